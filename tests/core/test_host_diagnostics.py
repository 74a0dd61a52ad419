"""``lossscale._diagnostics``: ``history=`` as every binding accepts it, the recorder's numbering, the stall guard."""

from __future__ import annotations

import numpy as np
import pytest

import lossscale
from lossscale import History, LossScaleError
from lossscale._diagnostics import HistoryRecorder, StallGuard, check_history


def test_history_true_false_none_and_a_history():
    made = check_history(True)
    assert isinstance(made, History) and len(made) == 0 and check_history(True) is not made
    assert check_history(False) is None and check_history(None) is None
    mine = History()
    assert check_history(mine) is mine


@pytest.mark.parametrize("bad", [[], "yes", 1, {"steps": []}])
def test_anything_else_as_history_names_what_is_accepted(bad):
    with pytest.raises(TypeError, match=rf"history must be a lossscale.History, True \(a new one\) or False/None "
                                        rf"\(off\), got {type(bad).__name__}\."):
        check_history(bad)


def test_the_recorder_numbers_steps_after_the_last_one_recorded():
    history = History()
    history.append(6, 2.0, False)
    recorder = HistoryRecorder(history)
    assert recorder.next_step == 7
    recorder.append(4.0, True, loss=0.5, stats={"headroom_bits": 3.0})
    recorder.extend([8.0, 8.0], [False, True])
    assert history.steps.tolist() == [6, 7, 8, 9]
    assert history.loss_scales.tolist() == [2.0, 4.0, 8.0, 8.0]
    assert history.skipped.tolist() == [False, True, False, True]
    assert history.losses[1] == 0.5 and np.isnan(history.losses[2])
    assert history.stat("headroom_bits")[1] == 3.0 and np.isnan(history.stat("headroom_bits")[2])
    assert recorder.next_step == 10


def test_given_step_numbers_are_kept_and_must_increase():
    recorder = HistoryRecorder(History())
    recorder.extend([1.0, 1.0], [False, False], steps=[3, 5])
    recorder.append(1.0, False, step=9)
    assert recorder.history.steps.tolist() == [3, 5, 9] and recorder.next_step == 10
    with pytest.raises(ValueError, match="steps must increase strictly"):
        recorder.append(1.0, False, step=9)


def test_the_guard_raises_at_its_limit_with_the_bindings_words():
    guard = StallGuard(3, loss_check="xp.isfinite(loss)", causes="  * a cause of this framework;\n",
                       see="debug=True or ")
    guard.check(2, 1.0)  # under the limit: nothing
    with pytest.raises(LossScaleError) as raised:
        guard.check(3, 0.25)
    message = str(raised.value)
    assert message.startswith("3 steps in a row were skipped because gradients held NaN or Inf (loss scale now 0.25; "
                              "max_consecutive_skips=3).")
    assert "check xp.isfinite(loss);\n" in message and "  * a cause of this framework;\n" in message
    assert message.endswith("Pass debug=True or max_consecutive_skips=None to disable this check.")


@pytest.mark.parametrize(("limit", "error"), [(0, ValueError), (True, TypeError), (2.5, TypeError), (None, TypeError)])
def test_the_guard_limit_is_checked(limit, error):
    with pytest.raises(error, match="max_consecutive_skips"):
        StallGuard(limit, loss_check="", causes="")


def test_the_recorder_refuses_what_is_not_a_history():
    with pytest.raises(TypeError, match="history must be a lossscale.History, got list"):
        HistoryRecorder([])  # type: ignore[arg-type]
    assert lossscale.History is History
