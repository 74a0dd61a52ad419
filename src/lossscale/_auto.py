"""``AutoLossScale`` (EXPERIMENTAL): a scale set from measured gradient statistics, and its rule
:func:`next_auto_state`, over an array namespace ``xp`` like :func:`lossscale.next_state` (no host sync, jittable)."""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, fields
from numbers import Integral
from typing import Any, NamedTuple

from ._errors import ArgumentTypeError, whole
from ._policy import COUNTER_MAX, LossScale, RuleParams, _extensions, _set, count, scale_bounds
from ._rule import LossScaleState, _finite_flag, count_up, skip_counters
from ._stats import LOG2_FLOAT16_MAX, GradientStats

__all__ = ["AutoLossScale", "AutoState", "check_stats_every", "initial_auto_state", "next_auto_state",
           "overflow_grid", "overflow_key", "overflow_outcome", "overflow_table", "table_key"]

#: log2 of float16's smallest normal.
_LOG2_TINY = -14.0
#: The scale's exponent stays within float32's normal powers of two.
_MAX_EXPONENT = 126.0
#: The margin's own limit: float16's range, smallest subnormal to max (a taller one acts no further).
_MARGIN_LIMIT = 40.0


@dataclass(frozen=True, repr=False)
class AutoLossScale(LossScale):
    """EXPERIMENTAL. A loss scale set in one jump from sampled gradient statistics.

    A binding that measures gradients (``stats_every=N``; 16 when not given) feeds each sample to
    :func:`next_auto_state`. In bits (log2): ``S = 2**e`` is the scale, ``m`` the current margin (``margin_bits``
    at the start), ``F = log2(65504)``, ``top`` and ``low`` the largest and the smallest ``log2(amax / S)``
    (unscaled) in the window of recent samples, ``lo`` the last sample's "enough" (below), and
    ``hi(m) = min(b(min(m, M)), max(b(m), lo - underflow_bits))`` with ``b(m) = floor(F - max(m + low,
    margin_bits + top))`` and ``M = max_margin_bits``: a margin past ``M`` lowers the bound only as far as the
    smallest tensor RMS stays at float16's smallest normal. Per step::

        if not finite and no sample measured yet:   # the start was a guess
            e = e - start_backoff_bits              # any start up to 2**32 in at most 2 skips
        elif not finite:                            # a spike passed F at e: it was over F - e - low bits tall
            m = min(max(ceil(F - e - low) + 1, min(2 m, M), m), 40)   # remember its height (doubling stops at M)
            e = min(hi(m), e - 1)                   # the bound of that margin, at least one bit down
        elif sampled and amax == 0:                 # everything flushed: search upwards
            e = e + search_bits
        elif sampled:
            window <- log2(amax / S)
            lo = ceil(-14 + underflow_bits - log2(rms_min / micro_batches / S))  # smallest RMS b bits above the floor
            hi = hi(m)                              # (with this lo) the spike m bits over the typical gradient fits
            if e < lo:  e = max(e, min(lo + 1, hi - 1, e + max_jump_bits))  # raise only when short of "enough"
            e = min(e, hi)                          # lower at once when too close to overflow
        S = clamp(2**e, min, max)
        sampled, after relax_steps finite steps in a row:  m = max(m - 1, margin_bits)

    The band ``[lo, hi]`` is the hysteresis; ``hi`` wins over ``lo``. Without statistics it runs the TF rule of
    :meth:`rule_params` (x2 after 2000 finite steps, /2 on overflow). docs/gradient_stats.md explains the rule.

    Args:
        initial_loss_scale: the scale at step 0 (2**15).
        min_loss_scale, max_loss_scale: the floor (1) and the ceiling (None: 2**126).
        margin_bits: ``m`` at the start and its floor (4).
        max_margin_bits: ``M``, where the margin stops doubling and the most room it keeps at a cost to the
            underflow room (16); past it the margin grows to a spike's height only, into the normal range only.
        window: samples of ``amax`` remembered for ``hi`` (16).
        underflow_bits: ``b``, bits between the smallest tensor RMS and float16's smallest normal (8).
        relax_steps: finite steps in a row after which ``m`` shrinks by one, at the next sampled step (2000).
            Only a sample moves the margin down, so between two samples an unsampled step changes nothing but
            the counters, or backs off: a binding can look that up (:func:`overflow_table`).
        search_bits: the jump when every sampled gradient is zero (12).
        max_jump_bits: the largest rise in one sample (16); lowering is not capped.
        start_backoff_bits: the backoff on an overflow before the first measured sample (16).

    >>> AutoLossScale(margin_bits=6).get_config()
    {'initial_loss_scale': 32768.0, 'margin_bits': 6}
    """

    dynamic = True
    initial_loss_scale: float = 2.0**15
    _: KW_ONLY
    min_loss_scale: float = 1.0
    max_loss_scale: float | None = None
    margin_bits: int = 4
    max_margin_bits: int = 16
    window: int = 16
    underflow_bits: int = 8
    relax_steps: int = 2000
    search_bits: int = 12
    max_jump_bits: int = 16
    start_backoff_bits: int = 16

    def __post_init__(self) -> None:
        initial, min_scale, max_scale = scale_bounds(self.initial_loss_scale, self.min_loss_scale, self.max_loss_scale)
        if initial > 2.0**_MAX_EXPONENT:  # the auto rule's exponent arithmetic stops at 2**126
            raise ValueError(f"initial_loss_scale={initial!r} is above 2**{_MAX_EXPONENT}; pick a smaller initial scale.")
        counted = [f.name for f in fields(self) if f.name.endswith(("bits", "window", "steps"))]
        counts = {name: count(name, getattr(self, name)) for name in counted}
        margin, most = counts["margin_bits"], counts["max_margin_bits"]
        if most < margin:
            raise ValueError(f"max_margin_bits={most} is below margin_bits={margin}; raise max_margin_bits (the margin "
                             "only grows from margin_bits).")
        if margin > 15:
            raise ValueError(f"margin_bits={margin} leaves no room below float16's max (2**16): use 1 to 15.")
        _set(self, initial_loss_scale=initial, min_loss_scale=min_scale, max_loss_scale=max_scale, **counts)

    @property
    def ceiling(self) -> float:
        """``max_loss_scale``, or 2**126 when it is None."""
        return 2.0**_MAX_EXPONENT if self.max_loss_scale is None else self.max_loss_scale

    def rule_params(self) -> RuleParams:
        """The TF rule used where no statistics are measured (see the class docstring)."""
        return RuleParams(
            True, self.initial_loss_scale, growth_interval=2000, growth_factor=2.0, backoff_divisor=2.0,
            min_scale=self.min_loss_scale, max_scale=self.ceiling,
        )

    def get_config(self) -> dict[str, Any]:
        return {"initial_loss_scale": self.initial_loss_scale, **_extensions(self)}


