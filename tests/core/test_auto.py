"""`AutoLossScale` and its rule (`lossscale._auto.next_auto_state`), numpy only.

The rule is checked against a plain-Python transcription of the class
docstring (floats and ``math`` only) on long random sequences, and on the
behaviours the issue asks for: one or two sampled steps to a safe scale from
2**0 and 2**30, never outside [min, max], the TF rule's skip and backoff on
Inf/NaN, exact resume from a checkpoint, and config round trips.
"""

from __future__ import annotations

import math
import pickle
import random

import numpy as np
import pytest

import lossscale
from lossscale import AutoLossScale, DynamicLossScale, initial_state, next_state
from lossscale._auto import (
    TABLE_EXPONENTS,
    TABLE_MARGINS,
    AutoState,
    initial_auto_state,
    next_auto_state,
    overflow_table,
    table_key,
)
from lossscale._rule import LossScaleState
from lossscale._stats import gradient_stats

F = math.log2(65504)


# ----------------------------------------------------------------------------- a plain-Python reference


class Ref:
    """The rule of AutoLossScale's docstring, in Python floats."""

    def __init__(self, p: AutoLossScale):
        self.p, self.S, self.m, self.window, self.calm = p, p.initial_loss_scale, float(p.margin_bits), [], 0
        self.skipped = self.streak = self.good = 0
        self.lo = None  # no measured sample yet

    def step(self, finite: bool, amax: float | None, rms_min: float | None, micro_batches: int = 1,
             sampled: bool | None = None) -> None:
        p = self.p
        old = self.S
        e = math.floor(math.log2(self.S))
        if not finite:
            self.skipped += 1
            self.streak += 1
            if self.lo is None:  # the start was a guess
                e_b = e - p.start_backoff_bits
            else:  # the spike was more than F - e - low bits over the window's lowest sample
                top, low = (max(self.window), min(self.window)) if self.window else (F - e - self.m,) * 2
                doubled = max(min(2 * self.m, p.max_margin_bits), self.m)
                grown = min(max(math.ceil(F - e - low) + 1, doubled), 40)
                e_b = min(self.hi(grown, top, low, self.lo - p.underflow_bits), e - 1)
                self.m = grown
            self.S = max(2.0 ** max(e_b, -126), p.min_loss_scale)
            self.calm, self.good = 0, 0
            return
        self.streak = 0
        target = e
        if amax is not None and amax == 0:
            target = e + p.search_bits
        elif amax is not None:
            self.window = ([math.log2(amax) - math.log2(self.S)] + self.window)[: p.window]
            lo = math.ceil(-14 + p.underflow_bits - (math.log2(rms_min / micro_batches) - math.log2(self.S)))
            hi = self.hi(self.m, max(self.window), min(self.window), lo - p.underflow_bits)
            up = min(lo + 1, hi - 1, e + p.max_jump_bits)
            if e < lo and up > e:
                target = up
            target = min(target, hi)
            self.lo = lo
        target = min(target, 126)
        if target != e:
            self.S = min(max(2.0**target, p.min_loss_scale), p.ceiling)
        self.calm += 1
        if (amax is not None if sampled is None else sampled) and self.calm >= p.relax_steps:  # at a sample only
            self.m = max(self.m - 1, p.margin_bits)
            self.calm = 0
        self.good = self.good + 1 if self.S == old else 0

    def hi(self, m: float, top: float, low: float, floor: float) -> float:
        """The overflow bound of margin ``m``; past ``max_margin_bits`` the margin lowers it to ``floor`` at most."""
        def bound(margin: float) -> float:
            return math.floor(F - max(margin + low, self.p.margin_bits + top))

        return min(bound(min(m, self.p.max_margin_bits)), max(bound(m), floor))


def sample(rng, S, true_log2_amax, spread=6):
    """Two float32 'scaled gradients' whose true magnitudes are about 2**true_log2_amax and 2**-spread below."""
    a = rng.normal(size=64) * 2.0 ** (true_log2_amax - 2)
    b = rng.normal(size=64) * 2.0 ** (true_log2_amax - 2 - spread)
    return [(a * S).astype(np.float32), (b * S).astype(np.float32)]


