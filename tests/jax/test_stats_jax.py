"""``stats_every`` and ``loss_scale="auto"`` in lossscale.jax: numbers vs the numpy core, one compile, no host transfer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale
import lossscale.jax as lsj
from lossscale._auto import initial_auto_state, next_auto_state
from lossscale._stats import gradient_stats
from lossscale.jax._stats import tensor_names


def grads_at(scale):
    rng = np.random.default_rng(0)
    w = (rng.normal(size=(16, 8)) * 2.0**-20 * scale).astype(np.float16)
    w[0, :3] = 0
    b = (rng.normal(size=8) * 2.0**-8 * scale).astype(np.float32)
    return {"b": jnp.asarray(b), "w": jnp.asarray(w)}


def params():
    return {"b": jnp.zeros(8, jnp.float32), "w": jnp.zeros((16, 8), jnp.float16)}


def test_statistics_equal_the_numpy_core():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), 2.0**10, stats_every=1)
    state = opt.init(params())
    grads = grads_at(2.0**10)
    _, state = jax.jit(opt.update)(grads, state, params())
    got = state.gradient_stats
    ref = gradient_stats([np.asarray(g) for g in jax.tree_util.tree_leaves(grads)], np)
    for key in ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms_min"):
        np.testing.assert_allclose(np.asarray(got[key]), getattr(ref, key), rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(np.asarray(got["per_tensor"]["zero_fraction"]), ref.tensor_zero_fraction)
    assert float(got["per_tensor"]["zero_fraction"][1]) >= 3 / 128  # "w" is the second leaf
    assert tensor_names(params()) == ("['b']", "['w']")


def test_off_by_default_and_validated():
    state = lsj.loss_scale_optimizer(optax.sgd(0.1)).init(params())
    assert state.stats is None and state.gradient_stats is None
    with pytest.raises(TypeError, match="stats_every must be an int"):
        lsj.loss_scale_optimizer(optax.sgd(0.1), stats_every=2.5)
    with pytest.raises(ValueError, match="at least 1"):
        lsj.loss_scale_optimizer(optax.sgd(0.1), stats_every=0)


def test_sampled_every_n_compiled_once_without_host_transfers():
    opt = lsj.loss_scale_optimizer(optax.adam(1e-3), stats_every=3)
    traces = []

    def step(g, s, p):
        traces.append(1)
        return opt.update(g, s, p)

    step = jax.jit(step)
    state = opt.init(params())
    grads = jax.device_put(grads_at(2.0**15))
    p = jax.device_put(params())
    samples = []
    with jax.transfer_guard("disallow"):
        for _ in range(7):
            _, state = step(grads, state, p)
            samples.append(state.stats.sample.step)
    assert len(traces) == 1
    assert [int(s) for s in samples] == [0, 0, 0, 3, 3, 3, 6]


def test_auto_follows_the_core_rule():
    """The jitted step's scale trajectory equals the numpy core's on the same gradients."""
    policy = lossscale.AutoLossScale(1.0)
    opt = lsj.loss_scale_optimizer(optax.sgd(0.0), policy, stats_every=1)
    state = opt.init(params())
    ref_state, ref_auto = lossscale.initial_state(policy, np), initial_auto_state(policy, np)
    update = jax.jit(opt.update)
    scales = []
    for i in range(4):
        scale = float(state.loss_scale)
        grads = grads_at(scale)
        if i == 2:
            grads["b"] = grads["b"].at[0].set(jnp.inf)
        _, state = update(grads, state, params())
        leaves = [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)]
        finite = np.bool_(all(np.isfinite(g).all() for g in leaves))
        with np.errstate(all="ignore"):
            ref_state, ref_auto = next_auto_state(
                policy, ref_state, ref_auto, finite, gradient_stats(leaves, np, i), True, np
            )
        assert float(state.loss_scale) == float(ref_state.loss_scale)
        assert int(state.skipped_steps) == int(ref_state.skipped_steps)
        scales.append(float(state.loss_scale))
    assert scales[0] > 1.0 and int(state.skipped_steps) == 1
    # The overflow remembered the spike: the margin grew past its start, by the same amount as the numpy core's.
    assert float(state.stats.auto.margin) == float(ref_auto.margin) > policy.margin_bits


def test_auto_from_2_30_settles_in_one_sample_on_float32_gradients():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.0), lossscale.AutoLossScale(2.0**30))
    state = opt.init(params())
    p = {"b": jnp.zeros(8, jnp.float32), "w": jnp.zeros((16, 8), jnp.float32)}
    state = opt.init(p)
    rng = np.random.default_rng(1)
    true = {"b": jnp.asarray(rng.normal(size=8) * 2.0**-4, jnp.float32),
            "w": jnp.asarray(rng.normal(size=(16, 8)) * 2.0**-22, jnp.float32)}
    update = jax.jit(opt.update)
    _, state = update(jax.tree_util.tree_map(lambda t: t * state.loss_scale, true), state, p)
    scaled = jax.tree_util.tree_map(lambda t: (t * state.loss_scale).astype(jnp.float16), true)
    after = gradient_stats([np.asarray(g) for g in jax.tree_util.tree_leaves(scaled)], np)
    assert float(after.zero_fraction) == 0.0 and float(after.headroom_bits) >= 4
    assert int(state.skipped_steps) == 0


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf, -jnp.inf])
def test_the_one_pass_check_skips_nan_and_inf(bad):
    """With stats_every=1 the finite flag is read from the statistics' max |g|."""
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), stats_every=1)
    p = {"w": jnp.ones(3, jnp.float32), "h": jnp.ones(2, jnp.float16)}
    state = opt.init(p)
    grads = {"w": jnp.array([1.0, bad, 1.0]), "h": jnp.ones(2, jnp.float16)}
    updates, state = jax.jit(opt.update)(grads, state, p)
    assert int(state.skipped_steps) == 1 and float(state.loss_scale) == 2.0**14
    assert not bool(jnp.any(updates["w"]))


