"""Passes over gradients: unscale-and-check, check-only, copies and norms.

Every function here states its cost in passes over the gradients (R = one
read of every element, W = one write) and host syncs. None of them syncs:
the "found inf" result is a 0-d float32 tensor (1.0 if any element was NaN
or +-Inf), the convention torch's fused optimizers read.

Dense gradients are grouped by (device, dtype) with torch's C++ grouping and
handled by one multi-tensor kernel call per group
(``torch._amp_foreach_non_finite_check_and_unscale_``: R+W, computes in
float32 for half types). Sparse gradients are handled one by one.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

__all__ = [
    "collect_grads",
    "unscale_and_check_",
    "check_finite",
    "unscaled_copies",
    "scaled_norm",
    "reciprocal",
]


def collect_grads(param_groups: Iterable[dict]) -> list[torch.Tensor]:
    """The ``.grad`` of every parameter in ``param_groups`` that has one."""
    return [p.grad for group in param_groups for p in group["params"] if p.grad is not None]


def reciprocal(scale: torch.Tensor) -> torch.Tensor:
    """``1 / scale`` computed in float64, returned as float32 (exact for powers of two)."""
    return scale.double().reciprocal().float()


def _split(grads: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    dense = [g for g in grads if g.layout == torch.strided]
    sparse = [g for g in grads if g.layout != torch.strided]
    return dense, sparse


def _combine(flags: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of per-device found-inf flags on ``device`` (0 or a positive count)."""
    if not flags:
        return torch.zeros((), dtype=torch.float32, device=device)
    total = flags[0].to(device, non_blocking=True)
    for flag in flags[1:]:
        total = total + flag.to(device, non_blocking=True)
    return total


def unscale_and_check_(
    grads: Sequence[torch.Tensor], inv_scale: torch.Tensor, *, out_device: torch.device
) -> torch.Tensor:
    """Multiplies every gradient in place by ``inv_scale`` and flags non-finite values.

    Cost: one R+W pass (a single multi-tensor kernel per (device, dtype)); no
    host sync. Half-precision values are multiplied in float32 and rounded
    once. Returns the found-inf flag on ``out_device``.
    """
    dense, sparse = _split(grads)
    flags: list[torch.Tensor] = []
    groups = _group_tensors_by_device_and_dtype([dense])
    for (device, _dtype), ([tensors], _) in groups.items():
        found = torch.zeros((), dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, inv_scale.to(device, non_blocking=True))
        flags.append(found)
    for grad in sparse:
        values = _sparse_values(grad)
        found = torch.zeros((), dtype=torch.float32, device=grad.device)
        torch._amp_foreach_non_finite_check_and_unscale_([values], found, inv_scale.to(grad.device))
        flags.append(found)
    return _combine(flags, out_device)


def check_finite(grads: Sequence[torch.Tensor], *, out_device: torch.device) -> torch.Tensor:
    """Flags non-finite values and leaves every gradient's value as it was.

    This is :func:`unscale_and_check_` with a scale of exactly 1: the kernel
    writes each value back unchanged. Measured on CPU (see
    ``benchmarks/bench_torch.py``), this R+W kernel beats every read-only
    multi-tensor reduction torch offers (``_foreach_max``, ``_foreach_norm``).
    Cost: one R+W pass; no host sync.
    """
    one = torch.ones((), dtype=torch.float32, device=out_device)
    with torch.no_grad():
        return unscale_and_check_(grads, one, out_device=out_device)


def unscaled_copies(grads: Sequence[torch.Tensor | None], inv_scale: torch.Tensor) -> list[torch.Tensor | None]:
    """New tensors ``g * inv_scale`` of each gradient's dtype; ``None`` stays ``None``.

    Cost: one R pass over the inputs and one W pass into new memory; no sync.
    """
    out: list[torch.Tensor | None] = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    dense = [i for i in present if grads[i].layout == torch.strided]  # type: ignore[union-attr]
    groups = _group_tensors_by_device_and_dtype([[grads[i] for i in dense]], with_indices=True)
    for (device, _dtype), ([tensors], indices) in groups.items():
        results = torch._foreach_mul(tensors, inv_scale.to(device, non_blocking=True))
        for j, result in zip(indices, results):
            out[dense[j]] = result
    for i in present:
        grad = grads[i]
        if grad is not None and grad.layout != torch.strided:
            out[i] = grad * inv_scale.to(grad.device)
    return out


def scaled_norm(grads: Sequence[torch.Tensor], norm_type: float, *, out_device: torch.device) -> torch.Tensor:
    """The ``norm_type``-norm of all gradients together, accumulated in float32.

    Cost: one R pass; no host sync. Per-tensor norms of half-precision
    gradients are accumulated and returned in float32, so they cannot
    overflow at float16's 65504.
    """
    dense, sparse = _split(grads)
    norms: list[torch.Tensor] = []
    groups = _group_tensors_by_device_and_dtype([dense])
    for (device, _dtype), ([tensors], _) in groups.items():
        per_tensor = torch._foreach_norm(tensors, norm_type, dtype=torch.float32)
        norms.extend(n.to(out_device, non_blocking=True) for n in per_tensor)
    for grad in sparse:
        values = _sparse_values(grad)
        norms.append(torch.linalg.vector_norm(values, norm_type, dtype=torch.float32).to(out_device))
    if not norms:
        return torch.zeros((), dtype=torch.float32, device=out_device)
    return torch.linalg.vector_norm(torch.stack(norms), norm_type)


def _sparse_values(grad: torch.Tensor) -> torch.Tensor:
    """The stored values of a sparse COO gradient, coalesced first for float16.

    Uncoalesced float16 duplicates could overflow only when summed; coalescing
    makes the check see what the optimizer will see (as GradScaler does).
    """
    if grad.layout != torch.sparse_coo:
        raise TypeError(
            f"lossscale supports dense (strided) and sparse COO gradients, got layout {grad.layout}. "
            "Convert the gradient with .to_dense() or .to_sparse() before step()."
        )
    if grad.dtype == torch.float16 and not grad.is_coalesced():
        # coalesce() returns a new tensor; move its storage into the gradient.
        grad.data = grad.coalesce()
    return grad._values()
