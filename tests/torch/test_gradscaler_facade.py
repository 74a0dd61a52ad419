"""lossscale.torch.GradScaler's own contract: what it adds to torch.amp.GradScaler's (host syncs, the skip switch,
lossscale's policy extras and diagnostics, checkpoint validation) and that it follows the same rule as
LossScaleOptimizer. torch's behaviours it shares are in test_gradscaler_compat.py."""

from __future__ import annotations

import gc
import math
import pickle
import warnings

import pytest
import torch

from lossscale import DynamicLossScale, History, LossScaleError
from lossscale.torch import GradScaler, HostSyncCounter, LossScaleOptimizer


def _param_and(opt_cls=torch.optim.SGD, n=3, **kwargs):
    param = torch.nn.Parameter(torch.linspace(-1.0, 1.0, n))
    return param, opt_cls([param], **kwargs)


def _iteration(scaler, param, optimizer, grad_value=1.0, unscale=False):
    optimizer.zero_grad()
    scaler.scale((param * grad_value).sum()).backward()
    if unscale:
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()


def _count_step_calls(optimizer):
    calls = []
    original = optimizer.step

    def patched(*args, **kwargs):  # what accelerate and LR schedulers do to optimizer.step
        calls.append(True)
        return original(*args, **kwargs)

    optimizer.step = patched
    return calls


# ---- host syncs and the skip switch --------------------------------------------------------------------------------


@pytest.mark.parametrize("unscale", [False, True], ids=["step", "unscale_then_step"])
@pytest.mark.parametrize(
    "fused,sync_skips,syncs_per_step",
    [(True, False, 0), (True, True, 1), (False, False, 1)],
    ids=["fused", "fused-sync_skips", "unfused"],
)
def test_host_syncs_per_iteration(fused, sync_skips, syncs_per_step, unscale):
    # Unfused: SGD, whose foreach step makes no sync of its own (foreach AdamW reads its step count on the host).
    scaler = GradScaler("cpu", init_scale=2.0**8, sync_skips=sync_skips)
    if fused:
        param, optimizer = _param_and(torch.optim.AdamW, lr=0.1, fused=True)
    else:
        param, optimizer = _param_and(torch.optim.SGD, lr=0.1, momentum=0.9, foreach=True)
    _iteration(scaler, param, optimizer)  # the first step creates the optimizer's state: decided on the host
    weights = []
    with HostSyncCounter() as syncs:
        for step in range(4):
            _iteration(scaler, param, optimizer, math.inf if step == 2 else 1.0, unscale)
            weights.append(param.detach().clone())
    assert syncs.count == 4 * syncs_per_step
    assert int(scaler.skipped_steps) == 1 and torch.equal(weights[1], weights[2])
    assert not torch.equal(weights[2], weights[3])


@pytest.mark.parametrize("sync_skips", [False, True])
def test_sync_skips_decides_whether_a_fused_skip_calls_optimizer_step(sync_skips):
    scaler = GradScaler("cpu", init_scale=2.0**8, sync_skips=sync_skips)
    param, optimizer = _param_and(torch.optim.AdamW, lr=0.1, fused=True)
    calls = _count_step_calls(optimizer)
    _iteration(scaler, param, optimizer)
    before = param.detach().clone()
    _iteration(scaler, param, optimizer, math.inf)
    assert torch.equal(param.detach(), before) and bool(scaler.last_step_skipped)
    # Without the switch the kernel skips on the device: step() ran, so a caller counting calls sees no skip.
    assert len(calls) == (1 if sync_skips else 2)


def test_fused_step_leaves_no_scale_attributes_and_forwards_arguments():
    scaler = GradScaler("cpu", init_scale=4.0)
    param, optimizer = _param_and(torch.optim.AdamW, lr=0.1, fused=True)
    scaler.scale(param.sum()).backward()
    assert scaler.step(optimizer, None) is None  # accelerate's step(optimizer, closure) with closure=None
    scaler.update()
    assert not hasattr(optimizer, "grad_scale") and not hasattr(optimizer, "found_inf")


# ---- the same rule as LossScaleOptimizer ---------------------------------------------------------------------------


def test_same_weights_and_scale_as_loss_scale_optimizer():
    kwargs = {"min_loss_scale": 2.0, "max_loss_scale": 32.0, "hysteresis": 2}
    scaler = GradScaler("cpu", init_scale=8.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2, **kwargs)
    policy = DynamicLossScale(8.0, 2, 2.0, backoff_factor=0.5, **kwargs)
    assert scaler.loss_scale_policy == policy
    param, optimizer = _param_and(lr=0.1, momentum=0.9)
    twin, twin_inner = _param_and(lr=0.1, momentum=0.9)
    wrapped = LossScaleOptimizer(twin_inner, policy)
    inf = math.inf
    pattern = [1, 1, 1, 1, 1, 1, inf, 1, inf, inf, inf, inf, inf, inf, inf, inf, inf, 1, 1]
    scales = []
    for g in pattern:
        _iteration(scaler, param, optimizer, g)
        wrapped.zero_grad()
        wrapped.get_scaled_loss((twin * g).sum()).backward()
        wrapped.step()
        assert scaler.get_scale() == float(wrapped.loss_scale)
        assert torch.equal(param.detach(), twin.detach())
        assert int(scaler.skipped_steps) == int(wrapped.skipped_steps)
        scales.append(scaler.get_scale())
    # growth every 2 finite steps up to the ceiling, backoff every 2nd overflow down to the floor
    assert scales == [8, 16, 16, 32, 32, 32, 32, 32, 16, 16, 8, 8, 4, 4, 2, 2, 2, 2, 4]


