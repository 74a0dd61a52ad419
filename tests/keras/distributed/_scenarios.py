"""Distributed scenarios for the Keras loss-scale optimizers, one per process: run as a script, print one JSON line.

    python tests/keras/distributed/_scenarios.py SCENARIO CLASS [ARG...]

CLASS is ``lossscale`` (``lossscale.keras.LossScaleOptimizer``) or ``keras`` (Keras 3's own
``keras.optimizers.LossScaleOptimizer``, the control). The script sets its own KERAS_BACKEND, XLA_FLAGS and
logical devices before TensorFlow/JAX start, so it must be a fresh process. It prints ``RESULT <json>`` as its
last stdout line (``_runner.py`` parses it); every phase that raises is recorded as ``{"error": ...}`` instead.

The skip scenarios take three snapshots, each a list with one record per replica (device or worker):
``before`` (built, nothing applied), ``after_bad`` (one step whose FIRST replica's shard holds an Inf in x;
the MSE loss carries it into every gradient of that replica) and ``after_good`` (one clean step). A record
holds each weight's and each inner optimizer variable's raw bytes (hex) and the scale state as numbers.

Optimizer settings: Adam(0.01) (so slots move on a clean step), initial_scale=1024, dynamic_growth_steps as
the scenario needs. Models: Dense(2 -> 4, tanh) -> Dense(1), a batch of 4 rows (2 per replica).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback

MARK = "RESULT "
INITIAL_SCALE = 1024.0
GLOBAL_BATCH = 4


# ---------------------------------------------------------------------------------------------- process set-up


def setup(backend: str, devices: int = 2) -> None:
    """Fixes the backend and the device count before the framework starts (once per process)."""
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if backend == "jax":
        flags = os.environ.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=", "--_old=")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
        os.environ["JAX_PLATFORMS"] = "cpu"
    if backend == "tensorflow" and devices > 1:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)


def make_optimizer(cls: str, growth_steps: int = 100):
    import keras

    inner = keras.optimizers.Adam(0.01)
    if cls == "lossscale":
        import lossscale.keras as lsk

        return lsk.LossScaleOptimizer(inner, initial_scale=INITIAL_SCALE, dynamic_growth_steps=growth_steps)
    if cls == "keras":
        return keras.optimizers.LossScaleOptimizer(
            inner, initial_scale=INITIAL_SCALE, dynamic_growth_steps=growth_steps
        )
    raise ValueError(f"unknown optimizer class {cls!r}: lossscale or keras")


def make_model():
    import keras

    keras.utils.set_random_seed(7)
    return keras.Sequential(
        [keras.Input((2,)), keras.layers.Dense(4, activation="tanh", name="hidden"), keras.layers.Dense(1, name="out")]
    )


def data(bad_replica: int | None = None, rows: int = GLOBAL_BATCH, replicas: int = 2):
    """``rows`` rows of x and y; the rows of replica ``bad_replica``'s shard (rows split evenly, in order)
    hold an Inf in x."""
    import numpy as np

    x = np.linspace(-1.0, 1.0, 2 * rows, dtype=np.float32).reshape(rows, 2)
    y = (x @ np.array([[0.5], [-1.5]], np.float32)).astype(np.float32)
    if bad_replica is not None:
        part = rows // replicas
        x[bad_replica * part : (bad_replica + 1) * part, 0] = np.inf
    return x, y


# ---------------------------------------------------------------------------------------------- snapshots


def _hex(array) -> str:
    import numpy as np

    return np.ascontiguousarray(array).tobytes().hex()


def _components(variable) -> list:
    """One numpy array per local replica: a tf.distribute variable's components, a JAX array's device shards
    (in device order), or the single value."""
    import numpy as np

    value = getattr(variable, "value", variable)
    if callable(value):  # tf.Variable.value is a method
        value = variable
    values = getattr(value, "values", None)
    if isinstance(values, tuple) and values:
        return [np.array(v.numpy()) for v in values]
    shards = getattr(value, "addressable_shards", None)
    # A JAX array split over devices (ModelParallel) is compared whole: its shards differ by design.
    if shards is not None and len(shards) > 1 and value.sharding.is_fully_replicated:
        ordered = sorted(shards, key=lambda s: s.device.id)
        return [np.array(s.data) for s in ordered]
    return [np.array(value)]


def _scalar(variable, replica: int):
    if variable is None:
        return None
    parts = _components(variable)
    value = parts[replica if len(parts) > 1 else 0]
    return value.item()


def snapshot(model, opt) -> list[dict]:
    """One record per local replica (see the module docstring)."""
    weights = [_components(v) for v in model.trainable_variables]
    inner = opt.inner_optimizer
    slots = {v.path: _components(v) for v in inner.variables}
    count = max(len(w) for w in weights)
    records = []
    for r in range(count):

        def pick(parts, r=r):
            return parts[r if len(parts) > 1 else 0]

        records.append(
            {
                "weights": [_hex(pick(w)) for w in weights],
                "weights_finite": bool(all(__import__("numpy").isfinite(pick(w)).all() for w in weights)),
                "slots": {name: _hex(pick(parts)) for name, parts in slots.items() if not name.endswith("iteration")},
                "iterations": _scalar(opt.iterations, r),
                "inner_iterations": _scalar(inner.iterations, r),
                "scale": _scalar(getattr(opt, "dynamic_scale", None), r),
                "step_counter": _scalar(getattr(opt, "step_counter", None), r),
                "skipped_steps": _skipped(opt, r),
            }
        )
    return records


def _skipped(opt, replica: int):
    variable = getattr(opt, "_skipped_steps_variable", None)
    if variable is not None:
        return _scalar(variable, replica)
    if hasattr(type(opt), "skipped_steps"):
        import numpy as np

        return int(np.array(opt.skipped_steps))
    return None  # Keras' own class keeps no such counter


def phase(result: dict, name: str, fn):
    """Runs ``fn`` and stores its value under ``name``, or the error that it raised."""
    start = time.perf_counter()
    try:
        result[name] = fn()
        return True
    except Exception as error:  # noqa: BLE001 - recorded for the test to report
        lines = traceback.format_exception_only(type(error), error)
        message = re.sub(r"\x1b\[[0-9;]*m", "", "".join(lines)).strip()
        trace = re.sub(r"\x1b\[[0-9;]*m", "", "".join(traceback.format_exception(error)))
        result[name] = {
            "error": message[-1500:],
            "where": _where(error),
            "traceback": trace if len(trace) < 6000 else trace[:3000] + "\n...\n" + trace[-3000:],
        }
        return False
    finally:
        result.setdefault("seconds", {})[name] = round(time.perf_counter() - start, 2)


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if "lossscale" in f.filename or "keras/src/optimizers" in f.filename]
    frame = (ours or frames or [None])[-1]
    return f"{frame.filename}:{frame.lineno} {frame.line}" if frame else ""


def emit(result: dict) -> None:
    sys.stdout.flush()
    print(MARK + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------- TF: training steps


def tf_fit_step(model, x, y, batch_size: int = GLOBAL_BATCH) -> None:
    """One ``fit`` step on one batch (``y`` None: ``x`` is a batched dataset of one batch)."""
    if y is None:
        import keras

        keras.config.disable_traceback_filtering()
        model.fit(x, epochs=1, verbose=0)
    else:
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)


def tf_loop(strategy, model, opt, cls: str, user_sum: bool = False):
    """The seeds' custom loop (seeds 001/002): ``strategy.run`` of get_scaled_loss -> tape.gradient ->
    get_unscaled_gradients -> apply_gradients inside one tf.function. Keras' own class has no
    get_scaled_loss/get_unscaled_gradients: the control runs Keras 3's contract (scale_loss -> tape.gradient ->
    apply_gradients, which unscales). With ``user_sum`` the loop all-reduces the unscaled gradients itself and
    passes ``experimental_aggregate_gradients=False``. Returns ``step(x_shards, y_shards)``, one shard per
    replica."""
    import tensorflow as tf

    variables = model.trainable_variables
    seeds = hasattr(opt, "get_unscaled_gradients")

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(model(x, training=True) - y), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
            scaled = opt.get_scaled_loss(loss) if seeds else opt.scale_loss(loss)
        grads = tape.gradient(scaled, variables)
        if seeds:
            grads = opt.get_unscaled_gradients(grads)
        if user_sum:
            grads = tf.distribute.get_replica_context().all_reduce("sum", grads)
            opt.apply_gradients(zip(grads, variables), experimental_aggregate_gradients=False)
        else:
            opt.apply_gradients(zip(grads, variables))

    @tf.function
    def step(x, y):
        strategy.run(replica_step, args=(x, y))

    def run(x_shards, y_shards):
        xs = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(x_shards[ctx.replica_id_in_sync_group])
        )
        ys = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(y_shards[ctx.replica_id_in_sync_group])
        )
        step(xs, ys)

    return run


def _compile(model, opt) -> None:
    model.compile(optimizer=opt, loss="mse", jit_compile=False)


def _skip_symbolic_reduce(model, dataset, _) -> None:
    """Works around Keras 3.15's ``fit`` under MultiWorkerMirroredStrategy, which fails for every optimizer
    before the first step: ``_maybe_symbolic_build`` all-reduces the first distributed batch eagerly and TF
    raises "Attempt to convert a value (PerReplica...) to a Tensor". The model is built here from a local batch
    instead, and fit's build hook is skipped. What is tested (the optimizer's step) is untouched."""
    batch = next(iter(dataset))
    model._maybe_symbolic_build(data_batch=batch)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
    # Second Keras 3.15 bug on the same path: the step's logs (scalars) are reduced with
    # strategy.reduce("MEAN", v, axis=0), which fails to trace ("Invalid reduction dimension 0 for input with 0
    # dimensions"). Reduce them as on one worker instead (each worker logs its own loss).
    from keras.src.backend.tensorflow import trainer

    trainer._collective_all_reduce_multi_worker = lambda strategy: False


def skip_scenario(strategy, cls: str, mode: str, shards, multi_worker: bool = False) -> dict:
    """Builds model and optimizer in ``strategy``'s scope, then: snapshot, bad step, snapshot, clean step,
    snapshot. ``shards(bad)`` gives the data: for ``fit`` an (x, y) batch, for ``loop`` per-replica lists."""
    result: dict = {"scenario": mode, "class": cls, "replicas": strategy.num_replicas_in_sync}
    state: dict = {}

    def build():
        with strategy.scope():
            state["model"] = model = make_model()
            state["opt"] = opt = make_optimizer(cls)
            if mode == "fit":
                _compile(model, opt)
                if multi_worker:
                    _skip_symbolic_reduce(model, *shards(False))
            opt.build(model.trainable_variables)
        if mode == "loop":
            state["step"] = tf_loop(strategy, model, opt, cls)
        return snapshot(model, opt)

    def step(bad: bool):
        def go():
            if mode == "fit":
                tf_fit_step(state["model"], *shards(bad))
            else:
                state["step"](*shards(bad))
            return snapshot(state["model"], state["opt"])

        return go

    if phase(result, "before", build) and phase(result, "after_bad", step(True)):
        phase(result, "after_good", step(False))
    return result


# ---------------------------------------------------------------------------------------------- TF scenarios


def _two_replicas(kind: str) -> object:
    """Two replicas on two logical CPUs: ``mirrored`` (MirroredStrategy), or ``central``
    (CentralStorageStrategy: the variables on one device, the compute on both)."""
    import tensorflow as tf

    if kind == "central":
        return tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"])
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def tf_mirrored(cls: str, mode: str, bad: str = "0", kind: str = "mirrored") -> dict:
    """Two replicas (:func:`_two_replicas` ``kind``) over two logical CPU devices; ``mode`` is ``fit`` or
    ``loop``; replica ``bad``'s shard holds the Inf."""
    setup("tensorflow", 2)
    strategy = _two_replicas(kind)
    half = GLOBAL_BATCH // 2

    def shards(bad_step: bool):
        x, y = data(bad_replica=int(bad) if bad_step else None)
        if mode == "fit":
            return x, y
        return [x[:half], x[half:]], [y[:half], y[half:]]

    return skip_scenario(strategy, cls, mode, shards)


