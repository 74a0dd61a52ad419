"""Migrating from ``torch.amp.GradScaler`` (docs/migration/gradscaler.md, "What carries over"/"What differs"):
train with torch's scaler, save as users do (``torch.save`` of the model, the optimizer and ``scaler.state_dict()``),
switch to lossscale, load, train on, and compare with a run that never stopped. Each row of the page's two tables
names the test here that backs it."""

from __future__ import annotations

import math

import pytest
import torch

import lossscale.torch as lst

STEPS, SAVE_AT, INF_AT = 10, 5, (3, 7)
CONFIG = {"init_scale": 2.0**10, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)


def _iteration(model, opt, scaler, i, clip=None):
    x, y = _batch(i)
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    if i in INF_AT:
        model[0].weight.grad[0, 0] = math.inf
    if clip is not None:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    scaler.step(opt)
    scaler.update()
    return scaler.get_scale()


def _run(scaler_cls, steps, *, model=None, opt=None, scaler=None, clip=None, fused=False):
    model = _model() if model is None else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused) if opt is None else opt
    scaler = scaler_cls("cpu", **CONFIG) if scaler is None else scaler
    scales = [_iteration(model, opt, scaler, i, clip) for i in steps]
    return model, opt, scaler, scales


def _assert_same_weights(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("clip", [None, 1.0], ids=["plain", "unscale_+clip"])
@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_switching_gradscaler_mid_run_matches_the_uninterrupted_run(tmp_path, clip, fused):
    """Carries over: the weights, the optimizer's state, the scale and its growth counter (torch's five keys)."""
    ref_model, _, ref_scaler, ref_scales = _run(torch.amp.GradScaler, range(STEPS), clip=clip, fused=fused)
    model, opt, scaler, _ = _run(torch.amp.GradScaler, range(SAVE_AT), clip=clip, fused=fused)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict()},
               tmp_path / "ckpt.pt")

    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    model = _model()
    model.load_state_dict(saved["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    opt.load_state_dict(saved["optimizer"])
    scaler = lst.GradScaler("cpu", **CONFIG)  # the import changed, nothing else
    scaler.load_state_dict(saved["scaler"])
    assert scaler.get_scale() == saved["scaler"]["scale"] and scaler._get_growth_tracker() == \
        saved["scaler"]["_growth_tracker"]
    _, _, scaler, scales = _run(lst.GradScaler, range(SAVE_AT, STEPS), model=model, opt=opt, scaler=scaler, clip=clip)
    assert scales == ref_scales[SAVE_AT:]
    assert scaler.get_scale() == ref_scaler.get_scale()
    assert scaler._get_growth_tracker() == ref_scaler._get_growth_tracker()
    _assert_same_weights(model, ref_model)


def test_back_to_torch_loads_lossscales_state_dict(tmp_path):
    """Carries over, the other way: torch's GradScaler loads our state dict (its five keys; ours is extra)."""
    ref_model, _, ref_scaler, _ = _run(torch.amp.GradScaler, range(STEPS))
    model, opt, scaler, _ = _run(lst.GradScaler, range(SAVE_AT))
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict()},
               tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert set(saved["scaler"]) == {"scale", "growth_factor", "backoff_factor", "growth_interval",
                                    "_growth_tracker", "lossscale"}
    model = _model()
    model.load_state_dict(saved["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.load_state_dict(saved["optimizer"])
    scaler = torch.amp.GradScaler("cpu", **CONFIG)
    scaler.load_state_dict(saved["scaler"])
    _run(torch.amp.GradScaler, range(SAVE_AT, STEPS), model=model, opt=opt, scaler=scaler)
    assert scaler.get_scale() == ref_scaler.get_scale()
    _assert_same_weights(model, ref_model)


def test_skip_counters_start_at_the_switch(tmp_path):
    """Differs: torch keeps no skip count, so ``skipped_steps`` counts the skips since the switch."""
    model, opt, scaler, _ = _run(torch.amp.GradScaler, range(SAVE_AT))
    ours = lst.GradScaler("cpu", **CONFIG)
    ours.load_state_dict(scaler.state_dict())
    assert int(ours.skipped_steps) == 0  # step 3 overflowed under torch's scaler: not counted
    _run(lst.GradScaler, range(SAVE_AT, STEPS), model=model, opt=opt, scaler=ours)
    assert int(ours.skipped_steps) == 1 and not bool(ours.last_step_skipped)  # step 7


def test_a_scale_below_the_floor_is_clamped_on_load():
    """Differs: torch's scale may have fallen below 1; it loads clamped to ``min_loss_scale`` (1 by default)."""
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**-3)
    ours = lst.GradScaler("cpu")
    ours.load_state_dict(torch_scaler.state_dict())
    assert ours.get_scale() == 1.0
    low = lst.GradScaler("cpu", min_loss_scale=2.0**-8)
    low.load_state_dict(torch_scaler.state_dict())
    assert low.get_scale() == 2.0**-3


def test_wrapping_the_optimizer_instead_carries_the_scale_and_restarts_the_growth_counter(tmp_path):
    """The other way in: ``LossScaleOptimizer`` takes the saved scale and interval as its policy; the growth
    counter (one finite step at the save) starts again from 0, so the next growth comes that many steps later."""
    model, opt, scaler, _ = _run(torch.amp.GradScaler, range(SAVE_AT))
    saved = scaler.state_dict()
    assert saved["_growth_tracker"] == 1
    wrapped = lst.LossScaleOptimizer(opt, initial_scale=saved["scale"], dynamic_growth_steps=saved["growth_interval"])
    scales = []
    for i in range(SAVE_AT, STEPS):
        x, y = _batch(i)
        wrapped.zero_grad(set_to_none=True)
        wrapped.get_scaled_loss(torch.nn.functional.mse_loss(model(x), y)).backward()
        if i in INF_AT:
            model[0].weight.grad[0, 0] = math.inf
        wrapped.step()
        scales.append(float(wrapped.loss_scale))
    _, _, _, ref_scales = _run(torch.amp.GradScaler, range(STEPS))
    start = saved["scale"]
    assert scales == [start, start * 2, start, start, start * 2]
    assert ref_scales[SAVE_AT:] == [start * 2, start * 2, start, start, start * 2]


def test_a_step_without_gradients_and_an_update_without_a_step_are_no_ops():
    """Differs: torch raises an AssertionError for both; lossscale does nothing."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = lst.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.ones((), requires_grad=True))  # scaled, but no parameter got a gradient
    before = [p.detach().clone() for p in model.parameters()]
    assert scaler.step(opt) is None
    scaler.update()
    scaler.update()
    assert scaler.get_scale() == 8.0 and scaler._get_growth_tracker() == 0
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    torch_scaler.scale(torch.ones((), requires_grad=True))
    with pytest.raises(AssertionError):
        torch_scaler.step(opt)


def test_a_scale_that_may_fall_below_one_unscales_before_a_fused_kernel():
    """Differs: with ``min_loss_scale < 1`` a fused optimizer gets float32 gradients unscaled and ``grad_scale``
    None (the check saw ``g / S``); with the default floor it gets the scaled ones and ``grad_scale = S``."""
    seen = []

    class Recording(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})
            self._step_supports_amp_scaling = True

        def step(self, closure=None):
            seen.append((self.grad_scale, [p.grad.clone() for g in self.param_groups for p in g["params"]]))

    for floor in (1.0, 2.0**-4):
        model = _model()
        scaler = lst.GradScaler("cpu", init_scale=4.0, min_loss_scale=floor)
        scaler.scale(torch.nn.functional.mse_loss(model(_batch(0)[0]), _batch(0)[1])).backward()
        scaled = [p.grad.clone() for p in model.parameters()]
        scaler.step(Recording(model.parameters()))
        scaler.update()
        grad_scale, grads = seen[-1]
        if floor == 1.0:
            assert float(grad_scale) == 4.0 and all(torch.equal(g, s) for g, s in zip(grads, scaled))
        else:
            assert grad_scale is None and all(torch.equal(g, s / 4.0) for g, s in zip(grads, scaled))
