"""tf.train.Checkpoint (TensorFlow backend): the plain inner optimizer's checkpoint restores into the loss-scale
optimizer and the reverse, before or after build, as in tf-keras; the wrapper's own checkpoint carries the scale."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from kutil import BACKEND, numbers

import lossscale.keras as lsk

pytestmark = pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.train.Checkpoint is TensorFlow's")


def variables():
    return [keras.Variable(np.ones((3, 2), np.float32), name="k"), keras.Variable(np.zeros(2, np.float32), name="b")]


def stepped(opt, ws, scale=1.0):
    opt.apply([keras.ops.ones_like(w) * scale for w in ws], ws)
    return opt


def values(opt):
    return [np.array(v.numpy()) for v in opt.variables]


@pytest.mark.parametrize("when", ["before build", "after build"])
def test_plain_checkpoint_restores_into_the_wrapper_and_back(tmp_path, when):
    import tensorflow as tf

    plain = stepped(keras.optimizers.Adam(0.1), variables())
    path = tf.train.Checkpoint(optimizer=plain).save(str(tmp_path / "plain"))
    wrapper = lsk.LossScaleOptimizer(keras.optimizers.Adam(0.1), initial_scale=8.0)
    ws = variables()
    if when == "after build":
        wrapper.build(ws)
    tf.train.Checkpoint(optimizer=wrapper).restore(path)
    if when == "before build":
        wrapper.build(ws)
    assert int(wrapper.iterations) == 1
    for mine, theirs in zip(wrapper.inner_optimizer.variables, plain.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    assert numbers(wrapper) == (8.0, 0, 0, 0, 0)  # no scale in a plain checkpoint: the initial one

    stepped(wrapper, ws, scale=8.0)
    back = tf.train.Checkpoint(optimizer=wrapper).save(str(tmp_path / "wrapper"))
    plain_again = keras.optimizers.Adam(0.1)
    if when == "after build":
        plain_again.build(variables())
    tf.train.Checkpoint(optimizer=plain_again).restore(back).expect_partial()
    if when == "before build":
        plain_again.build(variables())
    assert int(plain_again.iterations) == 2
    for mine, theirs in zip(plain_again.variables, wrapper.inner_optimizer.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


@pytest.mark.parametrize("when", ["before build", "after build"])
def test_wrapper_checkpoint_carries_the_scale_state(tmp_path, when):
    import tensorflow as tf

    ws = variables()
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=8.0)
    opt.apply([keras.ops.convert_to_tensor(np.full((3, 2), np.inf, np.float32)), keras.ops.zeros(2)], ws)
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "ck"))
    again = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=8.0)
    if when == "after build":
        again.build(variables())
    tf.train.Checkpoint(optimizer=again).restore(path)
    if when == "before build":
        again.build(variables())
    assert numbers(again) == numbers(opt) == (4.0, 0, 0, 1, 1)
