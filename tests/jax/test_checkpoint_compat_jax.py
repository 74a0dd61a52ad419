"""JAX checkpoints written by every release (tests/compat/fixtures/<version>/) restore with today's code and train on
exactly as an uninterrupted run does: the loss_scale_optimizer state (with the parameters) and lossscale's flax
TrainState, through flax msgpack (flax.serialization) and orbax (StandardCheckpointer), with gradient statistics
off and (from 0.2.0) on."""

from __future__ import annotations

import functools

import jax
import pytest

import lossscale.jax as lsj
from tests.compat import recipes
from tests.compat.compare import VERSIONS, assert_same, at_save, fixture, manifest

serialization = pytest.importorskip("flax.serialization", reason="the flax formats need flax (in the dev extra)")
ocp = pytest.importorskip("orbax.checkpoint", reason="the orbax format needs orbax-checkpoint (flax's dependency)")

AFTER = range(recipes.SAVED_AFTER, recipes.TOTAL_STEPS)
EVERYTHING = range(recipes.TOTAL_STEPS)
FORMATS = ["msgpack", "orbax"]
#: The fixtures of the optimizer state, and the loss_scale_optimizer options each was written with.
STATE_OPTIONS = {"jax_state": {}, "jax_stats_state": {"stats_every": 2}}


def restore(version, name, fmt, target):
    path = fixture(version, f"{name}.{fmt}")
    if fmt == "msgpack":
        return serialization.from_bytes(target, path.read_bytes())
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(path, target)


def check_at_save(version, name, opt_state):
    found = lsj.find_state(opt_state)
    numbers = {
        "loss_scale": float(found.loss_scale),
        "good_steps": int(found.loss_scale_state.good_steps),
        "skipped_steps": int(found.skipped_steps),
    }
    recorded = {k: v for k, v in at_save(version, name).items() if k in numbers}
    assert numbers == recorded == recipes.AT_SAVE


#: The steps before the save were computed by the release that wrote the checkpoint. XLA may fuse another
#: release's jitted step differently (0.2 chooses each output of the inner update where 0.1 branched with a
#: lax.cond), which moves a weight or a moment by a few ulps; the scale and the counters stay exact.
ULPS = 1e-5


def assert_same_tree(mine, theirs, where):
    assert jax.tree_util.tree_structure(mine) == jax.tree_util.tree_structure(theirs), where
    assert_same(jax.tree_util.tree_leaves(mine), jax.tree_util.tree_leaves(theirs), where, rtol=ULPS)


@functools.cache
def uninterrupted(name):
    tx = recipes.jax_tx(lsj, **STATE_OPTIONS[name])
    return recipes.jax_steps(lsj, tx, recipes.jax_params(), tx.init(recipes.jax_params()), EVERYTHING)


@functools.cache
def uninterrupted_train_state():
    return recipes.jax_train_state_steps(lsj, recipes.jax_train_state(lsj), EVERYTHING)


def state_cases():
    return [
        pytest.param(version, name, fmt, id=f"{version}-{name}.{fmt}")
        for version in VERSIONS
        for name in STATE_OPTIONS
        for fmt in FORMATS
        if f"{name}.{fmt}" in manifest(version)["at_save"]
    ]


@pytest.mark.parametrize(("version", "name", "fmt"), state_cases())
def test_optimizer_state_restores_and_resumes(version, name, fmt):
    tx = recipes.jax_tx(lsj, **STATE_OPTIONS[name])
    params = recipes.jax_params()
    restored = restore(version, name, fmt, {"params": params, "opt_state": tx.init(params)})
    check_at_save(version, f"{name}.{fmt}", restored["opt_state"])
    params, state = recipes.jax_steps(lsj, tx, restored["params"], restored["opt_state"], AFTER)

    ref_params, ref_state = uninterrupted(name)
    assert float(ref_state.loss_scale) == recipes.AT_END["loss_scale"]
    assert int(ref_state.skipped_steps) == recipes.AT_END["skipped_steps"]
    assert_same_tree(params, ref_params, "params")
    assert_same_tree(state, ref_state, "opt_state")  # scale, counters, Adam's moments and count, statistics
    assert (state.gradient_stats is None) == ("stats_every" not in STATE_OPTIONS[name])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("version", VERSIONS)
def test_train_state_restores_and_resumes(version, fmt):
    restored = restore(version, "jax_train_state", fmt, recipes.jax_train_state(lsj))
    check_at_save(version, f"jax_train_state.{fmt}", restored.opt_state)
    assert int(restored.step) == at_save(version, f"jax_train_state.{fmt}")["step"] == 3  # applied steps only
    state = recipes.jax_train_state_steps(lsj, restored, AFTER)

    ref = uninterrupted_train_state()
    assert int(ref.step) == recipes.TOTAL_STEPS - recipes.AT_END["skipped_steps"]
    assert_same_tree(state.params, ref.params, "params")
    assert_same_tree(state.opt_state, ref.opt_state, "opt_state")
    assert int(state.step) == int(ref.step)
