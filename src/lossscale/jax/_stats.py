"""``stats_every`` on JAX: the measurement inside the jitted step (:func:`measure`, :func:`sample_if_due`); the
sampler is the core's, over ``jax.numpy``, and :func:`lossscale.jax._state.advance` keeps what is measured here."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .._jax._kernels import cond
from .._sampler import SamplerState, is_due
from .._stats import FLOAT16_TINY, GradientStats, summarize, tensor_sums
from ._grads import _varying_as
from ._state import Measurement

__all__ = ["measure", "sample_if_due", "tensor_names"]


def _reduce_across(sample: GradientStats, leaves: list, axes: tuple[Hashable, ...]) -> GradientStats:
    """The statistics of the gradients of every device along ``axes``: max of maxima, mean of shares."""
    sizes = [leaf.size for leaf in leaves]
    sums = [
        (lax.pmax(a, axes), lax.pmean(z * n, axes), lax.pmean(s * n, axes), lax.pmean(r * r * n, axes))
        for a, z, s, r, n in zip(
            sample.tensor_amax, sample.tensor_zero_fraction, sample.tensor_subnormal_fraction, sample.tensor_rms, sizes
        )
    ]
    return summarize(sums, sizes, sample.step, jnp)


#: Leaves up to this many elements (4 MB of float32, the development CPU's caches) take four plain reductions.
CACHED_ELEMENTS = 2**20


def _sums(g: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """:func:`~lossscale._stats.tensor_sums` of one non-empty leaf: ``max |g|``, zeros, subnormals, ``sum g**2``.

    Two kernels by size (XLA's CPU backend): the core's four plain reductions vectorize but write ``|g|`` and the
    masks out and read them back (10 passes); one variadic ``lax.reduce`` of the same terms reads ``g`` once but does
    not vectorize. Leaves that fit the caches (:data:`CACHED_ELEMENTS`) take the first, whose passes stay in cache,
    larger ones the second, whose one pass from memory wins (timed in benchmarks/results/gradient-stats/README.md).
    """
    if g.size <= CACHED_ELEMENTS:
        return tensor_sums(g, jnp)
    a = jnp.abs(g.astype(jnp.float32)).reshape(-1)
    zero, below = jnp.where(a == 0, 1.0, 0.0), jnp.where(a < FLOAT16_TINY, 1.0, 0.0)

    def combine(x: tuple, y: tuple) -> tuple:
        (amax_x, zeros_x, below_x, sumsq_x), (amax_y, zeros_y, below_y, sumsq_y) = x, y
        return lax.max(amax_x, amax_y), zeros_x + zeros_y, below_x + below_y, sumsq_x + sumsq_y

    amax, zeros, n_below, sumsq = lax.reduce((a, zero, below, a * a), (jnp.float32(0),) * 4, combine, (0,))
    return amax, zeros, n_below - zeros, sumsq


def measure(grads: list, count: Any, axes: tuple[Hashable, ...] | None) -> GradientStats:
    """The statistics of the gradient leaves ``grads`` (across ``axes``), tagged ``count``: about one read pass."""
    zero = jnp.zeros((), jnp.float32)
    sums = [_sums(g) if g.size else (zero,) * 4 for g in grads]
    sample = summarize(sums, [g.size for g in grads], jnp.asarray(count, jnp.int32), jnp)
    return sample if axes is None else _reduce_across(sample, grads, axes)


def sample_if_due(
    every: int, grads: list, sampler: SamplerState, axes: tuple[Hashable, ...] | None = None, check: Any = None
) -> Measurement:
    """The step's :class:`~lossscale.jax._state.Measurement`: the sample where due (across ``axes``), else the kept
    one, in one ``lax.cond`` (none with ``every=1``; outside any trace, a Python ``if`` on the count: one host read).
    With no gradients (an empty group of ``optax.multi_transform``) the step is unsampled.

    Args:
        every: ``stats_every``, the sampling period.
        grads: the gradient leaves (scaled).
        sampler: the core's ``SamplerState`` before this step; its ``count`` says whether the step is due.
        axes: under ``pmap``/``shard_map``, the axes the sample is reduced across (inside the sampled branch).
        check: None, or the finite check of the unsampled branch (``all_finite``): then the measurement's ``finite``
            comes with one read pass on every step, ``isfinite(amax)`` on a sampled step (max propagates NaN),
            ``check(grads)`` on an unsampled one: the *fused* check. For float32 and narrower leaves with ``S >= 1``
            only (a float64 above float32's range would read as an overflow). Without ``check``, ``finite`` is None.

    Both branches' flags are as varying as the gradients (under ``shard_map`` they must agree). With ``axes`` the
    sampled flag is already the devices' common one (``amax`` is ``pmax``-ed), the unsampled one this device's; the
    caller's ``pmin`` makes them alike. Cost: about one read pass on a sampled step, ``check``'s on the others.
    """
    count = jnp.asarray(sampler.count)

    def take(g: list) -> tuple[Any, GradientStats]:
        sample = measure(g, count, axes)
        return (None if check is None else _varying_as(jnp.isfinite(sample.amax), g)), sample

    def keep(g: list) -> tuple[Any, GradientStats]:
        kept = jax.tree_util.tree_map(jnp.asarray, sampler.sample)
        return (None if check is None else _varying_as(check(g), g)), kept

    if not grads:  # nothing to measure (optax.multi_transform's empty group): an unsampled step
        return Measurement(*keep(grads), False)
    if every == 1:
        finite, sample = take(grads)
        return Measurement(finite, sample, True)
    due = is_due(every, count)
    finite, sample = cond(due, take, keep, grads)
    return Measurement(finite, sample, due)


def tensor_names(params: Any) -> tuple[str, ...]:
    """The names ``gradient_stats["per_tensor"]`` uses for the leaves of ``params`` (``jax.tree_util.keystr``).

    Args:
        params: the parameters (or the gradients: the same structure), any pytree.

    Returns:
        One name per leaf, in ``jax.tree_util.tree_leaves`` order (the order of the per-tensor columns).

    >>> import jax.numpy as jnp, lossscale.jax as lsj
    >>> lsj.tensor_names({"dense": {"w": jnp.ones(2), "b": jnp.ones(1)}})
    ("['dense']['b']", "['dense']['w']")
    """
    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    return tuple(jax.tree_util.keystr(path) for path, _ in leaves)
