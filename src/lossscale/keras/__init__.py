"""lossscale for Keras 3: TF's ``tf.keras.mixed_precision.LossScaleOptimizer`` on the TF, JAX and torch backends.

The backend is Keras' (``KERAS_BACKEND``, chosen before the first ``import keras``); the optimizer subclasses Keras'.

>>> import keras, lossscale.keras as lsk
>>> opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1))
>>> float(opt.loss_scale), opt.dynamic_growth_steps, isinstance(opt, keras.optimizers.LossScaleOptimizer)
(32768.0, 2000, True)
"""

from __future__ import annotations

try:
    import keras as _keras
except ImportError as error:  # pragma: no cover - exercised only without keras
    raise ImportError(
        "lossscale.keras needs Keras 3 and one backend: pip install 'lossscale[keras]' plus tensorflow-cpu, "
        "jax or torch (set KERAS_BACKEND to pick one)."
    ) from error

if not _keras.__version__.startswith("3."):  # pragma: no cover - Keras 2 is tf-keras's
    raise ImportError(
        f"lossscale.keras needs Keras 3, found keras {_keras.__version__}: pip install 'lossscale[keras]'."
    )

from .. import (
    DynamicLossScale,
    ExponentialUpdateLossScaleManager,
    FixedLossScale,
    FixedLossScaleManager,
    History,
    LossScale,
    LossScaleError,
)
from ._optimizer import LossScaleOptimizer

__all__ = [
    "DynamicLossScale", "ExponentialUpdateLossScaleManager", "FixedLossScale", "FixedLossScaleManager", "History",
    "LossScale", "LossScaleError", "LossScaleOptimizer",
]
