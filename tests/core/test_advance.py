"""``lossscale._advance``: the one step function of every binding and its host twin, bit for bit against each other
and against the public rule, on random runs of every reference policy and of ``AutoLossScale``."""

from __future__ import annotations

import numpy as np
import pytest

import lossscale
from lossscale._advance import advance, advance_in_place
from lossscale._auto import initial_auto_state
from lossscale._rule import COUNTER_MAX
from lossscale._sampler import initial_sampler_state
from lossscale._stats import gradient_stats
from tests.reference import POLICIES


def _bits(state):
    return [np.asarray(x).tobytes() for x in state]


def _flags(seed, n=400):
    rng = np.random.default_rng(seed)
    return rng.random(n) < 0.85  # mostly finite: the scale grows, then overflows back off


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_advance_is_the_public_rule_and_its_host_twin_the_same_bits(policy):
    arrays = lossscale.initial_state(policy, np)
    reference = lossscale.initial_state(policy, np)
    views = lossscale.initial_state(policy, np)
    count = 0
    for finite in _flags(0):
        arrays, none = advance(policy, arrays, np.bool_(finite), np)
        reference = lossscale.next_state(policy, reference, np.bool_(finite), np)
        count = advance_in_place(policy, views, bool(finite), count=count)
        assert none is None
        assert _bits(arrays) == _bits(reference) == _bits(views)
    assert count == 400


def test_the_host_twin_returns_no_count_without_a_sampler_and_saturates_one():
    policy = lossscale.DynamicLossScale()
    views = lossscale.initial_state(policy, np)
    assert advance_in_place(policy, views, True) is None
    assert advance_in_place(policy, views, True, count=COUNTER_MAX) == COUNTER_MAX


@pytest.mark.parametrize("finite", [True, False])
def test_a_scale_moved_elsewhere_keeps_its_objects_and_counts_the_skip(finite):
    policy = lossscale.DynamicLossScale(2.0**10, 1)
    scale = lossscale.initial_state(policy, np)._replace(consecutive_skips=np.int32(4), skipped_steps=np.int32(9))
    moved, _ = advance(policy, scale, finite, np, moves_scale=False)
    assert moved.loss_scale is scale.loss_scale and moved.good_steps is scale.good_steps
    assert moved.bad_steps is scale.bad_steps
    assert (int(moved.skipped_steps), int(moved.consecutive_skips)) == ((9, 0) if finite else (10, 5))
    views = lossscale.initial_state(policy, np)._replace(
        consecutive_skips=np.asarray(4, np.int32), skipped_steps=np.asarray(9, np.int32))
    assert advance_in_place(policy, views, finite, moves_scale=False) is None
    assert _bits(views) == _bits(moved)


def test_saturated_skip_counters_stay_at_their_limit_in_both_forms():
    policy = lossscale.FixedLossScale(1.0)
    full = np.int32(COUNTER_MAX)
    scale = lossscale.initial_state(policy, np)._replace(skipped_steps=full, consecutive_skips=full)
    moved, _ = advance(policy, scale, False, np, moves_scale=False)
    views = lossscale.initial_state(policy, np)._replace(
        skipped_steps=np.asarray(full), consecutive_skips=np.asarray(full))
    advance_in_place(policy, views, False, moves_scale=False)
    assert int(moved.skipped_steps) == int(views.skipped_steps) == COUNTER_MAX


def test_with_a_sampler_the_sample_is_kept_where_taken_and_every_step_counted():
    policy = lossscale.DynamicLossScale(2.0**10, 3)
    sampler = initial_sampler_state(policy, 1, np)
    scale = lossscale.initial_state(policy, np)
    for i in range(5):
        sampled = i % 2 == 0
        sample = gradient_stats([np.full(4, 2.0**-i, np.float32)], np, step=i) if sampled else None
        scale, sampler = advance(policy, scale, True, np, sampler=sampler, sample=sample, sampled=sampled)
    assert sampler.count == 5 and int(sampler.sample.step) == 4 and float(sampler.sample.amax) == 2.0**-4
    assert float(scale.loss_scale) == 2.0**11  # the TF rule: 5 finite steps at interval 3 grow once


def test_a_sampler_beside_a_scale_moved_elsewhere_counts_and_keeps_the_sample():
    policy = lossscale.AutoLossScale()
    sampler = initial_sampler_state(policy, 1, np)
    scale = lossscale.initial_state(policy, np)
    sample = gradient_stats([np.full(4, 0.5, np.float32)], np, step=0)
    moved, after = advance(policy, scale, True, np, sampler=sampler, sample=sample, sampled=True, moves_scale=False)
    assert moved.loss_scale is scale.loss_scale and after.count == 1 and float(after.sample.amax) == 0.5
    assert after.auto is sampler.auto  # another rule moved the scale: the auto state stays


def test_auto_unsampled_steps_on_the_host_are_the_array_rule_bit_for_bit():
    policy = lossscale.AutoLossScale(2.0**12)
    level = 2.0**-6
    sampler = initial_sampler_state(policy, 1, np)
    scale = lossscale.initial_state(policy, np)
    sample = gradient_stats([np.full(8, level, np.float32)], np, step=0)
    scale, sampler = advance(policy, scale, True, np, sampler=sampler, sample=sample, sampled=True)
    views = lossscale.LossScaleState(*(np.array(x) for x in scale))
    auto = type(sampler.auto)(*(np.array(x) for x in sampler.auto))
    count = sampler.count
    for finite in _flags(1, 200):
        scale, sampler = advance(policy, scale, np.bool_(finite), np, sampler=sampler, sampled=False)
        count = advance_in_place(policy, views, bool(finite), count=count, auto=auto)
        assert _bits(views) == _bits(scale) and _bits(auto) == _bits(sampler.auto) and count == sampler.count
    assert int(scale.skipped_steps) > 0


def test_auto_without_its_state_runs_the_dynamic_rule():
    """No sampler (or one without ``auto``): the policy's RuleParams, as ``next_state`` reads them."""
    policy = lossscale.AutoLossScale()
    scale, _ = advance(policy, lossscale.initial_state(policy, np), False, np)
    assert _bits(scale) == _bits(lossscale.next_state(policy, lossscale.initial_state(policy, np), False, np))
    assert initial_auto_state(policy, np).window.shape == (policy.window,)


def test_bad_finite_flags_and_rule_params_with_a_sampler_are_refused_with_the_fix():
    policy = lossscale.DynamicLossScale()
    scale = lossscale.initial_state(policy, np)
    with pytest.raises(TypeError, match=r"finite must be a bool or a 0-d bool array .* found_inf == 0"):
        advance(policy, scale, np.float32(0.0), np)
    with pytest.raises(TypeError, match=r"finite must be a bool or a 0-d bool array"):
        advance(policy, scale, 1, np, moves_scale=False)
    with pytest.raises(TypeError, match=r"needs the policy itself, not its RuleParams"):
        advance(policy.rule_params(), scale, True, np, sampler=initial_sampler_state(policy, 1, np))
