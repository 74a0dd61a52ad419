"""The optimizer state: a NamedTuple pytree of arrays, and nothing else.

The policy is *not* in the state. It is fixed when the transformation is
built and captured in its closure, so flattening, ``tree_map``, ``jit``
arguments and checkpoint restores cannot lose or change it (jmp kept
``min_loss_scale`` in its state object and dropped it on flatten: jmp PR #44).
"""

from __future__ import annotations

import collections
from typing import Any

import jax
import jax.numpy as jnp
import optax

from .._rule import LossScaleState

__all__ = [
    "LossScaleOptimizerState",
    "find_loss_scale_state",
    "find_state",
]


# The two layouts; the classes below give both the name LossScaleOptimizerState in repr.
_Fields = collections.namedtuple("_Fields", ["inner_state", "loss_scale_state"])
_FieldsWithStats = collections.namedtuple("_FieldsWithStats", ["inner_state", "loss_scale_state", "stats"])


class LossScaleOptimizerState(_Fields):
    """The state of :func:`~lossscale.jax.loss_scale_optimizer`: a NamedTuple pytree.

    Attributes:
        inner_state: the wrapped transformation's state, untouched by skipped
            steps.
        loss_scale_state: a :class:`lossscale.LossScaleState` of 0-d arrays:
            ``loss_scale`` (float32), ``good_steps``, ``bad_steps``,
            ``skipped_steps`` and ``consecutive_skips`` (int32, saturating).
        stats: with ``stats_every``, the step count, latest gradient
            statistics and ``AutoLossScale``'s state; None otherwise.

    Without ``stats_every`` the tuple has the two fields ``inner_state`` and
    ``loss_scale_state`` only (``stats`` reads None), the layout of 0.1, so
    checkpoints of it (flax msgpack, orbax) restore across versions; with
    ``stats_every`` it has a third field, ``stats``.
    ``LossScaleOptimizerState(inner_state, loss_scale_state, stats)`` builds
    either, and ``isinstance(state, LossScaleOptimizerState)`` holds for both.

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> state = lsj.loss_scale_optimizer(optax.sgd(0.1)).init({"w": jnp.ones(2)})
    >>> float(state.loss_scale), int(state.skipped_steps), state._fields, state.stats
    (32768.0, 0, ('inner_state', 'loss_scale_state'), None)
    >>> lsj.loss_scale_optimizer(optax.sgd(0.1), stats_every=10).init({"w": jnp.ones(2)})._fields
    ('inner_state', 'loss_scale_state', 'stats')
    """

    __slots__ = ()

    # Not Self: without statistics it returns cls, with them the three-field subclass.
    def __new__(  # noqa: PYI034
        cls, inner_state: Any, loss_scale_state: LossScaleState, stats: Any = None
    ) -> LossScaleOptimizerState:
        if stats is None:
            return _Fields.__new__(cls, inner_state, loss_scale_state)
        return tuple.__new__(_StatsOptimizerState, (inner_state, loss_scale_state, stats))

    @property
    def stats(self) -> Any:
        """``stats_every``'s :class:`lossscale.jax._stats.StatsState` (None when off)."""
        return None

    # The accessors convert with jnp.asarray: under flax.nnx.Optimizer the leaves are nnx's OptArray
    # wrappers, which have no arithmetic or comparison operators of their own.

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
        from ._stats import stats_mapping

        return stats_mapping(self.stats)

    @property
    def last_step_skipped(self) -> jax.Array:
        """Whether the last step was skipped, a 0-d bool array."""
        return self.consecutive_skips > 0


