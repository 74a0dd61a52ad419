"""lossscale: loss scaling for mixed-precision training, TF's design for every framework.

The root imports numpy only; :mod:`lossscale.torch`, ``.jax`` and ``.keras`` import their framework when imported."""

from ._auto import AutoLossScale
from ._errors import LossScaleError
from ._history import History
from ._policy import (
    DynamicLossScale,
    ExponentialUpdateLossScaleManager,
    FixedLossScale,
    FixedLossScaleManager,
    LossScale,
    RuleParams,
)
from ._report import underflow_report
from ._resolve import get, resolve_loss_scale, serialize
from ._rule import LossScaleState, initial_state, next_state

__version__ = "0.2.0"

__all__ = ["AutoLossScale", "DynamicLossScale", "ExponentialUpdateLossScaleManager", "FixedLossScale",
           "FixedLossScaleManager", "History", "LossScale", "LossScaleError", "LossScaleState", "RuleParams", "get",
           "initial_state", "next_state", "resolve_loss_scale", "serialize", "underflow_report"]
