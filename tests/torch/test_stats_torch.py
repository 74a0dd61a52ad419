"""torch's gradient statistics and StatsSampler against the numpy core."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import lossscale
from lossscale._auto import initial_auto_state, next_auto_state
from lossscale._stats import gradient_stats as numpy_stats
from lossscale.torch._sampler import StatsSampler, check_stats_every
from lossscale.torch._stats import gradient_stats


def tensors():
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(64, 32, generator=g) * 2.0**-18).half().float()  # autocast-style: float16 values in float32
    a[0, :5] = 0
    return [
        a,
        torch.tensor([0.0, 2.0**-20, -(2.0**-14), 3.0]),
        torch.zeros(0),
        torch.tensor([float("inf"), 1.0]),
        (torch.randn(7, generator=g) * 100).half(),
    ]


def test_equal_to_the_numpy_core():
    grads = tensors()
    got = gradient_stats(grads, step=3)
    ref = numpy_stats([g.numpy() for g in grads], np, step=3)
    for name in ref._fields:
        np.testing.assert_allclose(
            np.asarray(getattr(got, name), np.float64), np.asarray(getattr(ref, name), np.float64),
            rtol=1e-5, err_msg=name,
        )
    assert math.isinf(float(got.amax)) and float(got.tensor_zero_fraction[1]) == 0.25


def test_does_not_touch_the_gradients():
    grads = tensors()
    copies = [g.clone() for g in grads]
    gradient_stats(grads)
    for g, c in zip(grads, copies):
        assert torch.equal(g, c)


def test_stats_every_is_validated():
    assert check_stats_every(None, lossscale.DynamicLossScale()) is None
    assert check_stats_every(None, lossscale.AutoLossScale()) == 1
    with pytest.raises(TypeError, match="stats_every must be an int"):
        check_stats_every("4", lossscale.DynamicLossScale())
    with pytest.raises(ValueError, match="at least 1"):
        check_stats_every(0, lossscale.DynamicLossScale())


def test_sampler_runs_the_core_auto_rule_in_place():
    policy = lossscale.AutoLossScale(1.0)
    sampler = StatsSampler(2, policy)
    live = lossscale.initial_state(policy, torch)
    ref, ref_auto = lossscale.initial_state(policy, np), initial_auto_state(policy, np)
    g = torch.Generator().manual_seed(1)
    true = [torch.randn(256, generator=g) * 2.0**-20, torch.randn(16, generator=g) * 2.0**-8]
    for i in range(6):
        scale = float(live.loss_scale)
        grads = [(t * scale).half().float() for t in true]
        if i == 4:
            grads[1][0] = float("inf")
        sampler.measure(grads, ["w", "b"], live)
        found_inf = torch.tensor(float(not all(torch.isfinite(x).all() for x in grads)))
        sampler.advance(live, found_inf)
        with np.errstate(all="ignore"):
            ref, ref_auto = next_auto_state(
                policy, ref, ref_auto, np.bool_(float(found_inf) == 0),
                numpy_stats([x.numpy() for x in grads], np, i), np.bool_(i % 2 == 0), np,
            )
        assert float(live.loss_scale) == float(ref.loss_scale), i
        assert int(live.skipped_steps) == int(ref.skipped_steps)
    assert float(live.loss_scale) > 1.0 and int(live.skipped_steps) == 1
    assert sampler.gradient_stats["per_tensor"]["names"] == ("w", "b")
    assert int(sampler.gradient_stats["step"]) == 4


def test_sampler_checkpoint_round_trip():
    policy = lossscale.AutoLossScale(2.0**4, window=4)
    a = StatsSampler(1, policy)
    state = lossscale.initial_state(policy, torch)
    a.measure([torch.full((8,), 2.0**-3)], None, state)
    a.advance(state, torch.tensor(0.0))
    b = StatsSampler(1, policy)
    b.load_state_dict(a.state_dict())
    assert b.iteration == 1 and all(torch.equal(x, y) for x, y in zip(a.auto, b.auto))
    with pytest.raises(ValueError, match="window"):
        StatsSampler(1, lossscale.AutoLossScale(window=8)).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="no AutoLossScale state"):
        StatsSampler(1, policy).load_state_dict({"iteration": 3})
