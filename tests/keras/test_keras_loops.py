"""Custom training loops on each backend, in both gradient contracts, and the rule that tells them apart."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import ops
from kutil import BACKEND

import lossscale.keras as lsk

X = np.linspace(-1, 1, 16, dtype=np.float32).reshape(8, 2)
Y = (X @ np.array([[0.5], [-1.5]], np.float32)).astype(np.float32)


def make_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])


def weights(model):
    return [np.array(v.numpy()) for v in model.trainable_variables]


def loss_of(model, x, y):
    return ops.mean(ops.square(ops.subtract(model(x), ops.convert_to_tensor(y))))


def train(contract, steps=3, xs=None, compiled=False):
    """Trains with a custom loop in the given contract: "keras3" (scale_loss -> grads -> apply, the LSO
    unscales) or "seeds" (get_scaled_loss -> grads -> get_unscaled_gradients -> apply_gradients)."""
    model = make_model()
    opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(0.05), initial_scale=256, dynamic_growth_steps=2)
    variables = model.trainable_variables
    opt.build(variables)
    xs = xs if xs is not None else [X] * steps

    def finish(grads):
        if contract == "seeds":
            opt.apply_gradients(zip(opt.get_unscaled_gradients(grads), variables))
        else:
            opt.apply(grads, variables)

    if BACKEND == "tensorflow":
        import tensorflow as tf

        def step(x):
            with tf.GradientTape() as tape:
                scaled = (opt.get_scaled_loss if contract == "seeds" else opt.scale_loss)(loss_of(model, x, Y))
            finish(tape.gradient(scaled, variables))

        step = tf.function(step) if compiled else step
        for x in xs:
            step(tf.constant(x))
    elif BACKEND == "torch":
        for x in xs:
            for v in variables:
                v.value.grad = None
            scaled = (opt.get_scaled_loss if contract == "seeds" else opt.scale_loss)(loss_of(model, x, Y))
            scaled.backward()
            finish([v.value.grad for v in variables])
    else:
        import jax

        def scaled_loss(tv, ntv, ov, x):
            mapping = list(zip(model.trainable_variables, tv)) + list(zip(model.non_trainable_variables, ntv))
            with keras.StatelessScope(state_mapping=mapping + list(zip(opt.variables, ov))):
                return opt.scale_loss(loss_of(model, x, Y))

        def jax_step(tv, ntv, ov, x):
            grads = jax.grad(scaled_loss)(tv, ntv, ov, x)
            if contract == "seeds":
                with keras.StatelessScope(state_mapping=list(zip(opt.variables, ov))):
                    grads = opt.get_unscaled_gradients(grads)
            tv, ov = opt.stateless_apply(ov, grads, tv)
            return tv, ov

        fn = jax.jit(jax_step) if compiled else jax_step
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]
        ov = [v.value for v in opt.variables]
        for x in xs:
            tv, ov = fn(tv, ntv, ov, x)
        for v, value in zip(model.trainable_variables, tv):
            v.assign(value)
        for v, value in zip(opt.variables, ov):
            v.assign(value)
    return model, opt


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_both_contracts_train_identically(compiled):
    m1, o1 = train("keras3", compiled=compiled)
    m2, o2 = train("seeds", compiled=compiled)
    for a, b in zip(weights(m1), weights(m2)):
        np.testing.assert_array_equal(a, b)
    assert float(o1.loss_scale) == float(o2.loss_scale) == 512.0
    assert int(o1.iterations) == int(o2.iterations) == 3
    start = weights(make_model())
    assert not np.array_equal(start[0], weights(m1)[0])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_bad_batch_is_skipped_in_a_custom_loop(compiled):
    # The Inf comes in through the data, so no graph optimizer can fold it away.
    bad = X.copy()
    bad[0, 0] = np.inf
    m1, o1 = train("seeds", xs=[X, bad, X], compiled=compiled)
    m2, o2 = train("seeds", xs=[X, X], compiled=compiled)
    for a, b in zip(weights(m1), weights(m2)):
        np.testing.assert_array_equal(a, b)
    assert int(o1.skipped_steps) == 1 and int(o1.iterations) == 2
    assert float(o1.loss_scale) == 128.0 and float(o2.loss_scale) == 512.0


def test_eager_jax_custom_loop_works_where_keras_own_crashes():
    if BACKEND != "jax":
        pytest.skip("JAX only")
    model = make_model()
    ours = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    import jax

    def loss_fn(tv):
        with keras.StatelessScope(state_mapping=list(zip(model.trainable_variables, tv))):
            return ours.scale_loss(loss_of(model, X, Y))

    grads = jax.grad(loss_fn)([v.value for v in model.trainable_variables])
    before = weights(model)
    ours.apply(grads, model.trainable_variables)  # eager, stateful: no UnexpectedTracerError
    assert int(ours.iterations) == 1
    assert not np.array_equal(before[0], weights(model)[0])


def _grads(opt, scale):
    return [ops.convert_to_tensor(np.array([scale * 1.0, scale * 2.0], np.float32))]


def _fresh(scale=4.0):
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(1.0), scale)
    w = keras.Variable(np.zeros(2, np.float32))
    opt.build([w])
    return opt, w


def test_contract_rule_side_call_for_logging_still_unscales():
    opt, w = _fresh()
    scaled = _grads(opt, 4.0)
    opt.get_unscaled_gradients(scaled)  # looked at, not used
    opt.apply(scaled, [w])
    np.testing.assert_array_equal(ops.convert_to_numpy(w), [-1.0, -2.0])


def test_contract_rule_logging_after_the_step_arms_nothing():
    """get_unscaled_gradients on the gradients the last apply took (logging after the step) leaves the next apply
    on Keras 3's contract; it took the next step's new scaled gradients as unscaled, a step S times too large."""
    opt, w = _fresh()
    for _ in range(2):
        scaled = _grads(opt, 4.0)
        opt.apply(scaled, [w])
        opt.get_unscaled_gradients(scaled)  # logged after the step
    np.testing.assert_array_equal(ops.convert_to_numpy(w), [-2.0, -4.0])


@pytest.mark.skipif(BACKEND == "torch", reason="eager: a call before fit cannot be told from the TF contract")
def test_contract_rule_a_call_outside_fit_does_not_reach_fits_steps():
    """A call made eagerly (an inspection before training) is not the traced first step's contract: fit trains as
    without it (on JAX the first trace baked "already unscaled" into every step: the loss went to inf)."""
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = np.ones((64, 1), "float32")
    losses = []
    for inspect in (False, True):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.01))
        model.compile(optimizer=opt, loss="mse")
        if inspect:
            opt.get_unscaled_gradients([ops.ones_like(v.value) for v in model.trainable_variables])
        losses.append(model.fit(x, y, batch_size=32, epochs=2, verbose=0).history["loss"])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)


def test_contract_rule_clipped_unscaled_gradients_are_not_unscaled_again():
    opt, w = _fresh()
    (unscaled,) = opt.get_unscaled_gradients(_grads(opt, 4.0))
    opt.apply([ops.clip(unscaled, -1.5, 1.5)], [w])
    np.testing.assert_array_equal(ops.convert_to_numpy(w), [-1.0, -1.5])
    opt.apply(_grads(opt, 4.0), [w])  # the next apply is back to Keras 3's contract
    np.testing.assert_array_equal(ops.convert_to_numpy(w), [-2.0, -3.5])


def test_contract_rule_refuses_a_mixture():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(1.0), 4)
    w1, w2 = keras.Variable(np.zeros(2, np.float32)), keras.Variable(np.zeros(2, np.float32))
    scaled = _grads(opt, 4.0) + _grads(opt, 4.0)
    unscaled = opt.get_unscaled_gradients(scaled)
    with pytest.raises(ValueError, match="mix tensors"):
        opt.apply([scaled[0], unscaled[1]], [w1, w2])


def test_get_unscaled_gradients_keeps_none_and_dtypes():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(1.0), 1024)
    g16 = ops.convert_to_tensor(np.array([512.0, 2.0**-10], np.float16))
    out = opt.get_unscaled_gradients([None, g16, ops.convert_to_tensor(np.array([2048.0], np.float32))])
    assert out[0] is None
    assert keras.backend.standardize_dtype(out[1].dtype) == "float16"
    np.testing.assert_array_equal(ops.convert_to_numpy(out[1]), np.array([0.5, 2.0**-20], np.float16))
    np.testing.assert_array_equal(ops.convert_to_numpy(out[2]), [2.0])


def test_get_scaled_loss_tensor_and_callable():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(1.0), 8)
    loss = ops.convert_to_tensor(np.float16(0.5))
    scaled = opt.get_scaled_loss(loss)
    assert keras.backend.standardize_dtype(scaled.dtype) == "float16" and float(scaled) == 4.0
    assert float(opt.get_scaled_loss(lambda: loss)()) == 4.0
    assert float(opt.scale_loss(ops.convert_to_tensor(1.5))) == 12.0


def test_scale_loss_promotes_a_half_precision_loss_as_keras_3_does():
    """Keras 3's scale_loss multiplies by the float32 scale variable: a float16 loss of 3 at 2**15 is 98304 in
    float32, not inf in float16 (get_scaled_loss, TF's name, keeps TF's dtype)."""
    for cls in (keras.optimizers.LossScaleOptimizer, lsk.LossScaleOptimizer):
        opt = cls(keras.optimizers.SGD(1.0))
        opt.build([keras.Variable(np.zeros(1, np.float32))])
        scaled = opt.scale_loss(ops.cast(3.0, "float16"))
        assert keras.backend.standardize_dtype(scaled.dtype) == "float32" and float(scaled) == 98304.0, cls
    assert keras.backend.standardize_dtype(opt.get_scaled_loss(ops.cast(3.0, "float16")).dtype) == "float16"


def test_minimize_tensorflow_seed_example():
    if BACKEND != "tensorflow":
        with pytest.raises(NotImplementedError, match="apply"):
            lsk.LossScaleOptimizer(keras.optimizers.SGD(0.25)).minimize(lambda: 1.0, [])
        return
    # Seed 002: var = 1, loss = var**2, SGD(0.25): minimize gives 0.5, then a tape step gives 0.25.
    import tensorflow as tf

    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.25), "dynamic")
    var = keras.Variable(1.0)
    opt.minimize(lambda: var**2, [var])
    assert float(var) == 0.5
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(var**2)
    (grad,) = opt.get_unscaled_gradients([tape.gradient(scaled, var)])
    opt.apply_gradients([(grad, var)])
    assert float(var) == 0.25


@pytest.mark.skipif(BACKEND != "tensorflow", reason="minimize is TensorFlow's")
@pytest.mark.parametrize("form", ["tf.Variable", "keras.Variable", "callable"])
def test_minimize_takes_one_variable_or_a_callable_as_var_list(form):
    """The seed's own form, ``minimize(loss, var_list=var)`` with one variable (it raised "Cannot iterate over a
    scalar tensor"), and TF's callable var_list, called after the loss."""
    import tensorflow as tf

    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.25), "dynamic")
    var = tf.Variable(1.0) if form == "tf.Variable" else keras.Variable(1.0)
    opt.minimize(lambda: var**2, var_list=(lambda: [var]) if form == "callable" else var)
    assert float(var.numpy()) == 0.5


def test_apply_to_a_variable_it_was_not_built_with_raises_and_changes_nothing():
    # Keras' own optimizers raise "Unknown variable"; on JAX the gradient of such a variable was dropped silently
    # while the known ones were updated.
    v = keras.Variable(np.ones(3, "float32"))
    w = keras.Variable(np.ones(2, "float32"))
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=1)
    opt.apply([ops.ones(3)], [v])
    with pytest.raises(ValueError, match="Unknown variable"):
        opt.apply([ops.ones(3), ops.ones(2)], [v, w])
    np.testing.assert_array_equal(v.numpy(), np.zeros(3, "float32"))
    np.testing.assert_array_equal(w.numpy(), np.ones(2, "float32"))
