"""Where lossscale 0.2 defined the scale classes: its pickles name this module (they now live in ``_state``)."""

from ._state import IterationScale, PrivateLossScale, ScaleState, SharedLossScale

__all__ = ["IterationScale", "PrivateLossScale", "ScaleState", "SharedLossScale"]
