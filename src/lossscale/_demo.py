"""``python -m lossscale demo``: fp32 vs fp16 vs fp16 + lossscale on real data, in about a minute.

What it trains: an MLP (6 hidden GELU layers of 64, PyTorch's default
initialisation) on scikit-learn's handwritten digits (1,797 8x8 images that
ship inside scikit-learn, so no network is needed), with Adam and mini-batches
of 128, three times from the same weights on the same batches:

1. ``fp32``: the reference;
2. ``fp16``: ``torch.autocast`` float16, no loss scaling;
3. ``fp16+lossscale``: the same, with :class:`lossscale.torch.LossScaleOptimizer`
   (dynamic scale).

``--framework jax`` trains the same three runs with optax and
:mod:`lossscale.jax` (float16 compute, float32 master weights; see
:mod:`lossscale._demo_jax`).

Why the unscaled fp16 run loses gradients, honestly. float16's smallest
positive value is 2**-24 (about 6e-8); anything smaller rounds to zero.
Micikevicius et al. (2018, "Mixed Precision Training") found that in real
networks a large share of the activation gradients lies below that, because
a gradient's size is set by how the loss is averaged: a large model's loss is
a mean over millions of tokens, so each token's share of every gradient is
tiny. A 64-pixel digit classifier averaged over 128 examples has gradients
well inside float16's range (try ``--loss-weight 1``: the three runs agree).
So the demo puts them where a large model's are: the loss is multiplied by
``loss_weight`` = 2**-10, as if each batch were one 1/1024 slice of a large
global batch. Adam is invariant to a constant factor on the loss when its
``eps`` is scaled by the same factor, which the demo does, so in exact
arithmetic all three runs train the same model as the plain mean loss would;
every difference between them is float16 precision.

What happens then: as the model fits the data, the per-example errors
``softmax - onehot`` shrink, the backward pass's activation gradients fall
below 2**-24 layer after layer, and float16 flushes them; the weight
gradients built from them are exactly zero. The unscaled run stops improving
while fp32 keeps going. The loss scale multiplies the loss by S (grown until
a gradient overflows, then backed off) before the backward pass, which
shifts those values back into float16's range; the optimizer divides by S in
float32, and the run tracks fp32.

"Zero gradients" in the table is the share of weight-gradient values that are
exactly zero, averaged over every ``measure_every``-th step. In fp32 about 1%
are: the first-layer weights of the few pixels that are blank in every image.
GELU has no dead units, so whatever an fp16 run has beyond that, fp16
flushed.

The demo is also an API: :func:`run_demo` returns a :class:`DemoResult` with
every number of the table and the curves of the plot.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ._history import History

__all__ = ["DemoConfig", "DemoData", "DemoResult", "RunResult", "MODES", "load_data", "run_demo", "plot_results", "main"]

#: The three runs, in order.
MODES = ("fp32", "fp16", "fp16+lossscale")

#: framework name -> module holding ``train(mode, data, config, on_step) -> RunResult``.
#: Adding a framework is one entry here and one ``_demo_<framework>.py``.
BACKENDS = {"torch": "lossscale._demo_torch", "jax": "lossscale._demo_jax"}
#: framework name -> the packages its backend imports, and the extra that installs them.
REQUIREMENTS = {"torch": (("torch",), "demo"), "jax": (("jax", "optax"), "demo,jax")}


def check_installed(framework: str) -> None:
    """Raises ``ModuleNotFoundError`` naming the install command when ``framework``'s packages are missing."""
    packages, extra = REQUIREMENTS[framework]
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f"The {framework} demo needs {', '.join(missing)}: pip install 'lossscale[{extra}]' "
            "(make demo installs everything)."
        )

DEFAULT_OUTPUT = "lossscale_demo.png"


