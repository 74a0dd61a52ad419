"""Errors that name the real cause: a built-in policy's bad config, ``loss_scale=-1``, ``underflow_report``
before the first sample. numpy only; each binding's own load path is pinned in its tests/<binding>/test_messages_*.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import lossscale
from lossscale import DynamicLossScale, get, resolve_loss_scale, underflow_report
from lossscale._stats import as_mapping, empty_stats, gradient_stats

BAD_MULTIPLIER = {
    "class_name": "DynamicLossScale",
    "config": {"initial_loss_scale": 1024.0, "increment_period": 2000, "multiplier": 1.0},
}
CONSTRUCTOR_SAYS = "multiplier must be greater than 1 so the scale can grow, got 1.0. Use for example multiplier=2.0."


def test_a_built_in_policy_with_a_bad_field_says_which_field_and_why():
    with pytest.raises(ValueError) as info:
        get(BAD_MULTIPLIER)
    assert str(info.value) == f"Invalid loss scale config for DynamicLossScale: {CONSTRUCTOR_SAYS}"
    assert "not a built-in" not in str(info.value)
    # the policy constructor's own error, chained
    assert isinstance(info.value.__cause__, ValueError) and str(info.value.__cause__) == CONSTRUCTOR_SAYS
    with pytest.raises(ValueError, match=re.escape(CONSTRUCTOR_SAYS)) as direct:
        DynamicLossScale(1024, 2000, 1.0)
    assert str(direct.value) == CONSTRUCTOR_SAYS


def test_a_bad_field_of_the_wrong_type_keeps_its_type():
    with pytest.raises(TypeError, match=r"^Invalid loss scale config for DynamicLossScale: increment_period must be"):
        get({"class_name": "DynamicLossScale", "config": {"increment_period": 2.5}})


def test_an_unknown_class_still_says_custom_objects():
    with pytest.raises(ValueError, match=r"custom_objects=\{'MyLossScale': MyLossScale\}"):
        get({"class_name": "MyLossScale", "config": {}})


@pytest.mark.parametrize("build", [lambda v: get(v), lambda v: resolve_loss_scale(v)], ids=["get", "resolve"])
def test_loss_scale_minus_one_names_loss_scale(build):
    with pytest.raises(ValueError) as info:
        build(-1)
    assert str(info.value) == (
        "loss_scale must be positive, got -1.0. Pass a positive finite number, for example loss_scale=2**15."
    )
    with pytest.raises(ValueError, match=r"^loss_scale must be at least 1, got 0.5: "):
        build(0.5)
    with pytest.raises(ValueError, match=r"^loss_scale must be finite"):
        build(float("inf"))


def test_the_policy_itself_still_names_its_own_argument():
    with pytest.raises(ValueError, match=r"^loss_scale_value must be positive, got -1.0"):
        lossscale.FixedLossScale(-1)


class _Holder:
    """What underflow_report reads of an optimizer: ``gradient_stats`` and ``_stats_progress()``."""

    def __init__(self, stats, progress):
        self.gradient_stats, self._progress = stats, progress

    def _stats_progress(self):
        return self._progress


def test_underflow_report_before_the_first_sample_says_when_it_comes():
    with pytest.raises(ValueError) as info:
        underflow_report(_Holder(None, (4, 0)))
    assert str(info.value) == (
        "No gradient statistics sample yet: with stats_every=4 the first sample is taken at step 0; 0 steps so far. "
        "Call underflow_report after that step."
    )
    with pytest.raises(ValueError, match=r"with stats_every=4 the first sample is taken at step 8; 5 steps so far"):
        underflow_report(_Holder(None, (4, 5)))  # a restored step count
    with pytest.raises(ValueError, match=r"stats_every=100 the first sample is taken at step 100; 1 step so far"):
        underflow_report(_Holder(None, (100, 1)))
    empty = as_mapping(empty_stats(2, np))
    with pytest.raises(ValueError, match=r"at step 0; 0 steps so far"):
        underflow_report(_Holder(empty, (4, 0)))


def test_underflow_report_without_the_optimizer_says_what_none_and_step_minus_one_mean():
    with pytest.raises(ValueError, match=r"^stats holds no sample yet \(step -1\): the first sample is taken at the "
                                         r"first step \(step 0\)"):
        underflow_report(as_mapping(empty_stats(2, np)))
    with pytest.raises(TypeError) as info:
        underflow_report(None)
    assert "Pass stats_every=N" not in str(info.value)
    assert "Either the optimizer records none (pass stats_every=N to it), or no sample was taken yet" in str(info.value)
    assert "underflow_report(opt)" in str(info.value)


def test_underflow_report_of_an_optimizer_without_statistics_says_stats_every():
    with pytest.raises(TypeError, match=r"^This _Holder records no gradient statistics: build the optimizer with "
                                        r"stats_every=N"):
        underflow_report(_Holder(None, None))


def test_underflow_report_takes_the_optimizer_once_sampled():
    stats = as_mapping(gradient_stats([np.array([0.0, 1.0], np.float16)], np, step=3), ["w"])
    report = underflow_report(_Holder(stats, (4, 4)))
    assert report.step == 3 and report.rows[0][0] == "w" and report.rows[0][1] == 0.5


def test_a_policy_built_for_a_caller_speaks_its_names_and_only_inside():
    """The stable form's names in a validation message (written with them, not rewritten), then the policy's again."""
    from lossscale._policy import caller_names

    with pytest.raises(ValueError, match=r"^initial_scale=0.5 is below min_loss_scale=1.0; raise initial_scale or"):
        lossscale.resolve_loss_scale(initial_scale=0.5)
    growth = pytest.raises(ValueError, match=r"^growth_interval must be an int in \[1, 2\*\*31 - 1\]")
    with caller_names({"increment_period": "growth_interval"}), growth:
        lossscale.DynamicLossScale(increment_period=0)
    with pytest.raises(ValueError, match=r"^increment_period must be an int in \[1, 2\*\*31 - 1\]"):
        lossscale.DynamicLossScale(increment_period=0)
