"""What ``stats_every`` costs: a whole training step with and without statistics, in every binding, one run.

One subprocess per binding (Keras fixes its backend per process); in each,
``--models`` models per contender, timed in interleaved rounds in a shuffled
order, so every ratio compares steps measured side by side. Two identical
models on this machine differ by up to 4% (where their memory landed), and a
block now and then runs far slower. Reported: ``off``'s median time per step,
and per contender the median, over its blocks (one model's steps in one
round), of the block's time over the median of ``off``'s blocks in that round:

* ``off``: ``loss_scale="dynamic"``, no statistics;
* ``control``: the same as ``off``, other models: how far the method's noise goes;
* ``N=1``: ``stats_every=1`` (a sample every step);
* ``N=16``: ``stats_every=16``, the default N of ``loss_scale="auto"``: the
  average over 16 steps, one of them sampled (``--steps`` is a multiple of 16);
* ``auto``: ``loss_scale="auto"`` with its defaults (a sample every 16 steps,
  and the auto rule every step).

Bindings (``--bindings``):

* ``torch``: ``lossscale.torch.LossScaleOptimizer`` over fused ``AdamW``,
  forward under ``torch.autocast("cpu", float16)``, backward, step;
* ``jax``: ``loss_scale_optimizer(optax.adam)``, the whole step jitted, parameters and state donated;
* ``keras-tensorflow``, ``keras-jax``, ``keras-torch``: ``model.train_on_batch``
  (``fit``'s compiled step), Adam, ``mixed_float16``. The ``i``-th model of every
  contender is built on the same layers (one set of weights per ``i``, each
  contender its own optimizer and compiled step), so where the weights landed in
  memory does not separate the contenders.

The model is an MLP of ``--layers`` square layers holding about ``--params``
parameters, batch 64.

Usage::

    python benchmarks/bench_stats.py                                 # every binding, 1M parameters
    python benchmarks/bench_stats.py --bindings torch jax --rounds 9
    python benchmarks/bench_stats.py --bindings torch jax --device cuda      # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

BINDINGS = ("torch", "jax", "keras-tensorflow", "keras-jax", "keras-torch")
CONTENDERS = {"off": ("dynamic", None), "control": ("dynamic", None), "N=1": ("dynamic", 1), "N=16": ("dynamic", 16),
              "auto": ("auto", None)}
Step = Callable[[int], None]


def interleaved(steps: dict[str, list[Step]], rounds: int, count: int) -> dict[str, float]:
    """Per contender: the median, over its blocks (``count`` steps of one model in one round), of the block's time
    per step over the median of ``off``'s blocks in the same round.

    Paired by round, so a slow spell of the shared machine slows both sides of a ratio; a median over the blocks, so
    one model that landed badly, or a block hit by a neighbour, does not move it. ``off`` itself is reported as the
    median seconds per step of its blocks.
    """
    times: dict[str, list[list[float]]] = {name: [] for name in steps}
    runs = [(name, run) for name, models in steps.items() for run in models]
    for _ in range(rounds):
        spent: dict[str, list[float]] = {name: [] for name in steps}
        for name, run in random.sample(runs, len(runs)):
            start = time.perf_counter()
            run(count)
            spent[name].append((time.perf_counter() - start) / count)
        for name, blocks in spent.items():
            times[name].append(blocks)
    base = [statistics.median(blocks) for blocks in times["off"]]
    out = {name: statistics.median(t / b for blocks, b in zip(rows, base) for t in blocks) for name, rows in times.items()}
    out["off"] = statistics.median(t for blocks in times["off"] for t in blocks)
    return out


def torch_mlp(width: int, layers: int, device: object) -> object:
    """The torch model: ``layers`` square Linear + Tanh layers, seeded."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
                                 for _ in range(layers))).to(device)


