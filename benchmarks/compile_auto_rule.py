"""An experiment: ``torch.compile`` of a sampled ``loss_scale="auto"`` step's scale work (the core rule on the new
sample, then the overflow table's rebuild), against the same operators run eagerly.

Eagerly (the library today) a sampled step dispatches about 190 operators for this work, one kernel launch each
on a GPU (``benchmarks/kernel_count.py``). Compiled, inductor fuses them into a few kernels. This prints the first
compile's time, the kernels inductor generated, whether the compiled results equal the eager ones bit for bit, and
the host time per call of each. On the CPU inductor writes C++ kernels (a C++ compiler is needed); on a GPU it
writes Triton kernels, whose number may differ: run it there with ``--device cuda``.

The library does not compile its rule: the first compile takes tens of seconds, and a GPU is needed to check and
time the compiled form where it matters (docs/benchmarks.md, "Launches per step").

Run:  python benchmarks/compile_auto_rule.py [--device cpu|cuda] [--calls 200]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch._inductor import metrics

from lossscale import AutoLossScale, initial_state
from lossscale._auto import initial_auto_state, next_auto_state, overflow_key, overflow_table
from lossscale._stats import gradient_stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    device = torch.device(args.device)
    policy = AutoLossScale()
    state, auto = initial_state(policy, torch, device=device), initial_auto_state(policy, torch, device=device)
    sample = gradient_stats([torch.full((8,), 2.0**-3, device=device), torch.full((4,), 2.0**-10, device=device)],
                            torch, 0)
    finite, sampled = torch.tensor(True, device=device), torch.tensor(True, device=device)

    def sampled_step(state: Any, auto: Any, finite: Any, sample: Any) -> tuple:
        state, auto = next_auto_state(policy, state, auto, finite, sample, sampled, torch)
        return state, auto, overflow_table(policy, auto, torch), overflow_key(state.loss_scale, auto.margin, torch)

    def flat(out: tuple) -> list[torch.Tensor]:
        return [*out[0], *out[1], out[2], out[3]]

    eager = flat(sampled_step(state, auto, finite, sample))
    metrics.reset()
    start = time.perf_counter()
    compiled = torch.compile(sampled_step, fullgraph=True, dynamic=False)
    got = flat(compiled(state, auto, finite, sample))
    first = time.perf_counter() - start
    same = all(torch.equal(torch.nan_to_num(x), torch.nan_to_num(y)) and torch.equal(x.isnan(), y.isnan())
               for x, y in zip(got, eager))
    print(f"torch {torch.__version__}, {device}: first compile {first:.1f} s, {metrics.generated_kernel_count} "
          f"kernels generated, bit for bit the eager results: {same}")
    for name, fn in [("compiled", compiled), ("eager", sampled_step)]:
        for _ in range(5):
            fn(state, auto, finite, sample)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.calls):
            fn(state, auto, finite, sample)
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(f"{name}: {(time.perf_counter() - start) / args.calls * 1e6:.0f} us per call")


if __name__ == "__main__":
    main()
