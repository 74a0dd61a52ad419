"""Opt-in diagnostics of a step, each free when off: stall guard, overflow report, history; and HostSyncCounter.
Recording only: what is done with the numbers is the core's (:mod:`lossscale._diagnostics`: ``StallGuard``,
``HistoryRecorder``); this room decides how they reach the host from torch's devices."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .._diagnostics import HistoryRecorder, StallGuard, check_history
from .._history import STATS_COLUMNS, History
from ._compat import SCALAR_READ, TorchDispatchMode, sparse_values

if TYPE_CHECKING:
    from typing import Self

__all__ = ["Diagnostics", "HostSyncCounter", "OverflowReport", "OverflowReporter", "SkipGuard", "StepRecorder"]

logger = logging.getLogger("lossscale")


def _host_int(t: torch.Tensor) -> int:
    """A CPU tensor's value, read without the dispatcher (CPU tensors have no queue to sync)."""
    return int(t.detach().numpy())


_CAUSES = (
    "  * a model pretrained in bfloat16 and run in float16, whose activations overflow 65504: "
    "run it in bfloat16 with FixedLossScale(1), or keep the overflowing layers in float32;\n"
    "  * stale gradients: zero_grad() not called between steps, or gradients accumulated over skipped steps.\n"
)
_REPORT_CAUSE = "  * which gradients held Inf or NaN: last_overflow_report (logged at each skipped step);\n"


class SkipGuard:
    """The stall guard (the core's :class:`~lossscale._diagnostics.StallGuard`) fed from torch's devices: it reads
    the streak on CPU for free; on CUDA by a non-blocking copy into pinned memory read a step later (no sync, it
    raises one step late); elsewhere with one sync.

    Args:
        max_consecutive_skips: the limit, an int >= 1.
        overflow_report: whether the optimizer already reports overflows,
        named: and names their gradients: the error then points at the report instead of asking for options that
            are already set.

    Raises:
        TypeError, ValueError: ``max_consecutive_skips`` is not an int >= 1.
    """

    def __init__(self, max_consecutive_skips: int, overflow_report: bool = False, named: bool = False) -> None:
        # Only options not already set: with overflow_report on, the report already says which gradients overflowed.
        if not overflow_report:
            causes, see = _CAUSES, ("overflow_report=True (with named_parameters=model.named_parameters()) to see "
                                    "which gradients overflow, or ")
        elif not named:
            causes = _CAUSES + _REPORT_CAUSE
            see = "named_parameters=model.named_parameters() to name them in that report, or "
        else:
            causes, see = _CAUSES + _REPORT_CAUSE, ""
        self._guard = StallGuard(max_consecutive_skips, loss_check="torch.isfinite(loss)", causes=causes, see=see)
        self.limit = self._guard.limit
        self.overflow_report, self.named = overflow_report, named
        self._in_flight: tuple[torch.Tensor, Any] | None = None  # (pinned copy, CUDA event): never pickled

    def __getstate__(self) -> dict[str, Any]:
        return {"limit": self.limit, "overflow_report": self.overflow_report, "named": self.named}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["limit"], state.get("overflow_report", False), state.get("named", False))  # type: ignore[misc]

    def check(self, consecutive_skips: torch.Tensor, loss_scale: torch.Tensor) -> None:
        """Raises :class:`~lossscale.LossScaleError` once ``consecutive_skips`` reaches the limit (on CUDA, one
        step late); ``loss_scale`` is the scale after the step (in the message)."""
        device = consecutive_skips.device
        if device.type == "cpu":
            self._guard.check(_host_int(consecutive_skips), float(loss_scale.detach().numpy()))
            return
        values = torch.stack([consecutive_skips.double(), loss_scale.double()])
        if device.type != "cuda":  # no event to wait on: read it now (one sync)
            streak, scale = values.cpu().tolist()
            self._guard.check(int(streak), scale)
            return
        previous, self._in_flight = self._in_flight, None
        host = torch.empty(2, dtype=torch.float64, pin_memory=True)
        stream = torch.cuda.current_stream(device)
        with torch.cuda.stream(stream):
            host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
        self._in_flight = (host, event)
        if previous is not None:
            copied, done = previous
            done.synchronize()  # recorded a step ago: long finished
            streak, scale = copied.tolist()
            self._guard.check(int(streak), scale)


