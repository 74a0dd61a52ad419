"""The cost of ``stats_every`` on Keras with TensorFlow, every contender stepping one shared model.

``bench_stats.py`` builds three models per contender; on a shared 2-core VM two identical Keras models differ by
up to 4%, which hides differences of 1%. Here a single model is stepped in turn by every contender's optimizer (a
``tf.GradientTape`` loop with ``optimizer.apply``, the ``fit`` step's work), so a model's memory layout is the same
for all. Per round, each optimizer runs ``--steps`` steps in a shuffled order; a cell is the median over rounds of
the contender's mean block time over ``off``'s in the same round, with the standard error of the mean beside it.

    python benchmarks/bench_keras_tf_one_model.py                 # TensorFlow's default threads
    python benchmarks/bench_keras_tf_one_model.py --threads 1     # one thread: less scheduling noise

Contenders: ``off`` and ``control`` (no statistics), ``never`` (``stats_every=2**30``: sampled at step 0 only, the
unsampled step's cost), ``N=16`` and ``N=1``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

CONTENDERS = {"off": None, "control": None, "never": 2**30, "N=16": 16, "N=1": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=float, default=1e6)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=32, help="steps per optimizer and round, a multiple of 16")
    parser.add_argument("--copies", type=int, default=2, help="optimizers per contender")
    parser.add_argument("--threads", type=int, default=0, help="TensorFlow's inter- and intra-op threads (0: default)")
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    import keras
    import numpy as np

    import lossscale.keras as lsk

    keras.mixed_precision.set_global_policy("mixed_float16")
    width = int((args.params / args.layers) ** 0.5)
    rng = np.random.default_rng(0)
    x, y = (tf.constant(rng.standard_normal((64, width)).astype(np.float32)) for _ in range(2))
    layers = [keras.layers.Dense(width, activation="tanh") for _ in range(args.layers - 1)]
    model = keras.Sequential([keras.Input((width,)), *layers, keras.layers.Dense(width, dtype="float32")])

    def make_step(every: int | None) -> tf.types.experimental.GenericFunction:
        opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-4), "dynamic", stats_every=every)
        opt.build(model.trainable_variables)

        @tf.function
        def step() -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
                scaled = opt.get_scaled_loss(loss)
            opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
            return loss

        step()
        step()
        return step

    runs = [(name, make_step(every)) for name, every in CONTENDERS.items() for _ in range(args.copies)]
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for _ in range(args.rounds):
        spent: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        for name, step in random.sample(runs, len(runs)):
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = step()
            float(loss)
            spent[name].append((time.perf_counter() - start) / args.steps)
        for name, blocks in spent.items():
            times[name].append(statistics.mean(blocks))
    print(f"MLP of {args.layers} layers, about {args.params:.0e} parameters, batch 64; {args.rounds} rounds x "
          f"{args.copies} optimizers x {args.steps} steps; TensorFlow threads: {args.threads or 'default'}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"off: {statistics.median(times['off']) * 1e3:.2f} ms/step")
    print("| contender | median ratio to off | mean | standard error |\n|---|---|---|---|")
    for name, series in times.items():
        ratios = [t / base for t, base in zip(series, times["off"])]
        print(f"| {name} | {statistics.median(ratios):.3f} | {statistics.mean(ratios):.3f} | "
              f"{statistics.stdev(ratios) / len(ratios) ** 0.5:.3f} |")


if __name__ == "__main__":
    main()
