"""Construction forms and errors, get_config/from_config, and configs written by tf-keras (by hand, from the
shapes tf-keras's LossScaleOptimizer.get_config and optimizer serialization write)."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

import lossscale
import lossscale.keras as lsk


def sgd():
    return keras.optimizers.SGD(0.01, name="sgd")


# ----------------------------------------------------------------------------- forms and attributes


def test_default_is_tf_dynamic():
    opt = lsk.LossScaleOptimizer(sgd())
    assert opt.dynamic and opt.initial_scale == 2.0**15 and opt.dynamic_growth_steps == 2000
    assert float(opt.loss_scale) == 2.0**15 and int(opt.dynamic_counter) == 0 and int(opt.skipped_steps) == 0
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer) and opt.inner_optimizer.learning_rate is not None


def test_seed_001_pairs_have_equal_configs():
    pairs = [
        ({"loss_scale": "dynamic"}, {}),
        ({"loss_scale": 123}, {"dynamic": False, "initial_scale": 123}),
        (
            {"loss_scale": lsk.DynamicLossScale(initial_loss_scale=2048, increment_period=500)},
            {"initial_scale": 2048, "dynamic_growth_steps": 500},
        ),
    ]
    for experimental, stable in pairs:
        a, b = lsk.LossScaleOptimizer(sgd(), **experimental), lsk.LossScaleOptimizer(sgd(), **stable)
        ca, cb = a.get_config(), b.get_config()
        ca.pop("name"), cb.pop("name")
        assert ca == cb


def test_fixed_attributes():
    opt = lsk.LossScaleOptimizer(sgd(), dynamic=False, initial_scale=123)
    assert not opt.dynamic and opt.dynamic_counter is None and opt.dynamic_growth_steps is None
    assert opt.initial_scale == 123.0 and float(opt.loss_scale) == 123.0


def test_managers_and_extensions():
    manager = lsk.ExponentialUpdateLossScaleManager(64, 10, decr_every_n_nan_or_inf=2)
    assert lsk.LossScaleOptimizer(sgd(), manager).loss_scale_policy == manager
    opt = lsk.LossScaleOptimizer(
        sgd(), dynamic_growth_steps=100, min_loss_scale=0.5, max_loss_scale=2**20, hysteresis=2
    )
    assert opt.loss_scale_policy == lsk.DynamicLossScale(
        2**15, 100, min_loss_scale=0.5, max_loss_scale=2**20, hysteresis=2
    )
    assert lsk.LossScaleOptimizer(sgd(), "dynamic", hysteresis=3).loss_scale_policy.hysteresis == 3


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"loss_scale": 8, "dynamic": False}, ValueError, "not both"),
        ({"dynamic": False}, ValueError, "needs initial_scale"),
        ({"dynamic": "yes"}, TypeError, "True or False"),
        ({"dynamic": False, "initial_scale": 8, "dynamic_growth_steps": 3}, ValueError, "only applies to a dynamic"),
        ({"loss_scale": "static"}, ValueError, '"dynamic"'),
        ({"loss_scale": 0.5}, ValueError, "at least 1"),
        ({"dynamic": False, "initial_scale": 8, "hysteresis": 2}, ValueError, "only apply to a dynamic"),
        ({"loss_scale": lsk.DynamicLossScale(), "min_loss_scale": 0.5}, ValueError, "Pass them to the policy"),
        ({"loss_scale": "dynamic", "initial_scale": 4, "min_loss_scale": 0.5}, ValueError, "not both"),
        ({"min_loss_scale": -1}, ValueError, "positive"),
        ({"max_consecutive_skips": 0}, ValueError, "at least 1"),
        ({"max_consecutive_skips": 2.5}, TypeError, "int or None"),
        ({"history": "yes"}, TypeError, "History"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        lsk.LossScaleOptimizer(sgd(), **kwargs)


def test_bad_inner_optimizers():
    with pytest.raises(TypeError, match="already a LossScaleOptimizer"):
        lsk.LossScaleOptimizer(lsk.LossScaleOptimizer(sgd()))
    with pytest.raises(TypeError, match="already a LossScaleOptimizer"):
        lsk.LossScaleOptimizer(keras.optimizers.LossScaleOptimizer(sgd()))
    with pytest.raises(TypeError, match="keras.optimizers.Optimizer instance"):
        lsk.LossScaleOptimizer("adam")
    with pytest.raises(ValueError, match="loss_scale=128"):
        lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1, loss_scale_factor=128))


def test_learning_rate_and_iterations_are_the_inner_optimizers():
    opt = lsk.LossScaleOptimizer(sgd())
    opt.learning_rate = 0.5
    assert float(opt.inner_optimizer.learning_rate) == 0.5 and opt.iterations is opt.inner_optimizer.iterations


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"loss_scale": 64},
        {
            "initial_scale": 1024,
            "dynamic_growth_steps": 7,
            "min_loss_scale": 0.25,
            "max_loss_scale": 2**20,
            "hysteresis": 2,
        },
        {"loss_scale": lsk.DynamicLossScale(16, 3, 4.0, backoff_factor=0.5)},
        {"loss_scale": lsk.FixedLossScaleManager(32)},
        {"loss_scale": lsk.ExponentialUpdateLossScaleManager(64, 10)},
        {"max_consecutive_skips": 5},
    ],
    ids=str,
)
def test_config_round_trip(kwargs):
    opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(0.003, beta_1=0.8), name="lso", **kwargs)
    config = opt.get_config()
    again = lsk.LossScaleOptimizer.from_config(config)
    assert again.get_config() == config and again.loss_scale_policy == opt.loss_scale_policy
    assert float(again.inner_optimizer.beta_1) == 0.8
    generic = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert type(generic) is lsk.LossScaleOptimizer and generic.get_config() == config


def test_config_of_a_dynamic_scale_is_keras_3s_own():
    config = lsk.LossScaleOptimizer(sgd(), initial_scale=2048, dynamic_growth_steps=500, name="lso").get_config()
    theirs = keras.optimizers.LossScaleOptimizer(sgd(), initial_scale=2048, dynamic_growth_steps=500, name="lso")
    assert config == theirs.get_config() == {
        "name": "lso", "inner_optimizer": keras.saving.serialize_keras_object(sgd()),
        "initial_scale": 2048, "dynamic_growth_steps": 500,
    }
    # so Keras 3's own class reads it back
    again = keras.optimizers.LossScaleOptimizer.from_config(config)
    assert (again.initial_scale, again.dynamic_growth_steps) == (2048.0, 500)


def test_config_of_a_fixed_scale_is_the_experimental_form_without_tf_keras_dynamic_key():
    config = lsk.LossScaleOptimizer(sgd(), dynamic=False, initial_scale=123).get_config()
    assert {k: v for k, v in config.items() if k != "inner_optimizer"} == {"name": config["name"], "loss_scale": 123.0}
    assert lsk.LossScaleOptimizer.from_config(config).loss_scale_policy == lsk.FixedLossScale(123)
    # tf-keras's configs (with its dynamic key) still load
    old = {"inner_optimizer": config["inner_optimizer"], "dynamic": False, "initial_scale": 123.0,
           "dynamic_growth_steps": None}
    assert lsk.LossScaleOptimizer.from_config(old).loss_scale_policy == lsk.FixedLossScale(123)


def test_from_config_does_not_mutate_its_argument():
    config = lsk.LossScaleOptimizer(sgd(), 8).get_config()
    snapshot = repr(config)
    lsk.LossScaleOptimizer.from_config(config)
    assert repr(config) == snapshot


# ----------------------------------------------------------------------------- configs from elsewhere

LEGACY_SGD = {
    "class_name": "SGD",
    "config": {"name": "SGD", "learning_rate": 0.01, "decay": 0.0, "momentum": 0.9, "nesterov": False},
}
LEGACY_ADAM = {
    "class_name": "Adam",
    "config": {
        "name": "Adam",
        "learning_rate": 0.001,
        "decay": 0.0,
        "beta_1": 0.9,
        "beta_2": 0.999,
        "epsilon": 1e-07,
        "amsgrad": False,
    },
}
# TF 2.11+ (the "new" optimizers, serialized with module/registered_name).
NEW_ADAM = {
    "module": "keras.optimizers",
    "class_name": "Adam",
    "config": {
        "name": "Adam",
        "weight_decay": None,
        "clipnorm": None,
        "global_clipnorm": None,
        "clipvalue": None,
        "use_ema": False,
        "ema_momentum": 0.99,
        "ema_overwrite_frequency": None,
        "jit_compile": False,
        "is_legacy_optimizer": False,
        "learning_rate": 0.002,
        "beta_1": 0.8,
        "beta_2": 0.999,
        "epsilon": 1e-07,
        "amsgrad": False,
    },
    "registered_name": None,
}
LEGACY_RMSPROP_2_11 = {
    "module": "keras.optimizers.legacy",
    "class_name": "RMSprop",
    "config": {
        "name": "RMSprop",
        "learning_rate": 0.001,
        "decay": 0.0,
        "rho": 0.9,
        "momentum": 0.0,
        "epsilon": 1e-07,
        "centered": False,
        "is_legacy_optimizer": True,
    },
    "registered_name": None,
}


def test_tf_2_3_experimental_dynamic_config():
    config = {
        "optimizer": LEGACY_SGD,
        "loss_scale": {
            "class_name": "DynamicLossScale",
            "config": {"initial_loss_scale": 2048.0, "increment_period": 500, "multiplier": 2.0},
        },
    }
    opt = lsk.LossScaleOptimizer.from_config(config)
    assert opt.loss_scale_policy == lsk.DynamicLossScale(2048, 500)
    assert isinstance(opt.inner_optimizer, keras.optimizers.SGD) and float(opt.inner_optimizer.momentum) == 0.9


def test_tf_2_3_experimental_fixed_config():
    config = {
        "optimizer": LEGACY_ADAM,
        "loss_scale": {"class_name": "FixedLossScale", "config": {"loss_scale_value": 128.0}},
    }
    opt = lsk.LossScaleOptimizer.from_config(config)
    assert not opt.dynamic and opt.initial_scale == 128.0 and isinstance(opt.inner_optimizer, keras.optimizers.Adam)


@pytest.mark.parametrize(
    "inner", [LEGACY_SGD, LEGACY_ADAM, NEW_ADAM, LEGACY_RMSPROP_2_11], ids=lambda d: d["class_name"]
)
@pytest.mark.parametrize(
    "scale",
    [
        {"dynamic": True, "initial_scale": 32768.0, "dynamic_growth_steps": 2000},
        {"dynamic": False, "initial_scale": 512.0, "dynamic_growth_steps": None},
    ],
    ids=["dynamic", "fixed"],
)
def test_tf_keras_stable_configs(inner, scale):
    config = {"inner_optimizer": inner, **scale}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing dropped here: no warning
        opt = lsk.LossScaleOptimizer.from_config(config)
    assert opt.dynamic is scale["dynamic"] and opt.initial_scale == scale["initial_scale"]
    assert opt.dynamic_growth_steps == scale["dynamic_growth_steps"]
    assert type(opt.inner_optimizer).__name__ == inner["class_name"]
    assert np.isclose(float(opt.inner_optimizer.learning_rate), inner["config"]["learning_rate"])


def test_jit_compile_true_is_dropped_with_a_warning():
    inner = {**NEW_ADAM, "config": {**NEW_ADAM["config"], "jit_compile": True}}
    with pytest.warns(UserWarning, match="jit_compile=True"):
        opt = lsk.LossScaleOptimizer.from_config(
            {"inner_optimizer": inner, "dynamic": True, "initial_scale": 8.0, "dynamic_growth_steps": 10}
        )
    assert float(opt.inner_optimizer.beta_1) == 0.8


def test_legacy_decay_becomes_the_same_schedule():
    inner = {
        "class_name": "SGD",
        "config": {"name": "SGD", "learning_rate": 0.5, "decay": 0.25, "momentum": 0.0, "nesterov": False},
    }
    opt = lsk.LossScaleOptimizer.from_config(
        {"inner_optimizer": inner, "dynamic": False, "initial_scale": 1.0, "dynamic_growth_steps": None}
    )
    schedule = opt.inner_optimizer._learning_rate
    # Keras 2: lr / (1 + decay * iterations)
    assert [float(schedule(step)) for step in (0, 1, 4)] == [0.5, float(np.float32(0.5 / 1.25)), 0.25]


def test_legacy_decay_with_a_schedule_is_dropped_with_a_warning():
    schedule = keras.saving.serialize_keras_object(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5))
    inner = {"class_name": "SGD", "config": {"name": "SGD", "learning_rate": schedule, "decay": 0.1}}
    with pytest.warns(UserWarning, match="decay=0.1 is dropped"):
        lsk.LossScaleOptimizer.from_config(
            {"inner_optimizer": inner, "dynamic": True, "initial_scale": 8.0, "dynamic_growth_steps": 10}
        )


def test_keras3_own_config_loads():
    theirs = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.01), initial_scale=1024, dynamic_growth_steps=50
    )
    opt = lsk.LossScaleOptimizer.from_config(theirs.get_config())
    assert opt.loss_scale_policy == lsk.DynamicLossScale(1024, 50)
    old = {**theirs.get_config(), "weight_decay": None, "use_ema": False, "ema_momentum": 0.99}
    assert lsk.LossScaleOptimizer.from_config(old).initial_scale == 1024
    with pytest.raises(ValueError, match="inner optimizer"):
        lsk.LossScaleOptimizer.from_config({**old, "clipnorm": 1.0})


def test_unusable_configs_name_the_problem():
    with pytest.raises(ValueError, match="inner_optimizer"):
        lsk.LossScaleOptimizer.from_config({"dynamic": True})
    with pytest.raises(ValueError, match="Keras 3 does not have"):
        lsk.LossScaleOptimizer.from_config({"inner_optimizer": {"class_name": "SGD", "config": {"bogus": 1}}})
    with pytest.raises(ValueError, match="not both"):
        lsk.LossScaleOptimizer.from_config({"inner_optimizer": LEGACY_SGD, "loss_scale": 8, "dynamic": True})


def test_policies_serialize_through_lossscale():
    config = lsk.LossScaleOptimizer(sgd(), lsk.FixedLossScaleManager(32)).get_config()
    assert lossscale.get(config["loss_scale"]) == lsk.FixedLossScaleManager(32)


# ----------------------------------------------------------------------------- Keras 3's initial_scale below 1


def test_a_dynamic_initial_scale_below_1_is_accepted_as_keras_3_accepts_it_and_is_the_floor():
    keras.optimizers.LossScaleOptimizer(sgd(), initial_scale=0.5)  # Keras 3 takes it
    opt = lsk.LossScaleOptimizer(sgd(), initial_scale=0.5, dynamic_growth_steps=2)
    assert opt.loss_scale_policy == lsk.DynamicLossScale(0.5, 2, min_loss_scale=0.5)
    w = keras.Variable(np.ones(2, np.float32))
    scales = []
    for g in [np.inf, 1.0, 1.0, 1.0, np.inf]:
        opt.apply([keras.ops.convert_to_tensor(np.full(2, g, np.float32))], [w])
        scales.append(float(opt.loss_scale))
    # an overflow at 0.5 stays at 0.5 (Keras 3 halves to 0.25, TF's floor of 1 would jump to 1); growth doubles
    assert scales == [0.5, 0.5, 1.0, 1.0, 0.5]
    again = lsk.LossScaleOptimizer.from_config(opt.get_config())
    assert again.loss_scale_policy == opt.loss_scale_policy
    # Keras 3's own config with a scale below 1
    theirs = keras.optimizers.LossScaleOptimizer(sgd(), initial_scale=0.25).get_config()
    assert lsk.LossScaleOptimizer.from_config(theirs).loss_scale_policy == lsk.DynamicLossScale(0.25, min_loss_scale=0.25)
    # an explicit floor still decides
    assert lsk.LossScaleOptimizer(sgd(), initial_scale=0.5, min_loss_scale=0.125).loss_scale_policy.min_loss_scale == 0.125


@pytest.mark.parametrize("value", [0, -1.0, float("inf")])
def test_an_initial_scale_keras_3_takes_but_that_breaks_the_scale_is_refused(value):
    keras.optimizers.LossScaleOptimizer(sgd(), initial_scale=value)  # Keras 3 takes any number
    with pytest.raises(ValueError, match="initial_scale must be"):
        lsk.LossScaleOptimizer(sgd(), initial_scale=value)


def test_a_fixed_scale_below_1_is_still_refused():
    with pytest.raises(ValueError, match="initial_scale must be at least 1, got 0.5"):
        lsk.LossScaleOptimizer(sgd(), dynamic=False, initial_scale=0.5)
