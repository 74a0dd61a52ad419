"""``model.fit`` step time: lossscale.keras.LossScaleOptimizer against Keras 3's own, per backend.

One small model (an MLP under ``mixed_float16``, Adam), compiled with Keras'
``LossScaleOptimizer`` (what ``compile`` wraps a plain Adam in), with
lossscale's, and with Keras' again (the control). All are warmed up
(compilation), then timed interleaved: each round runs one epoch of
``--steps`` batches with each, the order rotating from round to round so that
each model takes each place equally often; each epoch gives two numbers per
optimizer:

* step: the median time between consecutive batch ends (a callback's
  clock), i.e. one whole ``fit`` step with its Python loop, the epoch's
  setup and teardown (data adapter, iterator, callbacks) left out;
* epoch: the wall time of the ``fit`` call divided by ``--steps``, which
  includes that setup and its occasional stalls (garbage collection).

The table gives the medians over ``--rounds`` rounds and, per measure, the
median over the rounds of each round's ratio lossscale / Keras (the timings
of a round are taken back to back, so their ratio cancels the shared
machine's slower drifts). A third model, "control", runs Keras' own class
again: its ratio to the first is what identical work measures, the noise
floor of the ratio. All models start from the same weights and data.

The backend is fixed per process, so ``--backend all`` (the default) runs this
script once per backend in a subprocess and prints one table.

Usage::

    PYTHONPATH=src python benchmarks/bench_keras.py                      # all three backends
    KERAS_BACKEND=jax PYTHONPATH=src python benchmarks/bench_keras.py --backend current --rounds 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BACKENDS = ("tensorflow", "jax", "torch")


def measure(args: argparse.Namespace) -> dict[str, float]:
    import keras
    import numpy as np

    import lossscale.keras as lsk

    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps * args.batch, args.width)).astype(np.float32)
    y = rng.standard_normal((args.steps * args.batch, 1)).astype(np.float32)

    def model_with(optimizer):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((args.width,))]
            + [keras.layers.Dense(args.width, activation="relu") for _ in range(args.depth)]
            + [keras.layers.Dense(1, dtype="float32")]
        )
        model.compile(optimizer=optimizer, loss="mse")
        return model

    models = {
        "keras": model_with(keras.optimizers.Adam(1e-4)),  # compile wraps it in Keras' LossScaleOptimizer
        "lossscale": model_with(lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-4))),
        "control": model_with(keras.optimizers.Adam(1e-4)),  # Keras' class again: what identical work measures
    }
    assert type(models["keras"].optimizer) is keras.optimizers.LossScaleOptimizer

    class StepTimer(keras.callbacks.Callback):
        """The time between consecutive batch ends: one whole ``fit`` step, the epoch's setup left out."""

        def on_epoch_begin(self, epoch, logs=None):
            self.ends = [time.perf_counter()]

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    def epoch(model) -> tuple[float, float]:
        """(wall time of the ``fit`` call per step, median step time within it)."""
        timer = StepTimer()
        start = time.perf_counter()
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False, callbacks=[timer])
        wall = (time.perf_counter() - start) / args.steps
        return wall, statistics.median(b - a for a, b in zip(timer.ends[1:], timer.ends[2:]))

    for model in models.values():  # compile and warm up
        epoch(model)
        epoch(model)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    order = list(models)
    for _ in range(args.rounds):
        for name in order:
            times[name].append(epoch(models[name]))
        order = order[1:] + order[:1]
    result: dict[str, float] = {}
    for which, kind in enumerate(("epoch", "step")):
        ours, theirs, again = ([t[which] for t in times[name]] for name in ("lossscale", "keras", "control"))
        result[f"keras_{kind}"], result[f"lossscale_{kind}"] = statistics.median(theirs), statistics.median(ours)
        # Each round times both back to back, so its ratio cancels the machine's slower drifts.
        result[f"paired_{kind}"] = statistics.median(a / b for a, b in zip(ours, theirs))
        result[f"control_{kind}"] = statistics.median(a / b for a, b in zip(again, theirs))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="all", help="all, or current (KERAS_BACKEND of this process)")
    parser.add_argument("--steps", type=int, default=100, help="batches per timed epoch")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.backend == "current":
        result = measure(args)
        print(json.dumps(result) if args.json else result)
        return
    rows = []
    for backend in BACKENDS:
        passed = [a for a in sys.argv[1:] if not a.startswith("--backend")]
        command = [sys.executable, __file__, "--backend", "current", "--json", *passed]
        out = subprocess.run(
            command, env={**os.environ, "KERAS_BACKEND": backend}, capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            rows.append(f"| {backend} | failed: {out.stderr.strip().splitlines()[-1]} | | | | | | | |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(
            f"| {backend} | {r['keras_step'] * 1e3:.3f} | {r['lossscale_step'] * 1e3:.3f} | {r['paired_step']:.3f} "
            f"| {r['control_step']:.3f} | {r['keras_epoch'] * 1e3:.2f} | {r['lossscale_epoch'] * 1e3:.2f} "
            f"| {r['paired_epoch']:.3f} | {r['control_epoch']:.3f} |"
        )
    print(
        f"fit step time, MLP {args.depth}x{args.width}, batch {args.batch}, mixed_float16, Adam; "
        f"median of {args.rounds} interleaved rounds of {args.steps} steps\n"
    )
    print(
        "| backend | step: Keras 3 (ms) | step: lossscale (ms) | step: ratio | step: control "
        "| epoch: Keras 3 (ms/step) | epoch: lossscale (ms/step) | epoch: ratio | epoch: control |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
