"""Held-out runs for ``AutoLossScale`` (issue 28): cases the rule was not tuned on.

Written and committed before the rule change of issue 28 and run on the old
rule first; the rule is tuned on ``auto_scale_experiment.py`` (sim, ae, lm),
never on these. Every run goes through the real bindings at their defaults
unless a case says otherwise, on models and data the experiment does not use,
with seeds 10 and 11:

* ``cancer``: a 30-64-64-1 GELU classifier on sklearn's ``load_breast_cancer``
  (standardised), torch CPU autocast float16, ``lossscale.torch.LossScaleOptimizer``
  around Adam (eps 1e-8/K), binary cross-entropy divided by K, batch 32, 400
  steps. Metric: held-out log-loss (nats, lower is better).
* ``digits-clf``: a 64-128-128-10 tanh classifier on sklearn's ``load_digits``
  (a classifier, not the demo's autoencoder), JAX float16 compute with float32
  master weights, ``lossscale.jax.loss_scale_optimizer`` around Adam, cross-entropy
  divided by K, batch 64, 400 steps. Metric: held-out cross-entropy (nats).
* ``start``: ``cancer`` at K = 1 with every policy started at 2**24 and 2**32
  (the start-up cascade): skips in the first 100 steps.
* ``spike``: ``cancer`` at K = 2**16 with the loss multiplied by 2**k on steps
  100, 130, ..., 340 (nine spikes of the same height, k in 12, 16, 20; the
  unscaled gradients' max is about 2**-20 here, so the TF rule's 2**15 has about
  20 bits of headroom and auto's "enough" scale about 12): the policy must learn
  the spike. The spiked step's update is what it is (the
  loss of that batch is larger): a skip refuses it.
* ``spike-jax`` (added later, with seeds 20 and 21, before the spike-cap change and not
  run on any rule before it was fixed): ``digits-clf`` at K = 2**16 with the loss
  multiplied by 2**k on the same steps, k in 12, 16, 20: the spike case on another
  model and binding.
* ``spike-flush`` (added with ``spike-jax``): ``cancer`` at K = 2**24 with spikes of
  k in 12, 20: where the TF rule flushes, a taller remembered spike must not cost
  flushing, and a skip that refuses a spike is not a loss.
* ``accum``: ``cancer`` with 8 micro-batches of 8 summed per step (each a
  float16 backward of its own, loss divided by K = 2**20 per micro-batch), the
  core rule fed the sum's statistics, ``micro_batches=8`` against ``1``; the
  flushed share is that of each micro-batch's float16 gradient (what the sum
  cannot show). ``auto_k1``/``auto1_k1``: the same with ``micro_batches=1``.

Policies: ``fp32`` (float32, reference), ``tf`` = ``"dynamic"`` (TensorFlow's
rule, 2**15, x2 per 2000 steps), ``auto`` = ``"auto"`` at its defaults (a
sample every 16 steps), ``auto1`` = ``"auto"`` with ``stats_every=1``.

Reported per case (mean over seeds and the range): skips in the first 100 steps
and in total; steps whose weight-gradient zero share exceeds float32's at the
same step by more than 1 percentage point ("flushed steps"); the final metric
and its difference from float32; the final log2 S. A skip on a spiked step where
the TF rule loses quality to flushing is marked in the notes column, not hidden.

Usage::

    python benchmarks/auto_scale_heldout.py [--quick] [--cases cancer digits-clf start spike accum] [--out FILE]

``--quick``: one seed, 200 steps, fewer K (a smoke run: minutes on a loaded 2-core machine).
Prints a markdown table, writes JSON (default /tmp/auto_scale_heldout.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import time
from typing import Any

import numpy as np

import lossscale
from lossscale import AutoLossScale, DynamicLossScale

POLICIES = ("fp32", "tf", "auto", "auto1")


def policy_for(name: str, initial: float | None = None) -> tuple[Any, int | None]:
    """(loss_scale, stats_every) for a binding; None stats_every = the binding's default."""
    if name == "tf":
        return (DynamicLossScale() if initial is None else DynamicLossScale(initial)), None
    auto = AutoLossScale() if initial is None else AutoLossScale(initial)
    return auto, (1 if name == "auto1" else None)


# ----------------------------------------------------------------------------- data


