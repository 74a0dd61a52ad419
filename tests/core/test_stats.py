"""Gradient statistics (`lossscale._stats`) against a plain-Python reference, numpy only."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lossscale._stats import FLOAT16_TINY, as_mapping, empty_stats, gradient_stats


def reference(grads):
    """Per tensor (amax, zero share, subnormal share, rms) and overall, in float64 Python loops."""
    rows, zeros, subs, total = [], 0, 0, 0
    for g in grads:
        values = [abs(float(v)) for v in np.asarray(g, dtype=np.float64).ravel()]
        n = len(values)
        amax = max(values) if values else 0.0
        z = sum(v == 0 for v in values)
        s = sum(0 < v < FLOAT16_TINY for v in values)
        rms = math.sqrt(sum(v * v for v in values) / n) if n else 0.0
        rows.append((amax, z / n if n else 0.0, s / n if n else 0.0, rms))
        zeros, subs, total = zeros + z, subs + s, total + n
    amax = max(r[0] for r in rows)
    positive = [r[3] for r in rows if r[3] > 0]
    return rows, (amax, zeros / total, subs / total, min(positive) if positive else 0.0)


def known_tensors():
    rng = np.random.default_rng(0)
    return [
        np.array([0.0, 1.0, 2.0**-20, -4.0, 2.0**-15, -(2.0**-14)], np.float16),  # zeros, subnormals, the edge
        (rng.normal(size=(7, 5)) * 2.0**-12).astype(np.float16),  # mostly subnormal, some flushed
        np.zeros(3, np.float32),
        np.zeros((0, 4), np.float16),  # empty
        (rng.normal(size=50) * 1e3).astype(np.float32),
    ]


def test_statistics_equal_a_python_reference():
    grads = known_tensors()
    stats = gradient_stats(grads, np, step=7)
    rows, overall = reference(grads)
    assert int(stats.step) == 7
    np.testing.assert_allclose(stats.tensor_amax, [r[0] for r in rows], rtol=1e-6)
    np.testing.assert_allclose(stats.tensor_zero_fraction, [r[1] for r in rows], rtol=1e-6)
    np.testing.assert_allclose(stats.tensor_subnormal_fraction, [r[2] for r in rows], rtol=1e-6)
    np.testing.assert_allclose(stats.tensor_rms, [r[3] for r in rows], rtol=1e-5)
    np.testing.assert_allclose(
        [stats.amax, stats.zero_fraction, stats.subnormal_fraction, stats.rms_min], overall, rtol=1e-5
    )
    expected_headroom = [math.log2(65504 / r[0]) if r[0] else math.inf for r in rows]
    np.testing.assert_allclose(stats.tensor_headroom_bits, expected_headroom, rtol=1e-6)
    assert float(stats.headroom_bits) == pytest.approx(math.log2(65504 / overall[0]), rel=1e-6)


def test_the_first_tensor_by_hand():
    stats = gradient_stats(known_tensors()[:1], np)
    assert float(stats.amax) == 4.0
    assert float(stats.zero_fraction) == pytest.approx(1 / 6)
    # 2**-20 and 2**-15 are subnormal; -(2**-14) is float16's smallest normal, not below it.
    assert float(stats.subnormal_fraction) == pytest.approx(2 / 6)
    assert float(stats.headroom_bits) == pytest.approx(math.log2(65504) - 2)


def test_non_finite_gradients_show_in_amax_and_headroom():
    stats = gradient_stats([np.array([1.0, np.inf], np.float16), np.array([np.nan], np.float32)], np)
    assert math.isinf(float(stats.tensor_amax[0])) and math.isnan(float(stats.tensor_amax[1]))
    assert float(stats.tensor_headroom_bits[0]) == -math.inf
    # A NaN gradient has NaN headroom (it read +inf, the safest-looking value, in a History), overall too.
    assert math.isnan(float(stats.tensor_headroom_bits[1]))
    assert math.isnan(float(stats.amax)) and math.isnan(float(stats.headroom_bits))


def test_all_zero_gradients_have_infinite_headroom_and_no_rms():
    with np.errstate(all="raise"):  # no warning from log2(0)
        stats = gradient_stats([np.zeros(4, np.float16)], np)
    assert float(stats.headroom_bits) == math.inf
    assert float(stats.zero_fraction) == 1.0
    assert float(stats.rms_min) == 0.0


def test_no_gradients_is_an_error():
    with pytest.raises(ValueError, match="at least one gradient"):
        gradient_stats([], np)


def test_inputs_are_not_mutated():
    grads = known_tensors()
    copies = [g.copy() for g in grads]
    gradient_stats(grads, np)
    for g, c in zip(grads, copies):
        np.testing.assert_array_equal(g, c)


def test_mapping_form_and_empty_sample():
    stats = gradient_stats(known_tensors(), np)
    mapping = as_mapping(stats, ["a", "b", "c", "d", "e"])
    assert {"amax", "headroom_bits", "zero_fraction", "per_tensor"} <= set(mapping)
    assert mapping["per_tensor"]["names"] == ("a", "b", "c", "d", "e")
    assert mapping["per_tensor"]["amax"] is stats.tensor_amax
    assert as_mapping(stats)["per_tensor"]["names"][0] == "0"
    with pytest.raises(ValueError, match="each of the 5 tensors"):
        as_mapping(stats, ["a"])
    empty = empty_stats(5, np)
    assert int(empty.step) == -1 and empty.tensor_amax.shape == (5,) and math.isnan(float(empty.amax))
