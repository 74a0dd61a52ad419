"""``LossScaleOptimizer`` for ``torch.optim``: TF's API over any torch optimizer.

It wraps the user's optimizer *instance* and is itself a
``torch.optim.Optimizer`` whose ``param_groups``, ``state`` and ``defaults``
are the inner optimizer's, so LR schedulers, ``add_param_group`` and
checkpoints reach it.

Cost per ``step()``, with G the bytes of all gradients:

========================== ======================== ====================
inner optimizer            passes over gradients    host syncs
========================== ======================== ====================
fused (``fused=True``)     1 unscale+check (R+W)    0: it skips itself [*]
fused, float16 gradients   1 check (R+W, values     0 [*]
                           unchanged); the kernel
                           unscales in float32
anything else              1 unscale+check (R+W)    1 (``found_inf``)
with ``clip_grad_norm_``   1 norm (R) [+1 R+W if    as above
                           not fused]
========================== ======================== ====================

[*] 1 on a step in which a parameter gets its first gradient: the inner
optimizer creates its state for that parameter then (SGD's momentum buffer
is uninitialised memory until its first real step), so that step is
decided on the host. In a usual run this is the first step only.

A policy whose scale may fall below 1 (``min_loss_scale < 1``) adds one
check pass (R+W) after the unscale: multiplying by ``1/S > 1`` can overflow
a finite gradient.

The scale update always runs on the device (about 20 scalar ops, no sync).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import weakref
from collections import OrderedDict
from numbers import Integral
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from .._policy import LossScale, serialize
from .._resolve import stable_form
from ._distributed import agreement_groups, all_reduce_max, validate_process_group
from ._distributed import check_replicas_agree as _check_replicas_agree
from ._diagnostics import OverflowReport, OverflowReporter, SkipGuard, StepRecorder
from ._grads import GradGroups, check_finite, move, reciprocal, scaled_norm, unscale_and_check_, unscaled_copies
from ._scale import SharedLossScale

__all__ = ["LossScaleOptimizer"]

# inner optimizer -> the LossScaleOptimizer wrapping it (weakly, both ways).
_WRAPPED: "weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.ref]" = weakref.WeakKeyDictionary()

_HOOK_DICTS = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


class LossScaleOptimizer(torch.optim.Optimizer):
    """An optimizer that applies loss scaling; TF's ``LossScaleOptimizer`` for torch.

    Loss scaling multiplies the loss by ``S`` before backprop and the
    gradients by ``1/S`` before the update, so that float16 gradients below
    about 6e-8 do not flush to zero (Micikevicius et al., 2018, "Mixed
    Precision Training"). A step whose gradients hold a NaN or an Inf is
    skipped (no change to weights, inner state or step counts) in every mode,
    fixed included, and the scale is updated either way.

    Args:
        optimizer: the ``torch.optim.Optimizer`` instance to wrap.
        loss_scale: the experimental form: a number (fixed scale),
            ``"dynamic"``, any :class:`lossscale.LossScale` (managers included),
            or a :class:`SharedLossScale` to share with other optimizers.
        dynamic: the stable form (default True).
        initial_scale: the initial (or, when ``dynamic=False``, fixed) scale;
            default 2**15.
        dynamic_growth_steps: finite steps before the scale doubles; default 2000.
        process_group: a ``torch.distributed`` group over which the found-inf
            flag is all-reduced (MAX) before the decision, so that every rank
            skips or steps together when ranks hold different gradients
            (sharded optimizers, model parallelism). One scalar all-reduce per
            step. Not needed with plain DDP, whose gradients already agree.
            A ``DeviceMesh`` means all of its ranks. When it is None and the
            parameters are DTensors (FSDP2 ``fully_shard``), the flag is
            reduced over their device mesh automatically. Give a group that
            spans every rank that must agree (e.g. all pipeline stages).
            See ``docs/distributed.md``.
        max_consecutive_skips: raise :class:`lossscale.LossScaleError`, with
            likely causes and fixes, once this many steps in a row were
            skipped (default None: never). No sync (one step late on a GPU).
        overflow_report: on a skipped step, log (logger ``"lossscale"``) and
            keep in :attr:`last_overflow_report` which gradients held NaN or
            Inf. Free on finite steps of the unfused path; one host sync per
            step on the fused path.
        named_parameters: names for that report, e.g. ``model.named_parameters()``.
        history: True or a :class:`lossscale.History` to record each step's
            scale, skip flag and loss (the one given to
            :meth:`get_scaled_loss`); transferred in batches, no per-step sync.
            Read it with :attr:`history`.

    The torch idiom::

        opt = LossScaleOptimizer(torch.optim.AdamW(model.parameters(), fused=True))
        for x, y in data:
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(model(x), y)
            opt.get_scaled_loss(loss).backward()
            opt.step()          # unscale, check, step or skip, update the scale

    Closure-based optimizers (LBFGS): the closure scales its own loss and
    returns the unscaled one::

        def closure():
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            opt.get_scaled_loss(loss).backward()
            return loss
        opt.step(closure)

    Every evaluation's gradients are unscaled and checked; if any overflowed,
    weights and inner state are restored from a copy taken before the step.

    >>> import torch
    >>> w = torch.nn.Parameter(torch.tensor([1.0]))
    >>> opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.25), "dynamic")
    >>> opt.get_scaled_loss((w ** 2).sum()).backward()
    >>> opt.step()
    >>> w.detach()
    tensor([0.5000])
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        loss_scale: Any = None,
        *,
        dynamic: bool | None = None,
        initial_scale: float | None = None,
        dynamic_growth_steps: int | None = None,
        process_group: Any = None,
        max_consecutive_skips: int | None = None,
        overflow_report: bool = False,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        history: Any = None,
    ) -> None:
        if isinstance(optimizer, LossScaleOptimizer):
            raise TypeError(
                "optimizer is already a LossScaleOptimizer; wrapping it again would scale twice. "
                "Use it as it is, or wrap its inner_optimizer."
            )
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer instance, got {type(optimizer).__name__}. "
                "Build the optimizer first, e.g. LossScaleOptimizer(torch.optim.AdamW(model.parameters()))."
            )
        owner = _WRAPPED.get(optimizer)
        if owner is not None and owner() is not None:
            raise ValueError(
                "This optimizer is already wrapped by another LossScaleOptimizer; two wrappers would unscale "
                "its gradients twice. Reuse the existing wrapper, or share one scale with SharedLossScale."
            )
        if isinstance(loss_scale, SharedLossScale):
            if dynamic is not None or initial_scale is not None or dynamic_growth_steps is not None:
                raise ValueError("A SharedLossScale carries its own policy; drop dynamic/initial_scale/dynamic_growth_steps.")
            scale = loss_scale
        else:
            device = next((p.device for g in optimizer.param_groups for p in g["params"]), None)
            scale = SharedLossScale(
                loss_scale,
                dynamic=dynamic,
                initial_scale=initial_scale,
                dynamic_growth_steps=dynamic_growth_steps,
                device=device,
            )
            scale._private = True
        self._inner = optimizer
        self._scale = scale
        self._pending: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._process_group = validate_process_group(process_group)
        self._agreement: list[Any] | None = None
        if not isinstance(overflow_report, bool):
            raise TypeError(f"overflow_report must be True or False, got {overflow_report!r}.")
        if named_parameters is not None and not overflow_report:
            raise ValueError("named_parameters only names the gradients of the overflow report: pass overflow_report=True too.")
        self._init_diagnostics(max_consecutive_skips, overflow_report, named_parameters, history)
        self._init_hooks()
        _WRAPPED[optimizer] = weakref.ref(self)

    def _init_diagnostics(
        self,
        max_consecutive_skips: int | None,
        overflow_report: bool,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
        history: Any,
    ) -> None:
        self._steps = 0  # step() calls; numbers the history and the overflow reports
        # (id, group settings) of parameters that a fused inner optimizer stepped and left without state
        # (SGD with momentum 0). Keyed by the settings too: a changed one (momentum) may make it keep state.
        self._stateless: set[tuple[int, tuple]] = set()
        # (inner state dict, parameter count) once every parameter was seen with state: the fast path.
        self._all_stateful: tuple[Any, int] | None = None
        # This optimizer's own skip signal, kept only when its scale is shared (else the scale's state says it).
        self._last_found_inf: torch.Tensor | None = None
        self._own_skipped_steps: torch.Tensor | None = None
        self._guard = None if max_consecutive_skips is None else SkipGuard(max_consecutive_skips)
        self._reporter = OverflowReporter(named_parameters) if overflow_report else None
        self._recorder = None if history is None or history is False else StepRecorder(history)

    def _init_hooks(self) -> None:
        for name in _HOOK_DICTS:
            setattr(self, name, OrderedDict())
        self._patch_step_function()

    # ------------------------------------------------------------ the inner optimizer's surface

    @property
    def inner_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer this LossScaleOptimizer wraps."""
        return self._inner

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self._inner.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self._inner.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self._inner.state

    @state.setter
    def state(self, value: Any) -> None:
        self._inner.state = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self._inner.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self._inner.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self._inner.add_param_group(param_group)
        self._agreement = None  # the new parameters may be DTensors on another mesh

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's ``zero_grad``; also forgets an ``unscale_()`` not yet stepped."""
        self._inner.zero_grad(set_to_none=set_to_none)
        self._pending = None

    # ------------------------------------------------------------ TF's attributes

    @property
    def dynamic(self) -> bool:
        """Whether the loss scale is dynamic."""
        return self._scale.policy.dynamic

    @property
    def dynamic_counter(self) -> torch.Tensor | None:
        """Finite steps since the scale last changed (0-d int32 tensor, no sync), or None if fixed."""
        return self._scale.state.good_steps.clone() if self.dynamic else None

    @property
    def dynamic_growth_steps(self) -> int | None:
        """Finite steps it takes to grow the scale, or None if fixed."""
        return stable_form(self._scale.policy)["dynamic_growth_steps"]

    @property
    def initial_scale(self) -> float:
        """The initial loss scale (the only one, when fixed)."""
        return self._scale.policy.initial_scale

    @property
    def loss_scale(self) -> torch.Tensor:
        """The current loss scale as a 0-d float32 tensor (no sync until you convert it)."""
        return self._scale.loss_scale

    @property
    def loss_scale_policy(self) -> LossScale:
        """The :class:`lossscale.LossScale` followed."""
        return self._scale.policy

    @property
    def shared_loss_scale(self) -> SharedLossScale:
        """The :class:`SharedLossScale` holding the state (private unless you passed one)."""
        return self._scale

    @property
    def last_step_skipped(self) -> torch.Tensor:
        """0-d bool tensor: was this optimizer's last step skipped? (no sync until you convert it).

        With a shared scale it is this optimizer's own step, even when
        another optimizer sharing the scale overflowed.
        """
        if self._scale._private:
            return self._scale.state.consecutive_skips > 0
        if self._last_found_inf is None:
            return torch.zeros((), dtype=torch.bool, device=self._scale.device)
        return self._last_found_inf > 0

    @property
    def skipped_steps(self) -> torch.Tensor:
        """0-d int32 tensor: this optimizer's steps skipped so far; saved in ``state_dict``."""
        if self._scale._private:
            return self._scale.state.skipped_steps.clone()
        if self._own_skipped_steps is None:
            return torch.zeros((), dtype=torch.int32, device=self._scale.device)
        return self._own_skipped_steps.clone()

    # ------------------------------------------------------------ scaling

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * loss_scale``, keeping ``loss``'s dtype; a callable gives a callable."""
        if self._recorder is not None:
            if isinstance(loss, torch.Tensor):
                self._recorder.note_loss(loss)
            elif callable(loss):
                return lambda: self.get_scaled_loss(loss())
        return self._scale.get_scaled_loss(loss)

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
        return None if self._reporter is None else self._reporter.last

    def get_unscaled_gradients(self, grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """A new list: each gradient times ``1/loss_scale`` in its own dtype; None stays None.

        Cost: one R pass and one W pass into new tensors; no sync.
        """
        return unscaled_copies(list(grads), self._scale.inv_scale())

    # ------------------------------------------------------------ the torch idiom

    @property
    def _fused(self) -> bool:
        return bool(getattr(self._inner, "_step_supports_amp_scaling", False))

    def _prepare(self) -> GradGroups:
        grads = GradGroups.of(self.param_groups)
        if grads.device is not None:
            self._scale.to_(grads.device)
        return grads

    def _require_unscalable(self, grads: GradGroups, what: str) -> None:
        if grads.has_float16:
            raise ValueError(
                f"{what} would unscale float16 gradients in float16, flushing to zero the small values loss "
                "scaling exists to keep. Keep float32 parameters and run the model under torch.autocast, "
                "or use a fused inner optimizer (e.g. torch.optim.AdamW(..., fused=True)) and call step() "
                "directly: it unscales inside its float32 kernel."
            )

    def _unscale_and_check(self, grads: GradGroups) -> torch.Tensor:
        """Unscales ``grads`` in place; returns the found-inf flag. No sync.

        One R+W pass, which checks the values before the multiplication by
        ``1/S``. When the policy lets ``S`` fall below 1 that product can
        overflow a finite value, so a second R+W pass checks the results.
        """
        device = self._scale.device
        found_inf = unscale_and_check_(grads, self._scale.inv_scale(), out_device=device)
        if self._scale.can_go_below_one:
            found_inf = torch.maximum(found_inf, check_finite(grads, out_device=device))
        return found_inf

    def unscale_(self) -> None:
        """Unscales the gradients in place now, e.g. to clip or inspect them before ``step()``.

        Calling it again before ``step()`` does nothing: the gradients are
        unscaled once. After :meth:`clip_grad_norm_` with a fused inner
        optimizer (which leaves them scaled for its kernel) it applies that
        clip's ``coef / S``. Cost: one R+W pass; no sync.
        """
        if self._pending is not None:
            found_inf, grad_scale = self._pending
            if grad_scale is None:
                return
            grads = self._prepare()
            self._require_unscalable(grads, "unscale_() after clip_grad_norm_()")
            if grads.tensors:
                torch._foreach_mul_(grads.tensors, reciprocal(grad_scale))
            self._pending = (found_inf, None)
            return
        grads = self._prepare()
        self._require_unscalable(grads, "unscale_()")
        self._pending = (self._unscale_and_check(grads), None)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clips the gradients' global norm to ``max_norm``, folding in the unscale.

        Returns the total norm of the *unscaled* gradients (a 0-d tensor; no
        sync), like ``torch.nn.utils.clip_grad_norm_``. A non-finite norm means
        the step will be skipped.

        The norm is taken of the scaled gradients, accumulated in float32, and
        divided by ``S``; a scaled norm beyond float32's range counts as an
        overflow (the step is skipped and the scale backs off, as for an Inf).
        With a fused inner optimizer the unscale and the clip factor travel
        into its kernel, so the norm is the only pass (R), and ``p.grad``
        stays scaled (as with GradScaler's fused path); otherwise one more R+W
        pass applies ``clip/S`` to every gradient.

        ``norm_type`` is any positive p, or ``inf``: a p-norm is infinite
        whenever an element is, which is what lets it stand in for the check.
        """
        norm_type = _validated_norm_type(norm_type)
        _validate_max_norm(max_norm)
        grads = self._prepare()
        if self._pending is not None:
            if self._pending[1] is not None:
                raise RuntimeError(
                    "clip_grad_norm_() was already called since the last step(); clip once per iteration."
                )
            # Already unscaled by unscale_(): an ordinary clip.
            total = scaled_norm(grads, norm_type, out_device=self._scale.device)
            if grads.tensors:
                torch._foreach_mul_(grads.tensors, torch.clamp(max_norm / (total + 1e-6), max=1.0))
            return total
        scale = self._scale.state.loss_scale
        total = scaled_norm(grads, norm_type, out_device=self._scale.device) * self._scale.inv_scale()
        found_inf = (~torch.isfinite(total)).float()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if self._fused:
            self._pending = (found_inf, scale / coef)
        else:
            self._require_unscalable(grads, "clip_grad_norm_()")
            if grads.tensors:
                torch._foreach_mul_(grads.tensors, self._scale.inv_scale() * coef)
            self._pending = (found_inf, None)
        return total

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Unscales and checks the gradients, steps or skips, and updates the scale.

        Returns the closure's loss, if a closure was given. See the class
        docstring for the passes and host syncs of each case.
        """
        if closure is not None:
            return self._step_with_closure(closure)
        if self._pending is None:
            grads = self._prepare()
            if self._fused and grads.has_float16:
                # Unscaling in float16 would flush small values: let the kernel unscale in float32.
                # (There g / S overflows float32 only if S < 65504 / 3.4e38, about 2**-112: not re-checked.)
                self._pending = (check_finite(grads, out_device=self._scale.device), self._scale.state.loss_scale)
            else:
                self._require_unscalable(grads, "step()")
                self._pending = (self._unscale_and_check(grads), None)
        found_inf, grad_scale = self._pending
        found_inf = self._agree(found_inf)
        self._finish(found_inf, self._apply(found_inf, grad_scale))
        return None

    def _needs_host_decision(self) -> bool:
        """Whether this step's skip must be decided on the host.

        Always for unfused optimizers, which take no ``found_inf``. For a fused
        one, only when a parameter with a gradient has no inner state yet: the
        step creates it (Adam's zero moments; SGD's momentum buffer, made with
        ``torch.empty_like`` and filled by the kernel), and a step skipped on
        the device would leave it behind, garbage in SGD's case. Parameters
        that a real step left stateless (SGD without momentum) are remembered.
        An empty entry counts as no state (``state`` is a defaultdict, which a
        mere read of ``opt.state[p]`` fills). Cost: once every parameter has
        state, a comparison of counts; until then one lookup per parameter.
        """
        if not self._fused:
            return True
        state = self._inner.state
        count = sum(len(group["params"]) for group in self.param_groups)
        known = self._all_stateful
        if known is not None and known[0] is state and known[1] == count:
            return False
        missing = list(self._params_without_state())
        if not missing:
            self._all_stateful = (state, count)
        return any(key not in self._stateless for p, key in missing if p.grad is not None)

    def _params_without_state(self) -> Iterable[tuple[torch.Tensor, tuple[int, tuple]]]:
        """``(p, (id(p), settings))`` for each parameter with no (or an empty) inner state entry.

        ``settings`` are its group's hyperparameters but ``lr`` (which
        schedulers change every step), as a hashable tuple.
        """
        state = self._inner.state
        for group in self.param_groups:
            settings = tuple(
                sorted((k, v) for k, v in group.items() if k not in ("params", "lr") and isinstance(v, _SETTING_TYPES))
            )
            for p in group["params"]:
                if not state.get(p):
                    yield p, (id(p), settings)

    def _apply(self, found_inf: torch.Tensor, grad_scale: torch.Tensor | None) -> bool | None:
        """Runs the inner step unless ``found_inf``; on the device when the inner optimizer can skip itself.

        Returns whether the step was skipped when that was decided on the
        host, and None when the inner optimizer decided on the device.
        """
        on_host = self._needs_host_decision()
        if on_host:
            if bool(found_inf.item()):  # the one host sync of the unfused path
                return True
            if not self._fused:
                self._inner.step()
                return False
        inner: Any = self._inner
        inner.grad_scale, inner.found_inf = grad_scale, found_inf
        try:
            inner.step()
        finally:
            del inner.grad_scale, inner.found_inf
        if not on_host:
            return None
        self._stateless.update(key for p, key in self._params_without_state() if p.grad is not None)
        return False

    def _agree(self, found_inf: torch.Tensor) -> torch.Tensor:
        """The found-inf flag every rank agrees on: MAX-all-reduced over ``process_group`` or the DTensor mesh.

        One scalar all-reduce per step (none without a group or DTensors);
        no host sync on NCCL (stream-ordered), a blocking wait on gloo.
        """
        if self._agreement is None:  # worked out once; add_param_group() clears it
            self._agreement = agreement_groups(self._process_group, self._all_params())
        return all_reduce_max(found_inf, self._agreement) if self._agreement else found_inf

    def check_replicas_agree(self, process_group: Any = None) -> None:
        """Debug check: raises :class:`lossscale.LossScaleError` unless all ranks hold the same scale state.

        Compares the scale, the four counters and the policy over
        ``process_group`` (default: the group the found-inf flag is reduced
        over, else the world). Call it on every rank of that group, e.g.
        every few hundred steps or after a resume. Cost: one all-gather of 6
        numbers and one host sync.
        """
        group = self._process_group if process_group is None else validate_process_group(process_group)
        groups = agreement_groups(group, self._all_params())
        _check_replicas_agree(self._scale.state, self._scale.policy, groups)

    def _finish(
        self,
        found_inf: torch.Tensor,
        skipped: bool | None,
        named_grads: Iterable[tuple[str, torch.Tensor]] | None = None,
    ) -> None:
        """Updates the scale and runs the diagnostics that are on (none costs anything when off)."""
        self._pending = None
        step = self._steps
        self._steps += 1
        if self._reporter is not None or self._recorder is not None:
            scale_used = self._scale.state.loss_scale.clone()
        if self._reporter is not None:
            if skipped is None:
                skipped = bool(found_inf.item())  # the report's one sync on the fused path
            if named_grads is None:
                named_grads = self._named_grads()
            self._reporter.observe(skipped, named_grads, scale_used, step)
        if not self._scale._private:
            self._last_found_inf = found_inf
            skipped_now = (found_inf > 0).to(torch.int32)
            own = self._own_skipped_steps
            self._own_skipped_steps = skipped_now if own is None else move(own, found_inf.device) + skipped_now
        self._scale._record(found_inf, self)
        if self._recorder is not None:
            self._recorder.record(step, scale_used, found_inf > 0)
        if self._guard is not None:
            self._guard.check(self._scale.state.consecutive_skips, self._scale.state.loss_scale)

    def _named_grads(self) -> Iterable[tuple[str, torch.Tensor]]:
        """``(name, grad)`` of every parameter with a gradient; lazy, so free unless iterated."""
        reporter = self._reporter
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if p.grad is not None and reporter is not None:
                    yield reporter.name_of(p, g, i), p.grad

    def _step_with_closure(self, closure: Callable[[], Any]) -> Any:
        params = self._all_params()
        saved_params = [p.detach().clone() for p in params]
        saved_state = copy.deepcopy(self._inner.state_dict())
        found_total = torch.zeros((), dtype=torch.float32, device=self._scale.device)

        def unscaled_closure() -> Any:
            with torch.enable_grad():
                loss = closure()
            grads = self._prepare()
            self._require_unscalable(grads, "step(closure)")
            found_total.add_(self._unscale_and_check(grads))
            return loss

        self._pending = None
        loss = self._inner.step(unscaled_closure)
        found_total = self._agree(found_total)
        if bool(found_total.item()):  # one host sync per closure step
            with torch.no_grad():
                for p, saved in zip(params, saved_params):
                    p.copy_(saved)
            self._inner.load_state_dict(saved_state)
            self._finish(found_total, True)
        else:
            self._finish(found_total, False)
        return loss

    # ------------------------------------------------------------ TF's methods

    def _all_params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def compute_gradients(
        self, loss: Any, var_list: Iterable[torch.Tensor] | None = None, grad_loss: torch.Tensor | None = None
    ) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
        """Unscaled ``(gradient, variable)`` pairs of ``loss`` (a tensor or a zero-argument callable).

        ``var_list`` defaults to every parameter of the inner optimizer that
        requires grad. Gradients are not accumulated into ``.grad``. Cost:
        one backward pass, one R and one W pass to unscale; no sync.
        """
        if callable(loss) and not isinstance(loss, torch.Tensor):
            loss = loss()
        if var_list is None:
            variables = [p for p in self._all_params() if p.requires_grad]
        else:
            variables = list(var_list)
            bad = [type(v).__name__ for v in variables if not (isinstance(v, torch.Tensor) and v.requires_grad)]
            if bad:
                raise ValueError(f"var_list must hold tensors that require grad; got {', '.join(bad)}.")
        scaled = self.get_scaled_loss(loss)
        if grad_loss is not None:
            grad_loss = grad_loss.to(scaled.dtype)
        grads = torch.autograd.grad(scaled, variables, grad_outputs=grad_loss, allow_unused=True)
        return list(zip(self.get_unscaled_gradients(grads), variables))

    def apply_gradients(
        self,
        grads_and_vars: Iterable[tuple[torch.Tensor | None, torch.Tensor]],
        global_step: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Applies *unscaled* gradients if all are finite; updates the scale either way.

        A non-finite gradient means no update at all: weights, inner state and
        step counts stay, and ``global_step`` (a tensor, incremented in place)
        is not incremented. The parameters' own ``.grad`` are left as they
        were. Returns a 0-d bool tensor, True if applied (no sync).
        Cost: one R+W check pass (values unchanged); host syncs as ``step()``.
        """
        pairs = list(grads_and_vars)
        if global_step is not None and not isinstance(global_step, torch.Tensor):
            raise TypeError(
                f"global_step must be a tensor to increment in place, e.g. torch.zeros((), dtype=torch.int64); "
                f"got {type(global_step).__name__}."
            )
        params = self._all_params()
        known = {id(p) for p in params}
        for _, var in pairs:
            if id(var) not in known:
                raise ValueError(
                    f"A variable of shape {tuple(var.shape)} is not a parameter of the inner optimizer; "
                    "add it with add_param_group() first."
                )
        given = [g for g, _ in pairs if g is not None]
        if not given:
            raise ValueError("No gradients provided for any variable: every gradient in grads_and_vars is None.")
        self._scale.to_(given[0].device)
        found_inf = self._agree(check_finite(GradGroups(given), out_device=self._scale.device))
        saved = [p.grad for p in params]
        try:
            for p in params:
                p.grad = None
            for grad, var in pairs:
                if grad is not None:
                    var.grad = grad
            skipped = self._apply(found_inf, None)
        finally:
            for p, grad in zip(params, saved):
                p.grad = grad
        applied = found_inf == 0
        if global_step is not None:
            global_step.add_(applied.to(device=global_step.device, dtype=global_step.dtype))
        index = {id(p): (g, i) for g, group in enumerate(self.param_groups) for i, p in enumerate(group["params"])}
        reporter = self._reporter
        named = (
            [(reporter.name_of(v, *index[id(v)]), grad) for grad, v in pairs if grad is not None]
            if reporter is not None
            else None
        )
        self._finish(found_inf, skipped, named)
        return applied

    def minimize(
        self,
        loss: Any,
        var_list: Iterable[torch.Tensor] | None = None,
        global_step: torch.Tensor | None = None,
        grad_loss: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``apply_gradients(compute_gradients(loss, var_list, grad_loss), global_step)``."""
        return self.apply_gradients(self.compute_gradients(loss, var_list, grad_loss), global_step)

    def get_slot(self, var: torch.Tensor, name: str) -> torch.Tensor | None:
        """The inner optimizer's state ``name`` for ``var`` (e.g. ``"exp_avg"``), or None."""
        return self.state.get(var, {}).get(name)

    def get_slot_names(self) -> list[str]:
        """Names of the per-parameter state of the inner optimizer (``"step"`` excluded)."""
        return sorted({name for s in self.state.values() for name in s if name != "step"})

    def variables(self) -> list[torch.Tensor]:
        """The loss-scale state tensors, then every tensor of the inner optimizer's state."""
        inner = [v for s in self.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        return list(self._scale.state) + inner

    # ------------------------------------------------------------ config and checkpoints

    def get_config(self) -> dict[str, Any]:
        """Keras's keys (``dynamic``, ``initial_scale``, ``dynamic_growth_steps``), the inner config, the policy."""
        inner = type(self._inner)
        return {
            "inner_optimizer": {"class_name": inner.__name__, "module": inner.__module__, "config": dict(self.defaults)},
            **stable_form(self._scale.policy),
            "loss_scale": serialize(self._scale.policy),
        }

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        params: Iterable[Any],
        custom_objects: Mapping[str, type] | None = None,
    ) -> LossScaleOptimizer:
        """Rebuilds from :meth:`get_config`; torch optimizers need their ``params`` at construction."""
        spec = config["inner_optimizer"]
        name = spec["class_name"]
        opt_cls = (custom_objects or {}).get(name)
        if opt_cls is None:
            module = importlib.import_module(spec.get("module", "torch.optim"))
            opt_cls = getattr(module, name, None)
        if opt_cls is None:
            raise ValueError(f"Unknown optimizer class {name!r}: pass it in custom_objects={{{name!r}: {name}}}.")
        inner = opt_cls(params, **_constructor_kwargs(opt_cls, spec["config"]))
        if config.get("loss_scale") is not None:
            return cls(inner, loss_scale=config["loss_scale"])
        return cls(
            inner,
            dynamic=config.get("dynamic"),
            initial_scale=config.get("initial_scale"),
            dynamic_growth_steps=config.get("dynamic_growth_steps"),
        )

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The inner optimizer's state dict plus a ``"lossscale"`` entry.

        That entry holds the policy, the scale and its counters, and this
        optimizer's own ``"optimizer"`` counters: its step count and, when
        the scale is shared, its skipped steps.
        """
        state = dict(self._inner.state_dict())
        state["lossscale"] = {**self._scale.state_dict(), "optimizer": self._own_state()}
        return state

    def _own_state(self) -> dict[str, Any]:
        own = self._own_skipped_steps
        return {"steps": self._steps, "skipped_steps": None if own is None else own.detach().clone()}

    def _load_own_state(self, own: dict[str, Any]) -> None:
        """Restores this optimizer's counters (as :func:`_validated_own_state` returns them).

        A history recorded past the restored step is cut back to it.
        """
        self._steps = own["steps"]
        skipped = own["skipped_steps"]
        self._own_skipped_steps = (
            None if skipped is None else torch.as_tensor(skipped).to(self._scale.device, torch.int32).clone()
        )
        self._last_found_inf = None
        if self._recorder is not None:
            self._recorder.flush()
            self._recorder.history.truncate(self._steps)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:  # type: ignore[override]
        """Restores :meth:`state_dict`'s output; the saved policy replaces the current one.

        A plain inner-optimizer state dict (no ``"lossscale"`` entry) restores
        the inner optimizer and keeps the current scale.
        """
        state = dict(state_dict)
        saved_scale = state.pop("lossscale", None)
        own = None if saved_scale is None else _validated_own_state(saved_scale.get("optimizer"))
        self._inner.load_state_dict(state)
        if saved_scale is not None:
            self._scale.load_state_dict(saved_scale)
            self._load_own_state(own)
        self._stateless.clear()
        self._all_stateful = None
        self._pending = None

    def __getstate__(self) -> dict[str, Any]:  # type: ignore[override]
        # Parameter names (keyed by tensor identity) and process groups do not survive pickling.
        return {
            "inner": self._inner,
            "scale": self._scale,
            "max_consecutive_skips": None if self._guard is None else self._guard.limit,
            "overflow_report": self._reporter is not None,
            "history": self.history,
            "optimizer": self._own_state(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:  # type: ignore[override]
        self._inner = state["inner"]
        self._scale = state["scale"]
        self._pending = None
        self._process_group = None  # process groups do not pickle; pass process_group= again
        self._agreement = None
        self._init_diagnostics(
            state.get("max_consecutive_skips"), state.get("overflow_report", False), None, state.get("history")
        )
        self._load_own_state(_validated_own_state(state.get("optimizer")))
        self._init_hooks()
        _WRAPPED[self._inner] = weakref.ref(self)

    def __repr__(self) -> str:
        return f"LossScaleOptimizer({self._inner!r}, loss_scale={self._scale.policy!r})"


_SETTING_TYPES = (bool, int, float, str, tuple, type(None))


def _validated_own_state(own: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``"optimizer"`` entry of a lossscale state dict, checked: ``{"steps": int, "skipped_steps": ...}``."""
    own = dict(own or {})
    steps = own.get("steps", 0)
    if isinstance(steps, torch.Tensor) and steps.numel() == 1 and not steps.is_floating_point():
        steps = int(steps)
    if isinstance(steps, bool) or not isinstance(steps, Integral) or steps < 0:
        raise ValueError(f"Not a lossscale state dict: its step count is {steps!r}; pass what state_dict() returned.")
    return {"steps": int(steps), "skipped_steps": own.get("skipped_steps")}


def _validated_norm_type(norm_type: Any) -> float:
    """``norm_type`` as a float p > 0 (``inf`` included), as ``clip_grad_norm_`` needs."""
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        raise TypeError(
            f"norm_type must be a number or 'inf', got {norm_type!r}. Use 2.0 for the Euclidean norm."
        ) from None
    if not p > 0:
        raise ValueError(
            f"norm_type must be positive, got {norm_type!r}: for p <= 0 (and -inf) the result is not a norm, "
            "and it can be finite while a gradient is Inf, so the overflow check would miss it. "
            "Use 2.0, 1.0 or float('inf')."
        )
    return p


def _validate_max_norm(max_norm: Any) -> None:
    if isinstance(max_norm, torch.Tensor):
        return  # reading it would sync
    try:
        value = float(max_norm)
    except (TypeError, ValueError):
        raise TypeError(f"max_norm must be a number, got {max_norm!r}.") from None
    if not value >= 0:
        raise ValueError(f"max_norm must be a non-negative number, got {max_norm!r}; for example max_norm=1.0.")


def _constructor_kwargs(opt_cls: type, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of an optimizer's ``defaults`` that its constructor takes.

    ``defaults`` may hold derived entries the constructor rejects (AdamW's
    ``decoupled_weight_decay``); a constructor with ``**kwargs`` takes all.
    """
    parameters = inspect.signature(opt_cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(defaults)
    return {k: v for k, v in defaults.items() if k in parameters}
