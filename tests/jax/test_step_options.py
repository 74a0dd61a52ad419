"""One trace of the inner update; clip_by_global_norm=; the chain-order error; the stall guard; apply_gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale
import lossscale.jax as lsj


def counting(inner):
    """``inner`` with a counter of the Python calls (traces, under jit) of its ``update``."""
    calls = []

    def update(updates, state, params=None):
        calls.append(1)
        return inner.update(updates, state, params)

    return optax.GradientTransformation(inner.init, update), calls


@pytest.mark.parametrize("kwargs", [{}, {"clip_by_global_norm": 1.0, "max_consecutive_skips": 2}])
def test_inner_update_is_traced_once(kwargs):
    inner, calls = counting(optax.adam(0.1))
    opt = lsj.loss_scale_optimizer(inner, 8, **kwargs)
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    state = opt.init(params)
    jax.jit(opt.update).lower(params, state, params)
    assert len(calls) == 1
    jax.jit(lambda g, s, p: lsj.apply_gradients(opt, g, s, p)).lower(params, state, params)
    assert len(calls) == 2


# ------------------------------------------------------------ clipping


def global_norm(tree) -> float:
    """The global L2 norm of a pytree, in float64 with numpy (the reference; optax 0.2.2 has no ``optax.tree``)."""
    return float(np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(tree))))


@pytest.mark.parametrize("true_grad", [[0.3, 0.4], [3.0, 4.0], [30.0, -40.0]])
def test_clip_by_global_norm_clips_the_true_gradients_like_optax_inside(true_grad):
    params = {"w": jnp.zeros(2), "v": jnp.zeros((2, 2), jnp.float16)}
    grads = {"w": jnp.array(true_grad), "v": jnp.full((2, 2), 0.5, jnp.float16)}
    inside = lsj.loss_scale_optimizer(optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1.0)), 1024)
    option = lsj.loss_scale_optimizer(optax.sgd(1.0), 1024, clip_by_global_norm=1.0)
    scaled = jax.tree.map(lambda g: g * 1024, grads)
    want, _ = inside.update(scaled, inside.init(params), params)
    got, _ = jax.jit(option.update)(scaled, option.init(params), params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-3)
    assert global_norm(got) == pytest.approx(min(1.0, global_norm(grads)), rel=2e-3)


def test_clip_by_global_norm_still_skips_non_finite_steps():
    opt = lsj.loss_scale_optimizer(optax.adam(0.1), 1024, clip_by_global_norm=1.0)
    params = jnp.zeros(3)
    state = opt.init(params)
    for bad in (jnp.nan, jnp.inf):
        updates, new = opt.update(jnp.array([1.0, bad, 0.0]), state, params)
        assert updates.tolist() == [0, 0, 0] and int(new.skipped_steps) == 1
        assert int(new.inner_state[0].count) == 0


def test_clip_by_global_norm_is_validated():
    for bad in (0, -1.0, float("inf"), "1", True):
        with pytest.raises(ValueError, match="clip_by_global_norm must be a positive finite number"):
            lsj.loss_scale_optimizer(optax.sgd(1.0), clip_by_global_norm=bad)


@pytest.mark.parametrize("before", [optax.clip_by_global_norm(1.0), optax.clip(1.0), optax.zero_nans()])
def test_a_transform_chained_before_the_loss_scale_is_an_error(before):
    opt = optax.chain(before, lsj.loss_scale_optimizer(optax.adam(1e-3)))
    state = opt.init(jnp.zeros(2))
    match = r"before loss_scale_optimizer, so it sees the SCALED gradients.*clip_by_global_norm=1.0"
    with pytest.raises(ValueError, match=match):
        lsj.get_scaled_loss(jnp.float32(1.0), state)
    with pytest.raises(ValueError, match=match):
        lsj.value_and_grad(lambda w: jnp.sum(w), state)
    # After it, or inside it, is fine.
    ok = optax.chain(lsj.loss_scale_optimizer(optax.chain(before, optax.adam(1e-3))), optax.clip(1.0))
    assert float(lsj.get_scaled_loss(jnp.float32(1.0), ok.init(jnp.zeros(2)))) == 2.0**15


# ------------------------------------------------------------ stall guard


def test_stall_guard_raises_from_the_jitted_loop_on_the_nth_skip_in_a_row():
    opt = lsj.loss_scale_optimizer(optax.sgd(1.0), 64.0, max_consecutive_skips=3)
    step = jax.jit(opt.update)
    state = opt.init(jnp.zeros(2))
    good, bad = jnp.array([1.0, 2.0]), jnp.array([1.0, jnp.nan])
    for g in (bad, bad, good, bad, bad):  # two streaks of 2: below the limit
        _, state = step(g, state)
    assert int(state.consecutive_skips) == 2 and int(state.skipped_steps) == 4
    with pytest.raises(Exception, match="3 steps in a row were skipped") as info:
        _, state = step(bad, state)
        jax.block_until_ready(state)  # at the latest when the results are read
    assert "LossScaleError" in str(info.value)
    assert "max_consecutive_skips=3" in str(info.value) and "loss scale now 64" in str(info.value)


def test_stall_guard_runs_host_code_only_when_the_limit_is_reached(monkeypatch):
    from lossscale.jax import _diagnostics

    runs = []
    monkeypatch.setattr(_diagnostics, "_raise", lambda streak, scale, *, guard: runs.append((int(streak), float(scale))))
    opt = lsj.loss_scale_optimizer(optax.sgd(1.0), 64.0, max_consecutive_skips=2)
    step = jax.jit(opt.update)
    state = opt.init(jnp.zeros(2))
    good, bad = jnp.array([1.0, 2.0]), jnp.array([1.0, jnp.nan])
    for g in (good, good, bad, good, bad):  # finite steps and skips below the limit: no host code
        _, state = step(g, state)
    jax.effects_barrier()
    assert runs == []
    _, state = step(bad, state)
    jax.effects_barrier()
    assert runs == [(2, 64.0)]


def test_stall_guard_is_validated_with_the_torch_bindings_messages():
    with pytest.raises(ValueError, match=r"max_consecutive_skips must be at least 1 \(or None to disable\), got 0"):
        lsj.loss_scale_optimizer(optax.sgd(1.0), max_consecutive_skips=0)
    with pytest.raises(TypeError, match="max_consecutive_skips must be an int or None, got 2.5"):
        lsj.loss_scale_optimizer(optax.sgd(1.0), max_consecutive_skips=2.5)
    assert issubclass(lossscale.LossScaleError, RuntimeError)


# ------------------------------------------------------------ apply_gradients


def test_apply_gradients_equals_update_then_apply_updates():
    opt = lsj.loss_scale_optimizer(optax.adamw(0.1), lossscale.DynamicLossScale(8.0, 2))
    params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.zeros((), jnp.bfloat16)}
    a = b = (params, opt.init(params))

    @jax.jit
    def two_lines(p, s, g):
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s

    one_call = jax.jit(lambda p, s, g: lsj.apply_gradients(opt, g, s, p), donate_argnums=(0, 1))
    for poison in (1.0, jnp.inf, 1.0, 1.0, jnp.nan, 1.0):
        g = {"w": jnp.array([0.5, 1.0, -1.0]) * poison * a[1].loss_scale, "b": jnp.ones((), jnp.bfloat16)}
        a = two_lines(*a, g)
        b = one_call(*b, g)
        assert jax.tree.structure(a) == jax.tree.structure(b)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            assert x.dtype == y.dtype
            np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), rtol=1e-6)
    assert int(b[1].skipped_steps) == 2


def test_apply_gradients_with_any_other_transformation():
    params, opt = jnp.ones(2), optax.sgd(0.5)
    new, _ = lsj.apply_gradients(opt, jnp.array([2.0, 4.0]), opt.init(params), params)
    assert new.tolist() == [0.0, -1.0]
    with pytest.raises(TypeError, match="needs the parameters"):
        lsj.apply_gradients(opt, jnp.ones(2), opt.init(params), None)


def test_the_stall_guard_under_vmap_raises_only_for_a_member_that_stalls():
    """Under ``jax.vmap`` the guard's ``lax.cond`` runs as a select, so its callback runs on every step; it raises
    only for a member whose streak reached the limit (it raised on the first, finite step before)."""
    tx = lsj.loss_scale_optimizer(optax.sgd(0.1), "dynamic", max_consecutive_skips=3)
    params = jnp.ones((2, 2))
    state = jax.vmap(tx.init)(params)
    step = jax.jit(jax.vmap(tx.update))
    _, state = step(jnp.ones((2, 2)), state, params)  # all finite
    jax.effects_barrier()
    bad = jnp.array([[1.0, 1.0], [jnp.inf, 1.0]])  # member 1 overflows on every step
    for _ in range(2):
        _, state = step(bad, state, params)
        jax.effects_barrier()
    assert state.consecutive_skips.tolist() == [0, 2]
    with pytest.raises(Exception, match="3 steps in a row were skipped"):
        _, state = step(bad, state, params)
        jax.effects_barrier()
