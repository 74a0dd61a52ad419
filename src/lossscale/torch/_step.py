"""One optimizer's step, top to bottom: :class:`OptimizerStep`, its stage record and its own counters.

An :class:`OptimizerStep` is what ``LossScaleOptimizer`` keeps for its inner
optimizer and what ``GradScaler`` keeps per optimizer (torch's
``per_optimizer_states``). It holds

* ``record``: the :class:`StepRecord` (the stage, and what this
  iteration's check left behind);
* ``tracker``: the :class:`~lossscale.torch._fused.FusedStateTracker`;
* ``counters``: this optimizer's :class:`StepCounters`;
* ``agree``: the found-inf agreement across ranks
  (:class:`~lossscale.torch._distributed.FlagAgreement`);
* ``diagnostics``: the opt-in report, history and stall guard;
* ``sampler``: ``stats_every``'s :class:`~lossscale.torch._stats.StatsSampler`
  (None: off), which every entry point feeds through :meth:`OptimizerStep.measure`
  before it unscales; :meth:`OptimizerStep.finish` ends its step (for
  ``AutoLossScale`` its rule sets the scale in place of the owner's);

and talks to one scale owner (``_scale.py``: a private scale, a
:class:`SharedLossScale`, or GradScaler's per-iteration scale). The torch
optimizer is passed to each call, so a GradScaler can key its steps weakly
by optimizer. One ``step()``::

    found_inf, grad_scale = step.check(inner)       # unscale-and-check (or the record's earlier check)
    found_inf = agree(found_inf)                     # all ranks (optional)
    skipped = apply or skip                          # inner.step(), or the fused kernel skips by itself
    step.finish(found_inf, skipped)                  # report, counters, owner.add_step, history, guard

The stage machine of the record::

    READY ──unscale_()──> UNSCALED ──clip_grad_norm_()──> CLIPPED
      │                                                      ▲
      ├──clip_grad_norm_(), unfused──────────────────────────┘
      ├──clip_grad_norm_(), fused──> CLIP_DEFERRED ──unscale_()──> CLIPPED
      └──step()──> READY, or STEPPED when the scale is advanced later (a shared
                   scale's update()); update() makes every member READY again

``zero_grad()`` forgets a pending check (back to ``READY``), not a step.

Cost (R/W: a read/write pass over the gradients): unscale-and-check R+W
(twice if the scale may fall below 1); clip R (+R+W unless fused); a fused
float16 step an R+W check. Host syncs: one when the decision is on the
host (unfused; a fused step creating state; ``on_host``), else none.
The counters: for CPU flags a few host operations on numpy views (no
sync: a CPU tensor has no queue); elsewhere three scalar device ops.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._rule import LossScaleState, _HostScalars, next_skip_counters
from ._checkpoint import Checkpoint, CounterRecord, ScaleRecord
from .._torch_compat import foreach_mul_, step_with_scale
from ._diagnostics import Diagnostics
from ._fused import FusedStateTracker, fused_sgd_warning, is_fused
from .._torch_kernels import (
    GradGroups,
    check_finite,
    reciprocal,
    scaled_norm,
    unscale_and_check_,
    validate_max_norm,
    validated_norm_type,
)
from ._stats import StatsSampler
from ._scale import PrivateLossScale, SharedLossScale, StepScale

__all__ = ["ANY_BEFORE_STEP", "OptimizerStep", "Stage", "StepCounters", "StepRecord"]


# ------------------------------------------------------------ the stage record

class Stage(enum.Enum):
    READY = "ready"
    UNSCALED = "unscaled"
    CLIPPED = "clipped"
    CLIP_DEFERRED = "clip_deferred"
    STEPPED = "stepped"


#: Every stage in which the gradients of this iteration have not been applied yet.
ANY_BEFORE_STEP = frozenset({Stage.READY, Stage.UNSCALED, Stage.CLIPPED, Stage.CLIP_DEFERRED})

# What brought the record to a stage, and what to do about a call that stage does not accept.
_CAUSE = {
    Stage.UNSCALED: "unscale_()",
    Stage.CLIPPED: "clip_grad_norm_()",
    Stage.CLIP_DEFERRED: "clip_grad_norm_()",
    Stage.STEPPED: "step()",
}
_SINCE = {
    Stage.UNSCALED: "the last step()",
    Stage.CLIPPED: "the last step()",
    Stage.CLIP_DEFERRED: "the last step()",
    Stage.STEPPED: "the scale's last update()",
}
_FIX = {
    Stage.UNSCALED: "Call step() (or zero_grad()) first.",
    Stage.CLIPPED: "Clip once per iteration, then call step().",
    Stage.CLIP_DEFERRED: "Clip once per iteration, then call step().",
    Stage.STEPPED: (
        "Call update() once per iteration, after every optimizer's step() "
        "(shared_scale.update() for a SharedLossScale, scaler.update() for a GradScaler)."
    ),
}


@dataclass
class StepRecord:
    """One optimizer's stage, and the check its gradients already had this iteration.

    Attributes:
        stage: the :class:`Stage`.
        found_inf: 0-d float32 flag (1.0 if a gradient was NaN/Inf), set with
            the stage by a check; None in ``READY``.
        grad_scale: what a fused kernel must divide the gradients by
            (``CLIP_DEFERRED``), else None.
    """

    stage: Stage = Stage.READY
    found_inf: torch.Tensor | None = None
    grad_scale: torch.Tensor | None = None

    def require(self, method: str, accepted: frozenset[Stage]) -> None:
        """Raises the shared ``RuntimeError`` unless the stage is in ``accepted``."""
        if self.stage in accepted:
            return
        cause = _CAUSE[self.stage]
        what = "was called twice" if cause == f"{method}()" else f"was called after {cause}"
        raise RuntimeError(
            f"{method}() {what} on the same optimizer since {_SINCE[self.stage]}. {_FIX[self.stage]}"
        )

    def checked(self, stage: Stage, found_inf: torch.Tensor, grad_scale: torch.Tensor | None = None) -> None:
        """Records a check of this iteration's gradients."""
        self.stage, self.found_inf, self.grad_scale = stage, found_inf, grad_scale

    def reset(self) -> None:
        """Back to ``READY`` (after a step whose scale was advanced, or an ``update()``)."""
        self.stage, self.found_inf, self.grad_scale = Stage.READY, None, None

    def stepped(self) -> None:
        """The step ran; the scale will be advanced by a later ``update()``."""
        self.stage, self.found_inf, self.grad_scale = Stage.STEPPED, None, None

    def forget_check(self) -> None:
        """``zero_grad()``: the gradients are gone, and with them a pending check (a step is not forgotten)."""
        if self.stage is not Stage.STEPPED:
            self.reset()


