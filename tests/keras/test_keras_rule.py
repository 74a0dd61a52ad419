"""The scale trajectory equals the numpy reference (TF's rule and lossscale's extensions) on this backend,
eagerly and compiled; a skipped step leaves weights, slots and iterations as they were, in every mode."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import ops
from kutil import BACKEND, compiled_stepper, eager_stepper, grad_for, numbers, state_variables

import lossscale
import lossscale.keras as lsk
from tests.reference import PATTERN, POLICIES, trajectory


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_eager_trajectory_equals_reference(policy):
    assert trajectory(policy, PATTERN, eager_stepper(policy)) == trajectory(policy, PATTERN, "numpy")


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_compiled_trajectory_equals_reference(policy):
    assert trajectory(policy, PATTERN, compiled_stepper()) == trajectory(policy, PATTERN, "numpy")


def test_tf_rule_by_hand():
    # TF's documented rule: x2 after dynamic_growth_steps finite steps, /2 on overflow, floor 1, counter reset.
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2, dynamic_growth_steps=2)
    w = keras.Variable(np.zeros(2, np.float32))
    seen = []
    for finite in [True, True, False, False, False, True, True]:
        opt.apply([ops.convert_to_tensor(grad_for(finite))], [w])
        seen.append((float(opt.loss_scale), int(opt.dynamic_counter)))
    assert seen == [(2, 1), (4, 0), (2, 0), (1, 0), (1, 0), (1, 1), (2, 0)]


def test_growth_refused_when_the_product_is_not_finite():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0**127, dynamic_growth_steps=1)
    w = keras.Variable(np.zeros(2, np.float32))
    opt.apply([ops.convert_to_tensor(grad_for(True, 0.0))], [w])
    assert float(opt.loss_scale) == 2.0**127 and int(opt.dynamic_counter) == 0


@pytest.mark.parametrize("loss_scale", ["dynamic", 8, lossscale.FixedLossScale(1)], ids=str)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_skip_keeps_weights_slots_and_iterations(loss_scale, bad):
    opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(0.1), loss_scale)
    w = keras.Variable(np.array([1.0, 2.0], np.float32))
    opt.apply([ops.convert_to_tensor(np.array([3.0, 4.0], np.float32))], [w])
    before = [ops.convert_to_numpy(v).copy() for v in opt.inner_optimizer.variables] + [ops.convert_to_numpy(w).copy()]
    opt.apply([ops.convert_to_tensor(np.array([bad, 4.0], np.float32))], [w])
    after = [ops.convert_to_numpy(v) for v in opt.inner_optimizer.variables] + [ops.convert_to_numpy(w)]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert int(opt.iterations) == 1 and int(opt.skipped_steps) == 1 and bool(opt.last_step_skipped)
    opt.apply([ops.convert_to_tensor(np.array([3.0, 4.0], np.float32))], [w])
    assert int(opt.iterations) == 2 and not bool(opt.last_step_skipped) and int(opt.skipped_steps) == 1


def test_unscaled_update_equals_the_plain_optimizer():
    # A scaled gradient S*g applied by the LSO moves the weights as g applied by the inner optimizer alone.
    plain, scaled = keras.optimizers.Adam(0.01), lsk.LossScaleOptimizer(keras.optimizers.Adam(0.01), 1024)
    w1, w2 = (keras.Variable(np.array([1.0, -1.0], np.float32)) for _ in range(2))
    for g in ([0.5, -0.25], [0.125, 2.0], [1.0, 1.0]):
        plain.apply([ops.convert_to_tensor(np.array(g, np.float32))], [w1])
        scaled.apply([ops.convert_to_tensor(1024 * np.array(g, np.float32))], [w2])
    np.testing.assert_array_equal(ops.convert_to_numpy(w1), ops.convert_to_numpy(w2))


def test_same_trajectory_as_keras_own_until_the_floor():
    # Keras 3's class and this one agree on TF's rule above 1; below, Keras' keeps halving (no floor).
    ours = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=4, dynamic_growth_steps=2)
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=4, dynamic_growth_steps=2)
    if BACKEND == "jax":
        pytest.skip("Keras' own class cannot apply eagerly on JAX (UnexpectedTracerError); see test_keras_loops")
    w1, w2 = (keras.Variable(np.zeros(2, np.float32)) for _ in range(2))
    pattern = "TTTFTFFFFF"
    scales = []
    for c in pattern:
        g = ops.convert_to_tensor(grad_for(c == "T"))
        ours.apply([g], [w1])
        theirs.apply([g], [w2])
        scales.append((float(ours.loss_scale), float(theirs.dynamic_scale)))
    assert [s[0] for s in scales] == [4, 8, 8, 4, 4, 2, 1, 1, 1, 1]
    assert [s[1] for s in scales] == [4, 8, 8, 4, 4, 2, 1, 0.5, 0.25, 0.125]


def test_counters_are_int32_variables_and_saturate_like_the_core():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), 4)
    w = keras.Variable(np.zeros(2, np.float32))
    opt.build([w])
    assert [keras.backend.standardize_dtype(v.dtype) for v in state_variables(opt)] == ["float32"] + ["int32"] * 4
    state_variables(opt)[3].assign(2**31 - 1)
    opt.apply([ops.convert_to_tensor(grad_for(False))], [w])
    assert numbers(opt)[3] == 2**31 - 1
