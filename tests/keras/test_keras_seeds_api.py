"""The seeds' remaining methods and signatures, the tf-keras behaviours of issue 19 item 8, and one record for
config, pickling and deepcopy (issue 23 defect 2). Every backend unless marked."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass

import keras
import numpy as np
import pytest
from keras import ops
from kutil import BACKEND, grad_for, numbers

import lossscale
import lossscale.keras as lsk


def built(**kwargs):
    opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(0.1), **kwargs)
    w = keras.Variable(np.ones(2, np.float32), name="w")
    opt.build([w])
    return opt, w


def test_apply_gradients_takes_the_seeds_signature():
    opt, w = built(initial_scale=4.0)
    g = ops.convert_to_tensor(np.array([4.0, 8.0], np.float32))
    iterations = opt.apply_gradients([(g, w)], name="step", experimental_aggregate_gradients=False)
    assert int(iterations) == 1
    # One Adam step from gradients [1, 2] (the given ones divided by the scale 4): each weight moves by lr.
    np.testing.assert_allclose(ops.convert_to_numpy(w), [0.9, 0.9], rtol=1e-5)


def test_slots_map_onto_keras3_variables():
    opt, w = built()
    assert opt.get_slot_names() == ["momentum", "velocity"]
    opt.apply([ops.convert_to_tensor(np.array([1.0, 2.0], np.float32) * float(opt.loss_scale))], [w])
    m = opt.get_slot(w, "m")  # tf-keras's name
    assert m is opt.get_slot(w, "momentum")  # Keras 3's
    np.testing.assert_allclose(ops.convert_to_numpy(m), [0.1, 0.2], rtol=1e-5)  # (1 - beta_1) * g
    with pytest.raises(KeyError, match="get_slot_names"):
        opt.get_slot(w, "nope")
    extra = opt.add_slot(w, "mine")
    assert opt.add_slot(w, "mine") is extra and extra.shape == (2,)
    assert opt.add_slot(w, "v") is opt.get_slot(w, "velocity")


def test_get_gradients_is_tensorflow_graph_mode_only():
    opt, w = built(initial_scale=8.0)
    if BACKEND != "tensorflow":
        with pytest.raises(NotImplementedError, match="apply\\(grads, variables\\)"):
            opt.get_gradients(ops.sum(w), [w])
        return
    import tensorflow as tf

    with pytest.raises(RuntimeError, match="tf.function"):
        opt.get_gradients(ops.sum(w), [w])
    grads = tf.function(lambda: opt.get_gradients(lambda: tf.reduce_sum(w * w), [w]))()
    np.testing.assert_array_equal(grads[0].numpy(), [2.0, 2.0])


def test_inner_settings_read_and_write_through_the_wrapper():
    inner = keras.optimizers.Adam(0.1, clipnorm=2.0)
    opt = lsk.LossScaleOptimizer(inner)
    assert opt.clipnorm == 2.0 and opt.use_ema is False
    opt.use_ema = True
    opt.weight_decay = 0.01
    assert inner.use_ema is True and inner.weight_decay == 0.01
    w = keras.Variable(np.ones(2, np.float32))
    opt.build([w])
    assert any("average" in v.name for v in inner.variables)  # the inner built its EMA


@pytest.mark.parametrize("arg", ["clipnorm", "weight_decay", "use_ema", "global_clipnorm", "loss_scale_factor"])
def test_base_optimizer_arguments_are_refused_naming_inner_optimizer(arg):
    with pytest.raises(ValueError, match=f"does not support `{arg}`. Instead, set `{arg}` on the `inner_optimizer`"):
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), **{arg: 1.0 if arg != "use_ema" else True})
    with pytest.raises(ValueError, match=f"{arg}=.*inner_optimizer"):
        lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), **{arg: 1.0 if arg != "use_ema" else True})


@pytest.mark.parametrize("kwargs", [{"bogus": 1}, {"foo": 1, "bar": 2}, {"clipnorm": None, "foo": 1}])
def test_unknown_keywords_raise_keras_3s_value_error(kwargs):
    with pytest.raises(ValueError) as theirs:
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), **kwargs)
    with pytest.raises(ValueError) as ours:
        lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), **kwargs)
    unknown = "`, `".join(k for k in kwargs if k != "clipnorm")
    assert str(theirs.value) == f"LossScaleOptimizer does not support arguments: `{unknown}`."
    assert str(ours.value).startswith(str(theirs.value))  # and then names the keywords it takes
    assert "initial_scale, dynamic_growth_steps" in str(ours.value)


def test_base_optimizer_arguments_at_their_defaults_are_accepted_as_keras_3_accepts_them():
    defaults = {
        "weight_decay": None, "clipnorm": None, "global_clipnorm": None, "clipvalue": None, "use_ema": False,
        "ema_momentum": 0.99, "ema_overwrite_frequency": None, "loss_scale_factor": None,
        "gradient_accumulation_steps": None,
    }
    keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), **defaults)  # Keras 3 accepts them
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1, clipnorm=2.0), **defaults, initial_scale=64)
    assert opt.clipnorm == 2.0 and opt.use_ema is False  # the inner's settings are untouched
    assert opt.loss_scale_policy == lsk.DynamicLossScale(64)
    lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), use_ema=0)  # equal to the default, as Keras 3 compares


def test_an_inner_optimizer_has_one_wrapper():
    inner = keras.optimizers.SGD(0.1)
    first = lsk.LossScaleOptimizer(inner)
    with pytest.raises(ValueError, match="already wrapped by another LossScaleOptimizer"):
        lsk.LossScaleOptimizer(inner)
    del first
    lsk.LossScaleOptimizer(inner)  # the first wrapper is gone


@dataclass(frozen=True)
class Quartering(lossscale.DynamicLossScale):
    """A LossScale subclass of the user's own (found only through custom_objects)."""


