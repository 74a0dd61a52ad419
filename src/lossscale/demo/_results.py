"""What the demo measured: one :class:`RunResult` per run, a :class:`DemoResult` per command, and their JSON."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._history import History
from ._config import ALL_MODES, DemoConfig

__all__ = ["METRIC", "RESULTS_FILE", "SWEEP_RESULTS_FILE", "DemoResult", "RunResult", "SweepResult"]

#: The headline metric's name in ``demo_results.json``.
METRIC = "psnr_db"
#: Written next to the demo's PNG.
RESULTS_FILE = "demo_results.json"
#: Written next to the sweep's PNG.
SWEEP_RESULTS_FILE = "demo_sweep_results.json"


@dataclass
class RunResult:
    """One training run's numbers.

    Attributes:
        framework: ``"torch"`` or ``"jax"``.
        mode: one of :data:`~lossscale.demo.ALL_MODES`.
        global_batch_factor: K, the loss's divisor.
        psnr_db: held-out reconstruction PSNR at the end, in dB (float32 evaluation).
        losses: every step's micro-batch mean squared error (times K, i.e. unweighted).
        zero_grad_steps: the steps where zero gradients were measured.
        zero_grad_by_layer: ``(len(zero_grad_steps), layers)``: the share of
            each layer's weight-gradient values that are exactly zero there.
        layer_sizes: the number of weight values of each layer.
        reconstructions: ``(10, 64)`` reconstructions of the shown held-out digits.
        skipped_steps: steps the loss-scale optimizer skipped (0 without one).
        final_scale: the loss scale at the end, or None without loss scaling.
        history: the loss scale's :class:`~lossscale.History`, or None without loss scaling.
        seconds: wall time of the run (training and evaluation).
    """

    framework: str
    mode: str
    global_batch_factor: int
    psnr_db: float
    losses: np.ndarray
    zero_grad_steps: np.ndarray
    zero_grad_by_layer: np.ndarray
    layer_sizes: np.ndarray
    reconstructions: np.ndarray
    skipped_steps: int = 0
    final_scale: float | None = None
    history: History | None = None
    seconds: float = 0.0

    @property
    def zero_grad_shares(self) -> np.ndarray:
        """Per layer, the share of weight-gradient values exactly zero, averaged over the measured steps."""
        return self.zero_grad_by_layer.mean(axis=0)

    @property
    def zero_grad_share(self) -> float:
        """The share of all weight-gradient values exactly zero (layers weighted by size), averaged over steps."""
        return float(np.average(self.zero_grad_shares, weights=self.layer_sizes))


@dataclass
class DemoResult:
    """Everything one ``python -m lossscale demo`` measured, and where its files went.

    Attributes:
        config: the settings.
        runs: ``runs[framework][mode]``, the runs of ``config.modes`` at ``config.global_batch_factor``.
        k1_runs: ``k1_runs[framework]["fp16"]``, plain fp16 at K = 1 (empty when
            ``config.k1_reference`` is False or K is 1). fp32 needs no K = 1 run:
            Adam with ``eps`` scaled alike makes its result independent of K
            (the sweep shows it).
        truth: ``(10, 64)`` the shown held-out digits.
        blob_psnr_db: the PSNR of the training mean image, a model that learned nothing.
        png_path, json_path: where the picture and ``demo_results.json`` went, or None.
    """

    config: DemoConfig
    runs: dict[str, dict[str, RunResult]]
    k1_runs: dict[str, dict[str, RunResult]] = field(default_factory=dict)
    truth: np.ndarray | None = None
    blob_psnr_db: float = math.nan
    png_path: str | None = None
    json_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``demo_results.json`` document: backend -> mode -> numbers (see docs/demo.md for the schema)."""
        settings = _settings(self.config)
        document: dict[str, Any] = {}
        for framework, runs in self.runs.items():
            document[framework] = {}
            for mode, run in runs.items():
                entry = _run_entry(run, settings)
                k1 = self.k1_runs.get(framework, {}).get(mode)
                if k1 is not None:
                    entry["k1_reference"] = _run_entry(k1, {**settings, "global_batch_factor": 1})
                document[framework][mode] = entry
        return document

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`to_json` to ``path`` (indented, finite numbers only)."""
        _write(self.to_json(), path)


@dataclass
class SweepResult:
    """``--sweep``: ``runs[framework][mode]`` is one :class:`RunResult` per K of ``factors``."""

    config: DemoConfig
    factors: tuple[int, ...]
    runs: dict[str, dict[str, list[RunResult]]]
    blob_psnr_db: float = math.nan
    png_path: str | None = None
    json_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        """backend -> mode -> {"metric", "global_batch_factors", "values", "zero_grad_share", "skipped_steps"}."""
        document: dict[str, Any] = {}
        for framework, runs in self.runs.items():
            document[framework] = {
                mode: {
                    "metric": METRIC,
                    "global_batch_factors": [run.global_batch_factor for run in mode_runs],
                    "values": [_number(run.psnr_db) for run in mode_runs],
                    "zero_grad_share": [_number(run.zero_grad_share) for run in mode_runs],
                    "skipped_steps": [run.skipped_steps for run in mode_runs],
                    "settings": {**_settings(self.config), "global_batch_factor": None},
                }
                for mode, mode_runs in runs.items()
            }
        return document

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`to_json` to ``path``."""
        _write(self.to_json(), path)


def _settings(config: DemoConfig) -> dict[str, Any]:
    return {
        "global_batch_factor": config.global_batch_factor,
        "steps": config.steps,
        "seed": config.seed,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "widths": list(config.widths),
        "growth_steps": config.growth_steps,
    }


def _run_entry(run: RunResult, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "metric": METRIC,
        "value": _number(run.psnr_db),
        "zero_grad_shares": [_number(share) for share in run.zero_grad_shares],
        "skipped_steps": int(run.skipped_steps),
        "final_loss_scale": None if run.final_scale is None else _number(run.final_scale),
        "wall_seconds": round(run.seconds, 3),
        "settings": dict(settings),
    }


def _number(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _write(document: dict[str, Any], path: str | os.PathLike[str]) -> None:
    with open(path, "w") as handle:
        json.dump(document, handle, indent=2, allow_nan=False)
        handle.write("\n")


def check_modes(mode: str) -> None:
    """Raises ValueError unless ``mode`` is one of :data:`ALL_MODES` (the three :data:`MODES` and ``"fp16+auto"``)."""
    if mode not in ALL_MODES:
        raise ValueError(f"mode must be one of {', '.join(ALL_MODES)}; got {mode!r}.")