def run(policy, events, seed=0, micro_batches=1):
    """Both implementations over ``events`` (finite, sampled, true log2 amax) -> lists of scales and states."""
    rng = np.random.default_rng(seed)
    state, auto, ref = initial_state(policy, np), initial_auto_state(policy, np), Ref(policy)
    scales = []
    for i, (finite, sampled, level) in enumerate(events):
        if level is None:  # all flushed
            stats = gradient_stats([np.zeros(64, np.float32), np.zeros(64, np.float32)], np, i)
        else:
            stats = gradient_stats(sample(rng, float(state.loss_scale), level), np, i)
        amax = float(stats.amax) if sampled and finite else None
        rms = float(stats.rms_min) if sampled and finite else None
        with np.errstate(all="ignore"):
            state, auto = next_auto_state(
                policy, state, auto, np.bool_(finite), stats, np.bool_(sampled), np, micro_batches=micro_batches
            )
        ref.step(finite, amax, rms, micro_batches, sampled)
        assert float(state.loss_scale) == ref.S, (i, float(state.loss_scale), ref.S)
        assert float(auto.margin) == ref.m
        assert (int(state.skipped_steps), int(state.consecutive_skips), int(state.good_steps)) == (
            ref.skipped, ref.streak, ref.good), i
        scales.append(float(state.loss_scale))
    return scales, state, auto


@pytest.mark.parametrize("seed", range(4))
def test_long_random_sequences_match_the_reference(seed):
    r = random.Random(seed)
    policy = AutoLossScale(
        2.0 ** r.randint(0, 30), min_loss_scale=2.0 ** r.randint(-4, 2), max_loss_scale=2.0 ** r.randint(30, 60),
        relax_steps=r.randint(5, 40), window=r.randint(1, 8), max_margin_bits=r.randint(4, 16),
        start_backoff_bits=r.randint(1, 20),
    )
    events = []
    level = -10.0
    for _ in range(400):
        level += r.uniform(-0.5, 0.5)
        kind = r.random()
        events.append((kind > 0.1, r.random() < 0.5, None if kind > 0.97 else level))
    scales, *_ = run(policy, events, seed, micro_batches=r.choice([1, 4, 8]))
    assert len(set(scales)) > 3  # the scale moved


# ----------------------------------------------------------------------------- the behaviours


@pytest.mark.parametrize("start", [2.0**0, 2.0**30])
def test_reaches_a_safe_scale_in_one_sampled_step(start):
    """Float32 scaled gradients (autocast's master grads): after one sample neither edge is near."""
    policy = AutoLossScale(start)
    rng = np.random.default_rng(1)
    true = [rng.normal(size=4096).astype(np.float32) * 2.0**-18, rng.normal(size=512).astype(np.float32) * 2.0**-6]
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    for step in range(2):
        S = np.float32(state.loss_scale)
        stats = gradient_stats([t * S for t in true], np, step)
        state, auto = next_auto_state(policy, state, auto, np.bool_(True), stats, np.bool_(True), np)
    S = np.float32(state.loss_scale)
    half = [(t * S).astype(np.float16) for t in true]
    after = gradient_stats(half, np)
    assert float(after.zero_fraction) == 0.0
    assert float(after.subnormal_fraction) < 0.01
    assert float(after.headroom_bits) >= policy.margin_bits
    assert int(state.skipped_steps) == 0


