"""Where lossscale 0.1 defined ``IterationScale``: its pickled ``GradScaler`` names this module (see
``_legacy_pickles.py``)."""

from ._scale import IterationScale

__all__ = ["IterationScale"]
