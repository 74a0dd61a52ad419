"""One step of ``loss_scale_optimizer``: check and unscale the gradients, skip or take the inner update, advance the
state. :class:`StepSettings` holds a transformation's validated settings; :func:`step` is the step itself, traced once per
``jit``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax

from .._diagnostics import StallGuard
from .._policy import LossScale
from ._compat import eval_jaxpr_choosing, like
from ._diagnostics import Recorder, guard_skip
from ._grads import all_finite, check_gradients, in_float32_range, squared_norm, unscale
from ._state import LossScaleOptimizerState, advance
from ._stats import sample_if_due

__all__ = ["StepSettings", "step"]


@dataclasses.dataclass(frozen=True, eq=False)
class StepSettings:
    """The settings of one :func:`~lossscale.jax.loss_scale_optimizer`, validated, and its ``update``.

    Attributes:
        inner: the wrapped transformation (with extra-args support).
        policy: the resolved :class:`lossscale.LossScale`.
        every: ``stats_every`` (None: off).
        axes: the ``pmap``/``shard_map`` axes of ``axis_name`` (None: none).
        max_norm: ``clip_by_global_norm`` (None: no clip).
        recorder: ``history=``'s :class:`~lossscale.jax._diagnostics.Recorder` (None: off).
        guard: ``max_consecutive_skips``'s core :class:`~lossscale._diagnostics.StallGuard` (None: none).
    """

    inner: optax.GradientTransformationExtraArgs
    policy: LossScale
    every: int | None = None
    axes: tuple[Hashable, ...] | None = None
    max_norm: float | None = None
    recorder: Recorder | None = None
    guard: StallGuard | None = None

    @property
    def fuses_check(self) -> bool:
        """Whether a sampled step's read pass can also be the finite check (the *fused* check), as far as the
        settings go: ``stats_every`` on, no clip (the clip's norm is the check then) and a scale floor ``>= 1`` (the
        check reads the scaled gradients). The gradients must also be in float32's range
        (:func:`~lossscale.jax._grads.in_float32_range`): the sample's ``amax`` is float32."""
        return self.every is not None and self.max_norm is None and self.policy.rule_params().min_scale >= 1

    def update(self, updates: Any, state: LossScaleOptimizerState, params: Any = None, **extra_args: Any) -> tuple:
        """optax's ``update``: ``(updates, new_state)`` from the scaled gradients ``updates`` (see :func:`step`)."""
        return step(self, updates, state, params, extra_args, apply=False)


def step(settings: StepSettings, grads: Any, state: Any, params: Any, extra_args: dict, *, apply: bool) -> tuple[Any, Any]:
    """One step: ``(updates, new_state)``, or ``(new_params, new_state)`` with ``apply``.

    The finite check reads the scaled gradients (with a scale floor ``>= 1``, ``g / S`` is finite exactly when
    ``g`` is), except with ``clip_by_global_norm``, where one pass gives both the global norm and the flag; with
    ``stats_every`` a sampled step's ``max |g|`` is the check too, so it reads the gradients once. The unscale and
    the skip fuse into the inner update's kernels (:func:`_chosen`). Under ``axis_name`` the flag is the devices'
    ``lax.pmin``. A tree with no gradients (an empty group of ``optax.multi_transform``) is a finite step that samples
    nothing. Cost: plain optax's passes plus one read of the gradients; no host sync (``history=`` and the stall guard
    stage a ``jax.debug.callback``).
    """
    if not isinstance(state, LossScaleOptimizerState):
        raise TypeError(
            f"update() needs the LossScaleOptimizerState that init()/update() returned, got "
            f"{type(state).__name__}. Pass this transformation's own state, not the inner optimizer's."
        )
    leaves = check_gradients(grads)
    scale = state.loss_scale
    every = None if state.stats is None else settings.every  # a state restored without statistics samples none
    factor = measurement = None
    if every is not None and settings.fuses_check and in_float32_range(leaves):
        measurement = sample_if_due(every, leaves, state.stats, settings.axes, all_finite)
        finite = measurement.finite
    elif settings.max_norm is None:
        checks_scaled = settings.policy.rule_params().min_scale >= 1
        finite = all_finite(grads if checks_scaled else unscale(grads, scale))
    else:
        norm = jnp.sqrt(squared_norm(grads, scale, settings.axes))
        finite = jnp.isfinite(norm)
        factor = jnp.where(norm < settings.max_norm, jnp.float32(1), jnp.float32(settings.max_norm) / norm)
    if settings.axes is not None:
        finite = lax.pmin(finite.astype(jnp.int32), settings.axes) > 0
    if every is not None and measurement is None:
        measurement = sample_if_due(every, leaves, state.stats, settings.axes)

    def taken(grads: Any, inner_state: Any, params: Any) -> Any:
        updates, inner_state = settings.inner.update(unscale(grads, scale, factor), inner_state, params, **extra_args)
        return (optax.apply_updates(params, updates) if apply else updates), inner_state

    first, inner_state = _chosen(
        finite, taken, (grads, state.inner_state, params), (params if apply else None, state.inner_state)
    )
    new = advance(settings.policy, state, finite, inner_state, measurement)
    if settings.recorder is not None:
        sampled = False if measurement is None else measurement.sampled
        settings.recorder.stage(scale, finite, settings.axes, None if new.stats is None else new.stats.sample, sampled)
    if settings.guard is not None:  # the streak reaches the limit only on a skipped step
        guard_skip(settings.guard, new.consecutive_skips, new.loss_scale)
    return first, new


