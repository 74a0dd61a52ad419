"""Sampled gradient statistics and the ``auto`` policy inside the jitted step.

The statistics are the core's (:mod:`lossscale._stats`), over ``jax.numpy``.
Every ``stats_every``-th update measures them (a ``lax.cond`` on the step
count, so the step compiles once and an unsampled step runs no reduction);
``AutoLossScale`` then reads them in :func:`lossscale._auto.next_auto_state`.
Nothing leaves the device.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .._auto import AutoLossScale, AutoState, check_stats_every, initial_auto_state, next_auto_state
from .._policy import LossScale
from .._rule import COUNTER_MAX, LossScaleState, next_state
from .._stats import GradientStats, as_mapping, empty_stats, gradient_stats, summarize

__all__ = ["StatsState", "check_stats_every", "init_stats", "measure", "stats_mapping", "step_scale", "tensor_names"]


class StatsState(NamedTuple):
    """What ``stats_every`` adds to the optimizer state: a pytree of arrays.

    Attributes:
        count: int32, updates seen (sampled iff ``count % stats_every == 0``).
        sample: the latest :class:`lossscale._stats.GradientStats`.
        auto: the :class:`lossscale._auto.AutoState` of an ``AutoLossScale``, else None.
    """

    count: Any
    sample: GradientStats
    auto: AutoState | None


def init_stats(policy: LossScale, params: Any) -> StatsState:
    """The :class:`StatsState` at step 0, for gradients shaped like ``params``."""
    count = len(jax.tree_util.tree_leaves(params))
    auto = initial_auto_state(policy, jnp) if isinstance(policy, AutoLossScale) else None
    return StatsState(jnp.zeros((), jnp.int32), empty_stats(count, jnp), auto)


def _reduce_across(sample: GradientStats, leaves: list, axes: tuple[Hashable, ...]) -> GradientStats:
    """The statistics of the gradients of every device along ``axes``: max of maxima, mean of shares."""
    sums = [
        (lax.pmax(a, axes), lax.pmean(z * n, axes), lax.pmean(s * n, axes), lax.pmean(r * r * n, axes))
        for a, z, s, r, n in zip(
            sample.tensor_amax, sample.tensor_zero_fraction, sample.tensor_subnormal_fraction, sample.tensor_rms,
            [leaf.size for leaf in leaves],
        )
    ]
    return summarize(sums, [leaf.size for leaf in leaves], sample.step, jnp)


def measure(grads: list, count: Any, axes: tuple[Hashable, ...] | None) -> GradientStats:
    """The statistics of the scaled gradient leaves ``grads`` (across ``axes`` when given), tagged ``count``."""
    sample = gradient_stats(grads, jnp, step=count)
    return sample if axes is None else _reduce_across(sample, grads, axes)


def step_scale(
    policy: LossScale,
    every: int | None,
    grads: list,
    scale_state: LossScaleState,
    stats: StatsState | None,
    finite: jax.Array,
    axes: tuple[Hashable, ...] | None,
    sample: GradientStats | None = None,
) -> tuple[LossScaleState, StatsState | None]:
    """The new scale state and statistics after one update (``grads``: the scaled gradient leaves).

    ``sample``: this step's statistics when the caller measured them already (``stats_every=1``, where
    the finite flag is read from them: ``isfinite(amax)``, so the check and the statistics are one pass).
    Cost on a sampled step: one read pass over the gradients (four reductions), plus about 60 scalar
    ops. On an unsampled step: the ``lax.cond`` on ``count % stats_every`` and the scalar update.
    No host sync.
    """
    if every is None or stats is None:
        return next_state(policy.rule_params(), scale_state, finite, jnp), stats
    count = jnp.asarray(stats.count)

    if every == 1:
        sampled = jnp.ones((), bool)
        sample = measure(grads, count, axes) if sample is None else sample
    else:
        sampled = count % every == 0
        sample = lax.cond(
            sampled, lambda g: measure(g, count, axes), lambda _: jax.tree_util.tree_map(jnp.asarray, stats.sample), grads
        )
    auto = stats.auto
    if isinstance(policy, AutoLossScale) and auto is not None:
        scale_state, auto = next_auto_state(policy, scale_state, auto, finite, sample, sampled, jnp)
    else:
        scale_state = next_state(policy.rule_params(), scale_state, finite, jnp)
    next_count = jnp.where(count < COUNTER_MAX, count + 1, count)
    return scale_state, StatsState(next_count, sample, auto)


def tensor_names(params: Any) -> tuple[str, ...]:
    """The names ``gradient_stats["per_tensor"]`` uses for the leaves of ``params`` (``jax.tree_util.keystr``)."""
    return tuple(jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0])


def stats_mapping(stats: StatsState | None) -> dict[str, Any] | None:
    """``gradient_stats`` of a state: :func:`lossscale._stats.as_mapping` of the latest sample, or None."""
    if stats is None:
        return None
    return as_mapping(GradientStats(*(jnp.asarray(x) for x in stats.sample)))
