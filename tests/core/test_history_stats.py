"""History's gradient-statistics columns, and underflow_report, numpy only."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from lossscale import History, underflow_report
from lossscale._history import STATS_COLUMNS
from lossscale._stats import as_mapping, gradient_stats


def test_stats_columns_round_trip_through_csv(tmp_path):
    h = History()
    h.extend([0, 1, 2], [8.0, 8.0, 16.0], [False, True, False], [1.0, 2.0, 3.0],
             stats={"headroom_bits": [3.5, math.nan, 2.25], "zero_fraction": [0.5, math.nan, 0.0]})
    h.append(3, 16.0, False, stats={"subnormal_fraction": 0.125})
    assert h.has_stats
    np.testing.assert_array_equal(h.stat("headroom_bits"), [3.5, math.nan, 2.25, math.nan])
    np.testing.assert_array_equal(h.stat("subnormal_fraction"), [math.nan] * 3 + [0.125])
    path = tmp_path / "h.csv"
    h.to_csv(path)
    assert path.read_text().splitlines()[0] == "step,loss_scale,skipped,loss," + ",".join(STATS_COLUMNS)
    back = History.from_csv(path)
    for name in STATS_COLUMNS:
        np.testing.assert_array_equal(back.stat(name), h.stat(name))
    np.testing.assert_array_equal(back.losses, [1.0, 2.0, 3.0, math.nan])


def test_without_stats_the_csv_keeps_its_four_columns(tmp_path):
    h = History()
    h.extend([0, 1], [8.0, 4.0], [False, True])
    assert not h.has_stats
    h.to_csv(tmp_path / "h.csv")
    assert (tmp_path / "h.csv").read_text().splitlines()[0] == "step,loss_scale,skipped,loss"
    assert np.isnan(History.from_csv(tmp_path / "h.csv").stat("zero_fraction")).all()


def test_truncate_keeps_the_stats_aligned():
    h = History()
    h.extend([0, 1, 2], [1.0, 2.0, 4.0], [False] * 3, stats={"zero_fraction": [0.1, 0.2, 0.3]})
    h.truncate(2)
    np.testing.assert_array_equal(h.stat("zero_fraction"), [0.1, 0.2])


def test_bad_stats_name_the_fix():
    h = History()
    with pytest.raises(ValueError, match="unknown columns"):
        h.extend([0], [1.0], [False], stats={"amax_bits": [1.0]})
    with pytest.raises(TypeError, match="mapping"):
        h.extend([0], [1.0], [False], stats=[1.0])
    with pytest.raises(ValueError, match="one value per step"):
        h.extend([0, 1], [1.0, 1.0], [False, False], stats={"zero_fraction": [1.0]})
    with pytest.raises(ValueError, match="must be one of"):
        h.stat("loss")


def test_underflow_report_names_the_worst_tensors():
    grads = [
        np.array([1.0, 2.0, 3.0, 4.0], np.float16),
        np.array([0.0, 0.0, 0.0, 1.0], np.float16),
        np.array([2.0**-20, 1.0, 0.0, 1.0], np.float16),
    ]
    stats = as_mapping(gradient_stats(grads, np, step=5), ["a", "b", "c"])
    report = underflow_report(stats, top=2)
    assert report.step == 5
    assert [r[0] for r in report.rows] == ["b", "c"]
    assert report.rows[0][1] == 0.75 and report.rows[1][2] == 0.25
    text = str(report)
    assert "step 5" in text and "b: 75.00% zero" in text and "More than 1%" in text
    assert [r[0] for r in underflow_report(stats, names=["x", "y", "z"]).rows][:1] == ["y"]


def test_underflow_report_errors():
    with pytest.raises(TypeError, match="stats_every"):
        underflow_report(None)
    stats = as_mapping(gradient_stats([np.ones(2, np.float16)], np, step=-1))
    with pytest.raises(ValueError, match="no sample yet"):
        underflow_report(stats)
    with pytest.raises(ValueError, match="top"):
        underflow_report(stats, top=0)


def test_the_diagnostics_how_to_names_history_fields_that_exist():
    from pathlib import Path

    import lossscale

    text = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "diagnostics.md").read_text(encoding="utf-8")
    sentence = text.split("**History**", 1)[1].split("to_csv", 1)[0]
    named = re.findall(r"`([a-z_]+)`", sentence)
    assert {"steps", "loss_scales", "skipped", "losses"} <= set(named)
    history = lossscale.History()
    history.extend([0, 1], [4.0, 2.0], [False, True])
    for name in named:
        assert hasattr(history, name), name
    np.testing.assert_array_equal(history.loss_scales, [4.0, 2.0])
    np.testing.assert_array_equal(history.skipped, [False, True])
