"""A framework-free record of a loss scale's trajectory: scale, skip flag and loss per step, as numpy arrays.

>>> h = History()
>>> h.append(0, 32768.0, False, loss=2.3)
>>> h.extend([1, 2], [32768.0, 16384.0], [True, False])
>>> len(h), h.num_skipped, h.loss_scales.tolist()
(3, 1, [32768.0, 32768.0, 16384.0])
"""

from __future__ import annotations

import csv
import math
import os
from numbers import Integral
from typing import Any

import numpy as np

__all__ = ["STATS_COLUMNS", "History"]

_COLUMNS = ("step", "loss_scale", "skipped", "loss")
#: Gradient statistics a step may carry (``stats_every``): NaN on the steps without a sample.
STATS_COLUMNS = ("headroom_bits", "zero_fraction", "subnormal_fraction")


def _column(name: str, values: Any, dtype: Any) -> np.ndarray:
    try:
        array = np.asarray(values)
    except (TypeError, RuntimeError) as error:  # e.g. a CUDA tensor
        raise TypeError(
            f"{name} must be array-like on the host (a list, numpy array or CPU tensor); got "
            f"{type(values).__name__}. Move device tensors first, e.g. torch.stack(values).cpu()."
        ) from error
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one value per step); got shape {array.shape}.")
    if dtype is bool:
        if array.dtype != np.bool_ and (not np.issubdtype(array.dtype, np.number) or not np.isin(array, (0, 1)).all()):
            raise ValueError(f"skipped must hold booleans (or 0/1); got {array[:5].tolist()}...")
        return array.astype(np.bool_)
    if dtype is np.int64:
        if not np.issubdtype(array.dtype, np.integer):
            if not np.issubdtype(array.dtype, np.floating):
                raise ValueError(f"steps must be integers; got {array[:5].tolist()}...")
            bad = ~np.isfinite(array) | (np.abs(array) >= 2.0**63)
            if bad.any():  # inf would become INT64_MIN and fail later as a misleading ordering error
                raise ValueError(
                    f"steps must be finite integers; got {array[bad][:5].tolist()} at positions "
                    f"{np.flatnonzero(bad)[:5].tolist()}. Record the optimizer's step counter, not a float ratio."
                )
            if not np.all(array == np.round(array)):
                raise ValueError(f"steps must be integers; got {array[:5].tolist()}...")
        return array.astype(np.int64)
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise TypeError(f"{name} must be numbers; got dtype {array.dtype}.")
    return array.astype(np.float64)


