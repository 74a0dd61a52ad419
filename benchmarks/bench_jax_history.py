"""What ``history=`` costs per step in ``lossscale.jax``: one jitted Adam step with and without it.

Each contender is a jitted ``apply_gradients`` step (params and state donated); rounds alternate between the two
and the median time per step is printed, with a no-op ``jax.debug.callback`` step as the floor of any host callback.

Usage::

    .venv/bin/python benchmarks/bench_jax_history.py
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lossscale
import lossscale.jax as lsj


def contender(history, n):
    opt = lsj.loss_scale_optimizer(optax.adam(1e-3), history=history)
    params = jnp.ones(n)
    state = opt.init(params)
    step = jax.jit(lambda p, s: lsj.apply_gradients(opt, p * 0.1, s, p), donate_argnums=(0, 1))
    params, state = step(params, state)
    jax.block_until_ready(params)

    def run(steps):
        nonlocal params, state
        start = time.perf_counter()
        for _ in range(steps):
            params, state = step(params, state)
        jax.block_until_ready(params)
        return (time.perf_counter() - start) / steps

    return run


def noop_callback(n):
    def f(x):
        jax.debug.callback(lambda a: None, x[0])
        return x * 1.0

    g = jax.jit(f)
    x = g(jnp.ones(n))

    def run(steps):
        nonlocal x
        start = time.perf_counter()
        for _ in range(steps):
            x = g(x)
        jax.block_until_ready(x)
        return (time.perf_counter() - start) / steps

    return run


def main():
    print(f"jax {jax.__version__}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'params':>9} {'off ms':>8} {'history ms':>11} {'no-op callback ms':>18}")
    for n in (1_000, 1_000_000):
        runs = {"off": contender(None, n), "history": contender(lossscale.History(), n), "noop": noop_callback(n)}
        steps = 300 if n < 100_000 else 50
        times = {k: [] for k in runs}
        for _ in range(5):
            for name, run in runs.items():
                times[name].append(run(steps))
        med = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
        print(f"{n:>9} {med['off']:>8.3f} {med['history']:>11.3f} {med['noop']:>18.3f}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