def test_float16_gradients_from_2_to_30_back_off_then_settle():
    """A float16 backward at 2**30 overflows: the unmeasured start backs off 16 bits, then one sample settles it."""
    policy = AutoLossScale(2.0**30)
    rng = np.random.default_rng(2)
    true = [rng.normal(size=2048).astype(np.float32) * 2.0**-20, rng.normal(size=256).astype(np.float32) * 2.0**-10]
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    for step in range(6):
        S = np.float32(state.loss_scale)
        with np.errstate(over="ignore"):
            half = [(t * S).astype(np.float16) for t in true]
        finite = all(np.isfinite(h).all() for h in half)
        stats = gradient_stats(half, np, step)
        state, auto = next_auto_state(policy, state, auto, np.bool_(finite), stats, np.bool_(True), np)
    assert int(state.skipped_steps) == 1  # the TF rule needs one skip per bit: 12 here; the rule before issue 28: 3
    half = [(t * np.float32(state.loss_scale)).astype(np.float16) for t in true]
    after = gradient_stats(half, np)
    assert float(after.zero_fraction) == 0.0 and float(after.headroom_bits) >= policy.margin_bits


def test_all_zero_samples_search_upwards():
    policy = AutoLossScale(1.0, search_bits=12)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    zeros = gradient_stats([np.zeros(8, np.float16)], np)
    state, auto = next_auto_state(policy, state, auto, True, zeros, True, np)
    assert float(state.loss_scale) == 2.0**12


def test_unsampled_steps_keep_the_scale():
    policy = AutoLossScale(2.0**10)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    stats = gradient_stats([np.full(8, 2.0**-20, np.float32)], np)
    for _ in range(5):
        state, auto = next_auto_state(policy, state, auto, True, stats, False, np)
        state, auto = next_auto_state(policy, state, auto, True, None, True, np)
    assert float(state.loss_scale) == 2.0**10 and int(state.good_steps) == 10


def test_lowers_the_scale_before_an_overflow():
    """Gradients at 2**-3 of float16's max, margin 4: the scale drops although the step was finite."""
    policy = AutoLossScale(2.0**16)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    stats = gradient_stats([np.full(8, 8192.0, np.float32), np.full(8, 1.0, np.float32)], np)
    state, auto = next_auto_state(policy, state, auto, True, stats, True, np)
    # amax 2**13 at 2**16 is 2**-3 unscaled; 2**14 leaves it at 2**11, the last power of two >= 4 bits below 65504.
    assert float(state.loss_scale) == 2.0**14 and int(state.skipped_steps) == 0
    assert float(auto.hi) == 14.0


@pytest.mark.parametrize("seed", range(3))
def test_never_leaves_min_max(seed):
    policy = AutoLossScale(2.0**8, min_loss_scale=4.0, max_loss_scale=2.0**20, relax_steps=7)
    r = random.Random(seed)
    events = [(r.random() > 0.3, r.random() < 0.7, r.choice([None, -40.0, -20.0, 0.0, 10.0, r.uniform(-30, 10)]))
              for _ in range(300)]
    scales, *_ = run(policy, events, seed)
    assert min(scales) == 4.0 and max(scales) == 2.0**20
    assert all(4.0 <= s <= 2.0**20 for s in scales)


def test_inf_and_nan_skip_and_back_off_like_the_tf_rule():
    """With a one-bit margin and no statistics, auto's trajectory is the TF rule's (within 2000 steps)."""
    auto_policy = AutoLossScale(2.0**15, margin_bits=1, max_margin_bits=1, min_loss_scale=2.0, start_backoff_bits=1)
    tf_policy = DynamicLossScale(2.0**15, min_loss_scale=2.0)
    r = random.Random(0)
    s_auto, a = initial_state(auto_policy, np), initial_auto_state(auto_policy, np)
    s_tf = initial_state(tf_policy, np)
    for _ in range(600):
        finite = np.bool_(r.random() > 0.2)
        s_auto, a = next_auto_state(auto_policy, s_auto, a, finite, None, True, np)
        s_tf = next_state(tf_policy, s_tf, finite, np)
        assert float(s_auto.loss_scale) == float(s_tf.loss_scale)
        assert int(s_auto.skipped_steps) == int(s_tf.skipped_steps)
        assert int(s_auto.consecutive_skips) == int(s_tf.consecutive_skips)
    assert float(s_tf.loss_scale) == 2.0  # the floor was reached and held


