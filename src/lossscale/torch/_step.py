"""One optimizer's step (:class:`OptimizerStep`): unscale and check, agree across ranks, step or skip, then report,
advance (in ``_state``), append the history row, guard. Stages as torch's ``OptState``: READY -> UNSCALED ->
STEPPED (until ``update()``), kept in a :class:`StepProgress`.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .._torch._kernels import (
    GradGroups,
    reciprocal,
    scaled_norm,
    unscale_and_check_,
    validate_max_norm,
    validated_norm_type,
)
from ._checkpoint import Checkpoint, CounterRecord, ScaleRecord
from ._compat import foreach_mul_
from ._diagnostics import Diagnostics
from ._distributed import FlagAgreement, agree_flag
from ._grads import CheckedGrads, FusedStateTracker, check_step_grads, is_fused, require_unscalable, run_inner_step
from ._state import PrivateLossScale, SharedLossScale, SkipCounters
from ._stats import StatsSampler

__all__ = ["OptimizerStep", "Stage", "StepProgress", "misuse"]


class Stage(enum.Enum):
    READY = "ready"
    UNSCALED = "unscaled"
    STEPPED = "stepped"


# the call that brought the progress where it is -> (since when, the fix)
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
class StepProgress:
    """Where one optimizer's iteration stands: its ``stage``, whether it was ``clipped``, its check's ``found_inf``
    (0-d float32) and ``grad_scale`` (a fused clip's ``S / coef``). A ``GradScaler`` shows it to client code as
    torch's ``_per_optimizer_states[id(optimizer)]``."""

    stage: Stage = Stage.READY
    clipped: bool = False
    found_inf: torch.Tensor | None = None
    grad_scale: torch.Tensor | None = None

    def require(self, call: str) -> None:
        """Refuses ``call()`` where this stage does not allow it (:func:`misuse`'s error)."""
        if self.stage is Stage.STEPPED:
            raise misuse(call, "step")
        if self.clipped and call == "clip_grad_norm_":
            raise misuse(call, "clip_grad_norm_")

    def checked(self, found_inf: torch.Tensor, grad_scale: torch.Tensor | None = None, clipped: bool = False) -> None:
        """UNSCALED, with the check's flag (and a fused clip's ``grad_scale``)."""
        self.stage, self.found_inf, self.grad_scale, self.clipped = Stage.UNSCALED, found_inf, grad_scale, clipped

    def reset(self) -> None:
        """READY, nothing checked."""
        self.stage, self.found_inf, self.grad_scale, self.clipped = Stage.READY, None, None, False

    def stepped(self, found_inf: torch.Tensor | None = None) -> None:
        """STEPPED until the scale's update, keeping the step's flag readable (torch's ``found_inf_per_device``)."""
        self.stage, self.found_inf, self.grad_scale, self.clipped = Stage.STEPPED, found_inf, None, False

    def forget_check(self) -> None:
        """``zero_grad()``: a pending check is gone (a step is not forgotten)."""
        if self.stage is not Stage.STEPPED:
            self.reset()


class OptimizerStep:
    """One optimizer's step over one scale, in torch's three stages (READY -> UNSCALED -> STEPPED): unscale and
    check (:meth:`unscale_`, :meth:`clip_grad_norm_`, or inside :meth:`step`), step or skip (:meth:`apply`), then
    :meth:`finish`: overflow report, the scale's and counters' advance (in ``_state``), history, stall guard.

    Args:
        owner: the scale (a :class:`~lossscale.torch._state.ScaleState`): private, or shared with others.
        agree: the groups the found-inf flag is MAX-reduced over, or None (one process).
        diagnostics: the optimizer's guard, reporter and recorder (None: all off).
        sampler: the ``stats_every`` sampler, or None.
        index: this optimizer's index in a GradScaler's shared ``sampler`` (its names are prefixed ``opt{index}.``;
            the GradScaler's update counts the sampler), or None for a ``LossScaleOptimizer``'s own.
        own_counters: with a shared ``owner``, whether this optimizer keeps skip counters of its own (a
            GradScaler's optimizers keep them only for a stall guard).
    """

    def __init__(self, owner: PrivateLossScale | SharedLossScale, agree: FlagAgreement | None = None, diagnostics: Diagnostics | None = None,
                 sampler: StatsSampler | None = None, index: int | None = None, *, own_counters: bool = True) -> None:
        self.owner = owner
        self.agree = agree
        self.diagnostics = Diagnostics(None, False, None, None) if diagnostics is None else diagnostics
        self.progress = StepProgress()
        self.tracker = FusedStateTracker()
        private = owner if owner.advances_each_step else None
        self.counters = SkipCounters(private, own_counters or self.diagnostics.guard is not None)
        self.sampler, self.index = sampler, index
        self.number: int | None = None  # the overflow report's step number, set by a GradScaler (None: counters.steps)
        self._in_closure = False

    def measure_if_due(self, inner: torch.optim.Optimizer, pairs: Any = None, factor: torch.Tensor | None = None) -> None:
        """On a sampled step (``sampler.due``), has the sampler :meth:`~StatsSampler.measure` the *scaled*
        gradients: ``pairs`` ``((group, index), param, grad)`` (default: every ``.grad`` of ``inner``), times
        ``factor`` (None: 1). Unsampled: nothing, no device work."""
        sampler = self.sampler
        if sampler is None or not sampler.due:
            return
        if pairs is None:
            pairs = [((g, i), p, p.grad) for g, group in enumerate(inner.param_groups)
                     for i, p in enumerate(group["params"]) if p.grad is not None]
        reporter, prefix = self.diagnostics.reporter, "" if self.index is None else f"opt{self.index}."

        def name_of(where: tuple[int, int]) -> str:
            g, i = where
            if reporter is not None:
                return prefix + reporter.name_of(inner.param_groups[g]["params"][i], g, i)
            return f"{prefix}param_groups[{g}]['params'][{i}]"

        sampler.measure(0 if self.index is None else self.index, pairs, name_of, factor)

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
        progress = self.progress
        progress.require("unscale_")
        if progress.stage is Stage.UNSCALED and progress.grad_scale is None:
            return
        grads = self._collect(inner)
        if not grads.tensors:
            return
        if progress.stage is Stage.UNSCALED:  # after a fused clip
            require_unscalable(grads, "unscale_() after clip_grad_norm_()")
            foreach_mul_(grads.tensors, reciprocal(progress.grad_scale))  # type: ignore[arg-type]
            progress.grad_scale = None
            return
        require_unscalable(grads, "unscale_()")
        self.measure_if_due(inner)
        progress.checked(self._unscale_and_check(grads))

    def clip_grad_norm_(self, inner: torch.optim.Optimizer, max_norm: Any, norm_type: Any = 2.0) -> torch.Tensor:
        """``norm = ||g_scaled||_p / S``, ``coef = min(1, max_norm / (norm + 1e-6))``: ``g *= coef / S``, or for a
        fused ``inner`` ``grad_scale = S / coef``."""
        norm_type = validated_norm_type(norm_type)
        validate_max_norm(max_norm)
        progress, owner = self.progress, self.owner
        progress.require("clip_grad_norm_")
        grads = self._collect(inner)
        if not grads.tensors:
            return torch.zeros((), dtype=torch.float32, device=owner.device)
        if progress.stage is Stage.UNSCALED:
            total = scaled_norm(grads, norm_type, out_device=owner.device)
            foreach_mul_(grads.tensors, torch.clamp(max_norm / (total + 1e-6), max=1.0))
            progress.clipped = True
            return total
        self.measure_if_due(inner)
        total = scaled_norm(grads, norm_type, out_device=owner.device) * owner.inv_scale()
        found_inf = (~torch.isfinite(total)).float()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if is_fused(inner):
            progress.checked(found_inf, owner.state.loss_scale / coef, clipped=True)
        else:
            require_unscalable(grads, "clip_grad_norm_()")
            foreach_mul_(grads.tensors, owner.inv_scale() * coef)
            progress.checked(found_inf, clipped=True)
        return total

    def step(self, inner: torch.optim.Optimizer, args: tuple = (), kwargs: dict | None = None, *,
             on_host: bool = False, named_grads: Any = (),
             checked: CheckedGrads | None = None) -> tuple[torch.Tensor, bool | None, Any] | None:
        """One step of ``inner``: check, agree, step or skip, finish.

        The gradients are checked by :func:`~lossscale.torch._grads.check_step_grads` (or ``unscale_()``'s or a
        clip's check is taken, or ``checked`` when given); the flag is agreed across ranks; ``inner.step(*args,
        **kwargs)`` runs or is skipped (:func:`~lossscale.torch._grads.run_inner_step`: one sync unless a fused
        kernel skips by itself); :meth:`finish` advances the state and records.

        Args:
            inner: the inner optimizer.
            args, kwargs: ``inner.step``'s arguments.
            on_host: decide a fused optimizer's skip on the host (one sync), so a skip calls no ``inner.step``.
            named_grads: ``(name, grad)`` pairs for the overflow report, or a zero-argument callable returning them.
            checked: a check made elsewhere (TF's ``apply_gradients``), taken as it is.

        Returns:
            ``(found_inf, skipped, inner.step's result)``; ``skipped`` is None where a fused kernel decided on the
            device. None when no parameter has a gradient (nothing happens).

        Raises:
            RuntimeError: ``step()`` again before the scale's update (:func:`misuse`).
        """
        progress = self.progress
        progress.require("step")
        if checked is None:
            unscaled = progress.stage is Stage.UNSCALED
            if not unscaled:
                self.measure_if_due(inner)
            checked = check_step_grads(inner, self.owner, progress if unscaled else None)
            if checked is None:
                return None
        found_inf = agree_flag(self.agree, checked.found_inf)
        skipped, result = run_inner_step(inner, found_inf, checked.grad_scale, self.tracker, fused=checked.fused,
                                         on_host=on_host, args=args, kwargs=kwargs)
        self.finish(found_inf, skipped, named_grads)
        return found_inf, skipped, result

    def stepped_by_itself(self, named_grads: Any = ()) -> None:
        """After ``inner.step(grad_scaler=...)``, which unscaled, checked and skipped by itself: finishes with the
        flag it recorded (``unscale_``, ``_check_inf_per_device`` or ``_per_optimizer_states``), else only marks the
        optimizer stepped (nothing for ``update()``, as in torch)."""
        found_inf = self.progress.found_inf
        if found_inf is None:
            self.progress.stepped()
            return
        self.finish(agree_flag(self.agree, found_inf), None, named_grads)

    def finish(self, found_inf: torch.Tensor, skipped: bool | None, named_grads: Any = ()) -> None:
        """Ends a step: overflow report, then the scale (private: now; shared: at its update), the optimizer's own
        counters and the sampler advance in ``_state``, then the history row and the stall guard."""
        diagnostics, counters, owner, progress = self.diagnostics, self.counters, self.owner, self.progress
        step = counters.steps if self.number is None else self.number
        scale_used = owner.state.loss_scale.clone() if diagnostics.wants_scale else None
        if diagnostics.reporter is not None:
            diagnostics.reporter.observe(step, found_inf, skipped, scale_used, named_grads)  # type: ignore[arg-type]
        if owner.advances_each_step:
            progress.reset()
        else:
            progress.stepped(found_inf)
        sampler = self.sampler if self.index is None else None  # a GradScaler's update counts its shared sampler
        owner.add_step(found_inf, progress, counters, sampler, diagnostics.recorder)
        if diagnostics.recorder is not None:
            diagnostics.recorder.append(step, scale_used, found_inf > 0)  # type: ignore[arg-type]
        if diagnostics.guard is not None:
            diagnostics.guard.check(counters.consecutive_skips(found_inf.device), owner.state.loss_scale)

    def step_with_closure(self, inner: torch.optim.Optimizer, closure: Callable[[], Any], named_grads: Any = ()) -> Any:
        """``inner.step(closure)``, every evaluation unscaled and checked (LBFGS). Cost: copies of the weights and
        inner state (restored on an overflow), one R+W pass per evaluation, one host sync."""
        self.progress.require("step")
        params = [p for g in inner.param_groups for p in g["params"]]
        saved_params = [p.detach().clone() for p in params]
        saved_state = copy.deepcopy(inner.state_dict())
        found_total = torch.zeros((), dtype=torch.float32, device=self.owner.device)
        seen = False  # whether an evaluation had gradients

        def unscaled_closure() -> Any:
            nonlocal seen
            with torch.enable_grad():
                loss = closure()
            grads = self._collect(inner)
            if grads.tensors:
                require_unscalable(grads, "step(closure)")
                if not seen:  # the sample: the first evaluation's gradients, at the step's weights
                    self.measure_if_due(inner)
                seen = True
                found_total.add_(self._unscale_and_check(grads).to(found_total.device))
            return loss

        self.progress.reset()
        if self.sampler is not None and self.index is None:
            self.sampler.forget()  # the backward passes counted for the sample are the closure's own
        self._in_closure = True
        try:
            loss = inner.step(unscaled_closure)
        finally:
            self._in_closure = False
        if not seen:
            if self.sampler is not None:
                self.sampler.forget()
            return loss
        found_total = agree_flag(self.agree, torch.clamp(found_total, max=1.0))
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
        self.progress.forget_check()
        if self.sampler is not None and self.index is None and not self._in_closure:
            self.sampler.forget()

    def reset(self) -> None:
        self.tracker.reset()
        self.progress.reset()

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
            "scale": None if shared is not None else self.owner.to_record().to_dict(policy_object=True),
            "optimizer": self.counters.to_record().to_dict(),
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