def test_a_nan_gradient_has_nan_headroom_not_infinite():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), 2.0**10, stats_every=1)
    grads = grads_at(2.0**10)
    grads["b"] = grads["b"].at[0].set(jnp.nan)
    _, state = jax.jit(opt.update)(grads, opt.init(params()), params())
    got = state.gradient_stats
    assert bool(state.last_step_skipped)
    assert np.isnan(float(got["headroom_bits"])) and np.isnan(float(got["per_tensor"]["headroom_bits"][0]))
    assert np.isfinite(float(got["per_tensor"]["headroom_bits"][1]))


@pytest.mark.parametrize("every", [1, 2])
def test_history_carries_the_sampled_statistics(every):
    """``history=`` with ``stats_every``: a sampled step's row holds its sample's columns, the others NaN.

    On 47dcf92 the JAX binding left every statistics column NaN.
    """
    history = lossscale.History()
    opt = lsj.loss_scale_optimizer(optax.sgd(0.0), 2.0**10, stats_every=every, history=history)
    state = opt.init(params())
    update = jax.jit(opt.update)
    refs = []
    for i in range(4):
        grads = grads_at(2.0**10 * (i + 1))
        _, state = update(grads, state, params())
        refs.append(gradient_stats([np.asarray(g) for g in jax.tree_util.tree_leaves(grads)], np, i))
    jax.effects_barrier()
    assert history.steps.tolist() == [0, 1, 2, 3]
    for name in ("headroom_bits", "zero_fraction", "subnormal_fraction"):
        column = history.stat(name)
        for i, ref in enumerate(refs):
            if i % every == 0:
                np.testing.assert_allclose(column[i], float(getattr(ref, name)), rtol=1e-6, err_msg=f"{name}[{i}]")
            else:
                assert np.isnan(column[i]), (name, i, column[i])
    assert history.has_stats


def _reference_run(policy, every, grads_seq):
    """The numpy core's scale and sampler states after ``grads_seq`` (scaled gradients per step)."""
    from lossscale._advance import advance
    from lossscale._sampler import initial_sampler_state, is_due

    scale, sampler = lossscale.initial_state(policy, np), initial_sampler_state(policy, 2, np)
    for grads in grads_seq:
        leaves = [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)]
        finite = all(np.isfinite(g).all() for g in leaves)
        sampled = is_due(every, sampler.count)
        with np.errstate(all="ignore"):
            sample = gradient_stats(leaves, np, sampler.count) if sampled else None
        scale, sampler = advance(policy, scale, finite, np, sampler=sampler, sample=sample, sampled=sampled)
    return scale, sampler