def _mwms_strategy(index: str, ports: str) -> tuple[int, object]:
    """Worker ``index`` of a two-worker MultiWorkerMirroredStrategy on 127.0.0.1 ``ports`` ("p0,p1"): its strategy."""
    index_ = int(index)
    workers = [f"127.0.0.1:{p}" for p in ports.split(",")]
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index_}})
    setup("tensorflow", 1)
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING, timeout_seconds=30
    )
    return index_, tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def tf_mwms_worker(cls: str, mode: str, bad: str, index: str, ports: str) -> dict:
    """One worker of MultiWorkerMirroredStrategy (two processes on 127.0.0.1, one CPU replica each). Worker
    ``bad``'s data hold the Inf, the other's are clean. ``ports`` is "p0,p1", chosen free by the runner."""
    index_, strategy = _mwms_strategy(index, ports)
    import tensorflow as tf
    half = GLOBAL_BATCH // 2

    def shards(bad_step: bool):
        if mode == "fit":
            # Each worker's rows are all bad or all clean, so whichever part of its batch a worker keeps, only
            # worker ``bad``'s replica sees an Inf.
            x, y = data(bad_replica=0 if (bad_step and index_ == int(bad)) else None, replicas=1)
            dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
            return dataset.with_options(options), None
        # Indexed by the global replica id: worker i's replica runs shard i.
        x, y = data(bad_replica=int(bad) if bad_step else None)
        return [x[:half], x[half:]], [y[:half], y[half:]]

    result = skip_scenario(strategy, cls, mode, shards, multi_worker=True)
    result["worker"] = index_
    return result