@dataclass(frozen=True)
class DemoConfig:
    """The demo's settings; the defaults are the ones ``python -m lossscale demo`` runs.

    Attributes:
        steps: optimizer steps per run.
        seed: seeds the train/test split, the initial weights and the batch order.
        framework: a key of :data:`BACKENDS`.
        loss_weight: the constant the loss is multiplied by (see the module
            docstring); 1 trains on the plain mean loss.
        growth_steps: finite steps before the dynamic scale doubles. Shorter
            than the library's 2000 so that a 1000-step demo shows the scale
            climbing and backing off.
        batch_size, depth, width, lr: the model and its training.
        measure_every: steps between measurements of zero gradients.
        threads: torch intra-op threads during the demo; 1 is fastest for
            this small model on a shared 2-core machine. Ignored by the JAX
            backend (XLA fixes its thread pool when JAX starts).
    """

    steps: int = 1000
    seed: int = 0
    framework: str = "torch"
    loss_weight: float = 2.0**-10
    growth_steps: int = 20
    batch_size: int = 128
    depth: int = 6
    width: int = 64
    lr: float = 1e-3
    measure_every: int = 10
    threads: int = 1

    def validate(self) -> None:
        """Raises ValueError naming the fix for any setting out of range."""
        for name in ("steps", "growth_steps", "batch_size", "depth", "width", "measure_every", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int; got {type(value).__name__}.")
            if value < 1:
                raise ValueError(f"{name} must be at least 1; got {value}.")
        if self.framework not in BACKENDS:
            raise ValueError(f"framework must be one of {', '.join(sorted(BACKENDS))}; got {self.framework!r}.")
        if not (math.isfinite(self.loss_weight) and 0 < self.loss_weight <= 1):
            raise ValueError(f"loss_weight must be in (0, 1], e.g. 2**-10; got {self.loss_weight}.")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, e.g. 1e-3; got {self.lr}.")
        if self.batch_size > 1437:
            raise ValueError(f"batch_size must be at most 1437, the size of the training split; got {self.batch_size}.")


@dataclass(frozen=True)
class DemoData:
    """scikit-learn's digits: an 80/20 stratified split, features standardised on the training part."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


@dataclass
class RunResult:
    """One run's numbers.

    Attributes:
        mode: one of :data:`MODES`.
        losses: the unweighted training loss of every step's batch.
        final_loss: the unweighted loss on the whole training split at the end (fp32 eval).
        accuracy: accuracy on the held-out test split at the end.
        zero_grad_steps, zero_grad_fractions: the steps measured and the share
            of weight-gradient values exactly zero there.
        skipped_steps: steps the loss-scale optimizer skipped (0 without one).
        final_scale: the loss scale at the end, or None without loss scaling.
        history: the loss-scale :class:`History`, or None without loss scaling.
    """

    mode: str
    losses: np.ndarray
    final_loss: float
    accuracy: float
    zero_grad_steps: np.ndarray
    zero_grad_fractions: np.ndarray
    skipped_steps: int
    final_scale: float | None
    history: History | None = None

    @property
    def zero_grad_percent(self) -> float:
        """Mean share of zero gradient values over the measured steps, in percent."""
        return float(np.mean(self.zero_grad_fractions) * 100)


@dataclass
class DemoResult:
    """Everything the demo measured, plus where its picture went."""

    config: DemoConfig
    runs: dict[str, RunResult]
    png_path: str | None
    seconds: float
    run_seconds: dict[str, float] = field(default_factory=dict)

    def table_rows(self) -> list[list[str]]:
        """The table's rows as strings: run, final loss, accuracy, zero grads, skipped, final scale."""
        rows = []
        for mode, run in self.runs.items():
            scale = "-" if run.final_scale is None else f"2^{math.log2(run.final_scale):g}"
            skipped = "-" if run.final_scale is None else str(run.skipped_steps)
            rows.append(
                [mode, f"{run.final_loss:.2e}", f"{run.accuracy:.1%}", f"{run.zero_grad_percent:.1f}%", skipped, scale]
            )
        return rows


TABLE_HEADER = ["run", "final loss", "test acc", "zero grads", "skipped", "final scale"]


def load_data(seed: int = 0) -> DemoData:
    """Loads scikit-learn's bundled digits (no download) and splits them 80/20, stratified by ``seed``."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:
        raise ImportError("The demo needs scikit-learn: pip install 'lossscale[demo]'.") from error
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    return DemoData(
        x_train=((x_train - mean) / std).astype(np.float32),
        y_train=y_train.astype(np.int64),
        x_test=((x_test - mean) / std).astype(np.float32),
        y_test=y_test.astype(np.int64),
    )


def batch_order(n: int, config: DemoConfig) -> np.ndarray:
    """The ``(steps, batch_size)`` training indices every backend uses.

    A fresh permutation of the ``n`` training examples (``numpy``'s
    generator, seeded with ``config.seed``) whenever the next batch would not
    fit, so no example repeats within a permutation.
    """
    rng = np.random.default_rng(config.seed)
    order, pos = rng.permutation(n), 0
    batches = np.empty((config.steps, config.batch_size), np.int64)
    for step in range(config.steps):
        if pos + config.batch_size > n:
            order, pos = rng.permutation(n), 0
        batches[step] = order[pos : pos + config.batch_size]
        pos += config.batch_size
    return batches


def measured_steps(config: DemoConfig) -> np.ndarray:
    """The steps whose zero-gradient share is measured: every ``measure_every``-th, and the last."""
    return np.array(sorted({*range(0, config.steps, config.measure_every), config.steps - 1}))


def _check_output(output: str | os.PathLike[str]) -> str:
    path = os.fspath(output)
    if not path.lower().endswith(".png"):
        raise ValueError(f"output must be a .png path, e.g. {DEFAULT_OUTPUT}; got {path!r}.")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"output's folder {folder!r} does not exist; create it or choose another path.")
    return path


def run_demo(
    config: DemoConfig | None = None,
    *,
    output: str | os.PathLike[str] | None = DEFAULT_OUTPUT,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
) -> DemoResult:
    """Trains the three runs and writes the picture.

    Args:
        config: the settings; :class:`DemoConfig`'s defaults if None.
        output: where to write the PNG, or None for no picture.
        progress: optional ``progress(mode, total_steps)`` returning a
            zero-argument callback called after every step.

    Returns:
        A :class:`DemoResult`.

    Raises:
        ValueError: on a bad setting or output path (checked before training).
    """
    config = DemoConfig() if config is None else config
    if not isinstance(config, DemoConfig):
        raise TypeError(f"config must be a DemoConfig; got {type(config).__name__}.")
    config.validate()
    png_path = None if output is None else _check_output(output)
    check_installed(config.framework)
    backend: Any = importlib.import_module(BACKENDS[config.framework])
    data = load_data(config.seed)
    start = time.perf_counter()
    runs: dict[str, RunResult] = {}
    run_seconds: dict[str, float] = {}
    for mode in MODES:
        on_step = progress(mode, config.steps) if progress is not None else None
        t0 = time.perf_counter()
        runs[mode] = backend.train(mode, data, config, on_step)
        run_seconds[mode] = time.perf_counter() - t0
    result = DemoResult(config, runs, png_path, time.perf_counter() - start, run_seconds)
    if png_path is not None:
        plot_results(result, png_path)
    return result


# ---------------------------------------------------------------- the picture

_COLORS = {"fp32": "#222222", "fp16": "#d62728", "fp16+lossscale": "#1f77b4"}
_PRECISION = {"torch": "torch CPU autocast float16", "jax": "jax CPU float16"}
_LABELS = {"fp32": "fp32 (reference)", "fp16": "fp16, no loss scaling", "fp16+lossscale": "fp16 + lossscale"}


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` steps in log space (the curves span decades)."""
    logs = np.log(np.maximum(values, 1e-30))
    cumsum = np.concatenate([[0.0], np.cumsum(logs)])
    out = np.empty_like(logs)
    for i in range(len(logs)):
        lo = max(0, i + 1 - window)
        out[i] = (cumsum[i + 1] - cumsum[lo]) / (i + 1 - lo)
    return np.exp(out)


def plot_results(result: DemoResult, path: str | os.PathLike[str]) -> None:
    """Draws loss curves, zero-gradient shares and the loss-scale trajectory into one PNG."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 8.6), layout="constrained")
    grid = fig.add_gridspec(3, 1, height_ratios=[3.2, 1.5, 1.7])
    ax_loss = fig.add_subplot(grid[0])
    ax_zero = fig.add_subplot(grid[1], sharex=ax_loss)
    ax_scale = fig.add_subplot(grid[2], sharex=ax_loss)
    steps = result.config.steps
    window = max(1, min(25, steps // 20))
    for mode, run in result.runs.items():
        x = np.arange(len(run.losses))
        color = _COLORS[mode]
        ax_loss.plot(x, run.losses, color=color, alpha=0.12, linewidth=0.8)
        label = f"{_LABELS[mode]}: final loss {run.final_loss:.1e}, test acc {run.accuracy:.1%}"
        ax_loss.plot(x, _smooth(run.losses, window), color=color, linewidth=2.2 if mode != "fp32" else 2.6,
                     linestyle="--" if mode == "fp16+lossscale" else "-", label=label)
        ax_zero.plot(run.zero_grad_steps, run.zero_grad_fractions * 100, color=color, linewidth=2,
                     linestyle="--" if mode == "fp16+lossscale" else "-",
                     label=f"{_LABELS[mode]}: {run.zero_grad_percent:.1f}% on average")
    ax_loss.set_yscale("log")
    ax_loss.set_ylabel("training loss (batch)")
    ax_loss.grid(True, which="major", alpha=0.3)
    ax_loss.legend(loc="upper right", frameon=True, framealpha=0.9)
    fig.suptitle(
        "Same model, same data, same batches: fp16 without loss scaling stalls as its gradients flush to zero",
        x=0.01, ha="left", fontsize=12, fontweight="bold",
    )
    cfg = result.config
    ax_loss.set_title(
        f"scikit-learn digits, MLP {cfg.depth}x{cfg.width} GELU, Adam lr {cfg.lr:g}, batch {cfg.batch_size}, "
        f"loss x 2^{math.log2(cfg.loss_weight):g} (a large model's gradient magnitude), seed {cfg.seed}, "
        f"{_PRECISION.get(cfg.framework, cfg.framework)}",
        loc="left", fontsize=9, color="#555555",
    )
    ax_loss.tick_params(labelbottom=False)
    ax_zero.set_ylabel("gradient values\nexactly zero (%)")
    ax_zero.set_ylim(-3, 103)
    ax_zero.grid(True, alpha=0.3)
    ax_zero.legend(loc="upper left", frameon=True, framealpha=0.9, fontsize=8.5)
    ax_zero.tick_params(labelbottom=False)
    scaled = result.runs.get("fp16+lossscale")
    if scaled is not None and scaled.history is not None:
        scaled.history.plot(ax=ax_scale)
        ax_scale.set_ylabel("lossscale's\ndynamic scale")
        ax_scale.legend(loc="lower right", frameon=True, framealpha=0.9, fontsize=8.5)
    ax_scale.set_xlabel("step")
    ax_scale.set_xlim(0, steps)
    fig.savefig(path, dpi=130)


# ---------------------------------------------------------------- the command line


def _parser() -> argparse.ArgumentParser:
    defaults = DemoConfig()
    parser = argparse.ArgumentParser(
        prog="python -m lossscale demo",
        description=(
            "Train one MLP on scikit-learn's digits three ways (fp32; float16 compute without loss scaling; "
            "float16 compute with lossscale's dynamic loss scale; torch: autocast, jax: float16 with float32 "
            "master weights), print a table of final loss, accuracy, "
            "zero gradients, skipped steps and final scale, and write a PNG of the loss curves and the "
            "loss-scale trajectory. About a minute on 2 CPU cores."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps per run (at least 1)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the data split, weights and batches")
    parser.add_argument("-o", "--output", default=DEFAULT_OUTPUT, help="where to write the PNG (its folder must exist)")
    parser.add_argument("--framework", choices=sorted(BACKENDS), default=defaults.framework,
                        help="framework to train with")
    parser.add_argument("--loss-weight", type=float, default=defaults.loss_weight,
                        help="constant the loss is multiplied by, to give gradients a large model's magnitude; "
                             "1 shows that a small model's gradients fit fp16")
    parser.add_argument("--growth-steps", type=int, default=defaults.growth_steps,
                        help="finite steps before the dynamic loss scale doubles (the library default is 2000)")
    parser.add_argument("--threads", type=int, default=defaults.threads,
                        help="intra-op threads for training (torch only)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the demo from the command line; returns the exit status (2 on bad options)."""
    parser = _parser()
    args = parser.parse_args(argv)
    config = DemoConfig(
        steps=args.steps, seed=args.seed, framework=args.framework, loss_weight=args.loss_weight,
        growth_steps=args.growth_steps, threads=args.threads,
    )
    try:
        config.validate()
        _check_output(args.output)
        check_installed(config.framework)
    except (ValueError, TypeError, ModuleNotFoundError) as error:
        parser.error(str(error))  # exits 2 with the usage line

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]lossscale demo[/]: digits, {config.steps} steps per run, fp32 vs fp16 vs fp16 + lossscale "
        f"({config.framework}, CPU)"
    )
    columns = (TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=args.no_progress) as bars:

        def progress(mode: str, total: int) -> Callable[[], None]:
            task = bars.add_task(mode, total=total)
            return lambda: bars.advance(task)

        result = run_demo(config, output=args.output, progress=progress)

    table = Table(title=f"After {config.steps} steps (seed {config.seed}, {result.seconds:.0f} s)")
    for i, name in enumerate(TABLE_HEADER):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    for row in result.table_rows():
        table.add_row(*row)
    console.print(table)
    console.print(
        "zero grads: share of weight-gradient values exactly zero. fp32's ~1% are the weights of pixels blank "
        "in every image; GELU has no dead units, so anything above that in fp16 underflowed below 2^-24."
    )
    console.print(f"Picture: [bold]{os.path.abspath(result.png_path or '')}[/]")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