class AutoState(NamedTuple):
    """The state :class:`AutoLossScale` keeps beside the :class:`~lossscale.LossScaleState`.

    Attributes:
        margin: float32, the current margin ``m`` in bits.
        window: float32 ``(window,)``, recent ``log2(amax / S)`` (unscaled), ``-inf`` where empty.
        calm_steps: int32, finite steps since the margin last changed or the last overflow.
        lo, hi: float32, the last sample's bounds on ``log2 S`` (NaN before one; ``hi < lo``: no scale is
            both "enough" and under the remembered spike).
    """

    margin: Any
    window: Any
    calm_steps: Any
    lo: Any
    hi: Any


def initial_auto_state(policy: AutoLossScale, xp: Any, **array_kwargs: Any) -> AutoState:
    """The :class:`AutoState` at step 0 (``array_kwargs`` go to ``xp.asarray``/``xp.full``, e.g. ``device=``)."""
    def f32(value: float) -> Any:
        return xp.asarray(value, dtype=xp.float32, **array_kwargs)

    return AutoState(
        margin=f32(float(policy.margin_bits)),
        window=xp.full((policy.window,), -math.inf, dtype=xp.float32, **array_kwargs),
        calm_steps=xp.asarray(0, dtype=xp.int32, **array_kwargs),
        lo=f32(math.nan),
        hi=f32(math.nan),
    )


def _pow2(e: Any, xp: Any) -> Any:
    """``2**e`` for an integral float32 ``e``, exact (``exp2`` is not exact under XLA)."""
    one = xp.ones_like(e)
    return xp.ldexp(one, xp.asarray(e, dtype=xp.int32))