# ---------------------------------------------------------------------------------------------- checkpoints


def tf_checkpoint_save(cls: str, directory: str) -> dict:
    """Under MirroredStrategy(2): fit one bad and one clean step (dynamic_growth_steps=2, so the next clean
    step grows the scale), save ``model.keras`` and a tf.train.Checkpoint ``ckpt``, then fit one more clean
    step and record the state it reaches (what a loader must reproduce)."""
    setup("tensorflow", 2)
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    result: dict = {"scenario": "checkpoint_save", "class": cls}
    state: dict = {}

    def train():
        with strategy.scope():
            state["model"] = model = make_model()
            state["opt"] = opt = make_optimizer(cls, growth_steps=2)
            _compile(model, opt)
        tf_fit_step(model, *data(bad_replica=0))
        tf_fit_step(model, *data())
        return snapshot(model, opt)

    def save():
        model = state["model"]
        model.save(os.path.join(directory, "model.keras"))
        checkpoint = tf.train.Checkpoint(model=model, optimizer=state["opt"])
        return checkpoint.write(os.path.join(directory, "ckpt"))

    def cont():
        tf_fit_step(state["model"], *data())
        return snapshot(state["model"], state["opt"])

    if phase(result, "saved", train) and phase(result, "save", save):
        phase(result, "continued", cont)
    return result


