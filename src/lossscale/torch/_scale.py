"""The loss scale's state as torch tensors (:class:`ScaleState`) and its owners, to which a step reports."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from numbers import Real
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from .._auto import AutoLossScale
from .._policy import DynamicLossScale, LossScale
from .._resolve import resolve_loss_scale
from .._rule import COUNTER_MAX, LossScaleState, advance_in_place, initial_state, kernel_form, next_state
from .._torch._compat import foreach_copy_
from .._torch._kernels import advance_scale_, move, reciprocal
from ._checkpoint import ScaleRecord

__all__ = [
    "IterationScale", "PrivateLossScale", "ScaleOwner", "ScaleState", "SharedLossScale", "StepScale",
    "require_own_scale", "scale_owner_for",
]


class ScaleState:
    """A policy and its five live 0-d tensors (float32 scale, four int32 counters); the only code that changes them.

    How a step moves them (:meth:`advance`):

    - on the CPU, :func:`~lossscale._rule.advance_in_place` on numpy views of the tensors' memory: no operator at
      all, a few microseconds of Python;
    - elsewhere, where :func:`~lossscale._rule.kernel_form` covers the policy, its fused form
      (:func:`~lossscale._torch._kernels.advance_scale_`): 5 operators, one of them GradScaler's update kernel (6 after
      a scale was set by hand, 3 for a fixed scale);
    - otherwise :func:`~lossscale._rule.next_state` on the tensors: about 33 operators.

    None reads the device. What the fused form needs known of the state is kept here as plain Python, known at
    construction and read once at a load (one host read off the CPU):

    - ``_room``: how many more steps cannot carry a skip counter past ``COUNTER_MAX`` (the form does not saturate);
    - ``_growth_known``: whether ``good_steps < growth_interval`` holds (false after a load or a shorter interval,
      until one step of the rule restores it);
    - ``_above_floor``: whether ``S >= min_scale`` holds, so that the floor is one ``clamp_min_`` instead of two
      operators (false after a scale set by hand below it, or a higher floor)."""

    _room: int
    _growth_known: bool
    _above_floor: bool

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
        return self.tensors.loss_scale.device

    def inv_scale(self) -> torch.Tensor:
        """``1 / S`` in float32, computed in float64 (for CPU state on the host)."""
        views = self._host_views_now()
        if views is not None:
            with np.errstate(over="ignore"):  # 1/S beyond float32 is inf, as on the device
                return torch.from_numpy(np.asarray(1.0 / float(views.loss_scale), dtype=np.float32))
        return reciprocal(self.tensors.loss_scale)

    def to_(self, device: torch.device) -> None:
        """Moves the state to ``device`` (done for you when gradients move)."""
        if self.device != device:
            self._set_tensors(LossScaleState(*(t.to(device) for t in self.tensors)), room=self._room)

    def advance(self, found_inf: torch.Tensor) -> None:
        """``state <- next_state(policy, state, found_inf == 0)`` in place, no sync: on the CPU in numpy, elsewhere
        by the fused form where it applies (5 operators), else by the rule on the tensors (about 33)."""
        if found_inf.device != self.tensors.loss_scale.device:
            found_inf = move(found_inf, self.device)
        views = self._host_views_now()
        if views is not None:
            advance_in_place(self._params, views, float(found_inf.detach().numpy()) == 0.0)
        elif self._form is not None and self._room > 0 and self._growth_known:
            advance_scale_(self._form, self.tensors, found_inf, above_floor=self._above_floor)
        else:
            new = next_state(self._params, self.tensors, found_inf == 0, torch)
            with torch.no_grad():
                foreach_copy_(list(self.tensors), new)
            self._growth_known = True  # the rule leaves good_steps below growth_interval
        self._room = max(self._room - 1, 0)

    def assign(self, new: LossScaleState) -> None:
        """Writes a rule's new state in place (``AutoLossScale``'s, one step's)."""
        with torch.no_grad():
            foreach_copy_(list(self.tensors), list(new))
        self._room, self._growth_known = max(self._room - 1, 0), False

    def set_scale(self, value: torch.Tensor, found_inf: torch.Tensor | None = None) -> None:
        """``S <- value`` in place, the growth counters kept, ``found_inf`` counted as for a fixed scale; no sync."""
        tensors = list(self.tensors)
        if found_inf is not None:
            finite = move(found_inf, self.device) == 0
            tensors = list(next_state(replace(self._params, dynamic=False), self.tensors, finite, torch))
            self._room = max(self._room - 1, 0)
        with torch.no_grad():
            foreach_copy_(list(self.tensors), [move(value, self.device).reshape(()).float(), *tensors[1:]])
        self._above_floor = False  # not read: the floor takes its exact two-operator form from now on

    def record(self) -> ScaleRecord:
        return ScaleRecord(self._policy, LossScaleState(*(t.detach().clone() for t in self.tensors)))

    def load(self, record: ScaleRecord) -> None:
        self._set_policy(record.policy)
        self._growth_known = False
        self._set_tensors(LossScaleState(*(t.to(self.device, copy=True) for t in record.state)))

    def __getstate__(self) -> dict[str, Any]:
        """Pickling and ``deepcopy`` go through the checkpoint record."""
        return {"record": self.record().to_dict(policy_object=True), "device": str(self.device)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        record = ScaleRecord.from_dict(state["record"])  # validated as a state dict is
        self._growth_known = self._above_floor = False
        self._set_policy(record.policy)
        self._set_tensors(LossScaleState(*(t.to(state["device"]) for t in record.state)))

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
        can be read, the fused form is not used)."""
        self.tensors = tensors
        self._host_views: LossScaleState | None = None
        self._host_pointers: tuple[int, ...] = ()
        if room is None:
            if tensors.loss_scale.device.type == "meta":
                room, self._above_floor = 0, False
            else:
                values = torch.stack([t.detach().double() for t in tensors]).tolist()
                room = COUNTER_MAX - 1 - int(max(values[3], values[4]))
                self._above_floor = values[0] >= self._params.min_scale
        self._room = max(room, 0)

    def _host_views_now(self) -> LossScaleState | None:
        """Numpy views of the CPU tensors' memory; None off the CPU or compiling."""
        if self.tensors.loss_scale.device.type != "cpu" or torch.compiler.is_compiling():
            return None
        pointers = tuple(t.data_ptr() for t in self.tensors)
        if self._host_views is None or pointers != self._host_pointers:
            self._host_views = LossScaleState(*(t.detach().numpy() for t in self.tensors))
            self._host_pointers = pointers
        return self._host_views


