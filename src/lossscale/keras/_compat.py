"""The private Keras APIs this binding uses, each with the public replacement it is waiting for.

Everything else in :mod:`lossscale.keras` uses Keras 3's public API only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["inner_aggregation_off", "no_automatic_dependency_tracking"]


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


@contextlib.contextmanager
def inner_aggregation_off(inner: Any) -> Iterator[None]:
    """Within the block, Keras' TensorFlow optimizer ``inner`` does not all-reduce the gradients it applies.

    Keras 3's ``TFOptimizer._all_reduce_sum_gradients`` (private) sums the
    gradients over the replicas inside every ``apply``; the loss-scale
    optimizer has already summed them (``experimental_aggregate_gradients=True``)
    or the user has (``False``), so a second sum would multiply them by the
    number of replicas. Public replacement: none (Keras 3's ``apply`` has no
    ``experimental_aggregate_gradients``). The instance attribute shadows the
    method for the block only (trace time under ``tf.function``).
    """
    object.__setattr__(inner, "_all_reduce_sum_gradients", list)
    try:
        yield
    finally:
        object.__delattr__(inner, "_all_reduce_sum_gradients")
