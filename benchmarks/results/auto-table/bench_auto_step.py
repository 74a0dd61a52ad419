"""The optimizer step of ``loss_scale="auto"`` against ``"dynamic"`` on the CPU, torch, in one process: 100 tensors
of 10,000 float32 parameters, fused AdamW, gradients set apart (no forward or backward). Contenders interleave in
shuffled rounds of 64 steps (4 of them sampled at ``stats_every=16``, with an overflow every 10th step); reported:
each contender's median ms per step, and ``auto``'s median over ``dynamic``'s.

Run:  PYTHONPATH=src python benchmarks/results/auto-table/bench_auto_step.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from lossscale.torch import LossScaleOptimizer


def make(policy: str) -> tuple:
    params = [torch.nn.Parameter(torch.randn(10_000)) for _ in range(100)]
    opt = LossScaleOptimizer(torch.optim.AdamW(params, 1e-4, fused=True), policy)
    grads = [torch.randn(10_000) * 1e-3 for _ in params]
    return params, opt, grads


def run(contender: tuple, steps: int, start: int) -> float:
    params, opt, grads = contender
    scale = opt.loss_scale
    t0 = time.perf_counter()
    for i in range(start, start + steps):
        for p, g in zip(params, grads):
            p.grad = g * scale
        if i % 10 == 9:
            params[0].grad[0] = float("inf")
        opt.step()
        scale = opt.loss_scale
    return (time.perf_counter() - t0) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    contenders = {name: make(policy) for name, policy in [("dynamic", "dynamic"), ("auto", "auto")]}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    rng = random.Random(0)
    for r in range(args.rounds + 1):
        order = list(contenders)
        rng.shuffle(order)
        for name in order:
            t = run(contenders[name], 64, 64 * r)
            if r:  # round 0 warms up
                times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [a / d for a, d in zip(times["auto"], times["dynamic"])]
    print(f"dynamic {med['dynamic']:.3f} ms/step, auto {med['auto']:.3f} ms/step, auto/dynamic median of rounds "
          f"{statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