def _window_range(window: Any, xp: Any) -> tuple[Any, Any]:
    """``(top, low)``: the largest and the smallest filled entry of the window (``-inf``, ``+inf`` when empty)."""
    top = xp.max(window)
    low = -xp.max(xp.where(window > -math.inf, -window, -math.inf))
    return top, low


def _overflow_bound(policy: AutoLossScale, m: Any, top: Any, low: Any, floor: Any, xp: Any) -> Any:
    """``hi(m) = min(b(min(m, M)), max(b(m), floor))``, ``b(m) = floor(F - max(m + low, margin_bits + top))``,
    ``floor`` the normal-range floor ``lo - underflow_bits`` (see :class:`AutoLossScale`). As ``b`` falls with
    ``m``, computed as ``max(b(m), min(b(M), floor))``: about 15 operators."""
    spike_free = policy.margin_bits + top

    def bound(margin: Any) -> Any:
        need = margin + low
        return xp.floor(LOG2_FLOAT16_MAX - xp.where(need > spike_free, need, spike_free))

    full, capped = bound(m), bound(float(policy.max_margin_bits))
    floor = xp.where(capped < floor, capped, floor)
    return xp.where(full > floor, full, floor)


def _floor_log2(scale: Any, xp: Any) -> Any:
    """``floor(log2(scale))`` exactly, as float32, for a positive finite ``scale``: ``S = f * 2**k`` with ``f`` in
    ``[0.5, 1)`` by ``frexp`` (3 operators) where ``xp`` has it; else from ``log2``, corrected (about 10: XLA's CPU
    ``log2`` is a few ulps off at some powers of two)."""
    frexp = getattr(xp, "frexp", None)
    if frexp is not None:
        return xp.asarray(frexp(scale)[1] - 1, dtype=xp.float32)
    e = xp.floor(xp.log2(scale))
    e = xp.where(_pow2(e + 1.0, xp) <= scale, e + 1.0, e)
    return xp.where(_pow2(e, xp) > scale, e - 1.0, e)