def tf_checkpoint_load(cls: str, directory: str, devices: str) -> dict:
    """Loads what :func:`tf_checkpoint_save` wrote, on one device without a strategy (``devices`` = 1) or
    under MirroredStrategy over that many logical CPUs, from the ``.keras`` file (result key ``keras``) and
    from the tf.train.Checkpoint (``ckpt``), each into its own model; each then fits one clean step (the
    save's batch on one device, 6 rows otherwise)."""
    count = int(devices)
    setup("tensorflow", count)
    import keras
    import tensorflow as tf

    if count > 1:
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(count)])
    else:
        strategy = tf.distribute.get_strategy()
    result: dict = {"scenario": "checkpoint_load", "class": cls, "replicas": count}

    def load(how: str, state: dict):
        with strategy.scope():
            if how == "keras":
                if cls == "lossscale":
                    import lossscale.keras  # noqa: F401 - registers the class for deserialization
                model = keras.models.load_model(os.path.join(directory, "model.keras"))
                opt = model.optimizer
            else:
                model = make_model()
                opt = make_optimizer(cls, growth_steps=2)
                _compile(model, opt)
                opt.build(model.trainable_variables)
                status = tf.train.Checkpoint(model=model, optimizer=opt).read(os.path.join(directory, "ckpt"))
                status.assert_existing_objects_matched()
        state["model"], state["opt"] = model, opt
        return snapshot(model, opt)

    def cont(state: dict):
        rows = GLOBAL_BATCH if count == 1 else 6
        tf_fit_step(state["model"], *data(rows=rows, replicas=count), batch_size=rows)
        return snapshot(state["model"], state["opt"])

    for how in ("keras", "ckpt"):
        part: dict = {}
        state: dict = {}
        if phase(part, "loaded", lambda how=how, state=state: load(how, state)):
            phase(part, "continued", lambda state=state: cont(state))
        result[how] = part
    return result


