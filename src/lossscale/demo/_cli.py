"""``python -m lossscale demo``: the command line, its progress bars and its tables."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ._backends import backend
from ._config import FRAMEWORKS, SWEEP_FACTORS, DemoConfig
from ._results import DemoResult, RunResult, SweepResult
from ._runner import DEFAULT_OUTPUT, check_output, run_demo, run_sweep, sweep_path

__all__ = ["main"]

EXPLAINED = (
    "What is simulated: a global batch of K micro-batches (gradient accumulation or data parallelism), where each "
    "micro-batch's backward sees its loss divided by K. Each step here runs exactly one such micro-batch backward "
    "and lets Adam (eps scaled by 1/K too) step on it, to fit a CPU budget: the gradient values float16 has to "
    "hold are the ones a real K-micro-batch run computes."
)


def _parser() -> argparse.ArgumentParser:
    defaults = DemoConfig()
    parser = argparse.ArgumentParser(
        prog="python -m lossscale demo",
        description="A digits autoencoder at a large global batch in float32, float16 and float16 + lossscale.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # every option's default, in --help
    )
    parser.add_argument("--framework", choices=[*FRAMEWORKS, "both"], default="both",
                        help="train with torch, jax or both")
    parser.add_argument("-K", "--global-batch-factor", type=int, default=defaults.global_batch_factor,
                        help="micro-batches per global batch; each step's loss is divided by K")
    parser.add_argument("--steps", type=int, default=defaults.steps,
                        help="optimizer steps per run")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="data split, weights and batch order")
    parser.add_argument("--growth-steps", type=int, default=defaults.growth_steps,
                        help="good steps before the loss scale doubles")
    parser.add_argument("--threads", type=int, default=defaults.threads, help="torch intra-op threads")
    parser.add_argument("--auto", action="store_true",
                        help="also train fp16+auto: the EXPERIMENTAL loss_scale='auto' (lossscale.AutoLossScale)")
    parser.add_argument("--no-k1", action="store_true", help="skip the K = 1 reference runs")
    parser.add_argument("--sweep", action="store_true",
                        help="instead: PSNR against K = 2^0..2^10 for the three modes (slow; see docs/demo.md)")
    parser.add_argument("-o", "--output", default=DEFAULT_OUTPUT,
                        help="the PNG; results JSON goes beside it; --sweep writes <name>_sweep.png")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def _config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> DemoConfig:
    try:
        config = DemoConfig(
            steps=args.steps, seed=args.seed, global_batch_factor=args.global_batch_factor,
            frameworks=FRAMEWORKS if args.framework == "both" else (args.framework,),
            growth_steps=args.growth_steps, threads=args.threads, k1_reference=not args.no_k1,
            auto=args.auto,
        )
        check_output(sweep_path(args.output) if args.sweep else args.output)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    for name in config.frameworks:  # a missing framework, before any training
        try:
            backend(name).load()
        except ModuleNotFoundError as error:
            parser.error(str(error))
    return config


def _row(run: RunResult, reference: RunResult) -> list[str]:
    scaled = run.final_scale is not None
    delta = "" if run is reference else f"{run.psnr_db - reference.psnr_db:+.2f}"
    return [
        run.mode if run.global_batch_factor != 1 else f"{run.mode}, K=1",
        f"{run.psnr_db:.2f}",
        delta,
        f"{run.zero_grad_share:.1%}",
        str(run.skipped_steps) if scaled else "-",
        f"2^{math.log2(run.final_scale):g}" if run.final_scale is not None else "-",
        f"{run.seconds:.0f} s",
    ]


def main(argv: list[str] | None = None) -> int:
    """Runs the demo (or ``--sweep``) with rich progress bars and prints the tables; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    config = _config(args, parser)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    k = config.global_batch_factor
    what = "K = 2^0..2^10" if args.sweep else f"K = {k}"
    console.print(f"[bold]lossscale demo[/]: digits autoencoder, {config.steps} steps per run, {what}, "
                  f"{' and '.join(config.frameworks)} on CPU")
    console.print(EXPLAINED, style="dim")
    columns = (TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    start = time.perf_counter()
    with Progress(*columns, console=console, disable=args.no_progress) as bars:

        def progress(label: str, total: int) -> Callable[[], None]:
            task = bars.add_task(label, total=total)
            return lambda: bars.advance(task)

        if args.sweep:
            sweep = run_sweep(config, factors=SWEEP_FACTORS, output=sweep_path(args.output), progress=progress)
            png, json_path = sweep.png_path, sweep.json_path
        else:
            result = run_demo(config, output=args.output, progress=progress)
            png, json_path = result.png_path, result.json_path
    seconds = time.perf_counter() - start

    if args.sweep:
        _print_sweep(console, sweep)
    else:
        _print_demo(console, result)
    console.print(f"Training and plotting took {seconds:.0f} s. Picture: [bold]{os.path.abspath(png or '')}[/]")
    console.print(f"Numbers: [bold]{json_path}[/]")
    return 0


def _print_sweep(console: Any, sweep: SweepResult) -> None:
    from rich.table import Table

    for framework, runs in sweep.runs.items():
        table = Table(title=f"{framework}: held-out PSNR (dB) against K (seed {sweep.config.seed})")
        table.add_column("K", justify="right")
        for mode in runs:
            table.add_column(mode, justify="right")
        for i, factor in enumerate(sweep.factors):
            table.add_row(f"2^{int(math.log2(factor))}" if factor & (factor - 1) == 0 else str(factor),
                          *(f"{mode_runs[i].psnr_db:.2f}" for mode_runs in runs.values()))
        console.print(table)


def _print_demo(console: Any, result: DemoResult) -> None:
    from rich.table import Table

    config = result.config
    header = ["run", "PSNR (dB)", "vs fp32", "zero grads", "skipped", "scale", "time"]
    for framework, runs in result.runs.items():
        table = Table(title=f"{framework}: held-out PSNR after {config.steps} steps at "
                            f"K = {config.global_batch_factor} (seed {config.seed})")
        for i, name in enumerate(header):
            table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
        reference = runs["fp32"]
        for run in runs.values():
            table.add_row(*_row(run, reference))
        k1 = result.k1_runs.get(framework)
        if k1:
            table.add_section()
            for run in k1.values():
                table.add_row(*_row(run, reference))
        console.print(table)
    console.print(
        "zero grads: share of weight-gradient values exactly zero, averaged over every "
        f"{config.measure_every}th step. float32's ~1% are the first layer's weights of pixels blank in every "
        "image; GELU has no dead units, so whatever float16 adds, it flushed (below 2^-25)."
        + (" fp16, K=1: plain float16 on the plain mean loss; this model's own gradients fit float16."
           if result.k1_runs else "")
        + (" fp16+auto: the EXPERIMENTAL loss_scale=\"auto\" (lossscale.AutoLossScale), default settings."
           if config.auto else "")
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
