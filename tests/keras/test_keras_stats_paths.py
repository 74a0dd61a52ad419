"""Issue 28: ``stats_every`` and ``loss_scale="auto"`` through every Keras entry point and on every kind of gradient,
per backend (KERAS_BACKEND).

Every sample is compared with the numpy core's (:func:`lossscale._stats.gradient_stats`) on the same scaled
gradients, known in advance: a ``Dense(1)`` at zero weights, one row ``x`` and ``y = -1`` give the MSE gradients
``2 S x`` (kernel) and ``2 S`` (bias); powers of two keep them exact in float32, float16 and bfloat16. The scale
and the auto state are compared with the core's sampler (:func:`lossscale._advance.advance`) on the
reference sample. tf.distribute and keras.distribution: tests/keras/distributed.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import ops

import lossscale
import lossscale.keras as lsk
from lossscale._advance import advance
from lossscale._sampler import initial_sampler_state
from lossscale._stats import gradient_stats

BACKEND = keras.backend.backend()
S = 16.0
X = np.array([[0.0, 1.0, 2.0**-20, -4.0]], np.float32)  # 2 S x: one zero, one float16 subnormal (2**-15)
Y = np.array([[-1.0]], np.float32)
KEYS = ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms_min")
TENSOR_KEYS = ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms")


def known_grads():
    return [np.float32(2 * S) * X.reshape(4, 1), np.full(1, 2 * S, np.float32)]


def make_policy(kind):
    return lossscale.AutoLossScale(S) if kind == "auto" else lossscale.DynamicLossScale(S)


def make_optimizer(kind, inner=None):
    inner = keras.optimizers.SGD(0.0) if inner is None else inner
    # auto samples every 2nd apply (the first through the cond), dynamic every apply
    return lsk.LossScaleOptimizer(inner, make_policy(kind), stats_every=2 if kind == "auto" else 1)


def make_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="zeros")])


def host(value):
    return np.asarray(ops.convert_to_numpy(value))


def assert_sample(opt, ref):
    got = opt.gradient_stats
    assert int(host(got["step"])) == int(ref.step)
    for key in KEYS:
        np.testing.assert_allclose(host(got[key]), np.asarray(getattr(ref, key)), rtol=1e-6, err_msg=key)
    for key in TENSOR_KEYS:
        np.testing.assert_allclose(host(got["per_tensor"][key]), np.asarray(getattr(ref, "tensor_" + key)),
                                   rtol=1e-6, err_msg=key)


def assert_rule(opt, policy, samples):
    """The scale and the auto state equal the core sampler's after ``samples`` (one (sample, finite) per apply)."""
    state, sampler = lossscale.initial_state(policy, np), initial_sampler_state(policy, len(samples[0][0].tensor_amax), np)
    every = opt.stats_every
    for i, (sample, finite) in enumerate(samples):
        with np.errstate(all="ignore"):
            state, sampler = advance(policy, state, finite, np, sampler=sampler, sample=sample, sampled=i % every == 0)
    assert float(host(opt.loss_scale)) == float(state.loss_scale)
    assert int(host(opt._scale_variables.stats.count)) == len(samples)
    for variable, value in zip(opt._scale_variables.stats.auto, sampler.auto or ()):
        np.testing.assert_allclose(host(variable), value, rtol=1e-6, err_msg=variable.name)
    return state, sampler


# ------------------------------------------------------------------ entry points (item 2)


def seeds_loop_step(model, opt):
    """get_scaled_loss -> the backend's gradient -> get_unscaled_gradients -> apply_gradients (seeds 001/002)."""
    ws = model.trainable_variables
    x, y = ops.convert_to_tensor(X), ops.convert_to_tensor(Y)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                scaled = opt.get_scaled_loss(ops.mean(ops.square(ops.cast(model(x), "float32") - y)))
            opt.apply_gradients(zip(opt.get_unscaled_gradients(tape.gradient(scaled, ws)), ws))

        step()
    elif BACKEND == "jax":
        import jax

        def scaled_loss(values):
            out, _ = model.stateless_call(values, [v.value for v in model.non_trainable_variables], x)
            return opt.get_scaled_loss(ops.mean(ops.square(ops.cast(out, "float32") - y)))

        grads = jax.grad(scaled_loss)([v.value for v in ws])
        opt.apply_gradients(zip(opt.get_unscaled_gradients(grads), ws))
    else:
        opt.get_scaled_loss(ops.mean(ops.square(ops.cast(model(x), "float32") - y))).backward()
        grads = [v.value.grad for v in ws]
        opt.apply_gradients(zip(opt.get_unscaled_gradients(grads), ws))


def one_step(entry, model, opt):
    ws = model.trainable_variables
    if entry == "fit":
        model.compile(optimizer=opt, loss="mse")
        model.fit(X, Y, batch_size=1, epochs=1, verbose=0, shuffle=False)
    elif entry == "apply":
        opt.apply([ops.convert_to_tensor(g) for g in known_grads()], ws)
    elif entry == "apply_gradients":
        opt.apply_gradients(zip([ops.convert_to_tensor(g) for g in known_grads()], ws))
    else:
        opt.build(ws)
        seeds_loop_step(model, opt)


