"""Property tests (hypothesis) of lossscale.jax.loss_scale_optimizer: skips, control runs, restores, tampered state.

See tests/properties.py for the profiles and how to run more examples.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lossscale.jax as lsj
from tests import properties as props

serialization = pytest.importorskip("flax.serialization")

SHAPES = {"a": (3,), "b": (2, 2)}
POISON = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}


def true_grads(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}


def scaled(step: int, plan_entry, scale: float) -> dict[str, jax.Array]:
    grads = {k: g * np.float32(scale) for k, g in true_grads(step).items()}
    if plan_entry is not None:
        kind, which = plan_entry
        name = sorted(SHAPES)[which % len(SHAPES)]
        flat = grads[name].reshape(-1)
        flat[which % flat.size] = POISON[kind]
    return {k: jnp.asarray(v) for k, v in grads.items()}


def exact(policy) -> bool:
    """Whether every scale the policy reaches is a power of two (then g * S * (1/S) == g exactly)."""
    params = policy.rule_params()
    return all(
        float(np.log2(x)).is_integer()
        for x in (params.initial_scale, params.growth_factor, params.backoff_multiplier, params.backoff_divisor)
    )


def assert_trees(a, b, bitwise: bool) -> None:
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        if bitwise:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-6, atol=1e-7)


class Run:
    """One training run; runs of one example share the transformation (one compile)."""

    def __init__(self, opt, update):
        self.params = {k: jnp.ones(s, jnp.float32) for k, s in SHAPES.items()}
        self.state = opt.init(self.params)
        self.update = update

    def step(self, step: int, entry) -> None:
        grads = scaled(step, entry, float(self.state.loss_scale))
        updates, self.state = self.update(grads, self.state, self.params)
        self.params = optax.apply_updates(self.params, updates)


def run_property(data) -> None:
    policy = data.draw(props.policies(), label="policy")
    plan = data.draw(props.step_plans(8), label="plan")
    stop = data.draw(st.integers(0, len(plan)), label="checkpoint step")
    opt = lsj.loss_scale_optimizer(optax.adam(0.05), policy)
    update = jax.jit(opt.update)
    run, control = Run(opt, update), Run(opt, update)
    bitwise = exact(policy)
    resumed = None
    for i, entry in enumerate(plan):
        if i == stop:
            resumed = Run(opt, update)
            saved = serialization.to_bytes(run.state)
            resumed.state = serialization.from_bytes(resumed.state, saved)
            lsj.check_state(resumed.state, policy)
            resumed.params = jax.tree_util.tree_map(jnp.array, run.params)
        before = (run.params, run.state.inner_state)
        run.step(i, entry)
        if resumed is not None:
            resumed.step(i, entry)
        scale = float(run.state.loss_scale)
        assert props.in_bounds(scale, policy), (scale, policy)
        lsj.check_state(run.state, policy)
        if entry is not None:  # a skipped step leaves weights and inner state bit-identical
            assert bool(run.state.last_step_skipped)
            assert_trees(before, (run.params, run.state.inner_state), bitwise=True)
        else:
            control.step(i, None)
            assert_trees(run.params, control.params, bitwise)
            assert_trees(run.state.inner_state, control.state.inner_state, bitwise)
    if resumed is not None:  # save, load into a fresh state and go on: the same trajectory
        assert_trees((run.params, run.state), (resumed.params, resumed.state), bitwise=True)


@props.fast(6)
@given(st.data())
def test_skips_control_and_resume(data):
    run_property(data)


@props.slow(6)
@given(st.data())
def test_skips_control_and_resume_slow(data):
    run_property(data)


FIELDS = ("loss_scale", "good_steps", "bad_steps", "skipped_steps", "consecutive_skips")


def tamper_property(data) -> None:
    policy = data.draw(props.policies(), label="policy")
    state = lsj.loss_scale_optimizer(optax.sgd(0.1), policy).init({"w": jnp.ones(2)})
    restored = serialization.to_state_dict(state)  # what a restore without a target gives
    field = data.draw(st.sampled_from(FIELDS), label="field")
    action = data.draw(st.sampled_from(["replace", "replace", "replace", "delete", "extra"]), label="action")
    record = restored["loss_scale_state"]
    if action == "delete":
        del record[field]
    elif action == "extra":
        record["from_the_future"] = 1
    else:
        record[field] = data.draw(props.bad_values(lambda: np.ones(2, np.float32)), label="value")
    try:
        lsj.check_state(restored, policy)
    except (TypeError, ValueError) as error:
        assert field in str(error) or action == "delete"
        return
    # accepted: a valid state (an extra field from a later version is ignored, by design)
    assert action == "extra" or (action == "replace" and record[field] is not None)
    scale = float(np.asarray(record["loss_scale"]))
    assert props.in_bounds(scale, policy)
    for name in FIELDS[1:]:
        value = record[name]
        assert not isinstance(value, bool) and 0 <= int(np.asarray(value)) < 2**31


@props.fast(100)
@given(st.data())
def test_tampered_state_is_refused_or_valid(data):
    tamper_property(data)


@props.slow(40)
@given(st.data())
def test_tampered_state_is_refused_or_valid_slow(data):
    tamper_property(data)


def test_check_state_finds_the_scale_in_chains_and_flax_train_states():
    from flax.training import train_state

    tx = optax.chain(optax.scale(1.0), lsj.loss_scale_optimizer(optax.sgd(0.1), 8))
    ts = train_state.TrainState.create(apply_fn=None, params={"w": jnp.ones(2)}, tx=tx)
    assert lsj.check_state(ts) is ts
    bad = ts.opt_state[1]._replace(loss_scale_state=ts.opt_state[1].loss_scale_state._replace(good_steps=jnp.int32(-3)))
    with pytest.raises(ValueError, match=r"state\[1\]\.loss_scale_state\['good_steps'\] must be an int in \[0"):
        lsj.check_state((ts.opt_state[0], bad))
    with pytest.raises(ValueError, match="outside the policy's bounds"):
        lsj.check_state(ts, lsj.FixedLossScale(16))
    with pytest.raises(TypeError, match="holding no loss scale"):
        lsj.check_state({"w": jnp.ones(2)})


def test_orbax_restore_recipe_of_docs(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    import lossscale

    policy = lossscale.DynamicLossScale(2**15, 2000, max_loss_scale=2**24)
    tx = lsj.loss_scale_optimizer(optax.adamw(1e-3), policy)
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    bad = state._replace(loss_scale_state=state.loss_scale_state._replace(loss_scale=jnp.float32(2.0**25)))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "good", state)
    checkpointer.save(tmp_path / "bad", bad)
    checkpointer.wait_until_finished()
    restored = lsj.check_state(checkpointer.restore(tmp_path / "good", tx.init(params)), policy)
    assert float(restored.loss_scale) == 2.0**15
    with pytest.raises(ValueError, match=r"loss_scale'\]=33554432.0 is outside the policy's bounds"):
        lsj.check_state(checkpointer.restore(tmp_path / "bad", tx.init(params)), policy)
    with pytest.raises(ValueError, match="outside the policy's bounds"):
        lsj.check_state(checkpointer.restore(tmp_path / "bad"), policy)  # no target: nested dicts


def inert_property(data) -> None:
    module, class_name = data.draw(props.hostile_names(), label="names")
    policy = {"class_name": class_name, "config": {}, "module": module}
    state = lsj.loss_scale_optimizer(optax.sgd(0.1)).init({"w": jnp.ones(2)})
    props.run_inert([module], [class_name], (lambda: lsj.loss_scale_optimizer(optax.sgd(0.1), policy), lambda: lsj.check_state(state, policy)))


@props.fast(30)
@given(st.data())
def test_policy_configs_import_and_call_nothing_named(data):
    inert_property(data)


def test_every_field_with_every_bad_value():
    """Exhaustive companion of the tamper property: each field of the state, each bad value."""
    policy = lsj.DynamicLossScale(2.0**10, 3, max_loss_scale=2.0**12)
    state = serialization.to_state_dict(lsj.loss_scale_optimizer(optax.sgd(0.1), policy).init({"w": jnp.ones(2)}))
    for field in FIELDS:
        for value in [*props.BAD_SCALARS, np.ones(2, np.float32), np.int64(2**32), np.float64(0.0)]:
            record = dict(state["loss_scale_state"], **{field: value})
            tampered = {**state, "loss_scale_state": record}
            valid = field != "loss_scale" and isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
            if valid:
                lsj.check_state(tampered, policy)
            else:
                with pytest.raises((TypeError, ValueError), match=field):
                    lsj.check_state(tampered, policy)
