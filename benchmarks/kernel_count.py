"""GPU kernels launched per optimizer step: plain, ``torch.amp.GradScaler``, and lossscale's variants (CUDA only).

On a GPU a small model's step is bound by launches (each eager op is one kernel and about 5-20 us of host time),
so the number of kernels loss scaling adds says more than its passes over the gradients. Counted with
``torch.profiler`` over ``--steps`` steps after a warm-up, per step; "+kernels" is over the plain step.

* ``plain``: fused AdamW ``step()`` on unscaled gradients;
* ``GradScaler``: ``scale``, ``step``, ``update``;
* ``dynamic``: ``LossScaleOptimizer(..., "dynamic")`` (TensorFlow's rule);
* ``auto``: ``loss_scale="auto"`` (a sample every 16 steps; its rule every step);
* ``stats N=1``: ``"dynamic"`` with a sample every step.

Run:  python benchmarks/kernel_count.py [--params 1e6] [--tensors 100]
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from lossscale.torch import LossScaleOptimizer

SCALE = 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=float, default=1e6)
    parser.add_argument("--tensors", type=int, default=100)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("kernel_count.py needs a CUDA device.")
    size = int(args.params) // args.tensors
    params = [torch.nn.Parameter(torch.randn(size, device="cuda")) for _ in range(args.tensors)]
    loss = torch.ones((), device="cuda")

    def set_grads(scale: float) -> None:
        for p in params:
            p.grad = torch.full_like(p, 1e-3 * scale)

    def variant(name: str):  # type: ignore[no-untyped-def]
        inner = torch.optim.AdamW(params, 1e-3, fused=True)
        if name == "plain":
            return lambda: (set_grads(1.0), inner.step())
        if name == "GradScaler":
            scaler = torch.amp.GradScaler("cuda", init_scale=SCALE)
            return lambda: (set_grads(SCALE), scaler.scale(loss), scaler.step(inner), scaler.update())
        loss_scale, every = {"dynamic": ("dynamic", None), "auto": ("auto", None), "stats N=1": ("dynamic", 1)}[name]
        opt = LossScaleOptimizer(inner, loss_scale, stats_every=every)
        return lambda: (set_grads(SCALE), opt.get_scaled_loss(loss), opt.step())

    rows = {}
    for name in ("plain", "GradScaler", "dynamic", "auto", "stats N=1"):
        run = variant(name)
        for _ in range(3):
            run()
        set_grads(1.0)  # the gradients' own fills, counted apart below
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                run()
            torch.cuda.synchronize()
        kernels = collections.Counter(e.name for e in prof.events() if e.device_type.name == "CUDA")
        rows[name] = (sum(kernels.values()) / args.steps, kernels)
    fills = args.tensors  # set_grads: one fill per tensor per step
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.params:.0e} parameters in "
          f"{args.tensors} tensors, fused AdamW; kernels per step (the {fills} gradient fills left out)\n")
    print("| variant | kernels/step | +kernels over plain | most launched (per step) |\n|---|---|---|---|")
    base = rows["plain"][0] - fills
    for name, (per_step, kernels) in rows.items():
        top = ", ".join(f"{k[:40]} {v / args.steps:g}" for k, v in kernels.most_common(4))
        print(f"| {name} | {per_step - fills:.1f} | {per_step - fills - base:+.1f} | {top} |")


if __name__ == "__main__":
    main()
