"""TF v1's optimizer methods for ``LossScaleOptimizer`` (gradients as values, slots, variables, config)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from .._resolve import serialize, stable_form
from .._torch._kernels import GradGroups, check_finite, unscaled_copies
from ._checkpoint import read_policy
from ._step import OptimizerStep

__all__ = ["TFv1Methods", "optimizer_class"]


class TFv1Methods:
    """The TF v1 methods; mixed into ``LossScaleOptimizer``."""

    param_groups: list[dict[str, Any]]
    state: Any
    _steps: OptimizerStep

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * loss_scale``, keeping ``loss``'s dtype; a callable gives a callable. With ``stats_every``, each
        call since the last step or ``zero_grad()`` counts as a micro-batch (``AutoLossScale`` reads them)."""
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
        """A new list: each gradient times ``1/loss_scale`` in its own dtype, None stays None. One R and one W pass
        (+R+W for half types, computed in float32); no sync."""
        return unscaled_copies(list(grads), self._steps.owner.inv_scale())

    def compute_gradients(
        self, loss: Any, var_list: Iterable[torch.Tensor] | None = None, grad_loss: torch.Tensor | None = None
    ) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
        """Unscaled ``(gradient, variable)`` pairs of ``loss`` (a tensor or a zero-argument callable), not
        accumulated into ``.grad``; ``var_list`` defaults to the parameters that require grad. No sync."""
        if callable(loss) and not isinstance(loss, torch.Tensor):
            loss = loss()
        if var_list is None:
            variables = [p for p in self._params() if p.requires_grad]
        else:
            variables = list(var_list)
            bad = [type(v).__name__ for v in variables if not (isinstance(v, torch.Tensor) and v.requires_grad)]
            if bad:
                raise ValueError(f"var_list must hold tensors that require grad; got {', '.join(bad)}.")
        scaled = self.get_scaled_loss(loss)  # type: ignore[attr-defined]
        if grad_loss is not None:
            grad_loss = grad_loss.to(scaled.dtype)
        grads = torch.autograd.grad(scaled, variables, grad_outputs=grad_loss, allow_unused=True)
        return list(zip(self.get_unscaled_gradients(grads), variables))  # type: ignore[attr-defined]

    def apply_gradients(self, grads_and_vars: Iterable[tuple[torch.Tensor | None, torch.Tensor]],
                        global_step: torch.Tensor | None = None) -> torch.Tensor:
        """Applies *unscaled* gradients if all are finite (else nothing, ``global_step`` included, a tensor
        incremented in place); updates the scale either way; ``.grad`` stays. Returns a 0-d bool tensor, True if
        applied. Cost: one R+W check, syncs as ``step()``."""
        pairs = list(grads_and_vars)
        if global_step is not None and not isinstance(global_step, torch.Tensor):
            raise TypeError("global_step must be a tensor to increment in place, e.g. torch.zeros((), "
                            f"dtype=torch.int64); got {type(global_step).__name__}.")
        params = self._params()
        index = {id(p): (g, i) for g, group in enumerate(self.param_groups) for i, p in enumerate(group["params"])}
        for _, var in pairs:
            if id(var) not in index:
                raise ValueError(f"A variable of shape {tuple(var.shape)} is not a parameter of the inner optimizer; "
                                 "add it with add_param_group() first.")
        given = [(index[id(v)], v, g) for g, v in pairs if g is not None]
        if not given:
            raise ValueError("No gradients provided for any variable: every gradient in grads_and_vars is None.")
        owner = self.shared_loss_scale  # type: ignore[attr-defined]
        owner.to_(given[0][2].device)
        # sampled as the scaled gradients: times S
        self._steps.measure(self.inner_optimizer, given, owner.state.loss_scale)  # type: ignore[attr-defined]
        found_inf = check_finite(GradGroups([g for _, _, g in given]), out_device=owner.device)
        reporter = self._steps.diagnostics.reporter
        named = () if reporter is None else [(reporter.name_of(v, *w), g) for w, v, g in given]
        saved = [p.grad for p in params]
        try:
            for p in params:
                p.grad = None
            for _, var, g in given:
                var.grad = g
            found_inf = self._steps.apply(self.inner_optimizer, found_inf, None, named_grads=named)[0]  # type: ignore[attr-defined]
        finally:
            for p, grad in zip(params, saved):
                p.grad = grad
        applied = found_inf == 0
        if global_step is not None:
            global_step.add_(applied.to(device=global_step.device, dtype=global_step.dtype))
        return applied

    def minimize(
        self, loss: Any, var_list: Iterable[torch.Tensor] | None = None, global_step: torch.Tensor | None = None,
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
        return list(self.shared_loss_scale.state) + inner  # type: ignore[attr-defined]

    def get_config(self) -> dict[str, Any]:
        """Keras's keys (``dynamic``, ``initial_scale``, ``dynamic_growth_steps``), the inner config, the policy."""
        inner = type(self.inner_optimizer)  # type: ignore[attr-defined]
        policy = self.shared_loss_scale.policy  # type: ignore[attr-defined]
        return {
            "inner_optimizer": {"class_name": inner.__name__, "module": inner.__module__, "config": dict(self.defaults)},  # type: ignore[attr-defined]
            **stable_form(policy),
            "loss_scale": serialize(policy),
        }

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], params: Iterable[Any], custom_objects: Mapping[str, type] | None = None,
    ) -> Any:
        """Rebuilds from :meth:`get_config` and ``params``; the inner class and a policy class of your own come from
        ``custom_objects``, else ``torch.optim``: no module a config names is imported."""
        spec = config["inner_optimizer"]
        opt_cls = optimizer_class(spec, custom_objects)
        inner = opt_cls(params, **_constructor_kwargs(opt_cls, spec["config"]))
        if config.get("loss_scale") is not None:
            return cls(inner, loss_scale=read_policy(config["loss_scale"], custom_objects, None))  # type: ignore[call-arg]
        stable = {k: config.get(k) for k in ("dynamic", "initial_scale", "dynamic_growth_steps")}
        return cls(inner, **stable)  # type: ignore[call-arg]


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
