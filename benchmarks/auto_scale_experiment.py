"""The experiment that decides whether ``AutoLossScale`` becomes the default (issue 20, item 3).

Three workloads, every policy on the same data, seeds and code path:

* ``sim``: recorded-magnitude simulation (numpy, no training). Per step, each
  of 8 tensors has a true RMS ``2**(level + offset_t + noise)`` and a max 3 bits
  above; float16 flushes a Gaussian tensor's share ``erf(2**-25 / (S rms sqrt 2))``;
  a step overflows when ``S * amax * 2**act`` passes 65504 (``act`` = 1 bit: an
  activation gradient the parameter gradients do not show). Outlier batches
  multiply every gradient by ``2**k`` (k in 2..12) for one step, every ~1000
  steps. Scenarios over 100k steps: ``steady`` (level -20), ``shrink`` (-10 to
  -40 over the first 20k steps, as gradients fall with the loss or a K switch),
  ``grow`` (-40 to -10 over 20k steps), ``start32`` (level -4, initial scale 2**32
  for every policy: the start-up cascade). Added for the spike cap (before changing
  it): ``tall`` (level -20 with a spike every 30 steps from step 20k, 16, 18, 20 and
  22 bits tall in four phases of 2500 steps), ``tall-wide`` (the same with the
  tensors' RMS spread over 16 bits instead of 10) and ``tall-narrow`` (over 4 bits).
* ``ae``: the demo's digits autoencoder (``lossscale.demo``'s data, model,
  batches and Adam), 1000 steps, loss divided by K, torch (autocast float16)
  and JAX (float16 compute, float32 master weights).
* ``lm``: a 2-layer transformer language model on a generated corpus (a
  random order-2 Markov chain over 48 symbols), torch CPU autocast float16.

Policies: ``tf`` = ``DynamicLossScale()`` (2**15, x2 per 2000 steps), ``torch`` =
the same from 2**16 (GradScaler's defaults), ``auto`` = ``AutoLossScale()`` with
statistics every step, ``auto16`` = every 16th step; ``fp32`` / ``fp16`` (no
scaling) as references where there is training.

The torch runs use one loop for every policy (the core rule over torch
tensors: scale, backward, measure, skip or unscale and step), not the
binding, so that every policy pays the same measurement (the zero share that
the tables report is measured every step for all policies). The JAX runs use
``lossscale.jax.loss_scale_optimizer(..., stats_every=N)``.

Reported per case (mean over seeds, and the range): skipped steps in the first
100 steps and in total; steps with more than 1% of the weight gradients
exactly zero (flushed); in the simulation also the steps with more than 1%
under float16's smallest normal (``subnormal_steps``: precision lost, not yet
zero); the final metric (PSNR dB, or held-out loss in nats); seconds per run (a loaded 2-core machine: indicative only).

Usage::

    python benchmarks/auto_scale_experiment.py sim [--steps 100000] [--seeds 0 1 2]
    python benchmarks/auto_scale_experiment.py ae --framework torch --k 10 16 20 24 [--seeds 0 1 2]
    python benchmarks/auto_scale_experiment.py ae --framework jax --k 10 16 20 24
    python benchmarks/auto_scale_experiment.py lm [--k 12] [--steps 150]

Each prints a markdown table and writes ``--out`` (JSON, default under /tmp).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

import numpy as np

import lossscale
from lossscale import AutoLossScale, DynamicLossScale, initial_state, next_state
from lossscale._auto import initial_auto_state, next_auto_state
from lossscale._stats import GradientStats

POLICIES: dict[str, tuple[Any, int | None]] = {
    "tf": (DynamicLossScale(2.0**15, 2000), None),
    "torch": (DynamicLossScale(2.0**16, 2000), None),
    "auto": (AutoLossScale(), 1),
    "auto16": (AutoLossScale(), 16),
    "auto_b2": (AutoLossScale(underflow_bits=2), 1),  # a variant: "enough" 6 bits lower
}


# ----------------------------------------------------------------------------- the policy loop, any xp


class Scaler:
    """One policy's state over ``xp``: the core rule, fed the finite flag and (when sampled) the statistics."""

    def __init__(self, name: str, xp: Any, initial: float | None = None):
        policy, self.every = POLICIES[name]
        if initial is not None:
            cls = type(policy)
            policy = cls(initial, 2000) if cls is DynamicLossScale else AutoLossScale.from_config(
                {**policy.get_config(), "initial_loss_scale": initial})
        self.policy, self.xp = policy, xp
        self.state = initial_state(policy, xp)
        self.auto = initial_auto_state(policy, xp) if isinstance(policy, AutoLossScale) else None
        self.step = 0

    @property
    def scale(self) -> float:
        return float(self.state.loss_scale)

    def update(self, finite: Any, stats: Any) -> None:
        xp = self.xp
        finite = xp.asarray(bool(finite)) if isinstance(finite, (bool, np.bool_)) else finite
        if self.auto is None:
            self.state = next_state(self.policy, self.state, finite, xp)
        else:
            sampled = self.every is not None and self.step % self.every == 0
            self.state, self.auto = next_auto_state(self.policy, self.state, self.auto, finite, stats, sampled, xp)
        self.step += 1


