"""Which modules of ``lossscale`` one Keras ``apply`` enters, in order, and how often it comes back into each.

Traces one real step (after a warm-up step, so that building and compiling
are not counted) of ``lossscale.keras.LossScaleOptimizer.apply`` with
``sys.settrace``, on a backend where Python runs each step (torch, or JAX's
eager ``apply``), and prints per module of ``lossscale`` (the core included):

entries, re-entries and back-calls as ``benchmarks/step_walk.py`` counts them.

Run::

    KERAS_BACKEND=torch PYTHONPATH=src python benchmarks/step_walk_keras.py [--stats]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np

import lossscale
import lossscale.keras as lsk

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_walk

# benchmarks/step_walk.py's tracer, over every module of lossscale (the core included) instead of lossscale.torch's.
step_walk.ROOT = os.path.dirname(lossscale.__file__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stats", action="store_true", help="stats_every=1 (the measured step)")
    stats = parser.parse_args().stats
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), stats_every=1 if stats else None)
    opt.build(model.trainable_variables)
    grads = [np.full(tuple(v.shape), 0.5, "float32") for v in model.trainable_variables]
    grads = [keras.ops.convert_to_tensor(g) for g in grads]

    def step() -> None:
        opt.apply(grads, model.trainable_variables)

    step()
    title = f"LossScaleOptimizer.apply() on {keras.backend.backend()}" + (" (stats_every=1)" if stats else "")
    step_walk.report(title, *step_walk.walk(step))


if __name__ == "__main__":
    main()
