"""One step in its two shapes: unscale and check, apply or skip, advance the scale.

:func:`traced` is the step as a graph of ``keras.ops`` (TensorFlow's ``apply``, and the pure step that ``fit`` runs
on JAX, :func:`stateless`); :func:`eager` is torch's ``apply``, decided by a Python ``if``. How the update is
applied is the traced step's one difference between backends: :class:`Stateful` assigns the variables inside a
``cond``; :class:`Stateless` returns new values, by a ``cond`` or (JAX off the CPU) a ``where``. Under
``tf.distribute``, :mod:`._distributed` runs the check per replica and the rest cross-replica.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from .._rule import LossScaleState
from . import _grads
from ._diagnostics import StepObserver
from ._grads import all_finite, overwritten, unscale
from ._state import ScaleVariables
from ._stats import Measurement

__all__ = ["Stateful", "Stateless", "eager", "stateless", "traced"]


class Stateful:
    """The traced step's update on the variables: ``inner.apply`` in a ``cond`` taken when finite (TensorFlow).

    Args:
        inner: the inner optimizer.
        variables: the variables the gradients are for.
    """

    #: A ``cond`` branch may assign variables: the sample's ``cond`` advances the step in its branches.
    writes_in_branches = True

    def __init__(self, inner: Any, variables: list[Any]) -> None:
        self.inner, self.variables = inner, variables

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """The context the check and the rule run in: the variables themselves."""
        return contextlib.nullcontext()

    def select(self, state: ScaleVariables, finite: Any, unscale_now: Callable[[], list[Any]], ahead: list[Any] | None,
               current: LossScaleState | None) -> None:
        """Applies the unscaled gradients iff ``finite`` (``ahead`` when the check computed them, else
        ``unscale_now()``, outside the ``cond``); with ``current``, each branch also advances the state from it with
        its flag a constant (the rule folds to fewer ops than with the flag a tensor)."""
        unscaled = unscale_now() if ahead is None else ahead

        def apply() -> None:
            self.inner.apply(unscaled, self.variables)
            if current is not None:
                state.write(state.after(current, True))

        _grads.cond(finite, apply, lambda: None if current is None else state.write(state.after(current, False)))


class Stateless:
    """The traced step's update as values, touching no variable (``stateless_apply``; ``fit`` on JAX).

    The inner update runs in a ``cond`` on the finite flag, except on JAX off the CPU (GPU, TPU; chosen when XLA
    compiles the step, :func:`._grads.by_platform`): there it always runs and each new value is chosen against the
    old one by ``where``, fused into the update's kernels by XLA, so that the step has no conditional, whose
    predicate XLA's GPU runtime would read on the host on every step. On a CPU the ``cond`` is the faster one for a
    small model (docs/benchmarks.md: a ``fit`` step 1.15-1.28x Keras' class with ``where``, 0.98-1.01x with it).

    Args:
        inner: the inner optimizer.
        own_variables: the wrapper's own variables (the scale's among them), whose values come first.
        trainable_variables: the variables the optimizer was built with.
        optimizer_values: the values of ``own_variables`` then of the inner's variables.
        trainable_values: the values of ``trainable_variables``.
    """

    #: The branches return values: a write inside a JAX ``cond`` would leak its tracers.
    writes_in_branches = False

    def __init__(self, inner: Any, own_variables: Sequence[Any], trainable_variables: Sequence[Any],
                 optimizer_values: Sequence[Any], trainable_values: Sequence[Any]) -> None:
        self.inner, self.own, self.trainable = inner, list(own_variables), list(trainable_variables)
        self.values, self.trainable_values = list(optimizer_values), list(trainable_values)
        self._scope: Any = None

    @contextlib.contextmanager
    def scope(self) -> Iterator[Any]:
        """A ``keras.StatelessScope`` over the given values: the rule's writes land there."""
        mapping = list(zip(self.own + list(self.inner.variables), self.values))
        with keras.StatelessScope(state_mapping=mapping) as self._scope:
            yield self._scope

    def select(self, state: ScaleVariables, finite: Any, unscale_now: Callable[[], list[Any]], ahead: list[Any] | None,
               current: LossScaleState | None) -> tuple[list[Any], list[Any]]:
        """New weights and optimizer values: the update's iff ``finite``; with ``current``, the state after the
        step is computed in each branch from it, its flag a constant. The update unscales again
        (``unscale_now()``, ``ahead`` unused), so that XLA fuses the multiply into the check and the update."""
        own, inner = len(self.own), self.inner
        new_own = [self._scope.get_current_value(v) for v in self.own]
        inner_values = [ops.convert_to_tensor(x, v.dtype) for x, v in zip(self.values[own:], inner.variables)]
        weights = [ops.convert_to_tensor(x, v.dtype) for x, v in zip(self.trainable_values, self.trainable)]
        positions = [[id(o) for o in self.own].index(id(v)) for v in state.variables]

        def own_after(flag: Any) -> list[Any]:
            values = list(new_own)
            if current is not None:
                for position, value in zip(positions, state.after(current, flag)):
                    values[position] = value
            return values

        def update() -> tuple[list[Any], list[Any]]:
            new_weights, new_inner = inner.stateless_apply(inner_values, unscale_now(), weights)
            return list(new_weights), list(new_inner)

        def step() -> tuple[list[Any], list[Any], list[Any]]:
            return *update(), own_after(True)

        def skip() -> tuple[list[Any], list[Any], list[Any]]:
            return weights, inner_values, own_after(False)

        def in_cond() -> tuple[list[Any], list[Any]]:
            new_weights, new_inner, new_own = _grads.cond(finite, step, skip)
            return list(new_weights), list(new_own) + list(new_inner)

        def by_where() -> tuple[list[Any], list[Any]]:
            import jax.numpy as jnp

            new_weights, new_inner = update()
            new_weights = [jnp.where(finite, n, o).astype(o.dtype) for n, o in zip(new_weights, weights)]
            new_inner = [jnp.where(finite, n, o).astype(o.dtype) for n, o in zip(new_inner, inner_values)]
            return new_weights, own_after(finite) + new_inner

        if keras.backend.backend() == "jax":
            return _grads.by_platform(in_cond, by_where, like=[finite])  # type: ignore[no-any-return]  # (looked up here: tests patch it)
        return in_cond()


