"""Which modules of ``lossscale`` one Keras ``apply`` enters, in order, and how often it comes back into each.

Traces one real step (after a warm-up step, so that building and compiling
are not counted) of ``lossscale.keras.LossScaleOptimizer.apply`` with
``sys.settrace``, on a backend where Python runs each step (torch, or JAX's
eager ``apply``), and prints per module of ``lossscale`` (the core included):

* ``entries``: calls into the module from another module;
* ``re-entries``: ``entries - 1``;
* ``back-calls``: entries made while a frame of that module is still on the
  stack below a frame of another module (``A -> B -> A``).

Run::

    KERAS_BACKEND=torch PYTHONPATH=src python benchmarks/step_walk_keras.py [--stats]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np

import lossscale
import lossscale.keras as lsk

ROOT = os.path.dirname(lossscale.__file__)


def _module(frame) -> str | None:
    path = frame.f_code.co_filename
    return os.path.relpath(path, ROOT) if path.startswith(ROOT) else None


def walk(fn) -> tuple[list[str], Counter]:
    """The modules entered (cross-module calls, in order) while ``fn()`` runs, and the back-calls per module."""
    entries: list[str] = []
    back: Counter = Counter()

    def tracer(frame, event, arg):
        if event != "call":
            return
        name = _module(frame)
        if name is None:
            return
        caller = frame.f_back
        if caller is not None and _module(caller) == name:
            return  # a call within one module
        entries.append(name)
        below = caller
        while below is not None:
            if _module(below) == name:
                back[name] += 1
                break
            below = below.f_back

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return entries, back


def report(title: str, entries: list[str], back: Counter) -> None:
    order = list(dict.fromkeys(entries))
    counts = Counter(entries)
    print(f"{title}: {len(order)} modules, {sum(counts[f] - 1 for f in order)} re-entries, "
          f"{sum(back.values())} back-calls, max re-entries {max((counts[f] - 1 for f in order), default=0)}")
    print("  walk: " + " -> ".join(entries))
    for name in order:
        print(f"  {name:28s} entries {counts[name]:2d}  re-entered {counts[name] - 1:2d}  back-calls {back[name]}")


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
    report(f"LossScaleOptimizer.apply() on {keras.backend.backend()}" + (" (stats_every=1)" if stats else ""),
           *walk(step))


if __name__ == "__main__":
    main()
