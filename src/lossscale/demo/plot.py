"""Pictures and TensorBoard scalars: a :class:`~lossscale.History`'s plot, and the demo's figures.

These left the core :class:`~lossscale.History` (a framework-free record) so
that ``import lossscale`` stays numpy-only. matplotlib is imported inside each
function, without pyplot, so they work headless and leave pyplot's state alone.
(No doctest here: the module's doctests must pass where matplotlib is missing.)

Example::

    opt = lossscale.torch.LossScaleOptimizer(torch.optim.Adam(params), history=True)
    ...  # train
    lossscale.demo.plot_history(opt.history, path="scale.png")
    lossscale.demo.write_tensorboard(opt.history, SummaryWriter("runs/amp"))
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .._history import STATS_COLUMNS, History
from ._config import ALL_MODES, AUTO_MODE

if TYPE_CHECKING:
    from ._results import DemoResult, SweepResult

__all__ = ["plot_demo", "plot_history", "plot_sweep", "write_tensorboard"]

COLORS = {"fp32": "#4d4d4d", "fp16": "#d62728", "fp16+lossscale": "#1f77b4", AUTO_MODE: "#2ca02c"}
LABELS = {
    "fp32": "float32",
    "fp16": "float16, no loss scaling",
    "fp16+lossscale": "float16 + lossscale",
    AUTO_MODE: "float16 + lossscale auto (experimental)",
}
TITLES = {"torch": "PyTorch (CPU autocast float16)", "jax": "JAX / optax (float16 compute)"}


def _figure(figsize: tuple[float, float]) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - matplotlib is in the demo extra
        raise ImportError("Plotting needs matplotlib: pip install 'lossscale[demo]'.") from error
    return Figure(figsize=figsize, layout="constrained")


def _check_history(history: Any) -> History:
    if not isinstance(history, History):
        raise TypeError(f"history must be a lossscale.History; got {type(history).__name__}.")
    return history


def plot_history(history: History, ax: Any = None, path: str | os.PathLike[str] | None = None) -> Any:
    """Draws the loss scale per step on a log2 axis, with skipped steps marked by red crosses.

    Args:
        history: the record, e.g. ``LossScaleOptimizer(..., history=True).history``.
        ax: a matplotlib ``Axes`` to draw into; by default a new figure.
        path: if given, the figure is saved there (PNG, SVG, ... by suffix).

    Returns:
        The ``Axes``.
    """
    _check_history(history)
    if ax is None:
        ax = _figure((7, 3.5)).add_subplot()
    steps, scales, skipped = history.steps, history.loss_scales, history.skipped
    if len(steps):
        ax.step(steps, scales, where="post", color="#1f77b4", linewidth=2, label="loss scale")
        if skipped.any():
            ax.scatter(
                steps[skipped], scales[skipped], marker="x", color="#d62728", s=50, linewidths=2, zorder=3,
                label=f"skipped step ({int(skipped.sum())})",
            )
        ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="best", frameon=False)
    if path is not None:
        ax.figure.savefig(path, dpi=150)
    return ax


def write_tensorboard(history: History, writer: Any, prefix: str = "lossscale/") -> None:
    """Writes every step as scalars ``{prefix}loss_scale``, ``{prefix}skipped`` and ``{prefix}loss``, and
    the sampled steps' gradient statistics as ``{prefix}headroom_bits``, ``{prefix}zero_fraction`` and
    ``{prefix}subnormal_fraction``.

    Args:
        history: the record.
        writer: anything with ``add_scalar(tag, value, step)``, e.g.
            ``torch.utils.tensorboard.SummaryWriter`` or tensorboardX's.
        prefix: prepended to each tag.

    Steps without a loss get no loss scalar. Cost: one call per value.

    Raises:
        TypeError: if ``writer`` has no ``add_scalar`` method.
    """
    _check_history(history)
    add_scalar = getattr(writer, "add_scalar", None)
    if not callable(add_scalar):
        raise TypeError(
            "writer must have add_scalar(tag, value, step), like torch.utils.tensorboard.SummaryWriter; "
            f"got {type(writer).__name__}."
        )
    rows = zip(history.steps.tolist(), history.loss_scales.tolist(), history.skipped.tolist(), history.losses.tolist())
    for step, scale, skip, loss in rows:
        add_scalar(f"{prefix}loss_scale", scale, step)
        add_scalar(f"{prefix}skipped", float(skip), step)
        if not math.isnan(loss):
            add_scalar(f"{prefix}loss", loss, step)
    if history.has_stats:  # gradient statistics (stats_every): only the sampled steps
        for name in STATS_COLUMNS:
            for step, value in zip(history.steps.tolist(), history.stat(name).tolist()):
                if not math.isnan(value):
                    add_scalar(f"{prefix}{name}", value, step)


# ---------------------------------------------------------------- the demo's figures


def _mosaic(rows: list[np.ndarray], gap: int = 1) -> np.ndarray:
    """Tiles ``rows`` (each ``(n, 64)``) of 8x8 images into one array, NaN between tiles."""
    n = len(rows[0])
    out = np.full((len(rows) * (8 + gap) - gap, n * (8 + gap) - gap), np.nan)
    for r, images in enumerate(rows):
        for c, image in enumerate(images):
            out[r * 9 : r * 9 + 8, c * 9 : c * 9 + 8] = np.clip(image.reshape(8, 8), 0, 1)
    return out


def _modes(runs: dict[str, Any]) -> list[str]:
    """The modes present in ``runs``, in :data:`ALL_MODES`'s order (the auto run only when it was trained)."""
    return [mode for mode in ALL_MODES if mode in runs]


