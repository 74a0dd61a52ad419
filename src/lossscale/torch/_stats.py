"""Gradient statistics for torch: the core's definitions (:mod:`lossscale._stats`) in arithmetic kernels.

The core's :func:`lossscale._stats.tensor_sums` counts with comparisons;
torch's CPU kernels for comparisons, ``sign`` and ``vector_norm(inf)`` ran
10-100x slower than plain arithmetic on the development machine.
Here every per-tensor sum is arithmetic: ``max |g|``, ``dot(|g|, |g|)``, the
count of non-zeros as ``sum(ceil(min(|g|, 2**-126) * 2**126))`` and of normals as
``sum(floor(min(|g| * 2**14, 1)))``. The result goes through the core's
:func:`lossscale._stats.summarize`, so the definitions are the core's. No host
sync: every value stays a tensor on the gradients' device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._stats import FLOAT16_TINY, GradientStats, summarize

__all__ = ["gradient_stats"]


def _sums(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    a = g.detach().reshape(-1).float().abs()  # the one copy of |g| (two temporaries in all: fresh pages cost)
    n = a.numel()
    amax, sumsq = a.max(), torch.dot(a, a)
    normal = (a * (1.0 / FLOAT16_TINY)).clamp_(max=1.0).floor_().sum()  # 1 per |g| >= 2**-14
    nonzero = a.clamp_(max=2.0**-126).mul_(2.0**126).ceil_().sum()  # in place on |g|: 1 per |g| > 0
    return amax, n - nonzero, nonzero - normal, sumsq


def gradient_stats(grads: Sequence[torch.Tensor], step: Any = 0) -> GradientStats:
    """:func:`lossscale._stats.gradient_stats` of the (scaled) ``grads``, in arithmetic kernels.

    Cost: per tensor one float32 copy of ``|g|`` (a read and a write) and four
    reads (max, dot, two clamp-round-sums that write a temporary each),
    about 8 kernel launches per tensor, then about 30 on ``(T,)`` tensors. No
    host sync. Measured in ``benchmarks/bench_stats.py --torch``.

    >>> s = gradient_stats([torch.tensor([0.0, 1.0, -4.0]), torch.zeros(2)])
    >>> float(s.amax), round(float(s.zero_fraction), 6)
    (4.0, 0.6)
    """
    grads = list(grads)
    if not grads:
        raise ValueError("gradient statistics need at least one gradient; got none.")
    device = grads[0].device
    zero = torch.zeros((), device=device)
    sums = [_sums(g) if g.numel() else (zero, zero, zero, zero) for g in grads]
    return summarize(sums, [g.numel() for g in grads], torch.as_tensor(step, device=device), torch, device=device)