class History:
    """Per-step loss scale, skip flag and (optionally) loss and gradient statistics, stored as numpy arrays.

    Steps must increase strictly across calls (a resumed run appends); a step without a loss stores NaN.
    Cost: :meth:`extend` copies its batch once; the arrays are concatenated lazily, O(1) amortised per batch."""

    def __init__(self) -> None:
        self._chunks: list[tuple[np.ndarray, ...]] = []
        self._cache: tuple[np.ndarray, ...] | None = None
        self._last_step: int | None = None

    def extend(self, steps: Any, loss_scales: Any, skipped: Any, losses: Any = None, stats: Any = None) -> None:
        """Records a batch of steps: array-likes of equal length (lists, numpy arrays or CPU tensors).

        Args:
            steps: integers, strictly increasing and after every step already recorded.
            loss_scales: the scale each step's loss was multiplied by.
            skipped: whether each step was skipped (its gradients held NaN/Inf).
            losses: optional unscaled losses.
            stats: optional mapping from some of :data:`STATS_COLUMNS` to values, NaN where not sampled.

        Raises ValueError on lengths that differ, steps that do not increase or skip flags that are not booleans,
        TypeError on values that are not numbers.
        """
        step_arr = _column("steps", steps, np.int64)
        scale_arr = _column("loss_scales", loss_scales, np.float64)
        skip_arr = _column("skipped", skipped, bool)
        loss_arr = np.full(step_arr.shape, np.nan) if losses is None else _column("losses", losses, np.float64)
        stat_arrs = _stat_columns(stats, step_arr.shape)
        lengths = {len(step_arr), len(scale_arr), len(skip_arr), len(loss_arr), *map(len, stat_arrs)}
        if len(lengths) != 1:
            raise ValueError(
                f"steps, loss_scales, skipped and losses must have one value per step; got lengths "
                f"{len(step_arr)}, {len(scale_arr)}, {len(skip_arr)}, {len(loss_arr)}."
            )
        if len(step_arr) == 0:
            return
        if np.any(np.diff(step_arr) <= 0) or (self._last_step is not None and step_arr[0] <= self._last_step):
            raise ValueError(
                f"steps must increase strictly (last recorded: {self._last_step}, got {step_arr[:5].tolist()}...); "
                "start a new History for a new run."
            )
        self._chunks.append((step_arr, scale_arr, skip_arr, loss_arr, *stat_arrs))
        self._cache = None
        self._last_step = int(step_arr[-1])

    def append(self, step: int, loss_scale: float, skipped: bool, loss: float | None = None, stats: Any = None) -> None:
        """Records one step; see :meth:`extend`, which is cheaper per step for long runs."""
        one = None if stats is None else {k: [v] for k, v in dict(stats).items() if k in STATS_COLUMNS}
        self.extend([step], [loss_scale], [skipped], None if loss is None else [loss], one)

    def truncate(self, before_step: int) -> None:
        """Drops every row at ``before_step`` or later (a run rolled back to a checkpoint: ``load_state_dict``)."""
        if isinstance(before_step, bool) or not isinstance(before_step, Integral):
            raise TypeError(f"before_step must be an int, got {before_step!r}.")
        steps = self.steps
        keep = int(np.searchsorted(steps, int(before_step), side="left"))
        if keep == len(steps):
            return
        columns = tuple(np.array(column[:keep]) for column in self._arrays())
        self._chunks = [columns] if keep else []  # type: ignore[list-item]
        self._cache = None
        self._last_step = int(columns[0][-1]) if keep else None

    def _arrays(self) -> tuple[np.ndarray, ...]:
        if self._cache is None:
            if self._chunks:
                self._cache = tuple(np.concatenate(column) for column in zip(*self._chunks))  # type: ignore[assignment]
                self._chunks = [self._cache]  # type: ignore[list-item]
            else:
                empty = np.zeros(0)
                columns = (empty.astype(np.int64), empty, empty.astype(np.bool_), empty)
                self._cache = columns + (empty,) * len(STATS_COLUMNS)
            for array in self._cache:  # type: ignore[union-attr]
                array.flags.writeable = False
        return self._cache  # type: ignore[return-value]

    @property
    def steps(self) -> np.ndarray:
        """int64 step numbers (read-only)."""
        return self._arrays()[0]

    @property
    def loss_scales(self) -> np.ndarray:
        """float64 loss scale of each step (read-only)."""
        return self._arrays()[1]

    @property
    def skipped(self) -> np.ndarray:
        """bool, True where the step was skipped (read-only)."""
        return self._arrays()[2]

    @property
    def losses(self) -> np.ndarray:
        """float64 loss of each step, NaN where none was recorded (read-only)."""
        return self._arrays()[3]

    def stat(self, name: str) -> np.ndarray:
        """float64 values of one of :data:`STATS_COLUMNS` per step, NaN where none was sampled (read-only)."""
        if name not in STATS_COLUMNS:
            raise ValueError(f"name must be one of {', '.join(STATS_COLUMNS)}; got {name!r}.")
        return self._arrays()[4 + STATS_COLUMNS.index(name)]

    @property
    def has_stats(self) -> bool:
        """Whether any step carries gradient statistics."""
        return any(bool(np.isfinite(self._arrays()[4 + i]).any()) for i in range(len(STATS_COLUMNS)))

    @property
    def num_skipped(self) -> int:
        """How many recorded steps were skipped."""
        return int(self.skipped.sum())

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        if not len(self):
            return "History(empty)"
        return (
            f"History({len(self)} steps {int(self.steps[0])}..{int(self.steps[-1])}, "
            f"{self.num_skipped} skipped, last scale {self.loss_scales[-1]:g})"
        )

    def to_csv(self, path: str | os.PathLike[str]) -> None:
        """Writes ``step,loss_scale,skipped,loss`` rows (skipped as 0/1, a missing value empty), then the
        :data:`STATS_COLUMNS` if any step has statistics, in ``repr`` precision (:meth:`from_csv` reads it back)."""
        steps, scales, skipped, losses, *stats = self._arrays()
        extra = self.has_stats
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(_COLUMNS + (STATS_COLUMNS if extra else ()))
            columns = zip(steps.tolist(), scales.tolist(), skipped.tolist(), losses.tolist(), *(c.tolist() for c in stats))
            for step, scale, skip, loss, *values in columns:
                row = [step, repr(scale), int(skip), _cell(loss)]
                writer.writerow(row + [_cell(v) for v in values] if extra else row)

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str]) -> History:
        """Reads a file written by :meth:`to_csv`; ValueError if its header is not ``step,loss_scale,skipped,loss``
        (optionally followed by the statistics columns)."""
        with open(path, newline="") as handle:
            rows = list(csv.reader(handle))
        if not rows or tuple(rows[0]) not in (_COLUMNS, _COLUMNS + STATS_COLUMNS):
            raise ValueError(f"{os.fspath(path)!r} is not a History CSV: its header must be {','.join(_COLUMNS)}.")
        history = cls()
        body = rows[1:]
        if body:
            stats = None
            if len(rows[0]) > len(_COLUMNS):
                stats = {name: [_number(r[4 + i]) for r in body] for i, name in enumerate(STATS_COLUMNS)}
            steps, scales = [int(r[0]) for r in body], [float(r[1]) for r in body]
            history.extend(steps, scales, [bool(int(r[2])) for r in body], [_number(r[3]) for r in body], stats)
        return history


def _cell(value: float) -> str:
    return "" if math.isnan(value) else repr(value)


def _number(cell: str) -> float:
    return float(cell) if cell else math.nan


def _stat_columns(stats: Any, shape: tuple[int, ...]) -> list[np.ndarray]:
    """The :data:`STATS_COLUMNS` of ``stats`` (a mapping, or None) as float64 arrays, NaN where absent."""
    if stats is None:
        return [np.full(shape, np.nan) for _ in STATS_COLUMNS]
    if not hasattr(stats, "items"):
        raise TypeError(f"stats must be a mapping of column name to values, got {type(stats).__name__}.")
    unknown = set(stats) - set(STATS_COLUMNS)
    if unknown:
        raise ValueError(f"stats has unknown columns {sorted(unknown)}; the columns are {', '.join(STATS_COLUMNS)}.")
    return [_column(k, stats[k], np.float64) if k in stats else np.full(shape, np.nan) for k in STATS_COLUMNS]
