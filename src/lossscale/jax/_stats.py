"""``stats_every`` on JAX: the measurement inside the jitted step; the sampler is the core's, over ``jax.numpy``."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .._policy import LossScale
from .._rule import LossScaleState, next_state
from .._sampler import SamplerState, initial_sampler_state, is_due, next_sampler_state
from .._stats import FLOAT16_TINY, GradientStats, summarize, tensor_sums
from ._grads import _varying_as

__all__ = ["init_stats", "measure", "sample_if_due", "step_scale", "tensor_names"]


def init_stats(policy: LossScale, params: Any) -> SamplerState:
    """The sampler state at step 0, for gradients shaped like ``params`` (the count an int32 array)."""
    count = len(jax.tree_util.tree_leaves(params))
    return initial_sampler_state(policy, count, jnp, count=jnp.zeros((), jnp.int32))


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
    not vectorize. Leaves that fit the caches take the first (1M parameters: 0.55 ms against 1.5 ms), larger ones
    the second (10M: 15 vs 40 ms).
    """
    if g.size <= CACHED_ELEMENTS:
        return tensor_sums(g, jnp)
    a = jnp.abs(g.astype(jnp.float32)).reshape(-1)
    zero, below = jnp.where(a == 0, 1.0, 0.0), jnp.where(a < FLOAT16_TINY, 1.0, 0.0)

    def combine(x: tuple, y: tuple) -> tuple:
        return lax.max(x[0], y[0]), x[1] + y[1], x[2] + y[2], x[3] + y[3]

    amax, zeros, n_below, sumsq = lax.reduce((a, zero, below, a * a), (jnp.float32(0),) * 4, combine, (0,))
    return amax, zeros, n_below - zeros, sumsq


def measure(grads: list, count: Any, axes: tuple[Hashable, ...] | None) -> GradientStats:
    """The statistics of the gradient leaves ``grads`` (across ``axes``), tagged ``count``: about one read pass."""
    zero = jnp.zeros((), jnp.float32)
    sums = [_sums(g) if g.size else (zero,) * 4 for g in grads]
    sample = summarize(sums, [g.size for g in grads], jnp.asarray(count, jnp.int32), jnp)
    return sample if axes is None else _reduce_across(sample, grads, axes)


def sample_if_due(
    every: int, grads: list, stats: SamplerState, axes: tuple[Hashable, ...] | None = None, check: Any = None
) -> tuple[Any, GradientStats, Any]:
    """``(finite, sample, sampled)``: the sample where due (across ``axes``), else the kept one, in one ``lax.cond``.

    With ``check``, ``finite`` comes with one read pass on every step: ``isfinite(amax)`` on a sampled step (max
    propagates NaN), ``check(grads)`` on an unsampled one; as varying as the gradients (under ``shard_map`` both
    branches must agree). With ``axes`` the sampled flag is already the devices' common one (``amax`` is
    ``pmax``-ed), the unsampled one this device's; the caller's ``pmin`` makes them alike. For float32 and narrower
    leaves with ``S >= 1`` only (a float64 above float32's range would read as an overflow). Without ``check``,
    ``finite`` is None."""
    count = jnp.asarray(stats.count)

    def take(g: list) -> tuple[Any, GradientStats]:
        sample = measure(g, count, axes)
        return (None if check is None else _varying_as(jnp.isfinite(sample.amax), g)), sample

    def keep(g: list) -> tuple[Any, GradientStats]:
        return (None if check is None else _varying_as(check(g), g)), jax.tree_util.tree_map(jnp.asarray, stats.sample)

    if every == 1:
        return *take(grads), True
    due = is_due(every, count)
    return *lax.cond(due, take, keep, grads), due


def step_scale(
    policy: LossScale, every: int | None, grads: list, scale_state: LossScaleState, stats: SamplerState | None,
    finite: jax.Array, axes: tuple[Hashable, ...] | None, measured: tuple[GradientStats, Any] | None = None,
) -> tuple[LossScaleState, SamplerState | None, Any]:
    """New scale state, sampler state and ``sampled`` flag (``measured``: :func:`sample_if_due`'s ``(sample,
    sampled)`` already taken); unsampled: no reduction."""
    if every is None or stats is None:
        return next_state(policy.rule_params(), scale_state, finite, jnp), stats, False
    sample, sampled = measured or sample_if_due(every, grads, stats, axes)[1:]
    # The cond chose the kept sample already: handed in as the sampler's own, it is kept with no select.
    new_scale, new_stats = next_sampler_state(
        policy, scale_state, SamplerState(jnp.asarray(stats.count), sample, stats.auto), finite, sample, sampled, jnp
    )
    return new_scale, new_stats, sampled


def tensor_names(params: Any) -> tuple[str, ...]:
    """The names ``gradient_stats["per_tensor"]`` uses for the leaves of ``params`` (``jax.tree_util.keystr``)."""
    return tuple(jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0])
