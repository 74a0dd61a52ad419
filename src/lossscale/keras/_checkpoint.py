"""Loads of the Keras optimizer's scale (``.keras``, ``load_weights``, pickle, ``tf.train.Checkpoint``), checked by
the core's one load rule (:func:`lossscale._checkpoint.read_record`) before any variable is assigned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from .._checkpoint import FIELDS, check_scale, read_record
from .._rule import LossScaleState, initial_state
from ._compat import before_tf_restore
from ._state import STATE_NAMES, ScaleVariables

__all__ = ["check_store", "guard_restores", "keras3_store"]

#: Keras variable name -> LossScaleState field.
_FIELD = dict(zip(STATE_NAMES, FIELDS))


def _check(optimizer: Any, values: dict[str, Any], where: str) -> None:
    read_record({_FIELD[name]: value for name, value in values.items()}, optimizer.loss_scale_policy, where=where,
                required=())


def check_store(optimizer: Any, state: Sequence[Any], store: Any) -> None:
    """Checks the values of the scale variables ``state`` in a Keras weights ``store`` (``load_own_variables``).

    Args:
        optimizer: the optimizer loading.
        state: its five scale variables.
        store: Keras' weights store. One of the wrong length is left to Keras, which then loads nothing (and warns).

    Raises:
        ValueError: a value that is not a scalar, or that the policy refuses.
    """
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


def _integer_scalar(value: Any) -> bool:
    return value.shape == () and np.issubdtype(value.dtype, np.integer)


def _float_scalar(value: Any) -> bool:
    return value.shape == () and np.issubdtype(value.dtype, np.floating)


def keras3_store(optimizer: Any, state: ScaleVariables, store: Any) -> dict[str, Any] | None:
    """A weights ``store`` written by Keras 3's own ``LossScaleOptimizer``, as this optimizer's layout; else None.

    Keras 3's optimizer saves its base variables (``iteration``, ``learning_rate``), then ``step_counter`` (an int)
    and ``dynamic_scale`` (a float), then the inner optimizer's; ours saves the base ones, then the five scale
    variables (``dynamic_scale`` first), the ``stats_every`` ones, then the inner's. The store is taken as Keras 3's
    when its length is that layout's and those two have those kinds (a lossscale file of another length, even one
    with the same count, has a float where Keras 3 has ``step_counter``): the scale and the step counter carry
    over, the scale clamped into the policy's bounds (Keras 3's has no floor: it can fall below 1, or to 0; one not
    finite raises ``ValueError``), and the variables Keras 3 does not have take their initial values (the skip
    counters 0, the statistics empty).

    Args:
        optimizer: the optimizer loading (its variables' order is the store's).
        state: its scale variables (and ``stats_every``'s).
        store: Keras' weights store (``"0"``, ``"1"``, ... -> arrays).

    Returns:
        The store in this optimizer's layout, or None when ``store`` is not Keras 3's layout (or not built yet).

    Raises:
        ValueError: Keras 3's saved scale is not finite.

    Cost: one read of each saved value (host copies, as Keras' own load)."""
    if not optimizer.built:
        return None
    scale_variables, stats = state.variables, state.stats
    stats_variables = [] if stats is None else stats.variables
    ours = {id(v) for v in [*scale_variables, *stats_variables]}
    variables, inner = list(optimizer.variables), list(optimizer.inner_optimizer.variables)
    base = [v for v in variables[: len(variables) - len(inner)] if id(v) not in ours]  # the wrapper's own, first
    width = len(base) + 2 + len(inner)  # Keras 3's: base, step_counter, dynamic_scale, inner
    if set(store.keys()) != {str(i) for i in range(width)}:
        return None
    saved = [np.asarray(store[str(i)]) for i in range(width)]
    counter, scale = saved[len(base)], saved[len(base) + 1]
    if not (_integer_scalar(counter) and _float_scalar(scale)):
        return None
    if not np.isfinite(np.float32(scale.item())):
        raise ValueError(
            f"optimizer {optimizer.name!r}: the dynamic_scale that Keras 3's LossScaleOptimizer saved is "
            f"{scale.item()}: that scale overflowed (Keras 3 doubles it unchecked), and no step trains from it. Load "
            "an earlier file, or load this one with Keras 3's class, give it a finite scale "
            "(opt.dynamic_scale.assign(2.0**15)) and save it again."
        )
    where = f"optimizer {optimizer.name!r}: the dynamic_scale that Keras 3's LossScaleOptimizer saved"
    clamped = np.float32(check_scale(where, scale.item(), optimizer.loss_scale_policy, clamp=True))  # finite: clamps
    values: dict[int, Any] = {id(v): value for v, value in zip(base, saved)}
    values |= {id(v): value for v, value in zip(inner, saved[len(base) + 2:])}
    values |= {id(v): value for v, value in zip(scale_variables, initial_state(state.params, np))}
    fields = LossScaleState(*scale_variables)
    values |= {id(fields.loss_scale): clamped, id(fields.good_steps): counter.astype(np.int32)}
    values |= {id(v): value for v, value in zip(stats_variables, [] if stats is None else stats.initial)}
    return {str(i): values[id(v)] for i, v in enumerate(variables)}


def guard_restores(optimizer: Any, state: Sequence[Any]) -> None:
    """After the scale variables exist (TensorFlow backend): ``tf.train.Checkpoint`` restores of them are checked
    first; a restore deferred until ``build`` has assigned its values already: they are checked here.

    Args:
        optimizer: the optimizer being built.
        state: its five scale variables.

    Raises:
        ValueError: a deferred restore's values that the policy refuses.
    """
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
