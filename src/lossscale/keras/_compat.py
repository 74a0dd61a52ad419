"""The private Keras APIs this binding uses, each with the public replacement it is waiting for.

Everything else in :mod:`lossscale.keras` uses Keras 3's public API only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["before_tf_restore", "no_automatic_dependency_tracking"]


def no_automatic_dependency_tracking(method: Callable[..., Any]) -> Callable[..., Any]:
    """Keras' ``tracking.no_automatic_dependency_tracking``, which its own ``LossScaleOptimizer.build`` uses.

    It keeps TensorFlow's checkpoint tracking from recording the variables
    twice (once as attributes, once through ``add_variable``). Public
    replacement: none yet (``keras.src.utils.tracking`` is private); without
    it, the decorator is the identity, which only costs duplicate checkpoint
    names under the TensorFlow backend.
    """
    try:
        from keras.src.utils import tracking
    except ImportError:  # pragma: no cover - a Keras that moved it
        return method
    return tracking.no_automatic_dependency_tracking(method)


def before_tf_restore(variable: Any, check: Callable[[Any], None]) -> bool:
    """Calls ``check(value)`` (a numpy value) before ``tf.train.Checkpoint`` restores ``variable``; False if it can't.

    TensorFlow restores a Keras variable through its private
    ``Trackable._restore_from_tensors(tensors)``; the hook is an instance
    attribute that runs ``check`` on ``tensors["VARIABLE_VALUE"]`` first, so a
    value that ``check`` refuses raises and is never assigned. Public
    replacement: none (TensorFlow offers no restore callback per variable).
    """
    restore = getattr(variable, "_restore_from_tensors", None)
    if restore is None:  # pragma: no cover - a Keras/TF that moved it
        return False

    def checked_restore(tensors: Any) -> Any:
        value = tensors.get("VARIABLE_VALUE") if hasattr(tensors, "get") else None
        if value is not None and hasattr(value, "numpy"):
            check(value.numpy())
        return restore(tensors)

    variable._restore_from_tensors = checked_restore
    return True
