"""Python function calls per training step: a deterministic proxy of a step's host overhead.

On a shared 2-core machine a step's added milliseconds vary between runs by as much as any refactor changes them;
the number of Python calls a step makes does not vary. This counts them with ``sys.setprofile`` (Python ``call``
events, C calls left out) over a few steps after a warm-up, for torch's ``torch.amp.GradScaler``, lossscale's
GradScaler drop-in and ``LossScaleOptimizer`` (default and ``stats_every=16``), on a 100-tensor model, and prints the
calls per step added over a plain optimizer step. Compare two checkouts side by side::

    PYTHONPATH=OLD/src python benchmarks/python_calls.py
    PYTHONPATH=src     python benchmarks/python_calls.py
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

import lossscale.torch as lst


def _params(tensors: int) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(64)) for _ in range(tensors)]


def _inner(kind: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if kind == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-3, fused=True)
    if kind == "adamw-foreach":
        return torch.optim.AdamW(params, lr=1e-3, foreach=True)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9)


def _calls(step: Any, steps: int) -> float:
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call":
            count += 1

    for _ in range(3):  # warm-up: first-step state, caches
        step()
    sys.setprofile(profile)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.setprofile(None)
    return count / steps


def measure(kind: str, tensors: int, steps: int) -> dict[str, float]:
    def runner(setup: str) -> Any:
        params = _params(tensors)
        inner = _inner(kind, params)
        loss_of = lambda: sum((p * p).sum() for p in params)
        if setup == "plain":
            def step() -> None:
                inner.zero_grad()
                loss_of().backward()
                inner.step()
            return step
        if setup in ("torch GradScaler", "lossscale GradScaler"):
            scaler = (torch.amp.GradScaler("cpu", init_scale=1024.0) if setup.startswith("torch")
                      else lst.GradScaler("cpu", init_scale=1024.0))

            def step() -> None:
                inner.zero_grad()
                scaler.scale(loss_of()).backward()
                scaler.step(inner)
                scaler.update()
            return step
        opt = lst.LossScaleOptimizer(inner, 1024.0 if setup == "default" else "dynamic",
                                     stats_every=16 if setup == "stats_every=16" else None)

        def step() -> None:
            opt.zero_grad()
            opt.get_scaled_loss(loss_of()).backward()
            opt.step()
        return step

    plain = _calls(runner("plain"), steps)
    return {setup: _calls(runner(setup), steps) - plain
            for setup in ("torch GradScaler", "lossscale GradScaler", "default", "stats_every=16")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=100)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    kinds = ("adamw-fused", "adamw-foreach", "sgd-momentum")
    print(f"# Python calls per step added over a plain step, {args.tensors} tensors, mean of {args.steps} steps")
    print("| optimizer | torch GradScaler | lossscale GradScaler | LossScaleOptimizer | stats_every=16 |")
    print("|---|---|---|---|---|")
    for kind in kinds:
        row = measure(kind, args.tensors, args.steps)
        print(f"| {kind} | " + " | ".join(f"{v:.1f}" for v in row.values()) + " |")


if __name__ == "__main__":
    main()
