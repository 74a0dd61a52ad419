"""The one statistics sampler over an array namespace ``xp``: when to measure, what to keep, and the rule that
reads the sample. A binding supplies the measurement and where the :class:`SamplerState` lives. Per step::

    sampled = is_due(every, count)                 # count % every == 0
    sample  = statistics of the scaled gradients   # by the binding, only when sampled
    scale, sampler = next_sampler_state(policy, scale, sampler, finite, sample, sampled, xp)

``count`` is a Python int (torch: an unsampled step does no device work) or a 0-d int32 array (JAX, Keras);
``sampled`` then a Python bool or a 0-d bool array. No host sync either way."""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral
from typing import Any, NamedTuple

import numpy as np

from ._auto import AutoLossScale, AutoState, check_stats_every, initial_auto_state, next_auto_state
from ._policy import LossScale
from ._rule import COUNTER_MAX, LossScaleState, advance_in_place, next_state
from ._stats import GradientStats, empty_stats, host_array

__all__ = [
    "SamplerState", "advance_sampler_in_place", "check_stats_every", "counted_sampler_state", "initial_sampler_state",
    "is_due", "next_sampler_state", "read_sampler_record", "sampler_record"
]


class SamplerState(NamedTuple):
    """What a binding keeps for ``stats_every``: ``count``, the steps seen (every step, skipped ones included,
    saturating at 2**31 - 1); ``sample``, the latest :class:`~lossscale._stats.GradientStats` (``step`` -1 and
    NaN before the first); ``auto``, the :class:`~lossscale._auto.AutoState` of an ``AutoLossScale``, else None."""

    count: Any
    sample: GradientStats
    auto: AutoState | None


def initial_sampler_state(
    policy: LossScale, num_tensors: int, xp: Any, *, count: Any = 0, **array_kwargs: Any
) -> SamplerState:
    """The :class:`SamplerState` at step 0 for ``num_tensors`` gradients (``count``: a Python int, or
    ``xp.asarray(0, dtype=xp.int32)`` on the device; ``array_kwargs`` go to ``xp.full``, e.g. ``device=``)."""
    auto = initial_auto_state(policy, xp, **array_kwargs) if isinstance(policy, AutoLossScale) else None
    return SamplerState(count, empty_stats(num_tensors, xp, **array_kwargs), auto)


def is_due(every: int, count: Any) -> Any:
    """Whether the step at ``count`` is sampled: a Python bool for an int count, a 0-d bool array for an array."""
    return count % every == 0


def _kept(sampled: Any, new: GradientStats | None, old: GradientStats, xp: Any) -> GradientStats:
    """``new`` where ``sampled``, else ``old`` (no op for a Python bool, or when ``new`` is ``old``)."""
    if new is None or sampled is False or new is old:
        return old
    if sampled is True:
        return new
    return GradientStats(*(xp.where(sampled, n, o) for n, o in zip(new, old)))


def next_sampler_state(
    policy: LossScale, scale_state: LossScaleState, sampler: SamplerState, finite: Any, sample: GradientStats | None,
    sampled: Any, xp: Any, *, micro_batches: Any = 1,
) -> tuple[LossScaleState, SamplerState]:
    """The scale state and sampler state after one step: the new sample kept where ``sampled`` (:func:`is_due`),
    the scale moved by :func:`~lossscale._auto.next_auto_state` for an :class:`~lossscale.AutoLossScale` (which
    reads ``micro_batches``) and by :func:`lossscale.next_state` otherwise, the step counted.

    Cost: about 15 ops on the ``(T,)`` sample if ``sampled`` is an array, plus the rule's. No host sync.

    >>> from lossscale import initial_state
    >>> from lossscale._stats import gradient_stats
    >>> p = AutoLossScale()
    >>> s = initial_sampler_state(p, 1, np)
    >>> g = [np.full(4, 2.0**-3, np.float32)]
    >>> scale, s = next_sampler_state(p, initial_state(p, np), s, True, gradient_stats(g, np), True, np)
    >>> s.count, int(s.sample.step), float(s.sample.amax)
    (1, 0, 0.125)
    """
    auto = sampler.auto
    kept = _kept(sampled, sample, sampler.sample, xp)
    if isinstance(policy, AutoLossScale) and auto is not None:
        # A step known on the host to be unsampled gives the rule no statistics: it skips their ~30 ops.
        scale_state, auto = next_auto_state(
            policy, scale_state, auto, finite, None if sampled is False else kept, sampled, xp,
            micro_batches=micro_batches,
        )
    else:
        scale_state = next_state(policy.rule_params(), scale_state, finite, xp)
    return scale_state, SamplerState(_next_count(sampler.count, xp), kept, auto)


