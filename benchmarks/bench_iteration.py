"""Whole training iterations: forward + backward + fused AdamW step, with and without loss scaling.

Contenders, each on its own copy of the same model (same initial weights,
same batch), all in ONE process:

* ``plain``               no scaling;
* ``plain-A/A``           a second plain copy: the A/A control, i.e. what
                          noise and memory placement alone make of "no change";
* ``GradScaler``          ``torch.amp.GradScaler``;
* ``lossscale-step``      ``lossscale.torch.LossScaleOptimizer`` (the check at step time).

(``check="backward"``, a check in backward hooks, was a contender until it
was removed: it measured slower than ``lossscale-step`` on this CPU and on
an H100, issue 23.)

Each round runs one iteration of every contender in a freshly shuffled order
and times each iteration alone (``time.perf_counter``). Reported per
contender: median and quartiles of the per-iteration ms, and the 10th
percentile (on a loaded machine, preemptions only ever add time, so the
low percentiles show the undisturbed cost); "+ms", the median
over rounds of (contender - plain) in the same round, with its quartiles;
"ratio", lossscale's +ms over GradScaler's; "+syncs", host syncs per
iteration beyond plain's (``lossscale.torch.HostSyncCounter``, one
iteration after warm-up); "+peak MB", the peak of live tensor bytes during
one iteration beyond plain's, from ``torch.profiler``'s memory timeline
(every CPU tensor allocation and free, exact, not RSS; a private profiler
API, so "n/a" if it fails). "noise" says when a contender's quartiles
overlap plain's (the added time is within noise) and when lossscale's
overlap GradScaler's.

Precision: parameters float32 (so gradients are float32) under
``torch.autocast("cpu", dtype)``. The default is bfloat16: float16 autocast
on this CPU (no native fp16 matmul) runs ~30x slower (an 8M-parameter MLP:
1.1 s vs 18 ms per forward+backward), which would drown the step in the
matmuls. The loss-scaling work is the same either way: it touches the
float32 gradients and the optimizer. ``--dtype float16`` runs it anyway.

Models: ``transformer`` (4-layer causal LM, d=256, vocab 4096, ~5.3M
parameters, 53 tensors, 2x32 tokens), ``mlp`` (10 x Linear(1024, 1024) +
GELU, ~10.5M parameters, 22 tensors, batch 64), and ``synthetic:N:T`` (N
parameters in T equal tensors, loss ``sum_i <c_i, p_i>``: the backward only
writes the gradients, so the iteration is the step plus one gradient write,
which is the step-level comparison that also charges the backward check its
cost in the backward).

Run:  python benchmarks/bench_iteration.py                  (both models, clip off/on, 150 rounds)
      python benchmarks/bench_iteration.py --quick          (smoke run, seconds)
      python benchmarks/bench_iteration.py --step-level     (synthetic 1M/10M/50M x 100/1000, no clip)
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lossscale.torch import HostSyncCounter, LossScaleOptimizer

SCALE = 1024.0
MAX_NORM = 1.0


# ---------------------------------------------------------------------------- models


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 4096, d: int = 256, layers: int = 4, heads: int = 4, seq: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, 4 * d) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln(x))


class Synthetic(nn.Module):
    """``n_params`` parameters in ``n_tensors`` tensors; loss ``sum_i <c_i, p_i>`` (gradient ``c_i``)."""

    def __init__(self, n_params: int, n_tensors: int) -> None:
        super().__init__()
        size = n_params // n_tensors
        self.ps = nn.ParameterList(nn.Parameter(torch.randn(size)) for _ in range(n_tensors))
        self.register_buffer("c", torch.randn(size) * 1e-3)

    def forward(self, _: Any) -> torch.Tensor:
        return torch.stack([torch.dot(p, self.c) for p in self.ps]).sum()


def build(spec: str) -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    """The model named by ``spec`` and a loss function of it (the batch is fixed)."""
    torch.manual_seed(0)
    if spec == "transformer":
        model: nn.Module = TinyLM()
        idx = torch.randint(0, 4096, (2, 33))
        return model, lambda m: nn.functional.cross_entropy(m(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    if spec == "mlp":
        layers: list[nn.Module] = []
        for _ in range(10):
            layers += [nn.Linear(1024, 1024), nn.GELU()]
        model = nn.Sequential(*layers, nn.Linear(1024, 10))
        x, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))
        return model, lambda m: nn.functional.cross_entropy(m(x), y)
    if spec.startswith("synthetic:"):
        _, n, t = spec.split(":")
        model = Synthetic(int(float(n)), int(t))
        return model, lambda m: m(None)
    raise ValueError(f"unknown model {spec!r}: transformer, mlp or synthetic:N_PARAMS:N_TENSORS")


def make_lossscale(inner: torch.optim.Optimizer) -> LossScaleOptimizer:
    """The lossscale contender (the check at step time)."""
    return LossScaleOptimizer(inner, initial_scale=SCALE)


# ---------------------------------------------------------------------------- contenders


class Contender:
    def __init__(self, name: str, model: nn.Module, loss_fn: Callable, clip: bool, dtype: torch.dtype | None,
                 accumulate: int = 1) -> None:
        self.name, self.clip, self.dtype, self.accumulate = name, clip, dtype, accumulate
        self.model = copy.deepcopy(model)
        self.params = list(self.model.parameters())
        self.loss_fn = loss_fn
        inner = torch.optim.AdamW(self.params, lr=1e-4, fused=True)
        self.scaler = None
        if name.startswith("plain"):
            self.opt = inner
        elif name == "GradScaler":
            self.opt = inner
            self.scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
        elif name == "lossscale-step":
            self.opt = make_lossscale(inner)
        else:
            raise ValueError(f"unknown contender {name!r}")

    def loss(self) -> torch.Tensor:
        enabled = self.dtype is not None and not isinstance(self.model, Synthetic)  # synthetic: float32 step rows
        with torch.autocast("cpu", dtype=self.dtype or torch.bfloat16, enabled=enabled):
            return self.loss_fn(self.model)

    def backwards(self, scaled: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """``accumulate`` forward+backward passes."""
        for _ in range(self.accumulate):
            scaled(self.loss()).backward()

    def iteration(self) -> None:
        if self.scaler is not None:
            self.backwards(self.scaler.scale)
            if self.clip:
                self.scaler.unscale_(self.opt)
                torch.nn.utils.clip_grad_norm_(self.params, MAX_NORM)
            self.scaler.step(self.opt)
            self.scaler.update()
        elif self.name.startswith("plain"):
            self.backwards(lambda loss: loss)
            if self.clip:
                torch.nn.utils.clip_grad_norm_(self.params, MAX_NORM)
            self.opt.step()
        else:
            self.backwards(self.opt.get_scaled_loss)
            if self.clip:
                self.opt.clip_grad_norm_(MAX_NORM)
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def timed(self) -> float:
        start = time.perf_counter()
        self.iteration()
        return time.perf_counter() - start

    def syncs(self) -> int:
        with HostSyncCounter() as counter:
            self.iteration()
        return counter.count

    def peak_bytes(self) -> float:
        """Peak live tensor bytes during one iteration, above what was live before it (profiler timeline)."""
        try:
            from torch.profiler import ProfilerActivity, profile
            from torch.profiler._memory_profiler import Action

            with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                         with_stack=True) as prof:
                self.iteration()
            live = peak = 0
            for _, action, key, size in prof._memory_profile().timeline:
                if key is None or key[0].device.type != "cpu":
                    continue
                if action == Action.CREATE:
                    live += size
                elif action == Action.DESTROY:
                    live -= size
                peak = max(peak, live)
            return float(peak)
        except Exception:  # noqa: BLE001 - a private API: report n/a rather than fail the run
            return float("nan")


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def bench_case(spec: str, clip: bool, names: list[str], rounds: int, dtype: torch.dtype | None,
               memory: bool, accumulate: int = 1, seed: int = 0) -> list[dict]:
    model, loss_fn = build(spec)
    contenders = [Contender(n, model, loss_fn, clip, dtype, accumulate) for n in names]
    del model
    for c in contenders:  # warm-up: optimizer state, first-step paths, allocator
        for _ in range(3):
            c.iteration()
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    for _ in range(rounds):
        order = contenders[:]
        rng.shuffle(order)
        for c in order:
            samples[c.name].append(c.timed() * 1e3)
    syncs = {c.name: c.syncs() for c in contenders}
    peaks = {c.name: c.peak_bytes() if memory else float("nan") for c in contenders}
    base = samples["plain"]
    rows = []
    for c in contenders:
        s = samples[c.name]
        diffs = [a - b for a, b in zip(s, base)]
        rows.append({
            "name": c.name, "q": quartiles(s), "diff": quartiles(diffs), "samples": s,
            "p10": statistics.quantiles(s, n=10, method="inclusive")[0],
            "syncs": syncs[c.name] - syncs["plain"], "peak_kb": (peaks[c.name] - peaks["plain"]) / 2**10,
        })
    return rows


def overlap(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    return a[0] <= b[2] and b[0] <= a[2]


def report(spec: str, n_params: int, n_tensors: int, clip: bool, rows: list[dict]) -> None:
    by = {r["name"]: r for r in rows}
    gs = by.get("GradScaler")
    for r in rows:
        q1, med, q3 = r["q"]
        d1, dmed, d3 = r["diff"]
        ratio = ""
        notes = []
        if r["name"] != "plain" and overlap(r["q"], by["plain"]["q"]):
            notes.append("~plain")
        if r["name"].startswith("lossscale") and gs is not None:
            if gs["diff"][1] > 0:
                ratio = f"{dmed / gs['diff'][1]:.2f}"
            if overlap(r["q"], gs["q"]):
                notes.append("~GradScaler")
        added = "" if r["name"] == "plain" else f"{dmed:+.2f} [{d1:+.2f}, {d3:+.2f}]"
        peak = "" if r["name"] == "plain" else f"{r['peak_kb']:+.1f}"
        print(f"| {spec} | {n_params / 1e6:.1f}M | {n_tensors} | {'yes' if clip else 'no'} | {r['name']} | "
              f"{med:.2f} | {q1:.2f}-{q3:.2f} | {r['p10']:.2f} | {added} | {ratio} | "
              f"{'' if r['name'] == 'plain' else r['syncs']} | {peak} | {', '.join(notes)} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small models and 10 rounds (a smoke run)")
    parser.add_argument("--step-level", action="store_true",
                        help="synthetic 1M/10M/50M x 100/1000 tensors, no clip (the README's step-level rows)")
    parser.add_argument("--models", type=lambda s: s.split(","), default=None,
                        help="comma list of transformer, mlp, synthetic:N:T")
    parser.add_argument("--clip", choices=["both", "on", "off"], default=None)
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 150; quick: 10)")
    parser.add_argument("--contenders", type=lambda s: s.split(","),
                        default=["plain", "plain-A/A", "GradScaler", "lossscale-step"])
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                        help="autocast dtype (float32: no autocast)")
    parser.add_argument("--no-memory", action="store_true", help="skip the profiler's peak-memory pass")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches (forward+backward) per step")
    args = parser.parse_args(argv)
    if "plain" not in args.contenders:
        parser.error("--contenders must include plain (the baseline)")
    if args.step_level:
        models = args.models or [f"synthetic:{n}:{t}" for n in ("1e6", "1e7", "5e7") for t in (100, 1000)]
        clip = args.clip or "off"
    else:
        models = args.models or (["synthetic:1e5:10", "mlp"] if args.quick else ["transformer", "mlp"])
        clip = args.clip or "both"
    clips = {"both": [False, True], "on": [True], "off": [False]}[clip]
    rounds = args.rounds or (10 if args.quick else 150)
    dtype = None if args.dtype == "float32" else getattr(torch, args.dtype)

    load = os.getloadavg()
    print(f"# torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cpus, {torch.get_num_threads()} "
          f"threads, autocast={args.dtype}, rounds={rounds}, scale={SCALE:g}, "
          f"accumulate={args.accumulate}, "
          f"load avg at start {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")
    print("| model | params | tensors | clip | contender | median ms | q1-q3 ms | p10 ms | +ms vs plain [q1, q3] | "
          "ratio LS/GS | +syncs | +peak KB | within noise of |")
    print("|" + "---|" * 13)
    for spec in models:
        model, _ = build(spec)
        n_params = sum(p.numel() for p in model.parameters())
        n_tensors = len(list(model.parameters()))
        del model
        for c in clips:
            rows = bench_case(spec, c, args.contenders, rounds, dtype, not args.no_memory, args.accumulate)
            report(spec, n_params, n_tensors, c, rows)
    load = os.getloadavg()
    print(f"# load avg at end {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")


if __name__ == "__main__":
    main()