def split(x: np.ndarray, y: np.ndarray, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    cut = int(0.75 * len(x))
    tr, te = order[:cut], order[cut:]
    mean, std = x[tr].mean(0), x[tr].std(0) + 1e-6
    return ((x[tr] - mean) / std).astype(np.float32), y[tr], ((x[te] - mean) / std).astype(np.float32), y[te]


def cancer_data(seed: int) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    return split(d.data, d.target.astype(np.float32), seed)


def digits_data(seed: int) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return split(d.data / 16.0, d.target.astype(np.int32), seed)


def batches(n: int, steps: int, size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 7)
    return np.stack([rng.choice(n, size, replace=False) for _ in range(steps)])


# ----------------------------------------------------------------------------- torch: the cancer classifier


def cancer_model(seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(30, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)
    )


def cancer_loss(model: Any, x: Any, y: Any, half: bool) -> Any:
    import torch

    with torch.autocast("cpu", dtype=torch.float16, enabled=half):
        logits = model(x)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits.float().squeeze(-1), y)


def weight_zero_share(model: Any) -> float:
    import torch

    weights = [m.weight.grad for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return float(sum(int((g == 0).sum()) for g in weights) / sum(g.numel() for g in weights))


def run_cancer(name: str, k: int, seed: int, steps: int, initial: float | None = None,
               spikes: tuple[int, ...] = (), spike_bits: int = 0) -> dict[str, Any]:
    import torch

    from lossscale.torch import LossScaleOptimizer

    torch.set_num_threads(1)
    x_tr, y_tr, x_te, y_te = (torch.from_numpy(a) for a in cancer_data(seed))
    model = cancer_model(seed)
    inner = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8 / k)
    opt = None
    if name != "fp32":
        loss_scale, every = policy_for(name, initial)
        opt = LossScaleOptimizer(inner, loss_scale, stats_every=every)
    zeros, skips, scales = [], [], []
    start = time.perf_counter()
    for step, idx in enumerate(torch.from_numpy(batches(len(x_tr), steps, 32, seed))):
        (opt or inner).zero_grad()
        loss = cancer_loss(model, x_tr[idx], y_tr[idx], name != "fp32") / k
        if step in spikes:
            loss = loss * 2.0**spike_bits
        (opt.get_scaled_loss(loss) if opt else loss).backward()
        zeros.append(weight_zero_share(model))
        (opt or inner).step()
        skips.append(bool(opt.last_step_skipped) if opt else False)
        scales.append(float(opt.loss_scale) if opt else 1.0)
    with torch.no_grad():
        metric = float(cancer_loss(model, x_te, y_te, False))
    return record(zeros, skips, scales, metric, start)


def run_accum(name: str, k: int, seed: int, steps: int, micro: int = 8) -> dict[str, Any]:
    """Gradient accumulation through the core rule: ``micro`` float16 backwards summed, ``micro_batches`` as named."""
    import torch

    from lossscale import initial_state, next_state
    from lossscale._auto import initial_auto_state, next_auto_state
    from lossscale._stats import gradient_stats

    torch.set_num_threads(1)
    x_tr, y_tr, x_te, y_te = (torch.from_numpy(a) for a in cancer_data(seed))
    model = cancer_model(seed)
    params = list(model.parameters())
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    opt = torch.optim.Adam(params, lr=1e-3, eps=1e-8 / k)
    every = {"tf": None, "auto": 16, "auto1": 1, "auto_k1": 16, "auto1_k1": 1}.get(name)
    told = 1 if name.endswith("_k1") else micro
    policy = DynamicLossScale() if name == "tf" else AutoLossScale()
    state = initial_state(policy, torch)
    auto = initial_auto_state(policy, torch) if isinstance(policy, AutoLossScale) else None
    zeros, skips, scales = [], [], []
    order = batches(len(x_tr), steps * micro, 8, seed).reshape(steps, micro, 8)
    start = time.perf_counter()
    for step in range(steps):
        scale = state.loss_scale if name != "fp32" else torch.tensor(1.0)
        total = [torch.zeros_like(p) for p in params]
        micro_zero = []
        for idx in torch.from_numpy(order[step]):
            loss = cancer_loss(model, x_tr[idx], y_tr[idx], name != "fp32") / k
            grads = torch.autograd.grad(loss * scale, params)
            w = [g for g, p in zip(grads, params) if any(p is q for q in weights)]
            micro_zero.append(sum(int((g == 0).sum()) for g in w) / sum(g.numel() for g in w))
            for t, g in zip(total, grads):
                t.add_(g)
        zeros.append(float(np.mean(micro_zero)))
        stats = gradient_stats(total, torch, step)
        finite = torch.isfinite(stats.amax) & torch.isfinite(stats.rms_min)
        skips.append(not bool(finite))
        if bool(finite):
            for p, t in zip(params, total):
                p.grad = t / scale
            opt.step()
        if name == "tf":
            state = next_state(policy, state, finite, torch)
        elif auto is not None and name != "fp32":
            state, auto = next_auto_state(policy, state, auto, finite, stats, step % every == 0, torch,
                                          micro_batches=told)
        scales.append(float(state.loss_scale) if name != "fp32" else 1.0)
    with torch.no_grad():
        metric = float(cancer_loss(model, x_te, y_te, False))
    return record(zeros, skips, scales, metric, start)


