"""Gradient statistics for torch: the core's definitions (:mod:`lossscale._stats`), few kernel launches.

The core's :func:`lossscale._stats.tensor_sums` costs about eight small ops
per tensor, which dominates for many small tensors on CPU. Here the per-tensor
maxima and sums of squares come from two ``torch._foreach_norm`` calls
(``inf`` and ``2``), and the zero and subnormal counts from one pass over the
gradients concatenated (``torch.cat``) with two segment sums. The result goes
through the core's :func:`lossscale._stats.summarize`, so the numbers are the
core's. No host sync: every value stays a tensor on the gradients' device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._stats import FLOAT16_TINY, GradientStats, summarize

__all__ = ["gradient_stats"]


def gradient_stats(grads: Sequence[torch.Tensor], step: Any = 0) -> GradientStats:
    """:func:`lossscale._stats.gradient_stats` of the (scaled) ``grads``, computed with batched kernels.

    Cost: two ``_foreach_norm`` reads, one ``cat`` (a read and a write of
    every gradient, as float32), one read for the two comparisons and two
    ``index_add_`` segment sums; about 15 kernel launches whatever the number
    of tensors. No host sync.

    >>> s = gradient_stats([torch.tensor([0.0, 1.0, -4.0]), torch.zeros(2)])
    >>> float(s.amax), float(s.zero_fraction)
    (4.0, 0.6)
    """
    grads = list(grads)
    if not grads:
        raise ValueError("gradient statistics need at least one gradient; got none.")
    device = grads[0].device
    sizes = [g.numel() for g in grads]
    wide = [g.detach().float() for g in grads]
    amax = torch._foreach_norm(wide, float("inf"))
    norms = torch._foreach_norm(wide, 2.0)
    flat = torch.cat([g.reshape(-1) for g in wide]).abs_()
    segments = torch.repeat_interleave(
        torch.arange(len(grads), device=device), torch.tensor(sizes, device=device), output_size=sum(sizes)
    )
    zeros = torch.zeros(len(grads), device=device).index_add_(0, segments, (flat == 0).float())
    below = torch.zeros(len(grads), device=device).index_add_(0, segments, (flat < FLOAT16_TINY).float())
    sums = [(a, z, b - z, n * n) for a, z, b, n in zip(amax, zeros.unbind(), below.unbind(), norms)]
    return summarize(sums, sizes, torch.as_tensor(step, device=device), torch)
