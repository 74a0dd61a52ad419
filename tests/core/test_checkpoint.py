"""The one load rule for loaded state (lossscale._checkpoint) and the float32-inert factors (issue 22)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import lossscale as ls
from lossscale._checkpoint import check_counter, check_policy, check_scale, read_record

POLICY = ls.DynamicLossScale(2.0**10, 5, min_loss_scale=0.5, max_loss_scale=2.0**20)
GOOD = {"loss_scale": 1024.0, "good_steps": 1, "bad_steps": 0, "skipped_steps": 3, "consecutive_skips": 0}


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (math.nan, ValueError, "finite in float32"),
        (math.inf, ValueError, "finite in float32"),
        (-math.inf, ValueError, "finite in float32"),
        (1e39, ValueError, "finite in float32"),
        (10**400, ValueError, "finite in float32"),
        (0.0, ValueError, "positive"),
        (-1.0, ValueError, "positive"),
        (1e-45, ValueError, "smallest normal"),
        (0.25, ValueError, r"outside the policy's bounds \[0.5, 1048576.0\]"),
        (2.0**21, ValueError, "outside"),
        ("2", TypeError, "positive finite number"),
        (None, TypeError, "positive finite number"),
        (True, TypeError, "positive finite number"),
        ([1.0], TypeError, "positive finite number"),
        (np.ones(2, np.float32), TypeError, "positive finite number"),
    ],
)
def test_bad_scales_name_field_value_and_fix(value, error, match):
    with pytest.raises(error, match=match) as info:
        check_scale("state['loss_scale']", value, POLICY)
    assert "state['loss_scale']" in str(info.value)
    assert "set state['loss_scale'] to a finite number" in str(info.value)


def test_scale_without_policy_refuses_subnormal():
    with pytest.raises(ValueError, match="smallest normal"):
        check_scale("s", 1e-40)
    assert check_scale("s", np.float32(3.0)) == 3.0
    assert check_scale("s", np.array(2.0, np.float64)) == 2.0


def test_bounds_are_compared_in_float32():
    policy = ls.DynamicLossScale(0.2, 5, min_loss_scale=0.1, max_loss_scale=0.3)
    assert check_scale("s", float(np.float32(0.3)), policy) == float(np.float32(0.3))
    assert check_scale("s", float(np.float32(0.1)), policy) == float(np.float32(0.1))


def test_clamp_moves_a_finite_scale_into_bounds_and_still_refuses_non_finite():
    assert check_scale("s", -1.0, POLICY, clamp=True) == 0.5
    assert check_scale("s", 0, POLICY, clamp=True) == 0.5
    assert check_scale("s", 2.0**30, POLICY, clamp=True) == 2.0**20
    for value in (math.nan, math.inf, 1e39, 10**400):
        with pytest.raises(ValueError, match="finite in float32"):
            check_scale("s", value, POLICY, clamp=True)


@pytest.mark.parametrize(
    ("value", "error"),
    [(-1, ValueError), (2**31, ValueError), (2**40, ValueError), (np.int64(2**32), ValueError),
     (1.0, TypeError), (math.nan, TypeError), (True, TypeError), (None, TypeError), ("1", TypeError),
     ([1], TypeError), (np.array([1, 2]), TypeError)],
)
def test_bad_counters(value, error):
    with pytest.raises(error, match=r"good_steps.*(int32|int)"):
        check_counter("good_steps", value)


def test_counters_accept_ints_of_any_kind():
    assert check_counter("c", np.int64(7)) == 7
    assert check_counter("c", np.array(2**31 - 1, np.int64)) == 2**31 - 1
    assert check_counter("c", 0) == 0


def test_check_state_returns_plain_values_and_refuses_missing_and_extra_keys():
    assert read_record(GOOD, POLICY)[1] == GOOD
    with pytest.raises(ValueError, match=r"missing \['bad_steps'\]"):
        read_record({k: v for k, v in GOOD.items() if k != "bad_steps"}, POLICY)
    with pytest.raises(ValueError, match=r"does not know: \['surprise'\]"):
        read_record({**GOOD, "surprise": 1}, POLICY, extra="refuse")
    assert read_record({**GOOD, "surprise": 1}, POLICY)[1] == GOOD


def test_check_policy_reads_serialized_builtins_only():
    assert check_policy(ls.serialize(POLICY)) == POLICY
    with pytest.raises(ValueError, match="policy is not a valid policy"):
        check_policy({"class_name": "os.system", "config": {}})
    with pytest.raises(TypeError, match="serialized loss scale policy"):
        check_policy(None)
    with pytest.raises(ValueError, match="multiplier"):
        check_policy({"class_name": "DynamicLossScale", "config": {"multiplier": 1 + 1e-9}})


# -------------------------------------------------------------- factors inert in float32 (issue 22's fuzz finding)


@pytest.mark.parametrize(
    ("build", "field", "rounded"),
    [
        (lambda: ls.DynamicLossScale(multiplier=1 + 1e-9), "multiplier", "1.0"),
        (lambda: ls.DynamicLossScale(multiplier=1.0000000000000002, backoff_factor=0.5, hysteresis=2**31 - 1),
         "multiplier", "1.0"),
        (lambda: ls.DynamicLossScale(multiplier=1e39), "multiplier", "inf"),
        (lambda: ls.DynamicLossScale(backoff_factor=1 - 1e-9), "backoff_factor", "1.0"),
        (lambda: ls.DynamicLossScale(backoff_factor=1e-50), "backoff_factor", "0.0"),
        (lambda: ls.ExponentialUpdateLossScaleManager(2, 2, incr_ratio=1 + 1e-12), "incr_ratio", "1.0"),
        (lambda: ls.ExponentialUpdateLossScaleManager(2, 2, incr_ratio=1e39), "incr_ratio", "inf"),
        (lambda: ls.ExponentialUpdateLossScaleManager(2, 2, decr_ratio=1 - 1e-12), "decr_ratio", "1.0"),
    ],
)
def test_factors_inert_in_float32_are_refused(build, field, rounded):
    with pytest.raises(ValueError, match=rf"{field}=.* is {rounded} in float32"):
        build()


def test_smallest_float32_factors_still_work():
    grow = float(np.nextafter(np.float32(1), np.float32(2)))
    policy = ls.DynamicLossScale(2.0**15, 1, multiplier=grow)
    state = ls.initial_state(policy, np)
    assert float(ls.next_state(policy, state, True, np).loss_scale) > 2.0**15
    assert float(ls.next_state(policy, state, False, np).loss_scale) < 2.0**15


@pytest.mark.parametrize("field", ["initial_loss_scale", "multiplier", "min_loss_scale", "max_loss_scale"])
def test_huge_int_policy_argument_is_a_value_error(field):
    with pytest.raises(ValueError, match=f"{field} must be finite"):
        ls.DynamicLossScale(**{field: 10**400})
    with pytest.raises(ValueError, match="increment_period must be an int in"):
        ls.DynamicLossScale(increment_period=10**400)