@dataclass
class OverflowReport:
    """Which gradients were non-finite on a skipped step: at ``step`` (``step()`` calls before), with the scale the
    gradients were computed with, ``(name, has_nan, has_inf)`` per gradient that held either."""

    step: int
    loss_scale: float
    nonfinite: list[tuple[str, bool, bool]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"step {self.step} skipped at loss scale {self.loss_scale:g}; non-finite gradients:"]
        for name, nan, inf in self.nonfinite:
            kinds = " and ".join(k for k, present in (("NaN", nan), ("Inf", inf)) if present)
            lines.append(f"  {name}: {kinds}")
        if not self.nonfinite:
            lines.append("  (none in this optimizer's gradients: another rank or optimizer overflowed)")
        return "\n".join(lines)


class OverflowReporter:
    """Builds and logs an :class:`OverflowReport` on a skipped step: one R pass and one sync for all the flags."""

    def __init__(self, named_parameters: Iterable[tuple[str, torch.Tensor]] | None) -> None:
        self._names: dict[int, str] = {}
        if named_parameters is not None:
            for name, param in named_parameters:
                if not isinstance(param, torch.Tensor):
                    raise TypeError("named_parameters must yield (name, tensor) pairs, e.g. model.named_parameters(); "
                                    f"got a {type(param).__name__} for {name!r}.")
                self._names[id(param)] = name
        self.last: OverflowReport | None = None

    def name_of(self, param: torch.Tensor, group: int, index: int) -> str:
        return self._names.get(id(param), f"param_groups[{group}]['params'][{index}] {tuple(param.shape)}")

    def observe(self, step: int, found_inf: torch.Tensor, skipped: bool | None, loss_scale: torch.Tensor,
                named_grads: Any) -> None:
        """Reports a skipped step (``skipped`` None: one sync reads it); ``named_grads``: pairs, or a callable."""
        if skipped is None:
            skipped = bool(found_inf.item())  # the report's sync on the fused path
        if not skipped:
            return
        named = list(named_grads() if callable(named_grads) else named_grads)
        flags = []
        for _, grad in named:
            values = sparse_values(grad) if grad.layout == torch.sparse_coo else grad
            flags.append(torch.stack([torch.isnan(values).any(), torch.isinf(values).any()]).to(loss_scale.device))
        stacked = torch.cat([torch.stack(flags).flatten().double() if flags else loss_scale.new_zeros(0).double(),
                             loss_scale.reshape(1).double()])
        host = stacked.tolist()  # the report's one host sync
        report = OverflowReport(step=step, loss_scale=host[-1])
        for i, (name, _) in enumerate(named):
            nan, inf = bool(host[2 * i]), bool(host[2 * i + 1])
            if nan or inf:
                report.nonfinite.append((name, nan, inf))
        self.last = report
        logger.warning("%s", report)