def test_floor_ceiling_and_hysteresis_in_torch_terms():
    scaler = GradScaler("cpu", init_scale=4.0, growth_interval=1, max_loss_scale=8.0)
    param, optimizer = _param_and()
    for _ in range(3):
        _iteration(scaler, param, optimizer)
    assert scaler.get_scale() == 8.0
    low = GradScaler("cpu", init_scale=1.0, min_loss_scale=0.25)  # a floor below 1 allows what torch does
    for expected in (0.5, 0.25, 0.25):
        _iteration(low, param, optimizer, math.inf)
        assert low.get_scale() == expected


def test_argument_errors_use_torch_names():
    with pytest.raises(ValueError, match="growth_factor must be greater than 1"):
        GradScaler("cpu", growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor must be in the open interval"):
        GradScaler("cpu", backoff_factor=1.5)
    with pytest.raises(ValueError, match="init_scale=0.5 is below min_loss_scale=1.0"):
        GradScaler("cpu", init_scale=0.5)
    scaler = GradScaler("cpu")
    with pytest.raises(ValueError, match="growth_interval"):
        scaler.set_growth_interval(0)
    assert scaler.get_growth_interval() == 2000  # unchanged by the refused setting


# ---- several optimizers, per-optimizer state -----------------------------------------------------------------------


def test_a_setter_between_step_and_update_keeps_the_iterations_overflow():
    scaler = GradScaler("cpu", init_scale=8.0, growth_interval=1)
    param, optimizer = _param_and()
    scaler.scale((param * math.inf).sum()).backward()
    scaler.step(optimizer)
    scaler.set_backoff_factor(0.25)
    scaler.update()
    assert scaler.get_scale() == 2.0 and int(scaler.skipped_steps) == 1


def test_skips_count_iterations_and_an_unstepped_unscale_counts_as_in_torch():
    scaler = GradScaler("cpu", init_scale=8.0)
    (a, opt_a), (b, opt_b) = _param_and(lr=0.5), _param_and(lr=0.5)
    scaler.scale((a * math.inf).sum() + (b * math.inf).sum()).backward()
    scaler.step(opt_a)
    scaler.step(opt_b)
    scaler.update()
    assert int(scaler.skipped_steps) == 1 and bool(scaler.last_step_skipped)  # one iteration, two skips
    for opt in (opt_a, opt_b):
        opt.zero_grad()
    scaler.scale((b * math.inf).sum()).backward()
    scaler.unscale_(opt_b)  # unscaled, found Inf, never stepped: torch's update() still backs off
    scaler.update()
    assert scaler.get_scale() == 2.0 and int(scaler.skipped_steps) == 2
    scaler.scale(b.sum()).backward()
    scaler.unscale_(opt_b)  # update() made every optimizer ready again


def test_per_optimizer_state_does_not_keep_optimizers_alive():
    scaler = GradScaler("cpu", init_scale=8.0)
    param, optimizer = _param_and()
    _iteration(scaler, param, optimizer)
    assert len(scaler._steps) == 1
    del optimizer
    gc.collect()
    assert len(scaler._steps) == 0


def test_update_new_scale_counts_the_skip_and_keeps_the_growth_counter():
    scaler = GradScaler("cpu", init_scale=8.0, growth_interval=3)
    param, optimizer = _param_and()
    _iteration(scaler, param, optimizer)
    optimizer.zero_grad()
    scaler.scale((param * math.inf).sum()).backward()
    scaler.step(optimizer)
    scaler.update(new_scale=64.0)
    state = scaler.state_dict()
    assert (state["scale"], state["_growth_tracker"], state["lossscale"]["skipped_steps"]) == (64.0, 1, 1)
    with pytest.raises(ValueError, match="new_scale"):
        scaler.update(new_scale=-1.0)


# ---- checkpoints ---------------------------------------------------------------------------------------------------


def test_state_dict_carries_the_whole_policy_and_counters():
    scaler = GradScaler("cpu", init_scale=8.0, hysteresis=2, max_loss_scale=64.0)
    param, optimizer = _param_and()
    _iteration(scaler, param, optimizer, math.inf)
    state = scaler.state_dict()
    assert state["lossscale"] == {
        "policy": {"class_name": "DynamicLossScale", "config": {
            "initial_loss_scale": 8.0, "increment_period": 2000, "multiplier": 2.0,
            "max_loss_scale": 64.0, "backoff_factor": 0.5, "hysteresis": 2}},
        "bad_steps": 1, "skipped_steps": 1, "consecutive_skips": 1,
    }
    resumed = GradScaler("cpu")
    resumed.load_state_dict(state)
    assert resumed.loss_scale_policy == scaler.loss_scale_policy and resumed.state_dict() == state
    _iteration(resumed, param, optimizer, math.inf)  # the second overflow backs off (hysteresis survived)
    assert resumed.get_scale() == 4.0


def test_loading_torch_state_clamps_into_the_floor_and_keeps_lossscale_settings():
    theirs = torch.amp.GradScaler("cpu", init_scale=1.0)
    param, optimizer = _param_and()
    for _ in range(3):
        _iteration(theirs, param, optimizer, math.inf)
    assert theirs.get_scale() == 0.125
    ours = GradScaler("cpu", max_loss_scale=2.0**20)
    ours.load_state_dict(theirs.state_dict())
    assert ours.get_scale() == 1.0  # clamped into [min_loss_scale, max_loss_scale]
    assert ours.loss_scale_policy.max_loss_scale == 2.0**20


@pytest.mark.parametrize(
    "change,error,match",
    [
        (lambda s: s.pop("growth_interval"), ValueError, r"missing \['growth_interval'\]"),
        (lambda s: s.update(scale=math.inf), ValueError, "set state_dict\\['scale'\\] to a finite number"),
        (lambda s: s.update(_growth_tracker=1.5), ValueError, "'_growth_tracker' is 1.5, not an int"),
        (lambda s: s.update(growth_factor=0.5), ValueError, "growth_factor must be greater than 1"),
        (lambda s: s["lossscale"].update(policy={"class_name": "Nope"}), ValueError, "policy is unreadable"),
        (lambda s: s.update(lossscale=3), ValueError, "'lossscale' entry is a int"),
    ],
)
def test_a_malformed_state_dict_is_refused_and_changes_nothing(change, error, match):
    source = GradScaler("cpu", init_scale=16.0).state_dict()
    change(source)
    target = GradScaler("cpu", init_scale=4.0)
    before = target.state_dict()
    with pytest.raises(error, match=match):
        target.load_state_dict(source)
    assert target.state_dict() == before


def test_pickles_between_iterations_only():
    scaler = GradScaler("cpu", init_scale=8.0, history=True)
    param, optimizer = _param_and()
    _iteration(scaler, param, optimizer)
    copy = pickle.loads(pickle.dumps(scaler))
    assert copy.state_dict() == scaler.state_dict() and len(copy.history) == 1
    copy_param, copy_optimizer = _param_and()
    _iteration(copy, copy_param, copy_optimizer)  # the copy trains on
    assert len(copy.history) == 2 and int(copy.skipped_steps) == 0
    scaler.scale(param.sum()).backward()
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="only between iterations"):
        pickle.dumps(scaler)