# ----------------------------------------------------------------------------- JAX: the digits classifier


def run_digits(name: str, k: int, seed: int, steps: int, initial: float | None = None,
               spikes: tuple[int, ...] = (), spike_bits: int = 0) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import optax

    import lossscale.jax as lsj

    x_tr, y_tr, x_te, y_te = digits_data(seed)
    key = jax.random.PRNGKey(seed)
    sizes = [64, 128, 128, 10]
    params = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        params.append({"w": jax.random.normal(jax.random.fold_in(key, i), (a, b)) / math.sqrt(a), "b": jnp.zeros(b)})

    def forward(p: Any, x: Any) -> Any:
        for layer in p[:-1]:
            x = jnp.tanh(x @ layer["w"] + layer["b"])
        return x @ p[-1]["w"] + p[-1]["b"]

    def xent(logits: Any, y: Any) -> Any:
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y))

    inner = optax.adam(1e-3, eps=1e-8 / k)
    if name == "fp32":
        opt = lsj.loss_scale_optimizer(inner, 1.0)
    else:
        loss_scale, every = policy_for(name, initial)
        opt = lsj.loss_scale_optimizer(inner, loss_scale, stats_every=every)
    half = name != "fp32"
    state = opt.init(params)
    xs, ys = jnp.asarray(x_tr), jnp.asarray(y_tr)

    def step(params: Any, state: Any, idx: Any, spike: Any) -> Any:
        x, y = xs[idx], ys[idx]

        def loss_fn(p: Any) -> Any:
            if half:
                p = jax.tree.map(lambda a: a.astype(jnp.float16), p)
                x16 = x.astype(jnp.float16)
            else:
                x16 = x
            return lsj.get_scaled_loss(xent(forward(p, x16), y) / k * spike, state)

        grads = jax.grad(loss_fn)(params)
        total = sum(layer["w"].size for layer in grads)
        zeros = sum(jnp.sum(layer["w"] == 0, dtype=jnp.float32) for layer in grads) / total
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, (zeros, state.last_step_skipped, state.loss_scale)

    step = jax.jit(step)
    start = time.perf_counter()
    records = [None] * steps
    for i, idx in enumerate(batches(len(x_tr), steps, 64, seed)):
        spike = jnp.float32(2.0**spike_bits if i in spikes else 1.0)
        params, state, records[i] = step(params, state, idx, spike)
    zeros, skipped, scales = (np.asarray(jnp.stack(c)) for c in zip(*records))
    metric = float(xent(forward(params, jnp.asarray(x_te)), jnp.asarray(y_te)))
    return record(list(zeros), list(skipped), list(scales) if half else [1.0] * steps, metric, start)


# ----------------------------------------------------------------------------- records and tables


def record(zeros: list, skips: list, scales: list, metric: float, start: float) -> dict[str, Any]:
    skips_a = np.asarray(skips, bool)
    return {
        "zeros": np.asarray(zeros, np.float64),
        "skips_first100": int(skips_a[:100].sum()),
        "skips": int(skips_a.sum()),
        "metric": metric,
        "final_log2_scale": math.log2(float(scales[-1])),
        "scale_changes": int(np.sum(np.diff(np.asarray(scales, np.float64)) != 0)),
        "seconds": time.perf_counter() - start,
    }


COLUMNS = ("skips_first100", "skips", "flushed_steps", "metric", "vs_fp32", "final_log2_scale", "scale_changes")


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in (*COLUMNS, "seconds"):
        values = [r[key] for r in runs if key in r]
        if not values:
            continue
        mean = statistics.fmean(values)
        digits = 3 if key in ("metric", "vs_fp32") else 1
        out[key] = (f"{mean:.{digits}f} ({min(values):.{digits}f} to {max(values):.{digits}f})"
                    if len(values) > 1 and min(values) != max(values) else f"{mean:.{digits}f}")
    out["per_seed_metric"] = [round(r["metric"], 4) for r in runs]
    out["per_seed_skips"] = [r["skips"] for r in runs]
    return out


