"""The one statistics sampler over an array namespace ``xp``: when to measure, what to keep, and its checkpoint
record. A binding supplies the measurement and where the :class:`SamplerState` lives. Per step::

    sampled = is_due(every, count)                 # count % every == 0
    sample  = statistics of the scaled gradients   # by the binding's measure, only when sampled
    scale, sampler = advance(policy, scale, finite, xp, sampler=sampler, sample=sample, sampled=sampled)

(:func:`lossscale._advance.advance`, which also runs ``AutoLossScale``'s rule on the kept sample.)

``count`` is a Python int (torch: an unsampled step does no device work) or a 0-d int32 array (JAX, Keras);
``sampled`` then a Python bool or a 0-d bool array. No host sync either way."""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral
from typing import Any, NamedTuple

import numpy as np

from ._auto import TABLE_MARGINS, AutoLossScale, AutoState, check_stats_every, initial_auto_state
from ._policy import LossScale
from ._rule import COUNTER_MAX
from ._stats import GradientStats, empty_stats, host_array

__all__ = ["SamplerState", "check_stats_every", "initial_sampler_state", "is_due", "kept_sample", "next_count",
           "read_sampler_record", "sampler_record"]


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


def kept_sample(sampled: Any, new: GradientStats | None, old: GradientStats, xp: Any) -> GradientStats:
    """``new`` where ``sampled``, else ``old``: no operator for a Python bool, or when ``new`` is ``old``;
    otherwise one ``where`` per field of the ``(T,)`` sample."""
    if new is None or sampled is False or new is old:
        return old
    if sampled is True:
        return new
    return GradientStats(*(xp.where(sampled, n, o) for n, o in zip(new, old)))


def next_count(count: Any, xp: Any) -> Any:
    """``count + 1``, saturating at 2**31 - 1 (a Python int stays one: torch counts on the host)."""
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
    margin, calm = float(auto.margin), int(auto.calm_steps)
    if not (margin.is_integer() and 0 <= margin <= TABLE_MARGINS - 1) or calm < 0:
        raise ValueError(
            f"The checkpoint's AutoLossScale state has margin={margin!r} and calm_steps={calm}: the rule keeps the "
            f"margin a whole number of bits in [0, {TABLE_MARGINS - 1}] and calm_steps >= 0. Load a checkpoint "
            "saved by lossscale, unedited."
        )
    return int(iteration), auto

