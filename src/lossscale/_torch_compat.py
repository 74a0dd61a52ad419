"""Every private torch API that lossscale.torch uses, in one place.

Each entry names its public replacement, or says that there is none (then
``torch.amp.GradScaler`` or ``torch.optim`` itself relies on the same API,
which is why it is stable in practice). Nothing else in the binding touches
an underscored torch name.

Oldest torch supported: 2.5 (see ``pyproject.toml``): CPU kernels for fused
SGD/Adam/AdamW arrived in 2.4 and fused Adagrad in 2.5, and
``torch.distributed.tensor`` (DTensor) became public in 2.5.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "TorchDispatchMode",
    "device_mesh_type",
    "dtensor_type",
    "foreach_copy_",
    "foreach_mul",
    "foreach_mul_",
    "foreach_norm",
    "group_by_device_and_dtype",
    "init_step_hooks",
    "non_finite_check_and_unscale_",
    "sparse_values",
    "step_with_scale",
    "supports_amp_scaling",
]

# TorchDispatchMode (torch.utils._python_dispatch): no public replacement; it is how torch's own
# debugging modes intercept ops. HostSyncCounter counts ``aten._local_scalar_dense`` with it.


def group_by_device_and_dtype(tensorlists: list[list[torch.Tensor]], with_indices: bool = False) -> dict:
    """``{(device, dtype): (tensorlists, indices)}`` grouped in C++.

    Private: ``torch.utils._foreach_utils._group_tensors_by_device_and_dtype``.
    No public replacement; torch.optim's foreach and fused paths use it.
    Under ``torch.compile`` the grouping is done in Python, at trace time:
    torch 2.5's dynamo cannot trace the C++ function (a graph break), and
    the groups depend only on the devices and dtypes, which it guards on.
    """
    if torch.compiler.is_compiling():
        return _group_in_python(tensorlists, with_indices)
    return _group_tensors_by_device_and_dtype(tensorlists, with_indices=with_indices)


def _group_in_python(tensorlists: list[list[torch.Tensor]], with_indices: bool) -> dict:
    """The same grouping as torch's C++ one, keyed by the first list's tensors (the others follow them)."""
    groups: dict = {}
    for i, first in enumerate(tensorlists[0]):
        key = (first.device, first.dtype)
        if key not in groups:
            groups[key] = ([[] for _ in tensorlists], [])
        lists, indices = groups[key]
        for out, tensors in zip(lists, tensorlists):
            out.append(tensors[i])
        indices.append(i)
    return {key: (lists, indices if with_indices else []) for key, (lists, indices) in groups.items()}


def non_finite_check_and_unscale_(tensors: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    """``tensors *= inv_scale`` in place (in float32 for half types); ``found_inf = 1.0`` on a NaN/Inf input.

    Private: ``torch._amp_foreach_non_finite_check_and_unscale_``. No public
    replacement; ``torch.amp.GradScaler.unscale_`` calls it.
    """
    torch._amp_foreach_non_finite_check_and_unscale_(tensors, found_inf, inv_scale)


# torch._foreach_*: multi-tensor kernels, documented by torch as a beta API but underscored.
# No public replacement (torch.optim's foreach paths and torch.nn.utils.clip_grad_norm_ call them).


def foreach_mul_(tensors: list[torch.Tensor], factor: Any) -> None:
    torch._foreach_mul_(tensors, factor)


def foreach_mul(tensors: list[torch.Tensor], factor: Any) -> list[torch.Tensor]:
    return list(torch._foreach_mul(tensors, factor))


def foreach_copy_(targets: list[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    torch._foreach_copy_(targets, list(sources))


def foreach_norm(tensors: list[torch.Tensor], norm_type: float) -> list[torch.Tensor]:
    """Per-tensor norms accumulated and returned in float32."""
    return list(torch._foreach_norm(tensors, norm_type, dtype=torch.float32))


def sparse_values(grad: torch.Tensor) -> torch.Tensor:
    """The stored values of a sparse COO tensor, duplicates included, as a view.

    Private: ``Tensor._values()``. The public ``Tensor.values()`` refuses an
    uncoalesced tensor, and coalescing would copy.
    """
    return grad._values()


def supports_amp_scaling(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` reads ``grad_scale``/``found_inf`` (torch's fused optimizers).

    Private: the ``_step_supports_amp_scaling`` attribute. No public
    replacement; ``torch.amp.GradScaler.step`` reads it.
    """
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def step_with_scale(
    optimizer: torch.optim.Optimizer,
    grad_scale: torch.Tensor | None,
    found_inf: torch.Tensor,
    call: Callable[[], Any] | None = None,
) -> None:
    """Runs a fused optimizer's step with the kernel dividing by ``grad_scale`` and skipping when ``found_inf``.

    ``call`` replaces ``optimizer.step()`` (a GradScaler forwarding the
    caller's arguments). Private protocol: the ``grad_scale``/``found_inf``
    attributes a fused optimizer reads during ``step()``. No public
    replacement; ``torch.amp.GradScaler.step`` sets them the same way.
    """
    inner: Any = optimizer
    inner.grad_scale, inner.found_inf = grad_scale, found_inf
    try:
        inner.step() if call is None else call()
    finally:
        del inner.grad_scale, inner.found_inf


_HOOK_DICTS = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


def init_step_hooks(optimizer: torch.optim.Optimizer) -> None:
    """Gives an Optimizer built without ``Optimizer.__init__`` the hook tables and the hooked ``step``.

    Private: the ``_optimizer_*_hooks`` dicts and
    ``Optimizer._patch_step_function``. No public replacement:
    ``Optimizer.__init__`` sets them up, and a wrapper that owns no
    parameters cannot call it (it needs a non-empty parameter list).
    Afterwards the public ``register_step_pre_hook`` & co. work.
    """
    from collections import OrderedDict

    for name in _HOOK_DICTS:
        setattr(optimizer, name, OrderedDict())
    optimizer._patch_step_function()


def dtensor_type() -> type | None:
    """``torch.distributed.tensor.DTensor`` if torch has imported it, else None (no DTensor can exist).

    Public (since torch 2.5); looked up in ``sys.modules`` so that a process
    that never built a DTensor pays nothing for the check.
    """
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def device_mesh_type() -> type | None:
    """``torch.distributed.device_mesh.DeviceMesh`` if imported (public), else None."""
    module = sys.modules.get("torch.distributed.device_mesh")
    return getattr(module, "DeviceMesh", None) if module is not None else None
