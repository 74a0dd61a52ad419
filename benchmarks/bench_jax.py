"""lossscale.jax against plain optax, jmp written by hand, and optax.apply_if_finite, donated and not.

One process, one jitted training step per contender (an MLP, Adam), run
interleaved: each round times every contender for ``--steps`` steps, in a
freshly shuffled order. Each size runs twice: with the parameters and the
optimizer state donated (``jax.jit(step, donate_argnums=(0, 1))``, the recipe
of flax, orbax and Keras' trainer) and without. The table gives the median
time per step, the median over rounds of each round's ratio to plain optax
(both timed in the same round), and the passes over the state that the
compiled step makes (``benchmarks/xla_passes.py``: bytes of weight-sized
arrays read and written by its kernels, over the weights' bytes; static, so
the same on a busy machine) with the size of its temporary buffer (XLA's
``memory_analysis``; on CPU a buffer over glibc's 32 MB mmap threshold is
mapped afresh, and its pages faulted in, at every step), and the minor page
faults per step (``getrusage``, median over rounds). The load average is printed before and after,
because other jobs on the machine move every time.

The contenders compute the same thing (a float32 model; loss scaling costs
the same whatever the model's dtype, and CPUs have no fast float16):

* ``optax``: ``grad``, ``adam.update``, ``apply_updates``; no scaling.
* ``jmp``: jmp's documented pattern: ``DynamicLossScale.scale`` the loss,
  ``unscale`` the grads, ``all_finite``, ``adjust``, and ``select_tree``
  between the new and the old params and optimizer state.
* ``if_finite``: ``optax.apply_if_finite(adam)``: optax's own skip, no scaling.
* ``lossscale``: ``get_scaled_loss`` + ``jax.grad`` and
  ``loss_scale_optimizer(adam).update`` + ``apply_updates``.
* ``ls_vag``: the same with ``lossscale.jax.value_and_grad`` (the helper must
  add nothing: compare with ``lossscale``).
* ``ls_apply``: ``value_and_grad`` and ``lossscale.jax.apply_gradients``, the
  form that returns new parameters instead of updates.
* ``ls_flax``: ``lossscale.jax.train_state.TrainState.apply_gradients`` (when
  flax is installed).

Usage::

    .venv/bin/python benchmarks/bench_jax.py                 # 1M and 10M parameters, donated and not
    .venv/bin/python benchmarks/bench_jax.py --sizes 1e6 --rounds 5 --donate yes
    .venv/bin/python benchmarks/bench_jax.py --passes-only   # the pass counts alone (seconds, any machine)
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import time

import jax
import jax.numpy as jnp
import jmp
import optax
from xla_passes import passes  # benchmarks/ is the script's directory, so on sys.path

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
        # jmp's state travels as plain arrays: its pytree does not unflatten from the abstract values that
        # ``lower`` passes (it checks its dtype at construction).
        opt_state, (scale, counter) = state
        ls = jmp.DynamicLossScale(scale, counter)
        grads = jax.grad(lambda p: ls.scale(loss_fn(p, x, y)))(params)
        grads = ls.unscale(grads)
        finite = jmp.all_finite(grads)
        ls = ls.adjust(finite)
        updates, new_opt_state = adam.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        params, opt_state = jmp.select_tree(finite, (new_params, new_opt_state), (params, opt_state))
        return params, (opt_state, (ls.loss_scale, ls.counter))

    if_finite = optax.apply_if_finite(adam, max_consecutive_errors=5)

    def if_finite_step(params, opt_state, x, y):
        grads = jax.grad(loss_fn)(params, x, y)
        updates, opt_state = if_finite.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt = lsj.loss_scale_optimizer(adam, "dynamic")

    def ls_step(params, opt_state, x, y):
        grads = jax.grad(lambda p: lsj.get_scaled_loss(loss_fn(p, x, y), opt_state))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def ls_vag_step(params, opt_state, x, y):
        _, grads = lsj.value_and_grad(loss_fn, opt_state)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def ls_apply_step(params, opt_state, x, y):
        _, grads = lsj.value_and_grad(loss_fn, opt_state)(params, x, y)
        return lsj.apply_gradients(opt, grads, opt_state, params)

    return {
        "optax": (plain_step, adam.init),
        "jmp": (jmp_step, lambda p: (adam.init(p), (jnp.float32(2.0**15), jnp.zeros((), jnp.int32)))),
        "if_finite": (if_finite_step, if_finite.init),
        "lossscale": (ls_step, opt.init),
        "ls_vag": (ls_vag_step, opt.init),
        "ls_apply": (ls_apply_step, opt.init),
    }


def _flax_contender(opt):
    try:
        from lossscale.jax.train_state import TrainState
    except ImportError:  # flax not installed
        return None

    def flax_step(state, _unused, x, y):
        _, grads = lsj.value_and_grad(loss_fn, state.opt_state)(state.params, x, y)
        return state.apply_gradients(grads=grads), _unused

    def init(params):
        return jnp.zeros(())

    def wrap(params):
        return TrainState.create(apply_fn=None, params=params, tx=opt)

    return flax_step, init, wrap


def bench(n_params: int, batch: int, rounds: int, steps: int, donate: bool, passes_only: bool, seed: int = 0):
    """Per contender: the time per step of each round (seconds), and the compiled step's passes."""
    params0, x, y = make_problem(n_params, batch)
    table = dict(contenders())
    flax = _flax_contender(lsj.loss_scale_optimizer(optax.adam(1e-4), "dynamic"))
    runs, counts = {}, {}
    for name, entry in list(table.items()) + ([("ls_flax", flax)] if flax else []):
        step, init = entry[:2]
        wrap = entry[2] if len(entry) > 2 else (lambda p: p)
        fn = jax.jit(step, donate_argnums=(0, 1) if donate else ())
        params = wrap(jax.tree_util.tree_map(jnp.copy, params0))
        carry = (params, init(params0))
        compiled = fn.lower(*carry, x, y).compile()
        counts[name] = passes(compiled.as_text(), n_params)
        memory = compiled.memory_analysis()
        counts[name].temp_mb = getattr(memory, "temp_size_in_bytes", 0) / 2**20
        if passes_only:
            continue
        carry = fn(*carry, x, y)  # compile and warm up
        jax.block_until_ready(carry)
        runs[name] = [fn, carry]
    times: dict[str, list[float]] = {name: [] for name in runs}
    faults: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    rng = random.Random(seed)
    for _ in range(rounds if runs else 0):
        rng.shuffle(names)
        for name in names:
            fn, carry = runs[name]
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            for _ in range(steps):
                carry = fn(*carry, x, y)
            jax.block_until_ready(carry)
            times[name].append((time.perf_counter() - start) / steps)
            faults[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps)
            runs[name][1] = carry
    for name, count in counts.items():
        count.faults = statistics.median(faults[name]) if faults.get(name) else 0.0
    return times, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7], help="parameter counts")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10, help="steps timed per round")
    parser.add_argument("--donate", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--passes-only", action="store_true", help="print the compiled passes, time nothing")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, optax {optax.__version__}, device {jax.devices()[0].device_kind}, "
          f"batch {args.batch}, median of {args.rounds} shuffled rounds x {args.steps} steps; "
          f"load average {os.getloadavg()[0]:.2f}")
    modes = {"both": [True, False], "yes": [True], "no": [False]}[args.donate]
    for size in args.sizes:
        for donate in modes:
            t, counts = bench(int(size), args.batch, args.rounds, args.steps, donate, args.passes_only)
            print(f"\n{size:.0e} parameters, {'donated' if donate else 'not donated'}")
            print(f"  {'':>10} {'ms/step':>8} {'/ optax':>8} {'faults':>7}   passes over the state "
                  "(+ conditional branches)")
            for name, count in counts.items():
                branches = "".join(f" +{b.taken:.2f}" for b in count.branches)
                timing = ""
                if t:
                    ratio = statistics.median(a / b for a, b in zip(t[name], t["optax"]))
                    timing = f"{statistics.median(t[name]) * 1e3:8.2f} {ratio:8.3f} {count.faults:7.0f}"
                print(f"  {name:>10} {timing:>25}   {count.total:6.2f}{branches}  "
                      f"({count.kernels} kernels, {count.copies} copies; {count.temp_mb:.0f} MB of temporaries)")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