def test_from_config_resolves_a_custom_loss_scale_through_custom_objects():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), Quartering(64.0, 3))
    config = opt.get_config()
    with pytest.raises(ValueError, match="custom_objects"):
        lsk.LossScaleOptimizer.from_config(config)
    again = lsk.LossScaleOptimizer.from_config(config, custom_objects={"Quartering": Quartering})
    assert again.loss_scale_policy == Quartering(64.0, 3)


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_pickle_and_deepcopy_go_through_config_and_values(how):
    opt, w = built(loss_scale=Quartering(64.0, 3), max_consecutive_skips=5)
    opt.apply([ops.convert_to_tensor(grad_for(False))], [w])
    opt.apply([ops.convert_to_tensor(grad_for(True))], [w])
    clone = pickle.loads(pickle.dumps(opt)) if how == "pickle" else copy.deepcopy(opt)
    assert clone.loss_scale_policy == Quartering(64.0, 3) and clone.get_config() == opt.get_config()
    assert clone.inner_optimizer is not opt.inner_optimizer
    w2 = keras.Variable(np.ones(2, np.float32))
    clone.build([w2])
    assert numbers(clone) == numbers(opt) == (32.0, 1, 0, 1, 0)
    for mine, theirs in zip(clone.variables, opt.variables):
        np.testing.assert_array_equal(ops.convert_to_numpy(mine), ops.convert_to_numpy(theirs))


def test_stall_guard_raises_lossscale_error_from_an_eager_apply():
    opt, w = built(max_consecutive_skips=2)
    bad = ops.convert_to_tensor(grad_for(False))
    opt.apply([bad], [w])
    with pytest.raises(lossscale.LossScaleError, match="2 steps in a row"):
        opt.apply([bad], [w])


def test_the_experimental_forms_optimizer_keyword_names_the_inner_optimizer():
    # Seeds 001/002: tf.keras.mixed_precision.experimental.LossScaleOptimizer(optimizer, loss_scale).
    inner = keras.optimizers.SGD(0.1)
    opt = lsk.LossScaleOptimizer(optimizer=inner, loss_scale=123)
    assert opt.inner_optimizer is inner and opt.loss_scale_policy == lsk.FixedLossScale(123)
    assert lsk.LossScaleOptimizer(optimizer=keras.optimizers.SGD(0.1)).loss_scale_policy == lsk.DynamicLossScale()
    with pytest.raises(TypeError, match="both inner_optimizer and optimizer"):
        lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), optimizer=keras.optimizers.SGD(0.1))
    with pytest.raises(TypeError, match="needs the optimizer to wrap"):
        lsk.LossScaleOptimizer(loss_scale="dynamic")


def test_lr_and_weights_are_tf_keras_names_of_learning_rate_and_variables():
    # Seed 002's attributes: lr (the learning rate) and weights (the variables, in creation order).
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.25))
    assert [v.name for v in opt.weights] == [v.name for v in opt.variables] == ["iteration", "learning_rate"] * 2
    w = keras.Variable(np.ones(2, np.float32))
    opt.build([w])
    assert float(opt.lr) == 0.25
    opt.lr = 0.5
    assert float(opt.inner_optimizer.learning_rate) == 0.5 and float(opt.learning_rate) == 0.5
    assert [id(v) for v in opt.weights] == [id(v) for v in opt.variables] and len(opt.weights) == 9


@pytest.mark.parametrize(
    "malformed",
    [lambda w: [ops.ones((2,))], lambda w: [(ops.ones((2,)),)], lambda w: [(ops.ones((2,)), w, 1)],
     lambda w: ops.ones((2, 2))],
    ids=["tensor", "one", "three", "2x2-tensor"],
)
def test_malformed_grads_and_vars_raise_type_error_and_change_nothing(malformed):
    # Seed 002: apply_gradients raises TypeError if grads_and_vars is malformed (a (2, 2) tensor used to unpack as
    # one pair of rows and fail deep inside the step, differently per backend).
    opt, w = built(initial_scale=4.0)
    with pytest.raises(TypeError, match=r"\(gradient, variable\) pairs"):
        opt.apply_gradients(malformed(w))
    assert int(opt.iterations) == 0 and numbers(opt) == (4.0, 0, 0, 0, 0)
    np.testing.assert_array_equal(ops.convert_to_numpy(w), [1.0, 1.0])


def test_no_gradient_for_any_variable_is_keras_value_error_on_every_backend():
    # Seed 002: ValueError if none of the variables have gradients; Keras' own words, not wrapped by the step's cond.
    opt, w = built(initial_scale=4.0)
    for call in (lambda: opt.apply_gradients([(None, w)]), lambda: opt.apply([None], [w])):
        with pytest.raises(ValueError) as error:
            call()
        assert str(error.value) == "No gradients provided for any variable."
    assert int(opt.iterations) == 0 and numbers(opt) == (4.0, 0, 0, 0, 0)


@pytest.mark.skipif(BACKEND == "tensorflow", reason="stateless_apply is JAX's and torch's")
def test_stateless_apply_before_build_raises_keras_3s_error():
    messages = []
    for cls in (keras.optimizers.LossScaleOptimizer, lsk.LossScaleOptimizer):
        with pytest.raises(ValueError) as error:
            cls(keras.optimizers.SGD(0.1)).stateless_apply([], [ops.ones((2,))], [ops.ones((2,))])
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    assert messages[1].startswith("To call `stateless_apply`, LossScaleOptimizer must be built")
