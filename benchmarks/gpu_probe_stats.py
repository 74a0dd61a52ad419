"""Where the statistics' time goes on a GPU (CUDA only): torch's host time by operator, and what a JAX ``lax.cond``
costs inside a jitted step.

* torch: ``LossScaleOptimizer`` over fused AdamW on the 1M-parameter MLP of ``bench_stats.py``; per contender
  (``off``, ``N=16``, ``N=1``, ``auto``) the wall time per step, the operators per step, and the operators that take
  the most host time (``torch.profiler``, CPU activity).
* JAX: the jitted step of ``bench_stats.py`` with ``off``, ``N=16``, ``N=1`` and ``auto``, ``off`` plus one
  ``lax.cond`` whose true branch sums one gradient (``cond``), ``off`` with the finite check as ``all(isfinite)``
  per leaf (``off, isfinite check``) or as the CPU's sum with the exact check in a ``lax.cond`` (``off, sum
  check``) instead of the library's ``isfinite(max|g|)`` per leaf off the CPU, and ``N=16`` with the sum check in
  the unsampled branch (``sum check``), with its ``lax.cond`` returning one packed vector (``packed cond``), or
  with no conditional at all (``branch-free``: the sample measured on every step, its ``max|g|`` the finite check,
  kept by ``where``), in interleaved rounds: the wall time per step and the time the host spends dispatching
  (a conditional whose predicate XLA reads on the host makes dispatch wait for the device). ``--xla-flags`` reruns
  the JAX part in a subprocess under those ``XLA_FLAGS``. Two more ``N=16`` steps:

  - ``N=16, one switch``: one ``lax.switch`` per step serves both the sum check's exact fallback and the sample
    (2 due, else 0 sum finite, else 1 exact check): does one conditional per step, as ``off``'s, cost what it does?
  - ``N=16, late cond``: ``off``'s finite check, then the sample's ``lax.cond`` with its predicate passed through
    ``lax.optimization_barrier`` with the updates and the inner state: does a host wait after the update kernels
    hide behind them? (XLA's CPU compiler drops the barrier before scheduling, its GPU compiler after.)

  ``--check`` first runs each of the three new ones (``one switch``, ``late cond``, ``branch-free``) and the library's ``stats_every=16`` step for 40 steps on the same gradients
  (Inf, NaN and overflowing sums among them) and exits unless updates, scale state, sample and count agree bit for bit.

Run:  python benchmarks/gpu_probe_stats.py [--part torch|jax|both] [--check] [--xla-flags "..."]
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


def switch_sample_if_due(every: int, grads: list, stats: object, axes: object = None, check: object = None) -> tuple:
    """``sample_if_due`` (with a check; a ``Measurement``) as one ``lax.switch``, which also stands for ``all_finite``'s own conditional:
    index 2 when due (the measurement; finite = isfinite(amax)), else 0 when the sum check is finite (finite, the kept
    sample), else 1 (the exact check, the kept sample). ``check`` is ignored: the finite flag is ``all_finite``'s."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from lossscale.jax._grads import _exactly_finite, sum_checks
    from lossscale.jax._state import Measurement
    from lossscale.jax._stats import _varying_as, is_due, measure

    count, kept = jnp.asarray(stats.count), stats.sample
    flag, summed, _ = sum_checks(grads)  # all_finite's checks before its cond
    summed = jnp.ones((), bool) if summed is None else summed

    def take(g: list) -> tuple:
        sample = measure(g, count, axes)
        return _varying_as(jnp.isfinite(sample.amax), g), sample

    def fast(g: list) -> tuple:
        return _varying_as(flag & summed, g), jax.tree_util.tree_map(jnp.asarray, kept)

    def exact(g: list) -> tuple:
        wide = [leaf for leaf in g if leaf.dtype in (jnp.float32, jnp.float64)]
        return _varying_as(flag & _exactly_finite(wide), g), jax.tree_util.tree_map(jnp.asarray, kept)

    if every == 1:
        return Measurement(*take(grads), True)
    due = is_due(every, count)
    index = jnp.where(due, 2, jnp.where(summed, 0, 1)).astype(jnp.int32)
    return Measurement(*lax.switch(index, (fast, exact, take), list(grads)), due)


def branch_free_sample_if_due(every: int, grads: list, stats: object, axes: object = None,
                              check: object = None) -> tuple:
    """``sample_if_due`` (with a check) with no conditional: the sample measured on every step (one read pass, the
    finite check's: ``isfinite(amax)``, max propagates NaN) and kept where due by ``where``."""
    import jax.numpy as jnp

    from lossscale._stats import GradientStats
    from lossscale.jax._grads import _varying_as
    from lossscale.jax._state import Measurement
    from lossscale.jax._stats import is_due, measure

    count = jnp.asarray(stats.count)
    sample = measure(grads, count, axes)
    due = jnp.asarray(True) if every == 1 else is_due(every, count)
    kept = GradientStats(*(jnp.where(due, new, jnp.asarray(old)) for new, old in zip(sample, stats.sample)))
    return Measurement(_varying_as(jnp.isfinite(sample.amax), grads), kept, due)


