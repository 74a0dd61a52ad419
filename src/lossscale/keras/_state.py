"""The scale's live state: five 0-d Keras variables, and the one place in the binding that moves them by a step.

Every step of every backend ends in :meth:`ScaleVariables.advance` (or its host twin
:meth:`ScaleVariables.advance_on_host`), which runs the core's rule (and the core's sampler, with ``stats_every``)
and writes the variables. No other code of the binding assigns them; loads go through Keras' own loader after
:mod:`._checkpoint`'s check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import keras
import numpy as np
from keras import ops

from .._advance import advance, advance_in_place
from .._policy import LossScale
from .._rule import LossScaleState, initial_state
from .._stats import GradientStats
from ._grads import XP

if TYPE_CHECKING:
    from .._sampler import SamplerState
    from ._stats import Measurement, StatsVariables

__all__ = ["STATE_NAMES", "ScaleVariables"]

#: The Keras variables' names, in :class:`~lossscale.LossScaleState`'s field order. ``dynamic_scale`` and
#: ``step_counter`` are Keras 3's own class's names (its files and configs load into ours).
STATE_NAMES = ("dynamic_scale", "step_counter", "bad_steps", "skipped_steps", "consecutive_skips")


class ScaleVariables:
    """One optimizer's loss-scale state as five 0-d Keras variables (:data:`STATE_NAMES`), and its sampler.

    Args:
        policy: the :class:`lossscale.LossScale` the optimizer follows.
        stats: the ``stats_every`` sampler's variables (:class:`._stats.StatsVariables`), or None when off.
    """

    def __init__(self, policy: LossScale, stats: StatsVariables | None = None) -> None:
        self.policy, self.params, self.stats = policy, policy.rule_params(), stats
        self.variables: list[Any] = []
        p = self.params
        #: ``0 < 1/S <= 1`` on every step: then the scaled gradients are finite iff the unscaled ones are, and the
        #: check reads the gradients as given, not waiting for the multiply.
        self.at_least_one = p.initial_scale >= 1 and (p.min_scale >= 1 if p.dynamic else True)
        # The variables the rule can move (the others are never assigned): up to three writes fewer per step.
        self._moving = LossScaleState(p.dynamic, p.dynamic, p.dynamic and p.hysteresis > 1, True, True)

    def build(self, add_variable: Callable[..., Any]) -> list[Any]:
        """Creates the five variables through the optimizer's ``add_variable``, at the policy's initial state.

        Args:
            add_variable: the optimizer's ``add_variable`` (Keras tracks and saves what it creates).

        Returns:
            The variables, in :data:`STATE_NAMES`' order.
        """
        self.variables = [
            add_variable(
                shape=(), dtype=str(value.dtype), initializer=keras.initializers.Constant(value.item()),
                aggregation="none", name=name,
            )
            for name, value in zip(STATE_NAMES, initial_state(self.params, np))
        ]
        return self.variables

    def fields(self) -> LossScaleState:
        """The variables themselves, by field (``fields().loss_scale`` is ``dynamic_scale``); empty before built."""
        return LossScaleState(*self.variables)

    def value(self, field: str) -> Any:
        """Field ``field`` of :class:`~lossscale.LossScaleState` now, a 0-d tensor (its initial value until built).
        No host sync."""
        if not self.variables:
            return ops.convert_to_tensor(getattr(initial_state(self.params, np), field))
        return ops.convert_to_tensor(self.variables[LossScaleState._fields.index(field)])

    def read(self, copy: bool = True) -> LossScaleState:
        """The state now: a snapshot ordered before this step's writes.

        Args:
            copy: torch only: copy the tensors (a write in place would change a view); False when the caller reads
                the values before any write.
        """
        backend = keras.backend.backend()
        if backend == "tensorflow":
            import tensorflow as tf

            return LossScaleState(*(tf.convert_to_tensor(v.value) for v in self.variables))
        values = (ops.convert_to_tensor(v) for v in self.variables)
        return LossScaleState(*(ops.copy(v) if copy and backend == "torch" else v for v in values))

    def after(self, current: LossScaleState, finite: Any) -> LossScaleState:
        """The state after one unsampled step, computed and not written (a pure step returns it as values).

        Args:
            current: the state before the step (:meth:`read`).
            finite: whether the step's gradients were all finite (a 0-d bool tensor or a Python bool).
        """
        return advance(self.params, current, finite, XP)[0]

    def advance(
        self, current: LossScaleState, finite: Any, measured: Measurement | None = None
    ) -> tuple[LossScaleState, GradientStats | None]:
        """Moves the state by one step and writes it: the core's rule, or with ``measured`` the core's sampler
        (which also keeps the sample and counts the step, written to the sampler's variables).

        Args:
            current: the state before the step (:meth:`read`).
            finite: whether the step's gradients were all finite.
            measured: the step's :class:`._stats.Measurement`, or None (no ``stats_every``, or a pure step's
                branch).

        Returns:
            ``(new, kept)``: the new state and the sample kept after the step (None without ``measured``).

        Cost: about 20 scalar ops (the sampler's: about 15 more on the ``(T,)`` sample when sampled); no host sync.
        """
        if measured is None:
            new, kept = self.after(current, finite), None
        else:
            stats = cast("StatsVariables", self.stats)  # a measurement comes only from the sampler
            new, after = advance(self.policy, current, finite, XP, sampler=stats.sampler_state(measured),
                                 sample=measured.sample, sampled=measured.sampled)
            after = cast("SamplerState", after)  # given a sampler, advance returns its state
            stats.store(measured, after)
            kept = after.sample
        self.write(new)
        return new, kept

    def write(self, new: LossScaleState) -> None:
        """Assigns the variables the rule can move (the policy's fixed ones never change)."""
        for variable, value, moving in zip(self.variables, new, self._moving):
            if moving:
                variable.assign(value)

    def advance_on_host(self, finite: bool, measured: Measurement | None = None) -> tuple[LossScaleState, Any] | None:
        """:meth:`advance` in numpy on views of torch CPU variables, for a step known on the host to be unsampled.

        Bit for bit the same numbers at about 30 us against 170 us for torch's operators on 0-d CPU tensors (5% of
        a small ``fit`` step, and about as much again with ``stats_every``); ``docs/benchmarks.md``.

        Args:
            finite: whether the step's gradients were all finite (a Python bool).
            measured: the step's measurement, or None.

        Returns:
            ``(old, views)``: the state before (numpy scalars) and the views after; None (nothing written) off the
            CPU, on a sampled step, or when the variables are not float32 torch tensors.
        """
        value = self.variables[0].value
        if value.device.type != "cpu" or str(value.dtype) != "torch.float32" or (measured is not None and measured.sampled):
            return None
        views = LossScaleState(*(v.value.detach().numpy() for v in self.variables))
        old = LossScaleState(*(view[()] for view in views))
        if measured is None:
            advance_in_place(self.params, views, finite)
        else:
            stats = cast("StatsVariables", self.stats)  # a measurement comes only from the sampler
            count = advance_in_place(self.policy, views, finite, count=stats.host_count(), auto=stats.auto_views())
            stats.store_on_host(cast(int, count))  # given a count, advance_in_place returns the new one
        return old, views
