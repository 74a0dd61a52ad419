"""The private Keras APIs this binding uses, each with the public replacement it is waiting for.

Everything else in :mod:`lossscale.keras` uses Keras 3's public API only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import keras

__all__ = [
    "HIDDEN_FROM_DIR",
    "before_tf_restore",
    "checkpoint_children",
    "checkpoint_node",
    "inner_aggregation_off",
    "no_automatic_dependency_tracking",
]


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


def checkpoint_node() -> Any:
    """A TensorFlow ``AutoTrackable`` to hang the scale variables on for ``tf.train.Checkpoint``, else None.

    Variables set on it as attributes after a restore started (restore before
    ``build``) receive their checkpointed values then (TF's deferred
    restoration). Public replacement: ``tf.Module`` would do, but also tracks
    itself by name; ``tf.__internal__.tracking.AutoTrackable`` is the bare one.
    """
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    return tf.__internal__.tracking.AutoTrackable()


def checkpoint_children(inner: Any, node: Any, save_type: str, **kwargs: Any) -> dict[str, Any]:
    """The wrapper's children in a ``tf.train.Checkpoint``: the inner optimizer's own, plus ``loss_scale``.

    So a checkpoint of the plain inner optimizer restores into the wrapper and
    the reverse (tf-keras's behaviour), before or after ``build``: the
    wrapper's graph is the inner's with one extra child. TensorFlow's private
    ``Trackable._trackable_children``; public replacement: none.
    """
    children = dict(inner._trackable_children(save_type, **kwargs))
    children["loss_scale"] = node
    return children


#: Names hidden from ``dir()``: TensorFlow's checkpoint writer (``checkpoint/util.py``) takes any object whose
#: ``dir()`` lists ``get_slot_names`` for a tf-keras optimizer and saves what ``get_slot`` returns a second time,
#: as slot variables; Keras 3 already saves these variables as the inner optimizer's, and TF refuses the
#: duplicate. Public replacement: none.
HIDDEN_FROM_DIR = ("get_slot_names",)
