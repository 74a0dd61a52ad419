"""The optimizer state: a NamedTuple pytree of arrays, and nothing else.

The policy is *not* in the state. It is fixed when the transformation is
built and captured in its closure, so flattening, ``tree_map``, ``jit``
arguments and checkpoint restores cannot lose or change it (jmp kept
``min_loss_scale`` in its state object and dropped it on flatten: jmp PR #44).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from .._rule import LossScaleState

__all__ = ["LossScaleOptimizerState", "find_loss_scale_state"]


class LossScaleOptimizerState(NamedTuple):
    """The state of :func:`~lossscale.jax.loss_scale_optimizer`.

    Attributes:
        inner_state: the wrapped transformation's state, untouched by skipped
            steps.
        loss_scale_state: a :class:`lossscale.LossScaleState` of 0-d arrays:
            ``loss_scale`` (float32), ``good_steps``, ``bad_steps``,
            ``skipped_steps`` and ``consecutive_skips`` (int32, saturating).

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> state = lsj.loss_scale_optimizer(optax.sgd(0.1)).init({"w": jnp.ones(2)})
    >>> float(state.loss_scale), int(state.skipped_steps)
    (32768.0, 0)
    """

    inner_state: Any
    loss_scale_state: LossScaleState

    @property
    def loss_scale(self) -> Any:
        """The current scale ``S``, a 0-d float32 array."""
        return self.loss_scale_state.loss_scale

    @property
    def skipped_steps(self) -> Any:
        """Steps skipped so far, a 0-d int32 array."""
        return self.loss_scale_state.skipped_steps

    @property
    def last_step_skipped(self) -> Any:
        """Whether the last step was skipped, a 0-d bool array."""
        return self.loss_scale_state.consecutive_skips > 0


def _is_scale_node(node: Any) -> bool:
    return isinstance(node, (LossScaleOptimizerState, LossScaleState))


def find_loss_scale_state(state: Any, caller: str) -> LossScaleState:
    """The one :class:`LossScaleState` in ``state`` (also inside an ``optax.chain`` state)."""
    if isinstance(state, LossScaleOptimizerState):
        return state.loss_scale_state
    if isinstance(state, LossScaleState):
        return state
    found = [n for n in jax.tree_util.tree_leaves(state, is_leaf=_is_scale_node) if _is_scale_node(n)]
    if len(found) == 1:
        return find_loss_scale_state(found[0], caller)
    if not found:
        raise TypeError(
            f"{caller} needs the state of a lossscale.jax.loss_scale_optimizer (what its init()/update() "
            f"returned), got {type(state).__name__} holding no loss scale."
        )
    raise ValueError(
        f"{caller} found {len(found)} loss scales in the state; pass the one you mean "
        "(the LossScaleOptimizerState of the transformation whose gradients these are)."
    )
