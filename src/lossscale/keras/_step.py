"""The scale state as five 0-d Keras variables, and one step per backend: unscale, check, apply or skip, advance."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import keras
import numpy as np
from keras import ops

from .._rule import LossScaleState, advance_in_place, initial_state, next_state
from . import _grads
from ._diagnostics import StepObserver
from ._grads import all_finite, unscale

__all__ = ["STATE_NAMES", "XP", "ScaleState", "apply_step", "jax_apply", "stateless_step", "unscale_and_check"]

STATE_NAMES = ("dynamic_scale", "step_counter", "bad_steps", "skipped_steps", "consecutive_skips")


def _namespace() -> Any:
    """``jax.numpy``, ``torch``, or on TensorFlow numpy's names as ``keras.ops`` (TF's operators do the rest)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax.numpy as jnp

        return jnp
    if backend == "torch":
        import torch

        return torch
    import tensorflow as tf

    def asarray(x: Any, dtype: Any = None) -> Any:
        return ops.convert_to_tensor(x) if dtype is None else ops.cast(x, dtype)

    def ldexp(x: Any, e: Any) -> Any:  # x * 2**e, 2**e written as float32 bits (exact; e clamped to [-126, 127])
        e = tf.clip_by_value(tf.cast(e, tf.int32), -126, 127)
        return x * tf.bitcast((e + 127) * (1 << 23), tf.float32)

    names = "abs ceil cumsum floor full full_like isfinite log2 max min ones_like roll sqrt stack sum where"
    functions = {name: getattr(ops, name) for name in names.split()}
    return SimpleNamespace(float32="float32", int32="int32", bool="bool", asarray=asarray, ldexp=ldexp, **functions)


#: The array namespace the core's rule, sampler and statistics run over on this backend.
XP = _namespace()


class ScaleState:
    """The five state variables of one optimizer, the rule's parameters, and the per-step observer."""

    def __init__(self, params: Any, observer: StepObserver) -> None:
        self.params, self.observer = params, observer
        self.variables: list[Any] = []
        self.stats: Any = None  # ``stats_every``'s StatsVariables (see _stats.py), or None when off
        p = params
        self.at_least_one = p.initial_scale >= 1 and (p.min_scale >= 1 if p.dynamic else True)  # then 0 < 1/S <= 1
        # The variables the rule can move (the others are never assigned): up to three writes fewer per step.
        self._moving = (p.dynamic, p.dynamic, p.dynamic and p.hysteresis > 1, True, True)

    def build(self, add_variable: Callable[..., Any]) -> list[Any]:
        """Creates the variables through the optimizer's ``add_variable``; returns them."""
        self.variables = [
            add_variable(
                shape=(), dtype=str(value.dtype), initializer=keras.initializers.Constant(value.item()),
                aggregation="none", name=name,
            )
            for name, value in zip(STATE_NAMES, initial_state(self.params, np))
        ]
        return self.variables

    def value(self, index: int, before_build: Any, dtype: str = "int32") -> Any:
        """The current value of variable ``index`` as a tensor (``before_build`` until built)."""
        if not self.variables:
            return ops.convert_to_tensor(before_build, dtype)
        return ops.convert_to_tensor(self.variables[index])

    def measure(self, grads: Any, variables: Any, scale: Any, already: bool) -> Any:
        """``stats_every``'s sample of this step (for :meth:`finish`), or None when off."""
        return None if self.stats is None else self.stats.measure(grads, variables, scale, already)[1]

    def fused(self, grads: list[Any], already: bool) -> bool:
        """Whether a sample's ``isfinite(amax)`` is the finite check: scaled float32-or-narrower gradients, ``S >= 1``."""
        return not already and self.at_least_one and all(
            g is None or keras.backend.standardize_dtype(g.dtype) in ("float16", "bfloat16", "float32") for g in grads
        )

    def check_and_measure(self, grads: list[Any], variables: Any, checked: list[Any], scale: Any, already: bool) -> Any:
        """``(finite, measured)``: whether ``checked`` (the gradients or their unscaled copies) is finite, and
        :meth:`measure`'s sample; one read pass on a sampled step when :meth:`fused`."""
        if self.stats is None:
            return all_finite(checked), None
        finite, measured = self.stats.measure(grads, variables, scale, already, lambda: all_finite(checked),
                                              self.fused(grads, already))
        return all_finite(checked) if finite is None else finite, measured  # None: torch's flag is not the sample's

    def read(self, copy: bool = True) -> LossScaleState:
        """The state now: a snapshot ordered before this step's assigns (torch: copies unless ``copy`` is False)."""
        backend = keras.backend.backend()
        if backend == "tensorflow":
            import tensorflow as tf

            return LossScaleState(*(tf.convert_to_tensor(v.value) for v in self.variables))
        values = (ops.convert_to_tensor(v) for v in self.variables)
        return LossScaleState(*(ops.copy(v) if copy and backend == "torch" else v for v in values))

    def advance(self, state: LossScaleState, finite: Any, measured: Any = None) -> tuple[LossScaleState, tuple[Any, ...]]:
        """The new state (with ``measured``, by the core's sampler) and the sample's columns for the history."""
        if measured is None:
            return next_state(self.params, state, finite, XP), ()
        new, kept = self.stats.advance(state, finite, measured)
        return new, (measured[1], kept.headroom_bits, kept.zero_fraction, kept.subnormal_fraction)

    def assign(self, new: LossScaleState) -> None:
        """Writes the variables the rule can move."""
        for variable, value, moving in zip(self.variables, new, self._moving):
            if moving:
                variable.assign(value)

    def finish(self, state: LossScaleState, finite: Any, measured: Any = None) -> None:
        """:meth:`advance`, then assigns the variables that move and tells the observer (when on)."""
        new, stats = self.advance(state, finite, measured)
        self.assign(new)
        if self.observer.active:
            self.observer.observe(state.loss_scale, finite, new.consecutive_skips, new.loss_scale, stats)

    def finish_in_place(self, finite: bool, measured: Any = None) -> bool:
        """:meth:`finish` in numpy on views of torch CPU state, for a step not sampled (False elsewhere): 30 us
        against 170 us, 5% of a small ``fit`` step, and about as much again with ``stats_every``."""
        value = self.variables[0].value
        if value.device.type != "cpu" or str(value.dtype) != "torch.float32" or (measured is not None and measured[1]):
            return False
        views = LossScaleState(*(v.value.detach().numpy() for v in self.variables))
        old = LossScaleState(*(view[()] for view in views))
        if measured is None:
            advance_in_place(self.params, views, finite)
        else:
            self.stats.advance_in_place(views, finite)
        if self.observer.active:
            self.observer.observe(old.loss_scale, np.bool_(finite), views[4][()], views[0][()])
        return True