class StepRecorder:
    """Per-step scale, skip flag and loss, kept on the device as rows and moved to the History (through the core's
    :class:`~lossscale._diagnostics.HistoryRecorder`) every ``flush_every`` rows: one copy to the host per
    ``flush_every`` steps instead of a sync per step.

    Args:
        history: a :class:`lossscale.History` to append to, or True/None for a new one.
        flush_every: rows kept on the device before they are copied to the host (default 100).

    Raises:
        TypeError: ``history`` is not a History (or True/None).
        ValueError: ``flush_every`` is not a positive int.
    """

    def __init__(self, history: Any = None, flush_every: int = 100) -> None:
        if isinstance(flush_every, bool) or not isinstance(flush_every, int) or flush_every < 1:
            raise ValueError(f"flush_every must be a positive int, got {flush_every!r}.")
        checked = check_history(True if history is None else history)
        if checked is None:
            raise TypeError("history=False records nothing: build no StepRecorder.")
        self._host = HistoryRecorder(checked)
        self.flush_every = flush_every
        self._rows: list[torch.Tensor] = []
        self._steps: list[int] = []
        self._loss: torch.Tensor | None = None
        self._has_loss = False
        self._stats: torch.Tensor | None = None  # headroom_bits, zero_fraction, subnormal_fraction (stats_every)
        self._has_stats = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_host" not in state:  # 0.1 pickled its __dict__, the History under "history"
            self.__init__(state.get("history"), state.get("flush_every", 100))  # type: ignore[misc]
            return
        self.__dict__.update(state)

    @property
    def history(self) -> History:
        """The :class:`lossscale.History` appended to (rows still on the device are not in it until :meth:`flush`)."""
        return self._host.history

    def note_loss(self, loss: torch.Tensor) -> None:
        """Keeps ``loss`` (detached) for the next row."""
        self._loss = loss.detach()

    def note_stats(self, stats: torch.Tensor) -> None:
        """Keeps a sample's ``(headroom_bits, zero_fraction, subnormal_fraction)`` for the next row."""
        self._stats = stats.detach()

    def append(self, step: int, loss_scale: torch.Tensor, skipped: torch.Tensor) -> None:
        """Appends one step's row on the device (no sync): ``loss_scale`` (the scale the gradients were computed
        with), ``skipped`` (0-d bool) and the loss and statistics noted since the last row."""
        loss, stats, device = self._loss, self._stats, loss_scale.device
        self._loss = self._stats = None
        nan = lambda *shape: torch.full(shape, float("nan"), dtype=torch.float64, device=device)
        self._has_stats |= stats is not None
        has_loss = loss is not None and loss.numel() == 1
        self._has_loss |= has_loss
        stats = nan(3) if stats is None else stats.to(device=device, dtype=torch.float64)
        loss_value = loss.reshape(()).to(device, torch.float64) if has_loss else nan()  # type: ignore[union-attr]
        self._rows.append(torch.cat([torch.stack([loss_scale.double(), skipped.double(), loss_value]), stats]))
        self._steps.append(step)
        if len(self._rows) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Copies the rows to the host and appends them to the History (one copy; nothing when empty)."""
        if not self._rows:
            return
        rows = _Rows(torch.stack(self._rows).cpu().numpy())
        steps, self._steps, self._rows = self._steps, [], []
        stats = None
        if self._has_stats:
            stats = {name: rows.stats[:, i] for i, name in enumerate(STATS_COLUMNS)}
        self._host.extend(rows.loss_scale, rows.skipped.astype(bool), rows.loss if self._has_loss else None, stats,
                          steps=steps)


class _Rows:
    """The columns of :class:`StepRecorder`'s device rows, by name: ``loss_scale``, ``skipped``, ``loss``, then the
    three ``stats``."""

    def __init__(self, rows: Any) -> None:
        self.loss_scale, self.skipped, self.loss, self.stats = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3:]


class Diagnostics:
    """One optimizer's guard, reporter and recorder (None: off), run when its step finishes.

    Args:
        max_consecutive_skips: the stall guard's limit, or None (off).
        overflow_report: whether skipped steps are reported.
        named_parameters: ``(name, parameter)`` pairs naming the report's gradients, or None.
        history: ``history=`` as :func:`lossscale._diagnostics.check_history` takes it.

    Raises:
        TypeError, ValueError: a malformed argument, named.
    """

    def __init__(self, max_consecutive_skips: int | None, overflow_report: bool, named_parameters: Any, history: Any):
        if not isinstance(overflow_report, bool):
            raise TypeError(f"overflow_report must be True or False, got {overflow_report!r}.")
        if named_parameters is not None and not overflow_report:
            raise ValueError("named_parameters only names the gradients of the overflow report: pass "
                             "overflow_report=True too.")
        self.guard = None if max_consecutive_skips is None else SkipGuard(
            max_consecutive_skips, overflow_report, named_parameters is not None)
        self.reporter = OverflowReporter(named_parameters) if overflow_report else None
        checked = check_history(history)
        self.recorder = None if checked is None else StepRecorder(checked)
        self.wants_scale = self.reporter is not None or self.recorder is not None

    def __getstate__(self) -> dict[str, Any]:
        """The constructor's settings, no live object."""
        recorder = self.recorder
        if recorder is not None:
            recorder.flush()
        return {"max_consecutive_skips": None if self.guard is None else self.guard.limit,
                "overflow_report": self.reporter is not None, "history": None if recorder is None else recorder.history}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "max_consecutive_skips" not in state:  # a 0.1 pickle: its __dict__ (guard, reporter, recorder)
            guard, recorder = state.get("guard"), state.get("recorder")
            state = {"max_consecutive_skips": None if guard is None else guard.limit,
                     "overflow_report": state.get("reporter") is not None,
                     "history": None if recorder is None else recorder.history}
        self.__init__(state["max_consecutive_skips"], bool(state["overflow_report"]), None, state["history"])  # type: ignore[misc]

    def named_grads(self, param_groups: Any) -> list[tuple[str, torch.Tensor]]:
        """``(name, grad)`` of every parameter with a gradient, for the report (empty when off)."""
        reporter = self.reporter
        if reporter is None:
            return []
        return [(reporter.name_of(p, g, i), p.grad) for g, group in enumerate(param_groups)
                for i, p in enumerate(group["params"]) if p.grad is not None]


