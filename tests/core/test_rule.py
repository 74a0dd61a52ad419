"""The one update rule (`lossscale.next_state`) against TF's and contrib's rules.

Three layers:

* tables: TF's own sequences from the issue, then tables written by hand from
  the rule as the issue states it;
* an independent plain-Python transcription of TF's ``DynamicLossScale.update``
  and contrib's ``ExponentialUpdateLossScaleManager.update_loss_scale``
  (float32 arithmetic emulated exactly: every op on float32 inputs is computed
  in float64 and rounded once to float32, which is correctly rounded for
  + - * / since 53 >= 2 * 24 + 2);
* long random finite/non-finite sequences, run through ``next_state`` with
  numpy as the namespace and through ``lossscale._advance.advance_in_place`` (the host path),
  compared with the transcription bit for bit.

numpy only: torch and JAX run the same rule against this numpy reference in
``tests/torch/test_rule_torch.py`` and ``tests/jax/test_rule_jax.py``.
"""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest

import lossscale
from lossscale import (
    DynamicLossScale,
    ExponentialUpdateLossScaleManager,
    FixedLossScale,
    FixedLossScaleManager,
    LossScaleState,
    initial_state,
    next_state,
)
from lossscale._advance import advance_in_place
from tests.reference import POLICIES, trajectory

INT32_MAX = 2**31 - 1
F32_MAX = float(np.finfo(np.float32).max)


# ----------------------------------------------------------------------------- helpers


