"""Scale trajectories: lossscale.jax against the numpy reference and lossscale.torch."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import lossscale
import lossscale.jax as lsj
import lossscale.torch as lst
from lossscale import DynamicLossScale, ExponentialUpdateLossScaleManager, FixedLossScale, FixedLossScaleManager

PATTERN = "FFTTTFTTFFFTTTTTFTFTTTTTTT"  # T: finite step, F: a step with an Inf

POLICIES = [
    DynamicLossScale(8, 2, 2),
    DynamicLossScale(4, 1, 2, min_loss_scale=2, max_loss_scale=16),
    DynamicLossScale(16, 3, 2, backoff_factor=0.5, hysteresis=2),
    DynamicLossScale(2.0**126, 1, 2),  # growth past float32's range is refused
    ExponentialUpdateLossScaleManager(8, 2, decr_every_n_nan_or_inf=2, incr_ratio=2, decr_ratio=0.8),
    FixedLossScale(4),
    FixedLossScaleManager(1),
]


def jax_trajectory(policy, pattern=PATTERN):
    opt = lsj.loss_scale_optimizer(optax.sgd(1.0), policy)
    state = opt.init({"w": jnp.zeros(2)})
    update = jax.jit(opt.update)
    out = []
    for step in pattern:
        grad = jnp.array([0.5, 1.0]) * state.loss_scale if step == "T" else jnp.array([1.0, jnp.inf])
        _, state = update({"w": grad}, state)
        out.append(tuple(np.asarray(x).item() for x in state.loss_scale_state))
    return out


def numpy_trajectory(policy, pattern=PATTERN):
    state = lossscale.initial_state(policy, np)
    out = []
    for step in pattern:
        with np.errstate(over="ignore"):  # the growth to inf that the rule refuses
            state = lossscale.next_state(policy, state, np.asarray(step == "T"), np)
        out.append(tuple(np.asarray(x).item() for x in state))
    return out


def torch_trajectory(policy, pattern=PATTERN):
    w = torch.nn.Parameter(torch.zeros(2))
    opt = lst.LossScaleOptimizer(torch.optim.SGD([w], lr=1.0), policy)
    out = []
    for step in pattern:
        scale = float(opt.loss_scale)
        w.grad = torch.tensor([0.5, 1.0]) * scale if step == "T" else torch.tensor([1.0, float("inf")])
        with warnings.catch_warnings():  # torch warns on the growth to inf that the rule refuses
            warnings.simplefilter("ignore", RuntimeWarning)
            opt.step()
        out.append((float(opt.loss_scale), int(opt.skipped_steps)))
    return out


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_same_trajectory_as_numpy_reference_and_torch(policy):
    got = jax_trajectory(policy)
    assert got == numpy_trajectory(policy)
    assert [(s, skipped) for s, _, _, skipped, _ in got] == torch_trajectory(policy)


def test_hand_written_table_tf_rule():
    # DynamicLossScale(8, increment_period=2, multiplier=2), TF's rule, worked by hand.
    scales = [s for s, *_ in jax_trajectory(DynamicLossScale(8, 2, 2), "FFTTTFTTFFFTT")]
    assert scales == [4, 2, 2, 4, 4, 2, 2, 4, 2, 1, 1, 1, 2]


def test_hand_written_table_hysteresis_and_clamps():
    # Backs off on every 2nd bad step since the scale changed, by 0.5; grows every 3rd good step.
    rows = jax_trajectory(DynamicLossScale(16, 3, 2, backoff_factor=0.5, hysteresis=2), "FFFTTTF")
    assert [r[0] for r in rows] == [16, 8, 8, 8, 8, 16, 16]
    assert [r[2] for r in rows] == [1, 0, 1, 1, 1, 0, 1]  # bad_steps
    assert [r[4] for r in rows] == [1, 2, 3, 0, 0, 0, 1]  # consecutive_skips
    clamped = jax_trajectory(DynamicLossScale(4, 1, 2, min_loss_scale=2, max_loss_scale=16), "TTTTFFFF")
    assert [r[0] for r in clamped] == [8, 16, 16, 16, 8, 4, 2, 2]


def test_fixed_scale_skips_but_never_moves():
    rows = jax_trajectory(FixedLossScale(4), "TFFT")
    assert [r[0] for r in rows] == [4, 4, 4, 4]
    assert [r[3] for r in rows] == [0, 1, 2, 2]  # skipped_steps