def test_accelerate_fsdp2_lazy_init_names():
    scaler = GradScaler("cpu")
    scaler._lazy_init_scale_growth_tracker(scaler._device)  # what accelerate calls after load_state under FSDP2
    assert scaler.loss_scale.device.type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA fallback")
def test_cuda_device_without_cuda_disables_with_a_warning_as_torch_does():
    with pytest.warns(UserWarning, match="CUDA is not available"):
        scaler = GradScaler()
    assert not scaler.is_enabled() and scaler.state_dict() == {}


# ---- diagnostics ---------------------------------------------------------------------------------------------------


def test_history_has_one_row_per_update_with_the_loss():
    history = History()
    scaler = GradScaler("cpu", init_scale=8.0, growth_interval=2, history=history)
    param, optimizer = _param_and()
    for g in (1.0, 1.0, math.inf, 1.0):
        _iteration(scaler, param, optimizer, g)
    assert scaler.history is history
    assert list(history.loss_scales) == [8.0, 8.0, 16.0, 8.0]  # the scale each iteration used
    assert list(history.skipped) == [False, False, True, False] and list(history.steps) == [0, 1, 2, 3]
    losses = list(history.losses)
    assert losses[0] == pytest.approx(0.0) and math.isnan(losses[2])  # sum(linspace(-1, 1, 3) * g)


def test_stall_guard_and_overflow_report():
    param, optimizer = _param_and()
    reported = GradScaler("cpu", init_scale=8.0, overflow_report=True, named_parameters=[("w", param)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _iteration(reported, param, optimizer, math.inf)
    assert reported.last_overflow_report.nonfinite == [("w", False, True)]
    guarded = GradScaler("cpu", init_scale=8.0, max_consecutive_skips=2)
    _iteration(guarded, param, optimizer, math.inf)
    with pytest.raises(LossScaleError, match="2 steps in a row were skipped"):
        _iteration(guarded, param, optimizer, math.inf)
