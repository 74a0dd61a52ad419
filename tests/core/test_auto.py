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
from lossscale._auto import AutoState, initial_auto_state, next_auto_state
from lossscale._rule import LossScaleState
from lossscale._stats import gradient_stats

F = math.log2(65504)


# ----------------------------------------------------------------------------- a plain-Python reference


class Ref:
    """The rule of AutoLossScale's docstring, in Python floats."""

    def __init__(self, p: AutoLossScale):
        self.p, self.S, self.m, self.window, self.calm = p, p.initial_loss_scale, float(p.margin_bits), [], 0
        self.skipped = self.streak = self.good = 0

    def step(self, finite: bool, amax: float | None, rms_min: float | None) -> None:
        p = self.p
        old = self.S
        if not finite:
            self.skipped += 1
            self.streak += 1
            self.S = max(self.S / 2**self.m, p.min_loss_scale)
            self.m = min(self.m + 1, p.max_margin_bits)
            self.window, self.calm, self.good = [], 0, 0
            return
        self.streak = 0
        e = math.floor(math.log2(self.S))
        target = e
        if amax is not None and amax == 0:
            target = e + p.search_bits
        elif amax is not None:
            self.window = ([math.log2(amax) - math.log2(self.S)] + self.window)[: p.window]
            hi = math.floor(F - self.m - max(self.window))
            lo = math.ceil(-14 + p.underflow_bits - (math.log2(rms_min) - math.log2(self.S)))
            if e < lo:
                target = min(lo + 1, e + p.max_jump_bits)
            target = min(target, hi)
        target = min(target, 126)
        if target != e:
            self.S = min(max(2.0**target, p.min_loss_scale), p.ceiling)
        self.calm += 1
        if self.calm >= p.relax_steps:
            self.m = max(self.m - 1, p.margin_bits) if self.m - 1 >= p.margin_bits else self.m
            self.calm = 0
        self.good = self.good + 1 if self.S == old else 0


def sample(rng, S, true_log2_amax, spread=6):
    """Two float32 'scaled gradients' whose true magnitudes are about 2**true_log2_amax and 2**-spread below."""
    a = rng.normal(size=64) * 2.0 ** (true_log2_amax - 2)
    b = rng.normal(size=64) * 2.0 ** (true_log2_amax - 2 - spread)
    return [(a * S).astype(np.float32), (b * S).astype(np.float32)]


def run(policy, events, seed=0):
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
            state, auto = next_auto_state(policy, state, auto, np.bool_(finite), stats, np.bool_(sampled), np)
        ref.step(finite, amax, rms)
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
        relax_steps=r.randint(5, 40), window=r.randint(1, 8), max_margin_bits=r.randint(4, 8),
    )
    events = []
    level = -10.0
    for _ in range(400):
        level += r.uniform(-0.5, 0.5)
        kind = r.random()
        events.append((kind > 0.1, r.random() < 0.5, None if kind > 0.97 else level))
    scales, *_ = run(policy, events, seed)
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
    """A float16 backward at 2**30 overflows: each skip backs off by the margin, then one sample settles it."""
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
    assert int(state.skipped_steps) <= 3  # the TF rule needs one skip per bit: 12 here
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
    auto_policy = AutoLossScale(2.0**15, margin_bits=1, max_margin_bits=1, min_loss_scale=2.0)
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


def test_default_backoff_is_by_the_margin_and_widens_it():
    policy = AutoLossScale(2.0**20)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    for expected_log2, expected_m in [(16, 5), (11, 6), (5, 7), (0, 8), (0, 9)]:
        state, auto = next_auto_state(policy, state, auto, np.bool_(False), None, False, np)
        assert math.log2(float(state.loss_scale)) == expected_log2 and float(auto.margin) == expected_m
    with pytest.raises(TypeError, match="finite must be"):
        next_auto_state(policy, state, auto, 1, None, False, np)


def test_the_margin_relaxes_after_calm_steps():
    policy = AutoLossScale(2.0**20, relax_steps=3)
    state, auto = initial_state(policy, np), initial_auto_state(policy, np)
    state, auto = next_auto_state(policy, state, auto, False, None, False, np)
    state, auto = next_auto_state(policy, state, auto, False, None, False, np)
    assert float(auto.margin) == 6
    margins = []
    for _ in range(9):
        state, auto = next_auto_state(policy, state, auto, True, None, False, np)
        margins.append(float(auto.margin))
    assert margins == [6, 6, 5, 5, 5, 4, 4, 4, 4]


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
    policy = AutoLossScale(2.0**5, min_loss_scale=0.5, max_loss_scale=2.0**40, margin_bits=3, window=8)
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
        ({"initial_loss_scale": 0.5}, ValueError, "is below min_loss_scale=1.0"),
        ({"max_loss_scale": 2.0**10}, ValueError, "is above max_loss_scale=1024.0"),
        ({"min_loss_scale": -1.0}, ValueError, "min_loss_scale"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        AutoLossScale(**kwargs)