def _reconstructions(ax: Any, truth: np.ndarray, runs: dict[str, Any]) -> None:
    import matplotlib

    modes = _modes(runs)
    cmap = matplotlib.colormaps["gray_r"].with_extremes(bad="white")
    ax.imshow(_mosaic([truth] + [runs[m].reconstructions for m in modes]), cmap=cmap, vmin=0, vmax=1)
    labels = ["held-out digits"] + [f"{LABELS[m]}\n{runs[m].psnr_db:.1f} dB PSNR" for m in modes]
    ax.set_yticks([3.5 + 9 * i for i in range(len(labels))], labels, fontsize=11)
    for tick, color in zip(ax.get_yticklabels(), ["black"] + [COLORS[m] for m in modes]):
        tick.set_color(color)
        tick.set_fontweight("bold")
    ax.set_xticks([])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title("Reconstructions of held-out digits", fontsize=12, loc="left")


def _zero_bars(ax: Any, runs: dict[str, Any]) -> None:
    modes = _modes(runs)
    layers = len(runs["fp32"].zero_grad_shares)
    x = np.arange(1, layers + 1)
    width = 0.81 / len(modes)  # 0.27 with the default three modes
    for i, mode in enumerate(modes):
        shares = runs[mode].zero_grad_shares * 100
        ax.bar(x + (i - (len(modes) - 1) / 2) * width, shares, width, color=COLORS[mode], label=f"{LABELS[mode]} ({runs[mode].zero_grad_share:.0%} overall)")
    ax.set_xticks(x)
    ax.set_xlabel("layer (input → output)")
    ax.set_ylabel("% of weight gradients = 0")
    ax.set_ylim(0, 150)  # room for the legend above the bars
    ax.set_yticks(range(0, 101, 20))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper right", frameon=False, fontsize=10)
    ax.set_title("Gradients lost to float16 underflow", fontsize=12, loc="left")


def _zero_over_time(ax: Any, runs: dict[str, Any]) -> None:
    """The share of zero weight gradients along the run: per layer (thin) and overall (thick), per float16 mode."""
    for mode in [m for m in _modes(runs) if m != "fp32"]:
        run = runs[mode]
        by_layer = run.zero_grad_by_layer * 100
        ax.plot(run.zero_grad_steps, by_layer, color=COLORS[mode], linewidth=0.7, alpha=0.35)
        overall = by_layer @ run.layer_sizes / run.layer_sizes.sum()
        ax.plot(run.zero_grad_steps, overall, color=COLORS[mode], linewidth=2.2, label=LABELS[mode])
    ax.set_xlabel("step")
    ax.set_ylabel("% of weight gradients = 0")
    ax.set_ylim(-2, 102)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center right", frameon=False, fontsize=9)
    ax.set_title("Underflow along the run (thin: each layer)", fontsize=12, loc="left")


