"""Objects pickled by lossscale 0.1: what their pickles hold, turned into today's pickled state.

0.1's pickles name classes that have moved since (``lossscale.torch._state.ScaleState``,
``lossscale.torch._gradscaler_scale.IterationScale``): those modules remain as aliases of today's
classes, whose pickled state kept 0.1's layout. Two layouts changed, and are converted here when a
0.1 pickle is loaded:

- ``LossScaleOptimizer``: 0.1 kept the scale object and the diagnostics' settings side by side
  (``"scale"``, ``"max_consecutive_skips"``, ``"overflow_report"``, ``"history"``, ``"check"``);
  today the scale travels as its checkpoint record (validated on load) and the settings as one
  ``Diagnostics``.
- ``GradScaler``: 0.1 pickled its ``__dict__`` (``"_owner"``, ``"_recorder"``, ...); today a record
  of named fields.

Nothing else is read from a 0.1 pickle; what it holds goes through the same validation as a state dict.
"""

from __future__ import annotations

from typing import Any

from ._diagnostics import Diagnostics
from ._scale import SharedLossScale


def is_optimizer_0_1(state: dict[str, Any]) -> bool:
    """Whether ``state`` is a pickled 0.1 ``LossScaleOptimizer`` (its diagnostics' settings at the top level)."""
    return "overflow_report" in state and "diagnostics" not in state


def optimizer_from_0_1(state: dict[str, Any]) -> dict[str, Any]:
    """Today's pickled ``LossScaleOptimizer`` state from 0.1's (its ``check`` mode is dropped: one mode remains)."""
    owner = state["scale"]
    shared = owner if isinstance(owner, SharedLossScale) else None
    return {
        "inner": state["inner"],
        "shared": shared,
        "scale": None if shared is not None else owner.record().to_dict(policy_object=True),
        "optimizer": state["optimizer"],
        "diagnostics": Diagnostics(state.get("max_consecutive_skips"), bool(state.get("overflow_report", False)),
                                   None, state.get("history")),
        "sampler": None,
    }


def is_gradscaler_0_1(state: dict[str, Any]) -> bool:
    """Whether ``state`` is a pickled 0.1 ``GradScaler`` (its ``__dict__``)."""
    return "_owner" in state


def gradscaler_from_0_1(state: dict[str, Any]) -> dict[str, Any]:
    """Today's pickled ``GradScaler`` state from 0.1's ``__dict__``."""
    recorder = state.get("_recorder")
    history = None if recorder is None else recorder.history
    diagnostics = state["_diagnostics"]
    return {
        "device": state["_device"],
        "enabled": state["_enabled"],
        "placed": state["_placed"],
        "scale": state["_owner"],
        "diagnostics": diagnostics,
        "history": history,
        "sync_skips": state.get("sync_skips", False),
        "updates": state.get("_updates", 0),
        "sampler": None,
    }


def diagnostics_from_0_1(state: dict[str, Any]) -> dict[str, Any]:
    """Today's pickled ``Diagnostics`` settings from 0.1's ``__dict__`` (``guard``, ``reporter``, ``recorder``)."""
    guard, recorder = state.get("guard"), state.get("recorder")
    return {
        "max_consecutive_skips": None if guard is None else guard.limit,
        "overflow_report": state.get("reporter") is not None,
        "history": None if recorder is None else recorder.history,
    }
