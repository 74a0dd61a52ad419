"""The torch kernels, shared by ``lossscale.torch`` and Keras on the torch backend: passes over gradients
(unscale-and-check, check-only, copies, norms) and the statistics sums.

Every function here states its cost in passes over the gradients (R = one
read of every element, W = one write) and host syncs. None of them syncs:
the "found inf" result is a 0-d float32 tensor (1.0 if any element was NaN
or +-Inf), the convention torch's fused optimizers read.

Dense gradients are grouped by (device, dtype) with torch's C++ grouping and
handled by one multi-tensor kernel call per group
(the kernel behind ``GradScaler.unscale_``, see ``_torch_compat.py``: R+W,
computes in float32 for half types). Sparse gradients are handled one by one.

DTensor gradients (FSDP2 ``fully_shard``, tensor parallel) are handled on
their local shards (``to_local()``, no copy): the passes stay local, with
no hidden collective per kernel call, and the optimizer agrees on the
found-inf flag with one all-reduce afterwards (see ``_distributed.py``).
:func:`scaled_norm` is the exception: a global norm needs one scalar
all-reduce over the sharded mesh dimensions.

Statistics. The core's :func:`lossscale._stats.tensor_sums` counts with comparisons;
torch's CPU kernels for comparisons, ``sign`` and ``vector_norm(inf)`` ran
10-100x slower than plain arithmetic on the development machine.
Here every per-tensor sum is arithmetic: ``max |g|``, ``dot(|g|, |g|)``, the
count of non-zeros as ``sum(ceil(min(|g|, 2**-126) * 2**126))`` and of normals as
``sum(floor(min(|g| * 2**14, 1)))``. The result goes through the core's
:func:`lossscale._stats.summarize`, so the definitions are the core's. No host
sync: every value stays a tensor on the gradients' device.

A sparse COO gradient (``nn.Embedding(sparse=True)``) counts as its dense
form: it is coalesced first (duplicate indices sum, as they do when applied),
its stored values are measured and every implicit entry counts as a zero.
"""


from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ._stats import FLOAT16_TINY, GradientStats, summarize
from ._torch_compat import (
    dtensor_type,
    foreach_mul,
    foreach_norm,
    group_by_device_and_dtype,
    non_finite_check_and_unscale_,
    sparse_values,
)

__all__ = [
    "GradGroups",
    "check_finite",
    "combine_flags",
    "move",
    "reciprocal",
    "scaled_norm",
    "unscale_and_check_",
    "unscaled_copies",
    "gradient_stats",
    "tensor_sums",
]


class GradGroups:
    """One step's gradients, grouped once by (device, dtype); sparse ones apart.

    Grouping uses torch's C++ helper; the Python cost is one loop over the
    gradients to set sparse ones aside. DTensor gradients are replaced by
    their local shards (views, so in-place passes reach the DTensor);
    ``sharded`` then keeps the original list for :func:`scaled_norm`.
    """

    __slots__ = ("dense", "device", "has_float16", "sharded", "sparse", "tensors")

    def __init__(self, grads: Sequence[torch.Tensor]) -> None:
        dtensor = dtensor_type()
        self.tensors: list[torch.Tensor] = []
        self.sparse: list[torch.Tensor] = []
        self.sharded: list[torch.Tensor] | None = None
        dense: list[torch.Tensor] = []
        strided = torch.strided
        for grad in grads:  # the one Python loop over the gradients
            if dtensor is not None and isinstance(grad, dtensor):
                if self.sharded is None:
                    self.sharded = list(grads)
                with torch.no_grad():
                    grad = grad.to_local()
            self.tensors.append(grad)
            (dense if grad.layout == strided else self.sparse).append(grad)
        groups = group_by_device_and_dtype([dense]) if dense else {}
        self.dense = {key: tensors for key, ([tensors], _) in groups.items()}
        #: whether any gradient is float16; the device of the first gradient (None without any)
        self.has_float16 = any(dtype == torch.float16 for _, dtype in self.dense) or any(
            g.dtype == torch.float16 for g in self.sparse
        )
        self.device: torch.device | None = self.tensors[0].device if self.tensors else None

    @classmethod
    def of(cls, param_groups: Iterable[dict]) -> GradGroups:
        """The ``.grad`` of every parameter in ``param_groups`` that has one."""
        return cls([p.grad for group in param_groups for p in group["params"] if p.grad is not None])