def _check_against(state, ref_scale, ref_sampler):
    assert float(state.loss_scale) == float(ref_scale.loss_scale)
    assert int(state.skipped_steps) == int(ref_scale.skipped_steps)
    got = state.gradient_stats
    assert int(got["step"]) == int(ref_sampler.sample.step)
    for key in ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms_min"):
        np.testing.assert_allclose(np.asarray(got[key]), getattr(ref_sampler.sample, key), rtol=1e-6, err_msg=key)
    if ref_sampler.auto is not None:
        for got_field, want in zip(state.stats.auto, ref_sampler.auto):
            np.testing.assert_allclose(np.asarray(got_field), want, rtol=1e-6)


def _grads_for(i, scale, inf_at=2):
    """Step ``i``'s scaled gradients at the scale it runs at (a level falling 2x per step); an Inf at ``inf_at``."""
    grads = grads_at(scale * 2.0**-i)
    if i == inf_at:
        grads["b"] = grads["b"].at[1].set(jnp.inf)
    return grads


@pytest.mark.parametrize("loss_scale,every", [(2.0**10, 2), ("auto", None), ("auto", 1)])
def test_apply_gradients_samples_and_scales_as_the_numpy_core(loss_scale, every):
    opt = lsj.loss_scale_optimizer(optax.sgd(0.0), loss_scale, stats_every=every)
    policy = lossscale.get(loss_scale)
    n_every = every or 16
    state, seen = opt.init(params()), []
    step = jax.jit(lambda g, s, p: lsj.apply_gradients(opt, g, s, p))
    for i in range(5):
        grads = _grads_for(i, float(state.loss_scale))
        seen.append(grads)
        _, state = step(grads, state, params())
    _check_against(state, *_reference_run(policy, n_every, seen))


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("loss_scale", ["dynamic", "auto"])
def test_overflows_on_sampled_and_unsampled_steps_follow_the_numpy_core(loss_scale, backend, monkeypatch):
    """stats_every=3: a sampled step's finite flag is read from the sample's max |g| (one pass), an unsampled
    step's from the usual check (on a GPU, ``all(isfinite)``); NaN and Inf on either kind of step skip as the numpy
    core's sampler says."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)  # the check chosen, on this machine's CPU
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), loss_scale, stats_every=3)
    state, seen = opt.init(params()), []
    step = jax.jit(opt.update)
    for i, bad in enumerate([None, jnp.nan, None, jnp.inf, None, None, -jnp.inf, None]):
        grads = grads_at(float(state.loss_scale) * 2.0**-8)
        if bad is not None:
            grads["w"] = grads["w"].at[2, 1].set(bad)
        seen.append(grads)
        updates, state = step(grads, state, params())
        ref_scale, ref_sampler = _reference_run(lossscale.get(loss_scale), 3, seen)
        _check_against(state, ref_scale, ref_sampler)
        assert bool(jnp.any(updates["b"])) == (bad is None), i
    assert int(state.skipped_steps) == 3


def test_value_and_grad_and_update_sample_the_scaled_gradients():
    """lsj.value_and_grad scales the loss by the state's S; the sample is of those scaled gradients."""
    opt = lsj.loss_scale_optimizer(optax.sgd(0.0), "auto", stats_every=1)
    w = {"b": jnp.linspace(-1.0, 1.0, 8), "w": jnp.full((16, 8), 2.0**-12, jnp.float32)}

    def loss(p):
        return (jnp.sum(p["b"] ** 2) * 2.0**-18 + jnp.sum(p["w"] ** 2)) * 2.0**-10

    grad_fn = lsj.value_and_grad(loss)
    state, seen = opt.init(w), []
    for _ in range(3):
        _, grads = grad_fn(w, opt_state=state)
        seen.append(grads)
        _, state = jax.jit(opt.update)(grads, state, w)
    _check_against(state, *_reference_run(lossscale.AutoLossScale(), 1, seen))
    assert float(state.loss_scale) != 2.0**15  # the auto rule moved the scale


def test_flax_train_state_samples_and_scales_as_the_numpy_core():
    pytest.importorskip("flax")
    from lossscale.jax.train_state import TrainState

    tx = lsj.loss_scale_optimizer(optax.sgd(0.0), "auto", stats_every=2)
    ts = TrainState.create(apply_fn=None, params=params(), tx=tx)
    seen = []
    for i in range(5):
        grads = _grads_for(i, float(lsj.find_state(ts.opt_state).loss_scale))
        seen.append(grads)
        ts = jax.jit(lambda t, g: t.apply_gradients(grads=g))(ts, grads)
    _check_against(lsj.find_state(ts.opt_state), *_reference_run(lossscale.AutoLossScale(), 2, seen))