def float16_step(policy, state, auto, true, step=0, sampled=True):
    """One float16 backward of the gradients ``true`` (float32 arrays, unscaled) at the current scale."""
    S = np.float32(state.loss_scale)
    with np.errstate(over="ignore", invalid="ignore"):
        half = [(t * S).astype(np.float16) for t in true]
        finite = all(np.isfinite(h).all() for h in half)
        stats = gradient_stats(half, np, step)
        return next_auto_state(policy, state, auto, np.bool_(finite), stats, np.bool_(sampled), np), finite


@pytest.mark.parametrize("start_log2", [15, 20, 24, 28, 32])
@pytest.mark.parametrize("edge_log2", [2, 6, 10, 14, 18, 22, 26])
def test_any_start_up_to_2_to_32_costs_at_most_two_skips(start_log2, edge_log2):
    """Gradients whose float16 overflow edge is 2**edge_log2: at most 2 skips from any start up to 2**32, then none.

    The rule before issue 28 backed off by m, m+1, m+2 bits (4, 5, 6): more than 2 skips in 19 of these 35
    cases, up to 5; the TF rule takes one per bit above the edge.
    """
    policy = AutoLossScale(2.0**start_log2)
    rng = np.random.default_rng(edge_log2)
    big = rng.normal(size=512).astype(np.float32)
    big *= np.float32(2.0 ** (F - edge_log2) / np.abs(big).max())  # overflows above 2**edge_log2
    true = [big, rng.normal(size=2048).astype(np.float32) * np.float32(2.0 ** (F - edge_log2 - 10))]
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    for step in range(200):
        (state, auto), _ = float16_step(policy, state, auto, true, step, sampled=step % 16 == 0)
    assert int(state.skipped_steps) <= 2
    assert math.log2(float(state.loss_scale)) <= max(edge_log2 - policy.margin_bits, 0)  # 0: the floor, min_loss_scale


def test_unmeasured_overflows_back_off_by_start_backoff_bits_and_keep_the_margin():
    policy = AutoLossScale(2.0**40, start_backoff_bits=16)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    for expected_log2 in [24, 8, 0, 0]:
        state, auto = next_auto_state(policy, state, auto, np.bool_(False), None, False, np)
        assert math.log2(float(state.loss_scale)) == expected_log2 and float(auto.margin) == policy.margin_bits
    with pytest.raises(TypeError, match="finite must be"):
        next_auto_state(policy, state, auto, 1, None, False, np)


def steady(rng, level, spread=6, n=256):
    """Unscaled gradients: a tensor with max about 2**level and one ``spread`` bits below."""
    a = rng.normal(size=n).astype(np.float32)
    a *= np.float32(2.0**level / np.abs(a).max())
    return [a, rng.normal(size=n).astype(np.float32) * np.float32(2.0 ** (level - spread - 2))]


def test_an_overflow_inside_the_band_is_remembered():
    """A spike overflows a scale inside the band: the margin covers the spike and the scale stays down.

    The rule before issue 28 widened the margin by one bit and jumped back to ``lo + 1`` on the next sample, so the
    backoff lasted one step (and the same spike overflowed again).
    """
    policy = AutoLossScale(2.0**0)
    rng = np.random.default_rng(4)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    for step in range(3):
        (state, auto), _ = float16_step(policy, state, auto, steady(rng, -20), step)
    e = math.log2(float(state.loss_scale))
    top = float(np.max(auto.window))
    assert float(auto.lo) <= e < float(auto.hi) - 4  # inside the band, well under hi
    spike = 2.0 ** (F - e - top)  # this spike's max, times 2**-19 unscaled, reaches 65504 at 2**e
    (state, auto), finite = float16_step(policy, state, auto, [g * np.float32(spike * 2) for g in steady(rng, -20)])
    assert not finite
    assert float(auto.margin) >= math.ceil(F - e - top) + 1  # at least the spike's height, plus a bit
    backed = float(state.loss_scale)
    assert backed <= 2.0 ** (e - 1)
    scales = []
    for step in range(40):
        (state, auto), _ = float16_step(policy, state, auto, steady(rng, -20), step)
        scales.append(float(state.loss_scale))
    assert max(scales) <= backed  # no climb back within 40 samples
    (state, auto), finite = float16_step(policy, state, auto, [g * np.float32(spike * 2) for g in steady(rng, -20)])
    assert finite  # the same spike again: no skip
    assert int(state.skipped_steps) == 1


