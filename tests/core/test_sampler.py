"""The core statistics sampler (``lossscale._sampler``): the decision, the kept sample, the rule, the count, the record."""

from __future__ import annotations

import numpy as np
import pytest

import lossscale
from lossscale._advance import advance, advance_in_place
from lossscale._auto import initial_auto_state, next_auto_state
from lossscale._rule import COUNTER_MAX
from lossscale._sampler import (
    SamplerState,
    initial_sampler_state,
    is_due,
    read_sampler_record,
    sampler_record,
)


def next_sampler_state(policy, scale, sampler, finite, sample, sampled, xp, **kwargs):
    """The sampler's step, as every binding takes it: :func:`lossscale._advance.advance` with a sampler."""
    return advance(policy, scale, finite, xp, sampler=sampler, sample=sample, sampled=sampled, **kwargs)
from lossscale._stats import gradient_stats


def grads(level):
    return [np.full(8, level, np.float32), np.array([0.0, level * 2.0**-12, level], np.float32)]


@pytest.mark.parametrize("host_count", [True, False])
def test_a_run_keeps_the_sample_of_each_due_step_and_counts_every_step(host_count):
    policy = lossscale.DynamicLossScale(2.0**10, 3)
    count = 0 if host_count else np.asarray(0, np.int32)
    sampler = initial_sampler_state(policy, 2, np, count=count)
    scale = lossscale.initial_state(policy, np)
    every, taken = 3, []
    for i in range(7):
        sampled = is_due(every, sampler.count)
        assert bool(sampled) == (i % every == 0)
        assert isinstance(sampled, bool) == host_count
        sample = gradient_stats(grads(2.0**-i), np, step=i) if sampled else None
        scale, sampler = next_sampler_state(policy, scale, sampler, True, sample, sampled, np)
        taken.append(int(sampler.sample.step))
        assert float(sampler.sample.amax) == 2.0 ** -(i - i % every)
    assert taken == [0, 0, 0, 3, 3, 3, 6]
    assert int(sampler.count) == 7 and isinstance(sampler.count, int) == host_count
    # A policy without statistics in its rule runs the TF rule: 7 finite steps at growth interval 3 double twice.
    assert float(scale.loss_scale) == 2.0**12 and sampler.auto is None


def test_an_unsampled_array_step_keeps_the_previous_sample_field_by_field():
    policy = lossscale.DynamicLossScale()
    sampler = initial_sampler_state(policy, 2, np, count=np.asarray(1, np.int32))
    ignored = gradient_stats(grads(1.0), np)
    _, after = next_sampler_state(policy, lossscale.initial_state(policy, np), sampler, True, ignored, np.bool_(False), np)
    assert int(after.sample.step) == -1 and np.isnan(after.sample.tensor_amax).all()


def test_the_auto_policy_runs_the_auto_rule_on_the_kept_sample():
    policy = lossscale.AutoLossScale(1.0)
    sampler = initial_sampler_state(policy, 2, np)
    scale = lossscale.initial_state(policy, np)
    ref_scale, ref_auto = scale, initial_auto_state(policy, np)
    for i, finite in enumerate([True, True, False, True]):
        sample = gradient_stats(grads(2.0**-10), np, step=i)
        scale, sampler = next_sampler_state(policy, scale, sampler, finite, sample, True, np, micro_batches=4)
        ref_scale, ref_auto = next_auto_state(policy, ref_scale, ref_auto, finite, sample, True, np, micro_batches=4)
        assert float(scale.loss_scale) == float(ref_scale.loss_scale)
        for got, want in zip(sampler.auto, ref_auto):
            np.testing.assert_array_equal(got, want)
    assert int(scale.skipped_steps) == 1 and float(scale.loss_scale) > 1.0


