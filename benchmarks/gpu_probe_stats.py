"""Where the statistics' time goes on a GPU (CUDA only): torch's host time by operator, and what a JAX ``lax.cond``
costs inside a jitted step.

* torch: ``LossScaleOptimizer`` over fused AdamW on the 1M-parameter MLP of ``bench_stats.py``; per contender
  (``off``, ``N=16``, ``N=1``, ``auto``) the wall time per step, the operators per step, and the operators that take
  the most host time (``torch.profiler``, CPU activity).
* JAX: the jitted step of ``bench_stats.py`` with ``off``, ``N=16``, ``N=1`` and ``auto``, ``off`` plus one
  ``lax.cond`` whose true branch sums one gradient (``cond``), and ``off`` with the finite check as
  ``all(isfinite)`` per leaf instead of a sum with the exact check in a ``lax.cond`` (``off, isfinite check``),
  and ``N=16`` with ``all(isfinite)`` or the sum check in the unsampled branch (the library takes the first on a
  GPU, the second elsewhere) or with its ``lax.cond`` returning one packed vector (``packed cond``), in
  interleaved rounds: the wall time per step and the time the host spends dispatching
  (a conditional whose predicate XLA reads on the host makes dispatch wait for the device). ``--xla-flags`` reruns
  the JAX part in a subprocess under those ``XLA_FLAGS``.

Run:  python benchmarks/gpu_probe_stats.py [--part torch|jax|both] [--xla-flags "..."]
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import subprocess
import sys
import time

from bench_stats import jax_mlp, torch_mlp  # the models bench_stats.py times (this script's folder)

WIDTH, LAYERS, BATCH = 500, 4, 64  # bench_stats.py's 1M-parameter MLP
CONTENDERS = {"off": ("dynamic", None), "N=16": ("dynamic", 16), "N=1": ("dynamic", 1), "auto": ("auto", None)}


def torch_part(steps: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lossscale.torch import LossScaleOptimizer

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only to try the script
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    x, y = torch.randn(BATCH, WIDTH, device=device), torch.randn(BATCH, WIDTH, device=device)
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")
    for name, (loss_scale, every) in CONTENDERS.items():
        model = torch_mlp(WIDTH, LAYERS, device)
        opt = LossScaleOptimizer(torch.optim.AdamW(model.parameters(), 1e-4, fused=True), loss_scale,
                                 stats_every=every)

        def run(n: int, model: torch.nn.Module = model, opt: LossScaleOptimizer = opt) -> None:
            for _ in range(n):
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device, dtype=torch.float16):
                    loss = torch.nn.functional.mse_loss(model(x).float(), y)
                opt.get_scaled_loss(loss).backward()
                opt.step()

        run(32)
        sync()
        walls = []
        for _ in range(7):
            start = time.perf_counter()
            run(steps)
            sync()
            walls.append((time.perf_counter() - start) / steps)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run(steps)
            sync()
        table = collections.defaultdict(lambda: [0, 0.0])
        for event in prof.key_averages():
            table[event.key][0] += event.count
            table[event.key][1] += event.self_cpu_time_total
        ops = sum(c for k, (c, _) in table.items() if k.startswith("aten::"))
        print(f"\n## torch {name}: {statistics.median(walls) * 1e3:.3f} ms/step (median of 7 x {steps}), "
              f"{ops / steps:.1f} aten ops/step")
        for key, (count, us) in sorted(table.items(), key=lambda kv: -kv[1][1])[:14]:
            print(f"  {key[:48]:48s} {count / steps:7.2f}/step {us / steps:8.1f} us/step")


def jax_part(steps: int) -> None:
    import jax
    import jax.numpy as jnp
    import optax
    from jax import lax

    import lossscale.jax as lsj

    print(f"# jax {jax.__version__} on {jax.devices()}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    params0, mlp_loss, x, y = jax_mlp(WIDTH, LAYERS)

    def loss(p: list) -> jax.Array:
        return mlp_loss(p, x, y)

    import lossscale.jax._optimizer as optimizer_module
    from lossscale._stats import GradientStats
    from lossscale.jax._grads import _exactly_finite
    from lossscale.jax._stats import is_due, measure

    def packed_sample_if_due(every: int, grads: list, stats: object, axes: object = None, check: object = None) -> tuple:
        """``sample_if_due`` (with ``check``) whose ``lax.cond`` returns the finite flag and one float32 vector, not 11 arrays."""
        count, kept = jnp.asarray(stats.count), stats.sample

        def pack(sample: GradientStats) -> jax.Array:
            return jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in sample[1:]])

        def sampled_branch(g: list) -> tuple:
            sample = measure(g, count, None)
            return jnp.isfinite(sample.amax), pack(sample)

        due = is_due(every, count)
        finite, flat = lax.cond(due, sampled_branch, lambda g: (check(g), pack(kept)), grads)
        fields, start = [jnp.where(due, count, kept.step)], 0
        for x in kept[1:]:
            fields.append(flat[start:start + x.size].reshape(x.shape))
            start += x.size
        return finite, GradientStats(*fields), due

    def exact(tree: object) -> jax.Array:
        return _exactly_finite(jax.tree_util.tree_leaves(tree))

    names = ("all_finite", "nested_all_finite", "sample_if_due")
    shipped = {n: getattr(optimizer_module, n) for n in names}
    patches = {  # what each variant puts in place of the step's plain check, its nested check, its sample
        "off, isfinite check": {"all_finite": exact},
        "N=16, isfinite check": {"nested_all_finite": exact},  # the library's choice on a GPU
        "N=16, sum check": {"nested_all_finite": shipped["all_finite"]},  # its choice elsewhere
        "N=16, packed cond": {"sample_if_due": packed_sample_if_due},
    }
    runs = {}
    variants = {**CONTENDERS, "cond": ("dynamic", None), **{n: ("dynamic", 16 if "N=16" in n else None) for n in patches}}
    for name, (loss_scale, every) in variants.items():
        for attr in names:
            setattr(optimizer_module, attr, patches.get(name, {}).get(attr, shipped[attr]))
        opt = lsj.loss_scale_optimizer(optax.adam(1e-4), loss_scale, stats_every=every)

        def step(p: list, s: object, c: jax.Array, opt: object = opt, name: str = name) -> tuple:
            g = jax.grad(lambda p: lsj.get_scaled_loss(loss(p), s))(p)
            u, s = opt.update(g, s, p)
            if name == "cond":  # one conditional with a real reduction in it (XLA turns tiny ones into selects)
                c = c + lax.cond(c % 16 == 0, lambda g: jnp.sum(g[0]["w"] ** 2), lambda g: jnp.float32(1), g)
            return optax.apply_updates(p, u), s, c

        step = jax.jit(step, donate_argnums=(0, 1))
        state = [jax.tree.map(jnp.array, params0)]
        state += [opt.init(state[0]), jnp.zeros((), jnp.float32)]

        def run(n: int, step: object = step, state: list = state) -> tuple[float, float]:
            start = time.perf_counter()
            for _ in range(n):
                state[:] = step(*state)
            mid = time.perf_counter()
            jax.block_until_ready(state)
            return (time.perf_counter() - start) / n, (mid - start) / n

        run(32)  # traced here, under this variant's check
        runs[name] = run
    for attr in names:
        setattr(optimizer_module, attr, shipped[attr])
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(9):  # interleaved rounds in a shuffled order: a slow spell hits every variant alike
        for name in random.sample(list(runs), len(runs)):
            times[name].append(runs[name](steps))
    rows = {name: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts))
            for name, ts in times.items()}
    base = rows["off"][0]
    print("\n| jax step | wall ms/step | over off | host dispatch ms/step |\n|---|---|---|---|")
    for name, (wall, disp) in rows.items():
        print(f"| {name} | {wall * 1e3:.3f} | {wall / base:.3f} | {disp * 1e3:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("torch", "jax", "both"), default="both")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--xla-flags", action="append", default=[], help="rerun the JAX part under these XLA_FLAGS")
    args = parser.parse_args()
    if args.part in ("torch", "both"):
        torch_part(args.steps)
    if args.part in ("jax", "both"):
        jax_part(args.steps)
        sys.stdout.flush()
        for flags in args.xla_flags:
            env = {**os.environ, "XLA_FLAGS": flags}
            done = subprocess.run([sys.executable, __file__, "--part", "jax", "--steps", str(args.steps)], env=env,
                                  check=False, capture_output=True, text=True, timeout=120)
            print(done.stdout[done.stdout.find("# jax"):] if done.returncode == 0 else
                  f"XLA_FLAGS={flags!r} failed: {done.stderr.strip().splitlines()[-3:]}")


if __name__ == "__main__":
    main()