def _keep(variables: Sequence[Any]) -> list[bool]:
    return [getattr(v, "overwrite_with_gradient", False) for v in variables]


def unscale_and_check(state: ScaleState, grads: list[Any], variables: Sequence[Any], scale: Any, already: bool) -> Any:
    """The gradients times ``1/scale`` (unless ``already``) and whether all are finite (``grads`` if ``1/S <= 1``)."""
    unscaled = grads if already else unscale(grads, scale, _keep(variables))
    return unscaled, all_finite(grads if state.at_least_one else unscaled)


def apply_step(state: ScaleState, inner: Any, grads: list[Any], variables: list[Any], already: bool) -> None:
    """The stateful step (TF without a strategy, torch): ``inner.apply`` in the taken branch, the rule in each (flag
    constant) unless an observer or the statistics need the flag. With statistics and no observer, each branch of
    the sample's ``cond`` advances the step (:meth:`~._stats.StatsVariables.measure`). One
    multiply, one read pass; eager TF: two host syncs (three with statistics)."""
    if keras.backend.backend() == "torch":
        import torch

        with torch.no_grad():  # updates must not be recorded by autograd
            return _torch_apply(state, inner, grads, variables, already)
    current = state.read()
    unscaled = grads if already else unscale(grads, current.loss_scale, _keep(variables))
    checked = grads if state.at_least_one else unscaled
    if state.stats is not None and not state.observer.active:  # the step advanced in the sample's branches
        finite = state.stats.measure(grads, variables, current.loss_scale, already, lambda: all_finite(checked),
                                     state.fused(grads, already), (current, state.assign))[0]
        ops.cond(finite, lambda: inner.apply(unscaled, variables), lambda: None)
        return None
    finite, measured = state.check_and_measure(grads, variables, checked, current.loss_scale, already)
    if measured is not None or state.observer.active:  # the rule runs outside the update's cond
        ops.cond(finite, lambda: inner.apply(unscaled, variables), lambda: None)
        return state.finish(current, finite, measured)

    def apply_and_advance() -> None:
        inner.apply(unscaled, variables)
        state.finish(current, True)

    ops.cond(finite, apply_and_advance, lambda: state.finish(current, False))


def _torch_apply(state: ScaleState, inner: Any, grads: list[Any], variables: list[Any], already: bool) -> None:
    """The eager torch step: the shared multi-tensor unscale-and-check, a Python ``if``; two passes, one host sync."""
    from .._torch._kernels import combine_flags, reciprocal, unscaled_copies

    scale = state.variables[0].value
    measured = state.measure(grads, variables, scale, already)
    as_given = [already or k for k in _keep(variables)]
    flags: list[Any] = []
    copies = unscaled_copies([None if a else g for g, a in zip(grads, as_given)], reciprocal(scale), flags)
    unscaled = [g if a else u for g, u, a in zip(grads, copies, as_given)]
    read = [g for g, a in zip(grads, as_given) if a and g is not None]  # the caller's: checked without a write
    finite = not bool(combine_flags(flags, scale.device)) and (not read or bool(all_finite(read)))
    if finite:
        inner.apply(unscaled, variables)
    if not state.finish_in_place(finite, measured):
        state.finish(state.read(copy=state.observer.active), finite, measured)