def test_micro_batches_raise_the_scale_for_one_backward():
    """The sum of K backwards has K times one backward's RMS (when they agree): auto sets the scale for one."""
    policy = lossscale.AutoLossScale(1.0)
    sample = gradient_stats(grads(2.0**-10), np)
    scales = []
    for k in (1, 16):
        sampler = initial_sampler_state(policy, 2, np)
        scale, _ = next_sampler_state(policy, lossscale.initial_state(policy, np), sampler, True, sample, True, np,
                                      micro_batches=k)
        scales.append(float(scale.loss_scale))
    assert scales[1] == scales[0] * 16


@pytest.mark.parametrize("host_count", [True, False])
def test_the_count_saturates_at_int32_max(host_count):
    policy = lossscale.DynamicLossScale()
    count = COUNTER_MAX if host_count else np.asarray(COUNTER_MAX, np.int32)
    sampler = initial_sampler_state(policy, 1, np, count=count)
    _, after = next_sampler_state(policy, lossscale.initial_state(policy, np), sampler, True, None, False, np)
    assert int(after.count) == COUNTER_MAX


@pytest.mark.parametrize("policy", [lossscale.DynamicLossScale(2.0**4, 2), lossscale.AutoLossScale(2.0**20, window=4)])
def test_advancing_in_place_matches_the_array_sampler_bit_for_bit(policy):
    """The host path of an unsampled step (numpy views, a Python count) against advance on arrays."""
    sampler = initial_sampler_state(policy, 2, np, count=np.asarray(COUNTER_MAX - 4, np.int32))
    scale = lossscale.initial_state(policy, np)
    # A first sampled step gives auto its bounds; then unsampled steps, overflows among them.
    scale, sampler = next_sampler_state(policy, scale, sampler, True, gradient_stats(grads(2.0**-8), np), True, np)
    views = lossscale.LossScaleState(*(np.array(v) for v in scale))
    auto = None if sampler.auto is None else type(sampler.auto)(*(np.array(v) for v in sampler.auto))
    count = int(sampler.count)
    for finite in [True, False, True, True, False, False, True, True]:
        scale, sampler = next_sampler_state(policy, scale, sampler, np.bool_(finite), None, np.bool_(False), np)
        count = advance_in_place(policy, views, finite, count=count, auto=auto)
        assert count == int(sampler.count)
        for got, want in zip([*views, *(auto or ())], [*scale, *(sampler.auto or ())]):
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype
    assert count == COUNTER_MAX and int(views.skipped_steps) == 3


def test_the_record_round_trips_and_refuses_what_does_not_fit():
    policy = lossscale.AutoLossScale(window=4)
    sampler = initial_sampler_state(policy, 1, np)._replace(count=5)
    record = sampler_record(sampler)
    assert record["iteration"] == 5 and set(record["auto"]) == {"margin", "window", "calm_steps", "lo", "hi"}
    count, auto = read_sampler_record(record, policy)
    assert count == 5 and auto.window.shape == (4,) and auto.calm_steps.dtype == np.int32
    assert read_sampler_record({"iteration": 3}, lossscale.DynamicLossScale()) == (3, None)
    with pytest.raises(ValueError, match="Invalid stats record"):
        read_sampler_record({"iteration": True}, policy)
    with pytest.raises(ValueError, match="Invalid stats record"):
        read_sampler_record({"iteration": -1}, policy)
    with pytest.raises(ValueError, match="no AutoLossScale state"):
        read_sampler_record({"iteration": 3}, policy)
    with pytest.raises(ValueError, match="window has 4 entries, the policy 16"):
        read_sampler_record(record, lossscale.AutoLossScale())
    for field, value in [("margin", 5.5), ("margin", 41.0), ("margin", -1.0), ("margin", np.nan), ("calm_steps", -1)]:
        bad = {**record, "auto": {**record["auto"], field: np.asarray(value, record["auto"][field].dtype)}}
        with pytest.raises(ValueError, match=r"whole number of bits in \[0, 40\] and calm_steps >= 0"):
            read_sampler_record(bad, policy)


def test_the_state_is_a_named_tuple_of_three():
    assert SamplerState._fields == ("count", "sample", "auto")
