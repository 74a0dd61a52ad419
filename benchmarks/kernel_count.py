"""What loss scaling adds to a torch optimizer step: operators on ``meta`` tensors (no GPU needed), or CUDA kernels.

On a GPU a small model's step is bound by launches (each eager operator is one kernel and about 5-20 us of host
time), so what loss scaling adds is counted here rather than timed.

* ``--device meta`` (the default; runs anywhere): the aten operators one step dispatches, counted with a
  ``TorchDispatchMode`` on parameters of device ``meta``, views and allocations left out. Meta tensors carry no data
  and take every branch an accelerator takes (the library keeps its numpy host path for ``cpu``), so the count is
  what a CUDA step launches. Host reads (``aten._local_scalar_dense``: on a GPU each is a sync) are counted apart;
  the optimizer's own reads are not answered by meta tensors, so a read returns 0 ("no overflow").
  Deterministic, so tests/torch/test_launch_counts.py pins them.
* ``--device cuda``: CUDA kernels per step from ``torch.profiler``.

Variants, each over a plain ``step()`` of the same inner optimizer:

* ``GradScaler``: ``torch.amp.GradScaler``'s ``scale``, ``step``, ``update``;
* ``lossscale GradScaler``: ``lossscale.torch.GradScaler``, the same calls;
* ``dynamic``: ``LossScaleOptimizer(inner)`` (TensorFlow's rule);
* ``auto``: ``loss_scale="auto"``, an unsampled and a sampled step;
* ``stats N=16``: ``"dynamic"`` with ``stats_every=16``, an unsampled and a sampled step.

* ``--depth`` (meta): also the critical path of each step, the longest chain of dependent operators
  (:attr:`OpCounter.depth`): a floor under what any eager regrouping of the same operators launches.

Run:  python benchmarks/kernel_count.py [--device meta|cuda] [--params 1e6] [--tensors 100 1000]
          [--optimizers adamw-fused adamw-foreach sgd] [--depth]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.optim.optimizer as _optimizer_module
from torch.utils._python_dispatch import TorchDispatchMode

from lossscale.torch import GradScaler, LossScaleOptimizer

SCALE = 1024.0
VARIANTS = ("GradScaler", "lossscale GradScaler", "dynamic", "auto", "stats N=16")
OPTIMIZERS = ("adamw-fused", "adamw-foreach", "sgd")
#: Operators that launch no kernel: allocations, and ``set_`` (a tensor made to share another's memory).
_ALLOCATIONS = {"empty.memory_format", "empty_strided.default", "set_.source_Storage_storage_offset"}
_READ = torch.ops.aten._local_scalar_dense.default


class OpCounter(TorchDispatchMode):
    """Counts the operators dispatched inside it, by name: views, allocations, ``set_`` and the profiler's markers
    left out (they launch no kernel). A host read of a meta tensor is counted and answered with 0.

    It also measures :attr:`depth`, the critical path: the longest chain of counted operators each of which reads
    what the one before wrote (a tensor it returned, or one it wrote in place). Operators that do not depend on each
    other could share a kernel; dependent ones cannot, so however an eager form batches the same operators it
    launches at least ``depth`` kernels. Dependencies are followed by tensor identity, not through shared memory,
    so this is a lower bound of the true chain."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.reads = 0
        self.depth = 0
        self._depths: dict[int, tuple[torch.Tensor, int]] = {}  # id -> (tensor, kept alive so ids stay unique)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is _READ and args[0].device.type == "meta":
            self.reads += 1
            return 0
        name = str(func)
        counted = not func.is_view and func.__name__ not in _ALLOCATIONS and not name.startswith("profiler.")
        if counted:
            self.ops[name] += func is not _READ
            self.reads += func is _READ
        kwargs = kwargs or {}
        depth = max((self._depths.get(id(t), (t, 0))[1] for t in _tensors((args, kwargs))), default=0) + counted
        out = func(*args, **kwargs)
        written = [v for a, v in zip(func._schema.arguments, args) if a.alias_info is not None and a.alias_info.is_write]
        for t in _tensors((out, written)):
            self._depths[id(t)] = (t, depth)
        self.depth = max(self.depth, depth)
        return out

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def _tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors in nested lists, tuples and dicts (an operator's arguments or results)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    return [t for item in tree for t in _tensors(item)] if isinstance(tree, (list, tuple)) else []


@contextlib.contextmanager
def fused_on_meta():
    """Lets torch's fused optimizers take ``meta`` parameters (their meta kernels exist; only the device check
    refuses), for the count. Restored on exit."""
    original = _optimizer_module._get_fused_kernels_supported_devices
    _optimizer_module._get_fused_kernels_supported_devices = lambda: [*original(), "meta"]
    try:
        yield
    finally:
        _optimizer_module._get_fused_kernels_supported_devices = original


def make_inner(kind: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if kind == "adamw-fused":
        return torch.optim.AdamW(params, 1e-3, fused=True)
    if kind == "adamw-foreach":
        return torch.optim.AdamW(params, 1e-3, foreach=True)
    if kind == "sgd":
        return torch.optim.SGD(params, 1e-3, momentum=0.9, foreach=True)
    raise ValueError(f"unknown optimizer {kind!r}; one of {', '.join(OPTIMIZERS)}")


def make_step(variant: str, inner: torch.optim.Optimizer, loss: torch.Tensor) -> Callable[[], Any]:
    """One iteration's loss-scaling calls around ``inner``'s step (the gradients are set apart)."""
    if variant == "plain":
        return inner.step
    if variant in ("GradScaler", "lossscale GradScaler"):
        cls = torch.amp.GradScaler if variant == "GradScaler" else GradScaler
        scaler = cls(loss.device.type, init_scale=SCALE)
        return lambda: (scaler.scale(loss), scaler.step(inner), scaler.update())
    policy, every = {"dynamic": ("dynamic", None), "auto": ("auto", None), "stats N=16": ("dynamic", 16)}[variant]
    opt = LossScaleOptimizer(inner, policy, stats_every=every)
    return lambda: (opt.get_scaled_loss(loss), opt.step())


def count_meta(variant: str, kind: str = "adamw-fused", params: float = 1e6, tensors: int = 100,
               steps: int = 17) -> list[tuple[int, int]]:
    """``(operators, host reads)`` of each of ``steps`` steps after 3 warm-up steps, over a plain step of ``kind``
    (so the loss scaling's own), on ``tensors`` meta parameters of ``params`` elements in all. Step 0 of the list
    is a sampled step of the ``stats_every=16`` variants (their 4th)."""
    size = max(1, int(params) // tensors)
    with fused_on_meta():
        out = []
        for name in ("plain", variant):
            weights = [torch.nn.Parameter(torch.empty(size, device="meta")) for _ in range(tensors)]
            loss = torch.ones((), device="meta")
            inner = make_inner(kind, weights)
            for w in weights:
                w.grad = torch.empty_like(w)
            with OpCounter():
                inner.step()  # the inner state exists before loss scaling starts (as after any first step)
            step = make_step(name, inner, loss)
            counts = []
            for i in range(3 + steps):
                for w in weights:
                    w.grad = torch.empty_like(w)
                with OpCounter() as counter:
                    step()
                if i >= 3 or name == "plain":
                    counts.append((counter.total, counter.reads))
            out.append(counts)
    (plain_ops, plain_reads), rows = out[0][-1], out[1]
    return [(ops - plain_ops, reads - plain_reads) for ops, reads in rows]


def critical_paths(variant: str, kind: str = "adamw-fused", params: float = 1e6, tensors: int = 100) -> list[int]:
    """:attr:`OpCounter.depth` of a whole step (the inner optimizer's included) of ``variant`` over ``kind``, for
    each of 17 steps after 3 warm-up steps, as :func:`count_meta` runs them (entry 13 is a sampled step, where
    the variant samples)."""
    size = max(1, int(params) // tensors)
    with fused_on_meta():
        weights = [torch.nn.Parameter(torch.empty(size, device="meta")) for _ in range(tensors)]
        inner = make_inner(kind, weights)
        for w in weights:
            w.grad = torch.empty_like(w)
        with OpCounter():
            inner.step()
        step = make_step(variant, inner, torch.ones((), device="meta"))
        depths = []
        for i in range(20):
            for w in weights:
                w.grad = torch.empty_like(w)
            with OpCounter() as counter:
                step()
            if i >= 3:
                depths.append(counter.depth)
    return depths


def summary(variant: str, kind: str, params: float, tensors: int) -> dict[str, Any]:
    """The added operators of an unsampled and (statistics) a sampled step, and the host reads per step."""
    rows = count_meta(variant, kind, params, tensors)
    ops = [r[0] for r in rows]
    sampled = variant in ("auto", "stats N=16")
    return {"unsampled": ops[1] if sampled else ops[0], "sampled": ops[13] if sampled else None,
            "reads": max(r[1] for r in rows), "steady": len(set(ops[1:13] + ops[14:])) == 1}


def _table(args: argparse.Namespace, variants: tuple[str, ...], cell: Callable[[str, str, int], str]) -> None:
    """A markdown table: a row per optimizer and tensor count, a column per variant, ``cell(variant, kind,
    tensors)`` in each."""
    print("| optimizer | tensors | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for kind in args.optimizers:
        for tensors in args.tensors:
            print(f"| {kind} | {tensors} | " + " | ".join(cell(v, kind, tensors) for v in variants) + " |")


def _count_cell(variant: str, kind: str, tensors: int, params: float) -> str:
    row = summary(variant, kind, params, tensors)
    text = str(row["unsampled"]) if row["sampled"] is None else f"{row['unsampled']} / {row['sampled']}"
    return text + (f" [{row['reads']:+d}]" if row["reads"] else "")


def _depth_cell(variant: str, kind: str, tensors: int, params: float) -> str:
    depths = critical_paths(variant, kind, params, tensors)
    return f"{depths[1]} / {depths[13]}" if variant in ("auto", "stats N=16") else str(depths[0])


def main_meta(args: argparse.Namespace) -> None:
    print(f"# torch {torch.__version__}, meta tensors, {args.params:.0e} parameters; operators added over a plain "
          "step of the same optimizer (host reads added in brackets)\n")
    _table(args, VARIANTS, lambda v, kind, tensors: _count_cell(v, kind, tensors, args.params))
    print("\nauto and stats N=16: unsampled / sampled step.")
    if args.depth:
        print("\nCritical path: the longest chain of dependent operators in a whole step (the plain step's "
              "included); an eager form launches at least this many kernels, however it batches the rest.\n")
        _table(args, ("plain", *VARIANTS), lambda v, kind, tensors: _depth_cell(v, kind, tensors, args.params))


def main_cuda(args: argparse.Namespace) -> None:
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a CUDA device; --device meta counts without one.")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.params:.0e} parameters; CUDA kernels "
          f"per step (mean of {args.steps}), added over a plain step\n")
    print("| optimizer | tensors | " + " | ".join(VARIANTS) + " |\n|---|---|" + "---|" * len(VARIANTS))
    for kind in args.optimizers:
        for tensors in args.tensors:
            size = max(1, int(args.params) // tensors)
            per_step = {}
            for variant in ("plain", *VARIANTS):
                weights = [torch.nn.Parameter(torch.randn(size, device="cuda")) for _ in range(tensors)]
                grads = [torch.full_like(w, 1e-3 * SCALE) for w in weights]
                inner = make_inner(kind, weights)
                step = make_step(variant, inner, torch.ones((), device="cuda"))

                def run() -> None:
                    for w, g in zip(weights, grads):  # noqa: B023
                        w.grad = g.clone()
                    step()  # noqa: B023

                for _ in range(3):
                    run()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(args.steps):
                        run()
                    torch.cuda.synchronize()
                kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
                per_step[variant] = kernels / args.steps
            base = per_step.pop("plain")
            print(f"| {kind} | {tensors} | " + " | ".join(f"{v - base:+.1f}" for v in per_step.values()) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", choices=("meta", "cuda"), default="meta")
    parser.add_argument("--params", type=float, default=1e6)
    parser.add_argument("--tensors", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--optimizers", nargs="+", choices=OPTIMIZERS, default=list(OPTIMIZERS))
    parser.add_argument("--steps", type=int, default=32, help="profiled steps per variant (cuda)")
    parser.add_argument("--depth", action="store_true", help="also each step's critical path (meta)")
    args = parser.parse_args()
    (main_meta if args.device == "meta" else main_cuda)(args)


if __name__ == "__main__":
    main()
