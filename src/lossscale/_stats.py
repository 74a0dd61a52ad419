"""Gradient statistics: how close the scaled gradients are to float16's two edges, over an array namespace ``xp``
like :func:`lossscale.next_state` (reductions, comparisons and ``xp.where`` only: no host sync, jittable).

Measured on the **scaled** gradients ``g = S * true_grad`` (what the float16 backward produced). With ``n_t``
the size of tensor ``t``:

* ``amax_t = max |g_t|``, ``headroom_bits_t = log2(65504 / amax_t)``: doublings of the scale before float16
  overflows (``+inf`` for an all-zero tensor, negative once past the edge);
* ``zero_fraction_t = #{g == 0} / n_t`` (flushed to zero, or true zeros);
* ``subnormal_fraction_t = #{0 < |g| < 2**-14} / n_t`` (below float16's smallest normal);
* ``rms_t = sqrt(sum g**2 / n_t)``, accumulated in float32.

Overall: ``amax = max_t amax_t``, fractions weighted by ``n_t``, and ``rms_min = min_t rms_t`` over the tensors
with ``rms_t > 0`` (0 if none), which :class:`lossscale.AutoLossScale` reads.

Cost: one read pass over each gradient (four reductions, fused under XLA), about 10 ops per tensor on 0-d arrays
plus 15 on ``(T,)`` arrays. No host sync."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = ["FLOAT16_MAX", "FLOAT16_TINY", "GradientStats", "Sizes", "as_mapping", "empty_stats", "gradient_stats",
           "host_array", "sizes_of", "summarize", "summarize_columns", "tensor_sums"]

#: The largest float16.
FLOAT16_MAX = 65504.0
#: float16's smallest positive normal, 2**-14.
FLOAT16_TINY = 2.0**-14
#: ``log2(FLOAT16_MAX)``, just under 16.
LOG2_FLOAT16_MAX = math.log2(FLOAT16_MAX)


class GradientStats(NamedTuple):
    """One sample: the overall values 0-d, the ``tensor_*`` values ``(T,)`` in the order of the gradients, float32;
    ``step`` (int32) the step it was taken at, -1 before the first. :func:`as_mapping` gives the public form."""

    step: Any
    amax: Any
    headroom_bits: Any
    zero_fraction: Any
    subnormal_fraction: Any
    rms_min: Any
    tensor_amax: Any
    tensor_headroom_bits: Any
    tensor_zero_fraction: Any
    tensor_subnormal_fraction: Any
    tensor_rms: Any


def _f32(x: Any, xp: Any) -> Any:
    return xp.asarray(x, dtype=xp.float32)


def tensor_sums(g: Any, xp: Any, count: Callable[[Any], Any] | None = None) -> tuple[Any, Any, Any, Any]:
    """``(max|g|, #zeros, #subnormals, sum g**2)`` of one non-empty gradient, as 0-d float32 arrays (``g`` widened to
    float32 first, so the squares neither overflow nor flush; NaN propagates). ``count(mask)``: the number of True
    entries as a float32 sum; by default of ``where(mask, 1, 0)``, which XLA's CPU backend vectorizes (a sum of the
    converted bool runs 10x slower there; TensorFlow's executor is the other way round). Cost: one read pass."""
    count = count or (lambda mask: xp.sum(xp.where(mask, 1.0, 0.0)))
    a = xp.abs(_f32(g, xp))
    zeros = _f32(count(a == 0), xp)
    below = _f32(count(a < FLOAT16_TINY), xp)
    return xp.max(a), zeros, below - zeros, xp.sum(a * a)


def summarize(
    sums: Sequence[tuple[Any, Any, Any, Any]], sizes: Sequence[int] | Sizes, step: Any, xp: Any, **array_kwargs: Any
) -> GradientStats:
    """The :class:`GradientStats` of per-tensor :func:`tensor_sums` (or a binding's kernels' 0-d float32 values; an
    empty tensor is ``(0, 0, 0, 0)`` with size 0): :func:`summarize_columns` of them stacked."""
    if not sums:
        raise ValueError("gradient statistics need at least one gradient; got none.")
    return summarize_columns([xp.stack(list(column)) for column in zip(*sums)], sizes, step, xp, **array_kwargs)