def f32(x: float) -> float:
    """``x`` rounded to float32 (to +-inf beyond its range), as a Python float."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def bits(x) -> int:
    """The float32 bit pattern of a float that is exactly a float32 (as the trajectories' scales are)."""
    assert float(np.float32(x)) == x, x
    return int(np.asarray(x, dtype=np.float32).view(np.int32))


def as_tuple(state: LossScaleState) -> tuple:
    """(scale, good, bad, skipped, streak) as Python numbers."""
    return tuple(float(v) if i == 0 else int(v) for i, v in enumerate(state))


def host(policy):
    """A ``trajectory`` backend: advance_in_place, the same rule on numpy scalars in place on 0-d arrays."""
    views = initial_state(policy, np)
    params = policy.rule_params()

    def step(finite: bool):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a refused growth must stay silent here too
            advance_in_place(params, views, finite)
        assert views.loss_scale.dtype == np.float32 and all(t.dtype == np.int32 for t in views[1:])
        return views

    return step


def run_np(policy, finites) -> list[LossScaleState]:
    """Every state after each step (as Python numbers), from ``next_state`` over numpy."""
    return [LossScaleState(*t) for t in trajectory(policy, finites, "numpy")]


def run_host(policy, finites) -> list[LossScaleState]:
    return [LossScaleState(*t) for t in trajectory(policy, finites, host)]


def scales(states) -> list[float]:
    return [float(s.loss_scale) for s in states]


F, N = True, False  # a finite step, a non-finite step


# ----------------------------------------------------------------------------- the references


def tf_dynamic_reference(initial, period, multiplier, finites):
    """TF's ``DynamicLossScale.update`` (tensorflow/python/training/experimental/loss_scale.py), transcribed.

    ``_num_good_steps`` and ``_current_loss_scale`` (float32) are the state::

        if is_finite:
            if num_good_steps + 1 >= increment_period:
                new = scale * multiplier; if isfinite(new): scale = new   # _assign_if_finite
                num_good_steps = 0
            else:
                num_good_steps += 1
        else:
            num_good_steps = 0
            scale = maximum(scale / multiplier, 1)

    Yields (scale, num_good_steps) after every step.
    """
    scale, good = f32(initial), 0
    mult = f32(multiplier)
    for finite in finites:
        if finite:
            if good + 1 >= period:
                new = f32(scale * mult)
                if math.isfinite(new):
                    scale = new
                good = 0
            else:
                good += 1
        else:
            good = 0
            scale = max(f32(scale / mult), 1.0)
        yield scale, good


def contrib_reference(init, incr_every, decr_every, incr_ratio, decr_ratio, finites):
    """contrib's ``ExponentialUpdateLossScaleManager.update_loss_scale``, transcribed.

    ::

        if finite:
            if good + 1 >= incr_every_n_steps:
                scale = scale * incr_ratio if isfinite(scale * incr_ratio) else scale
                good = bad = 0                 # _reset_stats
            else:
                good += 1
        else:
            if bad + 1 >= decr_every_n_nan_or_inf:
                scale = maximum(1., scale * decr_ratio)
                good = bad = 0                 # _reset_stats
            else:
                bad += 1; good = 0

    Yields (scale, good, bad) after every step.
    """
    scale, good, bad = f32(init), 0, 0
    up, down = f32(incr_ratio), f32(decr_ratio)
    for finite in finites:
        if finite:
            if good + 1 >= incr_every:
                new = f32(scale * up)
                scale = new if math.isfinite(new) else scale
                good = bad = 0
            else:
                good += 1
        else:
            if bad + 1 >= decr_every:
                scale = max(1.0, f32(scale * down))
                good = bad = 0
            else:
                bad += 1
                good = 0
        yield scale, good, bad


def extended_reference(
    initial, period, multiplier, finites, *, min_scale=1.0, max_scale=None, backoff_factor=None, hysteresis=1
):
    """The issue's rule with the keyword-only extensions (DynamicLossScale's docstring).

    Yields (scale, good, bad, skipped, streak).
    """
    scale, good, bad, skipped, streak = f32(initial), 0, 0, 0, 0
    mult = f32(multiplier)
    lo = f32(min_scale)
    hi = None if max_scale is None else f32(max_scale)
    for finite in finites:
        if finite:
            streak = 0
            good += 1
            if good >= period:
                new = f32(scale * mult)
                if math.isfinite(new):
                    scale = new if hi is None else min(new, hi)
                good = bad = 0
        else:
            skipped += 1
            streak += 1
            good = 0
            bad += 1
            if bad >= hysteresis:
                new = f32(scale / mult) if backoff_factor is None else f32(scale * f32(backoff_factor))
                scale = max(new, lo)
                bad = 0
        yield scale, good, bad, skipped, streak


# ----------------------------------------------------------------------------- TF's own tables


def test_tf_table_growth_1_2_2():
    """TF's test: DynamicLossScale(1, 2, 2) given six finite steps gives 1, 2, 2, 4, 4, 8."""
    policy = DynamicLossScale(1, 2, 2)
    assert scales(run_np(policy, [F] * 6)) == scales(run_host(policy, [F] * 6)) == [1, 2, 2, 4, 4, 8]


def test_tf_table_backoff_from_16():
    """TF's test: init 16 given non-finite steps gives 8, 4, 2, 1, 1, 1."""
    policy = DynamicLossScale(16, 2, 2)
    assert scales(run_np(policy, [N] * 6)) == scales(run_host(policy, [N] * 6)) == [8, 4, 2, 1, 1, 1]


def test_doctest_sequence_matches_reference():
    got = [(s, g) for s, g in tf_dynamic_reference(1, 2, 2, [F] * 6)]
    assert got == [(1, 1), (2, 0), (2, 1), (4, 0), (4, 1), (8, 0)]


# ----------------------------------------------------------------------------- tables from the rule


@pytest.mark.parametrize("run", [run_np, run_host], ids=["numpy", "host"])
class TestDynamicTables:
    def test_counter_counts_finite_steps_and_resets_at_the_period(self, run):
        states = run(DynamicLossScale(8, 3, 2), [F, F, F, F, F, F, F])
        assert [as_tuple(s)[:2] for s in states] == [
            (8, 1), (8, 2), (16, 0), (16, 1), (16, 2), (32, 0), (32, 1),
        ]

    def test_non_finite_resets_the_counter_and_halves(self, run):
        states = run(DynamicLossScale(64, 3, 2), [F, F, N, F, F, F])
        assert [as_tuple(s)[:2] for s in states] == [(64, 1), (64, 2), (32, 0), (32, 1), (32, 2), (64, 0)]

    def test_period_one_grows_every_finite_step(self, run):
        assert scales(run(DynamicLossScale(1, 1, 2), [F] * 5)) == [2, 4, 8, 16, 32]

    def test_floor_is_one(self, run):
        assert scales(run(DynamicLossScale(3, 10, 2), [N, N, N, N])) == [1.5, 1, 1, 1]

    def test_floor_is_one_with_another_multiplier(self, run):
        assert scales(run(DynamicLossScale(10, 10, 4), [N, N, N])) == [2.5, 1, 1]

    def test_growth_refused_when_the_product_overflows_float32(self, run):
        # 2**127 * 2 = 2**128 is +inf in float32: the scale stays, the counter still resets.
        states = run(DynamicLossScale(2.0**126, 1, 2), [F, F, F])
        assert [as_tuple(s)[:2] for s in states] == [(2.0**127, 0), (2.0**127, 0), (2.0**127, 0)]

    def test_growth_up_to_float32_max_then_refused(self, run):
        # F32_MAX / 2 * 2 is exactly F32_MAX (finite): accepted; F32_MAX * 2 and * 1.5 overflow: refused.
        states = run(DynamicLossScale(F32_MAX / 2, 2, 2), [F, F, F, F])
        assert scales(states) == [F32_MAX / 2, F32_MAX, F32_MAX, F32_MAX]
        assert scales(run(DynamicLossScale(F32_MAX, 1, 1.5), [F, F, N])) == [F32_MAX, F32_MAX, f32(F32_MAX / 1.5)]

    def test_non_integer_multiplier(self, run):
        states = run(DynamicLossScale(2, 1, 1.5), [F, F, N, N])
        assert scales(states) == [3, 4.5, 3, 2]

    def test_a_table_mixing_everything(self, run):
        finites = [F, F, N, F, F, F, F, N, N, F, F, F]
        want = [(s, g) for s, g in tf_dynamic_reference(4, 2, 2, finites)]
        got = [as_tuple(s)[:2] for s in run(DynamicLossScale(4, 2, 2), finites)]
        assert got == want == [
            (4, 1), (8, 0), (4, 0), (4, 1), (8, 0), (8, 1), (16, 0), (8, 0), (4, 0), (4, 1), (8, 0), (8, 1),
        ]

    def test_skip_counters(self, run):
        states = run(DynamicLossScale(4, 2, 2), [N, N, F, N, F, F])
        assert [as_tuple(s)[3:] for s in states] == [(1, 1), (2, 2), (2, 0), (3, 1), (3, 0), (3, 0)]

    def test_min_loss_scale_extension(self, run):
        states = run(DynamicLossScale(64, 5, 2, min_loss_scale=16), [N, N, N, N])
        assert scales(states) == [32, 16, 16, 16]
        # A floor below 1 lets the scale go under TF's floor.
        states = run(DynamicLossScale(1, 5, 2, min_loss_scale=0.25), [N, N, N, N])
        assert scales(states) == [0.5, 0.25, 0.25, 0.25]

    def test_max_loss_scale_extension_clamps_growth(self, run):
        states = run(DynamicLossScale(8, 1, 2, max_loss_scale=50), [F, F, F, F, N, F])
        assert scales(states) == [16, 32, 50, 50, 25, 50]

    def test_backoff_factor_extension(self, run):
        states = run(DynamicLossScale(100, 5, 2, backoff_factor=0.5), [N, N])
        assert scales(states) == [50, 25]
        states = run(DynamicLossScale(100, 5, 2, backoff_factor=0.8), [N])
        assert bits(states[0].loss_scale) == bits(np.float32(f32(100 * f32(0.8))))

    def test_hysteresis_extension(self, run):
        # Backs off on every 3rd non-finite step counted since the scale last changed.
        states = run(DynamicLossScale(64, 2, 2, hysteresis=3), [N, N, F, N, N, N])
        assert [as_tuple(s)[:3] for s in states] == [
            (64, 0, 1), (64, 0, 2), (64, 1, 2), (32, 0, 0), (32, 0, 1), (32, 0, 2),
        ]

    def test_defaults_are_tf_defaults(self, run):
        policy = DynamicLossScale()
        assert (policy.initial_loss_scale, policy.increment_period, policy.multiplier) == (2.0**15, 2000, 2.0)
        states = run(policy, [F] * 2000 + [N])
        assert [as_tuple(s)[:2] for s in states[1996:]] == [
            (2.0**15, 1997), (2.0**15, 1998), (2.0**15, 1999), (2.0**16, 0), (2.0**15, 0),
        ]


@pytest.mark.parametrize("run", [run_np, run_host], ids=["numpy", "host"])
class TestContribTables:
    def test_decrease_after_n_bad_steps_with_ratio_0_8(self, run):
        policy = ExponentialUpdateLossScaleManager(100, 1000)  # decr every 2, ratio 0.8
        states = run(policy, [N, N, N, N])
        want = [100, f32(100 * f32(0.8)), f32(100 * f32(0.8)), f32(f32(100 * f32(0.8)) * f32(0.8))]
        assert [bits(s.loss_scale) for s in states] == [bits(np.float32(w)) for w in want]
        assert [as_tuple(s)[1:3] for s in states] == [(0, 1), (0, 0), (0, 1), (0, 0)]

    def test_floor_at_one(self, run):
        states = run(ExponentialUpdateLossScaleManager(1.1, 1000, 1), [N, N, N])
        assert scales(states) == [1, 1, 1]

    def test_good_step_resets_bad_count_only_when_scale_changes(self, run):
        policy = ExponentialUpdateLossScaleManager(8, 3, 3)
        states = run(policy, [N, F, N, F, F, F, N])
        # bad keeps counting across good steps; it is reset when the scale grows on the 3rd good step in a row.
        assert [as_tuple(s)[:3] for s in states] == [
            (8, 0, 1), (8, 1, 1), (8, 0, 2), (8, 1, 2), (8, 2, 2), (16, 0, 0), (16, 0, 1),
        ]

    def test_bad_step_resets_good_count(self, run):
        policy = ExponentialUpdateLossScaleManager(8, 3, 5)
        states = run(policy, [F, F, N, F, F, F])
        assert [as_tuple(s)[:3] for s in states] == [
            (8, 1, 0), (8, 2, 0), (8, 0, 1), (8, 1, 1), (8, 2, 1), (16, 0, 0),
        ]

    def test_bad_count_accumulates_across_good_steps_to_a_decrease(self, run):
        policy = ExponentialUpdateLossScaleManager(8, 100, 2, decr_ratio=0.5)
        states = run(policy, [N, F, F, N])
        assert [as_tuple(s)[:3] for s in states] == [(8, 0, 1), (8, 1, 1), (8, 2, 1), (4, 0, 0)]

    def test_growth_refused_on_overflow_still_resets_counts(self, run):
        policy = ExponentialUpdateLossScaleManager(2.0**127, 2, 3, incr_ratio=2)
        states = run(policy, [N, F, F])
        assert [as_tuple(s)[:3] for s in states] == [(2.0**127, 0, 1), (2.0**127, 1, 1), (2.0**127, 0, 0)]

    def test_matches_reference_table(self, run):
        finites = [F, N, F, F, N, N, F, F, F, N, F, F, N, N, N]
        policy = ExponentialUpdateLossScaleManager(50, 2, 2, incr_ratio=3, decr_ratio=0.6)
        want = list(contrib_reference(50, 2, 2, 3, 0.6, finites))
        got = [as_tuple(s)[:3] for s in run(policy, finites)]
        assert [(bits(np.float32(a)), b, c) for a, b, c in want] == [(bits(np.float32(a)), b, c) for a, b, c in got]


@pytest.mark.parametrize("run", [run_np, run_host], ids=["numpy", "host"])
@pytest.mark.parametrize("policy", [FixedLossScale(128), FixedLossScaleManager(5000), FixedLossScale(1)], ids=repr)
def test_fixed_never_moves(run, policy):
    finites = [F, N, N, F, F, F, N] * 5
    states = run(policy, finites)
    assert set(scales(states)) == {policy.initial_scale}
    assert {int(s.good_steps) for s in states} == {0} and {int(s.bad_steps) for s in states} == {0}
    # ... but the skip counters move: a non-finite step is skipped in every mode.
    assert int(states[-1].skipped_steps) == finites.count(N)
    assert int(states[-1].consecutive_skips) == 1


# ----------------------------------------------------------------------------- saturation


def test_skip_counters_saturate():
    xp = np
    policy = DynamicLossScale(4, 2, 2)
    top = xp.asarray(INT32_MAX, dtype=xp.int32)
    state = initial_state(policy, xp)._replace(skipped_steps=top, consecutive_skips=top)
    for _ in range(3):
        state = next_state(policy, state, xp.asarray(False), xp)
        assert int(state.skipped_steps) == INT32_MAX and int(state.consecutive_skips) == INT32_MAX
    state = next_state(policy, state, xp.asarray(True), xp)
    assert int(state.skipped_steps) == INT32_MAX and int(state.consecutive_skips) == 0


def test_good_counter_at_the_largest_period():
    xp = np
    policy = DynamicLossScale(4, INT32_MAX, 2)
    state = initial_state(policy, xp)._replace(good_steps=xp.asarray(INT32_MAX - 2, dtype=xp.int32))
    state = next_state(policy, state, xp.asarray(True), xp)
    assert (float(state.loss_scale), int(state.good_steps)) == (4, INT32_MAX - 1)
    state = next_state(policy, state, xp.asarray(True), xp)
    assert (float(state.loss_scale), int(state.good_steps)) == (8, 0)


def test_hysteresis_counter_at_the_largest_value():
    xp = np
    policy = DynamicLossScale(4, 2, 2, hysteresis=INT32_MAX)
    state = initial_state(policy, xp)._replace(bad_steps=xp.asarray(INT32_MAX - 1, dtype=xp.int32))
    state = next_state(policy, state, xp.asarray(False), xp)
    assert (float(state.loss_scale), int(state.bad_steps)) == (2, 0)


# ----------------------------------------------------------------------------- random sequences, bit for bit


def _random_finites(seed: int, n: int, p_bad: float) -> list[bool]:
    rng = random.Random(seed)
    return [rng.random() >= p_bad for _ in range(n)]


TF_CASES = [
    # (initial, period, multiplier, p_bad)
    (2.0**15, 3, 2.0, 0.2),
    (1.0, 1, 2.0, 0.1),  # grows every step into float32's overflow and back
    (2.0**100, 1, 2.0, 0.05),
    (7.0, 4, 3.0, 0.3),
    (1000.0, 2, 1.1, 0.4),
    (123.456, 5, 1.7, 0.25),
    (2.0**24 + 1, 2, 1.3, 0.5),
]


@pytest.mark.parametrize("case", TF_CASES, ids=str)
def test_random_sequences_match_tf_reference_bit_for_bit(case):
    initial, period, multiplier, p_bad = case
    finites = _random_finites(hash(case) & 0xFFFF, 600, p_bad)
    policy = DynamicLossScale(initial, period, multiplier)
    want = list(tf_dynamic_reference(initial, period, multiplier, finites))
    got_np = run_np(policy, finites)
    got_host = run_host(policy, finites)
    want_bits = [(bits(s), g) for s, g in want]
    assert [(bits(s.loss_scale), int(s.good_steps)) for s in got_np] == want_bits
    assert [as_tuple(s) for s in got_host] == [as_tuple(s) for s in got_np]
    # The skip counters count non-finite steps, in total and in a row.
    skipped = streak = 0
    for fin, s_np, s_t in zip(finites, got_np, got_host):
        skipped += not fin
        streak = 0 if fin else streak + 1
        assert int(s_np.skipped_steps) == int(s_t.skipped_steps) == skipped
        assert int(s_np.consecutive_skips) == int(s_t.consecutive_skips) == streak
        assert int(s_np.bad_steps) == int(s_t.bad_steps) == 0  # hysteresis 1: never counts
    # The sequence exercised growth, backoff and (for the period-1 cases) the float32 ceiling.
    seen = {s for s, _ in want}
    assert len(seen) > 3
    if period == 1 and multiplier == 2.0:
        assert 2.0**127 in seen  # the growth refused at float32's ceiling was exercised


CONTRIB_CASES = [
    # (init, incr_every, decr_every, incr_ratio, decr_ratio, p_bad)
    (2.0**15, 3, 2, 2.0, 0.8, 0.3),
    (100.0, 1, 1, 2.0, 0.8, 0.2),
    (5000.0, 4, 3, 1.5, 0.5, 0.45),
    (1.0, 2, 2, 3.0, 0.3, 0.35),
    (2.0**120, 1, 2, 2.0, 0.9, 0.15),
]


@pytest.mark.parametrize("case", CONTRIB_CASES, ids=str)
def test_random_sequences_match_contrib_reference_bit_for_bit(case):
    init, incr, decr, up, down, p_bad = case
    finites = _random_finites(hash(case) & 0xFFFF, 600, p_bad)
    policy = ExponentialUpdateLossScaleManager(init, incr, decr, up, down)
    want = [(bits(s), g, b) for s, g, b in contrib_reference(init, incr, decr, up, down, finites)]
    for got in (run_np(policy, finites), run_host(policy, finites)):
        assert [(bits(s.loss_scale), int(s.good_steps), int(s.bad_steps)) for s in got] == want
    assert len({w[0] for w in want}) > 3


EXTENDED_CASES = [
    {"initial": 64.0, "period": 2, "multiplier": 2.0, "min_scale": 4.0, "max_scale": 1024.0},
    {"initial": 1.0, "period": 1, "multiplier": 2.0, "min_scale": 0.125, "max_scale": None},
    {"initial": 300.0, "period": 3, "multiplier": 2.0, "backoff_factor": 0.7, "hysteresis": 2},
    {"initial": 2.0**15, "period": 2, "multiplier": 1.5, "max_scale": 5e4, "hysteresis": 3, "min_scale": 8.0},
]


@pytest.mark.parametrize("case", EXTENDED_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_random_sequences_match_extended_reference_bit_for_bit(case):
    case = dict(case)
    initial, period, multiplier = case.pop("initial"), case.pop("period"), case.pop("multiplier")
    finites = _random_finites(period * 7919 + int(initial), 600, 0.3)
    policy = DynamicLossScale(
        initial,
        period,
        multiplier,
        min_loss_scale=case.get("min_scale", 1.0),
        max_loss_scale=case.get("max_scale"),
        backoff_factor=case.get("backoff_factor"),
        hysteresis=case.get("hysteresis", 1),
    )
    want = [
        (bits(s), g, b, k, r) for s, g, b, k, r in extended_reference(initial, period, multiplier, finites, **case)
    ]
    for got in (run_np(policy, finites), run_host(policy, finites)):
        assert [(bits(s.loss_scale), *as_tuple(s)[1:]) for s in got] == want


def test_a_resumed_state_continues_the_same_trajectory():
    """Feeding a mid-run state back in continues the same trajectory (state is all there is)."""
    policy = ExponentialUpdateLossScaleManager(2.0**10, 3, 2)
    finites = _random_finites(5, 400, 0.3)
    full = run_np(policy, finites)
    state = LossScaleState(
        np.float32(full[199].loss_scale), *(np.asarray(c, dtype=np.int32) for c in full[199][1:])
    )
    rest = []
    for fin in finites[200:]:
        state = next_state(policy, state, np.asarray(fin), np)
        rest.append(as_tuple(state))
    assert [as_tuple(s) for s in full[200:]] == rest


def test_rule_params_accepted_in_place_of_policy():
    policy = DynamicLossScale(4, 2, 2)
    params = policy.rule_params()
    state_a = state_b = initial_state(policy, np)
    for fin in [F, F, N, F]:
        state_a = next_state(policy, state_a, np.asarray(fin), np)
        state_b = next_state(params, state_b, np.asarray(fin), np)
        assert as_tuple(state_a) == as_tuple(state_b)


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_state_dtypes_stay_float32_and_int32(policy):
    state = initial_state(policy, np)
    with np.errstate(over="ignore"):
        for fin in [F, N, F, F, N, N, F]:
            state = next_state(policy, state, np.asarray(fin), np)
            assert state.loss_scale.dtype == np.float32 and state.loss_scale.ndim == 0
            assert all(t.dtype == np.int32 and t.ndim == 0 for t in state[1:])


def test_initial_state_dtypes_and_values():
    for xp in (np,):
        s = initial_state(DynamicLossScale(2048, 500), xp)
        assert isinstance(s, LossScaleState)
        assert as_tuple(s) == (2048.0, 0, 0, 0, 0)
        assert s.loss_scale.dtype == xp.float32
        assert all(t.dtype == xp.int32 for t in s[1:])


def test_rule_is_pure():
    """next_state does not modify the state it is given."""
    policy = DynamicLossScale(4, 1, 2)
    for xp in (np,):
        s0 = initial_state(policy, xp)
        before = as_tuple(s0)
        next_state(policy, s0, xp.asarray(True), xp)
        next_state(policy, s0, xp.asarray(False), xp)
        assert as_tuple(s0) == before


def test_refused_growth_is_silent_with_numpy():
    """The numpy reference is used by users and tests; refusing growth is normal, not an error."""
    policy = DynamicLossScale(2.0**127, 1, 2)
    state = initial_state(policy, np)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = next_state(policy, state, np.asarray(True), np)
    assert float(state.loss_scale) == 2.0**127


def test_public_names():
    assert lossscale.next_state is next_state and lossscale.initial_state is initial_state


# ----------------------------------------------------------------------------- B1: what `finite` may be


@pytest.mark.parametrize("finite", [True, np.bool_(True), np.asarray(True)], ids=repr)
def test_b1_a_python_or_numpy_true_is_a_finite_step(finite):
    """``~True == -2`` is truthy: a Python True used to back the scale off as if the step had overflowed."""
    policy = DynamicLossScale(8, 2, 2)
    state = next_state(policy, initial_state(policy, np), finite, np)
    assert as_tuple(state) == (8.0, 1, 0, 0, 0)
    state = next_state(policy, state, finite, np)
    assert as_tuple(state) == (16.0, 0, 0, 0, 0)


@pytest.mark.parametrize("finite", [False, np.bool_(False), np.asarray(False)], ids=repr)
def test_b1_a_python_or_numpy_false_is_a_skipped_step(finite):
    policy = DynamicLossScale(8, 2, 2)
    state = next_state(policy, initial_state(policy, np), finite, np)
    assert as_tuple(state) == (4.0, 0, 0, 1, 1)
    assert state.loss_scale.dtype == np.float32 and state.consecutive_skips.dtype == np.int32


@pytest.mark.parametrize(
    "finite,message",
    [
        (1, r"finite must be a bool or a 0-d bool array .*got int 1"),
        (0.0, r"got float 0\.0"),
        (np.asarray(1), r"got dtype int64"),
        (np.asarray(0.0, dtype=np.float32), r"got dtype float32.*found_inf == 0"),
        (np.asarray([True]), r"finite must be a 0-d bool array, got shape \(1,\).*finite\.all\(\)"),
        (None, r"got NoneType None"),
    ],
    ids=repr,
)
def test_b1_anything_else_is_a_clear_type_error(finite, message):
    policy = DynamicLossScale(8, 2, 2)
    with pytest.raises(TypeError, match=message):
        next_state(policy, initial_state(policy, np), finite, np)
