"""The statistics sampler: when to measure, what to keep, and the scale rule that reads the sample.

Written once over an array namespace ``xp`` (numpy, torch, jax.numpy), like
:func:`lossscale.next_state`, and used by every binding. A binding supplies
only how to measure its gradients (the core's :func:`lossscale._stats.gradient_stats`
or its own kernels) and where the :class:`SamplerState` lives (tensors,
Keras variables, an optax state). Per step::

    sampled = is_due(every, count)                 # count % every == 0
    sample  = statistics of the scaled gradients   # by the binding, only when sampled
    scale, sampler = next_sampler_state(policy, scale, sampler, finite, sample, sampled, xp)

:func:`next_sampler_state` keeps the new sample (the previous one when not
sampled), runs :func:`lossscale._auto.next_auto_state` for an
:class:`~lossscale.AutoLossScale` and :func:`lossscale.next_state` otherwise,
and counts the step (every step, skipped ones included, saturating at
2**31 - 1); :func:`counted_sampler_state` only keeps and counts, for a
binding whose scale moves by its own rule (torch's ``GradScaler``, a
shared scale). ``count`` may be a Python int (torch keeps it on the host, so an
unsampled step does no device work at all) or a 0-d int32 array (JAX and
Keras keep it on the device, inside the compiled step); ``sampled`` then is a
Python bool or a 0-d bool array. No host sync either way.

A checkpoint keeps the count and the auto state: :func:`sampler_record` and
:func:`read_sampler_record` (which checks every field before anything is
built, so a bad record changes nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral
from typing import Any, NamedTuple

import numpy as np

from ._auto import AutoLossScale, AutoState, check_stats_every, initial_auto_state, next_auto_state
from ._policy import LossScale
from ._rule import COUNTER_MAX, LossScaleState, next_state
from ._stats import GradientStats, empty_stats

__all__ = [
    "SamplerState",
    "check_stats_every",
    "counted_sampler_state",
    "initial_sampler_state",
    "is_due",
    "next_sampler_state",
    "read_sampler_record",
    "sampler_record",
]


class SamplerState(NamedTuple):
    """What a binding keeps for ``stats_every``.

    Attributes:
        count: steps seen (int, or a 0-d int32 array); the step is sampled
            iff ``count % every == 0``, and the sample's ``step`` is the
            count it was taken at.
        sample: the latest :class:`lossscale._stats.GradientStats` (``step``
            -1 and every value NaN before the first).
        auto: the :class:`lossscale._auto.AutoState` of an ``AutoLossScale``,
            else None.
    """

    count: Any
    sample: GradientStats
    auto: AutoState | None


def initial_sampler_state(
    policy: LossScale, num_tensors: int, xp: Any, *, count: Any = 0, **array_kwargs: Any
) -> SamplerState:
    """The :class:`SamplerState` at step 0 for ``num_tensors`` gradients.

    ``count`` is 0 as a Python int; pass ``xp.asarray(0, dtype=xp.int32)``
    to keep it on the device. ``array_kwargs`` go to ``xp.asarray``/``xp.full``
    (e.g. ``device=``).

    >>> s = initial_sampler_state(AutoLossScale(), 2, np)
    >>> s.count, int(s.sample.step), s.sample.tensor_amax.shape, float(s.auto.margin)
    (0, -1, (2,), 4.0)
    """
    auto = initial_auto_state(policy, xp, **array_kwargs) if isinstance(policy, AutoLossScale) else None
    return SamplerState(count, empty_stats(num_tensors, xp, **array_kwargs), auto)


def is_due(every: int, count: Any) -> Any:
    """Whether the step at ``count`` is sampled: a Python bool for an int count, a 0-d bool array for an array."""
    return count % every == 0


def _kept(sampled: Any, new: GradientStats | None, old: GradientStats, xp: Any) -> GradientStats:
    """``new`` where ``sampled``, else ``old`` (field by field; no op for a Python bool, or when ``new`` is ``old``:
    a binding that chose the sample already, e.g. in a ``cond``)."""
    if new is None or sampled is False or new is old:
        return old
    if sampled is True:
        return new
    return GradientStats(*(xp.where(sampled, n, o) for n, o in zip(new, old)))


def next_sampler_state(
    policy: LossScale,
    scale_state: LossScaleState,
    sampler: SamplerState,
    finite: Any,
    sample: GradientStats | None,
    sampled: Any,
    xp: Any,
    *,
    micro_batches: Any = 1,
) -> tuple[LossScaleState, SamplerState]:
    """The scale state and sampler state after one step.

    Args:
        policy: the optimizer's policy; an :class:`~lossscale.AutoLossScale`
            sets the scale from the samples, any other runs its TF rule.
        scale_state: the :class:`~lossscale.LossScaleState` the step's
            gradients were computed at.
        sampler: the :class:`SamplerState`.
        finite: the step's finite flag, as in :func:`lossscale.next_state`.
        sample: this step's statistics of the scaled gradients (None, or
            anything when not ``sampled``: the previous sample is kept).
        sampled: :func:`is_due` of ``sampler.count``.
        xp: the array namespace.
        micro_batches: how many backward passes were summed into the
            gradients (gradient accumulation); the auto rule reads the
            sample as that many float16 backwards (see
            :func:`lossscale._auto.next_auto_state`).

    Cost: about 15 ops on the ``(T,)`` sample when ``sampled`` is an array
    (none for a Python bool), plus the rule's scalar ops. No host sync.

    >>> from lossscale import DynamicLossScale, initial_state
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