@pytest.mark.parametrize("kind", ["dynamic", "auto"])
@pytest.mark.parametrize("entry", ["fit", "apply", "apply_gradients", "seeds_loop"])
def test_every_entry_point_measures_the_scaled_gradients(entry, kind):
    model, opt = make_model(), make_optimizer(kind)
    one_step(entry, model, opt)
    ref = gradient_stats(known_grads(), np)
    assert float(ref.zero_fraction) == float(ref.subnormal_fraction) == np.float32(0.2)  # the reference is not trivial
    assert_sample(opt, ref)
    assert_rule(opt, make_policy(kind), [(ref, True)])
    assert int(host(opt.iterations)) == 1


# ------------------------------------------------------------------ inputs (item 3)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_inf_has_minus_inf_headroom_and_nan_nan(bad):
    model, opt = make_model(), make_optimizer("auto")
    grads = known_grads()
    grads[0][1, 0] = bad
    opt.apply([ops.convert_to_tensor(g) for g in grads], model.trainable_variables)
    got = opt.gradient_stats
    expected = -np.inf if np.isinf(bad) else np.nan
    np.testing.assert_array_equal(host(got["headroom_bits"]), expected)
    np.testing.assert_array_equal(host(got["per_tensor"]["headroom_bits"])[0], expected)  # the other: finite
    with np.errstate(all="ignore"):
        assert_sample(opt, gradient_stats(grads, np))
        assert_rule(opt, make_policy("auto"), [(gradient_stats(grads, np), False)])
    assert int(host(opt.skipped_steps)) == 1


@pytest.fixture(params=["mixed_float16", "mixed_bfloat16"])
def mixed(request):
    keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("entry", ["fit", "seeds_loop"])
def test_float32_gradients_of_a_mixed_precision_model(mixed, entry):
    """The float16 (bfloat16) backward's values, exact for these inputs, reach the float32 variables' gradients."""
    model, opt = make_model(), make_optimizer("dynamic")
    assert model.layers[0].compute_dtype == mixed.split("_")[1] and model.layers[0].kernel.dtype == "float32"
    one_step(entry, model, opt)
    assert_sample(opt, gradient_stats(known_grads(), np))


def test_bfloat16_gradients():
    ws = [keras.Variable(np.zeros((4, 1)), dtype="bfloat16"), keras.Variable(np.zeros(1), dtype="bfloat16")]
    opt = make_optimizer("dynamic")
    opt.apply([ops.convert_to_tensor(g, "bfloat16") for g in known_grads()], ws)
    assert_sample(opt, gradient_stats(known_grads(), np))


@pytest.mark.filterwarnings("ignore:Gradients do not exist for variables")
def test_none_and_empty_gradients_are_empty_tensors():
    """A variable without a gradient (None) and a size-0 variable count as empty tensors: no entries, amax 0."""
    ws = [keras.Variable(np.zeros((4, 1), np.float32)), keras.Variable(np.zeros(1, np.float32)),
          keras.Variable(np.zeros((0,), np.float32))]
    opt = make_optimizer("auto")
    opt.build(ws)
    grads = known_grads()
    opt.apply([ops.convert_to_tensor(grads[0]), None, ops.zeros((0,), "float32")], ws)
    ref = gradient_stats([grads[0], np.zeros(0, np.float32), np.zeros(0, np.float32)], np)
    assert_sample(opt, ref)
    assert host(opt.gradient_stats["per_tensor"]["headroom_bits"]).tolist()[1:] == [np.inf, np.inf]
    assert_rule(opt, make_policy("auto"), [(ref, True)])


# ------------------------------------------------------------------ accumulation (item 4)


def test_inner_gradient_accumulation_samples_each_micro_batch():
    """With the inner optimizer's gradient_accumulation_steps=K each apply passes ONE micro-batch's scaled
    gradients (the inner optimizer sums them after the check): each sample is that micro-batch's float16
    backward, and the auto rule reads it with micro_batches=1, not K."""
    inner = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
    policy = lossscale.AutoLossScale(1.0)
    opt = lsk.LossScaleOptimizer(inner, policy, stats_every=1)
    model = make_model()
    ws = model.trainable_variables
    rng = np.random.default_rng(0)
    samples = []
    for i in range(4):
        true = [(rng.normal(size=(4, 1)) * 2.0**-12).astype(np.float32), np.full(1, 2.0**-12, np.float32)]
        scaled = [g * np.float32(host(opt.loss_scale)) for g in true]
        opt.apply([ops.convert_to_tensor(g) for g in scaled], ws)
        samples.append((gradient_stats(scaled, np, step=i), True))
        assert_sample(opt, samples[-1][0])
    assert int(host(inner.iterations)) == 2  # four micro-batches applied: two updates
    state, _ = assert_rule(opt, policy, samples)
    twice = lossscale.initial_state(policy, np), initial_sampler_state(policy, 2, np)
    for sample, finite in samples:
        twice = advance(policy, twice[0], finite, np, sampler=twice[1], sample=sample, sampled=True, micro_batches=2)
    assert float(twice[0].loss_scale) != float(state.loss_scale)  # the test tells micro_batches 1 from 2