# ---------------------------------------------------------------------------------------------- JAX scenarios


def jax_distribution(cls: str, kind: str) -> dict:
    """``kind`` = ``data``: keras.distribution.DataParallel over 2 CPU devices (device 0's shard holds the
    Inf); ``model``: ModelParallel on a (batch=1, model=2) mesh, the hidden kernel split over ``model``."""
    setup("jax", 2)
    import jax
    import keras

    devices = jax.devices()
    if kind == "data":
        distribution = keras.distribution.DataParallel(devices=devices)
    else:
        mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices=devices)
        layout_map = keras.distribution.LayoutMap(mesh)
        layout_map[".*hidden/kernel"] = (None, "model")
        layout_map[".*hidden/bias"] = ("model",)
        distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    keras.distribution.set_distribution(distribution)
    result: dict = {"scenario": f"jax_{kind}", "class": cls, "replicas": len(devices)}
    state: dict = {}

    def build():
        state["model"] = model = make_model()
        state["opt"] = opt = make_optimizer(cls)
        _compile(model, opt)
        opt.build(model.trainable_variables)
        result["split_variables"] = [v.path for v in model.weights if not v.value.sharding.is_fully_replicated]
        return snapshot(model, opt)

    def step(bad: bool):
        def go():
            tf_fit_step(state["model"], *data(bad_replica=0 if bad else None))
            return snapshot(state["model"], state["opt"])

        return go

    if phase(result, "before", build) and phase(result, "after_bad", step(True)):
        phase(result, "after_good", step(False))
    return result


# ---------------------------------------------------------------------------------------------- statistics


def stats_rows(replica: int):
    """Replica ``replica``'s two rows of x (the first known, the second zeros) and y (-1): at W = 0, b = 0 the
    replica's kernel gradient of ``sum((x W + b - y)**2) / 4`` is ``0.5 * x[0]`` and its bias gradient 1. The
    two replicas' kernel gradients cancel at one entry, and each holds one float16 subnormal at scale 16 that the
    sum of the two does not: the per-replica statistics differ from those of the all-reduced gradient."""
    import numpy as np

    known = [[0.0, 1.0, 2.0**-19, -4.0], [0.0, -1.0, 2.0, 2.0**-19]][replica]
    x = np.array([known, [0.0] * 4], np.float32)
    return x, np.full((2, 1), -1.0, np.float32)


STATS_SCALE = 16.0


def stats_optimizer(policy: str):
    import keras

    import lossscale
    import lossscale.keras as lsk

    # auto samples every 2nd step: the first step is sampled through the ``cond``; dynamic measures every step.
    if policy == "auto":
        return lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), lossscale.AutoLossScale(STATS_SCALE), stats_every=2)
    return lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), initial_scale=STATS_SCALE, stats_every=1)


def stats_model():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="zeros", name="out")])


def stats_snapshot(opt) -> list[dict]:
    """Per local replica: the kept sample's 11 values, the sampler's count, the scale and the auto state."""
    stats = opt._scale_variables.stats
    parts = {"count": _components(stats.count), "scale": _components(opt.dynamic_scale)}
    parts.update({v.name: _components(v) for v in stats.sample + stats.auto})
    count = max(len(p) for p in parts.values())
    return [{k: p[r if len(p) > 1 else 0].tolist() for k, p in parts.items()} for r in range(count)]


def stats_scenario(strategy, policy: str, mode: str, shards, multi_worker: bool = False) -> dict:
    """One step of ``fit`` or of the seeds' loop on :func:`stats_rows`'s data; ``shards()`` gives it."""
    result: dict = {"scenario": f"stats_{mode}", "replicas": strategy.num_replicas_in_sync}
    state: dict = {}

    def go():
        with strategy.scope():
            state["model"] = model = stats_model()
            state["opt"] = opt = stats_optimizer(policy)
            if mode == "fit":
                _compile(model, opt)
                if multi_worker:
                    _skip_symbolic_reduce(model, *shards())
            opt.build(model.trainable_variables)
        if mode == "fit":
            tf_fit_step(model, *shards())
        else:
            tf_loop(strategy, model, opt, "lossscale", user_sum=mode == "loop_user_sum")(*shards())
        return stats_snapshot(opt)

    phase(result, "stats", go)
    return result


