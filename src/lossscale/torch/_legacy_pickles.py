"""Pickles of lossscale 0.1 whose layout differs from today's, converted on load (then checked as a state dict is).

Their moved classes resolve through the alias modules ``_state`` and
``_gradscaler_scale``; ``Diagnostics`` converts its own. ``LossScaleOptimizer``
(0.1: the scale object beside the diagnostics' settings) and ``GradScaler``
(0.1: its ``__dict__``) are converted here.
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

