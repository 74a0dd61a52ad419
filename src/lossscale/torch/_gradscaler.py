"""``GradScaler``: ``torch.amp.GradScaler``'s interface over an ``IterationScale`` and an ``OptimizerStep`` each."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any

import torch

from .._policy import DynamicLossScale
from .._sampler import check_stats_every
from .._torch._kernels import unscale_grads_per_device
from ._checkpoint import gradscaler_record, gradscaler_state_dict, replace_policy, with_torch_names
from ._checkpoint import growth_interval as checked_interval
from ._compat import AMP_SCALING, GRAD_SCALER_WARNING, OptState, takes_grad_scaler
from ._diagnostics import Diagnostics, OverflowReport, StepRecorder
from ._distributed import FlagAgreement
from ._state import IterationScale
from ._stats import StatsSampler
from ._step import OptimizerStep, Stage, StepProgress

__all__ = ["GradScaler"]


class _OptimizerStateView(MutableMapping):
    """torch's ``_per_optimizer_states[id(optimizer)]``: ``{"stage": OptState, "found_inf_per_device": {device:
    flag}}`` read from and written to the optimizer's live :class:`StepProgress`; ``step()`` and ``update()`` read what
    client code writes (a stage and flags after its own unscale, e.g. Megatron's and apex's)."""

    _KEYS = ("stage", "found_inf_per_device")

    def __init__(self, progress: StepProgress) -> None:
        self._progress = progress

    def __getitem__(self, key: str) -> Any:
        progress = self._progress
        if key == "stage":
            return OptState[progress.stage.name]
        if key == "found_inf_per_device":
            return {} if progress.found_inf is None else {progress.found_inf.device: progress.found_inf}
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        progress = self._progress
        if key == "stage":
            try:
                progress.stage = Stage[OptState(value).name]
            except ValueError:
                raise ValueError(f"stage must be a torch.amp.grad_scaler.OptState (READY, UNSCALED, STEPPED) or its "
                                 f"value, got {value!r}.") from None
            return
        if key != "found_inf_per_device":
            raise KeyError(f"{key!r}: an optimizer's state in a GradScaler has the keys {list(self._KEYS)}.")
        if not isinstance(value, Mapping) or not all(isinstance(t, torch.Tensor) for t in value.values()):
            raise TypeError("found_inf_per_device must be a dict {device: found_inf tensor} (what _unscale_grads_ "
                            f"returns), got {type(value).__name__}.")
        flags = list(value.values())
        if not flags:
            progress.found_inf = None
        elif len(flags) == 1 and flags[0].dim() == 0 and flags[0].dtype == torch.float32:
            progress.found_inf = flags[0]  # the tensor itself: an in-place all-reduce of it still decides the step
        else:
            device = flags[0].device
            progress.found_inf = torch.clamp(sum(f.to(device).reshape(()).float() for f in flags), max=1.0)

    def __delitem__(self, key: str) -> None:
        raise TypeError("An optimizer's state in a GradScaler always has its two keys; assign them instead.")

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)

    def __repr__(self) -> str:
        return repr(dict(self))


class _PerOptimizerStates(Mapping):
    """torch's ``_per_optimizer_states``: ``{id(optimizer): state}`` (views), a fresh READY state for an id not seen
    since the last ``update()``, as torch's ``defaultdict``; what a client writes there before the first
    ``step()`` is taken over by that optimizer's step. As torch's, it lists the optimizers this iteration touched
    (unscaled, stepped, or looked up here), and is empty after ``update()``."""

    def __init__(self, scaler: GradScaler) -> None:
        self._scaler = scaler

    def _all(self) -> dict[int, StepProgress]:
        scaler = self._scaler
        progresses = {id(opt): step.progress for opt, step in scaler._steps.items()}
        progresses.update(scaler._pending_progress)
        return progresses

    def _progresses(self) -> dict[int, StepProgress]:
        """This iteration's: an optimizer's live progress once it left READY or holds a flag, and every id looked
        up here since the last ``update()``."""
        scaler = self._scaler
        progresses = {id(opt): step.progress for opt, step in scaler._steps.items()
                      if step.progress.stage is not Stage.READY or step.progress.found_inf is not None
                      or id(opt) in scaler._looked_up}
        progresses.update(scaler._pending_progress)
        return progresses

    def __getitem__(self, key: int) -> _OptimizerStateView:
        progress = self._all().get(key)
        if progress is None:
            progress = self._scaler._pending_progress[key] = StepProgress()
        self._scaler._looked_up.add(key)
        return _OptimizerStateView(progress)

    def __contains__(self, key: object) -> bool:
        return key in self._progresses()

    def __iter__(self) -> Iterator[int]:
        return iter(self._progresses())

    def __len__(self) -> int:
        return len(self._progresses())


class GradScalerStateError(RuntimeError, AssertionError):
    """A call out of order (``step()`` or ``unscale_()`` before any ``scale()``, pickling mid-iteration). Also an
    ``AssertionError``, what ``torch.amp.GradScaler`` raises there, so that code written against torch's catches it."""


