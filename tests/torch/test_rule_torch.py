"""The core rule over ``torch`` against the numpy reference (tests/reference.py), bit for bit."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import lossscale
from lossscale import DynamicLossScale, ExponentialUpdateLossScaleManager, LossScaleState, initial_state, next_state
from tests.reference import PATTERN, POLICIES, trajectory

INT32_MAX = 2**31 - 1


def _random_pattern(seed: int, n: int, p_bad: float) -> list[bool]:
    rng = random.Random(seed)
    return [rng.random() >= p_bad for _ in range(n)]


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_torch_trajectory_equals_numpy(policy):
    assert trajectory(policy, PATTERN, "torch") == trajectory(policy, PATTERN, "numpy")


@pytest.mark.parametrize(
    "policy",
    [
        DynamicLossScale(2.0**15, 3, 2.0),
        DynamicLossScale(1.0, 1, 2.0),  # into float32's ceiling and back
        DynamicLossScale(123.456, 5, 1.7),
        DynamicLossScale(2.0**15, 2, 1.5, min_loss_scale=8.0, max_loss_scale=5e4, hysteresis=3),
        DynamicLossScale(300.0, 3, 2.0, backoff_factor=0.7, hysteresis=2),
        ExponentialUpdateLossScaleManager(5000.0, 4, 3, 1.5, 0.5),
    ],
    ids=repr,
)
def test_long_random_sequences_equal_numpy(policy):
    pattern = _random_pattern(len(repr(policy)), 600, 0.3)
    assert trajectory(policy, pattern, "torch") == trajectory(policy, pattern, "numpy")


def test_state_dtypes_and_shapes():
    policy = DynamicLossScale(8, 2)
    state = initial_state(policy, torch)
    for finite in (True, False, True, True):
        state = next_state(policy, state, torch.tensor(finite), torch)
        assert state.loss_scale.dtype == torch.float32 and state.loss_scale.dim() == 0
        assert all(t.dtype == torch.int32 and t.dim() == 0 for t in state[1:])


def test_skip_counters_saturate():
    policy = DynamicLossScale(4, 2, 2)
    top = torch.tensor(INT32_MAX, dtype=torch.int32)
    state = initial_state(policy, torch)._replace(skipped_steps=top, consecutive_skips=top)
    for _ in range(3):
        state = next_state(policy, state, torch.tensor(False), torch)
        assert int(state.skipped_steps) == INT32_MAX and int(state.consecutive_skips) == INT32_MAX
    state = next_state(policy, state, torch.tensor(True), torch)
    assert int(state.skipped_steps) == INT32_MAX and int(state.consecutive_skips) == 0


def test_counters_at_the_largest_period_and_hysteresis():
    policy = DynamicLossScale(4, INT32_MAX, 2, hysteresis=INT32_MAX)
    state = initial_state(policy, torch)._replace(
        good_steps=torch.tensor(INT32_MAX - 1, dtype=torch.int32), bad_steps=torch.tensor(INT32_MAX - 1, dtype=torch.int32)
    )
    grown = next_state(policy, state, torch.tensor(True), torch)
    assert (float(grown.loss_scale), int(grown.good_steps), int(grown.bad_steps)) == (8, 0, 0)
    backed = next_state(policy, state, torch.tensor(False), torch)
    assert (float(backed.loss_scale), int(backed.good_steps), int(backed.bad_steps)) == (2, 0, 0)


def test_a_numpy_state_resumed_in_torch_continues_the_trajectory():
    policy = ExponentialUpdateLossScaleManager(2.0**10, 3, 2)
    pattern = _random_pattern(5, 400, 0.3)
    full = trajectory(policy, pattern, "numpy")
    state = initial_state(policy, np)
    for finite in pattern[:200]:
        state = next_state(policy, state, np.asarray(finite), np)
    state = LossScaleState(*(torch.as_tensor(np.asarray(t)) for t in state))
    rest = []
    for finite in pattern[200:]:
        state = next_state(policy, state, torch.tensor(finite), torch)
        rest.append(lossscale._rule.LossScaleState(*state))
    from tests.reference import as_numbers

    assert [as_numbers(s) for s in rest] == full[200:]


@pytest.mark.parametrize("finite,scale", [(True, 16.0), (False, 4.0)])
def test_b1_python_bools_with_torch(finite, scale):
    """B1: a Python bool used to raise an opaque where() error with torch (and ``~True`` is -2)."""
    policy = DynamicLossScale(8, 1, 2)
    state = next_state(policy, initial_state(policy, torch), finite, torch)
    assert float(state.loss_scale) == scale and isinstance(state.consecutive_skips, torch.Tensor)


@pytest.mark.parametrize(
    "finite,message",
    [
        (torch.tensor(1), "got dtype torch.int64"),
        (torch.tensor(0.0), r"got dtype torch.float32.*found_inf == 0"),
        (torch.tensor([True]), r"0-d bool array, got shape \(1,\)"),
    ],
    ids=repr,
)
def test_b1_non_bool_tensors_are_a_clear_type_error(finite, message):
    policy = DynamicLossScale(8, 1, 2)
    with pytest.raises(TypeError, match=message):
        next_state(policy, initial_state(policy, torch), finite, torch)


def test_0d_tensors_are_accepted_by_policies():
    assert DynamicLossScale(torch.tensor(2.0**15), torch.tensor(100)) == DynamicLossScale(2**15, 100)
    with pytest.raises(TypeError, match="got the bool"):
        DynamicLossScale(torch.tensor(True))
    with pytest.raises(TypeError, match=r"increment_period must be an int, .*dtype torch.float32"):
        DynamicLossScale(8, torch.tensor(3.5))
    assert DynamicLossScale(8, torch.tensor(3.0)) == DynamicLossScale(8, 3)  # a whole float: the int it spells
