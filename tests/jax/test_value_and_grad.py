"""value_and_grad: true loss, scaled gradients, wherever the scale sits; jit, has_aux, argnums, pmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale.jax as lsj


def loss_fn(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


X = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)
Y = jnp.arange(8.0)
W = jnp.array([0.5, -1.0, 2.0])


def test_true_loss_and_gradients_of_the_scaled_loss():
    state = lsj.loss_scale_optimizer(optax.sgd(0.1), 1024).init(W)
    loss, grads = jax.jit(lambda w, s: lsj.value_and_grad(loss_fn, s)(w, X, Y))(W, state)
    ref_loss, ref_grads = jax.value_and_grad(loss_fn)(W, X, Y)
    assert float(loss) == float(ref_loss)
    np.testing.assert_allclose(np.asarray(grads), 1024 * np.asarray(ref_grads), rtol=1e-6)
    # ... which update() unscales back to the true gradients
    updates, _ = lsj.loss_scale_optimizer(optax.sgd(1.0), 1024).update(grads, state)
    np.testing.assert_allclose(np.asarray(updates), -np.asarray(ref_grads), rtol=1e-6)


def test_has_aux_and_argnums():
    state = optax.chain(lsj.loss_scale_optimizer(optax.adam(0.1), 8.0)).init(W)  # found inside a chain

    def fun(x, w, y):
        return loss_fn(w, x, y), {"pred": x @ w}

    (loss, aux), grads = lsj.value_and_grad(fun, state, argnums=(1, 2), has_aux=True)(X, W, Y)
    (ref_loss, ref_aux), ref_grads = jax.value_and_grad(fun, argnums=(1, 2), has_aux=True)(X, W, Y)
    assert float(loss) == float(ref_loss)
    np.testing.assert_array_equal(np.asarray(aux["pred"]), np.asarray(ref_aux["pred"]))
    assert isinstance(grads, tuple) and len(grads) == 2
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(np.asarray(g), 8 * np.asarray(r), rtol=1e-6)


def test_float16_loss_keeps_its_dtype_and_scaling_saves_small_gradients():
    state = lsj.loss_scale_optimizer(optax.sgd(1.0), 2.0**12).init(jnp.zeros(2, jnp.float16))

    def tiny(w):  # a float16 parameter with gradient 1e-8: below float16's smallest subnormal (6e-8)
        return jnp.sum(w.astype(jnp.float32) * 1e-8).astype(jnp.float16)

    loss, grads = lsj.value_and_grad(tiny, state)(jnp.ones(2, jnp.float16))
    assert loss.dtype == jnp.float16
    assert not np.any(np.asarray(jax.grad(tiny)(jnp.ones(2, jnp.float16))))  # unscaled: flushed to zero
    np.testing.assert_allclose(np.asarray(grads, np.float64), 1e-8 * 2**12, rtol=1e-2)


def test_a_training_loop_with_the_helper_equals_the_manual_form():
    opt = lsj.loss_scale_optimizer(optax.adam(0.05), 2.0**10)

    @jax.jit
    def helper_step(w, s):
        loss, grads = lsj.value_and_grad(loss_fn, s)(w, X, Y)
        updates, s = opt.update(grads, s, w)
        return optax.apply_updates(w, updates), s, loss

    @jax.jit
    def manual_step(w, s):
        loss = loss_fn(w, X, Y)
        grads = jax.grad(lambda v: lsj.get_scaled_loss(loss_fn(v, X, Y), s))(w)
        updates, s = opt.update(grads, s, w)
        return optax.apply_updates(w, updates), s, loss

    a = b = (W, opt.init(W))
    for _ in range(5):
        *a, la = helper_step(*a)
        *b, lb = manual_step(*b)
        assert float(la) == float(lb)
    np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))


def test_under_pmap_with_axis_name():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), 4.0, axis_name="d")

    def step(w, s, x, y):
        loss, grads = lsj.value_and_grad(loss_fn, s)(w, x, y)
        grads = jax.lax.pmean(grads, "d")
        updates, s = opt.update(grads, s, w)
        return optax.apply_updates(w, updates), s, jax.lax.pmean(loss, "d")

    n = jax.local_device_count()
    ws = jnp.broadcast_to(W, (n, 3))
    states = jax.pmap(opt.init)(ws)
    new_w, states, loss = jax.pmap(step, axis_name="d")(ws, states, X[None].repeat(n, 0), Y[None].repeat(n, 0))
    ref = W - 0.1 * jax.grad(loss_fn)(W, X, Y)
    np.testing.assert_allclose(np.asarray(new_w[0]), np.asarray(ref), rtol=1e-6)
    assert float(loss[0]) == pytest.approx(float(loss_fn(W, X, Y)), rel=1e-6)


def test_errors_name_the_fix():
    state = lsj.loss_scale_optimizer(optax.sgd(0.1)).init(W)
    with pytest.raises(TypeError, match="needs the state of a lossscale.jax.loss_scale_optimizer"):
        lsj.value_and_grad(loss_fn, optax.sgd(0.1).init(W))
    with pytest.raises(TypeError, match=r"0-d floating-point array.*pass has_aux=True"):
        lsj.value_and_grad(lambda w: (loss_fn(w, X, Y), 1), state)(W)
    with pytest.raises(TypeError, match=r"has_aux=True the loss function must return a pair"):
        lsj.value_and_grad(lambda w: loss_fn(w, X, Y), state, has_aux=True)(W)
    with pytest.raises(TypeError, match="0-d floating-point array, got .* of dtype int32 and shape ()"):
        lsj.value_and_grad(lambda w: jnp.int32(1), state)(W)


def test_a_loss_keyword_named_scale_reaches_the_loss():
    """``value_and_grad`` takes the loss function's own keywords, ``scale`` among them (it collided with the
    wrapper's scale argument: TypeError, multiple values for argument 'scale')."""
    def loss(p, x, scale=1.0):
        return jnp.sum(p * x) * scale

    state = lsj.loss_scale_optimizer(optax.sgd(0.1), 4.0).init(jnp.ones(2))
    value, grads = lsj.value_and_grad(loss)(jnp.ones(2), jnp.array([1.0, 3.0]), scale=2.0, opt_state=state)
    assert float(value) == 8.0
    np.testing.assert_array_equal(np.asarray(grads), [8.0, 24.0])  # d(4 * 2 * p.x)/dp
