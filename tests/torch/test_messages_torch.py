"""The torch binding's errors name the real cause: a checkpoint's built-in policy with a bad field (every load
path), ``loss_scale=-1``, ``underflow_report`` before the first sample."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import lossscale
import lossscale.torch as lst

CONSTRUCTOR_SAYS = "multiplier must be greater than 1 so the scale can grow, got 1.0. Use for example multiplier=2.0."
SAYS = f"This checkpoint's loss scale policy is unreadable: Invalid loss scale config for DynamicLossScale: {CONSTRUCTOR_SAYS}"


def _params():
    return [torch.nn.Parameter(torch.ones(2))]


def _bad(policy: dict) -> dict:
    policy = copy.deepcopy(policy)
    policy["config"]["multiplier"] = 1.0
    return policy


def _check(error: pytest.ExceptionInfo) -> None:
    assert str(error.value) == SAYS
    assert "not a built-in" not in str(error.value) and "custom_objects" not in str(error.value)
    cause = error.value.__cause__
    assert isinstance(cause, ValueError) and CONSTRUCTOR_SAYS in str(cause)


def test_loss_scale_optimizer_load_names_the_bad_field():
    opt = lst.LossScaleOptimizer(torch.optim.SGD(_params(), lr=0.1))
    saved = opt.state_dict()
    saved["lossscale"]["policy"] = _bad(saved["lossscale"]["policy"])
    before = float(opt.loss_scale)
    with pytest.raises(ValueError) as info:
        opt.load_state_dict(saved)
    _check(info)
    assert float(opt.loss_scale) == before  # nothing loaded


def test_shared_loss_scale_load_names_the_bad_field():
    shared = lst.SharedLossScale()
    saved = shared.state_dict()
    saved["policy"] = _bad(saved["policy"])
    with pytest.raises(ValueError) as info:
        lst.SharedLossScale().load_state_dict(saved)
    _check(info)


def test_gradscaler_load_names_the_bad_field():
    scaler = lst.GradScaler("cpu")
    saved = scaler.state_dict()
    saved["lossscale"]["policy"] = _bad(saved["lossscale"]["policy"])
    with pytest.raises(ValueError, match=re.escape(f"Invalid loss scale config for DynamicLossScale: {CONSTRUCTOR_SAYS}")) as info:
        lst.GradScaler("cpu").load_state_dict(saved)
    assert "not a built-in" not in str(info.value)


def test_an_unknown_class_still_asks_for_custom_objects():
    opt = lst.LossScaleOptimizer(torch.optim.SGD(_params(), lr=0.1))
    saved = opt.state_dict()
    saved["lossscale"]["policy"] = {"class_name": "MyScale", "config": {}}
    with pytest.raises(ValueError, match=r"its class 'MyScale' is not a built-in policy.*custom_objects=\{'MyScale'"):
        opt.load_state_dict(saved)


@pytest.mark.parametrize("value", [-1, 0])
def test_loss_scale_minus_one_names_loss_scale(value):
    with pytest.raises(ValueError) as info:
        lst.LossScaleOptimizer(torch.optim.SGD(_params(), lr=0.1), loss_scale=value)
    assert str(info.value) == (
        f"loss_scale must be positive, got {float(value)!r}. Pass a positive finite number, for example "
        "loss_scale=2**15."
    )


def _step(opt, param):
    opt.zero_grad()
    opt.get_scaled_loss((param * 2.0).sum()).backward()
    opt.step()


def test_underflow_report_before_the_first_sample_says_when_it_comes():
    param = torch.nn.Parameter(torch.ones(3))
    opt = lst.LossScaleOptimizer(torch.optim.SGD([param], lr=0.1), stats_every=4)
    with pytest.raises(ValueError) as info:
        lossscale.underflow_report(opt)
    assert str(info.value) == (
        "No gradient statistics sample yet: with stats_every=4 the first sample is taken at step 0; 0 steps so far. "
        "Call underflow_report after that step."
    )
    with pytest.raises(TypeError, match=r"no sample was taken yet: the first is taken at the first step"):
        lossscale.underflow_report(opt.gradient_stats)  # None: the message says both causes
    # a restored step count: no sample until the next multiple of stats_every
    saved = opt.state_dict()
    saved["lossscale_stats"]["iteration"] = 5
    resumed = lst.LossScaleOptimizer(torch.optim.SGD([param], lr=0.1), stats_every=4)
    resumed.load_state_dict(saved)
    with pytest.raises(ValueError, match=r"stats_every=4 the first sample is taken at step 8; 5 steps so far"):
        lossscale.underflow_report(resumed)
    _step(opt, param)
    report = lossscale.underflow_report(opt, names=["w"])
    assert report.step == 0 and report.rows == (("w", 0.0, 0.0, report.headroom_bits),)


def test_underflow_report_of_an_optimizer_without_statistics():
    opt = lst.LossScaleOptimizer(torch.optim.SGD(_params(), lr=0.1))
    with pytest.raises(TypeError, match=r"^This LossScaleOptimizer records no gradient statistics: build the "
                                        r"optimizer with stats_every=N"):
        lossscale.underflow_report(opt)


def test_gradscaler_underflow_report_before_the_first_sample():
    scaler = lst.GradScaler("cpu", stats_every=3)
    with pytest.raises(ValueError, match=r"^No gradient statistics sample yet: with stats_every=3 the first sample "
                                         r"is taken at step 0; 0 steps so far"):
        lossscale.underflow_report(scaler)


def test_underflow_report_names_from_named_parameters_label_the_right_tensors():
    # docs/gradient_stats.md: names=[n for n, _ in model.named_parameters()] with the optimizer over
    # model.parameters(); without names=, the report says param_groups[0]['params'][i].
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    with torch.no_grad():
        model[0].bias.zero_()
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), stats_every=2)
    names = [name for name, _ in model.named_parameters()]
    opt.zero_grad()
    x = torch.ones(2, 3)
    x[:, 1] = 0.0  # the first layer's weight column 1 gets exactly zero gradient: 4 of its 12 entries
    opt.get_scaled_loss(model(x).sum()).backward()
    opt.step()
    report = lossscale.underflow_report(opt, names=names, top=1)
    assert report.rows[0][0] == "0.weight" and report.rows[0][1] == pytest.approx(4 / 12)
    default = lossscale.underflow_report(opt, top=1)
    assert default.rows[0][0] == "param_groups[0]['params'][0]"


def _report_after_half_zero_gradients(make):
    """The report after one step whose gradient is half zeros (a dead ReLU's share), from the optimizer itself."""
    param = torch.nn.Parameter(torch.ones(4))
    opt = make([param])
    loss = (param * torch.tensor([0.0, 0.0, 1.0, 1.0])).sum()
    if isinstance(opt, lst.GradScaler):
        inner = torch.optim.SGD([param], lr=0.1)
        opt.scale(loss).backward()
        opt.step(inner)
        opt.update()
    else:
        opt.get_scaled_loss(loss).backward()
        opt.step()
    return lossscale.underflow_report(opt, names=["w"])


@pytest.mark.parametrize(
    "make, policy, says, never",
    [
        (lambda p: lst.LossScaleOptimizer(torch.optim.SGD(p, lr=0.1), loss_scale="auto"), "AutoLossScale",
         "with loss_scale='auto' already setting the scale", "use loss_scale='auto'"),
        (lambda p: lst.LossScaleOptimizer(torch.optim.SGD(p, lr=0.1), stats_every=1), "DynamicLossScale",
         "raise the loss scale, or use loss_scale='auto' (experimental)", "already"),
        (lambda p: lst.GradScaler("cpu", stats_every=1), "GradScaler",
         "raise init_scale, or use lossscale.torch.LossScaleOptimizer(..., loss_scale='auto')", "already"),
    ],
    ids=["auto", "dynamic", "gradscaler"],
)
def test_the_underflow_advice_fits_the_loss_scale_already_in_use(make, policy, says, never):
    report = _report_after_half_zero_gradients(make)
    assert report.policy == policy and report.zero_fraction == 0.5
    text = str(report)
    assert text.splitlines()[-1].startswith("More than 1% of the gradients are zero")
    assert says in text and never not in text
    assert repr(report) == text  # shown in a REPL or notebook: the text, not the dataclass
