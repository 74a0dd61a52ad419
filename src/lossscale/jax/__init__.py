"""lossscale for JAX: ``loss_scale_optimizer`` wraps any optax transformation (docs/jax.md)."""

from __future__ import annotations

try:
    import jax as _jax  # noqa: F401
    import optax as _optax  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without jax
    raise ImportError(
        f"lossscale.jax needs JAX and optax ({error.name} is missing): pip install 'lossscale[jax]'."
    ) from error

from .._errors import LossScaleError
from .._policy import (
    DynamicLossScale,
    ExponentialUpdateLossScaleManager,
    FixedLossScale,
    FixedLossScaleManager,
    LossScale,
)
from .._rule import LossScaleState
from ._checkpoint import check_state
from ._grads import all_finite
from ._optimizer import (
    LossScaleOptimizerState,
    apply_gradients,
    find_state,
    get_scaled_loss,
    get_unscaled_gradients,
    loss_scale_optimizer,
    value_and_grad,
)
from ._stats import tensor_names

__all__ = [
    "DynamicLossScale", "ExponentialUpdateLossScaleManager", "FixedLossScale", "FixedLossScaleManager", "LossScale",
    "LossScaleError", "LossScaleOptimizerState", "LossScaleState", "all_finite", "apply_gradients", "check_state",
    "find_state", "get_scaled_loss", "get_unscaled_gradients", "loss_scale_optimizer", "tensor_names",
    "value_and_grad",
]
