"""The torch passes over gradients (R: read, W: write; none syncs), shared by ``lossscale.torch`` and Keras on
torch. A found-inf flag is a 0-d float32 tensor, 1.0 on any NaN or +-Inf. Dense gradients go by (device, dtype)
group through one multi-tensor kernel; sparse COO ones one by one; DTensors as their local shards."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import torch

from .._rule import COUNTER_MAX, KernelForm, LossScaleState
from .._stats import FLOAT16_TINY, GradientStats, summarize_columns
from ._compat import (
    foreach_abs,
    foreach_add,
    foreach_ceil_,
    foreach_mul,
    foreach_mul_,
    foreach_norm,
    foreach_sign_,
    group_in_python,
    group_tensors_by_device_and_dtype,
    non_finite_check_and_unscale_,
    sparse_values,
    update_scale_,
)

__all__ = ["AUTO_COUNTER_MOVES", "AutoTable", "GradGroups", "advance_auto_unsampled_", "advance_scale_",
           "check_finite", "combine_flags", "dtensor_type", "gradient_stats", "host_state", "move",
           "reciprocal", "sample_columns", "scaled_norm", "tensor_sums",
           "unscale_and_check_", "unscale_grads_per_device", "unscaled_copies"]


def dtensor_type() -> type | None:
    """``torch.distributed.tensor.DTensor`` if torch has imported it, else None (then none can exist)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def _grouped(tensorlists: list[list[Any]], with_indices: bool = False) -> dict:
    if torch.compiler.is_compiling():
        return group_in_python(tensorlists, with_indices)
    return group_tensors_by_device_and_dtype(tensorlists, with_indices=with_indices)


class GradGroups:
    """One step's gradients, grouped once by (device, dtype), sparse ones apart; ``sharded``: the DTensor originals."""

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
        groups = _grouped([dense]) if dense else {}
        self.dense = {key: tensors for key, ([tensors], _) in groups.items()}
        self.has_float16 = any(dtype == torch.float16 for _, dtype in self.dense) or any(
            g.dtype == torch.float16 for g in self.sparse
        )
        self.device: torch.device | None = self.tensors[0].device if self.tensors else None

    @classmethod
    def of(cls, param_groups: Iterable[dict]) -> GradGroups:
        return cls([p.grad for group in param_groups for p in group["params"] if p.grad is not None])