def grid(case: str, train: Any, ks: list[int], policies: list[str], seeds: list[int], steps: int,
         **kwargs: Any) -> list[dict[str, Any]]:
    """Every K x policy x seed; fp32 first; flushed steps counted against fp32's zero share at the same step."""
    rows = []
    names = ["fp32", *[p for p in policies if p != "fp32"]]
    for exp in ks:
        baseline: dict[int, dict[str, Any]] = {}
        for name in names:
            runs = []
            for seed in seeds:
                run = train(name, 2**exp, seed, steps, **kwargs)
                zeros = run.pop("zeros")
                if name == "fp32":
                    baseline[seed] = {"zeros": zeros, "metric": run["metric"]}
                base = baseline[seed]
                run["flushed_steps"] = int((zeros > base["zeros"] + 0.01).sum())
                run["vs_fp32"] = run["metric"] - base["metric"]
                runs.append(run)
            label = f"{case} K=2^{exp}" + "".join(f" {k}={v}" for k, v in kwargs.items() if k != "spikes")
            row = {"case": label, "policy": name, **summary(runs)}
            rows.append(row)
            print(row, flush=True)
    return rows


def spike_notes(rows: list[dict[str, Any]]) -> None:
    """Mark auto's skips on spiked steps where the TF rule lost quality to flushing."""
    by_case: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_case.setdefault(row["case"], {})[row["policy"]] = row
    for rows_ in by_case.values():
        tf = rows_.get("tf")
        if not tf:
            continue
        tf_flushed = float(str(tf.get("flushed_steps", "0")).split()[0])
        for name, row in rows_.items():
            if name.startswith("auto") and tf_flushed > 0 and float(str(row["skips"]).split()[0]) > 0:
                row["notes"] = (f"TF flushed on {tf_flushed:.0f} steps; auto's skips refuse spiked batches "
                                "(quality in the metric column)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cases", nargs="+", default=["cancer", "digits-clf", "start", "spike", "accum"],
                        help="also: spike-jax, spike-flush (added later, see the module docstring)")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--out", default="/tmp/auto_scale_heldout.json")
    args = parser.parse_args()
    seeds = args.seeds or ([10] if args.quick else [10, 11])
    steps = args.steps or (200 if args.quick else 400)
    policies = args.policies
    rows: list[dict[str, Any]] = []
    if "cancer" in args.cases:
        rows += grid("cancer", run_cancer, [20] if args.quick else [16, 24], policies, seeds, steps)
    if "digits-clf" in args.cases:
        rows += grid("digits-clf", run_digits, [20] if args.quick else [16, 24], policies, seeds, steps)
    if "start" in args.cases:
        for initial in (24, 32):
            rows += grid("start", run_cancer, [0], policies, seeds, min(steps, 200), initial=2.0**initial)
        rows += grid("start jax", run_digits, [0], policies, seeds, min(steps, 200), initial=2.0**32)
    if "spike" in args.cases:
        spikes = tuple(range(100, steps - 50, 30))
        for bits in (12, 16, 20):
            rows += grid("spike", run_cancer, [16], policies, seeds, steps, spikes=spikes, spike_bits=bits)
    if "spike-jax" in args.cases:  # added with the spike-cap change, before it
        spikes = tuple(range(100, steps - 50, 30))
        for bits in (12, 16, 20):
            rows += grid("spike jax", run_digits, [16], policies, seeds, steps, spikes=spikes, spike_bits=bits)
    if "spike-flush" in args.cases:  # added with the spike-cap change, before it
        spikes = tuple(range(100, steps - 50, 30))
        for bits in (12, 20):
            rows += grid("spike", run_cancer, [24], policies, seeds, steps, spikes=spikes, spike_bits=bits)
    if "accum" in args.cases:
        accum = [p for p in ("fp32", "tf", "auto", "auto_k1", "auto1", "auto1_k1") if p.split("_")[0] in policies]
        rows += grid("accum 8x8", run_accum, [20] if args.quick else [20, 24], accum, seeds, min(steps, 200))
    spike_notes(rows)
    columns = ["case", "policy", *COLUMNS, "notes"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    git = ["git", "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, check=False, capture_output=True, text=True).stdout.strip()
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "commit": commit, "lossscale": lossscale.__version__, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
