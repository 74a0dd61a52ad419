"""Which files of ``lossscale`` one ``step()`` enters, in order, and how often it comes back into each.

Traces one real step (after a warm-up step, so that first-step work such as
creating optimizer state is not counted) of ``LossScaleOptimizer`` and of
``GradScaler`` with ``sys.settrace``, and prints, per file of the package (the binding, the top-level
``_torch/_kernels.py``/``_torch/_compat.py`` and the core modules; not the integrations):

* ``entries``: calls into the file from another file (a call within one
  file is not an entry);
* ``re-entries``: ``entries - 1``, the times the walk came back into a
  file after entering it once;
* ``back-calls``: entries made while a frame of that file is still on the
  stack below a frame of another file (``A -> B -> A``): the walk climbing
  back up into a floor it is standing on.

Run::

    PYTHONPATH=src python benchmarks/step_walk.py [--fused]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

import torch

import lossscale.torch as lst

ROOT = os.path.dirname(os.path.dirname(lst.__file__))  # the lossscale package


def _file(frame) -> str | None:
    path = frame.f_code.co_filename
    if path.startswith(ROOT) and "integrations" not in path:
        return os.path.relpath(path, ROOT)
    return None


def walk(fn) -> tuple[list[str], Counter]:
    """The package files entered (cross-file calls, in order) while ``fn()`` runs, and the back-calls per file."""
    entries: list[str] = []
    back: Counter = Counter()

    def tracer(frame, event, arg):
        if event != "call":
            return
        name = _file(frame)
        if name is None:
            return
        caller = frame.f_back
        caller_name = _file(caller) if caller is not None else None
        if caller_name == name:
            return  # a call within one file
        entries.append(name)
        below = caller
        while below is not None:  # is this file already on the stack, under another file's frame?
            if _file(below) == name:
                back[name] += 1
                break
            below = below.f_back

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return entries, back


def report(title: str, entries: list[str], back: Counter) -> None:
    order = list(dict.fromkeys(entries))
    counts = Counter(entries)
    again = sum(counts[f] - 1 for f in order)
    print(f"{title}: {len(order)} files, {again} re-entries, {sum(back.values())} back-calls")
    print("  walk: " + " -> ".join(entries))
    for name in order:
        print(f"  {name:28s} entries {counts[name]:2d}  re-entered {counts[name] - 1:2d}  back-calls {back[name]}")


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
    report("LossScaleOptimizer.step()", *lso_step())

    plain = inner()
    scaler = lst.GradScaler("cpu")

    def gs_step():
        plain.zero_grad()
        scaler.scale(model(x).square().mean()).backward()
        result = walk(lambda: scaler.step(plain))
        scaler.update()
        return result

    gs_step()
    report("GradScaler.step(optimizer)", *gs_step())


if __name__ == "__main__":
    main()
