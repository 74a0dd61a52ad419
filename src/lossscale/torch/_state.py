"""The loss scale's live state as torch tensors, and the only code that writes it.

- :class:`ScaleState`: a policy and its five 0-d tensors; every write of them (one step, a scale set by hand, a
  load) is one of its methods. :class:`PrivateLossScale` is one optimizer's, :class:`SharedLossScale` several
  optimizers', :class:`IterationScale` a ``GradScaler``'s.
- :class:`SkipCounters`: one optimizer's own skip counters beside a shared scale.
- "Advance one step" happens here only: :meth:`ScaleState.advance` and :meth:`SkipCounters.advance` call the core's
  :func:`~lossscale._advance.advance` (or its host twin :func:`~lossscale._advance.advance_in_place`), or the
  torch kernel form :func:`~lossscale._torch._kernels.advance_scale_` where :func:`~lossscale._rule.kernel_form`
  proves it gives the same bits. The sampler's state (``stats_every``) moves with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from numbers import Real
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from .._advance import advance, advance_in_place
from .._auto import AutoLossScale, AutoState, overflow_grid, overflow_key, overflow_table
from .._policy import DynamicLossScale, LossScale
from .._resolve import resolve_loss_scale
from .._rule import COUNTER_MAX, LossScaleState, initial_state, kernel_form
from .._sampler import next_count
from .._torch._kernels import (
    AUTO_COUNTER_MOVES,
    AutoTable,
    advance_auto_unsampled_,
    advance_scale_,
    host_state,
    move,
    reciprocal,
)
from ._checkpoint import CounterRecord, ScaleRecord
from ._compat import foreach_copy_

__all__ = [
    "IterationScale", "PrivateLossScale", "ScaleState", "SharedLossScale", "SkipCounters", "StepScale",
    "count_sampler", "require_own_scale", "scale_owner",
]


class ScaleState:
    """A policy and its five live 0-d tensors (float32 scale, four int32 counters); the only code that writes them.

    One step moves them in :meth:`advance`, by one of three forms of the same rule, chosen there and nowhere else:

    - on the CPU, :func:`~lossscale._advance.advance_in_place` on numpy views of the tensors' memory: no operator
      at all, a few microseconds of Python;
    - elsewhere, where :func:`~lossscale._rule.kernel_form` covers the policy, its kernel form
      (:func:`~lossscale._torch._kernels.advance_scale_`): 5 operators, one of them GradScaler's update kernel (6
      after a scale was set by hand, 3 for a fixed scale);
    - otherwise :func:`~lossscale._advance.advance` on the tensors: about 33 operators.

    An ``AutoLossScale`` moves by :meth:`_advance_auto`, on the CPU too: between two samples a lookup in a table
    of its overflows (6 operators), at a sample its rule (about 190, the table's rebuild included).

    None reads the device. What the kernel form needs known of the state is kept here as plain Python, known at
    construction and read once at a load (one host read off the CPU):

    - ``_room``: how many more steps cannot carry a skip counter past ``COUNTER_MAX`` (the form does not saturate);
    - ``_growth_known``: whether ``good_steps < growth_interval`` holds (false after a load or a shorter interval,
      until one step of the rule restores it);
    - ``_above_floor``: whether ``S >= min_scale`` holds, so that the floor is one ``clamp_min_`` instead of two
      operators (false after a scale set by hand below it, or a higher floor).

    Args:
        policy: the :class:`~lossscale.LossScale` to follow.
        device: where the tensors live (None: the CPU until a step moves them to its gradients' device).
    """

    #: Whether each optimizer step advances this scale at once (a private scale), or :meth:`update` does later.
    advances_each_step = False
    _room: int
    _growth_known: bool
    _above_floor: bool
    #: An ``AutoLossScale``'s packed state and overflow table (:meth:`_advance_auto`), once its first step ran.
    _auto_table: AutoTable | None = None
    _auto_sharing: tuple[torch.Tensor, ...] | None = None

    def __init__(self, policy: LossScale, device: torch.device | str | None = None) -> None:
        self._growth_known = self._above_floor = True
        self._set_policy(policy)
        self._set_tensors(initial_state(policy, torch, device=device), room=COUNTER_MAX - 1)

    @property
    def policy(self) -> LossScale:
        """The :class:`~lossscale.LossScale` this scale follows."""
        return self._policy

    @property
    def device(self) -> torch.device:
        """The device of the state tensors."""
        return self.tensors.loss_scale.device

    @property
    def state(self) -> LossScaleState:
        """The live state tensors (do not modify them)."""
        return self.tensors

    @property
    def loss_scale(self) -> torch.Tensor:
        """The current scale, a 0-d float32 tensor (a copy; no host sync)."""
        return self.tensors.loss_scale.clone()

    def inv_scale(self) -> torch.Tensor:
        """``1 / S`` in float32 (computed in float64 on the host for CPU state; one operator elsewhere)."""
        views = _host_views(self, self.tensors)
        if views is not None:
            with np.errstate(over="ignore"):  # 1/S beyond float32 is inf, as on the device
                return torch.from_numpy(np.asarray(1.0 / float(views.loss_scale), dtype=np.float32))
        return reciprocal(self.tensors.loss_scale)

    def get_scaled_loss(self, loss: Any, promote: bool = False) -> Any:
        """``loss * S``, rounded once to ``loss``'s dtype, or with ``promote`` in torch's result dtype of the product.

        Args:
            loss: a floating-point tensor, or a zero-argument callable returning one.
            promote: keep the product's dtype, as ``torch.amp.GradScaler.scale`` does: a 0-d float16/bfloat16 loss
                times the 0-d float32 scale is float32 (rounded back it would be Inf from ``|loss| > 1`` at
                ``2**16``); a tensor of any other shape keeps its dtype either way.

        Returns:
            The scaled tensor, or for a callable a callable returning it. One operator, no sync.

        Raises:
            TypeError: ``loss`` is neither, or not floating-point.
        """
        if callable(loss) and not isinstance(loss, torch.Tensor):
            return lambda: self.get_scaled_loss(loss(), promote)
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"get_scaled_loss() takes a tensor or a zero-argument callable returning one, got "
                            f"{type(loss).__name__}. Compute the loss with torch before scaling it.")
        if not loss.is_floating_point():
            raise TypeError(f"get_scaled_loss() needs a floating-point loss, got dtype {loss.dtype}.")
        scale = self.tensors.loss_scale
        if scale.device != loss.device:
            scale = move(scale, loss.device)
        scaled = torch.mul(loss, scale)
        return scaled if promote else scaled.to(loss.dtype)

    def to_(self, device: torch.device) -> None:
        """Moves the state to ``device`` (done for you when gradients move)."""
        if self.device != device:
            self._set_tensors(LossScaleState(*(t.to(device) for t in self.tensors)), room=self._room)

    def for_step(self, device: torch.device | None) -> StepScale:
        """Moves the state to ``device`` (None: stays), then what a step's check needs of it."""
        here = self.tensors.loss_scale.device  # read once: a step's hot path (no property calls)
        if device is not None and device != here:
            self.to_(device)
            here = device
        return StepScale(self.tensors.loss_scale, self.inv_scale(), here, self.can_go_below_one)

    def advance(self, found_inf: torch.Tensor, sampler: Any = None, recorder: Any = None) -> None:
        """Moves the state (and ``sampler``'s) by one step whose gradients overflowed iff ``found_inf != 0``, in
        place, with no host sync: the one place the binding advances a scale.

        Args:
            found_inf: a 0-d float32 flag (any device; moved to the state's).
            sampler: the ``StatsSampler`` whose measurements this step takes, or None. With an
                ``AutoLossScale`` its rule moves the scale (on the tensors); otherwise it is counted beside.
            recorder: where a taken sample's statistics are noted for the history row; or None.

        Cost: on the CPU no operator (an ``AutoLossScale``: 6 small ones); elsewhere 5 operators by the kernel form,
        else about 33; an ``AutoLossScale`` 6 between samples, about 200 on a sampled step (:meth:`_advance_auto`).
        """
        if found_inf.device != self.device:
            found_inf = move(found_inf, self.device)
        taken = None if sampler is None else sampler.take(recorder)
        if taken is not None and sampler.state.auto is not None and isinstance(self._policy, AutoLossScale):
            self._advance_auto(found_inf, sampler, taken)
            return
        views = _host_views(self, self.tensors)
        if views is not None:
            count = advance_in_place(self._params, views, float(found_inf.detach().numpy()) == 0.0,
                                     count=None if sampler is None else sampler.state.count)
            if sampler is not None:
                sampler.state = sampler.state._replace(count=count)
        elif self._form is not None and self._room > 0 and self._growth_known:
            advance_scale_(self._form, self.tensors, found_inf, above_floor=self._above_floor)
            _count(sampler)
        else:
            new, moved = advance(self._policy, self.tensors, found_inf == 0, torch,
                                 sampler=None if sampler is None else sampler.state)
            with torch.no_grad():
                foreach_copy_(list(self.tensors), list(new))
            self._growth_known = True  # the rule leaves good_steps below growth_interval
            if sampler is not None:
                sampler.state = moved
        self._room = max(self._room - 1, 0)

    def _advance_auto(self, found_inf: torch.Tensor, sampler: Any, taken: Any) -> None:
        """An ``AutoLossScale``'s step: an unsampled one by table (:func:`~lossscale._torch._kernels.
        advance_auto_unsampled_`, 6 operators), a sampled one by the core's rule (about 125, its overflow looked up
        too), after which the table is rebuilt for the new window (about 65 more, on 11,357 elements).

        The table form gives the core rule's bits while no counter can reach 2**31 - 1, known on the host: ``_room``
        for the scale's counters, the sampler's :meth:`calm_bound` for ``calm_steps``; past that the core rule runs
        (it saturates)."""
        if not taken.sampled and self._room > 0 and sampler.calm_bound() < COUNTER_MAX - 1:
            table = self._auto_table
            advance_auto_unsampled_(table if table is not None and self._packed(sampler) else self._pack(sampler),
                                    found_inf)
            self._room -= 1
            _count(sampler)
            return
        self._auto_to_device(sampler)
        table = self._auto_table
        looked_up = table.overflow() if table is not None and self._packed(sampler) else None
        new, sampler.state = advance(self._policy, self.tensors, found_inf == 0, torch, sampler=sampler.state,
                                     sample=taken.sample, sampled=taken.sampled, micro_batches=taken.micro_batches,
                                     overflow=looked_up)
        self._write(new)
        if taken.sampled and self._room > 0:
            self._pack(sampler)  # the new window's table, now: the next unsampled steps run by it

    def _auto_to_device(self, sampler: Any) -> None:
        """Moves ``sampler``'s auto state to the scale's device (once, after the scale moved)."""
        auto = sampler.state.auto
        if auto.margin.device != self.device:
            sampler.state = sampler.state._replace(auto=AutoState(*(t.to(self.device) for t in auto)))

    def _auto_live(self, sampler: Any) -> tuple[torch.Tensor, ...]:
        """The live tensors the table form writes, in :class:`~lossscale._torch._kernels.AutoTable`'s order: the
        scale and margin, then good, calm, streak and skipped."""
        live, auto = self.tensors, sampler.state.auto
        return (live.loss_scale, auto.margin, live.good_steps, auto.calm_steps, live.consecutive_skips,
                live.skipped_steps)

    def _packed(self, sampler: Any) -> bool:
        """Whether the live tensors are those :meth:`_pack` made share the table form's memory, so that its table is
        that of their window (a sampled step rebuilds it; a load or a move replaces the tensors)."""
        packed = self._auto_sharing
        return packed is not None and all(t is p for t, p in zip(self._auto_live(sampler), packed))

    def _pack(self, sampler: Any) -> AutoTable:
        """Puts the live tensors' values in the table form's packed memory (allocated once per device) and makes
        the tensors share it, the same objects (``Tensor.set_``: whoever holds them sees the table form's writes);
        then builds the table of the current window. About 70 operators, no host sync."""
        device = self.device
        table = self._auto_table
        if table is None or table.floats.device != device:
            floats = torch.empty(3, dtype=torch.float32, device=device)
            counters = torch.empty(4, dtype=torch.int32, device=device)
            moves = torch.tensor(AUTO_COUNTER_MOVES, dtype=torch.int32).to(device)
            table = AutoTable(floats, counters, floats.new_empty(0), moves, overflow_grid(floats, torch))
        self._auto_to_device(sampler)
        current = self._auto_live(sampler)
        sharing = current
        old = self._auto_sharing
        if old is not None and old[0] is current[0] and old[0].device == device:
            sharing = (current[0], old[1], current[2], old[3], *current[4:])  # the sampler's, as before the sample
        slots = [*table.floats[:2].unbind(), *table.counters.unbind()]
        with torch.no_grad():
            foreach_copy_(slots, list(current))  # the values, from wherever they are now
            for tensor, slot in zip(sharing, slots):  # metadata only: no kernel
                tensor.set_(slot.untyped_storage(), slot.storage_offset(), (), ())
            table.floats[2].copy_(overflow_key(sharing[0], sharing[1], torch))
        sampler.state = sampler.state._replace(auto=sampler.state.auto._replace(margin=sharing[1],
                                                                                calm_steps=sharing[3]))
        self._auto_sharing = sharing
        rows = overflow_table(cast(AutoLossScale, self._policy), sampler.state.auto, torch, table.grid)
        self._auto_table = table._replace(table=rows)
        return self._auto_table

    def set_scale(self, value: torch.Tensor, found_inf: torch.Tensor | None = None) -> None:
        """``S <- value`` in place, the growth counters kept, ``found_inf`` (if any) counted as for a fixed scale;
        no sync."""
        tensors = list(self.tensors)
        if found_inf is not None:
            finite = move(found_inf, self.device) == 0
            fixed = replace(self._params, dynamic=False)
            tensors = list(advance(fixed, self.tensors, finite, torch)[0])
            self._room = max(self._room - 1, 0)
        with torch.no_grad():
            foreach_copy_(list(self.tensors), [move(value, self.device).reshape(()).float(), *tensors[1:]])
        self._above_floor = False  # not read: the floor takes its exact two-operator form from now on

    def _write(self, new: LossScaleState) -> None:
        """Writes a rule's new state in place (``AutoLossScale``'s, one step's)."""
        with torch.no_grad():
            foreach_copy_(list(self.tensors), list(new))
        self._room, self._growth_known = max(self._room - 1, 0), False

    def to_record(self) -> ScaleRecord:
        """The checkpoint record: the policy and copies of the state tensors."""
        return ScaleRecord(self._policy, LossScaleState(*(t.detach().clone() for t in self.tensors)))

    def load(self, record: ScaleRecord) -> None:
        """Takes over a validated checkpoint record (policy and state, copied to this state's device)."""
        self._set_policy(record.policy)
        self._growth_known = False
        self._set_tensors(LossScaleState(*(t.to(self.device, copy=True) for t in record.state)))

    def state_dict(self) -> dict[str, Any]:
        """The policy config and copies of the state tensors (no sync)."""
        return self.to_record().to_dict()

    def load_state_dict(self, state_dict: dict[str, Any], custom_objects: Mapping[str, type] | None = None) -> None:
        """Restores :meth:`state_dict`'s output, policy included (checked first; nothing changes on error).

        Args:
            state_dict: what :meth:`state_dict` returned.
            custom_objects: ``{class name: class}`` for a policy class of your own (nothing is imported by name).

        Raises:
            ValueError: a malformed state dict (named).
        """
        self.load(ScaleRecord.from_dict(state_dict, custom_objects, current=self.policy))

    def __getstate__(self) -> dict[str, Any]:
        """Pickling and ``deepcopy`` go through the checkpoint record."""
        return {"record": self.to_record().to_dict(policy_object=True), "device": str(self.device)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_scale" in state:  # 0.1 pickled an owner holding its ScaleState: {"_scale": ScaleState}
            state = state["_scale"].__getstate__()
        record = ScaleRecord.from_dict(state["record"])  # validated as a state dict is
        self._growth_known = self._above_floor = False
        self._set_policy(record.policy)
        self._set_tensors(LossScaleState(*(t.to(state["device"]) for t in record.state)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.policy!r})"

    def _set_policy(self, policy: LossScale) -> None:
        params = policy.rule_params()
        old = getattr(self, "_params", None)
        if old is not None and params.growth_interval < old.growth_interval:
            self._growth_known = False  # good_steps may now be at or past the interval
        if old is not None and params.min_scale > old.min_scale:
            self._above_floor = False
        self._policy, self._params, self._form = policy, params, kernel_form(params)
        self.can_go_below_one = params.min_scale < 1

    def _set_tensors(self, tensors: LossScaleState, room: int | None = None) -> None:
        """Takes ``tensors`` as the live state. ``room`` None: a state from a load, whose counters and scale are
        read once for the class docstring's host knowledge (one host read off the CPU; on ``meta``, where nothing
        can be read, the kernel form is not used)."""
        self.tensors = tensors
        self._host_views: LossScaleState | None = None
        self._host_pointers: tuple[int, ...] = ()
        if room is None:
            if tensors.loss_scale.device.type == "meta":
                room, self._above_floor = 0, False
            else:
                values, room = host_state(tensors)
                self._above_floor = values.loss_scale >= self._params.min_scale
        self._room = max(room, 0)


def _host_views(holder: Any, tensors: LossScaleState) -> LossScaleState | None:
    """Numpy views of CPU ``tensors``' memory, cached on ``holder`` while the tensors stay; None off the CPU or
    under ``torch.compile`` (which must see the operators)."""
    if tensors.loss_scale.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    pointers = tuple(t.data_ptr() for t in tensors)
    if holder._host_views is None or pointers != holder._host_pointers:
        holder._host_views = LossScaleState(*(t.detach().numpy() for t in tensors))
        holder._host_pointers = pointers
    return holder._host_views


def count_sampler(sampler: Any, recorder: Any = None) -> None:
    """Ends a step for a ``sampler`` whose scale moved by another rule (a GradScaler's scale at ``update()`` with a
    ``new_scale``): its measurements are taken (statistics noted to ``recorder``) and the step counted. No
    operator unless ``recorder`` reads the sample."""
    sampler.take(recorder)
    _count(sampler)


def _count(sampler: Any) -> None:
    """Counts a step for ``sampler`` whose scale another form moved: its count + 1, saturating. The core's
    ``advance(..., moves_scale=False)`` would count it too, but also run the skip counters' 6 operators on the
    device for a result thrown away; the count is a Python int, so this costs no operator."""
    if sampler is not None:
        sampler.state = sampler.state._replace(count=next_count(sampler.state.count, torch))


class StepScale(NamedTuple):
    """What a step's check needs of the scale (:meth:`ScaleState.for_step`)."""

    loss_scale: torch.Tensor  # the live one
    inv_scale: torch.Tensor
    device: torch.device
    can_go_below_one: bool


class PrivateLossScale(ScaleState):
    """The scale of one ``LossScaleOptimizer``: each step advances it at once.

    Args:
        policy: the :class:`~lossscale.LossScale` to follow.
        device: where the tensors live (None: the CPU until a step moves them).
    """

    advances_each_step = True

    def add_step(self, found_inf: torch.Tensor, member: Any, counters: SkipCounters | None = None,
                 sampler: Any = None, recorder: Any = None) -> None:
        """The optimizer's step ended with ``found_inf``: the scale (and ``sampler``) advance now.

        Args:
            found_inf: the step's 0-d float32 flag (nonzero: an overflow).
            member: the optimizer's step progress (unused here: nothing waits for an update).
            counters: the optimizer's :class:`SkipCounters`, whose step count goes up (its skips are this scale's).
            sampler: the optimizer's ``StatsSampler``, or None.
            recorder: the history recorder a sample's statistics are noted to, or None.
        """
        if counters is not None:
            counters.steps += 1
        self.advance(found_inf, sampler, recorder)

    def update(self) -> None:
        """Refused: this scale's optimizer advances it at each step.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("This loss scale belongs to one LossScaleOptimizer, whose step() updates it. "
                           "Only a SharedLossScale passed to several optimizers needs update().")


class SharedLossScale(ScaleState):
    """A loss scale that one or more optimizers share.

    Args:
        loss_scale: the experimental form, as :class:`LossScaleOptimizer`'s (a number, ``"dynamic"``, a
            :class:`lossscale.LossScale`); default dynamic.
        dynamic, initial_scale, dynamic_growth_steps: the stable form (defaults True, 2**15, 2000).
        min_loss_scale, max_loss_scale, hysteresis: refine the dynamic scale (defaults 1, none, 1).
        device: where the state lives (default: the first gradient's device).

    Raises:
        ValueError: an ``AutoLossScale`` (no optimizer of several can follow it), or an invalid policy.

    Several optimizers driven by one loss::

        scale = SharedLossScale("dynamic")
        opt_a = LossScaleOptimizer(adam, loss_scale=scale)
        opt_b = LossScaleOptimizer(sgd, loss_scale=scale)
        scale.get_scaled_loss(loss).backward()
        opt_a.step()   # checks a's gradients, skips a if they overflowed
        opt_b.step()   # checks b's gradients, skips b if they overflowed
        scale.update() # once per iteration: backs off if either overflowed
    """

    def __init__(
        self, loss_scale: Any = None, *, dynamic: bool | None = None, initial_scale: float | None = None,
        dynamic_growth_steps: int | None = None, min_loss_scale: float | None = None,
        max_loss_scale: float | None = None, hysteresis: int | None = None, device: torch.device | str | None = None,
    ) -> None:
        policy = resolve_loss_scale(
            loss_scale, dynamic=dynamic, initial_scale=initial_scale, dynamic_growth_steps=dynamic_growth_steps,
            min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale, hysteresis=hysteresis,
        )
        super().__init__(policy, device)
        self._pending: torch.Tensor | None = None
        self._members: list[Any] = []

    def _set_policy(self, policy: LossScale) -> None:
        """Refuses ``AutoLossScale`` at construction and at load (nothing changes): no member can follow it."""
        require_own_scale(policy, self, "Use one LossScaleOptimizer per scale, or loss_scale='dynamic' with "
                          "stats_every=N for the statistics alone.")
        super()._set_policy(policy)

    def add_step(self, found_inf: torch.Tensor, member: Any, counters: SkipCounters | None = None,
                 sampler: Any = None, recorder: Any = None) -> None:
        """Keeps one optimizer's flag for :meth:`update`; the optimizer's own ``counters`` and ``sampler`` advance
        now. No sync.

        Args:
            found_inf: the step's 0-d float32 flag (nonzero: an overflow).
            member: the optimizer's step progress, reset at the next :meth:`update`.
            counters: the optimizer's own :class:`SkipCounters`, or None (a GradScaler's flag counted at update).
            sampler: the optimizer's ``StatsSampler``, or None.
            recorder: the history recorder a sample's statistics are noted to, or None.
        """
        self._members.append(member)
        if found_inf.device != self.device:
            found_inf = move(found_inf, self.device)
        self._pending = found_inf if self._pending is None else torch.maximum(self._pending, found_inf)
        if counters is not None:
            counters.advance(found_inf, self, sampler, recorder)

    def update(self) -> None:
        """Advances the scale once from the flags since the last update (none: nothing). No sync; on the CPU no
        operator, elsewhere 5 (the kernel form) or about 33."""
        pending = self.close()
        if pending is not None:
            self.advance(pending)

    def close(self) -> torch.Tensor | None:
        """Ends the iteration without advancing the scale: its members READY again; returns its summed flag (None
        if no member stepped), dropped unless the caller advances by it (a ``GradScaler`` subclass whose own
        ``update()`` moved the scale drops it)."""
        members, self._members = self._members, []
        for member in members:
            member.reset()
        pending, self._pending = self._pending, None
        return pending

    def to_(self, device: torch.device) -> None:
        super().to_(device)
        if self._pending is not None:
            self._pending = self._pending.to(device)

    def load(self, record: ScaleRecord) -> None:
        super().load(record)
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """``{"scale": ScaleState}``; pending flags and members are not kept."""
        scale = ScaleState(self.policy, self.device)
        scale._write(self.tensors)
        return {"scale": scale}

    def __setstate__(self, state: dict[str, Any]) -> None:
        scale = state["scale"]
        self._growth_known = self._above_floor = False
        self._set_policy(scale.policy)
        self._set_tensors(scale.tensors)
        self._pending = None
        self._members = []


def require_own_scale(policy: LossScale, owner: ScaleState, fix: str) -> None:
    """Refuses ``AutoLossScale`` on a scale shared by several optimizers."""
    if isinstance(policy, AutoLossScale) and not owner.advances_each_step:
        raise ValueError("AutoLossScale sets the scale of one optimizer from its own gradients; a scale shared by "
                         f"several optimizers (SharedLossScale) is not supported yet. {fix}")




def scale_owner(optimizer: torch.optim.Optimizer, scale: LossScale | SharedLossScale,
                stable: Mapping[str, Any]) -> PrivateLossScale | SharedLossScale:
    """Who owns the scale of a ``LossScaleOptimizer``: the given :class:`SharedLossScale`, or a private scale of the
    resolved ``policy`` on the device of ``optimizer``'s parameters.

    Args:
        optimizer: the inner optimizer (its first parameter's device is the scale's).
        scale: the resolved policy, or the ``SharedLossScale`` the user passed.
        stable: the stable form's keywords as passed (None where not given); refused beside a ``SharedLossScale``.

    Raises:
        ValueError: a ``SharedLossScale`` with stable-form keywords (it carries its own policy).
    """
    if isinstance(scale, SharedLossScale):
        given = [k for k, v in stable.items() if v is not None]
        if given:
            raise ValueError(f"A SharedLossScale carries its own policy; drop {', '.join(f'{k}=' for k in given)} "
                             "or give them to SharedLossScale(...).")
        return scale
    device = next((p.device for g in optimizer.param_groups for p in g["params"]), None)
    return PrivateLossScale(scale, device)


class IterationScale(SharedLossScale):
    """GradScaler's scale: a :class:`SharedLossScale` that also takes a new scale or policy."""

    @property
    def policy(self) -> DynamicLossScale:
        return cast(DynamicLossScale, self._policy)

    @property
    def pending(self) -> torch.Tensor | None:
        """The MAX of this iteration's found-inf flags so far (None before the first step)."""
        return self._pending

    def update(self, new_scale: Any = None, sampler: Any = None, recorder: Any = None) -> None:  # type: ignore[override]
        """Closes the iteration: advances the scale once from its flags, or sets ``new_scale`` (the growth counter
        stays). No sync.

        Args:
            new_scale: None, or a positive finite float or 1-element tensor (``requires_grad=False``).
            sampler: the GradScaler's ``StatsSampler``, counted once for an iteration with a step; or None.
            recorder: the history recorder a sample's statistics are noted to, or None.

        Raises:
            ValueError: a malformed ``new_scale`` (torch's message).
        """
        if new_scale is None:
            pending = self.close()
            if pending is not None:
                self.advance(pending, sampler, recorder)
            return
        fix = "new_scale should be a float or a 1-element tensor with requires_grad=False"
        if isinstance(new_scale, torch.Tensor):
            if new_scale.numel() != 1 or new_scale.requires_grad:
                raise ValueError(f"{fix}; got a tensor of shape {tuple(new_scale.shape)} "
                                 f"(requires_grad={new_scale.requires_grad}).")
            value = new_scale.detach().reshape(()).to(torch.float32, copy=True)
        elif isinstance(new_scale, bool) or not isinstance(new_scale, Real) or not 0 < cast(Any, new_scale) < math.inf:
            raise ValueError(f"{fix}, positive and finite; got {new_scale!r}.")
        else:
            value = torch.tensor(float(new_scale), dtype=torch.float32)
        pending = self.close()
        self.set_scale(value, pending)
        if pending is not None and sampler is not None:
            count_sampler(sampler, recorder)

    def load(self, record: ScaleRecord) -> None:
        """Takes over ``record`` as :class:`ScaleState` does, keeping this iteration's flags and members: as
        ``torch.amp.GradScaler.load_state_dict``, a load mid-iteration leaves the optimizers' checks (an
        ``unscale_`` already done, a step's overflow) to the iteration's ``step()`` and ``update()``."""
        members, pending = self._members, self._pending
        ScaleState.load(self, record)
        self._members, self._pending = members, None if pending is None else move(pending, self.device)

    def counts(self, member: Any) -> bool:
        """Whether ``member``'s flag (a step progress) is already among this iteration's."""
        return any(m is member for m in self._members)

    def overwrite(self, *, scale: float | None = None, growth_tracker: int | None = None) -> None:
        """torch's lazy-init attributes written by client code: ``S <- scale``, ``good_steps <- growth_tracker``
        (saturated at 2**31 - 1); None leaves one as it is."""
        if scale is not None:
            self.set_scale(torch.tensor(float(scale)))
        if growth_tracker is not None:
            with torch.no_grad():
                self.state.good_steps.fill_(min(int(growth_tracker), 2**31 - 1))
            self._growth_known = False

    def set_policy(self, policy: DynamicLossScale) -> None:
        """Follows ``policy`` from the next update on; the scale and its counters stay."""
        self._set_policy(policy)


class SkipCounters:
    """One optimizer's own ``steps``, ``skipped_steps`` and ``consecutive_skips``.

    With a private scale the state's skip counters count exactly this optimizer's steps: they are read there, and
    only the Python step count is kept here (counting costs nothing on the device). Beside a scale shared by
    several optimizers, whose counters count iterations, this optimizer keeps its own two tensors, moved by
    :meth:`advance` (the core's ``advance(..., moves_scale=False)``).

    Args:
        scale: the optimizer's private scale, or None beside a shared one.
        tracked: with no ``scale``, whether the skip counters are kept at all (a GradScaler keeps them only for its
            stall guard; the Python step count is kept always).
    """

    def __init__(self, scale: ScaleState | None = None, tracked: bool = True) -> None:
        self.steps = 0
        self._scale, self.tracked = scale, tracked
        self._skipped: torch.Tensor | None = None
        self._streak: torch.Tensor | None = None
        self._host_views: LossScaleState | None = None
        self._host_pointers: tuple[int, ...] = ()

    def advance(self, found_inf: torch.Tensor, shared: ScaleState, sampler: Any = None, recorder: Any = None) -> None:
        """Counts one step beside the ``shared`` scale (read only), and ``sampler``'s. No sync: on the CPU no
        operator, elsewhere the core's 6 scalar operators (none when not :attr:`tracked`)."""
        self.steps += 1
        if sampler is not None:
            sampler.take(recorder)
        if self._scale is not None or not self.tracked:
            _count(sampler)
            return
        device = shared.device
        found_inf = move(found_inf, device)
        if self._skipped is None:
            self._skipped = torch.zeros((), dtype=torch.int32, device=device)
            self._streak = torch.zeros((), dtype=torch.int32, device=device)
        elif self._skipped.device != device:
            self._skipped, self._streak = self._skipped.to(device), self._streak.to(device)  # type: ignore[union-attr]
        own = LossScaleState(*shared.tensors[:3], self._skipped, self._streak)  # type: ignore[arg-type]
        views = _host_views(self, own)
        if views is not None:
            count = advance_in_place(shared.policy, views, float(found_inf.detach().numpy()) == 0.0,
                                     count=None if sampler is None else sampler.state.count, moves_scale=False)
            if sampler is not None:
                sampler.state = sampler.state._replace(count=count)
            return
        new, moved = advance(shared.policy, own, found_inf == 0, torch, moves_scale=False,
                             sampler=None if sampler is None else sampler.state)
        self._skipped, self._streak = new.skipped_steps, new.consecutive_skips
        if sampler is not None:
            sampler.state = moved

    def _live(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self._scale is not None:
            state = self._scale.state
            return state.skipped_steps, state.consecutive_skips
        return self._skipped, self._streak

    def skipped_steps(self, device: torch.device) -> torch.Tensor:
        """A copy of this optimizer's skipped-step count (0 on ``device`` before any)."""
        skipped, _ = self._live()
        return torch.zeros((), dtype=torch.int32, device=device) if skipped is None else skipped.clone()

    def consecutive_skips(self, device: torch.device) -> torch.Tensor:
        """A copy of this optimizer's skip streak (0 on ``device`` before any)."""
        _, streak = self._live()
        return torch.zeros((), dtype=torch.int32, device=device) if streak is None else streak.clone()

    def to_record(self) -> CounterRecord:
        """The checkpoint record of the counters (copies)."""
        skipped, streak = self._live()
        if self._scale is not None:  # copies: the scale's tensors move on
            skipped, streak = skipped.detach().clone(), streak.detach().clone()  # type: ignore[union-attr]
        return CounterRecord(self.steps, skipped, streak)

    def load(self, record: CounterRecord, scale: LossScaleState) -> None:
        """Takes over ``record``; counts it lacks come from ``scale``'s state. With a private scale, the scale's
        counters are this optimizer's: the record's step count only is taken."""
        self.steps = record.steps
        if self._scale is not None:
            return
        skipped = scale.skipped_steps if record.skipped_steps is None else record.skipped_steps
        streak = scale.consecutive_skips if record.consecutive_skips is None else record.consecutive_skips
        device = scale.loss_scale.device
        self._skipped, self._streak = (t.to(device=device, dtype=torch.int32, copy=True) for t in (skipped, streak))
