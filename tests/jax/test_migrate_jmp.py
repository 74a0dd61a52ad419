"""Migrating from jmp's loss scale and from ``optax.apply_if_finite`` (docs/migration/jmp.md, "What carries over"
and "What differs"): train with the peer, save with flax (``to_bytes``), switch to ``loss_scale_optimizer``, move
the saved pieces into its state, train on, and compare with a run that never stopped."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale.jax as lsj

jmp = pytest.importorskip("jmp", reason="the jmp migration needs jmp (in the dev extra)")
serialization = pytest.importorskip("flax.serialization", reason="saving needs flax (in the dev extra)")

STEPS, SAVE_AT, INF_AT = 10, 5, (3, 7)
PERIOD, LR = 2, 1e-2


def _params():
    w = jax.random.normal(jax.random.PRNGKey(0), (8, 1))
    return {"b": jnp.zeros((1,)), "w": w}


def _batch(i):
    k1, k2 = jax.random.split(jax.random.PRNGKey(100 + i))
    return jax.random.normal(k1, (32, 8)), jax.random.normal(k2, (32, 1))


def _loss(params, x, y, poison):
    pred = x @ params["w"] + params["b"]
    return jnp.mean((pred - y) ** 2) * poison  # poison = inf at INF_AT: an overflowing step


def _poison(i):
    return jnp.float32(jnp.inf if i in INF_AT else 1.0)


#: The peer's jitted step and lossscale's fuse differently (XLA), which moves a weight or a moment by an ulp or two;
#: the scale, the counters and every skip decision are exact.
ULPS = 1e-6


def _same(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=ULPS, atol=1e-9)


# ----------------------------------------------------------------------------- jmp


@jax.jit
def _jmp_step(params, opt_state, loss_scale, x, y, poison):
    opt = optax.adam(LR)
    grads = jax.grad(lambda p: loss_scale.scale(_loss(p, x, y, poison)))(params)
    grads = loss_scale.unscale(grads)
    finite = jmp.all_finite(grads)
    loss_scale = loss_scale.adjust(finite)
    updates, new_state = opt.update(grads, opt_state, params)
    params, opt_state = jmp.select_tree(finite, (optax.apply_updates(params, updates), new_state), (params, opt_state))
    return params, opt_state, loss_scale


def _jmp_run(steps, params=None, opt_state=None, loss_scale=None):
    params = _params() if params is None else params
    opt_state = optax.adam(LR).init(params) if opt_state is None else opt_state
    loss_scale = jmp.DynamicLossScale(jnp.float32(2.0**10), period=PERIOD) if loss_scale is None else loss_scale
    scales = []
    for i in steps:
        params, opt_state, loss_scale = _jmp_step(params, opt_state, loss_scale, *_batch(i), _poison(i))
        scales.append(float(loss_scale.loss_scale))
    return params, opt_state, loss_scale, scales


@functools.cache
def _lossscale_step(tx):
    @jax.jit
    def step(params, state, x, y, poison):
        grads = jax.grad(lambda p: lsj.get_scaled_loss(_loss(p, x, y, poison), state))(params)
        return lsj.apply_gradients(tx, grads, state, params)

    return step


def _lossscale_run(tx, params, state, steps):
    scales = []
    for i in steps:
        params, state = _lossscale_step(tx)(params, state, *_batch(i), _poison(i))
        scales.append(float(state.loss_scale))
    return params, state, scales


def test_switching_from_jmp_mid_run_matches_the_uninterrupted_run():
    """Carries over: the weights, the inner optimizer's state, the scale and jmp's counter (as ``good_steps``)."""
    ref_params, ref_opt_state, ref_scale, ref_scales = _jmp_run(range(STEPS))
    params, opt_state, loss_scale, _ = _jmp_run(range(SAVE_AT))
    blob = serialization.to_bytes({"params": params, "opt_state": opt_state,
                                   "loss_scale": {"loss_scale": loss_scale.loss_scale, "counter": loss_scale.counter}})

    # the switch: the same policy in lossscale's names, the saved pieces moved into its state
    tx = lsj.loss_scale_optimizer(optax.adam(LR), initial_scale=2.0**10, dynamic_growth_steps=PERIOD)
    target = {"params": _params(), "opt_state": optax.adam(LR).init(_params()),
              "loss_scale": {"loss_scale": jnp.float32(0), "counter": jnp.int32(0)}}
    saved = serialization.from_bytes(target, blob)
    state = tx.init(saved["params"])
    state = state._replace(
        inner_state=saved["opt_state"],
        loss_scale_state=state.loss_scale_state._replace(
            loss_scale=jnp.float32(saved["loss_scale"]["loss_scale"]),
            good_steps=jnp.int32(saved["loss_scale"]["counter"]),
        ),
    )
    lsj.check_state(state, tx_policy := lsj.DynamicLossScale(2.0**10, PERIOD))
    assert tx_policy.min_loss_scale == 1.0  # jmp's floor too
    params, state, scales = _lossscale_run(tx, saved["params"], state, range(SAVE_AT, STEPS))
    assert scales == ref_scales[SAVE_AT:]
    assert float(state.loss_scale) == float(ref_scale.loss_scale)
    assert int(state.loss_scale_state.good_steps) == int(ref_scale.counter)
    _same(params, ref_params)
    _same(state.inner_state, ref_opt_state)
    assert int(state.skipped_steps) == 1  # differs: jmp counts no skips; lossscale counts from the switch (step 7)


# ----------------------------------------------------------------------------- optax.apply_if_finite


@functools.cache
def _apply_if_finite():
    return optax.apply_if_finite(optax.adam(LR), max_consecutive_errors=5)


@jax.jit
def _optax_step(params, opt_state, x, y, poison):
    grads = jax.grad(lambda p: _loss(p, x, y, poison))(params)
    updates, opt_state = _apply_if_finite().update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _optax_run(steps, params=None, opt_state=None):
    params = _params() if params is None else params
    opt_state = _apply_if_finite().init(params) if opt_state is None else opt_state
    for i in steps:
        params, opt_state = _optax_step(params, opt_state, *_batch(i), _poison(i))
    return params, opt_state


def test_switching_from_apply_if_finite_mid_run_matches_the_uninterrupted_run():
    """Carries over: the weights, the inner state, ``total_notfinite`` as ``skipped_steps`` and ``notfinite_count``
    as ``consecutive_skips``; ``loss_scale=1`` is apply_if_finite's skip without scaling."""
    ref_params, ref_state = _optax_run(range(STEPS))
    params, opt_state = _optax_run(range(SAVE_AT))
    blob = serialization.to_bytes({"params": params, "opt_state": opt_state})

    tx = lsj.loss_scale_optimizer(optax.adam(LR), 1)
    saved = serialization.from_bytes({"params": _params(), "opt_state": _apply_if_finite().init(_params())}, blob)
    peer = saved["opt_state"]
    state = tx.init(saved["params"])
    state = state._replace(
        inner_state=peer.inner_state,
        loss_scale_state=state.loss_scale_state._replace(
            skipped_steps=jnp.int32(peer.total_notfinite), consecutive_skips=jnp.int32(peer.notfinite_count)
        ),
    )
    assert int(state.skipped_steps) == 1
    params, state, scales = _lossscale_run(tx, saved["params"], state, range(SAVE_AT, STEPS))
    assert scales == [1.0] * (STEPS - SAVE_AT)
    _same(params, ref_params)
    _same(state.inner_state, ref_state.inner_state)
    assert int(state.skipped_steps) == int(ref_state.total_notfinite) == 2
    assert int(state.consecutive_skips) == int(ref_state.notfinite_count) == 0


def test_apply_if_finite_gives_up_where_lossscale_raises():
    """Differs: after ``max_consecutive_errors`` skips in a row apply_if_finite applies the non-finite update;
    ``max_consecutive_skips`` raises instead (and no NaN reaches the weights)."""
    params = _params()
    bad = jax.tree_util.tree_map(lambda p: jnp.full_like(p, jnp.nan), params)
    peer = optax.apply_if_finite(optax.sgd(LR), max_consecutive_errors=2)
    peer_state = peer.init(params)
    for _ in range(3):
        updates, peer_state = peer.update(bad, peer_state, params)
    assert np.isnan(np.asarray(updates["w"])).all()
    tx = lsj.loss_scale_optimizer(optax.sgd(LR), 1, max_consecutive_skips=3)
    state = tx.init(params)
    for _ in range(2):
        updates, state = tx.update(bad, state, params)
        assert not np.isnan(np.asarray(updates["w"])).any()
    with pytest.raises(Exception, match="3 steps in a row were skipped") as info:
        _, state = tx.update(bad, state, params)
        jax.block_until_ready(state)
    assert "LossScaleError" in str(info.value)
