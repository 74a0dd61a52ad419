"""Where lossscale 0.1 defined ``ScaleState``: its pickles name this module (see ``_legacy_pickles.py``)."""

from ._scale import ScaleState

__all__ = ["ScaleState"]
