"""``LossScaleOptimizer``: TF's API over any ``torch.optim`` optimizer; one scale owner and one ``OptimizerStep``."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from .._errors import ArgumentTypeError
from .._policy import LossScale
from .._resolve import resolve_loss_scale, serialize, stable_form
from .._sampler import check_stats_every
from .._torch._kernels import GradGroups, check_finite, unscaled_copies
from ._checkpoint import Checkpoint, load_inner, read_policy
from ._compat import init_step_hooks
from ._diagnostics import Diagnostics, OverflowReport
from ._distributed import FlagAgreement, agreement_groups, validate_process_group
from ._distributed import check_replicas_agree as _check_replicas_agree
from ._grads import CheckedGrads
from ._state import ScaleState, SharedLossScale, require_own_scale, scale_owner
from ._stats import StatsSampler
from ._step import OptimizerStep

__all__ = ["LossScaleOptimizer", "optimizer_class"]


# inner optimizer -> the LossScaleOptimizer wrapping it (weakly, both ways): two wrappers would unscale twice.
_WRAPPED: weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.ref] = weakref.WeakKeyDictionary()


#: TF's slot names (v1 and Keras optimizers) -> torch.optim's state names, per torch optimizer class.
_TF_SLOTS: dict[str, dict[str, str]] = {
    "SGD": {"momentum": "momentum_buffer"},
    "Adam": {"m": "exp_avg", "v": "exp_avg_sq", "vhat": "max_exp_avg_sq"},
    "AdamW": {"m": "exp_avg", "v": "exp_avg_sq", "vhat": "max_exp_avg_sq"},
    "NAdam": {"m": "exp_avg", "v": "exp_avg_sq"},
    "Adamax": {"m": "exp_avg", "v": "exp_inf"},
    "RMSprop": {"rms": "square_avg", "momentum": "momentum_buffer", "mg": "grad_avg"},
    "Adagrad": {"accumulator": "sum"},
    "Adadelta": {"accum_grad": "square_avg", "accum_var": "acc_delta"},
}


def _check_name(name: Any) -> None:
    """TF's ``name=`` for an operation: None or a string (torch names no operation, so it is otherwise unused)."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string or None, got {type(name).__name__}.")