def move(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; non-blocking unless the copy lands on the host."""
    if tensor.device == device:
        return tensor
    return tensor.to(device, non_blocking=device.type != "cpu")


def reciprocal(scale: torch.Tensor) -> torch.Tensor:
    """``1 / scale`` in float32: one op. The same bits as computing it in float64 and rounding to float32 (an IEEE
    division is correctly rounded, and a float32 quotient rounded through float64 is too), and exact for powers of
    two; tested on every float32 power of two and random scales."""
    return torch.reciprocal(scale)


def advance_scale_(form: KernelForm, state: LossScaleState, found_inf: torch.Tensor, *, above_floor: bool = False,
                   finite: bool | None = None, streak_is_zero: bool = False) -> None:
    """``state <- next_state(policy, state, found_inf == 0)`` in place, by :func:`lossscale._rule.kernel_form`'s
    kernel form; no host sync.

    With the flag on the device only (``finite`` None): GradScaler's update kernel, the floor, the skip counters in
    three: 5 operators for a dynamic policy, 3 for a fixed one. With the flag already read on the host (``finite``,
    Keras on torch's Python ``if``), the operators it makes no-ops are left out, the same bits:

    - a finite step: the update kernel (``good += 1``, the growth), then ``consecutive_skips = 0`` unless
      ``streak_is_zero``. No floor (the scale does not back off) and ``skipped_steps`` stays: 1-2 operators (a fixed
      scale: 0-1);
    - an overflow: the kernel (the backoff), the floor as ``clamp_min_`` (``max(S, floor)`` after a backoff, whatever
      the scale was before), both skip counters ``+ 1``: 4 operators (a fixed scale: 2).

    Args:
        form: the policy's :class:`~lossscale._rule.KernelForm`.
        state: the live state tensors, changed in place.
        found_inf: a 0-d float32 flag on the state's device, nonzero for an overflow (a flag summed over ranks,
            e.g. 2.0, counts once, as torch's update kernel reads it).
        above_floor: with ``finite`` None, known that ``S >= form.floor`` before the step: the floor is then
            ``clamp_min_`` (it can only act after a backoff); otherwise ``S = max(S, found_inf * floor)``, one
            operator more.
        finite: the flag as read on the host (0.0 in ``found_inf`` iff True), or None.
        streak_is_zero: with ``finite``, known that ``consecutive_skips`` is 0 before the step.

    The caller checks the form's other host conditions (``good_steps < growth_interval``, counters below their
    limit), which this does not read."""
    with torch.no_grad():
        if form.dynamic:
            update_scale_(state.loss_scale, state.good_steps, found_inf, form.growth_factor, form.backoff_factor,
                          form.growth_interval)
        if finite is None:
            inf = found_inf.to(torch.bool)
            if form.dynamic and above_floor:
                state.loss_scale.clamp_min_(form.floor)
            elif form.dynamic:
                torch.maximum(state.loss_scale, inf * form.floor, out=state.loss_scale)
            state.skipped_steps.add_(inf)
            torch.addcmul(inf, inf, state.consecutive_skips, out=state.consecutive_skips)
        elif not finite:
            if form.dynamic:
                state.loss_scale.clamp_min_(form.floor)
            state.skipped_steps.add_(1)
            state.consecutive_skips.add_(1)
        elif not streak_is_zero:
            state.consecutive_skips.zero_()


def host_state(tensors: LossScaleState) -> tuple[LossScaleState, int]:
    """The state's values read on the host, as Python numbers, and the room below :data:`COUNTER_MAX`: how many
    more steps cannot carry a counter past it (the kernel forms do not saturate). One host sync off the CPU (one
    stacked copy)."""
    values = LossScaleState(*torch.stack([t.detach().double() for t in tensors]).tolist())
    most = max(values.good_steps, values.skipped_steps, values.consecutive_skips)
    return values, max(COUNTER_MAX - 1 - int(most), 0)


class AutoTable(NamedTuple):
    """Where an ``AutoLossScale``'s unsampled step runs by table (:func:`advance_auto_unsampled_`): the state the
    step writes, packed so that it writes it in two operators, and the core's
    :func:`~lossscale._auto.overflow_table`. The binding's live 0-d tensors share the memory of ``floats`` and
    ``counters``."""

    floats: torch.Tensor  # (3,) float32: the scale, the margin, the table key of the two
    counters: torch.Tensor  # (4,) int32: good_steps, calm_steps, consecutive_skips, skipped_steps
    table: torch.Tensor  # (rows, 3) float32: overflow_table's rows (scale, margin, key)
    moves: torch.Tensor  # (2, 2, 4) int32: [finite, overflow] x [multiplier, addend] of the counters
    grid: tuple[torch.Tensor, torch.Tensor]  # overflow_grid's (e, m), kept

    def overflow(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The current state's overflow outcome ``(scale, margin)``, looked up (2 operators)."""
        row = self.table.index_select(0, self.floats[2:].long())[0]
        return row[0], row[1]


#: :attr:`AutoTable.moves`: a finite step counts good_steps and calm_steps up and ends the skip streak; an
#: overflow zeroes the first two and counts both skip counters up (``counter <- multiplier * counter + addend``).
AUTO_COUNTER_MOVES = (((1, 1, 0, 1), (1, 1, 0, 0)), ((0, 0, 1, 1), (0, 0, 1, 1)))


def advance_auto_unsampled_(table: AutoTable, found_inf: torch.Tensor) -> None:
    """An ``AutoLossScale``'s unsampled step in place, by table: 6 operators, no host sync.

    The core's rule (:func:`~lossscale._auto.next_auto_state` with no sample) on such a step keeps the scale and
    the margin and counts ``good_steps`` and ``calm_steps`` up, or on an overflow takes the scale and margin of
    :func:`~lossscale._auto.overflow_outcome` and zeroes them; the skip counters move as in every mode. Here the
    overflow's outcome is row ``key`` of the table, and the four counters move by one multiply-add::

        row = table[key]                                   # index_select
        floats = row if overflow else floats               # S, m, key
        counters = multiplier * counters + addend          # the multiplier and addend of finite or overflow

    The same bits as the core rule while no counter reaches 2**31 - 1 (these do not saturate; the caller checks
    that on the host) and the table is that of the current window and bounds (rebuilt at every sample).

    Args:
        table: the packed state and its table.
        found_inf: a 0-d float32 flag on the state's device, nonzero for an overflow.
    """
    with torch.no_grad():
        inf = found_inf.to(torch.bool)
        row = table.table.index_select(0, table.floats[2:].long())
        moves = torch.where(inf, table.moves[1], table.moves[0])
        torch.addcmul(moves[1], moves[0], table.counters, out=table.counters)
        torch.where(inf, row[0], table.floats, out=table.floats)


def combine_flags(flags: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The per-group found-inf flags as one on ``device``, exactly 0.0 or 1.0 (a MAX, not a sum).

    Exactly 1.0 matters: torch's fused kernels skip only when the flag equals 1.0, and subtract it from their step
    counters."""
    if not flags:
        return torch.zeros((), dtype=torch.float32, device=device)
    total = move(flags[0], device)
    for flag in flags[1:]:
        total = torch.maximum(total, move(flag, device))
    return total


def unscale_and_check_(grads: GradGroups, inv_scale: torch.Tensor, *, out_device: torch.device,
                       recheck: bool = False) -> torch.Tensor:
    """``g *= inv_scale`` in place and the found-inf flag on ``out_device``: one R+W pass; ``recheck`` (for ``S``
    below 1, where ``g / S`` can overflow): a second one."""
    flags: list[torch.Tensor] = []
    for (device, _dtype), tensors in grads.dense.items():
        found = torch.zeros((), dtype=torch.float32, device=device)
        non_finite_check_and_unscale_(tensors, found, move(inv_scale, device))
        flags.append(found)
    for grad in grads.sparse:
        found = torch.zeros((), dtype=torch.float32, device=grad.device)
        non_finite_check_and_unscale_([_sparse_values(grad)], found, move(inv_scale, grad.device))
        flags.append(found)
    found_inf = combine_flags(flags, out_device)
    if recheck:
        found_inf = torch.maximum(found_inf, check_finite(grads, out_device=out_device))
    return found_inf


def unscale_grads_per_device(param_groups: Iterable[dict], inv_scale: torch.Tensor, found_inf: torch.Tensor,
                             allow_fp16: bool) -> dict[torch.device, torch.Tensor]:
    """``torch.amp.GradScaler._unscale_grads_``: every ``.grad`` times ``inv_scale`` in place, checked into a copy
    of ``found_inf`` per device, returned as ``{device: found_inf}``. float16 gradients without ``allow_fp16``
    raise torch's ``ValueError``; sparse float16 ones are coalesced first (as torch does). One R+W pass."""
    groups: dict[torch.device, dict[torch.dtype, list[torch.Tensor]]] = {}
    with torch.no_grad():
        for group in param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is None:
                    continue
                if not allow_fp16 and grad.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                if grad.layout != torch.strided:
                    grad = _sparse_values(grad)
                groups.setdefault(grad.device, {}).setdefault(grad.dtype, []).append(grad)
        flags: dict[torch.device, torch.Tensor] = {}
        for device, by_dtype in groups.items():
            flag = flags[device] = found_inf.to(device, copy=True)
            inv = inv_scale.to(device, copy=True)
            for tensors in by_dtype.values():
                non_finite_check_and_unscale_(tensors, flag, inv)
    return flags


def check_finite(grads: GradGroups, *, out_device: torch.device) -> torch.Tensor:
    """The found-inf flag, values unchanged: :func:`unscale_and_check_` by exactly 1 (R+W)."""
    one = torch.ones((), dtype=torch.float32, device=out_device)
    with torch.no_grad():
        return unscale_and_check_(grads, one, out_device=out_device)


def unscaled_copies(
    grads: Sequence[torch.Tensor | None], inv_scale: torch.Tensor, found_inf: list[torch.Tensor] | None = None
) -> list[torch.Tensor | None]:
    """New tensors ``g * inv_scale`` in their gradient's dtype; None stays None. The inputs are not modified.

    What it is for: unscaling gradients that are *values*, not ``.grad`` (TF's ``get_unscaled_gradients``, and Keras
    on torch's eager step, whose gradients are a list it must not write into).

    The product is formed in float32 for float16/bfloat16 gradients and rounded once, so a value that ``1/S`` brings
    into float16's subnormal range survives (``4 * 2**-26 = 2**-24``; in float16 ``2**-26`` itself is 0): a
    float16 multiplication by ``1/S`` would flush what loss scaling exists to keep.

    Args:
        grads: the gradients (dense or sparse COO tensors, or None).
        inv_scale: ``1 / S``, a 0-d float32 tensor.
        found_inf: a list to append one found-inf flag per (device, dtype) group (and per sparse gradient) to, so
            that the copies are also checked: half types get it from their unscale kernel, the others from one more
            R+W check pass over their copies. None: not checked.

    Returns:
        The new list.

    Cost: float32/float64 gradients, one R pass and one W pass into new memory; half types, one more R+W (a copy,
    then the unscale kernel on it). No sync.
    """
    out: list[torch.Tensor | None] = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    dense = [i for i in present if grads[i].layout == torch.strided]  # type: ignore[union-attr]
    groups = _grouped([[grads[i] for i in dense]], with_indices=True) if dense else {}
    for (device, dtype), ([tensors], indices) in groups.items():
        inv = move(inv_scale, device)
        found = torch.zeros((), dtype=torch.float32, device=device)
        if dtype in (torch.float16, torch.bfloat16):
            results = list(foreach_mul(tensors, 1.0))  # copies, in their dtype
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
    """The ``norm_type``-norm of all gradients together, in float32: one R pass (DTensors: + scalar all-reduces)."""
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
    """:func:`scaled_norm` over DTensors: local norms, then a SUM (MAX for inf) over the shard dimensions."""
    import torch.distributed as dist

    dtensor = dtensor_type()
    buckets: dict[tuple, tuple[Any, tuple[int, ...], list[torch.Tensor]]] = {}
    for grad in grads:
        if dtensor is None or not isinstance(grad, dtensor):
            buckets.setdefault(("local",), (None, (), []))[2].append(grad)
            continue
        if any(p.is_partial() for p in grad.placements):
            raise ValueError("A DTensor gradient has a Partial placement (not yet reduced), so its norm is not "
                             "defined by its shards. Reduce it first, e.g. "
                             "grad.redistribute(placements=[Replicate()] * mesh.ndim).")
        dims = tuple(i for i, p in enumerate(grad.placements) if p.is_shard())
        buckets.setdefault((id(grad.device_mesh), dims), (grad.device_mesh, dims, []))[2].append(grad)
    norms = []
    for mesh, dims, members in buckets.values():
        local = GradGroups(members)
        local.sharded = None  # the local shards' norm
        part = scaled_norm(local, norm_type, out_device=out_device)
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
    """The stored values of a sparse COO gradient; float16 ones coalesced first, as GradScaler's."""
    if grad.layout != torch.sparse_coo:
        raise TypeError(f"lossscale supports dense (strided) and sparse COO gradients, got layout {grad.layout}. "
                        "Convert the gradient with .to_dense() or .to_sparse() before step().")
    if grad.dtype == torch.float16 and not grad.is_coalesced():
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
        raise ValueError(f"norm_type must be positive, got {norm_type!r}: for p <= 0 (and -inf) the result is not a "
                         "norm, and it can be finite while a gradient is Inf, so the overflow check would miss it. "
                         "Use 2.0, 1.0 or float('inf').")
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

#: The most elements :func:`sample_columns` measures at once (its transient memory: three copies of this many).
CHUNK_ELEMENTS = 2**23
_MULTI_TENSOR = (torch.float32, torch.float16, torch.bfloat16)


def tensor_sums(g: torch.Tensor, factor: torch.Tensor | None = None) -> Sums:
    """``(max|g|, #zeros, #subnormals, sum g**2)`` of one gradient (times ``factor``), 0-d float32 tensors. Cost: one
    float32 copy of ``|g|``, about 9 kernels; a sparse gradient's coalesce is one sync on CUDA."""
    n = g.numel()
    g = g.detach()
    if g.layout == torch.sparse_coo:
        g = g.coalesce().values()  # the stored values; the other n - nnz entries are zeros (public once coalesced)
    a = g.reshape(-1).float().abs()  # the one copy of |g|
    if factor is not None:
        a.mul_(factor)
    if not a.numel():
        zero = a.new_zeros(())
        return zero, zero + n, zero, zero
    amax, sumsq = a.max(), torch.dot(a, a)
    a.nan_to_num_(nan=math.inf)  # a NaN counts as neither zero nor subnormal, as in the core (not NaN sums)
    normal = (a * (1.0 / FLOAT16_TINY)).clamp_(max=1.0).floor_().sum()  # 1 per |g| >= 2**-14
    nonzero = a.clamp_(max=2.0**-126).mul_(2.0**126).ceil_().sum()  # in place on |g|: 1 per |g| > 0
    return amax, n - nonzero, nonzero - normal, sumsq


def _multi_tensor_sums(grads: list[torch.Tensor], factor: torch.Tensor | None) -> list[torch.Tensor]:
    """The four ``(k,)`` columns of :func:`tensor_sums` for ``k`` dense gradients of one device and dtype, by
    multi-tensor kernels: 14 launches for all ``k`` instead of about 9 each; three copies of ``|g|``, each read or
    written about four times.
    Each count is the 1-norm of a mark ``|sign(ceil(x))|``, which is 1 where ``x`` is positive, ``x <= -1`` or
    infinite, and 0 where it is NaN or in ``(-1, 0]`` (``sign`` is the only op here that maps NaN to a number, 0):
    ``x = |g| + 1`` marks the non-NaN entries, ``x = |g|`` those above 0, ``x = -|g| * 2**14`` those at or above
    float16's smallest normal, so ``zeros = #non-NaN - #positive`` and ``subnormals = #positive - #normal``."""
    a = list(foreach_abs(grads))  # |g| in the gradients' dtype
    if factor is not None:
        foreach_mul_(a, factor)
    k = len(grads)
    norms = [*foreach_norm(a, math.inf), *foreach_norm(a, 2.0)]  # before a is marked below
    marks = [*foreach_add(a, 1.0), *a, *foreach_mul(a, -1.0 / FLOAT16_TINY)]
    foreach_ceil_(marks)
    foreach_sign_(marks)
    table = torch.stack([*norms, *foreach_norm(marks, 1.0)]).view(5, k)  # max, root, #non-NaN, #positive, #normal
    zeros, subnormals = (table[2:4] - table[3:5]).unbind()
    return [table[0], zeros, subnormals, table[1] * table[1]]


@torch.no_grad()
def sample_columns(
    grads: Sequence[torch.Tensor], factor: torch.Tensor | None = None, multi_tensor: bool | None = None
) -> list[torch.Tensor]:
    """The four ``(T,)`` float32 columns ``(max|g|, #zeros, #subnormals, sum g**2)`` of ``grads`` (times ``factor``)
    in their order, for :func:`lossscale._stats.summarize_columns`. Off the CPU (``multi_tensor`` None) or with
    ``multi_tensor``, consecutive dense float32/float16/bfloat16 gradients go by up to :data:`CHUNK_ELEMENTS` through
    :func:`_multi_tensor_sums`; the others (sparse, empty, DTensor, float64, half types with a ``factor``), and every
    gradient on the CPU, one by one through :func:`tensor_sums` (on the CPU there are no launches to save, and the
    multi-tensor ops run 3x slower there). Cost: one read of the gradients, then passes over their float copies
    (about 12 multi-tensor launches per chunk, or about 9 kernels per tensor one by one). No host sync."""
    pieces: list[list[torch.Tensor]] = []
    run: list[torch.Tensor] = []
    size = 0
    dtensor = dtensor_type()

    def flush() -> None:
        nonlocal run, size
        if run:
            pieces.append(_multi_tensor_sums(run, factor))
        run, size = [], 0

    for g in grads:
        n = g.numel()
        fits = ((g.device.type != "cpu" if multi_tensor is None else multi_tensor)
                and g.layout == torch.strided and n > 0 and g.dtype in _MULTI_TENSOR
                and (factor is None or g.dtype == torch.float32) and (dtensor is None or not isinstance(g, dtensor)))
        if not fits or (run and (g.device, g.dtype) != (run[0].device, run[0].dtype)) or size + n > CHUNK_ELEMENTS:
            flush()
        if fits:
            run.append(g)
            size += n
        else:
            pieces.append(list(tensor_sums(g, factor)))  # 0-d
    flush()
    if not pieces:
        raise ValueError("gradient statistics need at least one gradient; got none.")
    device = pieces[0][0].device
    if all(p[0].ndim == 0 for p in pieces):  # one by one (the CPU): one stack per column
        return [torch.stack([p[k].to(device) for p in pieces]) for k in range(4)]
    if len(pieces) == 1:
        return pieces[0]
    return [torch.cat([p[k].reshape(-1).to(device) for p in pieces]) for k in range(4)]


def gradient_stats(grads: Sequence[torch.Tensor], step: Any = 0) -> GradientStats:
    """:func:`lossscale._stats.gradient_stats` of the (scaled) ``grads``: :func:`sample_columns`, then about 15
    kernels. No host sync.

    >>> s = gradient_stats([torch.tensor([0.0, 1.0, -4.0]), torch.zeros(2)])
    >>> float(s.amax), round(float(s.zero_fraction), 6)
    (4.0, 0.6)
    """
    grads = list(grads)
    if not grads:
        raise ValueError("gradient statistics need at least one gradient; got none.")
    device = grads[0].device
    tag = torch.full((), int(step), dtype=torch.int32, device=device)  # a fill kernel, not a copy from the host
    return summarize_columns(sample_columns(grads), [g.numel() for g in grads], tag, torch, device=device)