# ------------------------------------------------------------ this optimizer's own counters

class StepCounters:
    """One optimizer's own counters: ``steps`` (an int), ``skipped_steps`` and ``consecutive_skips`` (0-d int32).

    Per optimizer even when several share one scale: with a
    :class:`SharedLossScale`, optimizer A's ``last_step_skipped``,
    ``skipped_steps`` and stall guard count A's own overflows, and move at
    A's ``step()``. Per counted step with ``skip = found_inf > 0``: ``steps
    += 1`` and the core's :func:`lossscale._rule.next_skip_counters`. A
    ``step()`` that found no gradient at all is not a step.
    """

    def __init__(self) -> None:
        self.steps = 0
        self._skipped: torch.Tensor | None = None
        self._streak: torch.Tensor | None = None

    def count(self, found_inf: torch.Tensor) -> None:
        """Counts one step with this found-inf flag (0-d float, 0 or 1)."""
        self.steps += 1
        device = found_inf.device
        if self._skipped is None:
            self._skipped = torch.zeros((), dtype=torch.int32, device=device)
            self._streak = torch.zeros((), dtype=torch.int32, device=device)
        elif self._skipped.device != device:
            self._skipped, self._streak = self._skipped.to(device), self._streak.to(device)  # type: ignore[union-attr]
        if device.type == "cpu" and not torch.compiler.is_compiling():
            # Host scalars on numpy views of the CPU counters: the same rule, no device ops.
            views = self._skipped.numpy(), self._streak.numpy()  # type: ignore[union-attr]
            finite = np.bool_(float(found_inf.detach().numpy()) == 0.0)
            new = next_skip_counters(views[0][()], views[1][()], finite, _HostScalars)
            for view, value in zip(views, new):
                view[...] = value
            return
        self._skipped, self._streak = next_skip_counters(self._skipped, self._streak, found_inf == 0, torch)

    def skipped_steps(self, device: torch.device) -> torch.Tensor:
        return self._copy_or_zero(self._skipped, device)

    def consecutive_skips(self, device: torch.device) -> torch.Tensor:
        return self._copy_or_zero(self._streak, device)

    def last_step_skipped(self, device: torch.device) -> torch.Tensor:
        """0-d bool: was the last counted step skipped? No sync."""
        return self.consecutive_skips(device) > 0

    @staticmethod
    def _copy_or_zero(t: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        return torch.zeros((), dtype=torch.int32, device=device) if t is None else t.clone()

    def record(self) -> CounterRecord:
        return CounterRecord(self.steps, self._skipped, self._streak)

    def load(self, record: CounterRecord, scale: LossScaleState | None = None) -> None:
        """Takes over ``record``; counts it lacks (older checkpoints) come from ``scale``'s state, if given."""
        self.steps = record.steps
        skipped, streak = record.skipped_steps, record.consecutive_skips
        if skipped is None and scale is not None:
            skipped = scale.skipped_steps
        if streak is None and scale is not None:
            streak = scale.consecutive_skips
        device = None if scale is None else scale.loss_scale.device
        to = lambda t: None if t is None else t.to(device=device, dtype=torch.int32, copy=True)
        self._skipped, self._streak = to(skipped), to(streak)
        if self._skipped is None and self._streak is not None:
            self._skipped = torch.zeros_like(self._streak)
        if self._streak is None and self._skipped is not None:
            self._streak = torch.zeros_like(self._skipped)


# ------------------------------------------------------------ the step object

_CLIP_STAGES = frozenset({Stage.READY, Stage.UNSCALED})


def require_unscalable(grads: GradGroups, what: str) -> None:
    """Refuses to unscale float16 gradients in float16 (small values would flush to zero)."""
    if grads.has_float16:
        raise ValueError(
            f"Attempting to unscale FP16 gradients. {what} would unscale float16 gradients in float16, "
            "flushing to zero the small values loss "
            "scaling exists to keep. Keep float32 parameters and run the model under torch.autocast, "
            "or use a fused inner optimizer (e.g. torch.optim.AdamW(..., fused=True))"
            f"{fused_sgd_warning()} and call step() directly: it unscales inside its float32 kernel."
        )


def _no_agreement(found_inf: torch.Tensor) -> torch.Tensor:
    return found_inf


class OptimizerStep:
    """One optimizer's step machinery over one scale owner (see the module docstring).

    Args:
        owner: the scale owner (``_scale.py``): ``add_step`` ends each step.
        agree: ``agree(found_inf) -> found_inf`` across ranks (default: none).
        diagnostics: the opt-in report, history and stall guard (default: off).
    """

    def __init__(self, owner: Any, agree: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 diagnostics: Diagnostics | None = None, sampler: StatsSampler | None = None,
                 slot: int | None = None) -> None:
        self.owner = owner
        self.agree = _no_agreement if agree is None else agree
        self.diagnostics = Diagnostics(None, False, None, None) if diagnostics is None else diagnostics
        self.record = StepRecord()
        self.tracker = FusedStateTracker()
        self.counters = StepCounters()
        #: ``stats_every``'s sampler (None: off); ``slot`` None: this step's own, advanced by :meth:`finish`;
        #: an int: a GradScaler's, shared by its optimizers (names prefixed ``opt{slot}.``), advanced by update()
        self.sampler, self.slot = sampler, slot
        self._in_closure = False

    def measure(self, inner: torch.optim.Optimizer, pairs: Any = None, factor: torch.Tensor | None = None) -> None:
        """On a sampled step, the sampler keeps the sums of the *scaled* gradients (``pairs``' times ``factor``).

        Every entry point calls it before it unscales. ``pairs``:
        ``((group, index), parameter, gradient)``; by default every parameter's ``.grad``. An unsampled step
        returns at once: no walk over the parameters.
        """
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

    # ------------------------------------------------------------ before the step

    def _collect(self, inner: torch.optim.Optimizer) -> GradGroups:
        """The gradients of ``inner``'s parameters, grouped; moves the scale to their device. No sync."""
        grads = GradGroups.of(inner.param_groups)
        if grads.device is not None:
            self.owner.to_(grads.device)
        return grads

    @staticmethod
    def _unscale_and_check(grads: GradGroups, scale: StepScale) -> torch.Tensor:
        """Unscales ``grads`` in place; the found-inf flag on the scale's device. No sync.

        One R+W pass, which checks the values before the multiplication by
        ``1/S``. When the policy lets ``S`` fall below 1 that product can
        overflow a finite value, so a second R+W pass checks the results.
        """
        found_inf = unscale_and_check_(grads, scale.inv_scale, out_device=scale.device)
        if scale.can_go_below_one:
            found_inf = torch.maximum(found_inf, check_finite(grads, out_device=scale.device))
        return found_inf

    def unscale_(self, inner: torch.optim.Optimizer) -> None:
        """Unscales ``inner``'s gradients in place now (``READY`` -> ``UNSCALED``); once per iteration.

        In ``UNSCALED``/``CLIPPED`` it does nothing; after a fused clip
        (``CLIP_DEFERRED``) it applies that clip's ``coef / S`` (-> ``CLIPPED``).
        With no gradient at all it does nothing. Cost: one R+W pass; no sync.
        """
        record = self.record
        record.require("unscale_", ANY_BEFORE_STEP)
        if record.stage in (Stage.UNSCALED, Stage.CLIPPED):
            return
        grads = self._collect(inner)
        if not grads.tensors:
            return
        if record.stage is Stage.CLIP_DEFERRED:
            require_unscalable(grads, "unscale_() after clip_grad_norm_()")
            foreach_mul_(grads.tensors, reciprocal(record.grad_scale))  # type: ignore[arg-type]
            record.checked(Stage.CLIPPED, record.found_inf)  # type: ignore[arg-type]
            return
        require_unscalable(grads, "unscale_()")
        self.measure(inner)
        record.checked(Stage.UNSCALED, self._unscale_and_check(grads, self.owner.for_step(None)))

    def clip_grad_norm_(self, inner: torch.optim.Optimizer, max_norm: Any, norm_type: Any = 2.0) -> torch.Tensor:
        """Clips the unscaled gradients' global norm to ``max_norm``; returns that norm (0-d, no sync).

        ``norm = ||g_scaled||_p / S`` (accumulated in float32; a non-finite
        norm flags the step as overflowed), ``coef = min(1, max_norm / (norm +
        1e-6))``. From ``READY``: a fused ``inner`` gets ``grad_scale = S / coef``
        for its kernel (``CLIP_DEFERRED``; the norm is the only pass, R), any
        other one has its gradients multiplied by ``coef / S`` (one more R+W;
        ``CLIPPED``). From ``UNSCALED``: an ordinary clip (R, then R+W).
        A second clip before ``step()`` raises, fused or not.
        """
        norm_type = validated_norm_type(norm_type)
        validate_max_norm(max_norm)
        record, owner = self.record, self.owner
        record.require("clip_grad_norm_", _CLIP_STAGES)
        grads = self._collect(inner)
        if not grads.tensors:
            return torch.zeros((), dtype=torch.float32, device=owner.device)
        if record.stage is Stage.UNSCALED:
            total = scaled_norm(grads, norm_type, out_device=owner.device)
            foreach_mul_(grads.tensors, torch.clamp(max_norm / (total + 1e-6), max=1.0))
            record.checked(Stage.CLIPPED, record.found_inf)  # type: ignore[arg-type]
            return total
        self.measure(inner)
        total = scaled_norm(grads, norm_type, out_device=owner.device) * owner.inv_scale()
        found_inf = (~torch.isfinite(total)).float()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if is_fused(inner):
            record.checked(Stage.CLIP_DEFERRED, found_inf, owner.state.loss_scale / coef)
        else:
            require_unscalable(grads, "clip_grad_norm_()")
            foreach_mul_(grads.tensors, owner.inv_scale() * coef)
            record.checked(Stage.CLIPPED, found_inf)
        return total

    def check(self, inner: torch.optim.Optimizer) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """``(found_inf, grad_scale)`` for this step: the record's check, or one made now. None: no gradient at all.

        From ``READY``: a fused ``inner`` with float16 gradients gets a check
        pass only (R+W, values unchanged) and ``grad_scale = S``, so its kernel
        unscales in float32; anything else is unscaled and checked in place
        (a second R+W check pass when the scale may be below 1).
        """
        checked = self._check(inner, is_fused(inner))
        return None if checked is None else checked[:2]  # type: ignore[return-value]

    def _check(self, inner: torch.optim.Optimizer, fused: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        record = self.record
        record.require("step", ANY_BEFORE_STEP)
        if record.stage is not Stage.READY:
            return record.found_inf, record.grad_scale  # type: ignore[return-value]
        grads = GradGroups.of(inner.param_groups)
        if not grads.tensors:
            return None
        scale = self.owner.for_step(grads.device)
        self.measure(inner)
        if fused and grads.has_float16:
            # g / S overflows float32 in the kernel only if S < 65504 / 3.4e38, about 2**-112: not re-checked.
            return check_finite(grads, out_device=scale.device), scale.loss_scale
        if grads.has_float16:
            require_unscalable(grads, "step()")
        return self._unscale_and_check(grads, scale), None

    # ------------------------------------------------------------ the step

    def step(self, inner: torch.optim.Optimizer, *, on_host: bool = False, call: Callable[[], Any] | None = None,
             named_grads: Any = ()) -> tuple[torch.Tensor, bool | None] | None:
        """Checks, agrees, applies or skips, and finishes; ``(found_inf, skipped)``, or None with no gradient at all.

        ``skipped`` is True/False when decided on the host, None when the
        fused kernel decided on the device. ``on_host`` and ``call``: see
        :meth:`apply`.
        """
        fused = is_fused(inner)
        checked = self._check(inner, fused)
        if checked is None:  # no gradient at all: nothing to apply, nothing to count
            return None
        return self.apply(inner, *checked, on_host=on_host, call=call, named_grads=named_grads, fused=fused)

    def apply(self, inner: torch.optim.Optimizer, found_inf: torch.Tensor, grad_scale: torch.Tensor | None, *,
              on_host: bool = False, call: Callable[[], Any] | None = None,
              named_grads: Any = (), fused: bool | None = None) -> tuple[torch.Tensor, bool | None]:
        """Agrees on ``found_inf``, runs ``inner.step()`` unless it is set, and finishes the step.

        Unfused: one host sync (``found_inf.item()``), then ``inner.step()``
        or nothing. Fused: the kernel gets ``grad_scale``/``found_inf`` and
        skips by itself (0 syncs), except when a parameter still lacks state
        (see :class:`FusedStateTracker`) or ``on_host`` asks for it (a caller
        that must see the skip): then one sync, and a skipped step does not
        call ``inner.step()`` at all. ``call`` replaces ``inner.step()``.
        """
        self.record.require("step", ANY_BEFORE_STEP)
        found_inf = self.agree(found_inf)
        fused = is_fused(inner) if fused is None else fused
        on_host = on_host or not fused or self.tracker.needs_host_decision(inner)
        skipped: bool | None = None
        if on_host and bool(found_inf.item()):  # the one host sync of the unfused path
            skipped = True
        elif on_host and not fused:
            inner.step() if call is None else call()
            skipped = False
        else:
            step_with_scale(inner, grad_scale, found_inf, call)
            if on_host:
                self.tracker.note_host_step(inner)
                skipped = False
        self.finish(found_inf, skipped, named_grads)
        return found_inf, skipped

    def finish(self, found_inf: torch.Tensor, skipped: bool | None, named_grads: Any = ()) -> None:
        """Ends a step: overflow report, this optimizer's counters, the scale (now or at ``update()``), history, guard.

        The stall guard reads this optimizer's own skip streak after this step
        was counted, so ``max_consecutive_skips=n`` raises at the n-th skip in
        a row (one step later on CUDA, where the read is deferred to avoid a
        sync), and other optimizers sharing the scale do not count.
        """
        diagnostics, counters, owner, record = self.diagnostics, self.counters, self.owner, self.record
        step = counters.steps
        scale_used = owner.state.loss_scale.clone() if diagnostics.wants_scale else None
        if diagnostics.reporter is not None:
            diagnostics.report(step, found_inf, skipped, scale_used, named_grads)
        counters.count(found_inf)
        if owner.advances_each_step:
            record.reset()
        else:
            record.stepped()  # until the owner's update()
        sampler = self.sampler if self.slot is None else None
        # AutoLossScale: the core's sampler rule sets the scale (a private one: see _scale.require_own_scale);
        # any other policy: the owner's rule, and the sampler counts the step. No sync either way.
        new = None if sampler is None else sampler.advance(owner.state, found_inf, diagnostics.recorder)
        if new is None:
            owner.add_step(found_inf, record)
        else:
            owner.assign(new)
        if diagnostics.recorder is not None:
            diagnostics.record(step, scale_used, found_inf)
        if diagnostics.guard is not None:
            diagnostics.check_stall(counters.consecutive_skips(found_inf.device), owner.state.loss_scale)

    def step_with_closure(self, inner: torch.optim.Optimizer, closure: Callable[[], Any], named_grads: Any = ()) -> Any:
        """``inner.step(closure)`` with every evaluation's gradients unscaled and checked (LBFGS); the loss.

        On an overflow, weights and inner state are restored from copies
        taken before the step. Cost: a copy of the weights and the inner
        state, one R+W pass per evaluation, one host sync.
        """
        self.record.require("step", ANY_BEFORE_STEP)
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
                found_total.add_(self._unscale_and_check(grads, self.owner.for_step(None)).to(found_total.device))
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
        found_total = self.agree(torch.clamp(found_total, max=1.0))
        skipped = bool(found_total.item())  # one host sync per closure step
        if skipped:
            with torch.no_grad():
                for p, saved in zip(params, saved_params):
                    p.copy_(saved)
            inner.load_state_dict(saved_state)
        self.finish(found_total, skipped, named_grads)
        return loss

    # ------------------------------------------------------------ between iterations

    def forget(self) -> None:
        """``zero_grad()``: a pending check is forgotten (a step is not), and so is a pending sample.

        Not inside ``step(closure)``, whose closure zeroes the gradients it computes (its first evaluation's
        sample is kept).
        """
        self.record.forget_check()
        if self.sampler is not None and self.slot is None and not self._in_closure:
            self.sampler.forget()

    def reset(self) -> None:
        """After the inner optimizer's state or the scale was replaced (a checkpoint load)."""
        self.tracker.reset()
        self.record.reset()

    # ------------------------------------------------------------ checkpoints and pickling: one record

    def load(self, checkpoint: Checkpoint) -> None:
        """Takes over a validated checkpoint's scale and counters (the inner optimizer is the caller's)."""
        if checkpoint.scale is not None:
            self.owner.load_record(checkpoint.scale)
            self._load_counters(checkpoint.counters or CounterRecord())
        self.reset()

    def _load_counters(self, record: CounterRecord) -> None:
        """This optimizer's counters; a history recorded past the restored step is cut back to it."""
        self.counters.load(record, self.owner.state)
        recorder = self.diagnostics.recorder
        if recorder is not None:
            recorder.flush()
            recorder.history.truncate(record.steps)

    def pickled(self) -> dict[str, Any]:
        """The ``state_dict`` records (the policy as an object) and the diagnostics' settings; nothing else.

        A shared scale travels as itself (pickled through its own record), so
        optimizers pickled together still share it.
        """
        shared = self.owner if isinstance(self.owner, SharedLossScale) else None
        return {
            "shared": shared,
            "scale": None if shared is not None else self.owner.record().to_dict(policy_object=True),
            "optimizer": self.counters.record().to_dict(),
            "diagnostics": self.diagnostics,  # pickles its settings only (see Diagnostics.settings)
        }

    @classmethod
    def unpickled(cls, state: dict[str, Any], agree: Callable[[torch.Tensor], torch.Tensor]) -> OptimizerStep:
        """The step object :meth:`pickled` describes, validated as a state dict is."""
        owner = state["shared"]
        if owner is None:
            record = ScaleRecord.from_dict(state["scale"])
            owner = PrivateLossScale(record.policy, record.state.loss_scale.device)
            owner.load_record(record)
        step = cls(owner, agree, state["diagnostics"])
        step._load_counters(CounterRecord.from_dict(state["optimizer"]))
        return step
