"""One optimizer's step (:class:`OptimizerStep`): check, agree across ranks, step or skip, then report, count,
advance the scale, record, guard. Stages as torch's ``OptState``: READY -> UNSCALED -> STEPPED (until ``update()``).
"""

from __future__ import annotations

import copy
import enum
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._rule import LossScaleState, _HostScalars, next_skip_counters
from .._torch._compat import AMP_SCALING, foreach_mul_, step_with_scale, takes_grad_scaler
from .._torch._kernels import (
    GradGroups,
    check_param_grads_,
    kernel_unscales,
    reciprocal,
    scaled_norm,
    unscale_and_check_,
    validate_max_norm,
    validated_norm_type,
)
from ._checkpoint import Checkpoint, CounterRecord, ScaleRecord
from ._diagnostics import Diagnostics
from ._distributed import FlagAgreement, all_reduce_max
from ._scale import PrivateLossScale, SharedLossScale
from ._stats import StatsSampler

__all__ = ["FusedStateTracker", "OptimizerStep", "Stage", "StepCounters", "StepRecord", "misuse"]


class Stage(enum.Enum):
    READY = "ready"
    UNSCALED = "unscaled"
    STEPPED = "stepped"


# the call that brought the record where it is -> (since when, the fix)
_AFTER = {
    "unscale_": ("the last step()", "Call step() (or zero_grad()) first."),
    "clip_grad_norm_": ("the last step()", "Clip once per iteration, then call step()."),
    "step": ("the scale's last update()", (
        "Call update() once per iteration, after every optimizer's step() "
        "(shared_scale.update() for a SharedLossScale, scaler.update() for a GradScaler).")),
}


def misuse(call: str, after: str) -> RuntimeError:
    """The error for ``call()`` refused because of an earlier ``after()`` on the same optimizer."""
    since, fix = _AFTER[after]
    what = "was called twice" if call == after else f"was called after {after}()"
    return RuntimeError(f"{call}() {what} on the same optimizer since {since}. {fix}")


@dataclass
class StepRecord:
    """The stage of one optimizer's iteration, its ``found_inf`` (0-d float32) and ``grad_scale`` (a fused clip's)."""

    stage: Stage = Stage.READY
    clipped: bool = False
    found_inf: torch.Tensor | None = None
    grad_scale: torch.Tensor | None = None

    def require(self, call: str) -> None:
        if self.stage is Stage.STEPPED:
            raise misuse(call, "step")
        if self.clipped and call == "clip_grad_norm_":
            raise misuse(call, "clip_grad_norm_")

    def checked(self, found_inf: torch.Tensor, grad_scale: torch.Tensor | None = None, clipped: bool = False) -> None:
        self.stage, self.found_inf, self.grad_scale, self.clipped = Stage.UNSCALED, found_inf, grad_scale, clipped

    def reset(self) -> None:
        self.stage, self.found_inf, self.grad_scale, self.clipped = Stage.READY, None, None, False

    def stepped(self, found_inf: torch.Tensor | None = None) -> None:
        """STEPPED until the scale's update, keeping the step's flag readable (torch's ``found_inf_per_device``)."""
        self.stage, self.found_inf, self.grad_scale, self.clipped = Stage.STEPPED, found_inf, None, False

    def forget_check(self) -> None:
        """``zero_grad()``: a pending check is gone (a step is not forgotten)."""
        if self.stage is not Stage.STEPPED:
            self.reset()


