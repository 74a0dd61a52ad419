"""Issue 4: policy controls, the stall guard, the skip signal, the overflow report, skip-only mode."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
import torch
from sync_counter import count_syncs

from lossscale import DynamicLossScale, FixedLossScale, LossScaleError
from lossscale.torch import LossScaleOptimizer
from tests.reference import PATTERN, POLICIES, trajectory


def optimizer_stepper(fused):
    """``trajectory`` backend: a LossScaleOptimizer over AdamW, fed a NaN or -Inf on each non-finite step."""

    def make(policy):
        w = torch.nn.Parameter(torch.zeros(3))
        opt = LossScaleOptimizer(torch.optim.AdamW([w], lr=1e-3, fused=fused), loss_scale=policy)
        count = [0]

        def step(finite):
            opt.zero_grad()
            opt.get_scaled_loss((w * torch.tensor([1.0, 2.0, 3.0]) * 2.0**-4).sum()).backward()  # finite at S = 2**127
            if not finite:
                w.grad[1] = float("nan") if count[0] % 2 else float("-inf")
            count[0] += 1
            opt.step()
            return opt.shared_loss_scale.state

        return step

    return make


def numpy_trajectory(policy, pattern):
    return trajectory(policy, pattern, "numpy")


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_each_control_follows_the_numpy_reference_through_the_optimizer(policy, fused):
    assert trajectory(policy, PATTERN, optimizer_stepper(fused)) == trajectory(policy, PATTERN, "numpy")


def test_control_tables():
    scales = lambda policy, pattern: [s[0] for s in numpy_trajectory(policy, pattern)]
    # The floor can be below TF's 1.
    assert scales(DynamicLossScale(2, 3, min_loss_scale=0.25), [False] * 5) == [1, 0.5, 0.25, 0.25, 0.25]
    # Growth is clamped to the ceiling.
    assert scales(DynamicLossScale(8, 1, max_loss_scale=20), [True] * 3) == [16, 20, 20]
    # A separate backoff factor.
    assert scales(DynamicLossScale(64, 3, backoff_factor=0.25), [False, False]) == [16, 4]
    # Hysteresis 3: the third overflow since the last change backs off; finite steps in between do not reset it.
    assert scales(DynamicLossScale(64, 10, hysteresis=3), [False, True, False, True, False, False]) == [64, 64, 64, 64, 32, 32]
    # ... but a scale change (growth) does.
    assert scales(DynamicLossScale(64, 2, hysteresis=2), [False, True, True, False, False]) == [64, 64, 128, 128, 64]


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_skip_signal_on_both_paths(fused):
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.Adam([w], fused=fused), initial_scale=4.0)
    seen = []
    for i in range(5):
        opt.zero_grad()
        opt.get_scaled_loss(w.sum()).backward()
        if i in (1, 2):
            w.grad[0] = float("inf")
        opt.step()
        flag = opt.last_step_skipped
        assert flag.dtype == torch.bool and flag.dim() == 0
        seen.append(bool(flag))
    assert seen == [False, True, True, False, False]
    assert int(opt.skipped_steps) == 2
    # The count survives a checkpoint.
    other = LossScaleOptimizer(torch.optim.Adam([torch.nn.Parameter(torch.ones(2))], fused=fused))
    other.load_state_dict(opt.state_dict())
    assert int(other.skipped_steps) == 2


def test_reading_the_skip_signal_does_not_sync():
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.Adam([w], fused=True))
    opt.get_scaled_loss(w.sum()).backward()
    opt.step()
    assert count_syncs(lambda: (opt.last_step_skipped, opt.skipped_steps, opt.loss_scale)) == 0


def _stalling_run(opt, w, steps, bad):
    for i in range(steps):
        opt.zero_grad()
        opt.get_scaled_loss(w.sum()).backward()
        if bad(i):
            w.grad[0] = float("nan")
        opt.step()


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_stall_guard_raises_after_n_consecutive_skips(fused):
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.Adam([w], fused=fused), initial_scale=4.0, max_consecutive_skips=3)
    with pytest.raises(LossScaleError) as info:
        _stalling_run(opt, w, 10, bad=lambda i: i >= 2)
    message = str(info.value)
    assert message.startswith("3 steps in a row were skipped")
    for cause in ("NaN in the loss", "learning rate", "bfloat16", "stale gradients", "max_consecutive_skips=None"):
        assert cause in message
    assert isinstance(info.value, RuntimeError)
    assert int(opt.skipped_steps) == 3


def test_stall_guard_tolerates_interleaved_finite_steps():
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), max_consecutive_skips=2)
    _stalling_run(opt, w, 12, bad=lambda i: i % 2 == 0)  # one skip at a time never stalls
    assert int(opt.skipped_steps) == 6


@pytest.mark.parametrize(
    "kwargs, asked, not_asked",
    [
        ({}, ["Pass overflow_report=True (with named_parameters=model.named_parameters())"], ["last_overflow_report"]),
        ({"overflow_report": True}, ["last_overflow_report", "Pass named_parameters=model.named_parameters() to name"],
         ["overflow_report=True"]),
        ({"overflow_report": True, "named": True}, ["last_overflow_report", "Pass max_consecutive_skips=None"],
         ["overflow_report=True", "named_parameters="]),
    ],
    ids=["nothing-set", "report-set", "report-and-names-set"],
)
def test_the_stall_error_asks_only_for_options_not_already_set(kwargs, asked, not_asked):
    w = torch.nn.Parameter(torch.ones(2))
    if kwargs.pop("named", False):
        kwargs["named_parameters"] = [("w", w)]
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), max_consecutive_skips=2, **kwargs)
    with pytest.raises(LossScaleError) as info:
        _stalling_run(opt, w, 4, bad=lambda i: True)
    message = str(info.value)
    assert message.endswith("max_consecutive_skips=None to disable this check.")
    for text in asked:
        assert text in message, text
    for text in not_asked:
        assert text not in message, text


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError)])
def test_stall_guard_validation(bad, error):
    with pytest.raises(error, match="max_consecutive_skips"):
        LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0), max_consecutive_skips=bad)


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_overflow_report_names_the_tensors_and_kinds(fused, caplog):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    opt = LossScaleOptimizer(
        torch.optim.AdamW(model.parameters(), fused=fused),
        initial_scale=16.0,
        overflow_report=True,
        named_parameters=model.named_parameters(),
    )
    opt.get_scaled_loss(model(torch.randn(2, 3)).sum()).backward()
    opt.step()
    assert opt.last_overflow_report is None  # finite step: no report
    opt.zero_grad()
    opt.get_scaled_loss(model(torch.randn(2, 3)).sum()).backward()
    model[0].weight.grad[1, 1] = float("nan")
    model[1].bias.grad[0] = float("-inf")
    with caplog.at_level(logging.WARNING, logger="lossscale"):
        opt.step()
    report = opt.last_overflow_report
    assert report.step == 1 and report.loss_scale == 16.0
    assert report.nonfinite == [("0.weight", True, False), ("1.bias", False, True)]
    assert "0.weight: NaN" in caplog.text and "1.bias: Inf" in caplog.text


def test_overflow_report_without_names_and_through_apply_gradients():
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    opt = LossScaleOptimizer(torch.optim.SGD([a, b], lr=1.0), overflow_report=True)
    opt.apply_gradients([(torch.ones(2), a), (torch.tensor([1.0, float("inf"), float("nan")]), b)])
    assert opt.last_overflow_report.nonfinite == [("param_groups[0]['params'][1] (3,)", True, True)]
    assert torch.equal(b.detach(), torch.ones(3))


def test_overflow_report_adds_no_sync_on_the_unfused_path_and_names_need_it_on():
    w = torch.nn.Parameter(torch.ones(4))
    on = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), overflow_report=True)
    w2 = torch.nn.Parameter(torch.ones(4))
    off = LossScaleOptimizer(torch.optim.SGD([w2], lr=0.1))
    for opt, p in ((on, w), (off, w2)):
        opt.get_scaled_loss(p.sum()).backward()
    assert count_syncs(on.step) == count_syncs(off.step) == 1
    with pytest.raises(ValueError, match="overflow_report=True"):
        LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0), named_parameters=[])


def test_skip_only_mode_for_bfloat16():
    # FixedLossScale(1): no scaling, yet a step with a NaN is still skipped. bfloat16
    # gradients are accepted (bfloat16 has float32's range, unscaling cannot underflow).
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8).bfloat16())
    reference = w.detach().clone()
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5), loss_scale=FixedLossScale(1))
    grads = [torch.randn(8).bfloat16() for _ in range(4)]
    grads[2][3] = float("nan")
    for g in grads:
        w.grad = g.clone()
        assert float(opt.get_scaled_loss(torch.tensor(3.0, dtype=torch.bfloat16))) == 3.0
        opt.step()
    for i, g in enumerate(grads):
        if i != 2:
            reference -= 0.5 * g
    assert torch.equal(w.detach(), reference)
    assert float(opt.loss_scale) == 1.0 and int(opt.skipped_steps) == 1


def test_diagnostics_survive_pickling():
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), max_consecutive_skips=2, overflow_report=True)
    clone = pickle.loads(pickle.dumps(opt))
    clone_w = clone.param_groups[0]["params"][0]
    with pytest.raises(LossScaleError):
        _stalling_run(clone, clone_w, 3, bad=lambda i: True)
    assert clone.last_overflow_report is not None


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_history_records_every_step_without_a_sync_per_step(fused, tmp_path):
    from lossscale import History

    losses = [0.5, 0.25, 2.0, 1.0, 4.0]

    def run(history):
        w = torch.nn.Parameter(torch.ones(2))
        opt = LossScaleOptimizer(
            torch.optim.Adam([w], fused=fused), initial_scale=8.0, dynamic_growth_steps=2, history=history
        )

        def one_step(i):
            opt.zero_grad()
            opt.get_scaled_loss(w.sum() * 0 + losses[i]).backward()
            w.grad.fill_(8.0)
            if i == 2:
                w.grad[1] = float("inf")
            opt.step()

        return opt, [count_syncs(lambda i=i: one_step(i)) for i in range(5)]

    opt, syncs = run(history=True)
    assert syncs == run(history=None)[1]  # the recorder adds no sync to any step
    history = opt.history
    assert isinstance(history, History)
    assert history.steps.tolist() == [0, 1, 2, 3, 4]
    assert history.loss_scales.tolist() == [8.0, 8.0, 16.0, 8.0, 8.0]  # the scale each step used
    assert history.skipped.tolist() == [False, False, True, False, False]
    assert history.losses.tolist() == losses
    history.to_csv(tmp_path / "h.csv")
    assert History.from_csv(tmp_path / "h.csv").loss_scales.tolist() == history.loss_scales.tolist()


def test_history_flushes_in_batches():
    from lossscale.torch._diagnostics import StepRecorder

    recorder = StepRecorder(flush_every=3)
    for step in range(7):
        recorder.append(step, torch.tensor(2.0), torch.tensor(step == 4))
    assert len(recorder.history) == 6  # two transfers of three rows; one row still queued
    recorder.flush()
    assert recorder.history.skipped.tolist() == [False] * 4 + [True] + [False] * 2
    assert recorder.history.losses.shape == (7,) and np.isnan(recorder.history.losses).all()  # no loss noted
    with pytest.raises(TypeError, match="lossscale.History"):
        StepRecorder(history="yes")
