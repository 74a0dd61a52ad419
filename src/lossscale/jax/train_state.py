"""flax linen: a ``TrainState`` whose ``step`` counts only the steps that were applied (imports flax)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

try:
    from flax.training import train_state as _flax_train_state
except ImportError as error:  # pragma: no cover - exercised only without flax
    raise ImportError(f"lossscale.jax.train_state needs flax ({error.name} is missing): pip install flax.") from error

from ._optimizer import apply_gradients, find_state

__all__ = ["TrainState"]


class TrainState(_flax_train_state.TrainState):
    """flax's ``TrainState`` for a ``tx`` that holds a :func:`~lossscale.jax.loss_scale_optimizer`.

    ``apply_gradients(grads=...)`` takes the *scaled* loss's gradients, steps or skips through
    :func:`lossscale.jax.apply_gradients`, and adds 1 to ``step`` only when applied. Cost: flax's, minus one pass
    (the skip chooses the parameters as they are computed; no updates in memory).

    Args:
        step: the applied steps so far (skipped ones not counted; ``create`` starts it at 0).
        apply_fn: the model's apply function, as in flax's ``TrainState``.
        params: the parameters.
        tx: the optax transformation, holding a :func:`~lossscale.jax.loss_scale_optimizer` (alone or in a chain).
        opt_state: ``tx``'s state (``create`` makes it with ``tx.init(params)``).

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> from lossscale.jax.train_state import TrainState
    >>> tx = lsj.loss_scale_optimizer(optax.sgd(0.1), 2)
    >>> state = TrainState.create(apply_fn=None, params=jnp.ones(2), tx=tx)
    >>> state = state.apply_gradients(grads=jnp.array([jnp.nan, 0.0]))   # skipped
    >>> state = state.apply_gradients(grads=jnp.array([2.0, 2.0]))
    >>> int(state.step), state.params.tolist(), int(lsj.find_state(state.opt_state).skipped_steps)
    (1, [0.8999999761581421, 0.8999999761581421], 1)
    """

    def apply_gradients(self, *, grads: Any, **kwargs: Any) -> TrainState:
        """The state after one step (or skip) on ``grads``.

        Args:
            grads: the gradients of the scaled loss, shaped like ``params``.
            **kwargs: other fields to replace, as in flax's ``TrainState.apply_gradients``.

        Returns:
            A new ``TrainState``: ``params`` and ``opt_state`` stepped, ``step + 1`` only if the step was applied.

        Raises:
            ValueError: ``grads`` holds flax's overwrite-with-gradient collection (not supported).
        """
        if isinstance(grads, dict) and _flax_train_state.OVERWRITE_WITH_GRADIENT in grads:
            raise ValueError(
                "lossscale.jax.train_state.TrainState does not support flax's overwrite-with-gradient "
                "collection; use flax's TrainState and read the applied steps as "
                "state.step - lossscale.jax.find_state(state.opt_state).skipped_steps."
            )
        params, opt_state = apply_gradients(self.tx, grads, self.opt_state, self.params)
        applied = jnp.logical_not(find_state(opt_state).last_step_skipped)
        step = self.step + applied.astype(jnp.asarray(self.step).dtype)
        return self.replace(step=step, params=params, opt_state=opt_state, **kwargs)
