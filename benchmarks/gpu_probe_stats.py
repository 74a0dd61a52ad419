"""Where the statistics' time goes on a GPU (CUDA only): torch's host time by operator, and what a JAX ``lax.cond``
costs inside a jitted step.

* torch: ``LossScaleOptimizer`` over fused AdamW on the 1M-parameter MLP of ``bench_stats.py``; per contender
  (``off``, ``N=16``, ``N=1``, ``auto``) the wall time per step, the operators per step, and the operators that take
  the most host time (``torch.profiler``, CPU activity).
* JAX: the jitted step of ``bench_stats.py`` with ``off``, ``N=16`` and ``N=1``, and ``off`` plus one ``lax.cond``
  whose true branch sums one gradient (``cond``): the wall time per step and the time the host spends dispatching
  (a conditional whose predicate XLA reads on the host makes dispatch wait for the device). ``--xla-flags`` reruns
  the JAX part in a subprocess under those ``XLA_FLAGS``.

Run:  python benchmarks/gpu_probe_stats.py [--part torch|jax|both] [--xla-flags "..."]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import time

WIDTH, LAYERS, BATCH = 500, 4, 64
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
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
                                      for _ in range(LAYERS))).to(device)
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
    keys = jax.random.split(jax.random.PRNGKey(0), LAYERS + 2)
    params0 = [{"w": jax.random.normal(k, (WIDTH, WIDTH)) / WIDTH**0.5, "b": jnp.zeros(WIDTH)} for k in keys[:LAYERS]]
    x, y = jax.random.normal(keys[-2], (BATCH, WIDTH)), jax.random.normal(keys[-1], (BATCH, WIDTH))

    def loss(p: list) -> jax.Array:
        h = x
        for layer in p:
            h = jnp.tanh(h @ layer["w"] + layer["b"])
        return jnp.mean((h - y) ** 2)

    rows = {}
    for name, (loss_scale, every) in {**CONTENDERS, "cond": ("dynamic", None)}.items():
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
        for _ in range(32):
            state = list(step(*state))
        jax.block_until_ready(state)
        walls, dispatch = [], []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(steps):
                state = list(step(*state))
            mid = time.perf_counter()
            jax.block_until_ready(state)
            walls.append((time.perf_counter() - start) / steps)
            dispatch.append((mid - start) / steps)
        rows[name] = (statistics.median(walls), statistics.median(dispatch))
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
