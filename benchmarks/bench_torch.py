"""Optimizer-step overhead of loss scaling: plain step vs GradScaler vs lossscale.

Everything runs in ONE process, interleaved round by round, on the same
gradient values, and each case reports the median over rounds of the mean
time per step. What is timed is the optimizer side of a training step (what
loss scaling changes), not the forward/backward pass:

* plain:      ``[clip_grad_norm_] ; opt.step()``           (unscaled gradients)
* GradScaler: ``scaler.scale(loss) ; [scaler.unscale_ ; clip_grad_norm_] ; scaler.step ; scaler.update``
* lossscale:  ``opt.get_scaled_loss(loss) ; [opt.clip_grad_norm_] ; opt.step()``
* facade (``--facade``): ``lossscale.torch.GradScaler`` driven exactly as the GradScaler row

Both scaled variants start each step from gradients equal to ``S * g``
(restored outside the timed region). "overhead" is a variant's time minus
plain's; "ratio" is lossscale's overhead over GradScaler's. Host syncs are
counted with ``lossscale.torch.HostSyncCounter``, a ``TorchDispatchMode`` that counts ``aten._local_scalar_dense``
(what ``.item()``, ``bool(tensor)`` and friends call); the table shows the
syncs each variant adds to the plain step.

Run:  python benchmarks/bench_torch.py            (full sweep, a few minutes)
      python benchmarks/bench_torch.py --device cuda (on a GPU: each timed step ends with a synchronize)
      python benchmarks/bench_torch.py --quick    (small sizes, seconds)
      python benchmarks/bench_torch.py --facade   (adds lossscale.torch.GradScaler: its overhead and its
                                                   ratio to lossscale's, which should be about 1)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch

from lossscale.torch import GradScaler, HostSyncCounter, LossScaleOptimizer

SCALE = 1024.0
MAX_NORM = 1.0
DEVICE = torch.device("cpu")  # --device


def synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def make_params(n_params: int, n_tensors: int, seed: int) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    size = n_params // n_tensors
    return [torch.nn.Parameter(torch.randn(size, generator=gen).to(DEVICE)) for _ in range(n_tensors)]


def make_optimizer(kind: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if kind == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-3, fused=True)
    if kind == "adamw-foreach":
        return torch.optim.AdamW(params, lr=1e-3, foreach=True)
    if kind == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    raise ValueError(f"unknown optimizer {kind!r}")


class Variant:
    """One way of running the optimizer step.

    Every variant of a case steps the *same* parameter, gradient and
    optimizer-state tensors (each has its own optimizer object, all sharing
    one ``state`` dict), so that where the allocator put them cannot favour
    one variant: with separate copies, AdamW-foreach steps at 50M parameters
    differed by up to 20 % depending only on allocation order.
    """

    def __init__(
        self, name: str, kind: str, clip: bool, params: list[torch.nn.Parameter], state: dict | None
    ) -> None:
        self.name = name
        self.clip = clip
        self.params = params
        gen = torch.Generator().manual_seed(1)
        scale = 1.0 if name == "plain" else SCALE
        self.grads = [(torch.randn(p.shape, generator=gen) * (1e-3 * scale)).to(DEVICE) for p in self.params]
        inner = make_optimizer(kind, self.params)
        if state is not None:
            inner.state = state
        self.loss = torch.tensor(1.0, device=DEVICE)
        if name == "plain":
            self.opt = inner
            self.run = self._plain
        elif name == "GradScaler":
            self.opt = inner
            self.scaler = torch.amp.GradScaler(DEVICE.type, init_scale=SCALE)
            self.run = self._grad_scaler
        elif name == "facade":  # lossscale's drop-in, driven exactly as torch's
            self.opt = inner
            self.scaler = GradScaler(DEVICE.type, init_scale=SCALE)
            self.run = self._grad_scaler
        elif name == "lossscale":
            self.opt = LossScaleOptimizer(inner, initial_scale=SCALE)
            self.run = self._lossscale
        else:  # every diagnostic on: stall guard and batched history (the overflow report syncs when fused)
            self.opt = LossScaleOptimizer(inner, initial_scale=SCALE, max_consecutive_skips=100, history=True)
            self.run = self._lossscale
        self.restore()

    def restore(self) -> None:
        for p, g in zip(self.params, self.grads):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)

    def _plain(self) -> None:
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.params, MAX_NORM)
        self.opt.step()

    def _grad_scaler(self) -> None:
        self.scaler.scale(self.loss)
        if self.clip:
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.params, MAX_NORM)
        self.scaler.step(self.opt)
        self.scaler.update()

    def _lossscale(self) -> None:
        self.opt.get_scaled_loss(self.loss)
        if self.clip:
            self.opt.clip_grad_norm_(MAX_NORM)
        self.opt.step()

    def timed(self, steps: int) -> float:
        total = 0.0
        for _ in range(steps):
            self.restore()
            synchronize()
            start = time.perf_counter()
            self.run()
            synchronize()
            total += time.perf_counter() - start
        return total / steps

    def syncs(self) -> int:
        self.restore()
        with HostSyncCounter() as counter:
            self.run()
        return counter.count


def bench_case(
    kind: str, n_params: int, n_tensors: int, clip: bool, rounds: int, steps: int, diagnostics: bool = False,
    facade: bool = False,
) -> dict:
    names = ("plain", "GradScaler", "lossscale") + (("lossscale+diagnostics",) if diagnostics else ())
    names += ("facade",) if facade else ()
    params = make_params(n_params, n_tensors, seed=0)
    variants: list[Variant] = []
    for name in names:
        variants.append(Variant(name, kind, clip, params, variants[0].opt.state if variants else None))
    for v in variants:  # warm-up: state allocation, first-step paths
        v.timed(2)
    samples: dict[str, list[float]] = {v.name: [] for v in variants}
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            samples[v.name].append(v.timed(steps))
    med = {name: statistics.median(ts) for name, ts in samples.items()}
    return {
        "kind": kind,
        "n_params": n_params,
        "n_tensors": n_tensors,
        "clip": clip,
        "plain_ms": med["plain"] * 1e3,
        "gs_over_ms": (med["GradScaler"] - med["plain"]) * 1e3,
        "ls_over_ms": (med["lossscale"] - med["plain"]) * 1e3,
        "diag_over_ms": (med["lossscale+diagnostics"] - med["plain"]) * 1e3 if diagnostics else None,
        # Added host syncs: Adam's non-capturable paths read CPU step counters
        # with .item() themselves; those are the plain step's, not loss scaling's.
        "gs_syncs": variants[1].syncs() - variants[0].syncs(),
        "ls_syncs": variants[2].syncs() - variants[0].syncs(),
        "facade_over_ms": (med["facade"] - med["plain"]) * 1e3 if facade else None,
        "facade_syncs": variants[-1].syncs() - variants[0].syncs() if facade else None,
    }


def bench_check_kernels(rounds: int = 3, reps: int = 5) -> None:
    """Times the multi-tensor kernels that could look for Inf/NaN (best of ``rounds``)."""
    print("| kernel | pass | 100 x 100K floats (ms) | 1000 x 10K floats (ms) |")
    print("|---|---|---|---|")
    results: dict[str, list[float]] = {}
    for n_tensors in (100, 1000):
        grads = [torch.randn(10_000_000 // n_tensors) for _ in range(n_tensors)]
        found, one = torch.zeros(()), torch.ones(())
        kernels: dict[str, tuple[str, Callable[[], object]]] = {
            "_amp_foreach_non_finite_check_and_unscale_": (
                "R+W", lambda g=grads, f=found, o=one: torch._amp_foreach_non_finite_check_and_unscale_(g, f, o)),
            "_foreach_max": ("R", lambda g=grads: torch.stack(torch._foreach_max(g))),
            "_foreach_norm(2)": ("R", lambda g=grads: torch.stack(torch._foreach_norm(g, 2))),
            "_foreach_norm(1)": ("R", lambda g=grads: torch.stack(torch._foreach_norm(g, 1))),
            "per-tensor dot(g, g)": ("R", lambda gs=grads: [torch.dot(g, g) for g in gs]),
            "per-tensor sum": ("R", lambda gs=grads: [g.sum() for g in gs]),
        }
        for name, (_, fn) in kernels.items():
            best = float("inf")
            for _ in range(rounds):
                fn()
                start = time.perf_counter()
                for _ in range(reps):
                    fn()
                best = min(best, (time.perf_counter() - start) / reps)
            results.setdefault(name, []).append(best * 1e3)
    for name, (kind, _) in kernels.items():
        print(f"| `{name}` | {kind} | {results[name][0]:.2f} | {results[name][1]:.2f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (a smoke run)")
    parser.add_argument("--sizes", type=lambda s: [int(float(x)) for x in s.split(",")], default=None)
    parser.add_argument("--tensors", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--optimizers", type=lambda s: s.split(","), default=None)
    parser.add_argument("--clip", choices=["both", "on", "off"], default="both")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--diagnostics", action="store_true",
                        help="add a column: lossscale with max_consecutive_skips and history=True")
    parser.add_argument("--facade", action="store_true",
                        help="add columns: lossscale.torch.GradScaler driven as torch's, and its ratio to lossscale's")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--check-kernels", action="store_true", help="time the candidate Inf/NaN check kernels and exit")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.check_kernels:
        bench_check_kernels()
        return
    sizes = args.sizes or ([100_000] if args.quick else [1_000_000, 10_000_000, 50_000_000])
    tensors = args.tensors or ([10] if args.quick else [100, 1000])
    kinds = args.optimizers or ["adamw-fused", "adamw-foreach", "sgd-momentum"]
    clips = {"both": [False, True], "on": [True], "off": [False]}[args.clip]
    rounds = args.rounds or (2 if args.quick else 7)
    steps = args.steps or (2 if args.quick else 5)

    where = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else platform.processor() or platform.machine()
    print(f"# torch {torch.__version__}, {where}, "
          f"{torch.get_num_threads()} threads, rounds={rounds}, steps/round={steps}, scale={SCALE:g}")
    header = ("optimizer", "params", "tensors", "clip", "plain ms", "GradScaler +ms", "lossscale +ms",
              "ratio", "+syncs GS", "+syncs LS") + (("lossscale+diagnostics +ms",) if args.diagnostics else ())
    header += ("facade +ms", "facade / lossscale", "+syncs facade") if args.facade else ()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for kind in kinds:
        for n_params in sizes:
            for n_tensors in tensors:
                for clip in clips:
                    row = bench_case(kind, n_params, n_tensors, clip, rounds, steps, args.diagnostics, args.facade)
                    facade = ""
                    if args.facade:
                        same = row["facade_over_ms"] / row["ls_over_ms"] if row["ls_over_ms"] > 0 else float("nan")
                        facade = f" {row['facade_over_ms']:+.2f} | {same:.2f} | {row['facade_syncs']} |"
                    ratio = row["ls_over_ms"] / row["gs_over_ms"] if row["gs_over_ms"] > 0 else float("nan")
                    print(
                        f"| {kind} | {n_params / 1e6:g}M | {n_tensors} | {'yes' if clip else 'no'} | "
                        f"{row['plain_ms']:.2f} | {row['gs_over_ms']:+.2f} | {row['ls_over_ms']:+.2f} | "
                        f"{ratio:.2f} | {row['gs_syncs']} | {row['ls_syncs']} |"
                        + (f" {row['diag_over_ms']:+.2f} |" if args.diagnostics else "") + facade,
                        flush=True,
                    )


if __name__ == "__main__":
    main()