def test_bfloat16_and_empty_leaves_are_measured_as_the_numpy_core():
    """A bfloat16 leaf is widened to float32 before the sums; an empty leaf counts as size 0 (no NaN anywhere)."""
    leaves = {
        "a": jnp.asarray([0.0, 2.0**-20, 3.0, -2.0**-10], jnp.bfloat16),
        "e": jnp.zeros((0, 3), jnp.float32),
        "w": jnp.asarray([[1.0, 0.0], [2.0**-16, -8.0]], jnp.float16),
    }
    opt = lsj.loss_scale_optimizer(optax.sgd(0.0), 1.0, stats_every=1)
    _, state = jax.jit(opt.update)(leaves, opt.init(leaves), leaves)
    ref = gradient_stats([np.asarray(v, np.float32) for v in jax.tree_util.tree_leaves(leaves)], np)
    got = state.gradient_stats
    for key in ("amax", "zero_fraction", "subnormal_fraction", "rms_min"):
        np.testing.assert_allclose(np.asarray(got[key]), getattr(ref, key), rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(np.asarray(got["per_tensor"]["rms"]), ref.tensor_rms, rtol=1e-6)
    assert float(got["per_tensor"]["zero_fraction"][1]) == 0.0 and float(got["zero_fraction"]) == 2 / 8


@pytest.mark.parametrize("cached", [0, 2**20], ids=["one-variadic-reduction", "four-reductions"])
def test_both_kernels_give_the_numpy_core_statistics(monkeypatch, cached):
    """Leaves above CACHED_ELEMENTS take one variadic reduction, smaller ones four: the same numbers, NaN included."""
    import lossscale.jax._stats as jstats

    monkeypatch.setattr(jstats, "CACHED_ELEMENTS", cached)
    grads = grads_at(2.0**10)
    opt = lsj.loss_scale_optimizer(optax.sgd(0.0), 2.0**10, stats_every=1)
    _, state = jax.jit(opt.update)(grads, opt.init(params()), params())
    ref = gradient_stats([np.asarray(g) for g in jax.tree_util.tree_leaves(grads)], np)
    for key in ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms_min"):
        np.testing.assert_allclose(np.asarray(state.gradient_stats[key]), getattr(ref, key), rtol=1e-6, err_msg=key)
    bad = dict(grads, w=grads["w"].at[1, 1].set(jnp.nan))
    sample = jstats.measure(jax.tree_util.tree_leaves(bad), jnp.int32(0), None)
    assert np.isnan(float(sample.amax)) and np.isnan(float(sample.headroom_bits))


@pytest.mark.parametrize("settings", [{"loss_scale": "auto"}, {"stats_every": 2}], ids=["auto", "stats_every"])
def test_a_group_with_no_gradients_steps_without_a_sample(settings):
    """optax.multi_transform hands a group no parameter is labelled with an empty tree (optax.apply_if_finite and the
    default policy take it): update() counts the step as finite and unsampled, and the rest of the tree trains."""
    p = {"w": jnp.ones(2)}
    opt = lsj.loss_scale_optimizer(optax.adam(0.1), **settings)
    tx = optax.multi_transform({"mixed": opt, "plain": optax.sgd(1.0)}, {"w": "plain"})
    state = tx.init(p)
    step = jax.jit(tx.update)
    for _ in range(3):
        updates, state = step(p, state, p)
    np.testing.assert_array_equal(np.asarray(updates["w"]), [-1.0, -1.0])
    ours, fresh = lsj.find_state(state), lsj.find_state(tx.init(p))
    assert (int(ours.loss_scale_state.good_steps), int(ours.skipped_steps), int(ours.stats.count)) == (3, 0, 3)
    assert float(ours.loss_scale) == float(fresh.loss_scale) == 2.0**15
    for mine, first in zip(jax.tree.leaves(ours.stats.sample), jax.tree.leaves(fresh.stats.sample)):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(first))  # nothing measured: init()'s sample
    _, again = opt.update({}, opt.init({}), {})  # the binding's own update, outside a multi_transform
    assert int(again.stats.count) == 1
