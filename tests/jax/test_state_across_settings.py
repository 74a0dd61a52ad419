"""A saved ``loss_scale_optimizer`` state restores into the optimizer with ``stats_every`` turned on or off, or
``loss_scale="auto"``: the inner state, the scale and the counters carry over, the statistics start as ``init()``
makes them (kept when both sides sample in the same layout). Through flax (``to_bytes``/``from_bytes``,
``to_state_dict``/``from_state_dict``, a ``TrainState`` holding it) and, with docs/jax.md's recipe, orbax; the
0.1 and 0.2 fixtures included. Trained on, the restored run matches an uninterrupted one."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale
import lossscale.jax as lsj
from tests.compat import recipes
from tests.compat.compare import VERSIONS, fixture, manifest

serialization = pytest.importorskip("flax.serialization", reason="flax serialization needs flax (in the dev extra)")

AFTER = range(recipes.SAVED_AFTER, recipes.TOTAL_STEPS)
#: the settings a run saves with or restores into; "auto" is AutoLossScale at the recipe's initial scale
SETTINGS = {
    "plain": {},
    "stats2": {"stats_every": 2},
    "stats16": {"stats_every": 16},
    "auto": {"auto": True},
}


def _tx(setting):
    options = dict(SETTINGS[setting])
    if options.pop("auto", False):
        policy = lossscale.AutoLossScale(initial_loss_scale=recipes.INITIAL_SCALE)
        return lsj.loss_scale_optimizer(optax.adam(recipes.LEARNING_RATE), policy, stats_every=2)
    return recipes.jax_tx(lsj, **options)


def _numbers(state):
    s = state.loss_scale_state
    return {name: float(getattr(s, name)) for name in s._fields}


@functools.cache
def _trained(setting, steps):
    tx = _tx(setting)
    params = recipes.jax_params()
    return recipes.jax_steps(lsj, tx, params, tx.init(params), steps)


def _same(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


HOW = {
    "bytes": lambda target, state: serialization.from_bytes(target, serialization.to_bytes(state)),
    "state_dict": lambda target, state: serialization.from_state_dict(target, serialization.to_state_dict(state)),
}


def _pairs():
    pairs = [(saved, into, "bytes") for saved in SETTINGS for into in SETTINGS]
    return pairs + [("plain", "stats2", "state_dict"), ("stats2", "plain", "state_dict"), ("auto", "plain", "state_dict")]


@pytest.mark.parametrize(("saved", "into", "how"), _pairs())
def test_a_state_restores_across_settings(saved, into, how):
    params, state = _trained(saved, range(recipes.SAVED_AFTER))
    assert {k: _numbers(state)[k] for k in recipes.AT_SAVE if saved != "auto" or k != "loss_scale"} == {
        k: v for k, v in recipes.AT_SAVE.items() if saved != "auto" or k != "loss_scale"}
    tx = _tx(into)
    fresh = tx.init(params)
    restored = HOW[how](fresh, state)
    assert type(restored) is type(fresh)
    assert _numbers(restored) == _numbers(state)
    _same(restored.inner_state, state.inner_state)
    if SETTINGS[saved] == SETTINGS[into] or {saved, into} == {"stats2", "stats16"}:
        _same(restored.stats, state.stats)  # the same layout: the statistics too
    else:
        _same(restored.stats, fresh.stats)  # None, or empty as init() makes them
    if "auto" in (saved, into):
        return  # AutoLossScale sets its own scale: the trajectories part from here by design
    params, state = recipes.jax_steps(lsj, tx, params, restored, AFTER)
    ref_params, ref_state = _trained(saved, range(recipes.TOTAL_STEPS))
    _same(params, ref_params)
    _same(state.inner_state, ref_state.inner_state)
    assert _numbers(state) == _numbers(ref_state)


def test_an_auto_state_into_dynamic_and_back_trains_on():
    params, state = _trained("auto", range(recipes.SAVED_AFTER))
    dynamic = _tx("stats2")
    restored = serialization.from_bytes(dynamic.init(params), serialization.to_bytes(state))
    assert restored.stats.auto is None and _numbers(restored) == _numbers(state)
    params, restored = recipes.jax_steps(lsj, dynamic, params, restored, AFTER)
    back = serialization.from_bytes(_tx("auto").init(params), serialization.to_bytes(restored))
    assert back.stats.auto is not None and _numbers(back) == _numbers(restored)
    _, back = recipes.jax_steps(lsj, _tx("auto"), params, back, range(2))
    assert np.isfinite(float(back.loss_scale))


def test_a_train_state_and_a_chain_restore_across_settings():
    from flax.training import train_state

    def make(setting):
        tx = optax.chain(_tx(setting), optax.scale(1.0))
        return train_state.TrainState.create(apply_fn=None, params=recipes.jax_params(), tx=tx)

    source = make("plain")
    inner = source.opt_state[0]._replace(
        loss_scale_state=source.opt_state[0].loss_scale_state._replace(loss_scale=jnp.float32(64.0))
    )
    source = source.replace(opt_state=(inner, source.opt_state[1]))
    restored = serialization.from_bytes(make("stats16"), serialization.to_bytes(source))
    assert float(lsj.find_state(restored.opt_state).loss_scale) == 64.0
    assert lsj.find_state(restored.opt_state).gradient_stats is not None


def test_a_state_dict_that_is_no_optimizer_state_is_refused():
    fresh = _tx("stats2").init(recipes.jax_params())
    with pytest.raises(ValueError, match="The field names of the state dict and the named tuple do not match.*"
                                         "Restore it into the state of the transformation that saved it"):
        serialization.from_state_dict(fresh, {"inner_state": {}, "other": {}})


def _fixture_cases():
    return [
        pytest.param(version, name, id=f"{version}-{name}")
        for version in VERSIONS
        for name in ("jax_state", "jax_stats_state")
        if f"{name}.msgpack" in manifest(version)["at_save"]
    ]


@pytest.mark.parametrize("into", list(SETTINGS))
@pytest.mark.parametrize(("version", "name"), _fixture_cases())
def test_release_fixtures_restore_into_every_setting(version, name, into):
    tx = _tx(into)
    params = recipes.jax_params()
    target = {"params": params, "opt_state": tx.init(params)}
    restored = serialization.from_bytes(target, fixture(version, f"{name}.msgpack").read_bytes())
    state = restored["opt_state"]
    assert {k: _numbers(state)[k] for k in recipes.AT_SAVE} == recipes.AT_SAVE
    if into == "auto":
        return
    params, state = recipes.jax_steps(lsj, tx, restored["params"], state, AFTER)
    ref_params, ref_state = _trained("plain", range(recipes.TOTAL_STEPS))
    np.testing.assert_allclose(np.asarray(params["w"]), np.asarray(ref_params["w"]), rtol=1e-5)
    assert _numbers(state) == _numbers(ref_state)


def test_orbax_recipe_restores_across_settings(tmp_path):
    """docs/jax.md: orbax compares the tree with the file's, so restore into the layout it was saved with, then
    move the inner state and the scale into the new optimizer's state."""
    ocp = pytest.importorskip("orbax.checkpoint")
    params, state = _trained("plain", range(recipes.SAVED_AFTER))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", state)
    new_tx = _tx("stats16")
    with ocp.StandardCheckpointer() as checkpointer:
        with pytest.raises(ValueError, match="tree structures do not match"):
            checkpointer.restore(tmp_path / "ckpt", new_tx.init(params))
        old = checkpointer.restore(tmp_path / "ckpt", _tx("plain").init(params))
    restored = new_tx.init(params)._replace(inner_state=old.inner_state, loss_scale_state=old.loss_scale_state)
    lsj.check_state(restored)
    params, restored = recipes.jax_steps(lsj, new_tx, params, restored, AFTER)
    ref_params, ref_state = _trained("plain", range(recipes.TOTAL_STEPS))
    _same(params, ref_params)
    assert _numbers(restored) == _numbers(ref_state) and restored.gradient_stats is not None
