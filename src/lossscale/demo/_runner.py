"""Runs the demo's comparisons: :func:`run_demo` (``config.modes`` at one K) and :func:`run_sweep` (them per K).

``config.modes`` is the three :data:`MODES`, plus the experimental ``"fp16+auto"`` when ``config.auto``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ._backends import backend
from ._config import SWEEP_FACTORS, DemoConfig
from ._data import DemoData, blob_psnr_db, load_data
from ._results import RESULTS_FILE, SWEEP_RESULTS_FILE, DemoResult, RunResult, SweepResult

__all__ = ["DEFAULT_OUTPUT", "run_demo", "run_sweep", "sweep_path"]

DEFAULT_OUTPUT = "lossscale_demo.png"
DEFAULT_SWEEP_OUTPUT = "lossscale_demo_sweep.png"

#: ``progress(label, total_steps)`` returns a callback called after every step, or None.
Progress = Callable[[str, int], Callable[[], None]]


def check_output(output: str | os.PathLike[str]) -> str:
    """``output`` as a str, after checking it is a .png path in an existing folder (ValueError naming the fix)."""
    path = os.fspath(output)
    if not path.lower().endswith(".png"):
        raise ValueError(f"output must be a .png path, e.g. {DEFAULT_OUTPUT}; got {path!r}.")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"output's folder {folder!r} does not exist; create it or choose another path.")
    return path


def sweep_path(output: str | os.PathLike[str]) -> str:
    """Where ``--sweep`` writes its figure: ``<output stem>_sweep.png``."""
    path = os.fspath(output)
    return path[: -len(".png")] + "_sweep.png"


def _beside(png: str, name: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(png)), name)


def _checked(config: DemoConfig | None) -> DemoConfig:
    config = DemoConfig() if config is None else config
    if not isinstance(config, DemoConfig):
        raise TypeError(f"config must be a DemoConfig; got {type(config).__name__}.")
    return config


def _write_outputs(result: DemoResult | SweepResult, png: str, plot: Callable, json_name: str) -> None:
    """Draws ``result`` to ``png`` and writes its JSON (``json_name``) beside it; records both paths on it."""
    plot(result, png)
    result.png_path = png
    result.json_path = _beside(png, json_name)
    result.write_json(result.json_path)


def _train(
    name: str, mode: str, k: int, data: DemoData, config: DemoConfig, progress: Progress | None, label: str
) -> RunResult:
    on_step = progress(label, config.steps) if progress is not None else None
    return backend(name).load().train(mode, k, data, config, on_step)


def run_demo(
    config: DemoConfig | None = None,
    *,
    output: str | os.PathLike[str] | None = DEFAULT_OUTPUT,
    progress: Progress | None = None,
) -> DemoResult:
    """Trains fp32, fp16 and fp16 + lossscale (and fp16 + auto when ``config.auto``) at
    ``config.global_batch_factor`` per framework; writes PNG and JSON.

    Args:
        config: the settings; :class:`DemoConfig`'s defaults if None.
        output: the PNG's path (``demo_results.json`` goes beside it), or None to write nothing.
        progress: optional ``progress(label, total_steps)`` returning a per-step callback.

    Returns:
        A :class:`DemoResult`.

    Raises:
        ValueError: on a bad output path; ModuleNotFoundError naming the
            install command for a missing framework (both before training).
    """
    config = _checked(config)
    png = None if output is None else check_output(output)
    for name in config.frameworks:
        backend(name).load()
    data = load_data(config.seed)
    k = config.global_batch_factor
    result = DemoResult(config, runs={}, truth=data.x_test[data.shown], blob_psnr_db=blob_psnr_db(data))
    for name in config.frameworks:
        result.runs[name] = {mode: _train(name, mode, k, data, config, progress, f"{name} {mode}") for mode in config.modes}
        if config.k1_reference and k != 1:
            result.k1_runs[name] = {
                "fp16": _train(name, "fp16", 1, data, config, progress, f"{name} fp16 K=1")
            }
    if png is not None:
        from .plot import plot_demo

        _write_outputs(result, png, plot_demo, RESULTS_FILE)
    return result


def run_sweep(
    config: DemoConfig | None = None,
    *,
    factors: tuple[int, ...] = SWEEP_FACTORS,
    output: str | os.PathLike[str] | None = DEFAULT_SWEEP_OUTPUT,
    progress: Progress | None = None,
) -> SweepResult:
    """Trains ``config.modes`` at every K in ``factors`` per framework; writes the sweep figure and its JSON.

    ``config.global_batch_factor`` and ``config.k1_reference`` are not used.
    ``output`` is the figure's path (``demo_sweep_results.json`` goes beside it), or None.
    """
    config = _checked(config)
    png = None if output is None else check_output(output)
    factors = tuple(factors)
    if not factors or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in factors):
        raise ValueError(f"factors must be positive ints, e.g. (1, 2, 4); got {factors!r}.")
    for name in config.frameworks:
        backend(name).load()
    data = load_data(config.seed)
    result = SweepResult(config, factors, runs={}, blob_psnr_db=blob_psnr_db(data))
    for name in config.frameworks:
        result.runs[name] = {mode: [] for mode in config.modes}
        for k in factors:
            for mode in config.modes:
                result.runs[name][mode].append(_train(name, mode, k, data, config, progress, f"{name} {mode} K={k}"))
    if png is not None:
        from .plot import plot_sweep

        _write_outputs(result, png, plot_sweep, SWEEP_RESULTS_FILE)
    return result
