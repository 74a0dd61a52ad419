"""One tf.distribute scenario per process (run by test_keras_strategy.py; the mwms cases by hand): ``python strategy_worker.py CASE``.

TensorFlow is split into two logical CPUs before it starts (MirroredStrategy), or joins a two-worker cluster
from TF_CONFIG (MultiWorkerMirroredStrategy, one CPU per worker). An Inf is put into one replica's share of the
batch only; every replica must skip: weights bit-identical, iterations unchanged, one backoff, skipped_steps 1.
Exits non-zero with the failed assertion.
"""

from __future__ import annotations

import json
import os
import sys

if __name__ != "__main__":  # pytest's --doctest-modules imports every module; this one is a script
    import pytest

    pytest.skip("a script run in a subprocess by test_keras_strategy.py", allow_module_level=True)

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

CASE = sys.argv[1]
MULTI_WORKER = CASE.startswith("mwms")
if not MULTI_WORKER:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras
import numpy as np

import lossscale.keras as lsk

keras.config.disable_traceback_filtering()

if MULTI_WORKER:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    TASK = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
else:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    TASK = 0
assert strategy.num_replicas_in_sync == 2, strategy.num_replicas_in_sync

rng = np.random.default_rng(0)
X = rng.standard_normal((32, 8)).astype(np.float32)
Y = rng.standard_normal((32, 1)).astype(np.float32)
BAD = X.copy()
BAD[20, 3] = np.inf  # in the second half of the batch: replica 1's share (worker 1's under MWMS)


def build(batch_in_replica: int = 16):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-2), initial_scale=2.0**10)
    model.compile(optimizer=opt, loss="mse")
    opt.build(model.trainable_variables)
    return model, opt


def per_replica(variable) -> list[np.ndarray]:
    """Every local copy of a (mirrored) variable."""
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return [np.array(c.numpy()) for c in strategy.experimental_local_results(value)]


def snapshot(model, opt) -> list[list[np.ndarray]]:
    return [per_replica(v) for v in model.trainable_variables + opt.inner_optimizer.variables]


def check_skipped(model, opt, before) -> None:
    after = snapshot(model, opt)
    for b, a in zip(before, after):
        for copy_b, copy_a in zip(b, a):
            assert np.array_equal(copy_b, copy_a), "a replica's weights or slots changed on a skipped step"
    for name, variable, expected in (
        ("loss scale", opt.dynamic_scale, 2.0**9),
        ("skipped_steps", next(v for v in opt.variables if v.name == "skipped_steps"), 1),
        ("iterations", opt.iterations, 0),
    ):
        values = [float(v) for v in per_replica(variable)]
        assert values == [expected] * len(values), (name, values)


def data(x, y, global_batch=32):
    # Unshuffled, so that with auto-sharding off each replica's half is fixed (rows 0-15, 16-31 of the batch).
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options) if MULTI_WORKER else ds


def fit_case() -> None:
    with strategy.scope():
        model, opt = build()
    before = snapshot(model, opt)
    model.fit(data(BAD, Y), epochs=1, verbose=0)
    check_skipped(model, opt, before)
    # TF's properties are tensors, read as numbers under the strategy as on one device (not mirrored variables).
    read = (float(opt.loss_scale), int(opt.skipped_steps), int(opt.dynamic_counter), bool(opt.last_step_skipped))
    assert read == (2.0**9, 1, 0, True), read
    # A finite step now applies on every replica alike, as one device does on the whole batch.
    model.fit(data(X, Y), epochs=1, verbose=0)
    assert int(per_replica(opt.iterations)[0]) == 1
    copies = snapshot(model, opt)
    for c in copies:
        assert all(np.array_equal(c[0], other) for other in c[1:]), "replicas disagree after a finite step"
    reference, _ = build()
    reference.fit(X, Y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    if not MULTI_WORKER:
        for mine, theirs in zip(model.trainable_variables, reference.trainable_variables):
            np.testing.assert_allclose(per_replica(mine)[0], theirs.numpy(), rtol=1e-5, atol=1e-6)


def loop_case(aggregate: bool) -> None:
    """The seeds' custom loop: get_scaled_loss, tape.gradient, get_unscaled_gradients, apply_gradients."""
    with strategy.scope():
        model, opt = build()
    loss_fn = keras.losses.MeanSquaredError(reduction="sum")

    @tf.function
    def train(x, y):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x)) / 32.0
                scaled = opt.get_scaled_loss(loss)
            grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
            if not aggregate:  # seed 001's example: the user sums over the replicas
                grads = tf.distribute.get_replica_context().all_reduce("sum", grads)
            opt.apply_gradients(zip(grads, model.trainable_variables), experimental_aggregate_gradients=aggregate)

        strategy.run(step, args=(x, y))

    dist = iter(strategy.experimental_distribute_dataset(data(BAD, Y)))
    before = snapshot(model, opt)
    train(*next(dist))
    check_skipped(model, opt, before)
    dist = iter(strategy.experimental_distribute_dataset(data(X, Y)))
    train(*next(dist))
    reference, _ = build()
    with tf.GradientTape() as tape:
        loss = loss_fn(Y, reference(X)) / 32.0
    grads = tape.gradient(loss, reference.trainable_variables)
    reference.optimizer.inner_optimizer.apply(grads, reference.trainable_variables)
    for mine, theirs in zip(model.trainable_variables, reference.trainable_variables):
        for copy in per_replica(mine):  # gradients divided by the scale once, on every replica (defect 6)
            np.testing.assert_allclose(copy, theirs.numpy(), rtol=1e-5, atol=1e-6)


if CASE.endswith("fit"):
    fit_case()
elif CASE.endswith("loop"):
    loop_case(aggregate=True)
elif CASE.endswith("loop_user_sum"):
    loop_case(aggregate=False)
else:
    raise SystemExit(f"unknown case {CASE}")
print(f"ok {CASE} task {TASK}")