def _check_wrappable(optimizer: Any) -> None:
    """Refuses a non-optimizer, a wrapper, and an optimizer another live wrapper already wraps."""
    if isinstance(optimizer, LossScaleOptimizer):
        raise TypeError("optimizer is already a LossScaleOptimizer; wrapping it again would scale twice. "
                        "Use it as it is, or wrap its inner_optimizer.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        # a TypeError (Keras' LossScaleOptimizer raised one) that is also a ValueError (TF v1's raised one)
        raise ArgumentTypeError(f"optimizer must be a torch.optim.Optimizer instance, got {type(optimizer).__name__}. "
                        "Build the optimizer first, e.g. LossScaleOptimizer(torch.optim.AdamW(model.parameters())).")
    owner = _WRAPPED.get(optimizer)
    if owner is not None and owner() is not None:
        raise ValueError("This optimizer is already wrapped by another LossScaleOptimizer; two wrappers would unscale "
                         "its gradients twice. Reuse the existing wrapper, or share one scale with SharedLossScale.")


class LossScaleOptimizer(torch.optim.Optimizer):
    """An optimizer that applies loss scaling; TF's ``LossScaleOptimizer`` for torch (usage: ``docs/torch.md``).

    Loss scaling multiplies the loss by ``S`` before backprop and the gradients by ``1/S`` before the update,
    so that float16 gradients below about 6e-8 do not flush to zero. A step whose gradients hold a NaN or an Inf
    is skipped (weights, inner state, step counts unchanged) in every mode, and the scale is updated either way.
    ``param_groups``, ``state`` and ``defaults`` are the inner optimizer's (LR schedulers reach it).

    Cost per ``step()`` (``docs/concepts.md``): one unscale+check pass (R+W; fused float16 gradients, and a fused
    optimizer of your own: a check, and the kernel unscales by ``grad_scale = S`` as under ``torch.amp.GradScaler``);
    ``clip_grad_norm_`` adds a norm (R), and an R+W unless fused; ``min_loss_scale < 1`` an R+W recheck.
    An inner optimizer whose ``step`` takes ``grad_scaler=`` (apex's contract) gets unscaled gradients and a skip
    decided on the host: there is no scaler to pass it. Host syncs: fused 0 (1 when a parameter gets its first gradient), else 1; the scale update adds none.
    No gradient: a no-op.

    Args:
        optimizer: the ``torch.optim.Optimizer`` instance to wrap.
        loss_scale: the experimental form: a number (fixed), ``"dynamic"``, any :class:`lossscale.LossScale`
            (managers included), or a :class:`SharedLossScale` to share with other optimizers.
        dynamic, initial_scale, dynamic_growth_steps: the stable form (defaults True, 2**15, 2000 finite steps
            before the scale doubles; ``initial_scale`` is the fixed scale when ``dynamic=False``).
        min_loss_scale, max_loss_scale, hysteresis: refine the dynamic scale (defaults 1, none, 1).
        process_group: a ``torch.distributed`` group (or ``DeviceMesh``) over which the found-inf flag is
            MAX-all-reduced, so ranks with different gradients skip together: one scalar all-reduce per step. Not
            needed with plain DDP; None with DTensor parameters: their mesh (``docs/distributed.md``).
        max_consecutive_skips: raise :class:`lossscale.LossScaleError` at the n-th skipped ``step()`` in a row of
            *this* optimizer (default None: never). No sync (on CUDA it raises one step late).
        overflow_report: on a skipped step, log and keep in :attr:`last_overflow_report` which gradients held NaN
            or Inf. Cost: one sync per step on the fused path, one more on a skip.
        named_parameters: names for that report, e.g. ``model.named_parameters()``.
        history: True or a :class:`lossscale.History`: each step's scale, skip flag and loss, no per-step sync.
        stats_every: measure the *scaled* gradients every ``N``-th step (default None; 16 with
            ``loss_scale="auto"``): :attr:`gradient_stats` (``docs/gradient_stats.md``), which ``AutoLossScale``
            sets the scale from. Cost: about 8 kernels per gradient on a sampled step, no sync.
        **removed: ``loss_scale_manager``, contrib's name for ``loss_scale`` (a manager, or any form above); and
            keywords of earlier versions, refused with a message naming the fix (``check``: every step unscales
            and checks).

    Raises:
        TypeError, ValueError: a malformed argument, named, or an optimizer already wrapped.

    >>> import torch
    >>> w = torch.nn.Parameter(torch.tensor([1.0]))
    >>> opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.25), "dynamic")
    >>> opt.get_scaled_loss((w ** 2).sum()).backward()
    >>> opt.step(); w.detach()
    tensor([0.5000])
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, loss_scale: Any = None, *, dynamic: bool | None = None,
        initial_scale: float | None = None, dynamic_growth_steps: int | None = None,
        min_loss_scale: float | None = None, max_loss_scale: float | None = None, hysteresis: int | None = None,
        max_consecutive_skips: int | None = None, history: Any = None, process_group: Any = None,
        overflow_report: bool = False, named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        stats_every: int | None = None, **removed: Any,
    ) -> None:
        if "check" in removed:
            raise TypeError("LossScaleOptimizer's check argument was removed: step() always unscales and checks "
                            "the gradients. Drop the check argument.")
        if "loss_scale_manager" in removed:  # contrib's LossScaleOptimizer(opt, loss_scale_manager)
            if loss_scale is not None:
                raise TypeError("Pass loss_scale or loss_scale_manager (contrib's name for it), not both.")
            loss_scale = removed.pop("loss_scale_manager")
        if removed:
            raise TypeError(f"LossScaleOptimizer() got an unexpected keyword argument {next(iter(removed))!r}")
        _check_wrappable(optimizer)
        stable: dict[str, Any] = {"dynamic": dynamic, "initial_scale": initial_scale,
                                  "dynamic_growth_steps": dynamic_growth_steps,
                                  "min_loss_scale": min_loss_scale, "max_loss_scale": max_loss_scale,
                                  "hysteresis": hysteresis}
        # The policy is resolved here, as in every binding's constructor; a SharedLossScale carries its own.
        scale = loss_scale if isinstance(loss_scale, SharedLossScale) else resolve_loss_scale(loss_scale, **stable)
        owner = scale_owner(optimizer, scale, stable)
        diagnostics = Diagnostics(max_consecutive_skips, overflow_report, named_parameters, history)
        every = check_stats_every(stats_every, owner.policy)
        self._inner = optimizer
        self._sampler = None if every is None else StatsSampler(every, owner.policy)
        self._steps = OptimizerStep(owner, FlagAgreement(process_group, self._params), diagnostics, self._sampler)
        init_step_hooks(self)
        _WRAPPED[optimizer] = weakref.ref(self)

    @property
    def inner_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer this LossScaleOptimizer wraps."""
        return self._inner

    param_groups = property(lambda self: self._inner.param_groups, lambda self, v: setattr(self._inner, "param_groups", v))
    state = property(lambda self: self._inner.state, lambda self, v: setattr(self._inner, "state", v))
    defaults = property(lambda self: self._inner.defaults, lambda self, v: setattr(self._inner, "defaults", v))

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """The inner optimizer's ``add_param_group(param_group)``; the flag's process groups are found again (the new
        parameters may be DTensors on another mesh).

        Args:
            param_group: as ``torch.optim.Optimizer.add_param_group`` takes it.
        """
        self._inner.add_param_group(param_group)
        self._steps.agree.reset()  # type: ignore[union-attr]  # the new parameters may be DTensors on another mesh

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's ``zero_grad``; also forgets an ``unscale_()`` or clip not yet stepped.

        Args:
            set_to_none: as ``torch.optim.Optimizer.zero_grad`` (default True: the gradients become None).
        """
        self._inner.zero_grad(set_to_none=set_to_none)
        self._steps.forget()

    def unscale_(self) -> None:
        """Unscales the gradients in place now (to clip or inspect them); again before ``step()``, nothing.

        Raises:
            RuntimeError: after ``step()`` in the same iteration.
            ValueError: float16 gradients (they would be unscaled in float16).

        Cost: one R+W pass over the gradients; no sync.
        """
        self._steps.unscale_(self._inner)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clips the gradients' global norm to ``max_norm``, folding in the unscale; once per iteration.

        Args:
            max_norm: the largest norm kept (a number >= 0, or a 0-d tensor, not read on the host).
            norm_type: the p of the p-norm: any p > 0 or ``inf`` (default 2.0).

        Returns:
            The *unscaled* gradients' norm, a 0-d float32 tensor (no sync); a non-finite one skips the step.

        Raises:
            TypeError, ValueError: a malformed ``max_norm`` or ``norm_type``.
            RuntimeError: a second clip, or a clip after ``step()``, in the same iteration.

        Cost: one R pass over the gradients, plus an R+W unless the inner optimizer is fused; no sync.
        """
        return self._steps.clip_grad_norm_(self._inner, max_norm, norm_type)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Unscales and checks the gradients, steps or skips, and updates the scale (costs: the class docstring).

        Args:
            closure: None, or (LBFGS) a callable that calls ``opt.get_scaled_loss(loss).backward()`` and returns
                ``loss``; every evaluation is unscaled and checked, and an overflow in any restores the weights and
                inner state (cost: copies of both, one host sync).

        Returns:
            None, or the closure's loss.

        Raises:
            RuntimeError: ``step()`` twice before a shared scale's ``update()``.
            LossScaleError: ``max_consecutive_skips`` skipped steps in a row.
        """
        if closure is not None:
            return self._steps.step_with_closure(self._inner, closure, self._named_grads)
        self._steps.step(self._inner, named_grads=self._named_grads)
        return None

    def _named_grads(self) -> list[tuple[str, torch.Tensor]]:
        return self._steps.diagnostics.named_grads(self._inner.param_groups)

    def check_replicas_agree(self, process_group: Any = None) -> None:
        """Checks that every rank holds the same scale, counters and policy.

        Args:
            process_group: the ranks to compare (default: the flag's process group, else the world).

        Raises:
            LossScaleError: the ranks differ (the message names what differs on which rank).
            RuntimeError: ``torch.distributed`` is not initialized.

        Cost: one all-gather of 6 float64 per group, one sync.
        """
        agree = self._steps.agree
        group = agree.process_group if process_group is None else validate_process_group(process_group)  # type: ignore[union-attr]
        owner = self._steps.owner
        _check_replicas_agree(owner.state, owner.policy, agreement_groups(group, self._params()))

    # TF v1's optimizer methods (gradients as values, slots, variables, config)

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * loss_scale``, keeping ``loss``'s dtype. With ``stats_every``, each call since the last step or
        ``zero_grad()`` counts as a micro-batch (``AutoLossScale`` reads them).

        Args:
            loss: a floating-point tensor, or a zero-argument callable returning one.

        Returns:
            The scaled loss (a callable for a callable). One operator, no sync.

        Raises:
            TypeError: ``loss`` is not a floating-point tensor (or a callable).
        """
        steps = self._steps
        if isinstance(loss, torch.Tensor):
            if steps.diagnostics.recorder is not None:
                steps.diagnostics.recorder.note_loss(loss)
        elif callable(loss) and (steps.diagnostics.recorder is not None or steps.sampler is not None):
            return lambda: self.get_scaled_loss(loss())
        scaled = steps.owner.get_scaled_loss(loss)
        if steps.sampler is not None:
            steps.sampler.backwards += 1
        return scaled

    def get_unscaled_gradients(self, grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Unscaled copies of ``grads``.

        Args:
            grads: gradients of the scaled loss (tensors, or None for a variable without one); not modified.

        Returns:
            A new list: each gradient times ``1/loss_scale`` in its own dtype, None staying None.

        Cost: one R and one W pass over the gradients (+R+W for half types, computed in float32); no sync.
        """
        return unscaled_copies(list(grads), self._steps.owner.inv_scale())

    #: TF v1's ``gate_gradients`` values, accepted and ignored as TF ignores them in eager execution.
    GATE_NONE = 0
    GATE_OP = 1
    GATE_GRAPH = 2

    def get_name(self) -> str:
        """The inner optimizer's name, as TF's ``get_name()`` returned: torch optimizers have none, so it is the
        inner optimizer's class name (``"SGD"``, ``"AdamW"``)."""
        return type(self._inner).__name__

    def compute_gradients(
        self, loss: Any, var_list: Iterable[torch.Tensor] | None = None, gate_gradients: int = GATE_OP,
        aggregation_method: Any = None, colocate_gradients_with_ops: bool = False,
        grad_loss: torch.Tensor | None = None,
    ) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
        """Unscaled gradients of ``loss``, not accumulated into ``.grad``; TF v1's signature.

        Args:
            loss: the unscaled loss, a tensor or a zero-argument callable returning one.
            var_list: the tensors to differentiate by (default: the parameters that require grad).
            gate_gradients: ``GATE_NONE``, ``GATE_OP`` or ``GATE_GRAPH``; ignored, as TF ignored it in eager
                execution (autograd has no gating).
            aggregation_method, colocate_gradients_with_ops: ignored, as TF ignored them in eager execution.
            grad_loss: the gradient of the final result with respect to ``loss`` (default: ones, so a non-scalar
                ``loss`` is differentiated as its sum, as in TF).

        Returns:
            ``(gradient, variable)`` pairs; a gradient is None where ``loss`` does not depend on the variable.

        Raises:
            ValueError: a ``var_list`` entry that is not a tensor requiring grad, no variable to differentiate by,
                or a ``gate_gradients`` that is none of the three.

        Cost: one backward pass, then :meth:`get_unscaled_gradients`; no sync.
        """
        if isinstance(gate_gradients, bool) or gate_gradients not in (self.GATE_NONE, self.GATE_OP, self.GATE_GRAPH):
            raise ValueError("gate_gradients must be one of: LossScaleOptimizer.GATE_NONE, GATE_OP, GATE_GRAPH "
                             f"(0, 1, 2). Not {gate_gradients!r}.")
        if callable(loss) and not isinstance(loss, torch.Tensor):
            loss = loss()
        if var_list is None:
            variables = [p for p in self._params() if p.requires_grad]
        else:
            variables = list(var_list)
            bad = [type(v).__name__ for v in variables if not (isinstance(v, torch.Tensor) and v.requires_grad)]
            if bad:
                raise ValueError(f"var_list must hold tensors that require grad; got {', '.join(bad)}.")
        if not variables:
            raise ValueError("No variables to optimize: var_list is empty (or no parameter of the inner optimizer "
                             "requires grad). Pass the tensors to differentiate by, e.g. var_list=model.parameters().")
        scaled = self.get_scaled_loss(loss)
        if grad_loss is not None:
            grad_loss = grad_loss.to(scaled.dtype)
        elif isinstance(scaled, torch.Tensor) and scaled.dim() != 0:
            grad_loss = torch.ones_like(scaled)  # TF differentiates a non-scalar loss's sum; autograd would refuse
        grads = torch.autograd.grad(scaled, variables, grad_outputs=grad_loss, allow_unused=True)
        return list(zip(self.get_unscaled_gradients(grads), variables))

    def apply_gradients(self, grads_and_vars: Iterable[tuple[torch.Tensor | None, torch.Tensor]],
                        global_step: torch.Tensor | None = None, name: str | None = None) -> torch.Tensor:
        """Applies *unscaled* gradients if all are finite (else nothing, ``global_step`` included); updates the
        scale either way; ``.grad`` stays as it was.

        Args:
            grads_and_vars: ``(gradient, variable)`` pairs, as :meth:`compute_gradients` returns; every variable a
                parameter of the inner optimizer, a None gradient leaving its variable alone.
            global_step: a tensor incremented in place on an applied step, or None.
            name: TF's name for the returned operation: a string or None, otherwise unused (torch names no
                operation).

        Returns:
            A 0-d bool tensor, True if applied.

        Raises:
            TypeError: ``global_step`` is not a tensor, a gradient is neither a tensor nor None, or ``name`` is not a
                string.
            ValueError: a variable that is no parameter of the inner optimizer or that appears twice, a gradient
                whose shape is not its variable's, or no gradient at all.

        Cost: one R+W check over the gradients; syncs as ``step()``.
        """
        _check_name(name)
        pairs = list(grads_and_vars)
        if global_step is not None and not isinstance(global_step, torch.Tensor):
            raise TypeError("global_step must be a tensor to increment in place, e.g. torch.zeros((), "
                            f"dtype=torch.int64); got {type(global_step).__name__}.")
        params = self._params()
        index = {id(p): (g, i) for g, group in enumerate(self.param_groups) for i, p in enumerate(group["params"])}
        seen: set[int] = set()
        for grad, var in pairs:
            if id(var) not in index:
                what = (f"A variable of shape {tuple(var.shape)}" if isinstance(var, torch.Tensor)
                        else f"A variable of type {type(var).__name__}")
                raise ValueError(f"{what} is not a parameter of the inner optimizer; add it with add_param_group() "
                                 "first.")
            if grad is not None and not isinstance(grad, torch.Tensor):
                raise TypeError(f"A gradient must be a tensor or None, got {type(grad).__name__} for a variable of "
                                f"shape {tuple(var.shape)}. Convert it first, e.g. torch.as_tensor(grad).")
            if grad is not None and grad.shape != var.shape:
                raise ValueError(f"A gradient of shape {tuple(grad.shape)} was given for a variable of shape "
                                 f"{tuple(var.shape)}; each gradient must have its variable's shape.")
            if id(var) in seen:
                # one .grad per parameter: a second gradient would silently replace the first (TF applied both)
                raise ValueError(f"A variable of shape {tuple(var.shape)} appears twice in grads_and_vars; sum its "
                                 "gradients into one pair first.")
            seen.add(id(var))
        given = [(index[id(v)], v, g) for g, v in pairs if g is not None]
        if not given:
            raise ValueError("No gradients provided for any variable: every gradient in grads_and_vars is None.")
        owner = self._steps.owner
        owner.to_(given[0][2].device)
        # sampled as the scaled gradients: times S
        self._steps.measure_if_due(self._inner, given, owner.state.loss_scale)
        found_inf = check_finite(GradGroups([g for _, _, g in given]), out_device=owner.device)
        reporter = self._steps.diagnostics.reporter
        named = () if reporter is None else [(reporter.name_of(v, *w), g) for w, v, g in given]
        saved = [p.grad for p in params]
        try:
            for p in params:
                p.grad = None
            for _, var, g in given:
                var.grad = g
            found_inf = self._steps.step(self._inner, named_grads=named, checked=CheckedGrads(found_inf, None, None))[0]  # type: ignore[index]
        finally:
            for p, grad in zip(params, saved):
                p.grad = grad
        applied = found_inf == 0
        if global_step is not None:
            global_step.add_(applied.to(device=global_step.device, dtype=global_step.dtype))
        return applied

    def minimize(
        self, loss: Any, global_step: Any = None, var_list: Iterable[torch.Tensor] | None = None,
        gate_gradients: int = GATE_OP, aggregation_method: Any = None, colocate_gradients_with_ops: bool = False,
        name: str | None = None, grad_loss: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``apply_gradients(compute_gradients(loss, var_list, ..., grad_loss), global_step, name)``; TF v1's
        signature.

        Args:
            loss, var_list, gate_gradients, aggregation_method, colocate_gradients_with_ops, grad_loss: as
                :meth:`compute_gradients`.
            global_step: as :meth:`apply_gradients`. A second positional argument that is not a tensor is taken
                as ``var_list`` (Keras' order, ``minimize(loss, var_list)``; a tensor after it is then the global
            step): a global step is always a tensor.
            name: as :meth:`apply_gradients`.

        Returns:
            A 0-d bool tensor, True if the step was applied.

        Raises:
            ValueError: as :meth:`compute_gradients` (TF: "If some of the variables are not Variable objects").
            TypeError: as :meth:`apply_gradients`.
        """
        if global_step is not None and not isinstance(global_step, torch.Tensor):
            if var_list is not None and not isinstance(var_list, torch.Tensor):
                raise TypeError("global_step must be a tensor to increment in place, e.g. torch.zeros((), "
                                f"dtype=torch.int64); got {type(global_step).__name__}.")
            global_step, var_list = var_list, global_step  # minimize(loss, var_list[, global_step])
        _check_name(name)
        grads_and_vars = self.compute_gradients(loss, var_list, gate_gradients, aggregation_method,
                                                colocate_gradients_with_ops, grad_loss)
        return self.apply_gradients(grads_and_vars, global_step, name)

    def get_slot(self, var: torch.Tensor, name: str) -> torch.Tensor | None:
        """The inner optimizer's state ``name`` for ``var``.

        Args:
            var: a parameter of the inner optimizer.
            name: a state name, e.g. ``"exp_avg"`` (see :meth:`get_slot_names`), or TF's name of the same slot
                for the inner optimizer's class (Adam's ``"m"``/``"v"``, SGD's ``"momentum"``, Adagrad's
                ``"accumulator"``...).

        Returns:
            The state tensor, or None where there is none.
        """
        state = self.state.get(var, {})
        if name in state:
            return state[name]
        return state.get(_TF_SLOTS.get(type(self._inner).__name__, {}).get(name, name))

    def get_slot_names(self) -> list[str]:
        """Names of the per-parameter state of the inner optimizer (``"step"`` excluded)."""
        return sorted({name for s in self.state.values() for name in s if name != "step"})

    def variables(self) -> list[torch.Tensor]:
        """The loss-scale state tensors, then every tensor of the inner optimizer's state."""
        inner = [v for s in self.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        return list(self.shared_loss_scale.state) + inner

    def get_config(self) -> dict[str, Any]:
        """Keras's keys (``dynamic``, ``initial_scale``, ``dynamic_growth_steps``), the inner config, the policy."""
        inner = type(self.inner_optimizer)
        policy = self.shared_loss_scale.policy
        return {
            "inner_optimizer": {"class_name": inner.__name__, "module": inner.__module__, "config": dict(self.defaults)},
            **stable_form(policy),
            "loss_scale": serialize(policy),
        }

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], params: Iterable[Any], custom_objects: Mapping[str, type] | None = None,
    ) -> Any:
        """Rebuilds an optimizer from :meth:`get_config`'s output.

        Args:
            config: what :meth:`get_config` returned.
            params: the parameters (or parameter groups) for the new inner optimizer.
            custom_objects: ``{class name: class}`` for an inner optimizer class or policy class of your own; else
                ``torch.optim``'s classes only: no module a config names is imported.

        Returns:
            A new ``LossScaleOptimizer``.

        Raises:
            ValueError: an inner class neither in ``custom_objects`` nor in ``torch.optim``.
        """
        spec = config["inner_optimizer"]
        opt_cls = optimizer_class(spec, custom_objects)
        inner = opt_cls(params, **_constructor_kwargs(opt_cls, spec["config"]))
        if config.get("loss_scale") is not None:
            return cls(inner, loss_scale=read_policy(config["loss_scale"], custom_objects, None))
        stable = {k: config.get(k) for k in ("dynamic", "initial_scale", "dynamic_growth_steps")}
        return cls(inner, **stable)  # type: ignore[arg-type]

    @property
    def dynamic(self) -> bool:
        """Whether the loss scale is dynamic."""
        return self.loss_scale_policy.dynamic

    @property
    def dynamic_counter(self) -> torch.Tensor | None:
        """Finite steps since the scale last changed (0-d int32 tensor), or None if fixed."""
        return self._steps.owner.state.good_steps.clone() if self.dynamic else None

    @property
    def dynamic_growth_steps(self) -> int | None:
        """Finite steps it takes to grow the scale, or None if fixed."""
        return stable_form(self.loss_scale_policy)["dynamic_growth_steps"]

    @property
    def initial_scale(self) -> float:
        """The initial loss scale (the only one, when fixed)."""
        return self.loss_scale_policy.initial_scale

    @property
    def min_loss_scale(self) -> float | None:
        """The floor of a dynamic scale (None if fixed)."""
        return getattr(self.loss_scale_policy, "min_loss_scale", None) if self.dynamic else None

    @property
    def max_loss_scale(self) -> float | None:
        """The ceiling of a dynamic scale (None: none, or fixed)."""
        return getattr(self.loss_scale_policy, "max_loss_scale", None) if self.dynamic else None

    @property
    def hysteresis(self) -> int | None:
        """Non-finite steps a dynamic scale tolerates before backing off (None if fixed)."""
        return getattr(self.loss_scale_policy, "hysteresis", None) if self.dynamic else None

    @property
    def max_consecutive_skips(self) -> int | None:
        """The stall guard's limit, or None if off."""
        guard = self._steps.diagnostics.guard
        return None if guard is None else guard.limit

    @property
    def loss_scale(self) -> torch.Tensor:
        """The current loss scale as a 0-d float32 tensor (no sync until you convert it)."""
        return self._steps.owner.loss_scale

    @property
    def loss_scale_policy(self) -> LossScale:
        """The :class:`lossscale.LossScale` followed."""
        return self._steps.owner.policy

    @property
    def shared_loss_scale(self) -> ScaleState:
        """The scale owner: the :class:`SharedLossScale` you passed, or this optimizer's private one."""
        return self._steps.owner

    @property
    def last_step_skipped(self) -> torch.Tensor:
        """0-d bool tensor: was this optimizer's last step skipped? (its own, even with a shared scale; no sync)."""
        return self._steps.counters.consecutive_skips(self._steps.owner.device) > 0

    @property
    def skipped_steps(self) -> torch.Tensor:
        """0-d int32 tensor: this optimizer's steps skipped so far; saved in ``state_dict``."""
        return self._steps.counters.skipped_steps(self._steps.owner.device)

    @property
    def consecutive_skips(self) -> torch.Tensor:
        """0-d int32 tensor: this optimizer's skipped steps in a row, up to its last step; saved in ``state_dict``."""
        return self._steps.counters.consecutive_skips(self._steps.owner.device)

    @property
    def history(self) -> Any:
        """The :class:`lossscale.History` being recorded (flushed first), or None if off."""
        recorder = self._steps.diagnostics.recorder
        if recorder is None:
            return None
        recorder.flush()
        return recorder.history

    @property
    def gradient_stats(self) -> dict[str, Any] | None:
        """The latest ``stats_every`` sample (tensors; see ``docs/gradient_stats.md``), None when off or before one."""
        return None if self._sampler is None else self._sampler.gradient_stats

    def _stats_progress(self) -> tuple[int, int] | None:
        """``(stats_every, steps so far)`` for ``lossscale.underflow_report``; None when off."""
        return None if self._sampler is None else (self._sampler.every, self._sampler.state.count)

    @property
    def last_overflow_report(self) -> OverflowReport | None:
        """The report of the last skipped step (needs ``overflow_report=True``), or None."""
        reporter = self._steps.diagnostics.reporter
        return None if reporter is None else reporter.last

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict plus a ``"lossscale"`` entry: the policy, the scale and the counters
        (copies; no sync), and with ``stats_every`` a ``"lossscale_stats"`` entry."""
        inner = dict(self._inner.state_dict())
        steps = self._steps
        state = Checkpoint(inner, steps.owner.to_record(), steps.counters.to_record()).to_state_dict()
        if self._sampler is not None:  # stats_every's step count and AutoLossScale's state
            state["lossscale_stats"] = self._sampler.state_dict()
        return state

    def load_state_dict(self, state_dict: Any, custom_objects: Mapping[str, type] | None = None) -> None:
        """Restores :meth:`state_dict`'s output, saved policy included; a plain inner state dict keeps the current
        scale; a history is cut back to the restored step.

        Args:
            state_dict: what :meth:`state_dict` returned (or a plain inner optimizer's state dict).
            custom_objects: ``{class name: class}`` for a policy class of your own; else it is the current
                policy's class (nothing is imported by name).

        Raises:
            TypeError: ``state_dict`` is not a mapping.
            ValueError: a malformed ``"lossscale"`` entry, or another optimizer's state dict; nothing changes.
        """
        record = None
        if isinstance(state_dict, Mapping) and "lossscale_stats" in state_dict:
            record = state_dict["lossscale_stats"]
            state_dict = {k: v for k, v in state_dict.items() if k != "lossscale_stats"}
        owner = self._steps.owner
        checkpoint = Checkpoint.from_state_dict(state_dict, custom_objects, current=owner.policy)
        policy = owner.policy if checkpoint.scale is None else checkpoint.scale.policy
        require_own_scale(policy, owner, "Load the checkpoint into a LossScaleOptimizer with its own scale "
                          "(loss_scale='auto'), or save it with loss_scale='dynamic'.")
        sampler = self._sampler_for(policy, record)  # the record validated here: nothing is loaded before
        load_inner(self._inner, checkpoint.inner)  # all or nothing; another optimizer's state dict is refused
        self._steps.load(checkpoint)
        self._sampler = self._steps.sampler = sampler

    def _sampler_for(self, policy: LossScale, record: Any) -> StatsSampler | None:
        """The sampler after loading ``policy`` and a ``"lossscale_stats"`` ``record`` (None: none), validated."""
        current = self._sampler
        every = check_stats_every(None, policy) if current is None else current.every
        if every is None:
            return None
        if current is None:
            current = StatsSampler(every, policy)
        if record is None and policy == current.policy:
            return current
        return current.restored(record, policy)

    def __getstate__(self) -> dict[str, Any]:
        """The inner optimizer and ``OptimizerStep.pickled``; parameter names and process groups are not kept."""
        return {"inner": self._inner, **self._steps.pickled(), "sampler": self._sampler}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "overflow_report" in state and "diagnostics" not in state:  # 0.1: the scale object beside the settings
            state = {"inner": state["inner"], "shared": state["scale"], "optimizer": state["optimizer"],  # its owner
                     "diagnostics": Diagnostics(state.get("max_consecutive_skips"),
                                                bool(state.get("overflow_report", False)), None, state.get("history"))}
        self._inner = state["inner"]
        self._steps = OptimizerStep.unpickled(state, FlagAgreement(None, self._params))
        self._sampler = self._steps.sampler = state.get("sampler")
        init_step_hooks(self)
        _WRAPPED[self._inner] = weakref.ref(self)

    def __repr__(self) -> str:
        return f"LossScaleOptimizer({self._inner!r}, loss_scale={self._steps.owner.policy!r})"


def optimizer_class(spec: Mapping[str, Any], custom_objects: Mapping[str, type] | None = None) -> type:
    """The class a config names: from ``custom_objects``, else a ``torch.optim`` optimizer; never an import."""
    name = spec.get("class_name")
    if custom_objects and name in custom_objects:
        return custom_objects[name]  # type: ignore[index]
    module = spec.get("module", "torch.optim")
    candidate = getattr(torch.optim, name, None) if isinstance(name, str) else None
    from_torch = isinstance(module, str) and (module == "torch.optim" or module.startswith("torch.optim."))
    if from_torch and isinstance(candidate, type) and issubclass(candidate, torch.optim.Optimizer):
        return candidate
    raise ValueError(f"Unknown optimizer class {name!r} (module {module!r}): from_config builds torch.optim's "
                     "optimizers only, and imports no module a config names (a config from an untrusted checkpoint "
                     f"could name any). Pass the class itself: custom_objects={{{name!r}: {name}}}.")


def _constructor_kwargs(opt_cls: type, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``defaults`` the constructor takes (a constructor with ``**kwargs`` takes all)."""
    parameters = inspect.signature(opt_cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(defaults)
    return {k: v for k, v in defaults.items() if k in parameters}