def traced(state: ScaleVariables, observer: StepObserver, grads: list[Any], variables: Sequence[Any], already: bool,
           update: Stateful | Stateless) -> Any:
    """One step as a graph: unscale and check (and measure), advance the state, apply or skip by ``update``.

    The rule runs in each branch of the update's ``cond`` with its flag a constant, unless ``stats_every`` or the
    observer needs the flag as a tensor; with statistics and no observer on TensorFlow it runs in each branch of the
    sample's ``cond`` instead (:meth:`._stats.StatsVariables.measure`), so the update's ``cond`` only applies.

    Args:
        state: the optimizer's scale variables.
        observer: the optimizer's history and stall guard.
        grads: one gradient per variable (None for none), scaled unless ``already``.
        variables: the variables they are for.
        already: whether the gradients went through ``get_unscaled_gradients`` (docs/keras.md).
        update: how the inner update is applied (:class:`Stateful` or :class:`Stateless`).

    Returns:
        What ``update.select`` returns (:class:`Stateless`: new weights and optimizer values).

    Cost: one multiply and one read pass over the gradients (a sampled step with ``stats_every``: one more read
    pass, or none more when the sample's amax is the check), about 20 scalar ops for the rule. Host syncs: none
    when traced; two in eager TensorFlow (three with ``stats_every``); the observer adds one transfer of three
    scalars.
    """
    with update.scope():
        current = state.read()

        def unscale_now() -> list[Any]:
            return grads if already else unscale(grads, current.loss_scale, overwritten(variables))

        ahead = None if state.at_least_one else unscale_now()  # the check reads the unscaled gradients
        checked = grads if ahead is None else ahead
        stats, in_branch = state.stats, None
        if stats is None:
            finite, measured = all_finite(checked), None
        else:
            if not observer.active and update.writes_in_branches:
                def in_branch(flag: Any, measured: Measurement) -> None:
                    state.advance(current, flag, measured)

            finite, measured = stats.measure(grads, variables, current.loss_scale, already,
                                             check=lambda: all_finite(checked), fuse=state.at_least_one,
                                             in_branch=in_branch)
            finite = all_finite(checked) if finite is None else finite  # None: torch's sample is no check
        per_branch = stats is None and not observer.active  # the rule runs in the update's branches
        if not per_branch and in_branch is None:
            new, kept = state.advance(current, finite, measured)
            observer.observe(current.loss_scale, finite, new, measured, kept)
    return update.select(state, finite, unscale_now, ahead, current if per_branch else None)


