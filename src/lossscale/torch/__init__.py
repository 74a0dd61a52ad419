"""lossscale for PyTorch: ``LossScaleOptimizer`` wraps any ``torch.optim`` optimizer;
``GradScaler`` is a drop-in for ``torch.amp.GradScaler`` on the same scale and step code.

>>> import torch, lossscale.torch as lst
>>> opt = lst.LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1))
>>> float(opt.loss_scale), opt.dynamic_growth_steps
(32768.0, 2000)
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError("lossscale.torch needs PyTorch: pip install 'lossscale[torch]' (torch>=2.5).") from error

from .._errors import LossScaleError
from .._policy import (
    DynamicLossScale,
    ExponentialUpdateLossScaleManager,
    FixedLossScale,
    FixedLossScaleManager,
    LossScale,
)
from ._diagnostics import HostSyncCounter
from ._gradscaler import GradScaler
from ._optimizer import LossScaleOptimizer
from ._state import SharedLossScale

__all__ = ["DynamicLossScale", "ExponentialUpdateLossScaleManager", "FixedLossScale", "FixedLossScaleManager",
           "GradScaler", "HostSyncCounter", "LossScale", "LossScaleError", "LossScaleOptimizer", "SharedLossScale"]
