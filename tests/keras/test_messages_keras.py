"""The Keras binding's errors name the real cause, per backend (KERAS_BACKEND): a config whose built-in policy has a
bad field (``from_config``, as a ``.keras`` file loads it), ``loss_scale=-1``, ``underflow_report`` before the first
sample."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
from keras import ops

import lossscale
import lossscale.keras as lsk

CONSTRUCTOR_SAYS = "multiplier must be greater than 1 so the scale can grow, got 1.0. Use for example multiplier=2.0."
BAD = {"class_name": "DynamicLossScale", "config": {"initial_loss_scale": 1024.0, "multiplier": 1.0}}


def test_from_config_with_a_bad_field_names_it():
    config = lsk.LossScaleOptimizer(keras.optimizers.SGD()).get_config()
    config["loss_scale"] = BAD
    with pytest.raises(ValueError) as info:
        lsk.LossScaleOptimizer.from_config(config)
    assert str(info.value) == f"Invalid loss scale config for DynamicLossScale: {CONSTRUCTOR_SAYS}"
    assert "not a built-in" not in str(info.value)
    assert str(info.value.__cause__) == CONSTRUCTOR_SAYS


def test_a_tf_2_3_config_with_a_bad_field_names_it():
    config = {"optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.1}}, "loss_scale": BAD}
    with pytest.raises(ValueError, match=re.escape(f"DynamicLossScale: {CONSTRUCTOR_SAYS}")):
        lsk.LossScaleOptimizer.from_config(config)


def test_loss_scale_minus_one_names_loss_scale():
    with pytest.raises(ValueError) as info:
        lsk.LossScaleOptimizer(keras.optimizers.SGD(), loss_scale=-1)
    assert str(info.value) == (
        "loss_scale must be positive, got -1.0. Pass a positive finite number, for example loss_scale=2**15."
    )


def test_underflow_report_before_the_first_sample_says_when_it_comes():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(), stats_every=4)
    expected = (
        "No gradient statistics sample yet: with stats_every=4 the first sample is taken at step 0; 0 steps so far. "
        "Call underflow_report after that step."
    )
    with pytest.raises(ValueError) as info:
        lossscale.underflow_report(opt)  # before build
    assert str(info.value) == expected
    w = keras.Variable(np.ones(2, np.float32), name="w")
    opt.build([w])
    with pytest.raises(ValueError) as info:
        lossscale.underflow_report(opt)
    assert str(info.value) == expected
    with pytest.raises(ValueError, match=r"^stats holds no sample yet \(step -1\): the first sample is taken at the "
                                         r"first step \(step 0\)"):
        lossscale.underflow_report(opt.gradient_stats)
    opt.apply([ops.convert_to_tensor(np.array([0.0, 1.0], np.float32))], [w])
    report = lossscale.underflow_report(opt)
    assert report.step == 0 and report.rows[0][1] == 0.5


def test_underflow_report_of_an_optimizer_without_statistics():
    with pytest.raises(TypeError, match=r"^This LossScaleOptimizer records no gradient statistics"):
        lossscale.underflow_report(lsk.LossScaleOptimizer(keras.optimizers.SGD()))