def _auto_scale(ax: Any, auto: Any) -> None:
    """Adds the auto run's loss scale (and its skipped steps) to the scale panel, in its own colour."""
    history = auto.history
    ax.step(history.steps, history.loss_scales, where="post", color=COLORS[AUTO_MODE], linewidth=2,
            label=f"auto (experimental), {auto.skipped_steps} skipped")
    ax.set_yscale("log", base=2)
    ax.legend(loc="lower right", frameon=False, fontsize=9)


def plot_demo(result: DemoResult, path: str | os.PathLike[str]) -> Any:
    """Draws the demo's picture into ``path``: per framework, reconstructions, zero-gradient bars, the zero share
    along the run (per layer and overall, from the library's gradient statistics), loss scale.

    Returns:
        The matplotlib ``Figure``.
    """
    if result.truth is None:
        raise ValueError("plot_demo() draws the held-out digits: pass a DemoResult with truth (run_demo's).")
    truth = result.truth
    frameworks = list(result.runs)
    fig = _figure((21, 1.0 + 4.4 * len(frameworks)))
    config = result.config
    k = config.global_batch_factor
    fig.suptitle(
        f"Digits autoencoder, {config.steps} Adam steps; each step's loss is one micro-batch of {config.batch_size} "
        f"out of a global batch of K = {k} (loss ÷ {k})",
        fontsize=14,
    )
    rows = fig.subfigures(len(frameworks), 1, squeeze=False)[:, 0]
    for row, framework in zip(rows, frameworks):
        runs = result.runs[framework]
        row.suptitle(TITLES.get(framework, framework), fontsize=13, fontweight="bold", x=0.01, ha="left")
        axes = row.subplots(1, 4, width_ratios=[2.3, 1.25, 1.25, 1.25])
        _reconstructions(axes[0], truth, runs)
        _zero_bars(axes[1], runs)
        _zero_over_time(axes[2], runs)
        scaled = runs["fp16+lossscale"]
        if scaled.history is not None:
            plot_history(scaled.history, ax=axes[3])
        auto = runs.get(AUTO_MODE)
        if auto is not None and auto.history is not None:  # the opt-in experimental policy's scale beside it
            _auto_scale(axes[3], auto)
        axes[3].set_title("lossscale's loss scale", fontsize=12, loc="left")
    fig.savefig(path, dpi=110)
    return fig


def plot_sweep(result: SweepResult, path: str | os.PathLike[str]) -> Any:
    """Draws held-out PSNR against K (log2 axis) for each mode run, one panel per framework, into ``path``."""
    frameworks = list(result.runs)
    fig = _figure((6.4 * len(frameworks) + 0.6, 5.2))
    axes = fig.subplots(1, len(frameworks), squeeze=False, sharey=True)[0]
    for ax, framework in zip(axes, frameworks):
        runs = result.runs[framework]
        for mode in _modes(runs):
            factors = [run.global_batch_factor for run in runs[mode]]
            values = [run.psnr_db for run in runs[mode]]
            ax.plot(
                factors, values, color=COLORS[mode], marker="o", linewidth=2.5 if mode == "fp32" else 2,
                linestyle="--" if mode in ("fp16+lossscale", AUTO_MODE) else "-", label=LABELS[mode], markersize=5,
            )
        if math.isfinite(result.blob_psnr_db):
            ax.axhline(result.blob_psnr_db, color="#999999", linestyle=":", linewidth=1.5)
            ax.annotate("the training mean image: a model that learned nothing", (1, result.blob_psnr_db),
                        xytext=(0, -12), textcoords="offset points", color="#777777", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K: micro-batches per global batch (each micro-batch's loss ÷ K)")
        ax.set_title(TITLES.get(framework, framework), fontsize=12, loc="left")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="center left", frameon=True, framealpha=0.9)
    axes[0].set_ylabel("held-out PSNR (dB, higher is better)")
    config = result.config
    fig.suptitle(
        "As the global batch grows, plain float16 falls off a cliff; lossscale stays on float32's line\n"
        f"digits autoencoder, {config.steps} Adam steps, micro-batches of {config.batch_size}, seed {config.seed}",
        fontsize=12,
    )
    fig.savefig(path, dpi=120)
    return fig
