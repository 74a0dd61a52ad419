"""The JAX skip as compiled: exact with donated buffers, one read of the gradients beyond plain optax, no copies.

The step chooses each output of the inner update between its new and its old
value as the value is computed (``lossscale.jax._step._chosen``), and
checks the gradients with one float32 sum (``lossscale.jax.all_finite``).
These tests hold both to their promises: a skipped step leaves the donated
parameters and optimizer state bit for bit as they were, a finite one gives
plain optax's numbers, the check is exact on values whose sum overflows, and
the compiled program (XLA's own HLO) moves no more than plain optax plus one
read of the gradients, with no copy of the state, donated or not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale
import lossscale.jax as lsj
from benchmarks.xla_passes import passes

POISONS = [("w", 0, np.nan), ("w", 5, np.inf), ("b", 1, -np.inf)]


def _params():
    return {"w": jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4) / 7, "b": jnp.array([0.5, -0.0, 2.0], jnp.float32)}


def _grads(step: int, scale: float, poison=None):
    rng = np.random.default_rng(step)
    grads = {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=3).astype(np.float32)}
    grads = {k: v * np.float32(scale) for k, v in grads.items()}
    if poison is not None:
        name, index, value = poison
        grads[name].reshape(-1)[index] = value
    return {k: jnp.asarray(v) for k, v in grads.items()}


def _host(tree):
    return [np.array(x) for x in jax.tree_util.tree_leaves(tree)]


def _assert_bitwise(a, b):
    for x, y in zip(_host(a), _host(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8))


@pytest.mark.parametrize("form", ["update", "apply_gradients"])
def test_donated_steps_skip_bit_exactly_and_match_plain_optax_when_finite(form):
    inner = optax.adam(0.1)
    opt = lsj.loss_scale_optimizer(inner, lossscale.DynamicLossScale(2.0**10, 2))

    def step(params, state, grads):
        if form == "update":
            updates, state = opt.update(grads, state, params)
            return optax.apply_updates(params, updates), state
        return lsj.apply_gradients(opt, grads, state, params)

    donated = jax.jit(step, donate_argnums=(0, 1))
    params = _params()
    state = opt.init(params)
    plain_params, plain_state = _params(), inner.init(_params())
    plan = [None, POISONS[0], None, None, POISONS[1], POISONS[2], None]
    for i, poison in enumerate(plan):
        scale = float(state.loss_scale)
        before = (_host(params), _host(state.inner_state))
        params, state = donated(params, state, _grads(i, scale, poison))
        if poison is not None:
            assert bool(state.last_step_skipped)
            _assert_bitwise(before, (_host(params), _host(state.inner_state)))
        else:
            true = {k: g / scale for k, g in _grads(i, scale).items()}  # powers of two: exact
            updates, plain_state = inner.update(true, plain_state, plain_params)
            plain_params = optax.apply_updates(plain_params, updates)
            for x, y in zip(_host((params, state.inner_state)), _host((plain_params, plain_state)), strict=True):
                np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-9)  # XLA may fuse into FMAs: 1 ulp
    assert int(state.skipped_steps) == 3
    assert float(state.loss_scale) == 2.0**8  # halved at each of the three skips, doubled once after 2 clean steps


def test_the_update_form_returns_zero_updates_on_a_skip():
    opt = lsj.loss_scale_optimizer(optax.sgd(1.0), 4.0)
    params = _params()
    updates, state = jax.jit(opt.update)(_grads(0, 4.0, POISONS[0]), opt.init(params), params)
    for leaf in jax.tree_util.tree_leaves(updates):
        np.testing.assert_array_equal(np.asarray(leaf), 0.0)
    assert bool(state.last_step_skipped)


@pytest.mark.parametrize("jit", [False, True])
def test_all_finite_is_exact_where_the_sum_is_not(jit):
    check = jax.jit(lsj.all_finite) if jit else lsj.all_finite
    big = jnp.float32(3e38)
    assert bool(check([jnp.full(4, big), jnp.full(3, big)]))  # the sum overflows; every value is finite
    assert bool(check([jnp.array([big, -big, big])]))
    assert not bool(check([jnp.full(4, big), jnp.array([1.0, jnp.inf])]))
    assert not bool(check([jnp.array([jnp.inf, -jnp.inf]), jnp.ones(2)]))  # the sum is NaN
    assert not bool(check([jnp.array([0.0, jnp.nan])]))
    assert bool(check([jnp.full(8, 6e4, jnp.float16), jnp.zeros((0,), jnp.float16), jnp.zeros((0, 3))]))
    assert not bool(check([jnp.array([1.0, jnp.inf], jnp.bfloat16), jnp.ones(3)]))
    assert not bool(check({"a": jnp.ones(3), "h": jnp.array([jnp.nan], jnp.float16)}))


def test_an_inner_state_that_changes_shape_is_refused():
    def init(params):
        return {"n": jnp.zeros(())}

    def update(updates, state, params=None):
        return updates, {"n": state["n"] + 1, "extra": jnp.zeros(())}

    opt = lsj.loss_scale_optimizer(optax.GradientTransformation(init, update), 2.0)
    params = _params()
    with pytest.raises(TypeError, match="returned a state whose structure differs"):
        opt.update(_grads(0, 2.0), opt.init(params), params)

    def grows(updates, state, params=None):
        return updates, {"n": state["n"] + jnp.arange(3.0)}

    opt = lsj.loss_scale_optimizer(optax.GradientTransformation(init, grows), 2.0)
    with pytest.raises(TypeError, match=r"returned a state leaf of shape \(3,\) for one of shape \(\)"):
        opt.update(_grads(0, 2.0), opt.init(params), params)


def test_complex_gradients_whose_magnitude_overflows_are_finite():
    big = jnp.array([3e38 + 3e38j, 1.0], jnp.complex64)
    assert bool(lsj.all_finite([big, jnp.ones(2)]))
    assert not bool(lsj.all_finite([big.at[1].set(jnp.nan), jnp.ones(2)]))
    assert not bool(jax.jit(lsj.all_finite)([jnp.array([complex(1.0, float("inf"))], jnp.complex64)]))


def _step_passes(step, init, donate: bool, n: int):
    width = int((n / 2) ** 0.5)
    params = {"w1": jnp.ones((width, width)), "w2": jnp.ones((width, width))}
    x = jnp.ones((8, width))

    def loss(p, x):
        return jnp.sum(jnp.tanh(x @ p["w1"]) @ p["w2"])

    def train(p, s, x):
        return step(loss, p, s, x)

    fn = jax.jit(train, donate_argnums=(0, 1) if donate else ())
    return passes(fn.lower(params, init(params), x).compile().as_text(), 2 * width * width)


@pytest.mark.parametrize("donate", [False, True])
def test_the_compiled_step_reads_the_gradients_once_more_than_plain_optax_and_copies_nothing(donate):
    adam = optax.adam(1e-3)
    opt = lsj.loss_scale_optimizer(adam)

    def plain(loss, p, s, x):
        updates, s = adam.update(jax.grad(loss)(p, x), s, p)
        return optax.apply_updates(p, updates), s

    def scaled(loss, p, s, x):
        _, grads = lsj.value_and_grad(loss, s)(p, x)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    def applied(loss, p, s, x):
        _, grads = lsj.value_and_grad(loss, s)(p, x)
        return lsj.apply_gradients(opt, grads, s, p)

    n = 2 * 400 * 400
    base = _step_passes(plain, adam.init, donate, n)
    for step in (scaled, applied):
        ours = _step_passes(step, opt.init, donate, n)
        assert ours.copies == 0
        # One read of the gradients for the check; plain optax's own copies (if any) are gone.
        assert ours.total <= base.total + 1.1, (ours, base)
        # The only branch is the exact check, run when the gradients' sum is not finite: one read.
        assert [round(b.taken, 1) for b in ours.branches] in ([1.0], [1.5], [0.0, 1.0], [0.0, 1.5], [1.0, 0.0], [1.5, 0.0])


def test_finite_and_skipped_steps_share_one_compile_and_move_nothing_to_the_host():
    opt = lsj.loss_scale_optimizer(optax.adam(1e-3), lossscale.DynamicLossScale(4.0, 2))
    traces = []

    def step(params, state, grads):
        traces.append(1)
        return lsj.apply_gradients(opt, grads, state, params)

    step = jax.jit(step, donate_argnums=(0, 1))
    params = jax.device_put(_params())
    state = opt.init(params)
    plan = [jax.device_put(_grads(i, 1.0, poison)) for i, poison in enumerate([None, POISONS[0], None, POISONS[2]])]
    with jax.transfer_guard("disallow"):
        for grads in plan:
            params, state = step(params, state, grads)
    assert len(traces) == 1
    assert int(state.skipped_steps) == 2
