"""What loss scaling adds to Keras 3's ``fit`` step on torch off the CPU, counted on ``meta`` tensors (no GPU needed).

On a GPU a small model's step is bound by launches (each eager torch operator is one kernel) and by host reads (each
a sync), so they are counted here, as ``benchmarks/kernel_count.py`` counts torch: the aten operators dispatched on
variables of device ``meta``, counted with its ``OpCounter`` (views and allocations left out), host reads apart.
Meta tensors carry no data and take every branch an accelerator takes (the library keeps its numpy host path for
``cpu``), so the count is what a CUDA step launches.

What is counted: the optimizer's part of ``fit``'s train step on torch, ``optimizer.scale_loss(loss)`` and
``optimizer.apply(grads, variables)``, over the same two calls of a plain ``keras.optimizers.Adam``. The rest of
``train_step`` (forward, loss, metrics, backward) does not depend on the optimizer, and cannot run on ``meta``: Keras'
torch backend converts a meta variable to a fresh ``empty_like`` tensor, which cuts the autograd graph.

The device is named ``meta:0``, not ``meta``: Keras' torch ``ops.cond`` takes its first branch unread when the device
is the string ``"meta"``; under any other name it is a Python ``if`` that reads its predicate on the host, as on a
GPU. Meta tensors have no values to read, so each host read of a step is answered from the contender's list (what
a finite step that does not grow the scale reads): Keras 3's own class reads its two ``cond`` predicates (finite:
True; the growth step: False), lossscale's step reads its found-inf flag (0.0). A copy to the host (the statistics'
step count, read once and then known on the host) is answered with zeros. Keras' torch backend also turns each read
of a meta variable into an ``empty_like``: an allocation, left out (on a GPU the variable's own tensor is used).

Contenders, each over the plain Adam step, on 4 variables (Dense 32-64-4) and on 100 of 1M parameters in all:
Keras 3's ``keras.optimizers.LossScaleOptimizer``; ``lossscale.keras.LossScaleOptimizer`` by default, with
``stats_every=16`` and with ``loss_scale="auto"`` (an unsampled and a sampled step). The last column is each step's
critical path (``OpCounter.depth``), a floor under what any eager regrouping of its operators launches.

Run:  python benchmarks/kernel_count_keras.py
(it runs the count in a subprocess with ``KERAS_BACKEND=torch KERAS_TORCH_DEVICE=meta:0``; Keras picks its backend
once per process). Deterministic, so tests/keras/test_keras_torch_device.py pins the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: Where the count runs: meta tensors under a name other than ``"meta"`` (see the module's doc).
DEVICE = "meta:0"
#: The variables' shapes of each model.
MODELS = {"Dense 32-64-4": [(32, 64), (64,), (64, 4), (4,)], "100 x 10000": [(10000,)] * 100}
CONTENDERS = ("Keras 3 LossScaleOptimizer", "lossscale.keras, default", "lossscale.keras, stats_every=16",
              'lossscale.keras, loss_scale="auto"')
#: The row of :func:`count_steps` that is a sampled step (``stats_every=16``, ``"auto"``): the 17th apply.
SAMPLED_ROW = 13


def _counter(answers: Sequence[Any]) -> Any:
    """:class:`benchmarks.kernel_count.OpCounter` for Keras on meta: the ``i``-th scalar host read of the step is
    answered ``answers[i]``, a copy to the host with zeros; Keras' ``empty_like`` of a meta variable left out."""
    import torch

    from benchmarks.kernel_count import OpCounter

    read, to_copy, empty_like = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten._to_copy.default,
                                 torch.ops.aten.empty_like.default)

    class KerasOpCounter(OpCounter):
        def __init__(self) -> None:
            super().__init__()
            self.answered = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func is empty_like:
                return func(*args, **kwargs)
            if func is read and args[0].device.type == "meta":
                self.reads += 1
                self.answered += 1
                if self.answered > len(answers):
                    raise RuntimeError(f"host read {self.answered} of a step; the contender's answers: {answers}")
                return answers[self.answered - 1]
            if func is to_copy and args[0].device.type == "meta" and str(kwargs.get("device")) == "cpu":
                self.reads += 1
                return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
            return super().__torch_dispatch__(func, types, args, kwargs)

    return KerasOpCounter()


