"""The finiteness check of every apply path, on values a shortcut could get wrong.

TensorFlow checks float32 gradients through their sums first (falling back to the exact check when a sum is
not finite); torch unscales into new tensors and checks those with torch's multi-tensor kernel. These tests
pin the exact answer on each backend: finite values whose sum overflows are finite, +Inf beside -Inf is not,
and the caller's gradient tensors are left as they were.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import ops
from kutil import BACKEND

import lossscale.keras as lsk

BIG = np.float32(3.0e38)  # two of these sum past float32's 3.4e38


def _step(opt, grads, variables, compiled):
    """One ``apply`` of ``grads`` (numpy arrays), eagerly or compiled (tf.function on TF, jit'd stateless on JAX)."""
    tensors = [ops.convert_to_tensor(g) for g in grads]
    if not compiled:
        opt.apply(tensors, variables)
        return
    if BACKEND == "tensorflow":
        import tensorflow as tf

        tf.function(lambda gs: opt.apply(gs, variables))(tensors)
    elif BACKEND == "jax":
        import jax

        values = [v.value for v in opt.variables]
        new_tv, new_ov = jax.jit(opt.stateless_apply)(values, tensors, [v.value for v in variables])
        for v, value in zip(variables, new_tv):
            v.assign(value)
        for v, value in zip(opt.variables, new_ov):
            v.assign(value)
    else:
        pytest.skip("torch runs eagerly only")


def _fresh(shapes, dtype="float32"):
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(1e-38), loss_scale=1.0)
    variables = [keras.Variable(np.zeros(s, np.float32), dtype=dtype) for s in shapes]
    opt.build(variables)
    return opt, variables


CASES = {
    "finite values whose sum overflows": ([np.array([BIG, BIG, 1.0], np.float32)], True),
    "negative ones too": ([np.array([-BIG, -BIG], np.float32), np.ones(3, np.float32)], True),
    "+Inf": ([np.array([1.0, np.inf], np.float32)], False),
    "+Inf beside -Inf (sum NaN)": ([np.array([np.inf, -np.inf, 1.0], np.float32)], False),
    "NaN in the second gradient": ([np.ones(2, np.float32), np.array([np.nan, 0.0], np.float32)], False),
    "Inf after an overflowing sum": ([np.array([BIG, BIG], np.float32), np.array([-np.inf], np.float32)], False),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case", list(CASES))
def test_apply_skips_exactly_the_non_finite_steps(case, compiled):
    grads, finite = CASES[case]
    opt, variables = _fresh([g.shape for g in grads])
    _step(opt, grads, variables, compiled)
    assert int(opt.skipped_steps) == (0 if finite else 1)
    assert int(opt.iterations) == (1 if finite else 0)
    assert bool(ops.convert_to_numpy(opt.check_finite([ops.convert_to_tensor(g) for g in grads]))) is finite


def test_float16_gradients_past_float16s_sum_range_are_finite():
    # Half-precision gradients take the exact check: their sum would overflow at 65504.
    grads = [np.array([60000.0, 60000.0], np.float16)]
    assert bool(ops.convert_to_numpy(lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1)).check_finite(
        [ops.convert_to_tensor(g) for g in grads]
    )))


def test_apply_leaves_the_callers_gradients_as_they_were():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.5), loss_scale=4.0)
    w = keras.Variable(np.zeros(3, np.float32))
    opt.build([w])
    for values in ([4.0, 8.0, -12.0], [np.inf, 1.0, 2.0]):
        grad = ops.convert_to_tensor(np.array(values, np.float32))
        before = np.array(ops.convert_to_numpy(grad))
        opt.apply([grad], [w])
        np.testing.assert_array_equal(ops.convert_to_numpy(grad), before)
    np.testing.assert_array_equal(ops.convert_to_numpy(w), [-0.5, -1.0, 1.5])  # one step of -0.5 * g / 4
    assert int(opt.skipped_steps) == 1
