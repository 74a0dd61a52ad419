"""A control model against a loss-scaled model with a non-finite gradient injected at a known step.

The control runs the plain inner optimizer and simply does not step at the
injected step (TF: "no update is performed"). The scaled model uses
``LossScaleOptimizer`` with a power-of-two dynamic scale. The weights must
match, the inner optimizer's step counts must match, and the scale must follow
TF's rule.
"""

from __future__ import annotations

import math

import pytest
import torch

from lossscale.torch import LossScaleOptimizer

INITIAL, PERIOD, STEPS = 2.0**10, 3, 9

OPTIMIZERS = {
    "sgd-momentum-foreach": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=True),
    "sgd-momentum-fused": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, fused=True),
    "adam-foreach": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=True),
    "adam-fused": lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True),
    "adamw-foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=True),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
}


# (optimizer, check mode, how the non-finite value gets in): "grad" writes it into a gradient after the
# backward, "input" puts it in the batch, so that the backward makes it.
NAME_CHECKS = [pytest.param(n, "step", via, id=f"{n}-step-{via}") for n in OPTIMIZERS for via in ("grad", "input")]


def data(i: int):
    g = torch.Generator().manual_seed(i)
    return torch.randn(32, 6, generator=g), torch.randn(32, 3, generator=g)


def expected_scales(finites):
    """TF's rule, by hand: x2 after PERIOD finite steps in a row, /2 (floor 1) on a non-finite one."""
    scale, good, out = INITIAL, 0, []
    for finite in finites:
        if finite:
            good += 1
            if good >= PERIOD:
                scale, good = scale * 2, 0
        else:
            scale, good = max(scale / 2, 1.0), 0
        out.append((scale, good))
    return out


@pytest.mark.parametrize("name, check, via", NAME_CHECKS)
@pytest.mark.parametrize("bad_step,value", [(4, math.inf), (0, math.nan), (5, -math.inf)], ids=["inf@4", "nan@0", "-inf@5"])
def test_scaled_model_matches_control(make_model, name, check, via, bad_step, value):
    make_opt = OPTIMIZERS[name]
    control, scaled = make_model((6, 16, 3), torch.nn.ReLU), make_model((6, 16, 3), torch.nn.ReLU)
    ref = make_opt(control.parameters())
    opt = LossScaleOptimizer(
        make_opt(scaled.parameters()), initial_scale=INITIAL, dynamic_growth_steps=PERIOD
    )
    history = []
    for i in range(STEPS):
        x, y = data(i)
        if i != bad_step:
            ref.zero_grad()
            torch.nn.functional.mse_loss(control(x), y).backward()
            ref.step()
        opt.zero_grad()
        if i == bad_step and via == "input":
            x = x.clone()
            x[2, 1] = value
        opt.get_scaled_loss(torch.nn.functional.mse_loss(scaled(x), y)).backward()
        if i == bad_step and via == "grad":
            scaled[2].weight.grad[1, 3] = value
        opt.step()
        history.append((float(opt.loss_scale), int(opt.dynamic_counter)))
        for a, b in zip(control.parameters(), scaled.parameters()):
            torch.testing.assert_close(b.detach(), a.detach(), rtol=1e-6, atol=1e-7, msg=f"step {i}")
    assert history == expected_scales([i != bad_step for i in range(STEPS)])
    assert int(opt.skipped_steps) == 1
    for p_ref, p in zip(control.parameters(), scaled.parameters()):
        for key, value_ref in ref.state[p_ref].items():
            got = opt.state[p][key]
            if isinstance(value_ref, torch.Tensor):
                torch.testing.assert_close(got, value_ref, rtol=1e-6, atol=1e-7, msg=key)
            else:
                assert got == value_ref, key
        if "step" in ref.state[p_ref]:
            assert float(opt.state[p]["step"]) == STEPS - 1


@pytest.mark.parametrize("name", ["adam-fused", "adamw-fused", "sgd-momentum-fused"])
@pytest.mark.parametrize(
    "other_dtype",
    [torch.float64, torch.bfloat16],
)
@pytest.mark.parametrize("check", ["step"])
def test_fused_skip_with_two_dtype_groups_one_overflowing(name, other_dtype, check):
    """Only one (device, dtype) group overflows: the step is skipped."""
    a = torch.nn.Parameter(torch.ones(3))
    b = torch.nn.Parameter(torch.ones(3, dtype=other_dtype))
    opt = LossScaleOptimizer(OPTIMIZERS[name]([a, b]), initial_scale=4.0)
    a.grad, b.grad = torch.ones(3), torch.ones(3, dtype=other_dtype)
    opt.step()  # one good step first (creates fused SGD's momentum buffers)
    before = [a.detach().clone(), b.detach().clone()]
    a.grad = torch.tensor([math.inf, 1.0, 1.0])
    b.grad = torch.ones(3, dtype=other_dtype)
    opt.step()
    assert torch.equal(a.detach(), before[0]) and torch.equal(b.detach(), before[1])
    assert float(opt.loss_scale) == 2.0


@pytest.mark.parametrize("name", ["adam-fused", "adamw-fused", "sgd-momentum-fused"])
@pytest.mark.parametrize("other_dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("check", ["step"])
def test_fused_skip_with_two_dtype_groups_both_overflowing(name, other_dtype, check):
    """A float32 and a float64/bfloat16 parameter both overflow: no update at all, step counts untouched."""
    a = torch.nn.Parameter(torch.ones(3))
    b = torch.nn.Parameter(torch.ones(3, dtype=other_dtype))
    opt = LossScaleOptimizer(OPTIMIZERS[name]([a, b]), initial_scale=4.0)
    a.grad, b.grad = torch.ones(3), torch.ones(3, dtype=other_dtype)
    opt.step()
    before = [a.detach().clone(), b.detach().clone()]
    steps_before = {k: float(v["step"]) for k, v in enumerate(opt.state.values()) if "step" in v}
    a.grad = torch.tensor([math.inf, 1.0, 1.0])
    b.grad = torch.tensor([math.nan, 1.0, 1.0], dtype=other_dtype)
    opt.step()
    assert torch.equal(a.detach(), before[0]) and torch.equal(b.detach(), before[1])
    assert {k: float(v["step"]) for k, v in enumerate(opt.state.values()) if "step" in v} == steps_before
    assert float(opt.loss_scale) == 2.0


def test_fused_float16_and_float32_params_both_overflowing():
    """The fused float16 path (kernel unscales) with a float32 group next to it, e.g. fp16 weights, fp32 norms."""
    a = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    b = torch.nn.Parameter(torch.ones(3))
    opt = LossScaleOptimizer(torch.optim.Adam([a, b], lr=0.1, fused=True), initial_scale=4.0)
    a.grad = torch.tensor([math.inf, 1.0, 1.0], dtype=torch.float16)
    b.grad = torch.tensor([math.inf, 1.0, 1.0])
    opt.step()
    assert torch.equal(a.detach(), torch.ones(3, dtype=torch.float16)) and torch.equal(b.detach(), torch.ones(3))
    assert all(float(s["step"]) == 0 for s in opt.state.values())


@pytest.mark.parametrize("value", [math.inf, math.nan], ids=["inf", "nan"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_skipped_first_step_leaves_inner_state_empty(name, value):
    """Issue 2: a non-finite gradient means the inner optimizer's state is untouched: on a first step, still empty."""
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(OPTIMIZERS[name]([w]))
    w.grad = torch.tensor([value, 1.0])
    opt.step()
    assert torch.equal(w.detach(), torch.ones(2))
    assert opt.inner_optimizer.state_dict()["state"] == {} and opt.get_slot_names() == []
