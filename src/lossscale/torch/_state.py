"""Where lossscale 0.1 defined ``ScaleState``: its pickles name this module."""

from ._scale import ScaleState

__all__ = ["ScaleState"]