# Both bases are tuples with empty __slots__, so their layouts agree; mypy refuses any two tuple bases.
class _StatsOptimizerState(_FieldsWithStats, LossScaleOptimizerState):  # type: ignore[misc]
    """A :class:`LossScaleOptimizerState` with ``stats_every``: the third field ``stats``.

    Its fields, ``__new__``, ``_make`` and ``_replace`` are the three-field
    tuple's (first in the MRO); the accessors are ``LossScaleOptimizerState``'s.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self))
        return f"LossScaleOptimizerState({fields})"


def _is_scale_node(node: Any) -> bool:
    return isinstance(node, (LossScaleOptimizerState, LossScaleState))


def _find_node(state: Any, caller: str) -> Any:
    if _is_scale_node(state):
        return state
    found = [n for n in jax.tree_util.tree_leaves(state, is_leaf=_is_scale_node) if _is_scale_node(n)]
    if not found:
        raise TypeError(
            f"{caller} needs the state of a lossscale.jax.loss_scale_optimizer (what its init()/update() "
            f"returned, or a flax TrainState's opt_state), got {type(state).__name__} holding no loss scale."
        )
    if len(found) > 1:
        raise ValueError(
            f"{caller} found {len(found)} loss scales in the state; pass the one you mean "
            "(the LossScaleOptimizerState of the transformation whose gradients these are)."
        )
    _check_chain_order(state, caller)
    return found[0]


def _hides_scaled_gradients(node: Any) -> bool:
    # optax's stateless transforms (clip_by_global_norm, clip, adaptive_grad_clip, scale, ...) keep an
    # EmptyState; zero_nans would turn the NaNs that the skip looks for into zeros.
    return isinstance(node, (optax.EmptyState, optax.ZeroNansState))


def _check_chain_order(state: Any, caller: str) -> None:
    """Raise if, in an ``optax.chain`` state, a stateless transform or ``zero_nans`` precedes the loss scale.

    Those transforms then see the *scaled* gradients: a clip by global norm
    clips ``S * g`` (so nearly always, and by the wrong amount).
    """
    def is_leaf(n: Any) -> bool:
        return _is_scale_node(n) or _hides_scaled_gradients(n)

    leaves = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_leaf)[0]
    scale_paths = [p for p, n in leaves if _is_scale_node(n)]
    for path, node in leaves:
        if not _hides_scaled_gradients(node):
            continue
        for scale_path in scale_paths:
            common = 0
            while common < min(len(path), len(scale_path)) and path[common] == scale_path[common]:
                common += 1
            if common >= min(len(path), len(scale_path)):
                continue
            mine, theirs = path[common], scale_path[common]
            if (
                isinstance(mine, jax.tree_util.SequenceKey)
                and isinstance(theirs, jax.tree_util.SequenceKey)
                and mine.idx < theirs.idx
            ):
                raise ValueError(
                    f"{caller}: an optax.chain runs a transformation ({type(node).__name__} at "
                    f"{jax.tree_util.keystr(path)}; e.g. optax.clip_by_global_norm) before loss_scale_optimizer, "
                    "so it sees the SCALED gradients (a clip would clip S * g). Put it inside: "
                    "loss_scale_optimizer(optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))), or use "
                    "loss_scale_optimizer(optax.adamw(1e-3), clip_by_global_norm=1.0)."
                )


def find_loss_scale_state(state: Any, caller: str) -> LossScaleState:
    """The one :class:`LossScaleState` in ``state`` (also inside an ``optax.chain`` state or a TrainState).

    Raises ValueError if the chain runs a clip (any stateless transform) or
    ``zero_nans`` before the loss scale.
    """
    node = _find_node(state, caller)
    return node.loss_scale_state if isinstance(node, LossScaleOptimizerState) else node


def find_state(opt_state: Any) -> LossScaleOptimizerState:
    """The :class:`LossScaleOptimizerState` inside ``opt_state``, wherever it sits.

    ``opt_state`` may be the state of :func:`loss_scale_optimizer` itself, of
    an ``optax.chain`` holding it, a flax ``TrainState`` or its
    ``opt_state``, or a ``flax.nnx.Optimizer``'s ``opt_state``. Read its
    ``loss_scale``, ``skipped_steps``, ``consecutive_skips`` and
    ``last_step_skipped`` as arrays. Cost: a walk of the state's tree
    structure in Python (at trace time under ``jit``); no array op.

    Raises:
        TypeError: no loss scale in ``opt_state``.
        ValueError: more than one; or a chain that clips before the loss scale.

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> opt = optax.chain(lsj.loss_scale_optimizer(optax.sgd(0.1), 8), optax.scale(1.0))
    >>> int(lsj.find_state(opt.init(jnp.ones(2))).consecutive_skips)
    0
    """
    node = _find_node(opt_state, "find_state()")
    return node if isinstance(node, LossScaleOptimizerState) else LossScaleOptimizerState(None, node)
