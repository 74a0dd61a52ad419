"""lossscale.jax against jmp written by hand and against plain optax.

One process, one jitted training step per contender (an MLP, Adam, donated
buffers), run interleaved: every round times each contender for ``--steps``
steps, in a rotating order; the table gives the median over ``--rounds``
rounds of the time per step, and the ratios.

The contenders compute the same thing (a float32 model; loss scaling costs
the same whatever the model's dtype, and CPUs have no fast float16):

* ``optax``: ``grad``, ``adam.update``, ``apply_updates``; no scaling.
* ``jmp``: jmp's documented pattern: ``DynamicLossScale.scale`` the loss,
  ``unscale`` the grads, ``all_finite``, ``adjust``, and ``select_tree``
  between the new and the old params and optimizer state.
* ``lossscale``: ``get_scaled_loss`` and ``loss_scale_optimizer(adam)``.

Usage::

    .venv/bin/python benchmarks/bench_jax.py                 # 1M and 10M parameters
    .venv/bin/python benchmarks/bench_jax.py --sizes 1e6 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import jmp
import optax

import lossscale.jax as lsj

DEPTH = 4


def make_problem(n_params: int, batch: int, seed: int = 0):
    width = int((n_params / DEPTH) ** 0.5)
    keys = jax.random.split(jax.random.PRNGKey(seed), DEPTH + 2)
    params = [
        {"w": jax.random.normal(k, (width, width), jnp.float32) / width**0.5, "b": jnp.zeros((width,), jnp.float32)}
        for k in keys[:DEPTH]
    ]
    x = jax.random.normal(keys[-2], (batch, width), jnp.float32)
    y = jax.random.normal(keys[-1], (batch, width), jnp.float32)
    return params, x, y


def loss_fn(params, x, y):
    h = x
    for i, layer in enumerate(params):
        h = h @ layer["w"] + layer["b"]
        if i < len(params) - 1:
            h = jnp.tanh(h)
    return jnp.mean((h - y) ** 2)


def contenders(lr: float = 1e-4):
    adam = optax.adam(lr)

    def plain_step(params, opt_state, x, y):
        grads = jax.grad(loss_fn)(params, x, y)
        updates, opt_state = adam.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def jmp_step(params, state, x, y):
        opt_state, ls = state
        grads = jax.grad(lambda p: ls.scale(loss_fn(p, x, y)))(params)
        grads = ls.unscale(grads)
        finite = jmp.all_finite(grads)
        ls = ls.adjust(finite)
        updates, new_opt_state = adam.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        params, opt_state = jmp.select_tree(finite, (new_params, new_opt_state), (params, opt_state))
        return params, (opt_state, ls)

    opt = lsj.loss_scale_optimizer(adam, "dynamic")

    def ls_step(params, opt_state, x, y):
        grads = jax.grad(lambda p: lsj.get_scaled_loss(loss_fn(p, x, y), opt_state))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return {
        "optax": (plain_step, adam.init),
        "jmp": (jmp_step, lambda p: (adam.init(p), jmp.DynamicLossScale(jnp.float32(2.0**15)))),
        "lossscale": (ls_step, opt.init),
    }


def bench(n_params: int, batch: int, rounds: int, steps: int) -> dict[str, float]:
    params0, x, y = make_problem(n_params, batch)
    runs = {}
    for name, (step, init) in contenders().items():
        fn = jax.jit(step, donate_argnums=(0, 1))
        params = jax.tree_util.tree_map(jnp.copy, params0)
        carry = (params, init(params))
        carry = fn(*carry, x, y)  # compile and warm up
        jax.block_until_ready(carry)
        runs[name] = [fn, carry]
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn, carry = runs[name]
            start = time.perf_counter()
            for _ in range(steps):
                carry = fn(*carry, x, y)
            jax.block_until_ready(carry)
            times[name].append((time.perf_counter() - start) / steps)
            runs[name][1] = carry
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7], help="parameter counts")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps timed per round")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, optax {optax.__version__}, device {jax.devices()[0].device_kind}, "
          f"batch {args.batch}, median of {args.rounds} rounds x {args.steps} steps")
    print(f"{'params':>8} | {'optax ms':>9} | {'jmp ms':>7} | {'lossscale ms':>12} | "
          f"{'lossscale/optax':>15} | {'lossscale/jmp':>13}")
    for size in args.sizes:
        t = bench(int(size), args.batch, args.rounds, args.steps)
        print(f"{size:>8.0e} | {t['optax'] * 1e3:>9.2f} | {t['jmp'] * 1e3:>7.2f} | {t['lossscale'] * 1e3:>12.2f} | "
              f"{t['lossscale'] / t['optax']:>15.3f} | {t['lossscale'] / t['jmp']:>13.3f}")


if __name__ == "__main__":
    main()