class StepCounters:
    """One optimizer's own ``steps``, ``skipped_steps`` and ``consecutive_skips`` (core: ``next_skip_counters``).

    Args:
        scale: the optimizer's private scale, whose state's skip counters count exactly this optimizer's steps:
            they are then read there, and counting costs nothing on the device. None (a scale shared by several
            optimizers, whose counters count iterations): this optimizer keeps its own.
        tracked: with no ``scale``, whether the skip counters are kept at all (a GradScaler keeps them only for
            its stall guard; the Python step count is kept always).
    """

    def __init__(self, scale: Any = None, tracked: bool = True) -> None:
        self.steps = 0
        self._scale, self._tracked = scale, tracked
        self._skipped: torch.Tensor | None = None
        self._streak: torch.Tensor | None = None

    def count(self, found_inf: torch.Tensor) -> None:
        """Counts one step: with a private scale nothing more (its rule counts), else on CPU on numpy views,
        elsewhere three scalar ops; no sync."""
        self.steps += 1
        if self._scale is not None or not self._tracked:
            return
        device = found_inf.device
        if self._skipped is None:
            self._skipped = torch.zeros((), dtype=torch.int32, device=device)
            self._streak = torch.zeros((), dtype=torch.int32, device=device)
        elif self._skipped.device != device:
            self._skipped, self._streak = self._skipped.to(device), self._streak.to(device)  # type: ignore[union-attr]
        if device.type == "cpu" and not torch.compiler.is_compiling():
            views = self._skipped.numpy(), self._streak.numpy()  # type: ignore[union-attr]
            finite = np.bool_(float(found_inf.detach().numpy()) == 0.0)
            new = next_skip_counters(views[0][()], views[1][()], finite, _HostScalars)
            for view, value in zip(views, new):
                view[...] = value
            return
        self._skipped, self._streak = next_skip_counters(self._skipped, self._streak, found_inf == 0, torch)

    def _live(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self._scale is not None:
            state = self._scale.state
            return state.skipped_steps, state.consecutive_skips
        return self._skipped, self._streak

    def skipped_steps(self, device: torch.device) -> torch.Tensor:
        skipped = self._live()[0]
        return torch.zeros((), dtype=torch.int32, device=device) if skipped is None else skipped.clone()

    def consecutive_skips(self, device: torch.device) -> torch.Tensor:
        streak = self._live()[1]
        return torch.zeros((), dtype=torch.int32, device=device) if streak is None else streak.clone()

    def record(self) -> CounterRecord:
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


_SETTING_TYPES = (bool, int, float, str, tuple, type(None))


def hands_scale(inner: torch.optim.Optimizer) -> bool:
    """Whether a fused ``inner`` gets float32 gradients scaled, with ``grad_scale = S`` (``torch.amp.GradScaler``'s
    contract, which an optimizer of your own may rely on), rather than unscaled by the check pass with
    ``grad_scale = None``. torch's own fused optimizers get the latter: their kernels compute the same update from
    either (bit for bit at power-of-two scales), and given ``grad_scale`` they also write the unscaled gradients
    back, one more write over the gradients in the step."""
    return not type(inner).__module__.startswith("torch.optim.")


def is_fused(inner: torch.optim.Optimizer) -> bool:
    """Whether ``inner.step()`` reads ``grad_scale``/``found_inf`` (torch's fused optimizers). One whose ``step``
    takes ``grad_scaler=`` (the older contract) is not: it would ignore them, so it gets unscaled gradients and a
    skip decided on the host (a ``GradScaler`` passes itself to it instead, as torch's does)."""
    return bool(getattr(inner, AMP_SCALING, False)) and not takes_grad_scaler(inner)


class FusedStateTracker:
    """Which parameters of a fused optimizer still lack state (their step is decided on the host: a device-side
    skip would leave a first step's state behind). Cost once all have state: one comparison of counts per step."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._stateless: set[tuple[int, tuple]] = set()
        self._all_stateful: tuple[Any, int] | None = None  # (state dict, parameter count)
        self._checked_count = -1

    def needs_host_decision(self, inner: torch.optim.Optimizer) -> bool:
        state = inner.state
        count = sum(len(group["params"]) for group in inner.param_groups)
        known = self._all_stateful
        if known is not None and known[0] is state and known[1] == count:
            return False
        if count != self._checked_count:
            check_fused_kernels(inner)
            self._checked_count = count
        missing = list(_params_without_state(inner))
        if not missing:
            self._all_stateful = (state, count)
        return any(key not in self._stateless for p, key in missing if p.grad is not None)

    def note_host_step(self, inner: torch.optim.Optimizer) -> None:
        self._stateless.update(key for p, key in _params_without_state(inner) if p.grad is not None)


def _params_without_state(inner: torch.optim.Optimizer) -> Iterable[tuple[torch.Tensor, tuple[int, tuple]]]:
    state = inner.state
    for group in inner.param_groups:
        settings = tuple(sorted((k, v) for k, v in group.items()
                                if k not in ("params", "lr") and isinstance(v, _SETTING_TYPES)))
        for p in group["params"]:
            if not state.get(p):
                yield p, (id(p), settings)


@functools.cache
def fused_sgd_skips_half_on_cpu(dtype: torch.dtype) -> bool:
    """Whether this torch's fused SGD on CPU leaves a 16-element ``dtype`` parameter unchanged (probed once)."""
    p = torch.nn.Parameter(torch.zeros(16, dtype=dtype))
    p.grad = torch.ones_like(p)
    torch.optim.SGD([p], lr=1.0, fused=True).step()
    return bool((p.detach() == 0).any())


def check_fused_kernels(inner: torch.optim.Optimizer) -> None:
    """Refuses a fused SGD with float16/bfloat16 CPU parameters where torch's kernel skips them (torch 2.13)."""
    if not isinstance(inner, torch.optim.SGD):
        return
    for group in inner.param_groups:
        if not group.get("fused"):
            continue
        for p in group["params"]:
            half = p.dtype in (torch.float16, torch.bfloat16)
            if half and p.device.type == "cpu" and p.numel() >= 16 and fused_sgd_skips_half_on_cpu(p.dtype):
                raise ValueError(f"torch {torch.__version__}'s fused SGD on CPU does not update {p.dtype} parameters "
                                 "of 16 or more elements (it leaves them unchanged, with or without loss scaling). "
                                 "Use torch.optim.SGD(..., foreach=True) with float32 parameters under "
                                 "torch.autocast, or torch.optim.AdamW(..., fused=True), whose CPU kernel works.")


def require_unscalable(grads: GradGroups, what: str) -> None:
    """Refuses to unscale float16 gradients in float16 (small values would flush to zero)."""
    if grads.has_float16:
        broken = ""
        if fused_sgd_skips_half_on_cpu(torch.float16):
            broken = (f" (not SGD(fused=True) on CPU: torch {torch.__version__}'s kernel leaves float16 parameters "
                      "unchanged)")
        raise ValueError(f"Attempting to unscale FP16 gradients. {what} would unscale float16 gradients in float16, "
                         "flushing to zero the small values loss "
                         "scaling exists to keep. Keep float32 parameters and run the model under torch.autocast, "
                         "or use a fused inner optimizer (e.g. torch.optim.AdamW(..., fused=True))"
                         f"{broken} and call step() directly: it unscales inside its float32 kernel.")


class OptimizerStep:
    """One optimizer's step over one scale owner; ``slot``: its index in a GradScaler's shared ``sampler``."""

    def __init__(self, owner: Any, agree: FlagAgreement | None = None, diagnostics: Diagnostics | None = None,
                 sampler: StatsSampler | None = None, slot: int | None = None, *, own_counters: bool = True) -> None:
        """``own_counters``: with a shared ``owner``, whether this optimizer keeps skip counters of its own (a
        GradScaler's optimizers keep them only for a stall guard)."""
        self.owner = owner
        self.agree = agree
        self.diagnostics = Diagnostics(None, False, None, None) if diagnostics is None else diagnostics
        self.record = StepRecord()
        self.tracker = FusedStateTracker()
        private = owner if owner.advances_each_step else None
        self.counters = StepCounters(private, own_counters or self.diagnostics.guard is not None)
        self.sampler, self.slot = sampler, slot
        self.number: int | None = None  # the overflow report's step number, set by a GradScaler (None: counters.steps)
        self._in_closure = False

    def measure(self, inner: torch.optim.Optimizer, pairs: Any = None, factor: torch.Tensor | None = None) -> None:
        """On a sampled step, the sums of the *scaled* gradients ``((group, index), param, grad)`` times ``factor``."""
        sampler = self.sampler
        if sampler is None or not sampler.due:
            return
        if pairs is None:
            pairs = [((g, i), p, p.grad) for g, group in enumerate(inner.param_groups)
                     for i, p in enumerate(group["params"]) if p.grad is not None]
        reporter, prefix = self.diagnostics.reporter, "" if self.slot is None else f"opt{self.slot}."

        def name_of(where: tuple[int, int]) -> str:
            g, i = where
            if reporter is not None:
                return prefix + reporter.name_of(inner.param_groups[g]["params"][i], g, i)
            return f"{prefix}param_groups[{g}]['params'][{i}]"

        sampler.measure(0 if self.slot is None else self.slot, pairs, name_of, factor)

    def _collect(self, inner: torch.optim.Optimizer) -> GradGroups:
        grads = GradGroups.of(inner.param_groups)
        if grads.device is not None:
            self.owner.to_(grads.device)
        return grads

    def _unscale_and_check(self, grads: GradGroups) -> torch.Tensor:
        scale = self.owner.for_step(None)
        return unscale_and_check_(grads, scale.inv_scale, out_device=scale.device, recheck=scale.can_go_below_one)

    def unscale_(self, inner: torch.optim.Optimizer) -> None:
        """READY -> UNSCALED (then a no-op); after a fused clip, applies its ``coef / S``. One R+W pass; no sync."""
        record = self.record
        record.require("unscale_")
        if record.stage is Stage.UNSCALED and record.grad_scale is None:
            return
        grads = self._collect(inner)
        if not grads.tensors:
            return
        if record.stage is Stage.UNSCALED:  # after a fused clip
            require_unscalable(grads, "unscale_() after clip_grad_norm_()")
            foreach_mul_(grads.tensors, reciprocal(record.grad_scale))  # type: ignore[arg-type]
            record.grad_scale = None
            return
        require_unscalable(grads, "unscale_()")
        self.measure(inner)
        record.checked(self._unscale_and_check(grads))

    def clip_grad_norm_(self, inner: torch.optim.Optimizer, max_norm: Any, norm_type: Any = 2.0) -> torch.Tensor:
        """``norm = ||g_scaled||_p / S``, ``coef = min(1, max_norm / (norm + 1e-6))``: ``g *= coef / S``, or for a
        fused ``inner`` ``grad_scale = S / coef``."""
        norm_type = validated_norm_type(norm_type)
        validate_max_norm(max_norm)
        record, owner = self.record, self.owner
        record.require("clip_grad_norm_")
        grads = self._collect(inner)
        if not grads.tensors:
            return torch.zeros((), dtype=torch.float32, device=owner.device)
        if record.stage is Stage.UNSCALED:
            total = scaled_norm(grads, norm_type, out_device=owner.device)
            foreach_mul_(grads.tensors, torch.clamp(max_norm / (total + 1e-6), max=1.0))
            record.clipped = True
            return total
        self.measure(inner)
        total = scaled_norm(grads, norm_type, out_device=owner.device) * owner.inv_scale()
        found_inf = (~torch.isfinite(total)).float()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if is_fused(inner):
            record.checked(found_inf, owner.state.loss_scale / coef, clipped=True)
        else:
            require_unscalable(grads, "clip_grad_norm_()")
            foreach_mul_(grads.tensors, owner.inv_scale() * coef)
            record.checked(found_inf, clipped=True)
        return total

    def step(self, inner: torch.optim.Optimizer, args: tuple = (), kwargs: dict | None = None, *,
             on_host: bool = False, named_grads: Any = ()) -> tuple[torch.Tensor, bool | None, Any] | None:
        """Checks (or takes what ``unscale_()``/a clip checked), then :meth:`apply`: ``(found_inf, skipped,
        inner.step's result)``, None with no gradient. A fused ``inner`` gets a check only and the scaled
        gradients with ``grad_scale = S``, as ``torch.amp.GradScaler`` gives (its kernel unscales in float32),
        except float32 gradients where :func:`hands_scale` says no (torch's own fused optimizers) or with
        ``min_loss_scale < 1`` (``g / S`` may overflow inside the kernel): unscaled here, ``grad_scale`` None."""
        record = self.record
        record.require("step")
        fused = is_fused(inner)
        if record.stage is Stage.UNSCALED:
            found_inf, grad_scale = record.found_inf, record.grad_scale
            if found_inf is None:  # a client set the stage through _per_optimizer_states without a flag
                raise RuntimeError("No inf checks were recorded for this optimizer. Set its "
                                   "_per_optimizer_states[id(optimizer)]['found_inf_per_device'] along with its "
                                   "stage, or call unscale_(optimizer) instead.")
        else:
            scale = self.owner.for_step(None)
            self.measure(inner)
            contract = fused and hands_scale(inner)
            grads, found_inf = check_param_grads_(inner.param_groups, scale.inv_scale, fused=fused,
                                                  recheck=scale.can_go_below_one, contract=contract)
            if not grads.tensors:
                return None
            if found_inf is None:
                require_unscalable(grads, "step()")
            if grads.device != scale.device:  # the scale follows the gradients
                scale = self.owner.for_step(grads.device)
            unscales = kernel_unscales(grads, fused=fused, recheck=scale.can_go_below_one, contract=contract)
            grad_scale = scale.loss_scale if unscales else None
        return self.apply(inner, found_inf, grad_scale, args, kwargs,  # type: ignore[arg-type]
                          on_host=on_host, named_grads=named_grads, fused=fused)

    def apply(self, inner: torch.optim.Optimizer, found_inf: torch.Tensor, grad_scale: torch.Tensor | None,
              args: tuple = (), kwargs: dict | None = None, *, on_host: bool = False, named_grads: Any = (),
              fused: bool | None = None) -> tuple[torch.Tensor, bool | None, Any]:
        """Agrees on ``found_inf``, runs ``inner.step(*args, **kwargs)`` unless set, finishes. Unfused, a parameter
        without state, or ``on_host``: one sync, and a skip calls no ``inner.step``; else the fused kernel gets
        ``grad_scale``/``found_inf`` and skips by itself (``skipped`` None)."""
        self.record.require("step")
        found_inf = self._agreed(found_inf)
        fused = is_fused(inner) if fused is None else fused
        on_host = on_host or not fused or self.tracker.needs_host_decision(inner)
        skipped: bool | None = None
        result = None
        if on_host and bool(found_inf.item()):  # the one host sync of the unfused path
            skipped = True
        elif on_host and not fused:
            result = inner.step(*args, **(kwargs or {}))
            skipped = False
        else:
            result = step_with_scale(inner, grad_scale, found_inf, args, kwargs)
            if on_host:
                self.tracker.note_host_step(inner)
                skipped = False
        self.finish(found_inf, skipped, named_grads)
        return found_inf, skipped, result

    def stepped_by_itself(self, named_grads: Any = ()) -> None:
        """After ``inner.step(grad_scaler=...)``, which unscaled, checked and skipped by itself: finishes with the
        flag it recorded (``unscale_``, ``_check_inf_per_device`` or ``_per_optimizer_states``), else only marks the
        optimizer stepped (nothing for ``update()``, as in torch)."""
        found_inf = self.record.found_inf
        if found_inf is None:
            self.record.stepped()
            return
        self.finish(self._agreed(found_inf), None, named_grads)

    def _agreed(self, found_inf: torch.Tensor) -> torch.Tensor:
        agree = self.agree
        if agree is None:
            return found_inf
        groups = agree.groups if agree.groups is not None else agree.resolve()
        return all_reduce_max(found_inf, groups) if groups else found_inf

    def finish(self, found_inf: torch.Tensor, skipped: bool | None, named_grads: Any = ()) -> None:
        """Ends a step: overflow report, counters, the scale, history, stall guard."""
        diagnostics, counters, owner, record = self.diagnostics, self.counters, self.owner, self.record
        step = counters.steps if self.number is None else self.number
        scale_used = owner.state.loss_scale.clone() if diagnostics.wants_scale else None
        if diagnostics.reporter is not None:
            diagnostics.reporter.observe(step, found_inf, skipped, scale_used, named_grads)  # type: ignore[arg-type]
        counters.count(found_inf)
        if owner.advances_each_step:
            record.reset()
        else:
            record.stepped(found_inf)
        sampler = self.sampler if self.slot is None else None
        new = None if sampler is None else sampler.advance(owner.state, found_inf, diagnostics.recorder)
        if new is None:
            owner.add_step(found_inf, record)
        else:
            owner.assign(new)
        if diagnostics.recorder is not None:
            diagnostics.recorder.record(step, scale_used, found_inf > 0)  # type: ignore[arg-type]
        if diagnostics.guard is not None:
            diagnostics.guard.check(counters.consecutive_skips(found_inf.device), owner.state.loss_scale)

    def step_with_closure(self, inner: torch.optim.Optimizer, closure: Callable[[], Any], named_grads: Any = ()) -> Any:
        """``inner.step(closure)``, every evaluation unscaled and checked (LBFGS). Cost: copies of the weights and
        inner state (restored on an overflow), one R+W pass per evaluation, one host sync."""
        self.record.require("step")
        params = [p for g in inner.param_groups for p in g["params"]]
        saved_params = [p.detach().clone() for p in params]
        saved_state = copy.deepcopy(inner.state_dict())
        found_total = torch.zeros((), dtype=torch.float32, device=self.owner.device)
        seen = [False]

        def unscaled_closure() -> Any:
            with torch.enable_grad():
                loss = closure()
            grads = self._collect(inner)
            if grads.tensors:
                require_unscalable(grads, "step(closure)")
                if not seen[0]:  # the sample: the first evaluation's gradients, at the step's weights
                    self.measure(inner)
                seen[0] = True
                found_total.add_(self._unscale_and_check(grads).to(found_total.device))
            return loss

        self.record.reset()
        if self.sampler is not None and self.slot is None:
            self.sampler.forget()  # the backward passes counted for the sample are the closure's own
        self._in_closure = True
        try:
            loss = inner.step(unscaled_closure)
        finally:
            self._in_closure = False
        if not seen[0]:
            if self.sampler is not None:
                self.sampler.forget()
            return loss
        found_total = self._agreed(torch.clamp(found_total, max=1.0))
        skipped = bool(found_total.item())  # one host sync per closure step
        if skipped:
            with torch.no_grad():
                for p, saved in zip(params, saved_params):
                    p.copy_(saved)
            inner.load_state_dict(saved_state)
        self.finish(found_total, skipped, named_grads)
        return loss

    def forget(self) -> None:
        """``zero_grad()``: a pending check and sample are forgotten."""
        self.record.forget_check()
        if self.sampler is not None and self.slot is None and not self._in_closure:
            self.sampler.forget()

    def reset(self) -> None:
        self.tracker.reset()
        self.record.reset()

    def load(self, checkpoint: Checkpoint) -> None:
        if checkpoint.scale is not None:
            self.owner.load(checkpoint.scale)
            self._load_counters(checkpoint.counters or CounterRecord())
        self.reset()

    def _load_counters(self, record: CounterRecord) -> None:
        """This optimizer's counters; a history past the restored step is cut back to it."""
        self.counters.load(record, self.owner.state)
        recorder = self.diagnostics.recorder
        if recorder is not None:
            recorder.flush()
            recorder.history.truncate(record.steps)

    def pickled(self) -> dict[str, Any]:
        """The ``state_dict`` records and the diagnostics' settings; a shared scale travels as itself."""
        shared = self.owner if isinstance(self.owner, SharedLossScale) else None
        return {
            "shared": shared,
            "scale": None if shared is not None else self.owner.record().to_dict(policy_object=True),
            "optimizer": self.counters.record().to_dict(),
            "diagnostics": self.diagnostics,  # pickles its settings only
        }

    @classmethod
    def unpickled(cls, state: dict[str, Any], agree: FlagAgreement | None) -> OptimizerStep:
        """The step object :meth:`pickled` describes, validated as a state dict is."""
        owner = state["shared"]
        if owner is None:
            record = ScaleRecord.from_dict(state["scale"])
            owner = PrivateLossScale(record.policy, record.state.loss_scale.device)
            owner.load(record)
        step = cls(owner, agree, state["diagnostics"])
        step._load_counters(CounterRecord.from_dict(state["optimizer"]))
        return step
