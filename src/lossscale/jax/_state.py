"""Where lossscale 0.1 and 0.2 defined the optimizer state: pickles of it name this module."""

from ._optimizer import LossScaleOptimizerState, _StatsOptimizerState

__all__ = ["LossScaleOptimizerState", "_StatsOptimizerState"]
