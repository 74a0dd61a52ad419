"""Issue 23, defect 1: value_and_grad built once and reused across steps must use each step's scale.

On c0ad0d1 ``lsj.value_and_grad(fun, state)`` read the scale when it was built: built once outside a jitted step
it gave a 2x update after one backoff, and in float16 every step was skipped. Now the state is passed at call time
(``grad_fn(params, ..., opt_state=state)``), and the old misuse raises: a function built with a concrete state may
be called once, outside any trace, whatever replaced the state afterwards (an eager or a jitted update).
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale.jax as lsj


def loss_fn(w, x):
    return jnp.mean((x @ w - 1.0) ** 2)


X = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)
W = jnp.array([0.5, -1.0, 2.0])


def run(step, params, state, batches):
    scales = []
    for batch in batches:
        params, state = step(params, state, batch)
        scales.append(float(state.loss_scale))
    return params, state, scales


def test_built_once_jitted_loop_with_a_backoff_matches_plain_sgd():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=2.0**10)
    grad_fn = lsj.value_and_grad(loss_fn)  # once, outside the step

    @jax.jit
    def step(w, s, x):
        _, grads = grad_fn(w, x, opt_state=s)
        updates, s = opt.update(grads, s, w)
        return optax.apply_updates(w, updates), s

    bad = X.at[0, 0].set(jnp.inf)
    w, s, scales = run(step, W, opt.init(W), [X, bad, X, X])
    assert scales == [1024.0, 512.0, 512.0, 512.0]
    assert int(s.skipped_steps) == 1
    # three applied steps of plain SGD: the backoff did not turn the next update into 2x
    ref = W
    for _ in range(3):
        ref = ref - 0.1 * jax.grad(loss_fn)(ref, X)
    # The reference runs op by op; XLA may fuse the jitted update into a multiply-add (one rounding instead of
    # two), which moves a weight near 0 by an ulp of the weights' size: atol is one float32 ulp at 1.
    np.testing.assert_allclose(np.asarray(w), np.asarray(ref), rtol=1e-6, atol=1.2e-7)


def test_built_once_equals_built_inside_the_step():
    opt = lsj.loss_scale_optimizer(optax.adam(0.05), initial_scale=2.0**12, dynamic_growth_steps=2)
    grad_fn = lsj.value_and_grad(loss_fn)

    @jax.jit
    def outside(w, s, x):
        _loss, grads = grad_fn(w, x, opt_state=s)
        updates, s = opt.update(grads, s, w)
        return optax.apply_updates(w, updates), s

    @jax.jit
    def inside(w, s, x):
        _loss, grads = lsj.value_and_grad(loss_fn, s)(w, x)
        updates, s = opt.update(grads, s, w)
        return optax.apply_updates(w, updates), s

    batches = [X, X.at[2, 1].set(jnp.nan), X, X, X, X.at[0, 0].set(jnp.inf), X]
    a = run(outside, W, opt.init(W), batches)
    b = run(inside, W, opt.init(W), batches)
    assert a[2] == b[2] and a[2] == [4096.0, 2048.0, 2048.0, 4096.0, 4096.0, 2048.0, 2048.0]
    np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))


def test_float16_built_once_recovers_from_an_overflowing_initial_scale():
    # float16 loss: with 2**15 the scaled loss overflows; the scale must back off until steps go through.
    opt = lsj.loss_scale_optimizer(optax.sgd(0.01))  # default 2**15
    grad_fn = lsj.value_and_grad(lambda w, x: jnp.mean((x @ w) ** 2))

    @jax.jit
    def step(w, s, x):
        _, grads = grad_fn(w, x, opt_state=s)
        updates, s = opt.update(grads, s, w)
        return optax.apply_updates(w, updates), s

    w16 = W.astype(jnp.float16)
    x16 = X.astype(jnp.float16)
    w, s, scales = run(step, w16, opt.init(w16), [x16] * 20)
    skipped = int(s.skipped_steps)
    assert 1 <= skipped < 10, scales
    assert scales[-1] == scales[skipped - 1] == 2.0 ** (15 - skipped)  # backed off, then stayed
    assert not np.array_equal(np.asarray(w), np.asarray(w16))  # it trained


REUSE = r"called a second time.*\(1024\)\. .*called once, outside any trace.*opt_state=state\)"
IN_TRACE = r"called inside a traced function \(jit, pmap, scan, vmap\).*as a constant \(1024\)\. .*opt_state=state\)"


def test_the_old_misuse_is_loud_under_jit():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=2.0**10)
    state = opt.init(W)
    stale = lsj.value_and_grad(loss_fn, state)  # the habit: built once with the first state

    @jax.jit
    def step(w, s, x):
        _, grads = stale(w, x)
        return opt.update(grads, s, w)

    with pytest.raises(RuntimeError, match=IN_TRACE):
        step(W, state, X)


@pytest.mark.parametrize(
    "trace",
    [
        lambda f: jax.jit(lambda: f(W, X))(),  # every argument a constant: the scaled loss is still staged out
        lambda f: jax.lax.scan(lambda c, x: (c, f(W, x)[0]), 0.0, jnp.stack([X, X])),  # eager scan traces its body
        lambda f: jax.vmap(lambda x: f(W, x))(jnp.stack([X, X])),
    ],
    ids=["jit-constants", "scan", "vmap"],
)
def test_a_concrete_bound_state_in_a_trace_is_loud(trace):
    state = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=2.0**10).init(W)
    with pytest.raises(RuntimeError, match=IN_TRACE):
        trace(lsj.value_and_grad(loss_fn, state))


def test_a_concrete_bound_state_allows_exactly_one_call():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=2.0**10)
    state = opt.init(W)
    bound = lsj.value_and_grad(loss_fn, state)
    loss, grads = bound(W, X)
    assert float(loss) == float(loss_fn(W, X))
    np.testing.assert_allclose(np.asarray(grads), 1024 * np.asarray(jax.grad(loss_fn)(W, X)), rtol=1e-6)
    # a second call raises, even with the state still current and the same arguments
    with pytest.raises(RuntimeError, match=REUSE):
        bound(W, X)
    with pytest.raises(RuntimeError, match=REUSE):  # ... and stays refused
        bound(W, X)
    # passing a state at call time overrides the bound one and has no limit
    for _ in range(3):
        _, again = bound(W, X, opt_state=state)
        np.testing.assert_array_equal(np.asarray(again), np.asarray(grads))


def test_call_time_state_on_a_concrete_bound_function_does_not_use_up_its_one_call():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=2.0**10)
    state = opt.init(W)
    other = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=4.0).init(W)
    bound = lsj.value_and_grad(loss_fn, state)
    for _ in range(2):
        _, grads = bound(W, X, opt_state=other)  # overridden: scale 4
        np.testing.assert_allclose(np.asarray(grads), 4 * np.asarray(jax.grad(loss_fn)(W, X)), rtol=1e-6)
    _, grads = bound(W, X)  # the one call with the bound state is still there
    np.testing.assert_allclose(np.asarray(grads), 1024 * np.asarray(jax.grad(loss_fn)(W, X)), rtol=1e-6)
    with pytest.raises(RuntimeError, match=REUSE):
        bound(W, X)


def test_the_once_limit_holds_across_threads():
    state = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=2.0**10).init(W)
    bound = lsj.value_and_grad(loss_fn, state)
    barrier = threading.Barrier(4)
    outcomes = []

    def call():
        barrier.wait()
        try:
            bound(W, X)
            outcomes.append("ok")
        except RuntimeError:
            outcomes.append("refused")

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok", "refused", "refused", "refused"]


def test_the_old_misuse_is_loud_in_eager_code():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=2.0**10)
    state = opt.init(W)
    stale = lsj.value_and_grad(loss_fn, state)
    _, grads = stale(W, X)  # fine: the first call, with the state current
    _, state = opt.update(grads, state, W)
    with pytest.raises(RuntimeError, match=REUSE):
        stale(W, X)
    # ... and passing the new state at call time is the fix
    _, fresh = stale(W, X, opt_state=state)
    np.testing.assert_array_equal(np.asarray(fresh), np.asarray(grads))


def test_the_old_misuse_with_a_jitted_update_is_loud():
    # review1's gap: a jitted update() replaced the state where no eager code could record it, and the reused
    # function scaled by the old 1024 while update() unscaled by 512 (a silent 2x update).
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=2.0**10)
    state = opt.init(W)
    stale = lsj.value_and_grad(loss_fn, state)
    _, grads = stale(W, X)
    _, state = jax.jit(opt.update)(jax.tree_util.tree_map(lambda g: g * jnp.inf, grads), state, W)  # backs off
    assert float(state.loss_scale) == 2.0**9
    with pytest.raises(RuntimeError, match=REUSE):
        stale(W, X)
    _, fresh = stale(W, X, opt_state=state)
    np.testing.assert_allclose(np.asarray(fresh), 512 * np.asarray(jax.grad(loss_fn)(W, X)), rtol=1e-6)


def test_built_in_the_step_with_a_fixed_scale_is_not_called_stale():
    # A fixed scale's update passes the same scale array on to the new state: building inside the step with
    # the current state (the documented second form) must keep working after an eager update.
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), 1024)
    w, state = W, opt.init(W)
    for _ in range(3):
        _, grads = lsj.value_and_grad(loss_fn, state)(w, X)
        np.testing.assert_allclose(np.asarray(grads), 1024 * np.asarray(jax.grad(loss_fn)(w, X)), rtol=1e-6)
        updates, state = opt.update(grads, state, w)
        w = optax.apply_updates(w, updates)


@pytest.mark.parametrize("mode", ["eager", "disable_jit"])
def test_built_inside_the_step_without_jit_equals_the_call_time_form(mode):
    # The step body as written for jit, run eagerly (or under jax.disable_jit, where jax.jit runs it as Python):
    # the state is concrete, the function is rebuilt and called once per step, so each step reads its own scale.
    opt = lsj.loss_scale_optimizer(optax.adam(0.05), initial_scale=2.0**12, dynamic_growth_steps=2)
    grad_fn = lsj.value_and_grad(loss_fn)

    def inside(w, s, x):
        _loss, grads = lsj.value_and_grad(loss_fn, s)(w, x)
        updates, s = opt.update(grads, s, w)
        return optax.apply_updates(w, updates), s

    @jax.jit
    def call_time(w, s, x):
        _loss, grads = grad_fn(w, x, opt_state=s)
        updates, s = opt.update(grads, s, w)
        return optax.apply_updates(w, updates), s

    batches = [X, X.at[2, 1].set(jnp.nan), X, X, X, X.at[0, 0].set(jnp.inf), X]
    if mode == "eager":
        a = run(inside, W, opt.init(W), batches)
    else:
        with jax.disable_jit():
            a = run(jax.jit(inside), W, opt.init(W), batches)
    b = run(call_time, W, opt.init(W), batches)
    assert a[2] == b[2] == [4096.0, 2048.0, 2048.0, 4096.0, 4096.0, 2048.0, 2048.0]
    assert int(a[1].skipped_steps) == int(b[1].skipped_steps) == 2
    np.testing.assert_allclose(np.asarray(a[0]), np.asarray(b[0]), rtol=1e-6)


def test_no_state_at_all_names_the_fix():
    with pytest.raises(TypeError, match=r"opt_state=state"):
        lsj.value_and_grad(loss_fn)(W, X)


def test_call_time_form_under_scan_with_argnums_and_aux():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=8.0)
    grad_fn = lsj.value_and_grad(lambda x, w: (loss_fn(w, x), x.sum()), argnums=1, has_aux=True)

    def body(carry, x):
        w, s = carry
        (loss, _aux), grads = grad_fn(x, w, opt_state=s)
        updates, s = opt.update(grads, s, w)
        return (optax.apply_updates(w, updates), s), loss

    xs = jnp.stack([X, X.at[1, 1].set(jnp.inf), X])
    (w, s), _losses = jax.jit(lambda w, s: jax.lax.scan(body, (w, s), xs))(W, opt.init(W))
    assert float(s.loss_scale) == 4.0 and int(s.skipped_steps) == 1
    ref = W
    for _ in range(2):
        ref = ref - 0.1 * jax.grad(loss_fn)(ref, X)
    # The reference runs op by op; XLA may fuse the jitted update into a multiply-add (one rounding instead of
    # two), which moves a weight near 0 by an ulp of the weights' size: atol is one float32 ulp at 1.
    np.testing.assert_allclose(np.asarray(w), np.asarray(ref), rtol=1e-6, atol=1.2e-7)
