"""The one vocabulary on JAX: min_loss_scale/max_loss_scale/hysteresis, history=, and the state's attributes."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale
import lossscale.jax as lsj
from tests.reference import PATTERN, as_bools, trajectory

VOCAB = (
    "dynamic", "initial_scale", "dynamic_growth_steps", "min_loss_scale", "max_loss_scale", "hysteresis",
    "max_consecutive_skips", "history",
)


def test_the_keywords_are_the_vocabulary_with_none_defaults():
    params = inspect.signature(lsj.loss_scale_optimizer).parameters
    assert params["loss_scale"].default is None
    for name in VOCAB:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default is None, name


def drive(**kwargs):
    """A ``step(finite)`` for tests.reference.trajectory: one jitted update per call."""
    def make(_policy):
        opt = lsj.loss_scale_optimizer(optax.sgd(0.1), **kwargs)
        box = [opt.init(jnp.zeros(2))]
        update = jax.jit(opt.update)

        def step(finite):
            grads = jnp.ones(2) * (1.0 if finite else jnp.inf)
            _, box[0] = update(grads, box[0], jnp.zeros(2))
            return tuple(box[0].loss_scale_state)

        return step

    return make


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_scale": 2.0, "dynamic_growth_steps": 3, "min_loss_scale": 0.25},
        {"initial_scale": 8.0, "dynamic_growth_steps": 2, "max_loss_scale": 20.0},
        {"initial_scale": 64.0, "dynamic_growth_steps": 2, "hysteresis": 3},
        {"loss_scale": "dynamic", "min_loss_scale": 4.0, "max_loss_scale": 2.0**16, "hysteresis": 2},
    ],
)
def test_the_three_refinements_follow_the_core_rule(kwargs):
    extras = {k: kwargs[k] for k in ("min_loss_scale", "max_loss_scale", "hysteresis") if k in kwargs}
    policy = lossscale.DynamicLossScale(
        kwargs.get("initial_scale", 2.0**15), kwargs.get("dynamic_growth_steps", 2000), **extras
    )
    assert trajectory(policy, PATTERN, drive(**kwargs)) == trajectory(policy, PATTERN, "numpy")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"loss_scale": 128, "hysteresis": 2}, ValueError, r"hysteresis=.*loss_scale=128 carries its own"),
        ({"dynamic": False, "initial_scale": 8, "min_loss_scale": 2}, ValueError, r"only apply to a dynamic"),
        ({"loss_scale": "dynamic", "initial_scale": 8, "hysteresis": 2}, ValueError, r"not both"),
        ({"hysteresis": 0}, ValueError, r"hysteresis"),
        ({"hysteresis": 1.5}, TypeError, r"hysteresis"),
        ({"min_loss_scale": -1.0}, ValueError, r"min_loss_scale"),
        ({"min_loss_scale": "1"}, TypeError, r"min_loss_scale"),
        ({"max_loss_scale": 0.5}, ValueError, r"max_loss_scale"),
        ({"history": []}, TypeError,
         r"history must be a lossscale.History, True \(a new one\) or False/None \(off\), got list\."),
        ({"history": "yes"}, TypeError, r"history must be a lossscale.History.* got str\."),
    ],
)
def test_bad_values_name_the_keyword(kwargs, error, match):
    with pytest.raises(error, match=match):
        lsj.loss_scale_optimizer(optax.sgd(0.1), **kwargs)


def test_the_state_exposes_the_vocabulary():
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=8.0)
    state = opt.init(jnp.zeros(2))
    _, state = opt.update(jnp.array([1.0, jnp.nan]), state, jnp.zeros(2))
    _, state = opt.update(jnp.array([1.0, jnp.inf]), state, jnp.zeros(2))
    assert float(state.loss_scale) == 2.0
    assert int(state.skipped_steps) == 2 and int(state.consecutive_skips) == 2 and bool(state.last_step_skipped)
    _, state = opt.update(jnp.ones(2), state, jnp.zeros(2))
    assert int(state.skipped_steps) == 2 and int(state.consecutive_skips) == 0 and not bool(state.last_step_skipped)
    assert all(isinstance(getattr(state, n), jax.Array) for n in
               ("loss_scale", "skipped_steps", "consecutive_skips", "last_step_skipped"))


def test_history_true_records_into_a_new_history_held_by_the_transformation():
    # As torch's and Keras' optimizers: history=True makes a History, readable as tx.history; tx stays optax's pair.
    tx = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=8.0, dynamic_growth_steps=2, history=True)
    assert isinstance(tx, optax.GradientTransformationExtraArgs)
    assert isinstance(tx.history, lossscale.History) and len(tx.history) == 0
    init, update = tx  # still unpacks
    params = jnp.ones(2)
    state = init(params)
    step = jax.jit(update)
    for finite in as_bools("TFTT"):
        _, state = step(jnp.ones(2) * (1.0 if finite else jnp.inf), state, params)
    jax.effects_barrier()
    assert tx.history.steps.tolist() == [0, 1, 2, 3]
    assert tx.history.loss_scales.tolist() == [8.0, 8.0, 4.0, 4.0]
    assert tx.history.skipped.tolist() == [False, True, False, False]
    # a second transformation gets its own History; apply_gradients and a rebuilt pair record into the same one
    other = lsj.loss_scale_optimizer(optax.sgd(0.1), history=True)
    assert other.history is not tx.history
    rebuilt = optax.GradientTransformationExtraArgs(tx.init, tx.update)
    _, state = lsj.apply_gradients(rebuilt, jnp.ones(2), state, params)
    jax.effects_barrier()
    assert tx.history.steps.tolist() == [0, 1, 2, 3, 4] and len(other.history) == 0


@pytest.mark.parametrize("history", [None, False])
def test_history_off_leaves_tx_history_none(history):
    tx = lsj.loss_scale_optimizer(optax.sgd(0.1), history=history)
    assert tx.history is None


def test_a_given_history_is_the_transformations_history():
    history = lossscale.History()
    assert lsj.loss_scale_optimizer(optax.sgd(0.1), history=history).history is history


def test_history_records_every_step_of_a_jitted_loop():
    history = lossscale.History()
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=8.0, dynamic_growth_steps=2, history=history)
    params = jnp.ones(2)
    state = opt.init(params)
    step = jax.jit(lambda g, s, p: lsj.apply_gradients(opt, g, s, p))
    scales = []
    for finite in as_bools("TTFTFFT"):
        scales.append(float(state.loss_scale))
        params, state = step(jnp.ones(2) * (1.0 if finite else jnp.inf), state, params)
    jax.effects_barrier()
    assert history.steps.tolist() == list(range(7))
    assert history.loss_scales.tolist() == scales == [8.0, 8.0, 16.0, 8.0, 8.0, 4.0, 2.0]
    assert history.skipped.tolist() == [not f for f in as_bools("TTFTFFT")]
    assert np.isnan(history.losses).all()  # update never sees the loss


def test_history_in_a_scan_is_in_order_and_continues_a_record():
    history = lossscale.History()
    history.append(41, 1.0, False)  # e.g. restored from a CSV of an earlier run
    opt = lsj.loss_scale_optimizer(optax.adam(0.1), initial_scale=4.0, dynamic_growth_steps=1, history=history)
    pattern = as_bools("TFTTFT")

    def body(carry, finite):
        params, state = carry
        grads = jnp.where(finite, 1.0, jnp.inf) * jnp.ones(3)
        updates, state = opt.update(grads, state, params)
        return (optax.apply_updates(params, updates), state), state.loss_scale

    _, after = jax.jit(lambda c: jax.lax.scan(body, c, jnp.array(pattern)))((jnp.ones(3), opt.init(jnp.ones(3))))
    jax.effects_barrier()
    assert history.steps.tolist() == list(range(41, 48))
    assert history.loss_scales[1:].tolist() == [4.0, *np.asarray(after)[:-1].tolist()]
    assert history.skipped[1:].tolist() == [not f for f in pattern]


def test_no_history_stages_no_callback_and_history_stages_one():
    def jaxpr(opt):
        return jax.make_jaxpr(opt.update)(jnp.ones(2), opt.init(jnp.ones(2)), jnp.ones(2)).jaxpr

    def primitives(opt):
        return [eqn.primitive.name for eqn in jaxpr(opt).eqns]  # the top level: the record is outside the skip's cond

    assert "callback" not in str(jaxpr(lsj.loss_scale_optimizer(optax.sgd(0.1))))  # nowhere, nested ones included
    assert primitives(lsj.loss_scale_optimizer(optax.sgd(0.1), history=lossscale.History())).count("debug_callback") == 1


def test_history_under_pmap_records_each_step_once():
    history = lossscale.History()
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=8.0, axis_name="d", history=history)
    n = jax.local_device_count()
    states = jax.pmap(opt.init)(jnp.zeros((n, 2)))
    update = jax.pmap(opt.update, axis_name="d")
    for finite in (True, False):
        _, states = update(jnp.full((n, 2), 1.0 if finite else jnp.inf), states, jnp.zeros((n, 2)))
    jax.effects_barrier()
    assert history.steps.tolist() == [0, 1] and history.skipped.tolist() == [False, True]


def test_the_refinements_go_to_the_core_function(monkeypatch):
    # One resolver for every binding: the JAX constructor passes the three keywords to lossscale.resolve_loss_scale.
    import lossscale.jax._optimizer as optimizer_module

    calls = []

    def spy(loss_scale=None, *, dynamic=None, initial_scale=None, dynamic_growth_steps=None,
            min_loss_scale=None, max_loss_scale=None, hysteresis=None):
        calls.append((min_loss_scale, max_loss_scale, hysteresis))
        return lossscale.DynamicLossScale(8.0, 2, hysteresis=hysteresis)

    monkeypatch.setattr(optimizer_module, "resolve_loss_scale", spy)
    opt = lsj.loss_scale_optimizer(optax.sgd(0.1), hysteresis=3)
    assert calls == [(None, None, 3)]
    assert float(opt.init(jnp.zeros(1)).loss_scale) == 8.0
