"""``apply_gradients``: the step that returns new parameters, for loops that apply the updates at once."""

from __future__ import annotations

from typing import Any

import optax

from ._optimizer import stepper_of

__all__ = ["apply_gradients"]


def apply_gradients(tx: Any, grads: Any, opt_state: Any, params: Any, **extra_args: Any) -> tuple[Any, Any]:
    """``(new_params, new_opt_state)``: ``tx.update`` then ``optax.apply_updates``, with one skip.

    For a :func:`loss_scale_optimizer` this computes the same numbers as::

        updates, opt_state = tx.update(grads, opt_state, params, **extra_args)
        params = optax.apply_updates(params, updates)

    but the skip chooses between the new parameters and the old ones instead
    of between the updates and zeros, so on a skipped step the parameters
    come back unchanged without an addition of zeros, and the updates are
    never written to memory (XLA fuses them into the parameter update). With
    donated buffers (``jax.jit(step, donate_argnums=...)``) the new
    parameters are written over the old ones in place. Any other optax
    transformation takes the two-line path above. Cost: the update's; no
    host sync.

    Args:
        tx: the transformation, usually ``loss_scale_optimizer(...)``.
        grads: the gradients of the scaled loss (:func:`value_and_grad`).
        opt_state: ``tx``'s state.
        params: the parameters (required).
        **extra_args: passed to the inner transformation's ``update``.

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> tx = lsj.loss_scale_optimizer(optax.sgd(0.5), 4)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = tx.init(params)
    >>> params, state = lsj.apply_gradients(tx, jnp.array([4.0, jnp.inf]), state, params)   # skipped
    >>> params.tolist(), int(state.skipped_steps)
    ([1.0, 2.0], 1)
    >>> lsj.apply_gradients(tx, jnp.array([4.0, 8.0]), state, params)[0].tolist()
    [0.5, 1.0]
    """
    if params is None:
        raise TypeError("apply_gradients() needs the parameters to update; got params=None.")
    stepper = stepper_of(getattr(tx, "update", None))
    if stepper is None:
        updates, opt_state = tx.update(grads, opt_state, params, **extra_args)
        return optax.apply_updates(params, updates), opt_state
    return stepper(grads, opt_state, params, extra_args, True)