def local_shards(grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each DTensor replaced by its local shard (a view: in-place ops reach the DTensor); others as they are."""
    dtensor = dtensor_type()
    if dtensor is None:
        return list(grads)
    with torch.no_grad():
        return [g.to_local() if isinstance(g, dtensor) else g for g in grads]


def move(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``, without blocking unless the copy lands on the host.

    A non-blocking copy into CPU memory may still be in flight when the
    host reads it, so copies to the CPU block (they are 0-d flags: cheap).
    """
    if tensor.device == device:
        return tensor
    return tensor.to(device, non_blocking=device.type != "cpu")


def reciprocal(scale: torch.Tensor) -> torch.Tensor:
    """``1 / scale`` computed in float64, returned as float32 (exact for powers of two)."""
    return scale.double().reciprocal().float()


def combine_flags(flags: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The per-group found-inf flags as one flag on ``device``: exactly 0.0 or 1.0.

    Exactly 1.0 matters: torch's fused kernels skip only when the flag equals
    1.0, and subtract it from their step counters.
    """
    if not flags:
        return torch.zeros((), dtype=torch.float32, device=device)
    total = move(flags[0], device)
    for flag in flags[1:]:
        total = torch.maximum(total, move(flag, device))
    return total


def unscale_and_check_(grads: GradGroups, inv_scale: torch.Tensor, *, out_device: torch.device) -> torch.Tensor:
    """Multiplies every gradient in place by ``inv_scale`` and flags non-finite values.

    Cost: one R+W pass (a single multi-tensor kernel per (device, dtype)); no
    host sync. Half-precision values are multiplied in float32 and rounded
    once. Returns the found-inf flag on ``out_device``.
    """
    flags: list[torch.Tensor] = []
    for (device, _dtype), tensors in grads.dense.items():
        found = torch.zeros((), dtype=torch.float32, device=device)
        non_finite_check_and_unscale_(tensors, found, move(inv_scale, device))
        flags.append(found)
    for grad in grads.sparse:
        found = torch.zeros((), dtype=torch.float32, device=grad.device)
        non_finite_check_and_unscale_([_sparse_values(grad)], found, move(inv_scale, grad.device))
        flags.append(found)
    return combine_flags(flags, out_device)


def check_finite(grads: GradGroups, *, out_device: torch.device) -> torch.Tensor:
    """Flags non-finite values and leaves every gradient's value as it was.

    This is :func:`unscale_and_check_` with a scale of exactly 1: the kernel
    writes each value back unchanged. Measured on CPU (see
    ``benchmarks/bench_torch.py``), this R+W kernel is as fast as any
    read-only multi-tensor reduction torch offers (``_foreach_max``,
    ``_foreach_norm``, per-tensor ``dot``/``sum``).
    Cost: one R+W pass; no host sync.
    """
    one = torch.ones((), dtype=torch.float32, device=out_device)
    with torch.no_grad():
        return unscale_and_check_(grads, one, out_device=out_device)


def unscaled_copies(
    grads: Sequence[torch.Tensor | None], inv_scale: torch.Tensor, found_inf: list[torch.Tensor] | None = None
) -> list[torch.Tensor | None]:
    """New tensors ``g * inv_scale``, each of its gradient's dtype; ``None`` stays ``None``.

    The product is formed in float32 for float16/bfloat16 gradients and
    rounded once, so a value that ``1/S`` brings into float16's subnormal
    range survives (``4 * 2**-26 = 2**-24``; in float16 ``2**-26`` itself is
    0). Cost: float32/float64 gradients, one R pass and one W pass into new
    memory; half types, one more R+W (a copy, then the unscale kernel on
    it). No sync.

    With ``found_inf`` (a list), the copies are also checked and one found-inf
    flag per (device, dtype) group is appended (see :func:`unscale_and_check_`):
    half types get it from their unscale kernel, the others from one more
    R+W check pass over their copies.
    """
    out: list[torch.Tensor | None] = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    dense = [i for i in present if grads[i].layout == torch.strided]  # type: ignore[union-attr]
    groups = group_by_device_and_dtype([[grads[i] for i in dense]], with_indices=True) if dense else {}
    for (device, dtype), ([tensors], indices) in groups.items():
        inv = move(inv_scale, device)
        found = torch.zeros((), dtype=torch.float32, device=device)
        if dtype in (torch.float16, torch.bfloat16):
            results = foreach_mul(tensors, 1.0)  # copies, in their dtype
            non_finite_check_and_unscale_(results, found, inv)
        else:
            results = [r if r.dtype == dtype else r.to(dtype) for r in foreach_mul(tensors, inv)]
            if found_inf is not None:
                non_finite_check_and_unscale_(results, found, torch.ones((), dtype=torch.float32, device=device))
        if found_inf is not None:
            found_inf.append(found)
        for j, result in zip(indices, results):
            out[dense[j]] = result
    for i in present:
        grad = grads[i]
        if grad is not None and grad.layout != torch.strided:
            out[i] = (grad.float() * inv_scale.to(grad.device)).to(grad.dtype)
            if found_inf is not None:
                found = torch.zeros((), dtype=torch.float32, device=grad.device)
                one = torch.ones((), dtype=torch.float32, device=grad.device)
                non_finite_check_and_unscale_([_sparse_values(out[i])], found, one)  # type: ignore[arg-type]
                found_inf.append(found)
    return out


def scaled_norm(grads: GradGroups, norm_type: float, *, out_device: torch.device) -> torch.Tensor:
    """The ``norm_type``-norm of all gradients together, accumulated in float32.

    Cost: one R pass; no host sync. Per-tensor norms of half-precision
    gradients are accumulated and returned in float32, so they cannot
    overflow at float16's 65504.

    DTensor gradients: the norm of the whole (unsharded) gradients, from the
    local shards plus one scalar all-reduce per (mesh, sharded dimensions)
    combination (one under FSDP2); plain gradients count as local.
    """
    if grads.sharded is not None:
        return _sharded_norm(grads.sharded, norm_type, out_device)
    norms: list[torch.Tensor] = []
    for tensors in grads.dense.values():
        per_tensor = foreach_norm(tensors, norm_type)
        norms.extend(move(n, out_device) for n in per_tensor)
    for grad in grads.sparse:
        values = _sparse_values(grad)
        norms.append(torch.linalg.vector_norm(values, norm_type, dtype=torch.float32).to(out_device))
    if not norms:
        return torch.zeros((), dtype=torch.float32, device=out_device)
    return torch.linalg.vector_norm(torch.stack(norms), norm_type)


def _sharded_norm(grads: Sequence[torch.Tensor], norm_type: float, out_device: torch.device) -> torch.Tensor:
    """:func:`scaled_norm` over DTensor gradients: local norms, then a SUM (MAX for inf) over the shard dimensions."""
    import torch.distributed as dist

    dtensor = dtensor_type()
    buckets: dict[tuple, tuple[Any, tuple[int, ...], list[torch.Tensor]]] = {}
    for grad in grads:
        if dtensor is None or not isinstance(grad, dtensor):
            buckets.setdefault(("local",), (None, (), []))[2].append(grad)
            continue
        if any(p.is_partial() for p in grad.placements):
            raise ValueError(
                "A DTensor gradient has a Partial placement (not yet reduced), so its norm is not defined by its "
                "shards. Reduce it first, e.g. grad.redistribute(placements=[Replicate()] * mesh.ndim)."
            )
        dims = tuple(i for i, p in enumerate(grad.placements) if p.is_shard())
        buckets.setdefault((id(grad.device_mesh), dims), (grad.device_mesh, dims, []))[2].append(grad)
    norms = []
    for mesh, dims, members in buckets.values():
        part = scaled_norm(GradGroups(local_shards(members)), norm_type, out_device=out_device)
        if dims:
            if norm_type == float("inf"):
                for dim in dims:
                    dist.all_reduce(part, op=dist.ReduceOp.MAX, group=mesh.get_group(dim))
            else:
                power = part**norm_type
                for dim in dims:
                    dist.all_reduce(power, op=dist.ReduceOp.SUM, group=mesh.get_group(dim))
                part = power ** (1.0 / norm_type)
        norms.append(part)
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
    return sparse_values(grad)


def validated_norm_type(norm_type: Any) -> float:
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


def validate_max_norm(max_norm: Any) -> None:
    if isinstance(max_norm, torch.Tensor):
        return  # reading it would sync
    try:
        value = float(max_norm)
    except (TypeError, ValueError):
        raise TypeError(f"max_norm must be a number, got {max_norm!r}.") from None
    if not value >= 0:
        raise ValueError(f"max_norm must be a non-negative number, got {max_norm!r}; for example max_norm=1.0.")


Sums = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def tensor_sums(g: torch.Tensor, factor: torch.Tensor | None = None) -> Sums:
    """``(max|g|, #zeros, #subnormals, sum g**2)`` of one gradient (dense or sparse), 0-d float32 tensors.

    ``factor``: a 0-d tensor the values are multiplied by first (the scale, for
    gradients given already unscaled). Cost: one float32 copy of ``|g|`` (a
    read and a write) and four reads, about 8 kernel launches; a sparse
    gradient adds a coalesce (on CUDA that sizes its output: one host sync).
    """
    n = g.numel()
    g = g.detach()
    if g.layout == torch.sparse_coo:
        g = g.coalesce()._values()  # the stored values; the other n - nnz entries are zeros
    a = g.reshape(-1).float().abs()  # the one copy of |g| (two temporaries in all: fresh pages cost)
    if factor is not None:
        a.mul_(factor)
    if not a.numel():
        zero = a.new_zeros(())
        return zero, zero + n, zero, zero
    amax, sumsq = a.max(), torch.dot(a, a)
    normal = (a * (1.0 / FLOAT16_TINY)).clamp_(max=1.0).floor_().sum()  # 1 per |g| >= 2**-14
    nonzero = a.clamp_(max=2.0**-126).mul_(2.0**126).ceil_().sum()  # in place on |g|: 1 per |g| > 0
    return amax, n - nonzero, nonzero - normal, sumsq


def gradient_stats(grads: Sequence[torch.Tensor], step: Any = 0) -> GradientStats:
    """:func:`lossscale._stats.gradient_stats` of the (scaled) ``grads``, in arithmetic kernels.

    Cost: :func:`tensor_sums` per tensor, then about 30 kernels on ``(T,)``
    tensors; the sizes are copied from the host (the optimizers keep them on
    the device instead). No host sync. The whole step's cost: ``benchmarks/bench_stats.py``.

    >>> s = gradient_stats([torch.tensor([0.0, 1.0, -4.0]), torch.zeros(2)])
    >>> float(s.amax), round(float(s.zero_fraction), 6)
    (4.0, 0.6)
    """
    grads = list(grads)
    if not grads:
        raise ValueError("gradient statistics need at least one gradient; got none.")
    device = grads[0].device
    tag = torch.full((), int(step), dtype=torch.int32, device=device)  # a fill kernel, not a copy from the host
    return summarize([tensor_sums(g) for g in grads], [g.numel() for g in grads], tag, torch, device=device)
