"""On a CUDA device: statistics and ``auto`` add no host sync, and the sample equals the numpy core's.

``torch.cuda.set_sync_debug_mode("error")`` turns every host sync into a RuntimeError. A fused optimizer's step
makes none of its own once its state exists, so around those steps any sync would be loss scaling's: sampled steps
and unsampled ones, a private scale, ``auto``, and ``GradScaler`` with two optimizers. With an unfused optimizer the
step reads its found-inf flag on the host (one sync, by design): statistics must add none to it. Skipped without
CUDA (``pytest -m cuda`` on a GPU machine).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import lossscale
import lossscale.torch as lst
from lossscale._auto import initial_auto_state, next_auto_state
from lossscale._stats import gradient_stats as numpy_stats
from tests.torch.sync_counter import count_syncs

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

FIELDS = ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms_min")


@contextlib.contextmanager
def syncs_raise():
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).cuda()


X = None


def _loss(model):
    global X
    if X is None:
        X = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)).cuda()
    with torch.autocast("cuda", dtype=torch.float16):
        return (model(X).float() ** 2).mean() * 1e-3


def _backward(opt, model):
    opt.zero_grad(set_to_none=True)
    opt.get_scaled_loss(_loss(model)).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def assert_sample(got, scaled):
    ref = numpy_stats([g.float().cpu().numpy() for g in scaled], np)
    for name in FIELDS:
        np.testing.assert_allclose(float(got[name]), float(getattr(ref, name)), rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("loss_scale", ["dynamic", "auto"])
def test_sampled_and_unsampled_fused_steps_make_no_host_sync(loss_scale):
    model = _model()
    opt = lst.LossScaleOptimizer(torch.optim.AdamW(model.parameters(), 1e-4, fused=True), loss_scale, stats_every=2)
    _backward(opt, model)
    opt.step()  # the first fused step creates the optimizer state (a sync of torch's own)
    with syncs_raise():
        for _ in range(4):  # two unsampled steps and two sampled ones
            scaled = _backward(opt, model)
            opt.step()
    assert_sample(opt.gradient_stats, scaled)
    assert int(opt.gradient_stats["step"]) == 4


def test_gradscaler_samples_two_fused_optimizers_without_a_host_sync():
    model = _model()
    first = torch.optim.AdamW(model[0].parameters(), 1e-4, fused=True)
    second = torch.optim.AdamW(model[2].parameters(), 1e-4, fused=True)
    scaler = lst.GradScaler("cuda", stats_every=1)

    def iteration():
        first.zero_grad(set_to_none=True)
        second.zero_grad(set_to_none=True)
        scaler.scale(_loss(model)).backward()
        scaled = [p.grad.detach().clone() for p in model.parameters()]
        scaler.step(first)
        scaler.step(second)
        scaler.update()
        return scaled

    iteration()
    with syncs_raise():
        scaled = iteration()
    assert_sample(scaler.gradient_stats, scaled)
    names = scaler.gradient_stats["per_tensor"]["names"]
    assert {name.split(".")[0] for name in names} == {"opt0", "opt1"}


def test_statistics_add_no_sync_to_an_unfused_step():
    def syncs(stats_every):
        model = _model()
        opt = lst.LossScaleOptimizer(torch.optim.AdamW(model.parameters(), 1e-4, foreach=True), "dynamic",
                                     stats_every=stats_every)
        _backward(opt, model)
        opt.step()

        def steps():
            for _ in range(4):
                _backward(opt, model)
                opt.step()
        return count_syncs(steps)

    assert syncs(1) == syncs(None) > 0


def test_auto_on_cuda_moves_the_scale_as_the_numpy_core_does():
    model = _model()
    policy = lossscale.AutoLossScale(2.0**10)
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), policy, stats_every=1)
    scaled = _backward(opt, model)
    opt.step()
    with np.errstate(all="ignore"):
        state, _ = next_auto_state(policy, lossscale.initial_state(policy, np), initial_auto_state(policy, np),
                                   np.bool_(True), numpy_stats([g.float().cpu().numpy() for g in scaled], np),
                                   True, np)
    assert float(opt.loss_scale) == float(state.loss_scale)