class HostSyncCounter(TorchDispatchMode):
    """Counts host syncs inside a ``with`` block, to check that a training loop is sync-free.

    With CUDA (``source == "cuda_sync_debug_mode"``) it counts what ``torch.cuda.set_sync_debug_mode("warn")``
    reports: every blocking CUDA call from any thread. Without (``source == "scalar_reads"``) it counts scalar
    reads (``.item()``, ``float(t)``, ``bool(t)``) on the entering thread; it cannot see reads on other threads,
    host copies (``.cpu()``, ``.tolist()``) or value-dependent shapes (boolean-mask indexing, ``nonzero``).

    >>> import torch
    >>> with HostSyncCounter() as syncs:
    ...     t = torch.ones(3)
    ...     _ = (t * 2).sum().item()
    >>> syncs.scalar_reads
    1
    """

    def __init__(self) -> None:
        super().__init__()
        self.scalar_reads = 0
        self.source = "cuda_sync_debug_mode" if torch.cuda.is_available() else "scalar_reads"
        self._syncs: list[Any] = []
        self._catcher: Any = None
        self._previous_mode: int | None = None

    @property
    def count(self) -> int:
        """Host syncs seen: torch's sync debug mode's count on CUDA, else :attr:`scalar_reads`."""
        return len(self._syncs) if self.source == "cuda_sync_debug_mode" else self.scalar_reads

    def __enter__(self) -> Self:
        if self.source == "cuda_sync_debug_mode":
            self._catcher = warnings.catch_warnings(record=True)
            self._syncs = self._catcher.__enter__()
            warnings.simplefilter("always")
            self._previous_mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self._catcher is not None:
            torch.cuda.set_sync_debug_mode(self._previous_mode)  # type: ignore[arg-type]
            self._catcher.__exit__(*exc)
            self._catcher = None
            self._syncs = [w for w in self._syncs if "synchroniz" in str(w.message)]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is SCALAR_READ:
            self.scalar_reads += 1
        return func(*args, **(kwargs or {}))