def next_auto_state(
    policy: AutoLossScale, state: LossScaleState, auto: AutoState, finite: Any, stats: GradientStats | None,
    sampled: Any, xp: Any, *, micro_batches: Any = 1, overflow: tuple[Any, Any] | None = None,
) -> tuple[LossScaleState, AutoState]:
    """``(state, auto)`` after one step (the rule is in :class:`AutoLossScale`'s docstring).

    Args:
        state: the :class:`~lossscale.LossScaleState` this step's gradients were computed at.
        finite: as in :func:`lossscale.next_state`.
        stats: this step's :class:`~lossscale._stats.GradientStats` of the scaled gradients, or None.
        sampled: a 0-d bool array or Python bool, whether ``stats`` was measured on this step.
        micro_batches: the backward passes summed into the measured gradients (gradient accumulation): ``lo``
            reads ``rms_min / micro_batches``, so the scale suits one float16 backward; ``amax`` is read as is.
        overflow: :func:`overflow_outcome` of this state when the caller has it (a row of :func:`overflow_table`),
            or None to compute it here (about 50 operators).

    The skip counters move as in :func:`lossscale.next_state`; ``bad_steps`` stays 0. Cost, in torch operators
    dispatched (eager: each one kernel): about 175 on 0-d arrays and a few on the ``(window,)`` array (125 given
    ``overflow``), or about 80 with ``stats`` None (a step known on the host to be unsampled: the scale stays or
    backs off). No host sync.
    """
    finite = _finite_flag(finite, state.loss_scale, xp)
    if stats is not None and isinstance(sampled, bool):
        sampled = xp.full_like(finite, sampled)
    scale, good, bad, skipped, streak = state
    skipped, streak = skip_counters(skipped, streak, finite, xp)
    m = auto.margin
    e = _floor_log2(scale, xp)
    window = auto.window
    backed, overflow_m = overflow_outcome(policy, e, m, auto, xp) if overflow is None else overflow

    lo, hi = auto.lo, auto.hi
    calm = count_up(auto.calm_steps, xp)
    if stats is None:  # a step known to be unsampled: the scale stays or backs off, the margin waits for a sample
        new_scale = xp.where(finite, scale, backed)
        new_m = xp.where(finite, m, overflow_m)
        calm = xp.where(finite, calm, 0)
    else:
        log_s = e + xp.log2(scale / _pow2(e, xp))  # exact for the powers of two the rule produces
        amax, rms_min = stats.amax, stats.rms_min
        seen = sampled & finite & (amax > 0)
        x = xp.log2(xp.where(amax > 0, amax, 1.0)) - log_s
        first = xp.cumsum(xp.ones_like(window), 0) == 1  # the newest slot, on the window's device (no arange)
        pushed = xp.where(first, x, xp.roll(window, 1))
        window = xp.where(seen, pushed, window)
        r = xp.log2(xp.where(rms_min > 0, rms_min / micro_batches, 1.0)) - log_s
        lo_new = xp.where(rms_min > 0, xp.ceil(_LOG2_TINY + policy.underflow_bits - r), -math.inf)
        hi_new = _overflow_bound(policy, m, *_window_range(window, xp), lo_new - policy.underflow_bits, xp)
        up = xp.where(lo_new + 1 < hi_new - 1, lo_new + 1, hi_new - 1)
        up = xp.where(up > e + policy.max_jump_bits, e + policy.max_jump_bits, up)
        chosen = xp.where((e < lo_new) & (up > e), up, e)
        chosen = xp.where(chosen > hi_new, hi_new, chosen)  # lower at once, to hi
        searched = e + policy.search_bits
        target = xp.where(seen, chosen, xp.where(sampled & finite, searched, e))
        lo = xp.where(seen, lo_new, lo)
        hi = xp.where(seen, hi_new, hi)
        target = xp.clip(target, -math.inf, _MAX_EXPONENT)
        moved = xp.clip(_pow2(target, xp), policy.min_loss_scale, policy.ceiling)
        new_scale = xp.where(finite, xp.where(target != e, moved, scale), backed)
        relax = finite & sampled & (calm >= policy.relax_steps)
        new_m = xp.where(finite, xp.where(relax & (m - 1 >= policy.margin_bits), m - 1, m), overflow_m)
        calm = xp.where(finite & ~relax, calm, 0)
    good = xp.where(finite & (new_scale == scale), count_up(good, xp), 0)
    return LossScaleState(new_scale, good, bad, skipped, streak), AutoState(new_m, window, calm, lo, hi)


def overflow_outcome(policy: AutoLossScale, e: Any, m: Any, auto: AutoState, xp: Any) -> tuple[Any, Any]:
    """``(scale, margin)`` after an overflow at ``S`` with ``floor(log2 S) = e`` and margin ``m``, the rest of the
    state ``auto``'s: the rule's overflow branch (the class docstring's first two cases). Elementwise in ``e`` and
    ``m``: 0-d arrays for one step, or any broadcast shape (:func:`overflow_table` runs it on a grid).

    Cost: about 50 operators, whatever the shape of ``e`` and ``m``."""
    top, low = _window_range(auto.window, xp)
    # Overflow before any measured sample (lo is NaN): back off start_backoff_bits; after one: grow m, go to its hi.
    measured = auto.lo == auto.lo  # False for NaN
    filled = top > -math.inf
    guess = LOG2_FLOAT16_MAX - e - m  # an empty window: as if the scale sat at the margin
    top_ref, low_ref = xp.where(filled, top, guess), xp.where(filled, low, guess)
    implied = xp.ceil(LOG2_FLOAT16_MAX - e - low_ref) + 1.0
    doubled = xp.clip(2.0 * m, -math.inf, float(policy.max_margin_bits))
    doubled = xp.where(doubled > m, doubled, m)  # doubling stops at max_margin_bits; past it, only a spike's height
    grown = xp.where(implied > doubled, implied, doubled)
    grown = xp.clip(grown, -math.inf, _MARGIN_LIMIT)
    spike_hi = _overflow_bound(policy, grown, top_ref, low_ref, auto.lo - policy.underflow_bits, xp)  # NaN: unused
    spike_e = xp.where(spike_hi < e - 1, spike_hi, e - 1)
    backed_e = xp.where(measured, spike_e, e - policy.start_backoff_bits)
    backed = xp.clip(_pow2(xp.clip(backed_e, -_MAX_EXPONENT, math.inf), xp), policy.min_loss_scale, math.inf)
    return backed, xp.where(measured, grown, m)


