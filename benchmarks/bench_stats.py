"""What ``stats_every`` costs: the jitted JAX step, and the torch statistics pass, with and without it.

JAX: one process, one jitted training step (an MLP, Adam, ``loss_scale_optimizer``)
per contender, parameters and state donated, interleaved rounds in a shuffled
order; the median time per step over the rounds and its ratio to the step
without statistics:

* ``off``: ``stats_every=None`` (today's step);
* ``every1``: statistics on every step (in the same jitted function as the check);
* ``every16``: on every 16th step (a ``lax.cond``), so the average cost is the
  sampled cost / 16 plus the branch;
* ``auto``: ``loss_scale="auto"`` (statistics every step and the auto rule).

torch (``--torch``): the time of ``lossscale.torch._stats.gradient_stats``
(the sampled step's extra work) against the time of the unscale-and-check
(``torch._amp_foreach_non_finite_check_and_unscale_``) on the same gradients.

Usage::

    python benchmarks/bench_stats.py                  # JAX, 1M and 10M parameters
    python benchmarks/bench_stats.py --sizes 1e6 --rounds 5 --torch
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

DEPTH = 4


def jax_bench(sizes: list[float], rounds: int, steps: int) -> None:
    import jax
    import jax.numpy as jnp
    import optax

    import lossscale.jax as lsj

    for n in sizes:
        width = int((n / DEPTH) ** 0.5)
        keys = jax.random.split(jax.random.PRNGKey(0), DEPTH + 2)
        params0 = [{"w": jax.random.normal(k, (width, width)) / width**0.5, "b": jnp.zeros(width)} for k in keys[:DEPTH]]
        x = jax.random.normal(keys[-2], (64, width))
        y = jax.random.normal(keys[-1], (64, width))

        def loss(p, x, y):
            for layer in p:
                x = jnp.tanh(x @ layer["w"] + layer["b"])
            return jnp.mean((x - y) ** 2)

        contenders = {}
        for name, kwargs in {
            "off": {},
            "every1": {"stats_every": 1},
            "every16": {"stats_every": 16},
            "auto": {"loss_scale": "auto"},
        }.items():
            opt = lsj.loss_scale_optimizer(optax.adam(1e-3), **kwargs)

            def step(p, s, x, y, opt=opt):
                g = jax.grad(lambda p: lsj.get_scaled_loss(loss(p, x, y), s))(p)
                u, s = opt.update(g, s, p)
                return optax.apply_updates(p, u), s

            step = jax.jit(step, donate_argnums=(0, 1))
            p = jax.tree.map(jnp.array, params0)
            s = opt.init(p)
            p, s = step(p, s, x, y)
            jax.block_until_ready(p)
            contenders[name] = [step, p, s, []]
        for _ in range(rounds):
            order = list(contenders)
            random.shuffle(order)
            for name in order:
                c = contenders[name]
                step, p, s = c[0], c[1], c[2]
                t = time.perf_counter()
                for _ in range(steps):
                    p, s = step(p, s, x, y)
                jax.block_until_ready(p)
                c[3].append((time.perf_counter() - t) / steps)
                c[1], c[2] = p, s
        base = statistics.median(contenders["off"][3])
        print(f"\nJAX, {n:.0e} parameters, {DEPTH} layers, median of {rounds} rounds x {steps} steps:")
        print("| contender | ms/step | ratio to off |\n|---|---|---|")
        for name, c in contenders.items():
            med = statistics.median(c[3])
            print(f"| {name} | {med * 1e3:.2f} | {med / base:.3f} |")


def torch_bench(sizes: list[float], rounds: int) -> None:
    import torch

    from lossscale.torch._stats import gradient_stats

    torch.set_num_threads(1)
    for n in sizes:
        per = int(n) // 100
        grads = [torch.randn(per) * 2.0**-10 for _ in range(100)]
        found = torch.zeros(1)
        inv = torch.ones(1)

        def check(grads=grads, found=found, inv=inv):
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)

        def stats(grads=grads):
            gradient_stats(grads)

        times = {"check": [], "stats": []}
        for _ in range(rounds):
            for name, fn in random.sample([("check", check), ("stats", stats)], 2):
                t = time.perf_counter()
                for _ in range(5):
                    fn()
                times[name].append((time.perf_counter() - t) / 5)
        c, s = statistics.median(times["check"]), statistics.median(times["stats"])
        print(f"\ntorch, {n:.0e} parameters in 100 tensors, 1 thread, median of {rounds} rounds:")
        print("| pass | ms | ratio to the check |\n|---|---|---|")
        print(f"| unscale + finite check | {c * 1e3:.2f} | 1.00 |")
        print(f"| statistics (sampled step) | {s * 1e3:.2f} | {s / c:.2f} |")
        print(f"| statistics averaged over N=16 | {s / 16 * 1e3:.3f} | {s / 16 / c:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--torch", action="store_true", help="also time the torch statistics pass")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    jax_bench(args.sizes, args.rounds, args.steps)
    if args.torch:
        torch_bench(args.sizes, args.rounds)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