def advance_sampler_in_place(
    policy: LossScale, scale_views: LossScaleState, count: int, auto_views: AutoState | None, finite: bool
) -> int:
    """:func:`next_sampler_state` of a step known on the host to be unsampled, in numpy, in place on writable views
    (e.g. ``tensor.numpy()`` of CPU tensors) of the scale state and, for an ``AutoLossScale``, of its auto state;
    returns the new count (a Python int). Bit for bit the same numbers, at about 30 us where a framework's
    operators on 0-d CPU tensors take 170 us (``auto``'s rule: 1.3 ms). No statistics are read.

    >>> from lossscale import DynamicLossScale, initial_state
    >>> views = initial_state(DynamicLossScale(8.0, 1), np)
    >>> advance_sampler_in_place(DynamicLossScale(8.0, 1), views, 41, None, True), float(views.loss_scale)
    (42, 16.0)
    """
    if auto_views is None:
        advance_in_place(policy.rule_params(), scale_views, finite)
        return _next_count(count, np)
    scale = LossScaleState(*(view.copy() for view in scale_views))  # copies: no result may alias a view written before it
    sampler = SamplerState(count, None, AutoState(*(view.copy() for view in auto_views)))  # type: ignore[arg-type]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        new, after = next_sampler_state(policy, scale, sampler, np.bool_(finite), None, False, np)
    for view, value in [*zip(scale_views, new), *zip(auto_views, after.auto or ())]:
        view[...] = value
    return after.count


def counted_sampler_state(sampler: SamplerState, sample: GradientStats | None, sampled: Any, xp: Any) -> SamplerState:
    """The sampler state after a step whose scale moved by another rule (torch's ``GradScaler``, a shared scale):
    the kept sample, the count + 1, the auto state as it is. No host sync."""
    return SamplerState(_next_count(sampler.count, xp), _kept(sampled, sample, sampler.sample, xp), sampler.auto)


def _next_count(count: Any, xp: Any) -> Any:
    """``count + 1``, saturating at 2**31 - 1 (a Python int stays one)."""
    if isinstance(count, Integral):
        return min(int(count) + 1, COUNTER_MAX)
    return xp.where(count < COUNTER_MAX, count + 1, count)


def sampler_record(sampler: SamplerState, to_host: Any = np.asarray) -> dict[str, Any]:
    """A checkpoint's ``"lossscale_stats"`` entry: ``{"iteration": int, "auto": {field: to_host(array)}}`` (``auto``
    with an ``AutoLossScale`` only). Reading the count of a device array is one host sync."""
    out: dict[str, Any] = {"iteration": int(sampler.count)}
    if sampler.auto is not None:
        out["auto"] = {k: to_host(v) for k, v in sampler.auto._asdict().items()}
    return out


def read_sampler_record(record: Any, policy: LossScale) -> tuple[int, AutoState | None]:
    """``(count, auto state as numpy, or None but for an AutoLossScale)`` from :func:`sampler_record`'s output,
    every field checked first (ValueError naming the fix)."""
    iteration = record.get("iteration") if isinstance(record, Mapping) else None
    if isinstance(iteration, bool) or not isinstance(iteration, Integral) or not 0 <= int(iteration) <= COUNTER_MAX:
        raise ValueError(f"Invalid stats record {record!r}: expected StatsSampler.state_dict()'s output.")
    if not isinstance(policy, AutoLossScale):
        return int(iteration), None
    saved = record.get("auto")
    if not isinstance(saved, Mapping) or set(saved) != set(AutoState._fields):
        raise ValueError(
            "The checkpoint has no AutoLossScale state (saved with another policy?); "
            f"expected the keys {', '.join(AutoState._fields)}."
        )
    auto = AutoState(**{k: host_array(saved[k], np.int32 if k == "calm_steps" else np.float32) for k in AutoState._fields})
    if auto.window.shape != (policy.window,):
        raise ValueError(
            f"The checkpoint's AutoLossScale window has {auto.window.shape[0] if auto.window.ndim else 0} entries, "
            f"the policy {policy.window}: load it with the policy it was saved with."
        )
    return int(iteration), auto

