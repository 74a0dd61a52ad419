"""Unit tests of the reusable step parts: the fused-state tracker, the stage record, the step functions.

These drive the parts with a plain torch optimizer and no ``LossScaleOptimizer``, as a GradScaler-style
facade would.
"""

from __future__ import annotations

import math

import pytest
import torch

from lossscale import DynamicLossScale
from lossscale.torch import SharedLossScale
from lossscale.torch._grads import FusedStateTracker, check_fused_kernels, fused_sgd_skips_half_on_cpu
from lossscale.torch._state import PrivateLossScale
from lossscale.torch._step import OptimizerStep, Stage, misuse
from lossscale.torch._step import StepProgress as StepRecord

# ------------------------------------------------------------ FusedStateTracker


def test_tracker_decides_on_the_host_until_every_parameter_with_a_gradient_has_state():
    w, v = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    adam = torch.optim.Adam([w, v], lr=0.1, fused=True)
    tracker = FusedStateTracker()
    assert not tracker.needs_host_decision(adam)  # no gradient at all: nothing would be created
    w.grad = torch.ones(2)
    assert tracker.needs_host_decision(adam)
    _ = adam.state[w]  # a read of the defaultdict leaves an empty entry: still no state
    assert tracker.needs_host_decision(adam)
    adam.step()
    tracker.note_host_step(adam)
    assert not tracker.needs_host_decision(adam)  # v has no gradient
    v.grad = torch.ones(2)
    assert tracker.needs_host_decision(adam)
    adam.step()
    assert not tracker.needs_host_decision(adam)  # the fast path: every parameter has state
    x = torch.nn.Parameter(torch.ones(2))
    adam.add_param_group({"params": [x]})
    x.grad = torch.ones(2)
    assert tracker.needs_host_decision(adam)  # a new parameter is noticed by the count


def test_tracker_remembers_stateless_parameters_per_setting():
    w = torch.nn.Parameter(torch.ones(2))
    sgd = torch.optim.SGD([w], lr=0.1, fused=True)
    tracker = FusedStateTracker()
    w.grad = torch.ones(2)
    assert tracker.needs_host_decision(sgd)
    sgd.step()
    tracker.note_host_step(sgd)  # SGD without momentum keeps no state: remembered as stateless
    assert not tracker.needs_host_decision(sgd)
    sgd.param_groups[0]["momentum"] = 0.9  # now its step would create a buffer
    assert tracker.needs_host_decision(sgd)
    tracker.reset()
    sgd.param_groups[0]["momentum"] = 0.0
    assert tracker.needs_host_decision(sgd)  # forgotten after reset()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_check_fused_kernels_refuses_only_the_broken_case(dtype):
    def sgd(n, dt=dtype, **kwargs):
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(n, dtype=dt))], lr=1.0, **kwargs)

    check_fused_kernels(sgd(15, fused=True))  # below 16 elements the kernel works
    check_fused_kernels(sgd(64, dt=torch.float32, fused=True))
    check_fused_kernels(sgd(64, foreach=True))
    check_fused_kernels(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(64, dtype=dtype))], fused=True))
    if fused_sgd_skips_half_on_cpu(dtype):
        with pytest.raises(ValueError, match="fused SGD on CPU does not update"):
            check_fused_kernels(sgd(16, fused=True))
    else:
        check_fused_kernels(sgd(16, fused=True))


# ------------------------------------------------------------ StepRecord


def test_stage_record_messages_name_what_was_called_and_the_fix():
    record = StepRecord()
    record.require("clip_grad_norm_")
    record.checked(torch.zeros(()), clipped=True)
    with pytest.raises(RuntimeError, match=r"clip_grad_norm_\(\) was called twice.*Clip once per iteration"):
        record.require("clip_grad_norm_")
    with pytest.raises(RuntimeError, match=r"clip_grad_norm_\(\) was called after unscale_\(\).*last step\(\)"):
        raise misuse("clip_grad_norm_", "unscale_")
    record.forget_check()
    assert record.stage is Stage.READY and record.found_inf is None
    record.stepped()
    record.forget_check()  # zero_grad() does not forget a step
    with pytest.raises(RuntimeError, match=r"step\(\) was called twice.*update\(\).*scaler\.update\(\)"):
        record.require("step")
    record.reset()
    record.require("step")


# ------------------------------------------------------------ the step functions over plain optimizers


def _facade_step(inner, step):
    done = step.step(inner)
    return None if done is None else done[1]


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_two_plain_optimizers_share_one_scale_through_the_step_functions(fused):
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    inners = [torch.optim.AdamW([p], lr=0.1, fused=fused, foreach=not fused) for p in (a, b)]
    refs = [torch.nn.Parameter(torch.ones(3)) for _ in range(2)]
    ref_opts = [torch.optim.AdamW([p], lr=0.1, fused=fused, foreach=not fused) for p in refs]
    owner = SharedLossScale(DynamicLossScale(8.0, 2))
    steps = [OptimizerStep(owner) for _ in inners]
    for i in range(4):
        bad_b = i == 2
        for p, ref, g in ((a, refs[0], 1.0), (b, refs[1], -2.0)):
            p.grad = torch.full((3,), g * float(owner.loss_scale))
            ref.grad = torch.full((3,), g)
        if bad_b:
            b.grad[0] = math.inf
        if i == 1:
            steps[0].unscale_(inners[0])  # one optimizer unscaled early
            steps[0].clip_grad_norm_(inners[0], 1e9)
        for inner, ref_opt, step, ref_ok in zip(inners, ref_opts, steps, (True, not bad_b)):
            _facade_step(inner, step)
            assert step.progress.stage is Stage.STEPPED
            if ref_ok:
                ref_opt.step()
        owner.update()
        assert all(step.progress.stage is Stage.READY for step in steps)
    for p, ref in zip((a, b), refs):
        torch.testing.assert_close(p.detach(), ref.detach(), rtol=1e-6, atol=1e-7)
    assert [int(step.counters.skipped_steps(owner.device)) for step in steps] == [0, 1]
    assert float(owner.loss_scale) == 8.0  # grew at 2, backed off at 3, no growth since


def test_private_scale_advances_at_once_and_reports_readiness():
    w = torch.nn.Parameter(torch.ones(2))
    inner = torch.optim.SGD([w], lr=0.5)
    owner = PrivateLossScale(DynamicLossScale(4.0, 1))
    step = OptimizerStep(owner)
    record, counters = step.progress, step.counters
    assert _facade_step(inner, step) is None  # no gradient
    w.grad = torch.full((2,), 4.0)
    assert _facade_step(inner, step) is False
    assert record.stage is Stage.READY and float(owner.loss_scale) == 8.0 and counters.steps == 1
    assert w.tolist() == [0.5, 0.5]