def _contender(name: str) -> tuple[Callable[[], Any], tuple[Any, ...]]:
    """The optimizer factory and the answers to its host reads on a finite step that does not grow the scale."""
    import keras

    import lossscale.keras as lsk

    def adam() -> Any:
        return keras.optimizers.Adam(1e-3)

    makers: dict[str, tuple[Callable[[], Any], tuple[Any, ...]]] = {
        "plain": (adam, ()),
        "Keras 3 LossScaleOptimizer": (lambda: keras.optimizers.LossScaleOptimizer(adam()), (True, False)),
        "lossscale.keras, default": (lambda: lsk.LossScaleOptimizer(adam()), (0.0,)),
        "lossscale.keras, stats_every=16": (lambda: lsk.LossScaleOptimizer(adam(), stats_every=16), (0.0,)),
        'lossscale.keras, loss_scale="auto"': (lambda: lsk.LossScaleOptimizer(adam(), "auto"), (0.0,)),
    }
    if name not in makers:
        raise ValueError(f"unknown contender {name!r}; one of {', '.join(CONTENDERS)}")
    return makers[name]


def count_steps(contender: str, shapes: Sequence[tuple[int, ...]], steps: int = 17,
                depths: list[int] | None = None) -> list[tuple[int, int]]:
    """``(operators, host reads)`` of ``scale_loss`` + ``apply`` for each of ``steps`` steps after 3 warm-up steps,
    over the plain Adam step's, on meta variables of ``shapes``. Row :data:`SAMPLED_ROW` is a sampled step of the
    ``stats_every=16`` and ``"auto"`` contenders. ``depths``, when given, receives each of those steps' critical
    path (:attr:`benchmarks.kernel_count.OpCounter.depth`, of the whole step). Needs ``KERAS_BACKEND=torch``."""
    import keras
    import numpy as np
    import torch

    if keras.backend.backend() != "torch":
        raise RuntimeError(f"count_steps needs KERAS_BACKEND=torch, got {keras.backend.backend()!r}")
    out = []
    with keras.device(DEVICE):
        for name in ("plain", contender):
            make, answers = _contender(name)
            variables = [keras.Variable(np.zeros(shape, np.float32)) for shape in shapes]
            optimizer = make()
            optimizer.build(variables)
            loss = torch.empty((), device=DEVICE)
            counts = []
            for i in range(3 + steps):
                grads = [torch.empty(shape, device=DEVICE) for shape in shapes]
                with _counter(answers) as counter:
                    optimizer.scale_loss(loss)
                    optimizer.apply(grads, variables)
                if i >= 3 or name == "plain":
                    counts.append((counter.total, counter.reads))
                if i >= 3 and name == contender and depths is not None:
                    depths.append(counter.depth)
            out.append(counts)
    (plain_ops, plain_reads), rows = out[0][-1], out[1]
    return [(ops - plain_ops, reads - plain_reads) for ops, reads in rows]


def summary(contender: str, shapes: Sequence[tuple[int, ...]]) -> dict[str, Any]:
    """The added operators of an unsampled and (statistics) a sampled step, and the host reads per step."""
    depths: list[int] = []
    rows = count_steps(contender, shapes, depths=depths)
    ops = [r[0] for r in rows]
    sampled = "stats_every" in contender or "auto" in contender
    others = ops[:SAMPLED_ROW] + ops[SAMPLED_ROW + 1:]
    return {"contender": contender, "unsampled": ops[0], "sampled": ops[SAMPLED_ROW] if sampled else None,
            "reads": max(r[1] for r in rows), "steady": len(set(others if sampled else ops)) == 1,
            "depth": f"{depths[0]} / {depths[SAMPLED_ROW]}" if sampled else str(depths[0])}


def rows() -> list[dict[str, Any]]:
    """One row per model and contender (this process's backend must be torch)."""
    return [{"model": model, **summary(contender, shapes)} for model, shapes in MODELS.items()
            for contender in CONTENDERS]


def rows_in_subprocess() -> list[dict[str, Any]]:
    """:func:`rows` in a fresh process with ``KERAS_BACKEND=torch`` and ``KERAS_TORCH_DEVICE=meta:0``."""
    root = Path(__file__).resolve().parent.parent
    path = os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "KERAS_BACKEND": "torch", "KERAS_TORCH_DEVICE": DEVICE, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, __file__, "--json"], env=env, capture_output=True, text=True,
                          check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the Keras count failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the subprocess's part
    args = parser.parse_args()
    if args.json:
        print(json.dumps(rows()))
        return
    import keras
    import torch

    print(f"# Keras {keras.__version__} on torch {torch.__version__}, meta tensors; operators that scale_loss + "
          "apply add over a plain Adam step, and host reads per step\n")
    print("| model | optimizer | operators added | host reads | critical path |\n|---|---|---|---|---|")
    for row in rows_in_subprocess():
        ops = str(row["unsampled"]) if row["sampled"] is None else f"{row['unsampled']} / {row['sampled']}"
        print(f"| {row['model']} | {row['contender']} | {ops} | {row['reads']} | {row['depth']} |")
    print("\nstats_every=16 and auto: an unsampled / a sampled step. Critical path: the longest chain of dependent "
          "operators in the whole step (the plain Adam step's included), a floor under any eager regrouping.")


if __name__ == "__main__":
    main()