def summarize_columns(
    columns: Sequence[Any], sizes: Sequence[int] | Sizes, step: Any, xp: Any, **array_kwargs: Any
) -> GradientStats:
    """The :class:`GradientStats` of the four ``(T,)`` float32 columns ``(max|g|, #zeros, #subnormals, sum g**2)``.
    ``sizes``: a list of element counts (``array_kwargs``, e.g. ``device=``, go to :func:`sizes_of`), or the
    :class:`Sizes` a binding made once for its parameter set. About 20 ops on ``(T,)`` arrays."""
    amax, zeros, subnormal, sumsq = columns
    safe, total = sizes if isinstance(sizes, Sizes) else sizes_of(sizes, xp, **array_kwargs)
    total = total or 1.0  # every tensor empty: fractions 0
    rms = xp.sqrt(sumsq / safe)
    overall = xp.max(amax)
    rms_min = xp.min(xp.where(rms > 0, rms, math.inf))  # a Python scalar: no array made on the host (a copy to a GPU)
    return GradientStats(  # the overall values, then the per-tensor ones
        xp.asarray(step, dtype=xp.int32), overall, _headroom(overall, xp), xp.sum(zeros) / total,
        xp.sum(subnormal) / total, xp.where(rms_min < math.inf, rms_min, 0.0),
        amax, _headroom(amax, xp), zeros / safe, subnormal / safe, rms,
    )


class Sizes(NamedTuple):
    """The element counts of a parameter set as :func:`summarize_columns` divides by them: ``safe``, the ``(T,)``
    float32 sizes with 0 read as 1 (an empty tensor's fractions are 0), and ``total``, their sum (a float, so that
    the sizes of several parameter sets add up)."""

    safe: Any
    total: Any


def sizes_of(sizes: Sequence[int], xp: Any, **array_kwargs: Any) -> Sizes:
    """:class:`Sizes` of a list of element counts: one copy from the host (a binding keeps it per parameter set)."""
    safe = xp.asarray([float(n) or 1.0 for n in sizes], dtype=xp.float32, **array_kwargs)
    return Sizes(safe, float(sum(sizes)))


def _headroom(amax: Any, xp: Any) -> Any:
    """``log2(65504 / amax)`` of ``amax >= 0`` or NaN: +inf for 0, NaN for NaN, -inf for +inf (log2 gives each)."""
    with np.errstate(divide="ignore"):  # numpy's log2(0) = -inf warns; the other namespaces don't
        return LOG2_FLOAT16_MAX - xp.log2(amax)


def gradient_stats(grads: Sequence[Any], xp: Any, step: Any = 0) -> GradientStats:
    """The statistics of a list of scaled gradients (see the module docstring for the definitions).

    >>> import numpy as np
    >>> g = [np.array([0.0, 1.0, 2.0**-20, -4.0], np.float16), np.zeros(2, np.float16)]
    >>> s = gradient_stats(g, np)
    >>> float(s.amax), round(float(s.headroom_bits), 3), float(s.zero_fraction), s.tensor_zero_fraction.tolist()
    (4.0, 13.999, 0.5, [0.25, 1.0])
    """
    zero = _f32(0.0, xp)
    sums = [tensor_sums(g, xp) if _size(g) else (zero, zero, zero, zero) for g in grads]
    return summarize(sums, [_size(g) for g in grads], step, xp)


def _size(g: Any) -> int:
    return int(math.prod(tuple(g.shape)))


def empty_stats(num_tensors: int, xp: Any, **array_kwargs: Any) -> GradientStats:
    """The statistics before any sample: ``step`` -1, every value NaN (shapes as a real sample)."""
    def nan(*shape: int) -> Any:
        return xp.full(shape, math.nan, dtype=xp.float32, **array_kwargs)

    return GradientStats(
        xp.asarray(-1, dtype=xp.int32, **array_kwargs),
        nan(), nan(), nan(), nan(), nan(),
        nan(num_tensors), nan(num_tensors), nan(num_tensors), nan(num_tensors), nan(num_tensors),
    )


def as_mapping(stats: GradientStats, names: Sequence[str] | None = None) -> dict[str, Any]:
    """The public ``gradient_stats`` form of a sample: a dict of its arrays (no copy, no host sync) whose
    ``per_tensor`` dict holds the ``(T,)`` arrays and the tensor ``names`` (default ``"0"``, ``"1"``, ...)."""
    count = int(next(iter(stats.tensor_amax.shape)))
    names = tuple(str(i) for i in range(count)) if names is None else tuple(names)
    if len(names) != count:
        raise ValueError(f"names must name each of the {count} tensors, got {len(names)} names.")
    overall = {k: v for k, v in stats._asdict().items() if not k.startswith("tensor_")}
    per_tensor = {k.removeprefix("tensor_"): v for k, v in stats._asdict().items() if k.startswith("tensor_")}
    return {**overall, "per_tensor": {"names": names, **per_tensor}}


def host_array(value: Any, dtype: Any) -> np.ndarray:
    """A number, numpy or framework array as a new numpy array of ``dtype`` (a torch tensor via ``.cpu()``: one
    copy, a host sync on an accelerator)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.array(value, dtype=dtype)
