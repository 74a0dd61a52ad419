"""The scale state as Keras variables: created once, read once per step, advanced by the core's rule.

Five 0-d variables (``dynamic_scale`` and ``step_counter`` named as in
Keras' own class; ``bad_steps``, ``skipped_steps``, ``consecutive_skips``)
hold :class:`lossscale.LossScaleState`. They are created with
``aggregation="none"``: under ``tf.distribute`` they are mirrored, written
only from the cross-replica context (once per step, with one value), so the
scale is one logical value on every replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import ops

from .. import LossScaleState, initial_state
from .._rule import advance_in_place
from ._backend import advance
from ._observer import StepObserver

__all__ = ["STATE_NAMES", "ScaleState"]

STATE_NAMES = ("dynamic_scale", "step_counter", "bad_steps", "skipped_steps", "consecutive_skips")


class ScaleState:
    """The five state variables of one optimizer, the rule's parameters, and the per-step observer."""

    def __init__(self, params: Any, observer: StepObserver) -> None:
        self.params = params
        self.observer = observer
        self.variables: list[Any] = []
        self.stats: Any = None  # ``stats_every``'s StatsVariables (see _stats.py), or None when off

    def measure(self, grads: Any, variables: Any, scale: Any, already: bool) -> Any:
        """``stats_every``'s sample of this step (for :meth:`finish`), or None when off."""
        return None if self.stats is None else self.stats.measure(grads, variables, scale, already)

    @property
    def at_least_one(self) -> bool:
        """Whether the policy keeps the scale at 1 or above (its floor, or its fixed value)."""
        p = self.params
        return p.initial_scale >= 1 and (p.min_scale >= 1 if p.dynamic else True)

    @property
    def built(self) -> bool:
        return bool(self.variables)

    def build(self, add_variable: Callable[..., Any]) -> list[Any]:
        """Creates the variables through the optimizer's ``add_variable``; returns them."""
        start = initial_state(self.params, np)
        self.variables = [
            add_variable(
                shape=(),
                dtype=str(value.dtype),
                initializer=keras.initializers.Constant(value.item()),
                aggregation="none",
                name=name,
            )
            for name, value in zip(STATE_NAMES, start)
        ]
        return self.variables

    def value(self, index: int, before_build: Any, dtype: str = "int32") -> Any:
        """The current value of variable ``index`` as a tensor (``before_build`` until built)."""
        if not self.built:
            return ops.convert_to_tensor(before_build, dtype)
        return ops.convert_to_tensor(self.variables[index])

    @property
    def loss_scale(self) -> Any:
        """The current loss scale (0-d float32; the initial one until built)."""
        return self.value(0, self.params.initial_scale, "float32")

    @property
    def dynamic_counter(self) -> Any:
        """Finite steps since the scale last changed (0-d int32), or None for a fixed scale."""
        return self.value(1, 0) if self.params.dynamic else None

    @property
    def skipped_steps(self) -> Any:
        return self.value(3, 0)

    @property
    def consecutive_skips(self) -> Any:
        return self.value(4, 0)

    @property
    def last_step_skipped(self) -> Any:
        return ops.greater(self.consecutive_skips, 0)

    def read(self) -> LossScaleState:
        """The state now: copies, except on JAX (whose values are immutable).

        A torch variable's tensor is updated in place. On TensorFlow
        ``keras.ops.convert_to_tensor`` may hand over the variable itself, read
        only when used (after this step's assign, e.g. by the history's
        ``py_function``); TensorFlow's own conversion reads it once, here.
        """
        backend = keras.backend.backend()
        if backend == "tensorflow":  # one ReadVariableOp each: a snapshot, ordered before this step's assigns
            import tensorflow as tf

            return LossScaleState(*(tf.convert_to_tensor(v.value) for v in self.variables))
        values = (ops.convert_to_tensor(v) for v in self.variables)
        if backend != "jax":
            values = (ops.copy(v) for v in values)
        return LossScaleState(*values)

    def _moving(self) -> tuple[bool, ...]:
        """Which variables the rule can change under these parameters (the others are not assigned).

        A fixed scale keeps the scale and its two counters; with hysteresis 1
        the overflow counter stays 0 (``b + 1 >= 1`` resets it at every
        overflow). The two skip counters always move. Saves up to three
        variable writes per step.
        """
        p = self.params
        return (p.dynamic, p.dynamic, p.dynamic and p.hysteresis > 1, True, True)

    def next_values(self, state: LossScaleState, finite: bool) -> list[Any]:
        """The variables' values after a step with a known (Python) ``finite``: the rule's where it moves them.

        For a branch whose flag is a constant (``_step.apply_step`` on
        TensorFlow, ``_step.stateless_step``); the values are returned, not
        assigned (:meth:`assign` writes them).
        """
        new = advance(self.params, state, finite)
        return [value if moving else old for value, old, moving in zip(new, state, self._moving())]

    def assign(self, values: Any) -> None:
        """Writes a new state (a :class:`LossScaleState` or :meth:`next_values`) into the variables that move."""
        for variable, value, moving in zip(self.variables, values, self._moving()):
            if moving:
                variable.assign(value)

    def finish_host(self, finite: bool) -> None:
        """:meth:`finish` with the rule run on the host, for an eager torch step that already synced on ``finite``.

        About 20 scalar numpy ops (``lossscale._rule.advance_in_place``, the
        core's rule on numpy scalars) cost less than 20 small torch ops. State
        in CPU float32/int32 memory is advanced in place through numpy views
        of it; otherwise (an accelerator, or a cast copy under autocast) the
        rule runs on host copies and the values that changed are assigned (up
        to four small host-to-device copies).
        """
        import torch

        values = [v.value for v in self.variables]
        shared = values[0].device.type == "cpu" and values[0].dtype == torch.float32
        views = [v.detach().numpy() if shared else np.array(ops.convert_to_numpy(v)) for v in values]
        old = LossScaleState(*(view[()] for view in views))
        advance_in_place(self.params, LossScaleState(*views), finite)
        if not shared:
            for variable, view, before, moving in zip(self.variables, views, old, self._moving()):
                if moving and view[()] != before:
                    variable.assign(view)
        self.observer.observe(old.loss_scale, np.bool_(finite), views[4][()], views[0][()])

    def finish(self, state: LossScaleState, finite: Any, measured: Any = None) -> LossScaleState:
        """Advances ``state`` by the rule with ``finite``, assigns the variables and tells the observer.

        ``measured``: :meth:`measure`'s ``(sample, sampled)``; then the core's sampler
        (:func:`lossscale._sampler.next_sampler_state`) keeps the sample, runs the rule
        (``AutoLossScale``'s own, or the TF rule) and counts the step. Cost: about 20 scalar ops, no host sync
        (the observer adds one transfer when on).
        """
        stats: tuple[Any, ...] = ()
        if measured is None:
            new = advance(self.params, state, finite)
        else:
            new, kept = self.stats.advance(state, finite, measured)
            stats = (measured[1], kept.headroom_bits, kept.zero_fraction, kept.subnormal_fraction)
        self.assign(new)
        self.observer.observe(state.loss_scale, finite, new.consecutive_skips, new.loss_scale, stats)
        return new