def summary(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for key in keys:
        values = [r[key] for r in runs]
        mean = statistics.fmean(values)
        out[key] = f"{mean:.2f} ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else f"{mean:.2f}"
    return out


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- sim


SIM_SIZES = np.array([4096, 4096, 1024, 1024, 256, 256, 64, 64], float)
SIM_OFFSETS = np.array([0, -1, -2, -3, -4, -6, -8, -10], float)
#: ``tall-wide``: the tensors' RMS spread over 16 bits, so "enough" leaves little room under overflow.
SIM_WIDE_OFFSETS = np.array([0, -2, -4, -6, -8, -10, -13, -16], float)
#: ``tall-narrow``: spread over 4 bits, so "enough" leaves much room under overflow.
SIM_NARROW_OFFSETS = np.array([0, -0.5, -1, -1.5, -2, -2.5, -3, -4], float)


def tall_spikes(steps: int) -> np.ndarray:
    """``tall``/``tall-wide``: from step 20000, four phases of 2500 steps with a spike every 30 steps, 16, 18, 20
    and 22 bits tall (taller than the 16-bit margin cap of the issue-28 rule)."""
    heights = np.zeros(steps)
    for phase, bits in enumerate((16, 18, 20, 22)):
        begin = 20000 + 2500 * phase
        heights[begin:min(begin + 2500, steps):30] = bits
    return heights


def sim_level(scenario: str, steps: int) -> np.ndarray:
    t = np.arange(steps)
    ramp = np.clip(t / 20000, 0, 1)
    return {
        "steady": np.full(steps, -20.0),
        "shrink": -10.0 - 30.0 * ramp,
        "grow": -40.0 + 30.0 * ramp,
        "start32": np.full(steps, -4.0),
        "tall": np.full(steps, -20.0),
        "tall-wide": np.full(steps, -20.0),
        "tall-narrow": np.full(steps, -20.0),
    }[scenario]


def sim_run(scenario: str, name: str, steps: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    level = sim_level(scenario, steps) + rng.normal(0, 0.3, steps)
    outlier = np.zeros(steps)
    spikes = np.arange(500, steps, 997)
    outlier[spikes] = rng.integers(2, 13, len(spikes))
    if scenario.startswith("tall"):
        outlier = np.maximum(outlier, tall_spikes(steps))
    scaler = Scaler(name, np, initial=2.0**32 if scenario == "start32" else None)
    offsets = {"tall-wide": SIM_WIDE_OFFSETS, "tall-narrow": SIM_NARROW_OFFSETS}.get(scenario, SIM_OFFSETS)
    log_rms = level[:, None] + offsets[None, :] + outlier[:, None]
    rms = np.exp2(log_rms)
    amax = rms * 8.0
    skips = np.zeros(steps, bool)
    under = np.zeros(steps)
    subnormal = np.zeros(steps)
    scales = np.zeros(steps)
    start = time.perf_counter()
    from scipy.special import erf
    for i in range(steps):
        s = scaler.scale
        scales[i] = s
        finite = s * amax[i, 0] * 2.0 < 65504.0
        share = erf(2.0**-25 / (s * rms[i] * math.sqrt(2)))
        under[i] = float(np.sum(share * SIM_SIZES) / SIM_SIZES.sum())
        below = erf(2.0**-14 / (s * rms[i] * math.sqrt(2)))  # under float16's smallest normal: precision lost
        subnormal[i] = float(np.sum(below * SIM_SIZES) / SIM_SIZES.sum())
        stats = GradientStats(
            np.int32(i), np.float32(s * amax[i, 0]), None, None, None, np.float32(s * rms[i].min()),
            None, None, None, None, None,
        )
        skips[i] = not finite
        with np.errstate(all="ignore"):
            scaler.update(np.bool_(finite), stats)
    return {
        "skips_first100": int(skips[:100].sum()),
        "skips": int(skips.sum()),
        "underflow_steps": int((under > 0.01).sum()),
        "subnormal_steps": int((subnormal > 0.01).sum()),
        "final_log2_scale": math.log2(scaler.scale),
        "scale_changes": int(np.sum(np.diff(scales) != 0)),
        "seconds": time.perf_counter() - start,
    }


def run_sim(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for scenario in args.scenarios:
        for name in args.policies:
            runs = [sim_run(scenario, name, args.steps, seed) for seed in args.seeds]
            row = {"case": scenario, "policy": name}
            row.update(summary(runs, ("skips_first100", "skips", "underflow_steps", "subnormal_steps",
                                      "final_log2_scale", "scale_changes", "seconds")))
            rows.append(row)
            print(row, flush=True)
    print(table(rows, ["case", "policy", "skips_first100", "skips", "underflow_steps", "subnormal_steps",
                       "final_log2_scale", "scale_changes", "seconds"]))
    return rows


# ----------------------------------------------------------------------------- ae, torch


def ae_torch(name: str, k: int, seed: int, steps: int) -> dict[str, Any]:
    import torch

    from lossscale._stats import gradient_stats
    from lossscale.demo._config import DemoConfig
    from lossscale.demo._data import batch_order, load_data, psnr_db
    from lossscale.demo._torch import build_model, micro_batch_loss

    torch.set_num_threads(1)
    config = DemoConfig(steps=steps, seed=seed, frameworks=("torch",))
    data = load_data(seed)
    model = build_model(config)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, eps=1e-8 / k)
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    params = list(model.parameters())
    is_weight = torch.tensor([float(any(p is w for w in weights)) * p.numel() for p in params])
    scaler = None if name in ("fp32", "fp16") else Scaler(name, torch)
    x_train = torch.from_numpy(data.x_train)
    skips, under = [], []
    start = time.perf_counter()
    for step, idx in enumerate(torch.from_numpy(batch_order(len(x_train), steps, config.batch_size, seed))):
        opt.zero_grad()
        loss = micro_batch_loss(model, x_train[idx], k, name != "fp32")
        scale = scaler.state.loss_scale if scaler else None
        (loss * scale if scaler else loss).backward()
        grads = [p.grad for p in params]
        stats = gradient_stats(grads, torch, step)
        under.append(float((stats.tensor_zero_fraction * is_weight).sum() / is_weight.sum()))
        finite = bool(torch.isfinite(stats.amax)) and bool(torch.isfinite(stats.rms_min))
        skips.append(not finite)
        if finite:
            if scaler:
                inv = 1.0 / scale
                for g in grads:
                    g.mul_(inv)
            opt.step()
        if scaler:
            scaler.update(torch.tensor(finite), stats)
    with torch.no_grad():
        psnr = psnr_db(model(torch.from_numpy(data.x_test)).numpy(), data.x_test)
    return _ae_record(skips, under, psnr, scaler, start)


def _ae_record(skips: list, under: list, metric: float, scaler: Scaler | None, start: float) -> dict[str, Any]:
    skips_a, under_a = np.asarray(skips), np.asarray(under, np.float64)
    return {
        "zeros": under_a,
        "skips_first100": int(skips_a[:100].sum()),
        "skips": int(skips_a.sum()),
        "underflow_steps": int((under_a > 0.01).sum()),
        "zero_share_final": float(under_a[-100:].mean()),
        "metric": metric,
        "final_log2_scale": math.log2(scaler.scale) if scaler else 0.0,
        "seconds": time.perf_counter() - start,
    }


# ----------------------------------------------------------------------------- ae, jax


def ae_jax(name: str, k: int, seed: int, steps: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import optax

    import lossscale.jax as lsj
    from lossscale.demo._config import DemoConfig
    from lossscale.demo._data import batch_order, load_data, psnr_db
    from lossscale.demo._jax import _forward, init_params

    config = DemoConfig(steps=steps, seed=seed, frameworks=("jax",))
    data = load_data(seed)
    inner = optax.adam(config.lr, eps=1e-8 / k)
    scaled = name not in ("fp32", "fp16")
    if scaled:
        policy, every = POLICIES[name]
        opt = lsj.loss_scale_optimizer(inner, policy, stats_every=every or 1)
    else:
        opt = lsj.loss_scale_optimizer(inner, 1.0, stats_every=1)  # scale 1: plain fp16 (skip-only), measured
    half = name != "fp32"
    params = jax.tree.map(jnp.asarray, init_params(config))
    state = opt.init(params)
    x_train = jnp.asarray(data.x_train)

    def step(params: Any, state: Any, idx: Any) -> Any:
        x = x_train[idx]

        def loss_fn(p: Any) -> Any:
            if half:
                p = jax.tree.map(lambda a: a.astype(jnp.float16), p)
                out = _forward(p, x.astype(jnp.float16)).astype(jnp.float32)
            else:
                out = _forward(p, x)
            return lsj.get_scaled_loss(jnp.mean((out - x) ** 2) / k, state)

        grads = jax.grad(loss_fn)(params)
        total = sum(layer["w"].size for layer in grads)
        zeros = sum(jnp.sum(layer["w"] == 0, dtype=jnp.float32) for layer in grads) / total
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, (zeros, state.last_step_skipped)

    step = jax.jit(step, donate_argnums=(0, 1))
    start = time.perf_counter()
    records = []
    for idx in batch_order(len(data.x_train), steps, config.batch_size, seed):
        params, state, rec = step(params, state, idx)
        records.append(rec)
    zeros, skipped = (np.asarray(jnp.stack(c)) for c in zip(*records))
    psnr = psnr_db(np.asarray(_forward(params, jnp.asarray(data.x_test))), data.x_test)

    class _S:
        scale = float(state.loss_scale)

    return _ae_record(list(skipped), list(zeros), psnr, _S() if scaled else None, start)


COLUMNS = ("skips_first100", "skips", "underflow_steps", "zero_share_final", "metric", "final_log2_scale", "seconds")


def run_grid(label: str, train: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every K x policy x seed; fp32 first, and "underflow steps" counted against fp32's zero share.

    A step counts as underflowed when its weight-gradient zero share exceeds fp32's at the same step (same
    seed, K and batches: the structural zeros, e.g. of always-blank pixels) by more than 1 percentage point.
    """
    rows = []
    names = sorted(args.policies, key=lambda n: n != "fp32")
    for exp in args.k:
        baseline: dict[int, np.ndarray] = {}
        for name in names:
            runs = []
            for seed in args.seeds:
                run = train(name, 2**exp, seed, args.steps)
                zeros = run.pop("zeros")
                if name == "fp32":
                    baseline[seed] = zeros
                if seed in baseline:
                    run["underflow_steps"] = int((zeros > baseline[seed] + 0.01).sum())
                    run["zero_share_final"] = float(zeros[-100:].mean() - baseline[seed][-100:].mean())
                runs.append(run)
            row = {"case": f"{label} K=2^{exp}", "policy": name, **summary(runs, COLUMNS),
                   "metric_per_seed": [round(r["metric"], 3) for r in runs]}
            rows.append(row)
            print(row, flush=True)
    print(table(rows, ["case", "policy", *COLUMNS]))
    return rows


def run_ae(args: argparse.Namespace) -> list[dict[str, Any]]:
    return run_grid(args.framework, ae_torch if args.framework == "torch" else ae_jax, args)


# ----------------------------------------------------------------------------- lm, torch


def lm_corpus(seed: int, n: int, vocab: int = 48) -> np.ndarray:
    """A random order-2 Markov chain: each pair of symbols allows 3 next symbols with Dirichlet weights."""
    rng = np.random.default_rng(1000 + seed)
    nexts = rng.integers(0, vocab, (vocab, vocab, 3))
    probs = rng.dirichlet(np.ones(3) * 0.5, (vocab, vocab))
    out = np.empty(n, np.int64)
    out[:2] = rng.integers(0, vocab, 2)
    for i in range(2, n):
        p = probs[out[i - 2], out[i - 1]]
        c = int(np.searchsorted(np.cumsum(p), rng.random()))
        out[i] = nexts[out[i - 2], out[i - 1], min(c, 2)]
    return out


def lm_run(name: str, k: int, seed: int, steps: int) -> dict[str, Any]:
    import torch

    from lossscale._stats import gradient_stats

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    vocab, seq, batch, d = 48, 32, 16, 64
    data = torch.from_numpy(lm_corpus(seed, 40000))
    train, held = data[:36000], data[36000:]
    layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
    model = torch.nn.ModuleDict({
        "emb": torch.nn.Embedding(vocab, d), "pos": torch.nn.Embedding(seq, d),
        "enc": torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), "out": torch.nn.Linear(d, vocab),
    })
    mask = torch.nn.Transformer.generate_square_subsequent_mask(seq)

    def loss_of(tokens: torch.Tensor, half: bool) -> torch.Tensor:
        x, y = tokens[:, :-1], tokens[:, 1:]
        with torch.autocast("cpu", dtype=torch.float16, enabled=half):
            h = model["emb"](x) + model["pos"](torch.arange(seq, device=x.device))
            h = model["enc"](h, mask=mask, is_causal=True)
            logits = model["out"](h)
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))

    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=3e-3, eps=1e-8 / k)
    scaler = None if name in ("fp32", "fp16") else Scaler(name, torch)
    gen = torch.Generator().manual_seed(seed)
    skips, under = [], []
    start = time.perf_counter()
    for step in range(steps):
        starts = torch.randint(0, len(train) - seq - 1, (batch,), generator=gen)
        tokens = torch.stack([train[s : s + seq + 1] for s in starts.tolist()])
        opt.zero_grad()
        loss = loss_of(tokens, name != "fp32") / k
        scale = scaler.state.loss_scale if scaler else None
        (loss * scale if scaler else loss).backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        stats = gradient_stats(grads, torch, step)
        under.append(float(stats.zero_fraction))
        finite = bool(torch.isfinite(stats.amax)) and bool(torch.isfinite(stats.rms_min))
        skips.append(not finite)
        if finite:
            if scaler:
                for g in grads:
                    g.mul_(1.0 / scale)
            opt.step()
        if scaler:
            scaler.update(torch.tensor(finite), stats)
    with torch.no_grad():
        tokens = torch.stack([held[s : s + seq + 1] for s in range(0, len(held) - seq - 1, seq)])
        metric = float(loss_of(tokens, False))
    return _ae_record(skips, under, metric, scaler, start)


def run_lm(args: argparse.Namespace) -> list[dict[str, Any]]:
    return run_grid("lm", lm_run, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=("sim", "ae", "lm"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--policies", nargs="+", default=None)
    parser.add_argument("--scenarios", nargs="+", default=["steady", "shrink", "grow", "start32"])
    parser.add_argument("--framework", choices=("torch", "jax"), default="torch")
    parser.add_argument("--k", type=int, nargs="+", default=None, help="log2 of the loss divisor K")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.workload == "sim":
        args.steps = args.steps or 100_000
        args.policies = args.policies or ["tf", "torch", "auto", "auto16"]
        rows = run_sim(args)
    elif args.workload == "ae":
        args.steps = args.steps or 1000
        args.k = args.k or [10, 16, 20, 24]
        args.policies = args.policies or ["fp32", "fp16", "tf", "torch", "auto"]
        rows = run_ae(args)
    else:
        args.steps = args.steps or 150
        args.k = args.k or [12]
        args.policies = args.policies or ["fp32", "fp16", "tf", "auto", "auto_b2"]
        rows = run_lm(args)
    out = args.out or f"/tmp/auto_scale_{args.workload}{'_' + args.framework if args.workload == 'ae' else ''}.json"
    with open(out, "w") as f:
        json.dump({"args": vars(args), "rows": rows, "lossscale": lossscale.__version__}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
