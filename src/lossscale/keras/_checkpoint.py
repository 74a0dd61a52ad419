"""Loads of the Keras optimizer's scale, checked by the core's :func:`lossscale._checkpoint.read_record` first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from .._checkpoint import FIELDS, read_record
from ._compat import before_tf_restore
from ._step import STATE_NAMES

__all__ = ["check_store", "guard_restores"]

#: Keras variable name -> LossScaleState field.
_FIELD = dict(zip(STATE_NAMES, FIELDS))


def _check(optimizer: Any, values: dict[str, Any], where: str) -> None:
    read_record({_FIELD[name]: value for name, value in values.items()}, optimizer.loss_scale_policy, where=where,
                required=())


def check_store(optimizer: Any, state: Sequence[Any], store: Any) -> None:
    """Checks the scale variables' values in a Keras weights ``store`` (one of the wrong length: Keras warns)."""
    variables = list(optimizer.variables)
    if not optimizer.built or len(store.keys()) != len(variables):
        return
    index = {id(v): i for i, v in enumerate(variables)}
    values = {name: np.asarray(store[str(index[id(v)])]) for name, v in zip(STATE_NAMES, state)}
    for name, value in values.items():
        if value.shape != ():
            raise ValueError(
                f"the saved optimizer variable {name!r} ({_FIELD[name]}) has shape {value.shape}, not (): not a file "
                "this optimizer saved. Load a file written by model.save()/save_weights()."
            )
    _check(optimizer, values, f"optimizer {optimizer.name!r}: its saved variables")


def guard_restores(optimizer: Any, state: Sequence[Any]) -> None:
    """On TensorFlow: checks tf.train.Checkpoint restores of ``state`` first, and a deferred restore's values now."""
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf

    where = f"optimizer {optimizer.name!r}: its restored variables"
    for name, variable in zip(STATE_NAMES, state):
        def check(value: Any, name: str = name) -> None:
            _check(optimizer, {name: value}, where)

        before_tf_restore(variable, check)
    if tf.executing_eagerly():  # a deferred restore ran when the variables were hung on the checkpoint node
        values = {name: variable.numpy() for name, variable in zip(STATE_NAMES, state)}
        _check(optimizer, values, f"optimizer {optimizer.name!r}: its variables after a deferred restore")