class GradScalerArgumentError(ValueError, AssertionError):
    """A constructor argument or ``update(new_scale)`` refused. Also an ``AssertionError``, what
    ``torch.amp.GradScaler`` raises for those it checks (``growth_factor <= 1``, ``backoff_factor >= 1``, a
    malformed ``new_scale``)."""


class _StepTable(weakref.WeakKeyDictionary):
    """``{optimizer: OptimizerStep}``, not keeping the optimizers alive; pickled empty (its keys are live objects),
    so that ``torch.save(scaler.__dict__)``, which client checkpoints do with torch's scaler, works: each optimizer
    gets a fresh step object at its next ``step()``, as after :meth:`GradScaler.__setstate__`."""

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return type(self), ()


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler``'s interface over lossscale's dynamic loss scale.

    Cost per ``step(optimizer)`` as ``LossScaleOptimizer.step()``; ``scale()`` and ``update()`` add no sync,
    ``get_scale()`` and ``state_dict()`` one. Unlike torch's (``docs/migration/gradscaler.md``), the scale never
    backs off below ``min_loss_scale``, and a ``step()`` without gradients or an ``update()`` without a step is a no-op.

    A subclass of ``torch.amp.GradScaler``, so that code which checks ``isinstance(scaler, torch.amp.GradScaler)``
    (training loops that scale only then, CLI type checks of Lightning's ``MixedPrecision(scaler=...)``) takes it;
    every method and attribute torch's has is defined here, over lossscale's state, and torch's ``__init__`` is not
    called (it would assign its own state to names that are views here).

    Args:
        device, init_scale, growth_factor, backoff_factor, growth_interval, enabled: as ``torch.amp.GradScaler``
            (``device="cuda"`` without CUDA warns and disables); ``growth_interval`` saturates at 2**31 - 1.
        min_loss_scale, max_loss_scale, hysteresis: the rest of the policy (see :class:`lossscale.DynamicLossScale`).
        max_consecutive_skips, overflow_report, named_parameters: as :class:`LossScaleOptimizer` (per optimizer).
        history: True or a :class:`lossscale.History`: one row per ``update()`` (scale, skipped, ``scale()``'s loss).
        sync_skips: decide a fused optimizer's skip on the host (1 sync), so a skip calls no ``optimizer.step``.
        stats_every: measure the scaled gradients every ``N``-th iteration (default None): :attr:`gradient_stats`;
            ``scale()`` calls count the micro-batches.

    Raises:
        ValueError: an invalid policy argument when enabled (a :class:`GradScalerArgumentError`, also an
            ``AssertionError``, as torch's for ``growth_factor <= 1`` or ``backoff_factor >= 1``).

    >>> import torch
    >>> w = torch.nn.Parameter(torch.tensor([1.0]))
    >>> opt, scaler = torch.optim.SGD([w], lr=0.25), GradScaler("cpu", init_scale=8.0)
    >>> scaler.scale((w ** 2).sum()).backward()
    >>> scaler.step(opt); scaler.update()
    >>> w.detach(), scaler.get_scale(), int(scaler.skipped_steps)
    (tensor([0.5000]), 8.0, 0)
    """

    def __init__(
        self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
        backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True, *,
        min_loss_scale: float | None = 1.0, max_loss_scale: float | None = None, hysteresis: int | None = 1,
        max_consecutive_skips: int | None = None, overflow_report: bool = False,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None, history: Any = None,
        sync_skips: bool = False, stats_every: int | None = None,
    ) -> None:
        # torch.amp.GradScaler.__init__ is deliberately not called (see the class docstring).
        self._device, self._enabled = str(device), bool(enabled)
        if self._enabled and self._device == "cuda" and not torch.cuda.is_available():
            warnings.warn("lossscale.torch.GradScaler is enabled, but CUDA is not available.  Disabling.", stacklevel=2)
            self._enabled = False
        try:
            policy = with_torch_names(  # validation errors in torch's names
                DynamicLossScale, initial_loss_scale=init_scale, increment_period=checked_interval(growth_interval),
                multiplier=growth_factor, backoff_factor=backoff_factor, max_loss_scale=max_loss_scale,
                min_loss_scale=1.0 if min_loss_scale is None else min_loss_scale,
                hysteresis=1 if hysteresis is None else hysteresis,
            )
        except (TypeError, ValueError) as error:  # a wrong type first: it stays a TypeError (and a ValueError)
            if self._enabled:
                raise error if isinstance(error, TypeError) else GradScalerArgumentError(str(error)) from None
            policy = DynamicLossScale()  # disabled (GradScaler(enabled=use_fp16, **cfg)): never used, as in torch
        every = check_stats_every(stats_every, policy)
        self._owner = IterationScale(policy)
        self._placed = False
        self._diagnostics = Diagnostics(max_consecutive_skips, overflow_report, named_parameters, None)
        self._sampler = None if every is None else StatsSampler(every, policy)
        self._steps: _StepTable = _StepTable()
        self._recorder = None if history is None or history is False else StepRecorder(history)
        self.sync_skips = bool(sync_skips)
        self._updates = self._optimizers_seen = 0
        self._pending_progress: dict[int, StepProgress] = {}  # written through _per_optimizer_states before a step
        self._looked_up: set[int] = set()  # ids looked up in _per_optimizer_states this iteration (torch's defaultdict)

    def scale(self, outputs: Any) -> Any:
        """``outputs * S``; with ``history`` a one-element tensor is noted as the iteration's loss, with
        ``stats_every`` each call counts as a micro-batch.

        Args:
            outputs: a floating-point tensor, or nested lists/tuples (other iterables: a lazy ``map``) of them.

        Returns:
            ``outputs`` scaled, in the same structure (as they are when disabled), each in torch's result dtype of
            ``tensor * S`` (its own, but float32 for a 0-d float16/bfloat16 one). One operator per tensor, no sync.

        Raises:
            TypeError: a tensor that is not floating-point.
            ValueError: something that is neither a tensor nor an iterable of them.
        """
        if not self._enabled:
            return outputs
        if self._sampler is not None:  # a backward pass summed into the gradients (micro-batches, for the sample)
            self._sampler.backwards += 1
        if isinstance(outputs, torch.Tensor) and self._recorder is not None and outputs.numel() == 1:
            self._recorder.note_loss(outputs)
        return self._scale_nested(outputs)

    def _scale_nested(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point():
                raise TypeError(f"GradScaler.scale() needs floating-point outputs, got a tensor of dtype "
                                f"{value.dtype}. Pass the loss as computed by the model (e.g. scaler.scale(loss.float())).")
            if not self._placed:
                self._lazy_init_scale_growth_tracker(value.device)
            return self._owner.get_scaled_loss(value, promote=True)  # torch's dtype: float32 for a 0-d half loss
        if isinstance(value, Iterable):
            mapped = map(self._scale_nested, value)
            return type(value)(mapped) if isinstance(value, (list, tuple)) else mapped
        raise ValueError(f"outputs must be a Tensor or an iterable of Tensors, got a {type(value).__name__}.")

    def _lazy_init_scale_growth_tracker(self, device: Any) -> None:
        """Puts the scale on ``device`` (torch's name; accelerate calls it after loading under FSDP2)."""
        self._owner.to_(torch.device(device))
        self._placed = True

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divides ``optimizer``'s gradients by ``S`` in place and checks them, once per iteration.

        Args:
            optimizer: the ``torch.optim.Optimizer`` whose gradients to unscale.

        Raises:
            RuntimeError: before ``scale()`` (a :class:`GradScalerStateError`, also an ``AssertionError`` as
                torch's), twice in an iteration, or after ``step()`` (torch's messages).
            ValueError: float16 gradients.

        Cost: one R+W pass over the gradients; no sync.
        """
        if not self._enabled:
            return
        self._require_scaled("unscale_")
        step = self._step_of(optimizer)
        if step.progress.stage is Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update(). "
                               "Unscale once per iteration, between backward() and step().")
        if step.progress.stage is Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step(). Call it before step(), or after update().")
        step.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscales and checks ``optimizer``'s gradients (unless ``unscale_`` did), then steps or skips.

        Args:
            optimizer: the ``torch.optim.Optimizer`` to step.
            *args, **kwargs: ``optimizer.step``'s arguments (no ``closure``).

        Returns:
            ``optimizer.step(*args, **kwargs)``'s result, None on a skip decided on the host.

        Raises:
            RuntimeError: a ``closure``, before ``scale()`` (a :class:`GradScalerStateError`, also an
                ``AssertionError`` as torch's), or twice before ``update()`` (torch's messages).

        Cost: as ``LossScaleOptimizer.step()``: one R+W pass (a check only for a fused optimizer's float16
        gradients); host syncs: fused 0 (1 with ``sync_skips``), else 1.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled. For closure-based "
                               "optimizers (LBFGS) wrap them in lossscale.torch.LossScaleOptimizer, whose "
                               "step(closure) checks every evaluation.")
        self._require_scaled("step")
        step = self._step_of(optimizer)
        if step.progress.stage is Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update(). Call update() once per "
                               "iteration, after every optimizer's step().")
        named = (lambda: self._diagnostics.named_grads(optimizer.param_groups)) if self._diagnostics.reporter else ()
        if getattr(optimizer, AMP_SCALING, False) and takes_grad_scaler(optimizer):
            # torch's older contract: the optimizer gets this scaler and unscales, checks and skips by itself
            warnings.warn(GRAD_SCALER_WARNING, FutureWarning, stacklevel=2)
            result = optimizer.step(*args, **{**kwargs, "grad_scaler": self})
            step.stepped_by_itself(named)
            return result
        done = step.step(optimizer, args, kwargs, on_host=self.sync_skips, named_grads=named)
        return None if done is None else done[2]

    def _require_scaled(self, what: str) -> None:
        """torch's check that ``scale()`` ran at least once (else the gradients were never scaled, and unscaling
        them would divide them by ``S`` silently)."""
        if not self._placed:
            raise GradScalerStateError(
                f"Attempted {what} but _scale is None.  This may indicate your script did not use "
                "scaler.scale(loss or outputs) earlier in the iteration. Call scaler.scale(loss).backward() first."
            )

    def _step_of(self, optimizer: torch.optim.Optimizer) -> OptimizerStep:
        """``optimizer``'s step object, made on first use."""
        step = self._steps.get(optimizer)
        if step is None:
            ref = weakref.ref(optimizer)  # the value must not keep its weak key alive
            params = lambda: [p for g in ref().param_groups for p in g["params"]]  # type: ignore[union-attr]
            step = OptimizerStep(self._owner, FlagAgreement(None, params), self._diagnostics, self._sampler,
                                 self._optimizers_seen, own_counters=False)
            pending = self._pending_progress.pop(id(optimizer), None)
            if pending is not None:  # what client code wrote through _per_optimizer_states
                step.progress = pending
            self._optimizers_seen += 1
            self._steps[optimizer] = step
        step.number = self._updates  # the overflow report's step: update() calls so far (pickled, as History's rows)
        return step

    @property  # type: ignore[override]  # torch annotates a plain dict; this is a live mapping of views
    def _per_optimizer_states(self) -> _PerOptimizerStates:
        """torch's attribute: ``{id(optimizer): {"stage": OptState, "found_inf_per_device": {device: flag}}}``,
        live views of each optimizer's progress this iteration; what client code writes there, ``step()`` and
        ``update()`` read (a flag written with the stage ``UNSCALED`` decides the step)."""
        return _PerOptimizerStates(self)

    @_per_optimizer_states.setter
    def _per_optimizer_states(self, states: Mapping[int, Mapping[str, Any]]) -> None:
        """``scaler._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)``, the last line of torch's
        ``update()`` that a subclass overriding ``update()`` keeps: closes the iteration without moving the scale
        (the subclass moved it: ``torch._amp_update_scale_`` on :attr:`_scale` and :attr:`_growth_tracker`), every
        optimizer READY again; the entries of a non-empty ``states`` are then written as through the views.

        Raises:
            TypeError: ``states`` is not a mapping.
        """
        if not isinstance(states, Mapping):
            raise TypeError(f"_per_optimizer_states takes a mapping {{id(optimizer): state}} (torch's update() "
                            f"assigns an empty defaultdict), got {type(states).__name__}.")
        entries = [(key, dict(state)) for key, state in states.items()]  # read before anything is reset
        self._owner.close()
        for step in self._steps.values():
            step.progress.reset()
        self._pending_progress.clear()
        self._looked_up.clear()
        views = self._per_optimizer_states
        for key, state in entries:
            for name, value in state.items():
                views[key][name] = value

    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor,
                        allow_fp16: bool = False) -> dict[torch.device, torch.Tensor]:
        """torch's method: multiplies ``optimizer``'s gradients by ``inv_scale`` in place and returns ``{device:
        a copy of found_inf, set to 1.0 on a NaN/Inf}``; records nothing (write the result to
        :attr:`_per_optimizer_states` to make it this iteration's check). float16 gradients without ``allow_fp16``:
        ``ValueError``. One R+W pass, no sync."""
        return unscale_grads_per_device(optimizer.param_groups, inv_scale, found_inf, allow_fp16)

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[Any, torch.Tensor]:
        """torch's method: checks ``optimizer``'s gradients for NaN/Inf without unscaling them, records the flag as
        this iteration's (the stage is unchanged) and returns ``{device: flag}``. One R+W pass (by 1), no sync."""
        self._require_scaled("_check_inf_per_device")
        scale = self._owner.state.loss_scale
        one = torch.ones((), dtype=torch.float32, device=scale.device)
        zero = torch.zeros((), dtype=torch.float32, device=scale.device)
        states = self._per_optimizer_states
        states[id(optimizer)]["found_inf_per_device"] = self._unscale_grads_(optimizer, one, zero, True)
        return states[id(optimizer)]["found_inf_per_device"]

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Closes the iteration: advances the scale once from every optimizer's flag (an unscaled one not stepped
        too), or sets ``new_scale`` instead, keeping the growth counter. No sync.

        Args:
            new_scale: None, or a positive finite float or a 1-element tensor with ``requires_grad=False``.

        Raises:
            ValueError: a malformed ``new_scale`` (torch's message; a :class:`GradScalerArgumentError`, also an
                ``AssertionError`` as torch's).
        """
        if not self._enabled:
            return
        recorder, owner = self._recorder, self._owner
        scale_used = owner.loss_scale if recorder is not None else None
        progresses = [step.progress for step in self._steps.values()] + list(self._pending_progress.values())
        for progress in progresses:  # a flag not yet counted (unscaled but not stepped; one a client wrote) counts too
            if progress.found_inf is not None and not owner.counts(progress):
                owner.add_step(progress.found_inf, progress)
        pending = owner.pending
        try:
            owner.update(new_scale, self._sampler, recorder)  # one sample of every optimizer measured
        except ValueError as error:  # new_scale refused (before anything moved)
            raise GradScalerArgumentError(str(error)) from None
        if recorder is not None and pending is not None:
            recorder.append(self._updates, scale_used, pending > 0)  # type: ignore[arg-type]
        self._updates += 1
        for progress in progresses:  # every optimizer READY again, as torch's fresh per-optimizer states
            progress.reset()
        self._pending_progress.clear()
        self._looked_up.clear()

    @property
    def gradient_stats(self) -> dict[str, Any] | None:
        """The latest ``stats_every`` sample over every optimizer stepped (names prefixed ``opt{k}.``), or None."""
        return None if self._sampler is None else self._sampler.gradient_stats

    def _stats_progress(self) -> tuple[int, int] | None:
        """``(stats_every, steps so far)`` for ``lossscale.underflow_report``; None when off."""
        return None if self._sampler is None else (self._sampler.every, self._sampler.state.count)

    def state_dict(self) -> dict[str, Any]:
        """torch's five keys plus a ``"lossscale"`` entry, plain values only (``{}`` when disabled); one host sync."""
        return gradscaler_state_dict(self._owner.policy, self._owner.state) if self._enabled else {}

    def load_state_dict(self, state_dict: dict[str, Any], custom_objects: Mapping[str, type] | None = None) -> None:
        """Restores ours or ``torch.amp.GradScaler``'s state dict, validated first (nothing changes on error).
        Mid-iteration, as torch's, the optimizers' checks so far stay: an ``unscale_`` done is not done again, and
        ``update()`` counts a step's overflow.

        Args:
            state_dict: what ``state_dict()`` of this class or of ``torch.amp.GradScaler`` returned.
            custom_objects: ``{class name: class}`` for a policy class of your own (nothing is imported by name).

        Raises:
            TypeError: ``state_dict`` is not a mapping.
            RuntimeError: an empty state dict (torch's message: saved from a disabled scaler).
            ValueError: a missing or malformed key, named.
        """
        if not self._enabled:
            return
        self._owner.load(gradscaler_record(state_dict, self._owner.policy, self._owner.state, custom_objects))
        for step in self._steps.values():  # what a fused step learned of the inner state goes; checks stay
            step.tracker.reset()
        if self._sampler is not None:  # the iteration's measurements go with it
            self._sampler.forget()

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled). One host sync."""
        return float(self._owner.state.loss_scale) if self._enabled else 1.0

    @property
    def _scale(self) -> torch.Tensor | None:
        """torch's attribute: the live 0-d float32 scale tensor; None when disabled, and, as torch's, before the
        first ``scale()`` or ``_lazy_init_scale_growth_tracker(device)`` placed it (client code reads None as "call
        ``_lazy_init_scale_growth_tracker`` first", e.g. a pipeline stage that unscales a loss scaled elsewhere)."""
        return self._owner.state.loss_scale if self._enabled and self._placed else None

    @_scale.setter
    def _scale(self, value: torch.Tensor | None) -> None:
        """``scaler._scale = tensor`` (client code keeping a floor by hand): the scale takes ``value``'s value, on
        the scale's device (placed on ``value``'s first if nothing placed it yet); a copy, so later in-place
        changes to ``value`` do not reach it, unlike torch's, which holds ``value`` itself. No sync; ignored when
        disabled, as nothing reads torch's then.

        Raises:
            TypeError: ``value`` is not a one-element real tensor.
        """
        if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            shown = f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}" \
                if isinstance(value, torch.Tensor) else repr(value)
            raise TypeError(f"GradScaler._scale takes a one-element real tensor (as torch's holds), got {shown}. "
                            "To set the scale, call scaler.update(new_scale) after the iteration's steps.")
        if not self._enabled:
            return
        if not self._placed:
            self._lazy_init_scale_growth_tracker(value.device)
        self._owner.set_scale(value.detach())

    # torch's lazy-init attributes, views of the live state.
    _init_scale = property(lambda self: self.get_scale(), lambda self, v: self._owner.overwrite(scale=v))
    _init_growth_tracker = property(
        lambda self: self._get_growth_tracker(), lambda self, v: self._owner.overwrite(growth_tracker=v)
    )
    # torch's factor attributes (client code and accelerate's own tests read them; some write them): the policy's,
    # through the getters and the validating setters.
    _growth_factor = property(lambda self: self.get_growth_factor(), lambda self, v: self.set_growth_factor(v))
    _backoff_factor = property(lambda self: self.get_backoff_factor(), lambda self, v: self.set_backoff_factor(v))
    _growth_interval = property(lambda self: self.get_growth_interval(),
                                lambda self, v: self.set_growth_interval(v))

    def _check_scale_growth_tracker(self, funcname: str) -> tuple[torch.Tensor, torch.Tensor]:
        """torch's method (subclasses that override ``update()`` call it): the live scale and growth counter.

        Args:
            funcname: the caller's name, for the message.

        Raises:
            RuntimeError: neither ``scale()`` nor ``_lazy_init_scale_growth_tracker`` placed them yet (torch's words;
                a :class:`GradScalerStateError`, also an ``AssertionError`` as torch's).
        """
        self._require_scaled(funcname)
        return self._owner.state.loss_scale, self._owner.state.good_steps

    @property
    def _growth_tracker(self) -> torch.Tensor | None:
        """torch's attribute: the live 0-d int32 count of finite steps since the scale last changed (None when
        disabled, or not yet placed, as :attr:`_scale`); client code all-reduces it in place."""
        return self._owner.state.good_steps if self._enabled and self._placed else None

    @_growth_tracker.setter
    def _growth_tracker(self, value: torch.Tensor | int | None) -> None:
        """``scaler._growth_tracker = tensor or int``: the growth counter takes ``value`` (saturated at 2**31 - 1);
        one host read of a tensor. Ignored when disabled.

        Raises:
            TypeError: ``value`` is neither an int nor a one-element integer tensor.
            ValueError: a negative count.
        """
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point() \
                and not value.is_complex() and value.dtype != torch.bool:
            count = int(value.item())
        elif isinstance(value, int) and not isinstance(value, bool):
            count = value
        else:
            raise TypeError(f"GradScaler._growth_tracker takes an int or a one-element integer tensor, got {value!r}.")
        if count < 0:
            raise ValueError(f"GradScaler._growth_tracker counts finite steps, so it cannot be negative; got {count}.")
        if self._enabled:
            self._owner.overwrite(growth_tracker=count)

    def _get_scale_async(self) -> torch.Tensor | None:
        """torch's method: :attr:`_scale`, with no sync."""
        return self._scale

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[Any, torch.Tensor]:
        """torch's method: ``{device: found_inf}`` of ``optimizer``'s check this iteration (after ``unscale_``;
        empty before). The tensor is the one ``step()`` reads: an in-place all-reduce of it decides the step."""
        step = self._steps.get(optimizer)
        found = None if step is None else step.progress.found_inf
        return {} if found is None else {found.device: found}

    def _get_growth_tracker(self) -> int:
        """Finite steps since the scale last changed, a Python int (0 when disabled). One host sync."""
        return int(self._owner.state.good_steps) if self._enabled else 0

    def get_growth_factor(self) -> float:
        """The factor the scale grows by after ``growth_interval`` finite iterations."""
        return self._owner.policy.multiplier

    def set_growth_factor(self, new_factor: float) -> None:
        """Grows the scale by ``new_factor`` from the next ``update()`` on (validated as the constructor's).

        Args:
            new_factor: a number > 1.
        """
        self._owner.set_policy(replace_policy(self._owner.policy, growth_factor=new_factor))

    def get_backoff_factor(self) -> float:
        """The factor a skip multiplies the scale by (``1 / growth_factor`` where the policy leaves it unset)."""
        policy = self._owner.policy
        return 1.0 / policy.multiplier if policy.backoff_factor is None else policy.backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Backs the scale off by ``new_factor`` from the next ``update()`` on (validated as the constructor's).

        Args:
            new_factor: a number in (0, 1).
        """
        self._owner.set_policy(replace_policy(self._owner.policy, backoff_factor=new_factor))

    def get_growth_interval(self) -> int:
        """Finite iterations it takes to grow the scale."""
        return self._owner.policy.increment_period

    def set_growth_interval(self, new_interval: int) -> None:
        """Grows the scale after ``new_interval`` finite iterations from the next ``update()`` on.

        Args:
            new_interval: an int >= 1 (saturated at 2**31 - 1).
        """
        self._owner.set_policy(replace_policy(self._owner.policy, growth_interval=new_interval))

    def is_enabled(self) -> bool:
        """Whether this scaler scales (False: every method passes through)."""
        return self._enabled

    @property
    def loss_scale(self) -> torch.Tensor:
        """The current scale, a 0-d float32 tensor (a copy; 1.0 when disabled)."""
        return self._owner.loss_scale if self._enabled else torch.ones(())

    @property
    def skipped_steps(self) -> torch.Tensor:
        """0-d int32 tensor: iterations (``update()`` calls) in which a step was skipped."""
        return self._owner.state.skipped_steps.clone()

    @property
    def last_step_skipped(self) -> torch.Tensor:
        """0-d bool tensor: was a step skipped in the iteration the last ``update()`` closed?"""
        return self._owner.state.consecutive_skips > 0

    @property
    def consecutive_skips(self) -> torch.Tensor:
        """0-d int32 tensor: iterations in a row, up to the last ``update()``, in which a step was skipped."""
        return self._owner.state.consecutive_skips.clone()

    @property
    def loss_scale_policy(self) -> Any:
        """The :class:`lossscale.DynamicLossScale` followed (torch's factors and lossscale's extras)."""
        return self._owner.policy

    @property
    def history(self) -> Any:
        """The :class:`lossscale.History` being recorded (flushed first), or None if off."""
        if self._recorder is None:
            return None
        self._recorder.flush()
        return self._recorder.history

    @property
    def last_overflow_report(self) -> OverflowReport | None:
        """The report of the last skipped step (needs ``overflow_report=True``), or None."""
        reporter = self._diagnostics.reporter
        return None if reporter is None else reporter.last

    def __getstate__(self) -> dict[str, Any]:
        """The scale and the settings; no live object (CUDA event, per-optimizer records, parameter names)."""
        if any(step.progress.stage is not Stage.READY for step in self._steps.values()):
            raise GradScalerStateError("A GradScaler may be pickled only between iterations "
                               "(before scale() or after update()).")
        history = None if self._recorder is None else self._recorder.history
        if self._recorder is not None:
            self._recorder.flush()
        return {"device": self._device, "enabled": self._enabled, "placed": self._placed, "scale": self._owner,
                "diagnostics": self._diagnostics, "history": history, "sync_skips": self.sync_skips,
                "updates": self._updates, "sampler": self._sampler}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_owner" in state:  # 0.1: its __dict__
            recorder = state.get("_recorder")
            state = {"device": state["_device"], "enabled": state["_enabled"], "placed": state["_placed"],
                     "scale": state["_owner"], "diagnostics": state["_diagnostics"],
                     "history": None if recorder is None else recorder.history,
                     "sync_skips": state.get("sync_skips", False), "updates": state.get("_updates", 0)}
        if not isinstance(state["scale"], IterationScale):
            raise TypeError(f"Not a pickled GradScaler: its scale is a {type(state['scale']).__name__}.")
        self._device, self._enabled, self._placed = state["device"], bool(state["enabled"]), bool(state["placed"])
        self._owner, self._diagnostics = state["scale"], state["diagnostics"]
        self._sampler = state.get("sampler")
        self._steps, self._optimizers_seen = _StepTable(), 0
        self._pending_progress, self._looked_up = {}, set()
        self._recorder = None if state["history"] is None else StepRecorder(state["history"])
        self.sync_skips, self._updates = bool(state["sync_skips"]), int(state["updates"])

    def __repr__(self) -> str:
        return f"GradScaler({self._device!r}, {self._owner.policy!r}, enabled={self._enabled})"