def test_a_sampled_spike_under_the_learned_margin_is_not_counted_twice():
    """After the margin learned a spike, a smaller sampled spike that passes does not lower the scale.

    The window holds the sampled spike; the margin already holds its room. The first version of the
    remembering rule (issue 28) subtracted both (``hi = F - m - max(window)``) and dropped the scale by the
    spike's height again: flushing until the window forgot it.
    """
    policy = AutoLossScale(2.0**0)
    rng = np.random.default_rng(7)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    for step in range(3):
        (state, auto), _ = float16_step(policy, state, auto, steady(rng, -20), step)
    e = math.log2(float(state.loss_scale))
    spike = 2.0 ** (F - e - float(np.max(auto.window)))
    (state, auto), finite = float16_step(policy, state, auto, [g * np.float32(spike * 2) for g in steady(rng, -20)])
    assert not finite and float(auto.margin) >= 8
    for step in range(3):
        (state, auto), _ = float16_step(policy, state, auto, steady(rng, -20), step)
    settled = float(state.loss_scale)
    half = np.float32(2.0 ** (math.log2(spike) / 2))  # a spike of half the height: it fits under the margin
    (state, auto), finite = float16_step(policy, state, auto, [g * half for g in steady(rng, -20)])
    assert finite
    scales = []
    for step in range(5):
        (state, auto), _ = float16_step(policy, state, auto, steady(rng, -20), step)
        scales.append(float(state.loss_scale))
    assert min(scales) == settled and int(state.skipped_steps) == 1


def test_repeated_tall_spikes_are_learned_in_two_overflows():
    """A 12-bit spike every 50 steps, the scale at ``hi``: at most 2 skips (the rule before issue 28: every spike)."""
    policy = AutoLossScale(2.0**0, underflow_bits=14)  # "enough" above hi: the scale sits at the overflow bound
    rng = np.random.default_rng(5)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    for step in range(1000):
        grads = steady(rng, -10, spread=10)
        if step % 50 == 49:
            grads = [g * np.float32(2.0**12) for g in grads]
        (state, auto), _ = float16_step(policy, state, auto, grads, step)
    assert int(state.skipped_steps) <= 2
    assert float(auto.margin) >= 12


def test_a_spike_taller_than_max_margin_bits_is_learned_where_the_gradients_leave_room():
    """A 20-bit spike every 50 steps over gradients spread over 2 bits: "enough" sits 16 bits under overflow and
    float16's normal range leaves 8 more. The margin grows past ``max_margin_bits`` to the spike's height, into
    that room only: at most 4 skips, no gradient flushed (the rule with a hard 16-bit cap: all 20 spikes)."""
    policy = AutoLossScale(2.0**0)
    rng = np.random.default_rng(8)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    (state, auto), _ = float16_step(policy, state, auto, steady(rng, -20, spread=2), 0)
    normal_floor = float(auto.lo) - policy.underflow_bits  # the smallest RMS at float16's smallest normal
    skips, zeros, exponents = 0, [], []
    for step in range(1, 1000):
        grads = steady(rng, -20, spread=2)
        spiked = step % 50 == 49
        if spiked:
            grads = [g * np.float32(2.0**20) for g in grads]
        (state, auto), finite = float16_step(policy, state, auto, grads, step)
        skips += not finite
        exponents.append(math.log2(float(state.loss_scale)))
        if not spiked:
            zeros.append(float(gradient_stats([(g * np.float32(state.loss_scale)).astype(np.float16) for g in grads],
                                              np).zero_fraction))
    assert skips <= 4, skips
    assert float(auto.margin) >= 20
    assert min(exponents) >= normal_floor, (min(exponents), normal_floor)
    assert max(zeros) < 0.01


