"""Every private torch API lossscale uses (``lossscale.torch``, Keras on torch), bound to names here. None has a
public replacement; ``torch.amp.GradScaler`` or ``torch.optim`` relies on each. Oldest torch: 2.5."""

from __future__ import annotations

import inspect
import weakref
from collections import OrderedDict
from typing import Any

import torch
from torch.amp.grad_scaler import OptState
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["AMP_SCALING", "GRAD_SCALER_WARNING", "OptState", "TorchDispatchMode", "foreach_abs", "foreach_add", "foreach_ceil_", "foreach_copy_",
           "foreach_mul", "foreach_mul_", "foreach_norm", "foreach_sign_",
           "group_in_python", "group_tensors_by_device_and_dtype", "init_step_hooks", "non_finite_check_and_unscale_",
           "sparse_values", "step_with_scale", "takes_grad_scaler", "update_scale_"]

#: ``{(device, dtype): (tensorlists, indices)}``, grouped in C++ (torch.optim's foreach and fused paths use it).
group_tensors_by_device_and_dtype = _group_tensors_by_device_and_dtype

#: ``tensors *= inv_scale`` in place (float32 math for half types); ``found_inf = 1.0`` on a NaN/Inf input.
non_finite_check_and_unscale_ = torch._amp_foreach_non_finite_check_and_unscale_

#: GradScaler's scale update in one kernel, in place on ``(scale, growth_tracker)`` (float32, int32) given a float32
#: found-inf flag: a backoff ``scale *= backoff_factor`` on an overflow, else growth at ``growth_interval`` finite
#: steps unless not finite. Arguments: ``(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
#: growth_interval)``; the factors are multiplied in float64.
update_scale_ = torch._amp_update_scale_

# Multi-tensor kernels (torch's "beta" foreach API; torch.optim and clip_grad_norm_ call them).
foreach_mul_ = torch._foreach_mul_
foreach_mul = torch._foreach_mul
foreach_copy_ = torch._foreach_copy_
foreach_abs = torch._foreach_abs
foreach_add = torch._foreach_add
foreach_sign_ = torch._foreach_sign_
foreach_ceil_ = torch._foreach_ceil_

#: The attribute by which a fused optimizer says its ``step()`` reads ``grad_scale``/``found_inf``.
AMP_SCALING = "_step_supports_amp_scaling"

#: ``torch.amp.GradScaler.step``'s warning when it passes itself as ``grad_scaler=`` (the older contract).
GRAD_SCALER_WARNING = (
    "GradScaler is going to stop passing itself as a keyword argument to the passed optimizer. In the near future "
    "GradScaler registers `grad_scale: Tensor` and `found_inf: Tensor` to the passed optimizer and let the optimizer "
    "use them directly."
)

# ``OptState`` (READY, UNSCALED, STEPPED): the stages of ``torch.amp.GradScaler._per_optimizer_states``, imported
# above; client code reads and writes them.

_TAKES_GRAD_SCALER: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def takes_grad_scaler(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` has a ``grad_scaler`` parameter: ``torch.amp.GradScaler`` then passes itself
    (the older contract of ``_step_supports_amp_scaling``). Its signature is read once per step function."""
    step = optimizer.step
    function = getattr(step, "__func__", step)
    try:
        return _TAKES_GRAD_SCALER[function]
    except (KeyError, TypeError):
        pass
    try:
        found = "grad_scaler" in inspect.signature(step).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        found = False
    try:
        _TAKES_GRAD_SCALER[function] = found
    except TypeError:  # not weak-referenceable
        pass
    return found


def group_in_python(tensorlists: list[list[torch.Tensor]], with_indices: bool) -> dict:
    """:data:`group_tensors_by_device_and_dtype` in Python, for ``torch.compile`` (torch 2.5 cannot trace it)."""
    groups: dict = {}
    for i, first in enumerate(tensorlists[0]):
        lists, indices = groups.setdefault((first.device, first.dtype), ([[] for _ in tensorlists], []))
        for out, tensors in zip(lists, tensorlists):
            out.append(tensors[i])
        indices.append(i)
    return {key: (lists, indices if with_indices else []) for key, (lists, indices) in groups.items()}


def foreach_norm(tensors: list[torch.Tensor], norm_type: float) -> list[torch.Tensor]:
    """Per-tensor norms accumulated and returned in float32."""
    return list(torch._foreach_norm(tensors, norm_type, dtype=torch.float32))


def sparse_values(grad: torch.Tensor) -> torch.Tensor:
    """A sparse COO tensor's stored values, duplicates included, as a view (``values()`` refuses uncoalesced ones)."""
    return grad._values()


def step_with_scale(optimizer: Any, grad_scale: torch.Tensor | None, found_inf: torch.Tensor,
                    args: tuple = (), kwargs: dict | None = None) -> Any:
    """``optimizer.step(...)`` with the attributes ``torch.amp.GradScaler.step`` sets for a fused kernel."""
    optimizer.grad_scale, optimizer.found_inf = grad_scale, found_inf
    try:
        return optimizer.step(*args, **(kwargs or {}))
    finally:
        del optimizer.grad_scale, optimizer.found_inf


_HOOK_DICTS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
               "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
               "_optimizer_load_state_dict_post_hooks")


def init_step_hooks(optimizer: torch.optim.Optimizer) -> None:
    """Gives an Optimizer built without ``Optimizer.__init__`` its hook tables and hooked ``step``."""
    for name in _HOOK_DICTS:
        setattr(optimizer, name, OrderedDict())
    optimizer._patch_step_function()  # type: ignore[attr-defined]
