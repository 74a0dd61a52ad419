"""Habits brought from optax and jmp: ``history=`` under ``jax.vmap`` (refused before anything runs, with the fix),
and ``optax.inject_hyperparams`` (inside the wrapper a skipped step leaves the schedule's count alone; around it,
optax counts every update, skipped or not: docs/jax.md's recipe)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale
import lossscale.jax as lsj

# ----------------------------------------------------------------------------- history= under vmap

VMAP_FIX = (r"history= does not support jax.vmap over the optimizer: every member would append its own row .* "
            r"Drop history= and record outside vmap: after each vmapped step, state.loss_scale and "
            r"state.last_step_skipped hold one value per member")


@pytest.mark.parametrize("given", ["History()", "True"])
@pytest.mark.parametrize("wrap", ["vmap", "jit(vmap)", "vmap(jit)"])
def test_history_under_vmap_is_refused_before_any_row(wrap, given):
    tx = lsj.loss_scale_optimizer(optax.sgd(0.1), 4.0, history=lossscale.History() if given == "History()" else True)
    history = tx.history
    params = jnp.ones((3, 2))  # three members
    state = jax.vmap(tx.init)(params)
    update = {"vmap": jax.vmap(tx.update), "jit(vmap)": jax.jit(jax.vmap(tx.update)),
              "vmap(jit)": jax.vmap(jax.jit(tx.update))}[wrap]
    with pytest.raises(ValueError, match=VMAP_FIX):
        update(params, state, params)
    assert len(history) == 0


def test_the_fix_records_the_members_as_a_column_outside_vmap():
    tx = lsj.loss_scale_optimizer(optax.sgd(0.1), initial_scale=4.0)
    params = jnp.ones((3, 2))
    state = jax.vmap(tx.init)(params)
    update = jax.jit(jax.vmap(tx.update))
    scales, skipped = [], []
    for bad in (None, 1):
        grads = params if bad is None else params.at[bad, 0].set(jnp.inf)
        _, state = update(grads, state, params)
        scales.append(np.asarray(state.loss_scale))
        skipped.append(np.asarray(state.last_step_skipped))
    np.testing.assert_array_equal(np.stack(scales), [[4.0, 4.0, 4.0], [4.0, 2.0, 4.0]])
    np.testing.assert_array_equal(np.stack(skipped), [[False, False, False], [False, True, False]])


def test_history_without_vmap_still_records_one_row_per_step():
    history = lossscale.History()
    tx = lsj.loss_scale_optimizer(optax.sgd(0.1), 4.0, history=history)
    params = jnp.ones(2)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for g in (params, params.at[0].set(jnp.nan)):
        _, state = update(g, state, params)
    jax.effects_barrier()
    assert list(history.steps) == [0, 1] and list(history.skipped) == [False, True]


# ----------------------------------------------------------------------------- optax.inject_hyperparams

SCHEDULE = optax.linear_schedule(1.0, 0.0, 10)
GRADS = [jnp.ones(2), jnp.array([jnp.inf, 1.0]), jnp.ones(2), jnp.ones(2)]


def _run(tx, count_of):
    params = jnp.zeros(2)
    state = tx.init(params)
    update = jax.jit(tx.update)
    counts, updates = [], []
    for g in GRADS:
        u, state = update(g * 4.0, state, params)  # gradients of the loss scaled by 4
        counts.append(int(count_of(state)))
        updates.append(float(u[1]))
    return counts, updates


def test_inject_hyperparams_inside_the_wrapper_skips_the_schedule_too():
    """The recipe: the schedule's count is the inner state's, which a skipped step keeps."""
    tx = lsj.loss_scale_optimizer(optax.inject_hyperparams(optax.sgd)(learning_rate=SCHEDULE), 4.0)
    counts, updates = _run(tx, lambda s: s.inner_state.count)
    assert counts == [1, 1, 2, 3]
    np.testing.assert_allclose(updates, [-1.0, 0.0, -0.9, -0.8], rtol=1e-6)  # as if the skipped step never ran
    reference = optax.inject_hyperparams(optax.sgd)(learning_rate=SCHEDULE)
    ref_state = reference.init(jnp.zeros(2))
    for g in (GRADS[0], GRADS[2], GRADS[3]):
        ref_update, ref_state = reference.update(g, ref_state)
    np.testing.assert_allclose(updates[-1], float(ref_update[1]), rtol=1e-6)
    by_hand = lsj.loss_scale_optimizer(optax.inject_hyperparams(optax.sgd)(learning_rate=1.0), 4.0)
    state = by_hand.init(jnp.zeros(2))
    state.inner_state.hyperparams["learning_rate"] = jnp.float32(0.5)  # set by hand, as optax documents
    u, _ = by_hand.update(jnp.ones(2) * 4.0, state, jnp.zeros(2))
    np.testing.assert_allclose(np.asarray(u), [-0.5, -0.5])


def test_inject_hyperparams_around_the_wrapper_counts_skipped_steps():
    """What differs: optax's wrapper counts every update it sees, skipped or not (docs/jax.md)."""
    tx = optax.inject_hyperparams(lambda learning_rate: lsj.loss_scale_optimizer(optax.sgd(learning_rate), 4.0))(
        learning_rate=SCHEDULE
    )
    counts, updates = _run(tx, lambda s: s.count)
    assert counts == [1, 2, 3, 4]
    np.testing.assert_allclose(updates, [-1.0, 0.0, -0.8, -0.7], rtol=1e-6)


@pytest.mark.parametrize("policy, stats_every", [("dynamic", None), ("dynamic", 2), ("auto", 2)])
def test_an_eager_update_compiles_nothing_once_warm(policy, stats_every):
    """Called outside ``jit`` (eager code, as optax allows), an update compiles no new XLA program once each of its
    operators has run: the CPU's exact check after a non-finite sum is a Python ``if`` there, where a ``lax.cond``
    of new closures compiled a program at every call (about 100 ms)."""
    from benchmarks.bench_eager import compiles

    params = {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)}
    tx = lsj.loss_scale_optimizer(optax.adam(1e-3), policy, stats_every=stats_every)
    state = tx.init(params)
    finite = jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.5), params)
    bad = {"w": finite["w"].at[0, 0].set(jnp.inf), "b": finite["b"]}
    cycle = [finite, bad, finite, finite]

    def run() -> None:
        nonlocal state
        for grads in cycle:
            _, state = tx.update(grads, state, params)

    run()
    run()  # every operator of both paths has run once (their own compiles)
    assert compiles(run) == 0
    assert int(state.skipped_steps) == 3
    if policy == "dynamic":
        assert float(state.loss_scale) == 2.0**15 / 8