def test_doubling_the_margin_stops_at_max_margin_bits():
    """Past ``max_margin_bits`` an overflow grows the margin only to the height the spike implied (the first version
    of the change kept doubling: 16 to 32 bits on a 12-bit outlier, and the scale sat at the normal-range floor)."""
    policy = AutoLossScale(2.0**20)
    stats = gradient_stats([np.full(8, 1.0, np.float32), np.full(8, 2.0**-4, np.float32)], np)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    state, auto = next_auto_state(policy, state, auto, True, stats, True, np)  # measured: 2**-20 unscaled at 2**20
    assert float(state.loss_scale) == 2.0**20 and float(auto.lo) - policy.underflow_bits == 10
    auto = auto._replace(margin=np.float32(16.0))  # a margin learned at the cap
    state, auto = next_auto_state(policy, state, auto, False, None, False, np)  # overflow: over F - 20 + 20 bits
    assert float(auto.margin) == 17  # the implied height, ceil(F) + 1 (a hard cap: 16; doubling: 32)
    assert float(state.loss_scale) == 2.0**18  # hi(17), inside the normal range's room (floor 2**10)


def test_no_jitter_at_the_overflow_bound():
    """Noisy gradients, "enough" out of reach: the scale sits under ``hi`` and does not follow its 1-bit noise.

    The rule before issue 28 rose to ``hi`` whenever the window's max fell and dropped when it rose: a change on
    about every window's turn.
    """
    policy = AutoLossScale(2.0**0, underflow_bits=14, window=2)
    rng = np.random.default_rng(6)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    scales = []
    for step in range(400):
        (state, auto), _ = float16_step(policy, state, auto, steady(rng, -10 + rng.uniform(-0.7, 0.7), 10), step)
        scales.append(float(state.loss_scale))
    changes = int(np.sum(np.diff(scales[20:]) != 0))
    assert changes <= 4, changes
    assert int(state.skipped_steps) == 0


def test_micro_batches_raise_lo_by_log2_k():
    """``lo`` reads ``rms_min / micro_batches``: 8 accumulated backwards ask for 3 more bits of scale."""
    policy = AutoLossScale(2.0**0)
    stats = gradient_stats([np.full(8, 2.0**-20, np.float32), np.full(8, 2.0**-10, np.float32)], np)
    los = []
    for k in (1, 8):
        state, auto = initial_state(policy, np), initial_auto_state(policy, np)
        state, auto = next_auto_state(policy, state, auto, True, stats, True, np, micro_batches=k)
        los.append(float(auto.lo))
    assert los[1] - los[0] == 3.0


def test_the_margin_relaxes_after_calm_steps():
    """After ``relax_steps`` finite steps in a row the margin shrinks by a bit at the next sample, down to
    ``margin_bits``; an unsampled step never moves it."""
    policy = AutoLossScale(2.0**20, relax_steps=3)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    stats = gradient_stats([np.full(8, 2.0**12, np.float32)], np)
    state, auto = next_auto_state(policy, state, auto, True, stats, True, np)  # measured: overflows now learn
    assert float(state.loss_scale) == 2.0**19  # hi: 2**12 at 2**20 is 2**-8 unscaled, 4 bits under 65504 at 2**19
    state, auto = next_auto_state(policy, state, auto, False, None, False, np)
    assert float(auto.margin) == 8  # doubled
    margins = []
    for _ in range(15):
        state, auto = next_auto_state(policy, state, auto, True, stats, True, np)
        margins.append(float(auto.margin))
    assert margins == [8, 8, 7, 7, 7, 6, 6, 6, 5, 5, 5, 4, 4, 4, 4]
    # Unsampled steps count the calm but wait for a sample to relax: the first sample after 3 calm steps does.
    state, auto = next_auto_state(policy, state, auto, False, None, False, np)
    grown = float(auto.margin)
    assert grown > 8  # the overflow grew it to the spike's height
    margins = []
    for sampled in [False] * 5 + [True, False, True]:
        state, auto = next_auto_state(policy, state, auto, True, stats if sampled else None, sampled, np)
        margins.append(float(auto.margin))
    assert margins == [grown] * 5 + [grown - 1] * 3  # the last sample came 2 calm steps after the relax
    assert AutoLossScale().relax_steps == 2000  # the TF rule's growth interval: relaxes no faster than TF grows


