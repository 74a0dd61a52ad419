"""``lossscale.torch.GradScaler``: a drop-in for ``torch.amp.GradScaler`` on lossscale's state and rule.

It composes the pieces ``LossScaleOptimizer`` is made of: one
:class:`~lossscale.torch._gradscaler_scale.IterationScale` (a
``SharedLossScale`` advanced once per ``update()``), and per optimizer
(keyed weakly, as torch's ``per_optimizer_states``) a ``StepRecord``, a
``FusedStateTracker``, ``StepCounters`` and a ``FlagAgreement``, driven
through the step functions of ``_step.py``. Its checkpoint format is in
``_gradscaler_state.py``.

Cost per ``step(optimizer)`` (G: the bytes of its gradients), as
``LossScaleOptimizer.step()``:

=============================== ===================== ==========================
optimizer                       passes over gradients host syncs
=============================== ===================== ==========================
fused (``_step_supports_amp_    1 unscale+check (R+W; 0: the kernel skips [*]
scaling``), ``sync_skips=False`` a check only for fp16)
fused, ``sync_skips=True``      as above              1: a skip is decided on the
                                                      host, ``optimizer.step`` not
                                                      called
anything else                   1 unscale+check (R+W) 1 (``found_inf``)
=============================== ===================== ==========================

[*] 1 on a step in which a parameter gets its first gradient (its
optimizer state is created then; see ``_fused.py``). ``scale()`` and
``update()`` add no sync; ``get_scale()`` and ``state_dict()`` are one each.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from ._counters import StepCounters
from ._diagnostics import Diagnostics, StepRecorder
from ._distributed import FlagAgreement
from ._fused import FusedStateTracker
from ._gradscaler_accessors import GradScalerAccessors
from ._gradscaler_scale import IterationScale, torch_policy
from ._lifecycle import Stage, StepRecord
from ._step import apply_or_skip, check_for_step, finish_step, unscale_

__all__ = ["GradScaler"]

_UNSCALED = (Stage.UNSCALED, Stage.CLIPPED)


@dataclasses.dataclass
class _PerOptimizer:
    """What the scaler keeps for one optimizer (torch's ``per_optimizer_states`` entry)."""

    record: StepRecord
    tracker: FusedStateTracker
    counters: StepCounters
    agree: FlagAgreement


class GradScaler(GradScalerAccessors):
    """``torch.amp.GradScaler``'s interface over lossscale's dynamic loss scale.

    Drop it in where ``torch.amp.GradScaler`` was (the idiom, Lightning,
    Fabric, accelerate via :func:`lossscale.torch.integrations.accelerate.attach`,
    timm's ``NativeScaler``). Two deliberate differences from torch, both on
    by default: TF's floor (the scale never backs off below
    ``min_loss_scale=1``; torch's can reach 0, pytorch #101569) and growth
    only while ``S * growth_factor`` stays finite (and under
    ``max_loss_scale``). A ``step()`` that finds no gradient at all is a
    no-op (torch asserts), and ``update()`` with no step leaves the scale
    alone (torch asserts).

    Args:
        device, init_scale, growth_factor, backoff_factor, growth_interval, enabled: as
            ``torch.amp.GradScaler`` (``device="cuda"`` without CUDA warns and disables, as torch does).
        min_loss_scale, max_loss_scale, hysteresis: the rest of the policy
            (see :class:`lossscale.DynamicLossScale`).
        max_consecutive_skips, overflow_report, named_parameters: as
            :class:`LossScaleOptimizer` (per optimizer).
        history: True or a :class:`lossscale.History`: one row per
            ``update()`` (scale used, skipped, the loss given to ``scale()``).
        sync_skips: decide a fused optimizer's skip on the host, so that a
            skipped step does not call ``optimizer.step`` at all (one host
            sync per step). Integrations that learn of a skip by whether
            ``optimizer.step`` ran (accelerate, the transformers Trainer:
            their LR scheduler holds only then) need it;
            ``integrations.accelerate.attach`` sets it. Default False: the
            fused kernel skips on the device, 0 syncs, as torch's.

    >>> import torch
    >>> w = torch.nn.Parameter(torch.tensor([1.0]))
    >>> opt, scaler = torch.optim.SGD([w], lr=0.25), GradScaler("cpu", init_scale=8.0)
    >>> scaler.scale((w ** 2).sum()).backward()
    >>> scaler.step(opt); scaler.update()
    >>> w.detach(), scaler.get_scale(), int(scaler.skipped_steps)
    (tensor([0.5000]), 8.0, 0)
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        min_loss_scale: float = 1.0,
        max_loss_scale: float | None = None,
        hysteresis: int = 1,
        max_consecutive_skips: int | None = None,
        overflow_report: bool = False,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        history: Any = None,
        sync_skips: bool = False,
    ) -> None:
        self._device = str(device)
        self._enabled = bool(enabled)
        if self._enabled and self._device == "cuda" and not torch.cuda.is_available():
            warnings.warn("lossscale.torch.GradScaler is enabled, but CUDA is not available.  Disabling.", stacklevel=2)
            self._enabled = False
        policy = torch_policy(init_scale, growth_factor, backoff_factor, growth_interval, min_loss_scale=min_loss_scale,
                              max_loss_scale=max_loss_scale, hysteresis=hysteresis)
        self._owner = IterationScale(policy)
        self._placed = False
        self._diagnostics = Diagnostics(max_consecutive_skips, overflow_report, named_parameters, None)
        self._recorder = None if history is None or history is False else StepRecorder(history)
        self.sync_skips = bool(sync_skips)
        self._per_optimizer: weakref.WeakKeyDictionary[torch.optim.Optimizer, _PerOptimizer] = (
            weakref.WeakKeyDictionary()
        )
        self._updates = 0

    # ------------------------------------------------------------ scaling

    def scale(self, outputs: Any) -> Any:
        """``outputs * S``: a tensor, or nested lists/tuples (other iterables: a lazy ``map``) of them. No sync."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._recorder is not None and outputs.numel() == 1:
                self._recorder.note_loss(outputs)
            return self._scaled(outputs)
        return self._scale_nested(outputs)

    def _scaled(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self._placed:
            self._lazy_init_scale_growth_tracker(tensor.device)
        return self._owner.get_scaled_loss(tensor)

    def _scale_nested(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._scaled(value)
        if isinstance(value, Iterable):
            mapped = map(self._scale_nested, value)
            return type(value)(mapped) if isinstance(value, (list, tuple)) else mapped
        raise ValueError(f"outputs must be a Tensor or an iterable of Tensors, got a {type(value).__name__}.")

    def _lazy_init_scale_growth_tracker(self, device: Any) -> None:
        """Puts the scale on ``device`` (torch's name: accelerate calls it after loading under FSDP2)."""
        self._owner.to_(torch.device(device))
        self._placed = True

    # ------------------------------------------------------------ per optimizer

    def _of(self, optimizer: torch.optim.Optimizer) -> _PerOptimizer:
        slot = self._per_optimizer.get(optimizer)
        if slot is None:
            ref = weakref.ref(optimizer)  # not the optimizer itself: the value would keep its weak key alive
            params = lambda: [p for g in ref().param_groups for p in g["params"]]  # type: ignore[union-attr]
            slot = _PerOptimizer(StepRecord(), FusedStateTracker(), StepCounters(), FlagAgreement(None, params))
            self._per_optimizer[optimizer] = slot
        return slot

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divides ``optimizer``'s gradients by ``S`` in place (e.g. to clip them); once per iteration.

        Cost: one R+W pass that also checks for NaN/Inf; no sync.
        """
        if not self._enabled:
            return
        record = self._of(optimizer).record
        if record.stage in _UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update(). "
                "Unscale once per iteration, between backward() and step()."
            )
        if record.stage is Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step(). Call it before step(), or after update().")
        unscale_(optimizer, record, self._owner)

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscales and checks ``optimizer``'s gradients (unless ``unscale_`` did), then steps or skips.

        ``optimizer.step(*args, **kwargs)`` is called through the attribute of
        the object passed in (so a patched ``step`` runs), and its result is
        returned; a skip decided on the host does not call it and returns
        None. See the module docstring for the syncs.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError(
                "Closure use is not currently supported if GradScaler is enabled. For closure-based optimizers "
                "(LBFGS) wrap them in lossscale.torch.LossScaleOptimizer, whose step(closure) checks every evaluation."
            )
        slot = self._of(optimizer)
        if slot.record.stage is Stage.STEPPED:
            raise RuntimeError(
                "step() has already been called since the last update(). Call update() once per iteration, "
                "after every optimizer's step()."
            )
        checked = check_for_step(optimizer, slot.record, self._owner)
        if checked is None:  # no gradient at all: nothing to apply, nothing to count
            return None
        found_inf, grad_scale = checked
        found_inf = slot.agree(found_inf)
        result: list[Any] = [None]

        def call() -> None:
            result[0] = optimizer.step(*args, **kwargs)

        skipped = apply_or_skip(optimizer, found_inf, grad_scale, slot.tracker, on_host=self.sync_skips, call=call)
        finish_step(
            found_inf, skipped, record=slot.record, owner=self._owner, counters=slot.counters,
            diagnostics=self._diagnostics, named_grads=lambda: self._diagnostics.named_grads(optimizer.param_groups),
        )
        return result[0]

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Advances the scale once for this iteration: backs off if any optimizer overflowed, else maybe grows.

        An optimizer that was unscaled but not stepped counts too (as in
        torch). ``new_scale`` (a float or a 1-element tensor) sets the scale
        instead and keeps the growth counter. No sync.
        """
        if not self._enabled:
            return
        for slot in self._per_optimizer.values():
            if slot.record.stage in _UNSCALED:
                self._owner.add_step(slot.record.found_inf, slot.record)  # type: ignore[arg-type]
        recorder, pending = self._recorder, self._owner.pending
        scale_used = self._owner.loss_scale if recorder is not None else None
        self._owner.update(new_scale)
        for slot in self._per_optimizer.values():
            slot.record.reset()
        if recorder is not None and pending is not None:
            recorder.record(self._updates, scale_used, pending > 0)  # type: ignore[arg-type]
        self._updates += 1

    def __repr__(self) -> str:
        return f"GradScaler({self._device!r}, {self._owner.policy!r}, enabled={self._enabled})"
