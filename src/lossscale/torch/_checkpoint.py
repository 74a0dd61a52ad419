"""The checkpoint records: built and validated in one place, used by ``state_dict``, ``load_state_dict`` and pickle.

A ``LossScaleOptimizer.state_dict()`` is the inner optimizer's state dict
plus one ``"lossscale"`` entry::

    {"loss_scale": serialize(policy),            # ScaleRecord
     "state": {"loss_scale": f32, "good_steps": i32, "bad_steps": i32,
               "skipped_steps": i32, "consecutive_skips": i32},
     "optimizer": {"steps": int,                 # CounterRecord: this optimizer's own counters
                   "skipped_steps": i32 | None,
                   "consecutive_skips": i32 | None}}

Every reader goes through :meth:`ScaleRecord.from_dict`,
:meth:`CounterRecord.from_dict` or :meth:`Checkpoint.from_state_dict`,
which check *everything* and copy every tensor before anything is loaded:
a malformed entry raises ``ValueError`` and leaves the optimizer as it was.
Cost: a handful of 0-d tensor copies; no host sync for tensors already on
the CPU (a checkpoint read from disk).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import torch

from .._policy import LossScale, get, serialize
from .._rule import LossScaleState
from ._inner_load import load_inner
from ._validated import counter_tensor, refuse_extra, state_tensors

__all__ = ["Checkpoint", "CounterRecord", "ScaleRecord"]

_DTYPES = (torch.float32,) + (torch.int32,) * 4


def _not_a_state_dict(detail: str) -> ValueError:
    return ValueError(f"Not a lossscale state dict ({detail}); pass what state_dict() returned.")


def _zero_d(value: Any, dtype: torch.dtype, what: str) -> torch.Tensor:
    """``value`` as a new 0-d tensor of ``dtype`` (never the caller's tensor), on its own device."""
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise _not_a_state_dict(f"{what} is {value!r}") from None
    if tensor.numel() != 1 or tensor.is_complex() or tensor.dtype == torch.bool:
        raise _not_a_state_dict(f"{what} is {value!r}, not a number")
    if dtype != torch.float32 and tensor.is_floating_point():
        raise _not_a_state_dict(f"{what} is {value!r}, not an integer")
    return tensor.detach().reshape(()).to(dtype=dtype, copy=True)


@dataclass(frozen=True)
class ScaleRecord:
    """A loss scale's policy and state tensors (copies), validated."""

    policy: LossScale
    state: LossScaleState

    def to_dict(self) -> dict[str, Any]:
        return {
            "loss_scale": serialize(self.policy),
            "state": {name: t.detach().clone() for name, t in self.state._asdict().items()},
        }

    @classmethod
    def from_dict(cls, saved: Any) -> ScaleRecord:
        if not isinstance(saved, Mapping):
            raise _not_a_state_dict(f"the loss scale entry is a {type(saved).__name__}")
        if "loss_scale" not in saved or not isinstance(saved.get("state"), Mapping):
            raise _not_a_state_dict(f"missing 'loss_scale' or 'state' among {sorted(map(str, saved))}")
        try:
            policy = get(saved["loss_scale"])
        except (TypeError, ValueError) as error:
            raise _not_a_state_dict(f"its policy is unreadable: {error}") from error
        if policy is None:
            raise _not_a_state_dict("it holds no loss scale policy")
        refuse_extra(saved, ("loss_scale", "state", "optimizer"), "the 'lossscale' entry")
        return cls(policy, state_tensors(saved["state"], policy, "the 'lossscale' entry's state"))


@dataclass(frozen=True)
class CounterRecord:
    """One optimizer's own counters: ``step()`` calls that stepped or skipped, its skips, its skip streak.

    ``skipped_steps``/``consecutive_skips`` are None in checkpoints written
    before they were kept per optimizer; the loader then takes the scale's.
    """

    steps: int = 0
    skipped_steps: torch.Tensor | None = None
    consecutive_skips: torch.Tensor | None = None

    def to_dict(self) -> dict[str, Any]:
        copy = lambda t: None if t is None else t.detach().clone()
        return {
            "steps": self.steps,
            "skipped_steps": copy(self.skipped_steps),
            "consecutive_skips": copy(self.consecutive_skips),
        }

    @classmethod
    def from_dict(cls, saved: Any) -> CounterRecord:
        if saved is None:
            return cls()
        if not isinstance(saved, Mapping):
            raise _not_a_state_dict(f"the optimizer entry is a {type(saved).__name__}")
        steps = saved.get("steps", 0)
        if isinstance(steps, torch.Tensor) and steps.numel() == 1 and not steps.is_floating_point():
            steps = int(steps)
        if isinstance(steps, bool) or not isinstance(steps, Integral) or steps < 0:
            raise ValueError(f"Not a lossscale state dict: its step count is {steps!r}; pass what state_dict() returned.")
        refuse_extra(saved, ("steps", "skipped_steps", "consecutive_skips"), "the 'lossscale' entry's optimizer")
        counts = [
            None if saved.get(name) is None else counter_tensor(f"the 'lossscale' entry's optimizer[{name!r}]", saved[name])
            for name in ("skipped_steps", "consecutive_skips")
        ]
        return cls(int(steps), *counts)


@dataclass(frozen=True)
class Checkpoint:
    """A ``LossScaleOptimizer`` state dict, split and validated: the inner part and the lossscale records."""

    inner: dict[str, Any]
    scale: ScaleRecord | None
    counters: CounterRecord | None

    @classmethod
    def from_state_dict(cls, state_dict: Any) -> Checkpoint:
        """Splits and checks ``state_dict`` (not modified). A plain inner state dict has no lossscale records."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict() takes a dict, as state_dict() returns; got {type(state_dict).__name__}.")
        inner = dict(state_dict)
        saved = inner.pop("lossscale", None)
        if saved is None:
            return cls(inner, None, None)
        if not isinstance(saved, Mapping):
            raise _not_a_state_dict(f"its 'lossscale' entry is a {type(saved).__name__}")
        for key in ("state", "param_groups"):
            if key not in inner:
                raise _not_a_state_dict(f"the inner optimizer's {key!r} is missing")
        return cls(inner, ScaleRecord.from_dict(saved), CounterRecord.from_dict(saved.get("optimizer")))

    def to_state_dict(self) -> dict[str, Any]:
        state = dict(self.inner)
        if self.scale is not None:
            counters = self.counters or CounterRecord()
            state["lossscale"] = {**self.scale.to_dict(), "optimizer": counters.to_dict()}
        return state


class Checkpointing:
    """``state_dict``, ``load_state_dict`` and pickling of ``LossScaleOptimizer``, all through the records above.

    Relies on the wrapper's ``_inner`` (torch optimizer), ``_owner`` (scale
    owner: ``record()``, ``load_record()``, ``state``), ``_counters``
    (``record()``, ``load()``), ``_diagnostics``, ``_tracker``, ``_record``,
    and ``_restore(state)``, which rebuilds the wiring after unpickling.
    """

    _inner: Any
    _owner: Any
    _counters: Any
    _diagnostics: Any
    _tracker: Any
    _record: Any

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict plus a ``"lossscale"`` entry (see the module docstring).

        That entry holds the policy, the scale and its counters, and this
        optimizer's own counters (steps, skipped steps, skip streak).
        """
        inner = dict(self._inner.state_dict())
        return Checkpoint(inner, self._owner.record(), self._counters.record()).to_state_dict()

    def load_state_dict(self, state_dict: Any) -> None:
        """Restores :meth:`state_dict`'s output; the saved policy replaces the current one.

        Everything is validated before anything is loaded: a malformed
        ``"lossscale"`` entry raises ``ValueError`` and leaves the inner
        optimizer, the scale and the counters as they were. A plain
        inner-optimizer state dict restores the inner optimizer and keeps
        the current scale. A history recorded past the restored step is cut
        back to it.
        """
        checkpoint = Checkpoint.from_state_dict(state_dict)
        load_inner(self._inner, checkpoint.inner)
        if checkpoint.scale is not None:
            self._owner.load_record(checkpoint.scale)
            self._load_counters(checkpoint.counters or CounterRecord())
        self._tracker.reset()
        self._record.reset()

    def _load_counters(self, record: CounterRecord) -> None:
        self._counters.load(record, self._owner.state)
        recorder = self._diagnostics.recorder
        if recorder is not None:
            recorder.flush()
            recorder.history.truncate(record.steps)

    def __getstate__(self) -> dict[str, Any]:
        # Parameter names (keyed by tensor identity) and process groups do not survive pickling.
        diagnostics = self._diagnostics
        recorder = diagnostics.recorder
        if recorder is not None:
            recorder.flush()
        return {
            "inner": self._inner,
            "scale": self._owner,
            "max_consecutive_skips": None if diagnostics.guard is None else diagnostics.guard.limit,
            "overflow_report": diagnostics.reporter is not None,
            "history": None if recorder is None else recorder.history,
            "optimizer": self._counters.record().to_dict(),
            "check": self._check.mode,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._restore(state)
        self._load_counters(CounterRecord.from_dict(state.get("optimizer")))

    def _restore(self, state: dict[str, Any]) -> None:  # pragma: no cover - defined by the wrapper
        raise NotImplementedError
