"""Which files of ``lossscale.torch`` one ``step()`` enters, in order, and how often it comes back into each.

Traces one real step (after a warm-up step, so that first-step work such as
creating optimizer state is not counted) of ``LossScaleOptimizer`` and of
``GradScaler`` with ``sys.settrace``, and prints the sequence of binding
files entered. A "re-entry" is entering a file the walk already left
earlier in the same step. Run::

    PYTHONPATH=src python benchmarks/step_walk.py [--fused]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

import torch

import lossscale.torch as lst

ROOT = os.path.dirname(lst.__file__)


def walk(fn) -> list[str]:
    """The binding files entered while ``fn()`` runs, consecutive duplicates collapsed."""
    files: list[str] = []

    def tracer(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(ROOT) and "integrations" not in path:
                name = os.path.relpath(path, ROOT)
                if not files or files[-1] != name:
                    files.append(name)

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return files


def summary(files: list[str]) -> tuple[list[str], dict[str, int]]:
    """The files in first-entry order, and how many times each was re-entered after being left."""
    order = list(dict.fromkeys(files))
    entries = Counter(files)
    return order, {f: entries[f] - 1 for f in order}


def report(title: str, files: list[str]) -> None:
    order, again = summary(files)
    print(f"{title}: {len(order)} files, {sum(again.values())} re-entries")
    print("  walk: " + " -> ".join(files))
    for name in order:
        print(f"  {name:28s} re-entered {again[name]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fused", action="store_true", help="fused AdamW instead of SGD with momentum")
    fused = parser.parse_args().fused
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    x = torch.randn(16, 8)

    def inner():
        if fused:
            return torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    opt = lst.LossScaleOptimizer(inner())

    def lso_step():
        opt.zero_grad()
        opt.get_scaled_loss(model(x).square().mean()).backward()
        return walk(opt.step)

    lso_step()
    report("LossScaleOptimizer.step()", lso_step())

    sgd = inner()
    scaler = lst.GradScaler("cpu")

    def gs_step():
        sgd.zero_grad()
        scaler.scale(model(x).square().mean()).backward()
        files = walk(lambda: scaler.step(sgd))
        scaler.update()
        return files

    gs_step()
    report("GradScaler.step(optimizer)", gs_step())


if __name__ == "__main__":
    main()