#: The exponents ``floor(log2 S)`` of every positive finite float32, and the margins an :class:`AutoLossScale`
#: reaches (``0`` to ``_MARGIN_LIMIT`` bits, whole numbers): the grid of :func:`overflow_table`.
TABLE_EXPONENTS = (-149, 127)
TABLE_MARGINS = int(_MARGIN_LIMIT) + 1


def table_key(e: Any, m: Any) -> Any:
    """The row of :func:`overflow_table` for exponent ``e`` and margin ``m`` (float32, exact: under 2**24)."""
    return (e - TABLE_EXPONENTS[0]) * TABLE_MARGINS + m


def overflow_key(scale: Any, margin: Any, xp: Any) -> Any:
    """:func:`table_key` of a state: its scale's exponent ``floor(log2 S)`` and its margin (about 6 operators)."""
    return table_key(_floor_log2(scale, xp), margin)


def overflow_grid(like: Any, xp: Any) -> tuple[Any, Any]:
    """``(e, m)``: float32 arrays of shape ``(exponents, 1)`` and ``(1, margins)`` on ``like``'s device, the grid of
    :func:`overflow_table` (a binding may keep them: they never change)."""
    e0, e1 = TABLE_EXPONENTS
    ones = xp.ones_like(xp.reshape(like, (-1,))[:1], dtype=xp.float32)
    e = xp.reshape(xp.cumsum(xp.broadcast_to(ones, (e1 - e0 + 1,)), 0) + (e0 - 1.0), (-1, 1))
    m = xp.reshape(xp.cumsum(xp.broadcast_to(ones, (TABLE_MARGINS,)), 0) - 1.0, (1, -1))
    return e, m


def overflow_table(policy: AutoLossScale, auto: AutoState, xp: Any, grid: tuple[Any, Any] | None = None) -> Any:
    """Every overflow's outcome while ``auto``'s window and bounds stay: a float32 ``(rows, 3)`` array whose row
    :func:`table_key` ``(e, m)`` is ``(scale, margin, key)`` after an overflow at exponent ``e`` and margin ``m``
    (``key`` that of the state it leads to), for every float32 exponent and every whole margin 0 to 40.

    Between two samples the window and bounds of an ``AutoLossScale`` do not move, so an unsampled step is one row
    of this table on an overflow and two counters otherwise: a binding that looks the row up instead of running
    :func:`overflow_outcome` runs a handful of operators per unsampled step, where :func:`next_auto_state` runs
    about 80 (the torch binding does). The same bits, by construction: the table *is*
    :func:`overflow_outcome`, run once on the grid.

    Args:
        policy: the policy.
        auto: the state whose window and bounds the table is for (its margin is not read: the grid's are).
        xp: the array namespace.
        grid: :func:`overflow_grid`'s arrays, or None to make them (6 operators).

    Cost: :func:`overflow_outcome`'s operators and :func:`overflow_key`'s once, on arrays of 11,357 elements
    (about 130 KB); no host sync.
    """
    e, m = overflow_grid(auto.margin, xp) if grid is None else grid
    scale, margin = overflow_outcome(policy, e, m, auto, xp)
    key = overflow_key(scale, margin, xp)
    return xp.reshape(xp.stack([scale, margin, key], axis=-1), (-1, 3))


def check_stats_every(stats_every: Any, policy: LossScale) -> int | None:
    """``stats_every`` validated (None or an int >= 1; a whole float is its int); 16 for ``AutoLossScale`` when not
    given."""
    if stats_every is None:
        return 16 if isinstance(policy, AutoLossScale) else None
    stats_every = whole(stats_every)
    if isinstance(stats_every, bool) or not isinstance(stats_every, Integral):
        raise ArgumentTypeError(
            f"stats_every must be an int (measure every N-th step) or None (off), got {stats_every!r}."
        )
    every = int(stats_every)
    if every < 1:
        raise ValueError(f"stats_every must be at least 1 (or None to measure nothing), got {stats_every}.")
    if every > COUNTER_MAX:
        raise ValueError(
            f"stats_every must be at most 2**31 - 1 (the step counter is int32), got {stats_every}; "
            "pass None to measure nothing."
        )
    return every
