"""Keras checkpoints written by every release (tests/compat/fixtures/<version>/, written on the TensorFlow backend)
load with today's code and train on as an uninterrupted run does: a `.keras` file with the LossScaleOptimizer
compiled in, `.weights.h5`, and (TensorFlow backend) a tf.train.Checkpoint of the model and the optimizer, restored
completely (`assert_consumed`)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from kutil import BACKEND, numbers

import lossscale.keras as lsk
from tests.compat import recipes
from tests.compat.compare import VERSIONS, at_save, fixture

AFTER = range(recipes.SAVED_AFTER, recipes.TOTAL_STEPS)
EVERYTHING = range(recipes.TOTAL_STEPS)
#: The fixtures' first steps ran on TensorFlow; on the other backends, Adam's update may round differently.
EXACT = BACKEND == "tensorflow"


def arrays(variables):
    return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]


def assert_close(mine, theirs, where):
    assert len(mine) == len(theirs), where
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if EXACT:
            np.testing.assert_array_equal(a, b, err_msg=f"{where}[{i}]")
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=f"{where}[{i}]")


def check_at_save(version, name, opt):
    scale, good, _bad, skipped, _consecutive = numbers(opt)
    recorded = at_save(version, name)
    mine = {"loss_scale": scale, "good_steps": good, "skipped_steps": skipped, "iterations": int(opt.iterations)}
    assert mine == recorded == {**recipes.AT_SAVE, "iterations": recipes.SAVED_AFTER - 1}


@pytest.fixture(scope="module")
def uninterrupted():
    model = recipes.keras_model(lsk)
    recipes.keras_steps(model, model.optimizer, range(recipes.SAVED_AFTER))
    at_saving = arrays(model.trainable_weights)
    recipes.keras_steps(model, model.optimizer, AFTER)
    scale, _good, _bad, skipped, _consecutive = numbers(model.optimizer)
    assert (scale, skipped) == (recipes.AT_END["loss_scale"], recipes.AT_END["skipped_steps"])
    return model, at_saving


def same_run(model, opt, reference):
    ref_model = reference[0]
    assert_close(arrays(model.weights), arrays(ref_model.weights), "weights")
    assert numbers(opt) == numbers(ref_model.optimizer)
    assert int(opt.iterations) == int(ref_model.optimizer.iterations)
    assert_close(arrays(opt.inner_optimizer.variables), arrays(ref_model.optimizer.inner_optimizer.variables),
                 "inner optimizer")


@pytest.mark.parametrize("version", VERSIONS)
def test_keras_file_resumes(version, uninterrupted):
    model = keras.models.load_model(fixture(version, "keras_model.keras"))
    opt = model.optimizer
    assert isinstance(opt, lsk.LossScaleOptimizer)
    check_at_save(version, "keras_model.keras", opt)
    recipes.keras_steps(model, opt, AFTER)
    same_run(model, opt, uninterrupted)


@pytest.mark.parametrize("version", VERSIONS)
def test_weights_file_resumes(version, uninterrupted):
    model = recipes.keras_model(lsk)  # compiled, the optimizer built: save_weights wrote its variables too
    model.load_weights(fixture(version, "keras_model.weights.h5"))
    assert_close(arrays(model.trainable_weights), uninterrupted[1], "weights at the save")
    check_at_save(version, "keras_model.weights.h5", model.optimizer)
    recipes.keras_steps(model, model.optimizer, AFTER)
    same_run(model, model.optimizer, uninterrupted)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.train.Checkpoint is TensorFlow's")
@pytest.mark.parametrize("when", ["after build", "before build"])
@pytest.mark.parametrize("version", VERSIONS)
def test_tf_checkpoint_restores_completely_and_resumes(version, when, uninterrupted):
    import tensorflow as tf

    model = recipes.keras_model(lsk, compiled=False)
    opt = recipes.keras_optimizer(lsk)
    model.compile(optimizer=opt, loss="mse")
    if when == "after build":
        opt.build(model.trainable_variables)
    status = tf.train.Checkpoint(model=model, optimizer=opt).read(str(fixture(version, "keras_checkpoint") / "ckpt"))
    if when == "before build":  # the optimizer's values wait in TF's deferred restorations
        opt.build(model.trainable_variables)
    status.assert_consumed()  # every saved value has a home, and every variable got its value
    check_at_save(version, "keras_checkpoint", opt)
    recipes.keras_steps(model, opt, AFTER)
    same_run(model, opt, uninterrupted)