def test_checkpoints_resume_exactly():
    policy = AutoLossScale(2.0**3, relax_steps=11, window=4)
    r = random.Random(3)
    events = [(r.random() > 0.15, r.random() < 0.5, r.uniform(-25, -5)) for _ in range(120)]
    full, *_ = run(policy, events, seed=5)

    # Run 60 steps, save through a plain dict of numpy arrays and the config, rebuild, run the rest.
    rng = np.random.default_rng(5)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    scales, saved = [], None
    for i, (finite, sampled, level) in enumerate(events):
        if i == 60:
            saved = pickle.dumps({"policy": lossscale.serialize(policy), "state": state._asdict(), "auto": auto._asdict()})
            record = pickle.loads(saved)
            policy = lossscale.get(record["policy"])
            state, auto = LossScaleState(**record["state"]), AutoState(**record["auto"])
        stats = gradient_stats(sample(rng, float(state.loss_scale), level), np, i)
        with np.errstate(all="ignore"):
            state, auto = next_auto_state(policy, state, auto, np.bool_(finite), stats, np.bool_(sampled), np)
        scales.append(float(state.loss_scale))
    assert scales == full


def test_config_round_trips():
    policy = AutoLossScale(2.0**5, min_loss_scale=0.5, max_loss_scale=2.0**40, margin_bits=3, window=8,
                           start_backoff_bits=12)
    assert lossscale.get(lossscale.serialize(policy)) == policy
    assert AutoLossScale.from_config(policy.get_config()) == policy
    assert pickle.loads(pickle.dumps(policy)) == policy
    assert lossscale.get("auto") == AutoLossScale()
    assert AutoLossScale().get_config() == {"initial_loss_scale": 2.0**15}
    assert policy.dynamic and policy.rule_params().max_scale == 2.0**40


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"margin_bits": 0}, ValueError, "margin_bits"),
        ({"margin_bits": 16, "max_margin_bits": 20}, ValueError, "no room"),
        ({"margin_bits": 5, "max_margin_bits": 4}, ValueError, "max_margin_bits"),
        ({"window": 1.5}, (TypeError, ValueError), "window"),
        ({"start_backoff_bits": 0}, ValueError, "start_backoff_bits"),
        ({"initial_loss_scale": 0.5}, ValueError, "is below min_loss_scale=1.0"),
        ({"max_loss_scale": 2.0**10}, ValueError, "is above max_loss_scale=1024.0"),
        ({"min_loss_scale": -1.0}, ValueError, "min_loss_scale"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        AutoLossScale(**kwargs)


class _InexactLog2:
    """numpy, except that ``log2`` is one ulp low (as XLA's CPU ``log2`` is at 2**13, 2**15, 2**26, ...)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def log2(x):
        return np.nextafter(np.log2(x), np.float32(-np.inf)).astype(np.result_type(x, np.float32))


def test_an_inexact_log2_does_not_move_the_scale():
    """Under jax.jit on CPU ``floor(log2(2**13))`` is 12; the rule must still read the exponent exactly."""
    policy = AutoLossScale(2.0**13)
    stats = gradient_stats([np.full(8, 1.1 * 2.0**-6, np.float32), np.full(8, 2.0**-1, np.float32)], np)
    for xp in (np, _InexactLog2()):  # lo = ceil(-6 - log2(1.1 * 2**-19)) = 13: at lo, e = 12 would raise the scale
        state, auto = initial_state(policy, np), initial_auto_state(policy, np)
        for _ in range(3):
            state, auto = next_auto_state(policy, state, auto, np.bool_(True), stats, np.bool_(True), xp)
        assert float(auto.lo) == 13.0
        assert float(state.loss_scale) == 2.0**13 and int(state.good_steps) == 3  # at lo, inside the band: no move


@pytest.mark.parametrize("seed", range(4))
def test_a_step_known_unsampled_moves_as_a_step_whose_sample_is_masked(seed):
    """``stats=None`` (a binding knows on the host that nothing was sampled) skips the sample's ops; the state after
    it equals the state after the same step given a sample with ``sampled`` False, from any state the rule reaches
    (scales off the powers of two, at the bounds, before and after a measured sample)."""
    r = random.Random(seed)
    policy = AutoLossScale(r.choice([1000.0, 2.0**15, 2.0**30]), min_loss_scale=r.choice([1.0, 3.0]),
                           max_loss_scale=r.choice([None, 2.0**20]), relax_steps=r.choice([2, 50]), window=4)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    ignored = gradient_stats([np.full(4, 2.0**r.randint(-30, 20), np.float32)], np)
    for _ in range(300):
        finite = np.bool_(r.random() > 0.2)
        masked = next_auto_state(policy, state, auto, finite, ignored, np.bool_(False), np)
        known = next_auto_state(policy, state, auto, finite, None, False, np)
        for a, b in zip([*masked[0], *masked[1]], [*known[0], *known[1]]):
            np.testing.assert_array_equal(a, b)
        if r.random() < 0.3:  # move on by a sampled step, so that later steps start from measured states
            g = [np.full(4, 2.0**r.randint(-40, 25), np.float32), np.zeros(2, np.float32)]
            state, auto = next_auto_state(policy, state, auto, finite, gradient_stats(g, np), np.bool_(True), np)
        else:
            state, auto = known


# ----------------------------------------------------------------------------- the overflow table


@pytest.mark.parametrize("seed", range(3))
def test_the_overflow_table_is_the_rules_overflow_branch(seed):
    """Row ``table_key(e, m)`` of ``overflow_table`` is what ``next_auto_state`` does on an overflow at any scale of
    exponent ``e`` and margin ``m``, bit for bit, with and without a measured sample, at the grid's edges too."""
    r = random.Random(seed)
    policy = AutoLossScale(2.0**10, min_loss_scale=r.choice([2.0**-126, 2.0**-3, 3.0]), max_margin_bits=r.randint(4, 16),
                           margin_bits=r.randint(1, 4), window=r.randint(1, 6), start_backoff_bits=r.randint(1, 20))
    e0, e1 = TABLE_EXPONENTS
    for case in range(40):
        filled = r.randint(0, policy.window)
        window = np.full(policy.window, -np.inf, np.float32)
        window[:filled] = [r.uniform(-60, 10) for _ in range(filled)]
        lo = np.float32(np.nan if case % 4 == 0 else r.randint(-40, 60))
        auto = AutoState(np.float32(0), window, np.int32(r.randint(0, 50)), lo, np.float32(r.randint(-40, 60)))
        with np.errstate(all="ignore"):
            table = overflow_table(policy, auto, np)
        assert table.shape == ((e1 - e0 + 1) * TABLE_MARGINS, 3) and table.dtype == np.float32
        for e in [e0, e1, *(r.randint(e0, e1) for _ in range(6))]:
            m = np.float32(r.choice([0, TABLE_MARGINS - 1, r.randint(0, TABLE_MARGINS - 1)]))
            scale = np.float32(np.ldexp(np.float32(r.choice([1.0, 1.5, 1.9999999])), e))
            if not np.isfinite(scale) or scale == 0:
                continue
            state = LossScaleState(scale, np.int32(3), np.int32(0), np.int32(1), np.int32(0))
            with np.errstate(all="ignore"):
                after, moved = next_auto_state(policy, state, auto._replace(margin=m), np.bool_(False), None, False, np)
            row = table[int(table_key(np.float32(e), m))]
            assert row[0].tobytes() == np.float32(after.loss_scale).tobytes(), (e, m)
            assert row[1] == moved.margin
            e_after = math.floor(math.log2(float(after.loss_scale)))
            assert row[2] == table_key(e_after, float(moved.margin))
