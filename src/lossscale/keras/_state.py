"""The scale's live state: five 0-d Keras variables, and the one place in the binding that moves them by a step.

Every step of every backend ends in :meth:`ScaleVariables.advance` (or one of torch's two other forms of it,
:meth:`ScaleVariables.advance_on_host` on the CPU and :meth:`ScaleVariables.advance_on_device` elsewhere), which runs
the core's rule (and the core's sampler, with ``stats_every``) and writes the variables. No other code of the binding
assigns them; loads go through Keras' own loader after :mod:`._checkpoint`'s check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import keras
import numpy as np
from keras import ops

from .._advance import advance, advance_in_place
from .._auto import AutoLossScale, AutoState
from .._policy import LossScale
from .._rule import COUNTER_MAX, LossScaleState, initial_state, kernel_form
from .._sampler import next_count
from .._stats import GradientStats
from ._compat import version_counter
from ._grads import XP

if TYPE_CHECKING:
    from .._sampler import SamplerState
    from ._stats import Measurement, StatsVariables

__all__ = ["STATE_NAMES", "ScaleVariables", "on_host"]

#: The Keras variables' names, in :class:`~lossscale.LossScaleState`'s field order. ``dynamic_scale`` and
#: ``step_counter`` are Keras 3's own class's names (its files and configs load into ours).
STATE_NAMES = ("dynamic_scale", "step_counter", "bad_steps", "skipped_steps", "consecutive_skips")


def on_host(value: Any) -> bool:
    """Whether a torch variable's tensor ``value`` is moved in numpy on the host (the CPU) rather than by operators
    on its device. (A function of its own: tests switch the host path off to run the device's on CPU tensors.)"""
    return value.device.type == "cpu"  # type: ignore[no-any-return]


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
        # torch off the CPU: the rule as GradScaler's update kernel where it gives the same bits (advance_on_device).
        self._form = None if isinstance(policy, AutoLossScale) else kernel_form(p)
        self._known: tuple[Any, ...] | None = None  # the tensors' (id, address, version) as this class last wrote them
        self._room, self._growth_known, self._streak_is_zero = 0, False, False

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
        if keras.backend.backend() == "torch":  # the initial state: known without a read
            self._room, self._growth_known, self._streak_is_zero = COUNTER_MAX - 1, True, True
            self._remember()
        return self.variables

    def fields(self) -> LossScaleState:
        """The variables themselves, by field (``fields().loss_scale`` is ``dynamic_scale``); empty before built."""
        return LossScaleState(*self.variables)

    def value(self, field: str) -> Any:
        """Field ``field`` of :class:`~lossscale.LossScaleState` now, a 0-d tensor (its initial value until built;
        under ``tf.distribute`` the value, not the mirrored variable, so ``float()`` reads it). No host sync."""
        if not self.variables:
            return ops.convert_to_tensor(getattr(initial_state(self.params, np), field))
        return _as_tensor(self.variables[LossScaleState._fields.index(field)], keras.backend.backend())

    def read(self, copy: bool = True) -> LossScaleState:
        """The state now: a snapshot ordered before this step's writes.

        Args:
            copy: torch only: copy the tensors (a write in place would change a view); False when the caller reads
                the values before any write.
        """
        backend = keras.backend.backend()
        values = (_as_tensor(v, backend) for v in self.variables)
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
        if not on_host(value) or str(value.dtype) != "torch.float32" or (measured is not None and measured.sampled):
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

    def advance_on_device(
        self, finite: bool, found_inf: Any, measured: Measurement | None = None, copy: bool = False
    ) -> tuple[LossScaleState, LossScaleState, GradientStats | None]:
        """:meth:`advance` of an eager torch step (the CPU's sampled steps, and every step elsewhere): by the kernel
        form where it gives the core rule's bits, else by the rule's operators; the variables written in place.

        The kernel form (:func:`lossscale._rule.kernel_form`; :func:`lossscale._torch._kernels.advance_scale_`,
        GradScaler's update kernel and the skip counters, the flag already read on the host for the step's ``if``)
        covers the default dynamic policy and most others (not hysteresis, a ``max_loss_scale``, ``AutoLossScale``).
        It runs off the CPU (on the CPU the rule is cheaper in numpy, :meth:`advance_on_host`), and needs three facts
        of the state known on the host, as ``lossscale.torch`` keeps them: room below the counters' limit,
        ``good_steps < growth_interval``, and whether ``consecutive_skips`` is 0. They are known from the initial
        state and kept through this class's own writes; each tensor's identity, address and write count (torch's
        version counter) tell whether anything else wrote a variable since (a load, an ``assign``). Then the state
        is read once (one host sync; on ``meta`` nothing is read and the rule runs from then on) and one step of the
        rule restores ``good_steps < growth_interval``.

        Args:
            finite: whether the step's gradients were all finite (a Python bool, read from ``found_inf``).
            found_inf: the step's found-inf flag, a 0-d float32 tensor on the variables' device: 0.0 iff ``finite``.
            measured: the step's measurement with ``stats_every``, or None.
            copy: return the state before the step as copies (for the observer); else it is not copied.

        Returns:
            ``(old, new, kept)``: the state before the step (copies with ``copy``, else the variables' tensors, which
            the step changes), the variables' tensors after it, and the sample kept after the step (None without
            ``measured``).

        Cost, by the kernel form: 1 operator on a finite step (2 after a skipped one), 4 on an overflow (a fixed
        scale: 0-1 and 2); by the rule about 35. An ``AutoLossScale``: 5 on a finite unsampled step (its counters),
        its rule otherwise (about 80 unsampled, 175 sampled). No host sync but the one after another writer.
        """
        values = [v.value for v in self.variables]
        old = LossScaleState(*(v.clone() for v in values)) if copy else LossScaleState(*values)
        stats = self.stats
        if finite and measured is not None and not measured.sampled and stats is not None and stats.auto:
            # An AutoLossScale's finite unsampled step: its rule keeps the scale and the margin and counts; the
            # counters saturate as the rule's do (min(c, 2**31 - 2) + 1), so no host fact is needed.
            state = LossScaleState(*values)
            for counter in (state.good_steps, stats.auto[AutoState._fields.index("calm_steps")].value):
                counter.clamp_max_(COUNTER_MAX - 1).add_(1)
            state.consecutive_skips.zero_()
            sample = stats.kept(measured)
            stats.store_eager(measured, next_count(measured.count, np))
            self._room = max(self._room - 1, 0)
            return old, state, sample
        form = None if on_host(values[0]) else self._form
        if form is not None:
            known = _identity(values)
            if known is None or known != self._known:
                self._learn(values, known)
        if form is not None and self._room > 0 and self._growth_known:
            from .._torch._kernels import advance_scale_

            advance_scale_(form, LossScaleState(*values), found_inf, finite=finite, streak_is_zero=self._streak_is_zero)
            kept = None
            if measured is not None:  # the sampler's count, and its sample on a sampled step, as the core's
                stats = cast("StatsVariables", self.stats)  # a measurement comes only from the sampler
                kept = stats.kept(measured)
                stats.store_eager(measured, next_count(measured.count, np))
        else:
            kept = self.advance(old if copy else self.read(copy=False), finite, measured)[1]
            self._growth_known = True  # the rule leaves good_steps below growth_interval
        self._room, self._streak_is_zero = max(self._room - 1, 0), finite
        self._remember()
        return old, LossScaleState(*values), kept

    def _remember(self) -> None:
        """Notes the variables' tensors as this class wrote them."""
        self._known = _identity([v.value for v in self.variables])

    def _learn(self, values: list[Any], known: tuple[Any, ...] | None) -> None:
        """After another writer: the host facts of :meth:`advance_on_device` read from ``values`` (one host sync).
        ``known``: their identity (None: a tensor keeps no version, so no write can be seen: the rule from now on)."""
        import torch

        self._growth_known = self._streak_is_zero = False
        fits = values[0].dtype == torch.float32 and all(v.dtype == torch.int32 for v in values[1:])
        if known is None or values[0].device.type == "meta" or not fits:  # nothing to read; or not the kernel's
            self._room = 0
            return
        from .._torch._kernels import host_state

        host, self._room = host_state(LossScaleState(*values))
        self._streak_is_zero = host.consecutive_skips == 0


def _as_tensor(variable: Any, backend: str) -> Any:
    """A Keras variable's value as a tensor. TensorFlow: ``tf.convert_to_tensor`` of the TF variable, which under
    ``tf.distribute`` reads the mirrored variable's value (Keras' ``convert_to_tensor`` hands the mirrored variable
    back, which ``float()`` refuses)."""
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.convert_to_tensor(variable.value)
    return ops.convert_to_tensor(variable)


def _identity(values: list[Any]) -> tuple[Any, ...] | None:
    """Each tensor's identity, address and version (any other write since changes one of them); None when a tensor
    keeps no version (an inference tensor)."""
    out = tuple((id(v), v.data_ptr(), version_counter(v)) for v in values)
    return None if any(version is None for _, _, version in out) else out