def stateless(state: ScaleVariables, observer: StepObserver, inner: Any, own_variables: Sequence[Any],
              trainable_variables: Sequence[Any], optimizer_values: Sequence[Any], grads: list[Any],
              trainable_values: Sequence[Any], already: bool) -> tuple[list[Any], list[Any]]:
    """:func:`traced` with a :class:`Stateless` update: new weights and optimizer values (``own_variables``' first)."""
    update = Stateless(inner, own_variables, trainable_variables, optimizer_values, trainable_values)
    return traced(state, observer, grads, trainable_variables, already, update)  # type: ignore[no-any-return]


def eager(state: ScaleVariables, observer: StepObserver, inner: Any, grads: list[Any], variables: list[Any],
          already: bool) -> None:
    """One eager torch step: the shared multi-tensor unscale-and-check into new tensors, a Python ``if``, the rule.

    The state advances in numpy on views of the CPU variables when the step is unsampled
    (:meth:`~._state.ScaleVariables.advance_on_host`), else by torch's operators: GradScaler's update kernel where
    it gives the core rule's bits (:meth:`~._state.ScaleVariables.advance_on_device`).

    Args:
        state: the optimizer's scale variables.
        observer: the optimizer's history and stall guard.
        inner: the inner optimizer.
        grads: one gradient per variable (None for none), scaled unless ``already``.
        variables: the variables they are for.
        already: whether the gradients went through ``get_unscaled_gradients``.

    Cost: two passes over the gradients (unscaled copies with the check, and the update's); one host sync (the
    flag). Off the CPU, 6 operators in all for the default policy on a finite step, the two passes included
    (``benchmarks/kernel_count_keras.py``).
    """
    import torch

    from .._torch._kernels import combine_flags, reciprocal, unscaled_copies

    with torch.no_grad():  # updates must not be recorded by autograd
        scale = state.fields().loss_scale.value
        measured = None if state.stats is None else state.stats.measure(grads, variables, scale, already,
                                                                             eager=True)[1]
        as_given = [already or k for k in overwritten(variables)]
        flags: list[Any] = []
        copies = unscaled_copies([None if a else g for g, a in zip(grads, as_given)], reciprocal(scale), flags)
        unscaled = [g if a else u for g, u, a in zip(grads, copies, as_given)]
        read = [g for g, a in zip(grads, as_given) if a and g is not None]  # the caller's: checked without a write
        found_inf = combine_flags(flags, scale.device)
        if read:
            found_inf = torch.maximum(found_inf, torch.logical_not(all_finite(read)).to(found_inf.dtype))
        finite = not bool(found_inf)
        if finite:
            inner.apply(unscaled, variables)
        on_host = state.advance_on_host(finite, measured)
        if on_host is None:
            current, new, kept = state.advance_on_device(finite, found_inf, measured, copy=observer.active)
            observer.observe(current.loss_scale, finite, new, measured, kept)
        elif observer.active:
            old, views = on_host
            observer.observe(old.loss_scale, np.bool_(finite), LossScaleState(*(view[()] for view in views)))
