"""Advance one step: the one function every binding calls to move its state after a step, and its host twin.

A step ends with one question answered, "were all the gradients finite?", and three pieces of state to move:

- the scale (:class:`~lossscale.LossScaleState`): by the policy's rule, :func:`lossscale.next_state`, or
  :func:`~lossscale._auto.next_auto_state` for an :class:`~lossscale.AutoLossScale`;
- the skip counters inside it (``skipped_steps``, ``consecutive_skips``), which move in every mode;
- the statistics sampler (:class:`~lossscale._sampler.SamplerState`), with ``stats_every``: the step counted and
  the new sample kept where it was taken.

:func:`advance` moves all three over an array namespace ``xp`` (numpy, torch, jax.numpy, ``keras.ops``): no host
sync, traceable under ``jax.jit`` and ``torch.compile``. :func:`advance_in_place` is its host twin for a step known
on the host to be unsampled: the same numbers bit for bit, written into 0-d numpy views (torch and Keras keep CPU
state there, where a framework's operators on 0-d arrays cost far more than numpy scalars). A binding calls one of
the two from one place, its ``_state`` room; torch off the CPU may call GradScaler's fused kernel instead, where
:func:`lossscale._rule.kernel_form` proves it gives the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._auto import AutoLossScale, AutoState, next_auto_state
from ._policy import LossScale, RuleParams
from ._rule import HOST_SCALARS, LossScaleState, _finite_flag, _next_state, next_state, skip_counters
from ._sampler import SamplerState, kept_sample, next_count
from ._stats import GradientStats

__all__ = ["advance", "advance_in_place"]


def advance(
    policy: LossScale | RuleParams, scale: LossScaleState, finite: Any, xp: Any, *,
    sampler: SamplerState | None = None, sample: GradientStats | None = None, sampled: Any = False,
    micro_batches: Any = 1, moves_scale: bool = True, overflow: tuple[Any, Any] | None = None,
) -> tuple[LossScaleState, SamplerState | None]:
    """The scale state, and the sampler's when given, after one step whose gradients were all finite iff ``finite``.

    Args:
        policy: the :class:`~lossscale.LossScale` (or its :class:`~lossscale._policy.RuleParams`, for a policy
            that is not an ``AutoLossScale``).
        scale: the :class:`~lossscale.LossScaleState` the step's gradients were computed at, as ``xp`` arrays.
        finite: a 0-d bool array of ``xp`` or a Python/numpy bool: False if any gradient held NaN or +-Inf.
        xp: the array namespace of the state.
        sampler: the statistics sampler's state (``stats_every``), or None without statistics.
        sample: this step's :class:`~lossscale._stats.GradientStats` of the scaled gradients, or None when the step
            is known on the host not to be sampled.
        sampled: whether ``sample`` was measured on this step: a Python bool (known on the host) or a 0-d bool
            array (decided on the device).
        micro_batches: backward passes summed into the measured gradients (an ``AutoLossScale`` reads it).
        overflow: an ``AutoLossScale``'s overflow outcome when the caller looked it up
            (:func:`~lossscale._auto.overflow_table`); None: computed.
        moves_scale: False when another rule moved the scale (torch's GradScaler, a scale shared by several
            optimizers): ``loss_scale``, ``good_steps`` and ``bad_steps`` come back as the very objects given, and
            only the skip counters (and the sampler) move. An optimizer keeping its own skip counters beside a shared
            scale passes the shared scale's first three fields with its own two.

    Returns:
        ``(scale, sampler)`` after the step; ``sampler`` is None when None was given.

    Raises:
        TypeError: ``finite`` is not a bool or a 0-d bool array.

    Cost: the rule's scalar operators on 0-d arrays (about 20 for ``DynamicLossScale``, 6 with
    ``moves_scale=False``, about 80 for an unsampled ``AutoLossScale`` step and 175 for a sampled one), plus
    about 15 on the ``(T,)`` sample when ``sampled`` is an array. No host sync, no pass over the gradients.

    >>> from lossscale import DynamicLossScale, initial_state
    >>> p = DynamicLossScale(8.0, 2)
    >>> s, _ = advance(p, initial_state(p, np), True, np)
    >>> s, _ = advance(p, s, True, np)
    >>> float(s.loss_scale), int(s.good_steps)
    (16.0, 0)
    >>> s, _ = advance(p, s, False, np, moves_scale=False)
    >>> float(s.loss_scale), int(s.skipped_steps), int(s.consecutive_skips)
    (16.0, 1, 1)
    """
    if sampler is not None and not isinstance(policy, LossScale):
        raise TypeError("advance with a sampler needs the policy itself, not its RuleParams.")
    if not moves_scale:
        flag = _finite_flag(finite, scale.loss_scale, xp)
        skipped, streak = skip_counters(scale.skipped_steps, scale.consecutive_skips, flag, xp)
        scale = scale._replace(skipped_steps=skipped, consecutive_skips=streak)
    elif sampler is not None and sampler.auto is not None and isinstance(policy, AutoLossScale):
        # A step known on the host to be unsampled gives the rule no statistics: it skips their ~30 ops.
        kept = kept_sample(sampled, sample, sampler.sample, xp)
        scale, auto = next_auto_state(policy, scale, sampler.auto, finite, None if sampled is False else kept,
                                      sampled, xp, micro_batches=micro_batches, overflow=overflow)
        return scale, SamplerState(next_count(sampler.count, xp), kept, auto)
    else:
        scale = next_state(policy, scale, finite, xp)
    if sampler is None:
        return scale, None
    kept = kept_sample(sampled, sample, sampler.sample, xp)
    return scale, SamplerState(next_count(sampler.count, xp), kept, sampler.auto)


def advance_in_place(
    policy: LossScale | RuleParams, scale: LossScaleState, finite: bool, *, count: int | None = None,
    auto: AutoState | None = None, moves_scale: bool = True,
) -> int | None:
    """:func:`advance` of a step known on the host to be unsampled, in numpy, in place: the same numbers bit for bit.

    Args:
        policy: as in :func:`advance`.
        scale: writable 0-d numpy views of the scale state (e.g. ``tensor.numpy()`` of CPU tensors, or the numpy
            arrays behind Keras variables on the CPU). Written in place.
        finite: a Python or numpy bool.
        count: the sampler's step count (a Python int), or None without statistics.
        auto: writable views of the :class:`~lossscale._auto.AutoState` for an ``AutoLossScale`` (its unsampled
            rule: the scale stays or backs off); None otherwise.
        moves_scale: as in :func:`advance`.

    Returns:
        The new count (a Python int, saturating at 2**31 - 1), or None when ``count`` is None.

    Cost: a few microseconds of numpy scalar arithmetic (``AutoLossScale``: about 30); no framework operator.

    >>> from lossscale import DynamicLossScale, initial_state
    >>> views = initial_state(DynamicLossScale(8.0, 1), np)
    >>> advance_in_place(DynamicLossScale(8.0, 1), views, True, count=41), float(views.loss_scale)
    (42, 16.0)
    """
    new_count = None if count is None else next_count(count, np)
    if not moves_scale:
        skipped, streak = skip_counters(
            scale.skipped_steps[()], scale.consecutive_skips[()], bool(finite), HOST_SCALARS)
        scale.skipped_steps[...] = skipped
        scale.consecutive_skips[...] = streak
        return new_count
    if auto is None or not isinstance(policy, AutoLossScale):
        scalars = LossScaleState(*(view[()] for view in scale))
        with np.errstate(over="ignore"):  # a refused growth computes an inf on purpose
            params = policy if isinstance(policy, RuleParams) else policy.rule_params()  # inline: a hot path
            new = _next_state(params, scalars, np.bool_(finite), HOST_SCALARS)
        for view, value in zip(scale, new):
            view[...] = value
        return new_count
    # Copies: no result may alias a view written before it.
    before = LossScaleState(*(view.copy() for view in scale))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        after, moved = next_auto_state(policy, before, AutoState(*(view.copy() for view in auto)), np.bool_(finite),
                                       None, False, np)
    for view, value in [*zip(scale, after), *zip(auto, moved)]:
        view[...] = value
    return new_count