def tf_mirrored_stats(policy: str, mode: str, overflow: str = "", kind: str = "mirrored") -> dict:
    """Two replicas (:func:`_two_replicas` ``kind``) over two logical CPUs: the sample of one step (``fit`` or
    ``loop``) under ``policy`` (``dynamic`` or ``auto``); with ``overflow``, replica 1's kernel gradient holds an
    Inf (x = 2**126)."""
    setup("tensorflow", 2)
    import numpy as np

    strategy = _two_replicas(kind)
    rows = [stats_rows(r) for r in range(2)]
    if overflow:
        rows[1][0][0, 0] = 2.0**126

    def shards():
        if mode == "fit":
            return np.concatenate([x for x, _ in rows]), np.concatenate([y for _, y in rows])
        return [x for x, _ in rows], [y for _, y in rows]

    return stats_scenario(strategy, policy, mode, shards)


def tf_mwms_stats_worker(policy: str, mode: str, index: str, ports: str) -> dict:
    """One worker of a two-worker MultiWorkerMirroredStrategy (127.0.0.1), one CPU replica each: as
    :func:`tf_mirrored_stats`, worker ``i`` holding replica ``i``'s rows."""
    index_, strategy = _mwms_strategy(index, ports)
    import numpy as np
    import tensorflow as tf
    rows = [stats_rows(r) for r in range(2)]

    def shards():
        if mode == "fit":  # this worker's rows twice: whichever half of the batch it keeps, they are its own
            x, y = rows[index_]
            dataset = tf.data.Dataset.from_tensor_slices((np.tile(x, (2, 1)), np.tile(y, (2, 1)))).batch(4)
            opts = tf.data.Options()
            opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
            return dataset.with_options(opts), None
        return [x for x, _ in rows], [y for _, y in rows]

    result = stats_scenario(strategy, policy, mode, shards, multi_worker=True)
    result["worker"] = index_
    return result


def jax_distribution_stats(policy: str, kind: str = "data") -> dict:
    """keras.distribution over 2 CPU devices, ``DataParallel`` (``kind`` data) or ``ModelParallel`` with the
    kernel split over a (1, 2) mesh (``model``): the sample of one ``fit`` step on both replicas' rows (one
    global gradient)."""
    setup("jax", 2)
    import jax
    import keras
    import numpy as np

    if kind == "data":
        distribution = keras.distribution.DataParallel(devices=jax.devices())
    else:
        mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices=jax.devices())
        layout_map = keras.distribution.LayoutMap(mesh)
        layout_map[".*out/kernel"] = ("model", None)
        distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    keras.distribution.set_distribution(distribution)
    rows = [stats_rows(r) for r in range(2)]
    result: dict = {"scenario": "jax_stats", "replicas": 2}

    def go():
        model, opt = stats_model(), stats_optimizer(policy)
        _compile(model, opt)
        tf_fit_step(model, np.concatenate([x for x, _ in rows]), np.concatenate([y for _, y in rows]))
        return stats_snapshot(opt)

    phase(result, "stats", go)
    return result


SCENARIOS = {
    "tf_mirrored": tf_mirrored,
    "tf_mwms_worker": tf_mwms_worker,
    "tf_checkpoint_save": tf_checkpoint_save,
    "tf_checkpoint_load": tf_checkpoint_load,
    "jax_distribution": jax_distribution,
    "tf_mirrored_stats": tf_mirrored_stats,
    "tf_mwms_stats_worker": tf_mwms_stats_worker,
    "jax_distribution_stats": jax_distribution_stats,
}


def main(argv: list[str]) -> None:
    name, *args = argv
    try:
        result = SCENARIOS[name](*args)
    except Exception as error:  # noqa: BLE001 - set-up failures are results too
        result = {"scenario": name, "error": "".join(traceback.format_exception_only(type(error), error)).strip()}
    emit(result)


if __name__ == "__main__":
    main(sys.argv[1:])