def jax_mlp(width: int, layers: int) -> tuple:
    """The JAX model: ``(params, loss(params, x, y), x, y)`` with a batch of 64."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), layers + 2)
    params = [{"w": jax.random.normal(k, (width, width)) / width**0.5, "b": jnp.zeros(width)} for k in keys[:layers]]

    def loss(p: list, x: jax.Array, y: jax.Array) -> jax.Array:
        for layer in p:
            x = jnp.tanh(x @ layer["w"] + layer["b"])
        return jnp.mean((x - y) ** 2)

    return params, loss, jax.random.normal(keys[-2], (64, width)), jax.random.normal(keys[-1], (64, width))


def torch_steps(args: argparse.Namespace) -> dict[str, list[Step]]:
    import torch

    from lossscale.torch import LossScaleOptimizer

    width = int((args.params / args.layers) ** 0.5)
    device = torch.device(args.device)
    x, y = torch.randn(64, width, device=device), torch.randn(64, width, device=device)
    out: dict[str, list[Step]] = {}
    for name, (loss_scale, every) in [(n, c) for n, c in CONTENDERS.items() for _ in range(args.models)]:
        model = torch_mlp(width, args.layers, device)
        opt = LossScaleOptimizer(torch.optim.AdamW(model.parameters(), 1e-4, fused=True), loss_scale,
                                 stats_every=every)

        def run(n: int, model: torch.nn.Module = model, opt: LossScaleOptimizer = opt) -> None:
            for _ in range(n):
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=torch.float16):
                    loss = torch.nn.functional.mse_loss(model(x).float(), y)
                opt.get_scaled_loss(loss).backward()
                opt.step()
            float(opt.loss_scale)

        run(2)
        out.setdefault(name, []).append(run)
    return out


def jax_steps(args: argparse.Namespace) -> dict[str, list[Step]]:
    import jax
    import jax.numpy as jnp
    import optax

    import lossscale.jax as lsj

    params0, loss, x, y = jax_mlp(int((args.params / args.layers) ** 0.5), args.layers)

    out: dict[str, list[Step]] = {}
    for name, (loss_scale, every) in [(n, c) for n, c in CONTENDERS.items() for _ in range(args.models)]:
        opt = lsj.loss_scale_optimizer(optax.adam(1e-4), loss_scale, stats_every=every)

        def step(p: list, s: object, opt: optax.GradientTransformation = opt) -> tuple:
            g = jax.grad(lambda p: lsj.get_scaled_loss(loss(p, x, y), s))(p)
            u, s = opt.update(g, s, p)
            return optax.apply_updates(p, u), s

        step = jax.jit(step, donate_argnums=(0, 1))
        box = [jax.tree.map(jnp.array, params0)]
        box.append(opt.init(box[0]))

        def run(n: int, step: Callable = step, box: list = box) -> None:
            p, s = box
            for _ in range(n):
                p, s = step(p, s)
            jax.block_until_ready(p)
            box[:] = [p, s]

        run(2)
        out.setdefault(name, []).append(run)
    return out


def keras_steps(args: argparse.Namespace) -> dict[str, list[Step]]:
    import keras
    import numpy as np

    import lossscale.keras as lsk

    keras.mixed_precision.set_global_policy("mixed_float16")
    width = int((args.params / args.layers) ** 0.5)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, width)).astype(np.float32)
    y = rng.standard_normal((64, width)).astype(np.float32)
    out: dict[str, list[Step]] = {}
    for _ in range(args.models):
        keras.utils.set_random_seed(0)
        layers = [keras.layers.Dense(width, activation="tanh") for _ in range(args.layers - 1)]
        layers.append(keras.layers.Dense(width, dtype="float32"))
        for name, (loss_scale, every) in CONTENDERS.items():
            # One set of weights per model index, shared by every contender's model (each its own optimizer and
            # compiled step): where the weights landed in memory no longer separates the contenders.
            model = keras.Sequential([keras.Input((width,)), *layers])
            optimizer = lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-4), loss_scale, stats_every=every)
            model.compile(optimizer=optimizer, loss="mse")

            def run(n: int, model: keras.Model = model) -> None:
                for _ in range(n):
                    loss = model.train_on_batch(x, y)
                float(np.asarray(loss))

            run(2)
            out.setdefault(name, []).append(run)
    return out


def child(args: argparse.Namespace) -> None:
    binding = args.child
    if binding.startswith("keras-"):
        steps = keras_steps(args)
    else:
        steps = {"torch": torch_steps, "jax": jax_steps}[binding](args)
    medians = interleaved(steps, args.rounds, args.steps)
    print(json.dumps({"binding": binding, "medians": medians}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bindings", nargs="+", choices=BINDINGS, default=list(BINDINGS))
    parser.add_argument("--params", type=float, default=1e6)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--models", type=int, default=3, help="models per contender")
    parser.add_argument("--steps", type=int, default=32, help="steps per model and round, a multiple of 16")
    parser.add_argument("--device", default="cpu", help="torch's device (cpu or cuda); JAX uses its default device")
    parser.add_argument("--child", choices=BINDINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps % 16:
        parser.error(f"--steps must be a multiple of 16 (N=16 averages over whole sampling periods), got {args.steps}.")
    if args.child:
        child(args)
        return
    print(f"load average before: {os.getloadavg()}")
    print(f"MLP of {args.layers} layers, about {args.params:.0e} parameters, batch 64; {args.rounds} rounds x "
          f"{args.models} models x {args.steps} steps; the median over the blocks (one model, one round) of the "
          "time per step over `off`'s median block in the same round\n")
    print("| binding | off ms/step | control | N=1 | N=16 | auto (N=16) |\n|---|---|---|---|---|---|")
    for binding in args.bindings:
        env = dict(os.environ)
        if binding.startswith("keras-"):
            env["KERAS_BACKEND"] = binding.removeprefix("keras-")
        command = [sys.executable, __file__, "--child", binding, "--params", str(args.params), "--layers",
                   str(args.layers), "--rounds", str(args.rounds), "--models", str(args.models), "--steps",
                   str(args.steps), "--device", args.device]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            print(f"| {binding} | failed: {done.stderr.strip().splitlines()[-1:]} | | | | |")
            continue
        m = json.loads(lines[-1])["medians"]
        print(f"| {binding} | {m['off'] * 1e3:.2f} | {m['control']:.3f} | {m['N=1']:.3f} | {m['N=16']:.3f} | "
              f"{m['auto']:.3f} |")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