def counted_sampler_state(sampler: SamplerState, sample: GradientStats | None, sampled: Any, xp: Any) -> SamplerState:
    """The sampler state after a step whose scale the binding advanced by its own rule: the kept sample, the count + 1.

    For a binding whose scale moves elsewhere (torch's ``GradScaler`` and a
    scale shared by several optimizers advance once per iteration, with the
    TF rule); the auto state is left as it is. Cost as :func:`next_sampler_state`
    without the rule. No host sync.
    """
    return SamplerState(_next_count(sampler.count, xp), _kept(sampled, sample, sampler.sample, xp), sampler.auto)


def _next_count(count: Any, xp: Any) -> Any:
    """``count + 1``, saturating at 2**31 - 1 (a Python int stays one)."""
    if isinstance(count, Integral):
        return min(int(count) + 1, COUNTER_MAX)
    return xp.where(count < COUNTER_MAX, count + 1, count)


def sampler_record(sampler: SamplerState, to_host: Any = np.asarray) -> dict[str, Any]:
    """A checkpoint's ``"lossscale_stats"`` entry: ``{"iteration": int, "auto": {field: array}}``.

    ``auto`` is present only with an ``AutoLossScale``; ``to_host`` turns each
    of its arrays into what the checkpoint stores (numpy by default; torch
    keeps tensors). Reading the count of a device array is one host sync.
    """
    out: dict[str, Any] = {"iteration": int(sampler.count)}
    if sampler.auto is not None:
        out["auto"] = {k: to_host(v) for k, v in sampler.auto._asdict().items()}
    return out


def read_sampler_record(record: Any, policy: LossScale) -> tuple[int, AutoState | None]:
    """``(count, auto state as numpy)`` from :func:`sampler_record`'s output, every field checked first.

    The auto state is None unless ``policy`` is an :class:`~lossscale.AutoLossScale`,
    whose record must hold all of :class:`~lossscale._auto.AutoState`'s fields with the
    policy's window length. Raises ValueError naming the fix; nothing is built before every check passed.

    >>> read_sampler_record({"iteration": 7}, AutoLossScale())
    Traceback (most recent call last):
    ...
    ValueError: The checkpoint has no AutoLossScale state (saved with another policy?); expected the keys margin, window, calm_steps, lo, hi.
    """
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
    auto = AutoState(**{k: _host(saved[k], np.int32 if k == "calm_steps" else np.float32) for k in AutoState._fields})
    if auto.window.shape != (policy.window,):
        raise ValueError(
            f"The checkpoint's AutoLossScale window has {auto.window.shape[0] if auto.window.ndim else 0} entries, "
            f"the policy {policy.window}: load it with the policy it was saved with."
        )
    return int(iteration), auto


def _host(value: Any, dtype: Any) -> np.ndarray:
    """A checkpoint value (numpy, a number, or a framework tensor with ``.cpu()``) as a numpy array of ``dtype``."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.array(value, dtype=dtype)
