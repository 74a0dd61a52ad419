"""flax: linen TrainState (flax's, and lossscale's that counts applied steps only) and nnx.Optimizer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale
import lossscale.jax as lsj

pytest.importorskip("flax", reason="the flax tests need flax (in the dev extra): pip install flax")
from flax import linen as nn
from flax import nnx
from flax.training import train_state

from lossscale.jax.train_state import TrainState

X = jnp.asarray(np.random.default_rng(0).normal(size=(16, 4)), jnp.float32)
Y = jnp.asarray(np.random.default_rng(1).normal(size=(16, 2)), jnp.float32)
POISON = [1.0, 1.0, jnp.inf, 1.0, jnp.nan, jnp.nan, 1.0]  # steps 2, 4 and 5 overflow


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(nn.tanh(nn.Dense(8)(x)))


def linen_run(state_cls):
    model = MLP()
    tx = lsj.loss_scale_optimizer(optax.adam(0.01), 2.0**10)
    state = state_cls.create(apply_fn=model.apply, params=model.init(jax.random.PRNGKey(0), X), tx=tx)

    @jax.jit
    def train_step(state, poison):
        def loss_fn(params):
            return jnp.mean((state.apply_fn(params, X) - Y) ** 2) * poison

        loss, grads = lsj.value_and_grad(loss_fn, state.opt_state)(state.params)
        return state.apply_gradients(grads=grads), loss

    losses = []
    for poison in POISON:
        state, loss = train_step(state, jnp.float32(poison))
        losses.append(float(loss))
    return state, losses


def test_linen_flax_train_state_counts_every_call_and_the_correction_gives_applied_steps():
    state, losses = linen_run(train_state.TrainState)
    ls = lsj.find_state(state.opt_state)
    assert int(state.step) == len(POISON)  # flax's step counts skipped steps too
    assert int(ls.skipped_steps) == 3
    assert int(state.step - ls.skipped_steps) == 4 == int(state.opt_state.inner_state[0].count)  # Adam's count
    assert losses[1] > losses[3] > losses[6]  # it trains


def test_linen_lossscale_train_state_counts_applied_steps_and_matches_flax_params():
    ours, _ = linen_run(TrainState)
    flaxs, _ = linen_run(train_state.TrainState)
    assert int(ours.step) == 4 == int(ours.opt_state.inner_state[0].count)
    assert bool(lsj.find_state(ours.opt_state).last_step_skipped) is False
    for a, b in zip(jax.tree.leaves(ours.params), jax.tree.leaves(flaxs.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


class Linear(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(4, 8, rngs=rngs)
        self.l2 = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.tanh(self.l1(x)))


def test_nnx_optimizer_skips_and_its_state_reads_as_arrays():
    model = Linear(nnx.Rngs(0))
    tx = lsj.loss_scale_optimizer(optax.adam(0.01), lossscale.DynamicLossScale(2.0**10))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, poison):
        def loss_fn(model):
            return jnp.mean((model(X) - Y) ** 2) * poison

        loss, grads = lsj.value_and_grad(loss_fn, optimizer.opt_state)(model)
        optimizer.update(model, grads)
        return loss

    seen = []
    for poison in POISON:
        before = jax.tree.map(jnp.copy, nnx.state(model, nnx.Param))
        loss = train_step(model, optimizer, jnp.float32(poison))
        state = optimizer.opt_state
        skipped = state.last_step_skipped  # OptArray leaves: read through jnp.asarray
        assert isinstance(skipped, jax.Array) and skipped.dtype == jnp.bool_
        assert isinstance(state.loss_scale, jax.Array) and isinstance(state.consecutive_skips, jax.Array)
        unchanged = all(
            np.array_equal(np.asarray(a), np.asarray(b))
            for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(nnx.state(model, nnx.Param)))
        )
        assert unchanged == bool(skipped) == (poison != 1.0)
        seen.append((float(state.loss_scale), int(state.consecutive_skips), bool(np.isfinite(float(loss)))))
    assert seen == [
        (1024, 0, True), (1024, 0, True), (512, 1, False), (512, 0, True), (256, 1, False), (128, 2, False),
        (128, 0, True),
    ]
    assert int(lsj.find_state(optimizer.opt_state).skipped_steps) == 3
    assert int(optimizer.step[...]) == len(POISON)  # nnx's step, like linen's, counts every update() call


def test_find_state_in_a_tuple_beside_another_optimizers_state():
    """A tuple of two optimizers' states (an actor's and a critic's) is not a chain that clips first: the other
    optimizer's state holds arrays, not only stateless EmptyStates (it was refused in one order and not the other).
    A chain that runs a stateless transformation, or a chain of them, first is still refused."""
    p = jnp.ones(2)
    mine = lsj.loss_scale_optimizer(optax.adam(1e-3), 8.0).init(p)
    other = optax.adam(1e-3).init(p)
    assert float(lsj.find_state((other, mine)).loss_scale) == 8.0
    assert float(lsj.find_state((mine, other)).loss_scale) == 8.0
    for first in (optax.clip_by_global_norm(1.0), optax.chain(optax.clip(1.0), optax.scale(2.0)), optax.zero_nans()):
        chained = optax.chain(first, lsj.loss_scale_optimizer(optax.adam(1e-3), 8.0))
        with pytest.raises(ValueError, match="before loss_scale_optimizer"):
            lsj.find_state(chained.init(p))


class NormDropout(nnx.Module):
    """A model with state besides its parameters: BatchNorm's running statistics and Dropout's RNG stream."""

    def __init__(self, rngs):
        self.l1 = nnx.Linear(4, 8, rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.l2 = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.drop(nnx.relu(self.bn(self.l1(x)))))


def nnx_norm_dropout_run(grad_of):
    model = NormDropout(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, lsj.loss_scale_optimizer(optax.adam(0.01), 2.0**10), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, poison):
        def loss_fn(model):
            return jnp.mean((model(X) - Y) ** 2) * poison

        loss, grads = grad_of(loss_fn, optimizer)(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(train_step(model, optimizer, jnp.float32(poison))) for poison in POISON]
    return model, optimizer, losses


def as_numbers(leaf):
    return np.asarray(jax.random.key_data(leaf) if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) else leaf)


def test_nnx_value_and_grad_keeps_batchnorm_statistics_and_dropout_rngs_moving():
    # lsj.value_and_grad on an nnx Module is nnx.value_and_grad of the scaled loss: the running statistics and the
    # RNG stream that the forward pass updates are written back, as nnx.value_and_grad writes them back (JAX's
    # value_and_grad over the Module would refuse the RNG key, and drop the BatchNorm update without a word).
    ours = nnx_norm_dropout_run(lambda f, opt: lambda m: lsj.value_and_grad(f)(m, opt_state=opt.opt_state))

    def nnx_two_call_form(f, opt):  # nnx's own transform of the scaled loss, returning the true loss
        def scaled(m):
            loss = f(m)
            return lsj.get_scaled_loss(loss, opt.opt_state), loss

        grad_fn = nnx.value_and_grad(scaled, has_aux=True)

        def loss_and_grads(m):
            (_, loss), grads = grad_fn(m)
            return loss, grads

        return loss_and_grads

    reference = nnx_norm_dropout_run(nnx_two_call_form)
    (model, optimizer, losses), (ref_model, ref_optimizer, ref_losses) = ours, reference
    assert int(model.drop.rngs.count[...]) == int(ref_model.drop.rngs.count[...]) == len(POISON)
    assert not np.allclose(np.asarray(model.bn.mean[...]), 0.0)  # the statistics moved
    for mine, theirs in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(ref_model))):
        np.testing.assert_array_equal(as_numbers(mine), as_numbers(theirs))  # params, statistics, RNG keys
    np.testing.assert_array_equal(losses, ref_losses)
    assert int(lsj.find_state(optimizer.opt_state).skipped_steps) == 3
    assert float(optimizer.opt_state.loss_scale) == float(ref_optimizer.opt_state.loss_scale) == 2.0**10  # fixed


@pytest.mark.parametrize("argnums", [-1, (-1,), 1], ids=["-1", "(-1,)", "1"])
def test_nnx_value_and_grad_takes_a_negative_argnums(argnums):
    # nnx.value_and_grad does not count a negative argnums from the end (with a Dropout's RNG state it then
    # differentiates the key); lsj.value_and_grad gives it the position counted from the front.
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.linear, self.drop = nnx.Linear(3, 2, rngs=rngs), nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.drop(self.linear(x))

    def loss(x, model):
        return (model(x) ** 2).mean()

    x = jnp.ones((4, 3))
    state = lsj.loss_scale_optimizer(optax.sgd(0.1), 2.0**4).init(nnx.state(Net(nnx.Rngs(0, dropout=1)), nnx.Param))
    got_loss, grads = lsj.value_and_grad(loss, argnums=argnums)(x, Net(nnx.Rngs(0, dropout=1)), opt_state=state)
    ref_loss, ref_grads = nnx.value_and_grad(lambda x, m: 2.0**4 * loss(x, m), argnums=1)(
        x, Net(nnx.Rngs(0, dropout=1)))
    np.testing.assert_allclose(float(got_loss), float(ref_loss) / 2.0**4, rtol=1e-6)
    grads = grads[0] if isinstance(argnums, tuple) else grads
    for mine, theirs in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=1e-6)
