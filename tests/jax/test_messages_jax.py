"""The JAX binding's errors name the real cause: a built-in policy with a bad field, ``loss_scale=-1``,
``underflow_report`` before the first sample."""

from __future__ import annotations

import re

import jax.numpy as jnp
import optax
import pytest

import lossscale
import lossscale.jax as lsj

CONSTRUCTOR_SAYS = "multiplier must be greater than 1 so the scale can grow, got 1.0. Use for example multiplier=2.0."
BAD = {"class_name": "DynamicLossScale", "config": {"initial_loss_scale": 1024.0, "multiplier": 1.0}}


def test_a_serialized_policy_with_a_bad_field_names_it():
    with pytest.raises(ValueError) as info:
        lsj.loss_scale_optimizer(optax.sgd(0.1), loss_scale=BAD)
    assert str(info.value) == f"Invalid loss scale config for DynamicLossScale: {CONSTRUCTOR_SAYS}"
    assert str(info.value.__cause__) == CONSTRUCTOR_SAYS


def test_check_state_with_a_bad_policy_names_the_field():
    state = lsj.loss_scale_optimizer(optax.sgd(0.1)).init({"w": jnp.ones(2)})
    with pytest.raises(ValueError, match=re.escape(f"policy is not a valid policy: Invalid loss scale config for "
                                                   f"DynamicLossScale: {CONSTRUCTOR_SAYS}")):
        lsj.check_state(state, BAD)


def test_loss_scale_minus_one_names_loss_scale():
    with pytest.raises(ValueError) as info:
        lsj.loss_scale_optimizer(optax.sgd(0.1), loss_scale=-1)
    assert str(info.value) == (
        "loss_scale must be positive, got -1.0. Pass a positive finite number, for example loss_scale=2**15."
    )


def test_underflow_report_before_the_first_sample_says_when_it_comes():
    params = {"w": jnp.ones(2)}
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), stats_every=4)
    state = opt.init(params)
    for stats in (state.gradient_stats, state):
        with pytest.raises(ValueError, match=r"^stats holds no sample yet \(step -1\): the first sample is taken at "
                                             r"the first step \(step 0\), then every stats_every-th step"):
            lossscale.underflow_report(stats)
    grads = {"w": jnp.array([0.0, 1.0])}
    _, state = opt.update(grads, state, params)
    report = lossscale.underflow_report(state.gradient_stats, names=lsj.tensor_names(params))
    assert report.step == 0 and report.rows[0][0] == "['w']" and report.rows[0][1] == 0.5


def test_underflow_report_of_a_state_without_statistics():
    state = lsj.loss_scale_optimizer(optax.sgd(0.1)).init({"w": jnp.ones(2)})
    with pytest.raises(TypeError, match=r"^This LossScaleOptimizerState records no gradient statistics: build the "
                                        r"optimizer with stats_every=N"):
        lossscale.underflow_report(state)


def test_underflow_report_takes_a_flax_train_state_and_fits_its_advice_to_auto():
    train_state = pytest.importorskip("flax.training.train_state")
    params = {"w": jnp.ones(4)}
    tx = lsj.loss_scale_optimizer(optax.sgd(0.1), loss_scale="auto")
    state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
    state = state.apply_gradients(grads={"w": jnp.array([0.0, 0.0, 1.0, 1.0])})
    report = lossscale.underflow_report(state, names=lsj.tensor_names(params))
    assert report.step == 0 and report.rows[0][:2] == ("['w']", 0.5) and report.policy == "AutoLossScale"
    text = str(report)
    assert "with loss_scale='auto' already setting the scale" in text and "use loss_scale='auto'" not in text
    assert repr(report) == text


def test_underflow_report_finds_the_state_inside_a_chain_and_advises_auto_when_not_on_it():
    params = {"w": jnp.ones(4)}
    tx = optax.chain(lsj.loss_scale_optimizer(optax.sgd(0.1), stats_every=1), optax.scale(1.0))
    state = tx.init(params)
    _, state = tx.update({"w": jnp.array([0.0, 0.0, 1.0, 1.0])}, state, params)
    report = lossscale.underflow_report(state)
    assert report.zero_fraction == 0.5 and report.policy is None
    assert str(report).endswith("raise the loss scale, or use loss_scale='auto' (experimental).")
    with pytest.raises(TypeError, match=r"^stats must be an optimizer's gradient_stats mapping .* got int\.$"):
        lossscale.underflow_report(3)
