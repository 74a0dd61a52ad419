"""What ``stats_every`` costs in the Keras step: ``model.train_on_batch`` with and without it, per backend.

One process per backend (``KERAS_BACKEND``). An MLP of about ``--params``
parameters in ``DEPTH`` Dense layers, Adam, ``mixed_float16``, compiled by
``fit``'s machinery (``train_on_batch``). Contenders, interleaved over
``--rounds`` rounds in a shuffled order, each timed over ``--steps`` steps;
the median time per step and its ratio to ``off``:

* ``off``: ``stats_every=None``;
* ``every1``: statistics on every step;
* ``every16``: on every 16th step (the average cost);
* ``auto``: ``loss_scale="auto"`` (statistics every step and the auto rule).

Usage::

    KERAS_BACKEND=jax python benchmarks/bench_keras_stats.py --params 1e6 --rounds 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

DEPTH = 4

CONTENDERS = {"off": (None, None), "every1": (None, 1), "every16": (None, 16), "auto": ("auto", None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=float, default=1e6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()

    import keras
    import numpy as np

    import lossscale.keras as lsk

    keras.mixed_precision.set_global_policy("mixed_float16")
    width = int((args.params / DEPTH) ** 0.5)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, width)).astype(np.float32)
    y = rng.standard_normal((64, width)).astype(np.float32)
    models = {}
    for name, (loss_scale, every) in CONTENDERS.items():
        keras.utils.set_random_seed(0)
        layers = [keras.layers.Dense(width, activation="relu") for _ in range(DEPTH - 1)]
        model = keras.Sequential([keras.Input((width,)), *layers, keras.layers.Dense(width, dtype="float32")])
        opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-4), loss_scale, stats_every=every)
        model.compile(optimizer=opt, loss="mse")
        model.train_on_batch(x, y)  # compile
        models[name] = model
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for _ in range(args.rounds):
        order = list(CONTENDERS)
        random.shuffle(order)
        for name in order:
            model = models[name]
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = model.train_on_batch(x, y)
            float(np.asarray(loss))
            times[name].append((time.perf_counter() - start) / args.steps)
    base = statistics.median(times["off"])
    params = sum(int(np.prod(v.shape)) for v in models["off"].trainable_variables)
    print(f"backend {keras.backend.backend()}, {params} parameters in {DEPTH} layers, batch 64, mixed_float16")
    print("| contender | median ms/step | ratio to off |")
    print("|---|---|---|")
    for name in CONTENDERS:
        t = statistics.median(times[name])
        print(f"| {name} | {t * 1e3:.2f} | {t / base:.2f}x |")


if __name__ == "__main__":
    main()