def late_cond_optimizer(inner: object, loss_scale: object = None, *, stats_every: int | None = None) -> object:
    """``lsj.loss_scale_optimizer(inner, loss_scale, stats_every=...)`` (no clip, axes, history or skip limit) with its
    own stepper: the finite flag by ``all_finite`` (``off``'s), the updates, then the sample's ``lax.cond`` on
    ``is_due`` passed through ``lax.optimization_barrier`` with the updates (the barrier's updates are returned)."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax import lax

    import lossscale.jax as lsj
    from lossscale._resolve import resolve_loss_scale
    from lossscale._sampler import check_stats_every, is_due
    from lossscale.jax._grads import all_finite, check_gradients, unscale
    from lossscale.jax._state import LossScaleOptimizerState, Measurement, advance
    from lossscale.jax._stats import measure
    from lossscale.jax._step import _chosen

    policy = resolve_loss_scale(loss_scale)
    every = check_stats_every(stats_every, policy)
    if every is None or every == 1 or policy.rule_params().min_scale < 1:
        raise ValueError("late_cond_optimizer: the library's fused path only (stats_every >= 2, a scale >= 1)")
    init = lsj.loss_scale_optimizer(inner, loss_scale, stats_every=stats_every).init
    inner = optax.with_extra_args_support(inner)

    def update(grads: object, state: object, params: object = None, **extra_args: object) -> tuple:
        leaves = check_gradients(grads)
        if not all(leaf.dtype in (jnp.float32, jnp.float16, jnp.bfloat16) for leaf in leaves):
            raise TypeError("late_cond_optimizer: float32, float16 and bfloat16 gradients only (the fused path's)")
        scale = state.loss_scale
        finite = all_finite(grads)

        def taken(grads: object, inner_state: object, params: object) -> tuple:
            return inner.update(unscale(grads, scale), inner_state, params, **extra_args)

        updates, new_inner = _chosen(finite, taken, (grads, state.inner_state, params), (None, state.inner_state))
        count = jnp.asarray(state.stats.count)
        # the inner state too: Adam's moments may come out of kernels of their own
        due, updates, new_inner = lax.optimization_barrier((is_due(every, count), updates, new_inner))
        sample = lax.cond(due, lambda g: measure(g, count, None),
                          lambda g: jax.tree_util.tree_map(jnp.asarray, state.stats.sample), leaves)
        new_state: LossScaleOptimizerState = advance(policy, state, finite, new_inner, Measurement(None, sample, due))
        return updates, new_state

    return optax.GradientTransformationExtraArgs(init, update)


def check_jax_variants(steps: int = 40) -> None:
    """Each new ``N=16`` variant beside the library's own ``stats_every=16`` step, jitted, from the same state on the
    same gradients for ``steps`` steps: updates, parameters, inner state, scale state, kept sample (every field) and
    count equal bit for bit, for the ``dynamic`` and ``auto`` policies; SystemExit naming the first difference."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import lossscale.jax as lsj
    import lossscale.jax._step as step_module

    params0, mlp_loss, x, y = jax_mlp(WIDTH, LAYERS)
    # count -> what goes into the gradients: Inf/NaN in one element, or a whole leaf of 3e38 (the float32 sum
    # overflows, every value finite: the sum check says no, the exact check yes); 0, 16, 32 are sampled
    poison = {3: np.inf, 9: "huge", 16: np.nan, 20: -np.inf, 27: np.inf, 32: "huge", 33: "huge", 37: np.nan}

    def poisoned(g: list, i: int) -> list:
        g = jax.tree_util.tree_map(jnp.array, g)
        what = poison.get(i)
        if what == "huge":
            g[1]["w"] = jnp.full_like(g[1]["w"], 3e38)
        elif what is not None:
            g[2]["b"] = g[2]["b"].at[7].set(what)
        return g

    def same(a: object, b: object) -> bool:
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

    grad_fn = jax.jit(lambda p, s: jax.grad(lambda p: lsj.get_scaled_loss(mlp_loss(p, x, y), s))(p))
    for policy in ("dynamic", "auto"):
        for variant in ("N=16, one switch", "N=16, late cond", "N=16, branch-free"):
            ref_opt = lsj.loss_scale_optimizer(optax.adam(1e-4), policy, stats_every=16)
            build = late_cond_optimizer if variant == "N=16, late cond" else lsj.loss_scale_optimizer
            var_opt = build(optax.adam(1e-4), policy, stats_every=16)
            patch = {"N=16, one switch": {"sample_if_due": switch_sample_if_due},
                     "N=16, branch-free": {"sample_if_due": branch_free_sample_if_due}}.get(variant, {})
            ref_update, var_update = jax.jit(ref_opt.update), jax.jit(var_opt.update)
            p_ref = p_var = jax.tree_util.tree_map(jnp.array, params0)
            s_ref, s_var = ref_opt.init(p_ref), var_opt.init(p_var)
            skipped, sampled = [], []
            for i in range(steps):
                g = poisoned(grad_fn(p_ref, s_ref), i)
                u_ref, s_ref = ref_update(g, s_ref, p_ref)
                shipped = {n: getattr(step_module, n) for n in patch}
                try:  # the variant's trace (its first call) under its patch; the reference's never
                    for n, f in patch.items():
                        setattr(step_module, n, f)
                    u_var, s_var = var_update(g, s_var, p_var)
                finally:
                    for n, f in shipped.items():
                        setattr(step_module, n, f)
                p_ref, p_var = optax.apply_updates(p_ref, u_ref), optax.apply_updates(p_var, u_var)
                parts = {
                    "updates": (u_ref, u_var), "params": (p_ref, p_var),
                    "inner state": (s_ref.inner_state, s_var.inner_state),
                    **{f"loss_scale_state.{k}": (a, b) for k, a, b in zip(
                        s_ref.loss_scale_state._fields, s_ref.loss_scale_state, s_var.loss_scale_state)},
                    **{f"sample.{k}": (a, b) for k, a, b in zip(
                        s_ref.stats.sample._fields, s_ref.stats.sample, s_var.stats.sample)},
                    "count": (s_ref.stats.count, s_var.stats.count), "auto state": (s_ref.stats.auto, s_var.stats.auto),
                }
                for what, (a, b) in parts.items():
                    a_leaves, b_leaves = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
                    if len(a_leaves) != len(b_leaves) or not all(map(same, a_leaves, b_leaves)):
                        raise SystemExit(f"check failed: {variant} ({policy}) differs from the library's "
                                         f"stats_every=16 step in {what} after step {i} (poison {poison.get(i)!r})")
                if int(s_ref.stats.sample.step) == i:
                    sampled.append(i)
                if bool(s_ref.last_step_skipped):
                    skipped.append(i)
            if not (sampled == [0, 16, 32] and skipped and set(skipped) & set(sampled)):
                raise SystemExit(f"check failed: {variant} ({policy}): the run did not cover what it should "
                                 f"(sampled {sampled}, skipped {skipped})")
            print(f"check ok: {variant} ({policy}) == library stats_every=16, bit for bit, {steps} steps "
                  f"(sampled {sampled}, skipped {skipped}, scale {float(s_ref.loss_scale):g})")


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

    import lossscale.jax._step as step_module
    from lossscale._stats import GradientStats
    from lossscale.jax._grads import _by_sums, _exactly_finite
    from lossscale.jax._state import Measurement
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
        return Measurement(finite, GradientStats(*fields), due)

    def exact(tree: object) -> jax.Array:
        return _exactly_finite(jax.tree_util.tree_leaves(tree))

    def summed(tree: object) -> jax.Array:  # the library's check on a CPU: a sum, the exact check in a lax.cond
        return _by_sums(jax.tree_util.tree_leaves(tree))

    names = ("all_finite", "sample_if_due")
    shipped = {n: getattr(step_module, n) for n in names}
    patches = {  # what each variant puts in place of the step's finite check (both branches') or its sample
        "off, isfinite check": {"all_finite": exact},
        "off, sum check": {"all_finite": summed},
        "N=16, sum check": {"all_finite": summed},
        "N=16, packed cond": {"sample_if_due": packed_sample_if_due},
        "N=16, one switch": {"sample_if_due": switch_sample_if_due},  # one conditional per step
        "N=16, branch-free": {"sample_if_due": branch_free_sample_if_due},  # none
    }
    builders = {"N=16, late cond": late_cond_optimizer}  # variants with their own stepper
    runs = {}
    variants = {**CONTENDERS, "cond": ("dynamic", None), **{n: ("dynamic", 16 if "N=16" in n else None) for n in patches},
                **{n: ("dynamic", 16) for n in builders}}
    for name, (loss_scale, every) in variants.items():
        for attr in names:
            setattr(step_module, attr, patches.get(name, {}).get(attr, shipped[attr]))
        opt = builders.get(name, lsj.loss_scale_optimizer)(optax.adam(1e-4), loss_scale, stats_every=every)

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
        setattr(step_module, attr, shipped[attr])
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
    parser.add_argument("--check", action="store_true",
                        help="first check the new JAX variants against the library's stats_every=16 step, bit for bit")
    args = parser.parse_args()
    if args.part in ("torch", "both"):
        torch_part(args.steps)
    if args.part in ("jax", "both"):
        if args.check:
            check_jax_variants()
            sys.stdout.flush()
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
