"""The state of ``loss_scale_optimizer`` in JAX arrays, and the only code that writes it: :func:`init_state` at step
0 and :func:`advance` after each step.

Pickles of lossscale 0.1 and 0.2 name this module for :class:`LossScaleOptimizerState`, those of 0.3 name
``lossscale.jax._optimizer`` (which imports the two classes, so both resolve).
"""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from .. import _advance
from .._policy import LossScale
from .._rule import LossScaleState, initial_state
from .._sampler import SamplerState, initial_sampler_state
from .._stats import GradientStats, as_mapping

__all__ = ["LossScaleOptimizerState", "Measurement", "_StatsOptimizerState", "advance", "init_state"]

# The two layouts; the classes below give both the name LossScaleOptimizerState in repr.
_Fields = collections.namedtuple("_Fields", ["inner_state", "loss_scale_state"])
_FieldsWithStats = collections.namedtuple("_FieldsWithStats", ["inner_state", "loss_scale_state", "stats"])


class LossScaleOptimizerState(_Fields):
    """The state of :func:`~lossscale.jax.loss_scale_optimizer`: a NamedTuple pytree of arrays, without the policy.

    Attributes:
        inner_state: the wrapped transformation's state, untouched by skipped steps.
        loss_scale_state: a :class:`lossscale.LossScaleState` of 0-d arrays.
        stats: with ``stats_every``, a third field, the core's ``SamplerState``; None otherwise (0.1's two fields).

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> state = lsj.loss_scale_optimizer(optax.sgd(0.1)).init({"w": jnp.ones(2)})
    >>> float(state.loss_scale), int(state.skipped_steps), state._fields, state.stats
    (32768.0, 0, ('inner_state', 'loss_scale_state'), None)
    """

    __slots__ = ()

    # Not Self: without statistics it returns cls, with them the three-field subclass. Two layouts rather than one
    # with stats=None: a state without statistics keeps 0.1's two fields, so its pickles, flax state dicts and orbax
    # trees load in every release.
    def __new__(  # noqa: PYI034
        cls, inner_state: Any, loss_scale_state: LossScaleState, stats: Any = None
    ) -> LossScaleOptimizerState:
        if stats is None:
            return _Fields.__new__(cls, inner_state, loss_scale_state)
        return tuple.__new__(_StatsOptimizerState, (inner_state, loss_scale_state, stats))

    @property
    def stats(self) -> Any:
        """``stats_every``'s sampler state (None when off)."""
        return None

    # jnp.asarray: under flax.nnx.Optimizer the leaves are OptArray wrappers, which have no operators.
    @property
    def loss_scale(self) -> jax.Array:
        """The current scale ``S``, a 0-d float32 array."""
        return jnp.asarray(self.loss_scale_state.loss_scale)

    @property
    def skipped_steps(self) -> jax.Array:
        """Steps skipped so far, a 0-d int32 array (saturating)."""
        return jnp.asarray(self.loss_scale_state.skipped_steps)

    @property
    def consecutive_skips(self) -> jax.Array:
        """Steps skipped in a row up to now (0 after a finite step), a 0-d int32 array."""
        return jnp.asarray(self.loss_scale_state.consecutive_skips)

    @property
    def gradient_stats(self) -> dict[str, Any] | None:
        """The latest sample of ``stats_every`` (see docs/gradient_stats.md), or None when off."""
        return None if self.stats is None else as_mapping(GradientStats(*map(jnp.asarray, self.stats.sample)))

    @property
    def last_step_skipped(self) -> jax.Array:
        """Whether the last step was skipped, a 0-d bool array."""
        return self.consecutive_skips > 0


# Both bases are tuples with empty __slots__, so their layouts agree; mypy refuses any two tuple bases.
class _StatsOptimizerState(_FieldsWithStats, LossScaleOptimizerState):  # type: ignore[misc]
    """The state with ``stats_every``: the three-field tuple's fields, ``_make`` and ``_replace``, the accessors."""

    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self))
        return f"LossScaleOptimizerState({fields})"


class Measurement(NamedTuple):
    """What one step's gradients gave ``stats_every`` (:func:`lossscale.jax._stats.sample_if_due`).

    Attributes:
        finite: the finite flag read off the sample's ``amax`` where the sample's pass is also the finite check
            (the *fused* check), else None.
        sample: the new sample where ``sampled``, else the kept one (a ``GradientStats`` of arrays).
        sampled: whether this step took the sample: True, or a 0-d bool array (the sampler's ``is_due``).
    """

    finite: Any
    sample: GradientStats
    sampled: Any


def init_state(policy: LossScale, every: int | None, inner: optax.GradientTransformation, params: Any) -> Any:
    """The state at step 0: ``inner.init(params)``, the policy's initial scale and zero counters (int32), and with
    ``every`` (``stats_every``) the sampler's empty sample for gradients shaped like ``params``."""
    stats = None
    if every is not None:
        count = len(jax.tree_util.tree_leaves(params))
        stats = initial_sampler_state(policy, count, jnp, count=jnp.zeros((), jnp.int32))
    return LossScaleOptimizerState(inner.init(params), initial_state(policy.rule_params(), jnp), stats)


def advance(
    policy: LossScale, state: LossScaleOptimizerState, finite: Any, inner_state: Any,
    measurement: Measurement | None = None,
) -> LossScaleOptimizerState:
    """``state`` after one step whose gradients were all finite iff ``finite``, by the core's
    :func:`~lossscale._advance.advance`: the scale and the skip counters moved by the policy's rule, the sampler's
    count and sample by ``measurement`` (with ``stats_every``), the inner state replaced by ``inner_state`` (the skip
    already chose it). The one place the binding moves its state.

    Args:
        policy: the transformation's :class:`lossscale.LossScale`.
        state: the state before the step.
        finite: the step's finite flag, a 0-d bool array (the devices' common one under ``axis_name``).
        inner_state: the inner transformation's state after the step (the old one on a skipped step).
        measurement: with ``stats_every``, what :func:`~lossscale.jax._stats.sample_if_due` measured; None without
            (a state restored without statistics keeps none).

    Returns:
        The new :class:`LossScaleOptimizerState`, in the layout of ``state``.

    Cost: the rule's scalar ops (about 20; ``"auto"`` about 110, 200 on a sampled step), no host sync, no
    conditional.
    """
    if measurement is None or state.stats is None:
        scale, _ = _advance.advance(policy, state.loss_scale_state, finite, jnp)
        return LossScaleOptimizerState(inner_state, scale, state.stats)
    stats = state.stats
    # sample_if_due's cond chose the kept sample already: handed in as the sampler's own, it is kept with no select.
    kept = SamplerState(jnp.asarray(stats.count), measurement.sample, stats.auto)
    scale, sampler = _advance.advance(
        policy, state.loss_scale_state, finite, jnp, sampler=kept, sample=measurement.sample,
        sampled=measurement.sampled,
    )
    return LossScaleOptimizerState(inner_state, scale, sampler)
