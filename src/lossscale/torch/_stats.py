"""Gradient statistics for torch: the core's definitions (:mod:`lossscale._stats`) in arithmetic kernels.

The core's :func:`lossscale._stats.tensor_sums` counts with comparisons;
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

from collections.abc import Sequence
from typing import Any

import torch

from .._stats import FLOAT16_TINY, GradientStats, summarize

__all__ = ["gradient_stats", "tensor_sums"]


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