def _chosen(finite: jax.Array, update: Callable, operands: Any, olds: Any) -> Any:
    """``update(*operands)`` where ``finite``, else ``olds`` (None: zeros shaped like that output), leaf by leaf.

    ``update`` is traced once, to a jaxpr, and evaluated with each output leaf chosen by ``jnp.where(finite, new,
    old)`` as soon as it is computed (:func:`~lossscale.jax._compat.eval_jaxpr_choosing`): the equations after it,
    e.g. Adam's parameter update reading the new moments, read the chosen value. Under ``jit`` XLA then fuses each
    choice into the element-wise kernel that computes the value and writes every output once, in place when the
    buffers are donated, so the skip costs no pass over the state of its own.

    Why per output and not a ``lax.cond`` or one select at the end: a choice made only at the end leaves the
    parameter update reading the moments' new values while they are written in place, and XLA copies the moments
    first; a ``lax.cond`` copies its operands when they are not donated, or its results when they are (and on a
    GPU its predicate is read on the host on every step). The ``lax.cond`` skip's compiled step moved 18.25 passes
    over the weights donated and 22.25 not donated (a branch of 9 passes, 8 copies of the state), this one 13.75
    either way, plain optax's passes plus the check's read (docs/benchmarks.md, JAX, for the times). On a skipped
    step the update is computed and thrown away; its NaN never reaches an output.

    Raises TypeError when the inner update returns a state of another structure or leaf shape than it was given (a
    skip could not keep the old one).
    """
    flat, in_tree = jax.tree_util.tree_flatten(operands)
    closed, shapes = jax.make_jaxpr(
        lambda *xs: update(*jax.tree_util.tree_unflatten(in_tree, xs)), return_shape=True
    )(*flat)
    out_tree = jax.tree_util.tree_structure(shapes)
    (old_first, old_rest), (new_first, new_rest) = olds, shapes
    rest_tree: Any = jax.tree_util.tree_structure(new_rest)  # Any: the PyTreeDef stub has no comparisons
    if jax.tree_util.tree_structure(old_rest) != rest_tree:
        raise TypeError(
            "The inner optimizer's update() returned a state whose structure differs from the state it was "
            f"given ({rest_tree} vs {jax.tree_util.tree_structure(old_rest)}); a skipped step could not keep "
            "the old state. Use an optax transformation whose update returns the state in the shape init() made."
        )
    old_leaves = (
        [None] * len(jax.tree_util.tree_leaves(new_first)) if old_first is None else jax.tree_util.tree_leaves(old_first)
    ) + jax.tree_util.tree_leaves(old_rest)
    avals = closed.out_avals
    for old, aval in zip(old_leaves, avals):
        if old is not None and tuple(jnp.shape(old)) != tuple(aval.shape):
            raise TypeError(
                f"The inner optimizer's update() returned a state leaf of shape {tuple(aval.shape)} for one of "
                f"shape {tuple(jnp.shape(old))}; a skipped step could not keep the old state. Use an optax "
                "transformation whose update returns the state in the shape init() made."
            )

    def choose(i: int, new: Any) -> Any:
        aval, old = avals[i], old_leaves[i]
        kept = jnp.zeros((), aval.dtype) if old is None else jnp.asarray(old)
        return like(jnp.where(finite, new, kept).astype(aval.dtype), aval)

    return jax.tree_util.tree_unflatten(out_tree, eval_jaxpr_choosing(closed, flat, choose))
