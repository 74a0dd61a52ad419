"""Keras 3 on JAX: what ``fit``'s train step runs on a GPU, counted on this CPU, and the GPU's finite check run here.

XLA's GPU runtime reads each conditional's predicate on the host before it launches the branch: a wait on every
step. ``benchmarks/kernel_count_jax.py`` counts those reached on every step of the StableHLO ``jax.export`` gives
for CUDA. The default step runs none (the finite check is ``isfinite(max|g|)`` per gradient and the skip a
``where`` fused into the update); with statistics, one (the sample's)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import ops

import lossscale
import lossscale.keras as lsk
from tests.keras.kutil import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="JAX's exported StableHLO; XLA reads predicates on the host")


def _model(optimizer):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 6)).astype("float32"), rng.normal(size=(8, 2)).astype("float32")


@pytest.mark.parametrize(("kwargs", "most"), [
    ({}, 0), ({"loss_scale": 2.0**10}, 0), ({"initial_scale": 2.0**-3, "min_loss_scale": 2.0**-6}, 0),
    ({"stats_every": 16}, 1), ({"loss_scale": "auto"}, 1),
], ids=["default", "fixed", "scale-below-1", "stats_every=16", "auto"])
def test_fits_step_exported_for_cuda_runs_no_conditional_but_the_samples(kwargs, most):
    from benchmarks.kernel_count_jax import count_conditionals

    model = _model(lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-3), **kwargs))
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # builds the optimizer and the metrics
    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in model.optimizer.variables], [v.value for v in model.metrics_variables])
    assert count_conditionals(model.train_step, state, (x, y)) == most


@pytest.mark.parametrize(("policy", "every"), [("dynamic", None), ("dynamic", 2), ("auto", 2)])
def test_fit_with_the_gpus_check_and_select_is_the_cpus_bit_for_bit(policy, every, monkeypatch):
    """fit with the step it takes off the CPU (the check ``isfinite(max|g|)``, the skip a ``where``), run here,
    gives the CPU's weights, optimizer variables and scale state bit for bit, over batches with a NaN or an Inf."""
    import lossscale.keras._grads as grads_module

    x, y = _data()
    x = np.concatenate([x] * 6)
    y = np.concatenate([y] * 6)
    y[8 * 1 + 2, 0] = np.nan  # batch 1: a NaN in the loss
    y[8 * 3 + 1, 1] = np.inf  # batch 3: an Inf

    def run():
        loss_scale = lossscale.DynamicLossScale(2.0**4, 2) if policy == "dynamic" else "auto"
        model = _model(lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-2), loss_scale, stats_every=every))
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
        return [ops.convert_to_numpy(v).tobytes() for v in [*model.weights, *model.optimizer.variables]], \
            int(ops.convert_to_numpy(model.optimizer.skipped_steps))

    on_cpu, skipped = run()
    monkeypatch.setattr(grads_module, "by_platform", lambda cpu, other, like=(): other())
    off_cpu, _ = run()
    assert skipped == 4  # the NaN and the Inf, in each epoch
    assert off_cpu == on_cpu


@pytest.mark.parametrize("kwargs", [{}, {"stats_every": 2}, {"loss_scale": "auto"}], ids=["default", "stats", "auto"])
def test_an_eager_fit_compiles_nothing_once_warm(kwargs):
    """``run_eagerly=True`` on JAX: the skip, the sum check's fallback and the sample's decision are Python ``if``s
    on the concrete flags, so a warm step compiles no XLA program (a ``cond`` of new closures compiled one at every
    call: about 25x a plain eager step, where it is now under 2x)."""
    from benchmarks.bench_eager import compiles

    x, y = _data()
    bad = x.copy()
    bad[0, 0] = np.inf
    model = _model(lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-3), **kwargs))
    model.compile(optimizer=model.optimizer, loss="mse", run_eagerly=True)

    def run() -> None:
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
        model.fit(bad, y, batch_size=8, epochs=1, verbose=0)

    run()
    run()  # every operator of both paths has run once (their own compiles)
    assert compiles(run) == 0
    assert int(model.optimizer.skipped_steps) == 3 and int(model.optimizer.iterations) == 6