def stateless_step(
    state: ScaleState, inner: Any, own_variables: Sequence[Any], trainable_variables: Sequence[Any],
    optimizer_values: Sequence[Any], grads: list[Any], trainable_values: Sequence[Any], already: bool,
) -> tuple[list[Any], list[Any]]:
    """New weights and optimizer values (``own_variables``' first), touching no variable.

    The inner update runs in a ``cond`` on the finite flag, except on JAX off the CPU (GPU, TPU; chosen when XLA
    compiles the step, :func:`~._grads.by_platform`): there it always runs and each new value is chosen against the
    old one by ``where``, fused into the update's kernels by XLA, so that the step has no conditional, whose
    predicate XLA's GPU runtime would read on the host on every step. On a CPU the ``cond`` is the faster one for a
    small model (a ``fit`` step 1.15-1.28x Keras' class with ``where``, 0.98-1.01x with the ``cond``)."""
    own = len(own_variables)
    mapping = list(zip(list(own_variables) + list(inner.variables), optimizer_values))
    with keras.StatelessScope(state_mapping=mapping) as scope:
        current = state.read()
        checked = grads if already or state.at_least_one else unscale(grads, current.loss_scale, _keep(trainable_variables))
        finite, measured = state.check_and_measure(grads, trainable_variables, checked, current.loss_scale, already)
        branched = measured is None and not state.observer.active  # then the rule runs after the check, per branch
        if not branched:
            state.finish(current, finite, measured)
    new_own = [scope.get_current_value(v) for v in own_variables]
    inner_values = [ops.convert_to_tensor(x, v.dtype) for x, v in zip(optimizer_values[own:], inner.variables)]
    weights = [ops.convert_to_tensor(x, v.dtype) for x, v in zip(trainable_values, trainable_variables)]
    positions = [[id(o) for o in own_variables].index(id(v)) for v in state.variables]

    def own_after(flag: Any) -> list[Any]:
        values = list(new_own)
        if branched:
            for position, value in zip(positions, state.advance(current, flag)[0]):
                values[position] = value
        return values

    def update() -> tuple[list[Any], list[Any]]:
        # Unscaled again here, so that XLA fuses the multiply into the check and the update.
        again = grads if already else unscale(grads, current.loss_scale, _keep(trainable_variables))
        new_weights, new_inner = inner.stateless_apply(inner_values, again, weights)
        return list(new_weights), list(new_inner)

    def step() -> tuple[list[Any], list[Any], list[Any]]:
        return *update(), own_after(True)

    def skip() -> tuple[list[Any], list[Any], list[Any]]:
        return weights, inner_values, own_after(False)

    def in_cond() -> tuple[list[Any], list[Any]]:
        new_weights, new_inner, new_own = ops.cond(finite, step, skip)
        return list(new_weights), list(new_own) + list(new_inner)

    def by_where() -> tuple[list[Any], list[Any]]:
        import jax.numpy as jnp

        new_weights, new_inner = update()
        new_weights = [jnp.where(finite, n, o).astype(o.dtype) for n, o in zip(new_weights, weights)]
        new_inner = [jnp.where(finite, n, o).astype(o.dtype) for n, o in zip(new_inner, inner_values)]
        return new_weights, own_after(finite) + new_inner

    if keras.backend.backend() == "jax":
        return _grads.by_platform(in_cond, by_where)  # type: ignore[no-any-return]  # (looked up here: tests patch it)
    return in_cond()


def jax_apply(
    state: ScaleState, inner: Any, own_variables: Sequence[Any], trainable_variables: Sequence[Any],
    cache: dict[bool, Any], grads: list[Any], variables: list[Any], already: bool,
) -> None:
    """``apply`` on JAX: :func:`stateless_step` jitted per contract, then assigned (a stateful one leaks tracers)."""
    import jax

    known = {id(v) for v in trainable_variables}
    for variable in variables:
        if id(variable) not in known:  # Keras' own error; otherwise its gradient would be dropped silently
            raise ValueError(
                f"Unknown variable: {variable}. This optimizer can only be called for the variables it was "
                "originally built with. For a new set of variables, build a new optimizer."
            )
    by_id = {id(v): g for v, g in zip(variables, grads)}
    full = [by_id.get(id(v)) for v in trainable_variables]
    all_variables = list(own_variables) + list(inner.variables)
    step = cache.get(already)
    if step is None:
        pure = functools.partial(stateless_step, state, inner, own_variables, trainable_variables, already=already)
        step = cache[already] = jax.jit(pure)
    with state.observer.deferred() if state.observer.active else contextlib.nullcontext():
        new_trainable, new_optimizer = step([v.value for v in all_variables], full, [v.value for v in trainable_variables])
    for variable, value in zip([*trainable_variables, *all_variables], [*new_trainable, *new_optimizer]):
        variable.assign(value)
