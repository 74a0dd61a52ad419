"""Where lossscale 0.1 defined ``IterationScale``: its pickled ``GradScaler`` names this module."""

from ._state import IterationScale

__all__ = ["IterationScale"]
