"""Eager (un-jitted) steps on JAX: an optax ``update`` called outside ``jit``, and Keras' ``fit`` with
``run_eagerly=True`` on the JAX backend, each against its plain and its peer's step, side by side in one run.

Eager code is rare in training but common in notebooks and tests. There a JAX ``lax.cond`` whose branches are new
closures compiles a new XLA program at every call (tens of ms), so each loss-scaling step is timed here against the
plain optimizer's, and the XLA programs compiled per warm step are counted (``jax.log_compiles``).

* optax, a 64x64 + 64 model: ``optax.adam``, ``optax.apply_if_finite(adam)``, ``loss_scale_optimizer(adam)``,
  and the same with ``clip_by_global_norm``;
* Keras on JAX (a subprocess: Keras picks its backend once), a Dense 8-16-1 on batches of 8: Adam,
  Keras 3's ``LossScaleOptimizer``, lossscale's.

Run:  python benchmarks/bench_eager.py [--steps 20] [--rounds 3]
Prints the median ms per step over rounds, the ratio to plain (median of each round's), and the compiles per
warm step.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class _Compiles(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage().startswith("Compiling")


def compiles(run: Callable[[], Any]) -> int:
    """The XLA programs compiled while ``run()`` runs (JAX's compile log, ``jax.log_compiles``)."""
    import jax

    handler, logger = _Compiles(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            run()
    finally:
        logger.removeHandler(handler)
    return handler.count


def compiles_per_step(run: Callable[[], None], steps: int) -> float:
    """XLA programs compiled per call of ``run`` (already warm), over ``steps`` calls."""
    return compiles(lambda: [run() for _ in range(steps)]) / steps


def time_rounds(contenders: dict[str, Callable[[], Any]], steps: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per step of each contender, per round (the contenders interleaved in each round)."""
    out: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            start = time.perf_counter()
            for _ in range(steps):
                run()
            out[name].append((time.perf_counter() - start) / steps)
    return out


def optax_contenders() -> dict[str, Callable[[], Any]]:
    import jax
    import jax.numpy as jnp
    import optax

    import lossscale.jax as lsj

    params = {"w": jnp.ones((64, 64)), "b": jnp.zeros(64)}
    grads = jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.5), params)
    made = {
        "plain optax.adam": optax.adam(1e-3),
        "optax.apply_if_finite": optax.apply_if_finite(optax.adam(1e-3), 10),
        "lossscale": lsj.loss_scale_optimizer(optax.adam(1e-3)),
        "lossscale, clip_by_global_norm": lsj.loss_scale_optimizer(optax.adam(1e-3), clip_by_global_norm=1.0),
    }
    contenders = {}
    for name, tx in made.items():
        box = [tx.init(params)]

        def run(tx: Any = tx, box: list[Any] = box) -> None:
            updates, box[0] = tx.update(grads, box[0], params)
            jax.block_until_ready(updates)

        for _ in range(3):
            run()
        contenders[name] = run
    return contenders


def keras_contenders() -> dict[str, Callable[[], Any]]:
    import keras
    import numpy as np

    import lossscale.keras as lsk

    x, y = np.ones((8, 8), "float32"), np.ones((8, 1), "float32")
    makers = {
        "plain Adam": lambda: keras.optimizers.Adam(1e-3),
        "Keras 3 LossScaleOptimizer": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3)),
        "lossscale": lambda: lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-3)),
    }
    contenders = {}
    for name, make in makers.items():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
        model.compile(optimizer=make(), loss="mse", run_eagerly=True)

        def run(model: Any = model) -> None:
            model.train_on_batch(x, y)

        for _ in range(3):
            run()
        contenders[name] = run
    return contenders


def table(title: str, contenders: dict[str, Callable[[], Any]], steps: int, rounds: int) -> str:
    times = time_rounds(contenders, steps, rounds)
    plain = next(iter(times))
    lines = [f"\n{title}\n", "| step | ms per step | over plain | compiles per warm step |", "|---|---|---|---|"]
    for name, seconds in times.items():
        ratio = statistics.median(s / p for s, p in zip(seconds, times[plain]))
        compiles = compiles_per_step(contenders[name], 3)
        lines.append(f"| {name} | {statistics.median(seconds) * 1e3:.1f} | {ratio:.2f}x | {compiles:g} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keras", action="store_true", help=argparse.SUPPRESS)  # the subprocess's part
    args = parser.parse_args()
    if args.keras:
        print(table("Keras on JAX, run_eagerly=True (train_on_batch)", keras_contenders(), args.steps, args.rounds))
        return
    import jax

    print(f"# jax {jax.__version__}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    print(table("optax update outside jit", optax_contenders(), args.steps, args.rounds))
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "KERAS_BACKEND": "jax",
           "PYTHONPATH": os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, __file__, "--keras", "--steps", str(args.steps), "--rounds",
                           str(args.rounds)], env=env, capture_output=True, text=True, timeout=1200, check=False)
    print("\n" + done.stdout.strip() if done.returncode == 0 else f"the Keras run failed:\n{done.stderr[-2000:]}")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