class StepScale(NamedTuple):
    """What a step's check needs of the scale (:meth:`ScaleOwner.for_step`)."""

    loss_scale: torch.Tensor  # the live one
    inv_scale: torch.Tensor
    device: torch.device
    can_go_below_one: bool


class ScaleOwner(ScaleState):
    """A :class:`ScaleState` that steps report to with :meth:`add_step`."""

    advances_each_step = False

    @property
    def state(self) -> LossScaleState:
        """The live state tensors (do not modify them)."""
        return self.tensors

    @property
    def loss_scale(self) -> torch.Tensor:
        """The current scale, a 0-d float32 tensor (a copy; no host sync)."""
        return self.tensors.loss_scale.clone()

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * S``, rounded once to ``loss``'s dtype; a callable gives a callable. One op, no sync."""
        if callable(loss) and not isinstance(loss, torch.Tensor):
            return lambda: self.get_scaled_loss(loss())
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"get_scaled_loss() takes a tensor or a zero-argument callable returning one, got "
                            f"{type(loss).__name__}. Compute the loss with torch before scaling it.")
        if not loss.is_floating_point():
            raise TypeError(f"get_scaled_loss() needs a floating-point loss, got dtype {loss.dtype}.")
        scale = self.tensors.loss_scale
        if scale.device != loss.device:
            scale = move(scale, loss.device)
        return torch.mul(loss, scale).to(loss.dtype)

    def for_step(self, device: torch.device | None) -> StepScale:
        """Moves the state to ``device`` (None: stays), then what a step's check needs of it."""
        if device is not None:
            self.to_(device)
        return StepScale(self.tensors.loss_scale, self.inv_scale(), self.device, self.can_go_below_one)

    def add_step(self, found_inf: torch.Tensor, member: Any) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The policy config and copies of the state tensors."""
        return self.record().to_dict()

    def load_state_dict(self, state_dict: dict[str, Any], custom_objects: Mapping[str, type] | None = None) -> None:
        """Restores :meth:`state_dict`'s output, policy included (checked first; nothing changes on error); a policy
        class of your own comes from ``custom_objects``."""
        self.load(ScaleRecord.from_dict(state_dict, custom_objects, current=self.policy))

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_scale" in state:  # pickled when the owner held its ScaleState: {"_scale": ScaleState}
            state = state["_scale"].__getstate__()
        super().__setstate__(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.policy!r})"


class PrivateLossScale(ScaleOwner):
    """The scale of one ``LossScaleOptimizer``: each step advances it at once."""

    advances_each_step = True

    def add_step(self, found_inf: torch.Tensor, member: Any) -> None:
        self.advance(found_inf)

    def update(self) -> None:
        raise RuntimeError("This loss scale belongs to one LossScaleOptimizer, whose step() updates it. "
                           "Only a SharedLossScale passed to several optimizers needs update().")


class SharedLossScale(ScaleOwner):
    """A loss scale that one or more optimizers share.

    Takes :class:`LossScaleOptimizer`'s policy arguments (either of TF's forms) and ``device`` (where the state
    lives; by default the first gradient's device).

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

    def add_step(self, found_inf: torch.Tensor, member: Any) -> None:
        """Keeps one optimizer's flag for :meth:`update`. No sync."""
        self._members.append(member)
        if found_inf.device != self.device:
            found_inf = move(found_inf, self.device)
        self._pending = found_inf if self._pending is None else torch.maximum(self._pending, found_inf)

    def update(self) -> None:
        """Advances the scale once from the flags since the last update (none: nothing); no sync."""
        pending = self._close()
        if pending is not None:
            self.advance(pending)

    def _close(self) -> torch.Tensor | None:
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
        self._close()

    def __getstate__(self) -> dict[str, Any]:
        """``{"scale": ScaleState}``; pending flags and members are not kept."""
        scale = ScaleState(self.policy, self.device)
        scale.assign(self.tensors)
        return {"scale": scale}

    def __setstate__(self, state: dict[str, Any]) -> None:
        scale = state["scale"]
        self._growth_known = self._above_floor = False
        self._set_policy(scale.policy)
        self._set_tensors(scale.tensors)
        self._pending = None
        self._members = []


def require_own_scale(policy: LossScale, owner: ScaleOwner, fix: str) -> None:
    """Refuses ``AutoLossScale`` on a scale shared by several optimizers."""
    if isinstance(policy, AutoLossScale) and not owner.advances_each_step:
        raise ValueError("AutoLossScale sets the scale of one optimizer from its own gradients; a scale shared by "
                         f"several optimizers (SharedLossScale) is not supported yet. {fix}")


_SCALE_KEYWORDS = ("dynamic", "initial_scale", "dynamic_growth_steps", "min_loss_scale", "max_loss_scale", "hysteresis")


def scale_owner_for(optimizer: torch.optim.Optimizer, loss_scale: Any, **stable: Any) -> ScaleOwner:
    """The given :class:`SharedLossScale`, or a private scale on the device of ``optimizer``'s parameters."""
    if isinstance(loss_scale, SharedLossScale):
        given = [k for k in _SCALE_KEYWORDS if stable.get(k) is not None]
        if given:
            raise ValueError(f"A SharedLossScale carries its own policy; drop {', '.join(f'{k}=' for k in given)} "
                             "or give them to SharedLossScale(...).")
        return loss_scale
    policy = resolve_loss_scale(loss_scale, **stable)
    device = next((p.device for g in optimizer.param_groups for p in g["params"]), None)
    return PrivateLossScale(policy, device)


class IterationScale(SharedLossScale):
    """GradScaler's scale: a :class:`SharedLossScale` that also takes a new scale or policy."""

    @property
    def policy(self) -> DynamicLossScale:
        return cast(DynamicLossScale, self._policy)

    @property
    def pending(self) -> torch.Tensor | None:
        """The MAX of this iteration's found-inf flags so far (None before the first step)."""
        return self._pending

    def update(self, new_scale: Any = None) -> None:  # type: ignore[override]
        """Advances the scale once, or sets ``new_scale`` (the growth counter stays). No sync."""
        if new_scale is None:
            super().update()
            return
        fix = "new_scale should be a float or a 1-element tensor with requires_grad=False"
        if isinstance(new_scale, torch.Tensor):
            if new_scale.numel() != 1 or new_scale.requires_grad:
                raise ValueError(f"{fix}; got a tensor of shape {tuple(new_scale.shape)} "
                                 f"(requires_grad={new_scale.requires_grad}).")
            value = new_scale.detach().reshape(()).to(torch.float32, copy=True)
        elif isinstance(new_scale, bool) or not isinstance(new_scale, Real) or not 0 < new_scale < math.inf:
            raise ValueError(f"{fix}, positive and finite; got {new_scale!r}.")
        else:
            value = torch.tensor(float(new_scale), dtype=torch.float32)
        self.set_scale(value, self._close())

    def counts(self, member: Any) -> bool:
        """Whether ``member``'s flag is already among this iteration's."""
        return any(m is member for m in self._members)

    def overwrite(self, *, scale: float | None = None, growth_tracker: int | None = None) -> None:
        if scale is not None:
            self.set_scale(torch.tensor(float(scale)))
        if growth_tracker is not None:
            with torch.no_grad():
                self.state.good_steps.fill_(min(int(growth_tracker), 2**31 - 1))
            self._growth_known = False

    def set_policy(self, policy: DynamicLossScale) -> None:
        """Follows ``policy`` from the next update on; the scale and its counters stay."""
        self._set_policy(policy)
