"""tf-keras's TensorFlow-era methods over Keras 3: ``minimize``, ``get_gradients`` and the slot accessors.

Each function takes the loss-scale optimizer (or its inner optimizer) and
uses only its public methods.

Slots. tf-keras kept per-variable "slots" (Adam's ``m``/``v``); Keras 3
keeps the same tensors as optimizer variables named
``{variable.path with "/" as "_"}_{prefix}``, with its own prefixes
(Adam's ``momentum``/``velocity``). :func:`get_slot` takes either name; the
table below maps tf-keras's names onto Keras 3's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

__all__ = ["TFMethods", "add_slot", "get_gradients", "get_slot", "get_slot_names", "minimize"]

# tf-keras slot name -> Keras 3 variable prefix, per optimizer class (tf-keras's names where they differ).
_TF_KERAS_SLOTS = {
    "Adam": {"m": "momentum", "v": "velocity", "vhat": "velocity_hat"},
    "AdamW": {"m": "momentum", "v": "velocity", "vhat": "velocity_hat"},
    "Nadam": {"m": "momentum", "v": "velocity"},
    "Lamb": {"m": "momentum", "v": "velocity"},
    "Adamax": {"m": "momentum", "v": "norm"},
    "RMSprop": {"rms": "velocity", "mg": "average_gradient"},
    "Adadelta": {"accum_grad": "accumulated_grad", "accum_var": "accumulated_delta_var"},
}


def _backend() -> str:
    return keras.backend.backend()


def minimize(opt: Any, loss: Any, var_list: Sequence[Any], tape: Any = None) -> Any:
    """TF's ``minimize`` (TensorFlow backend): scale, differentiate, unscale, apply; returns ``iterations``."""
    if _backend() != "tensorflow":
        raise NotImplementedError(
            f"minimize() needs tf.GradientTape (TensorFlow backend); on {_backend()} compute the gradients of "
            "get_scaled_loss(loss) and call apply(grads, variables)."
        )
    import tensorflow as tf

    variables = list(var_list)
    tape = tape if tape is not None else tf.GradientTape()
    with tape:
        if callable(loss):
            loss = loss()
        scaled = opt.get_scaled_loss(loss)
    grads = tape.gradient(scaled, variables)
    return opt.apply_gradients(zip(opt.get_unscaled_gradients(grads), variables))


_OTHER_WAY = {
    "jax": "differentiate get_scaled_loss(loss) with jax.grad (or let model.fit do it) and pass the gradients to "
    "apply(grads, variables), which unscales them",
    "torch": "call get_scaled_loss(loss).backward() and pass [v.value.grad for v in variables] to "
    "apply(grads, variables), which unscales them",
}


def get_gradients(opt: Any, loss: Any, params: Sequence[Any]) -> list[Any]:
    """TF's ``get_gradients``: gradients of ``loss`` (a tensor or a callable) w.r.t. ``params``, unscaled.

    TensorFlow backend, in graph mode (inside ``tf.function``), as tf-keras's:
    ``tf.gradients`` of ``get_scaled_loss(loss)``, then
    ``get_unscaled_gradients``. Cost: one backward pass, one multiply per
    gradient element.
    """
    if _backend() != "tensorflow":
        raise NotImplementedError(
            f"get_gradients() is the TensorFlow backend's; on {_backend()}, {_OTHER_WAY[_backend()]}."
        )
    import tensorflow as tf

    if tf.executing_eagerly():
        raise RuntimeError(
            "get_gradients() uses tf.gradients, which works inside a tf.function only (as in tf-keras). In eager "
            "code use minimize(loss, var_list), or tf.GradientTape on get_scaled_loss(loss) and "
            "get_unscaled_gradients(grads)."
        )
    variables = [v.value if isinstance(v, keras.Variable) else v for v in params]
    scaled = opt.get_scaled_loss(loss() if callable(loss) else loss)
    return opt.get_unscaled_gradients(tf.gradients(scaled, variables))


def _prefix(variable: Any) -> str:
    path = getattr(variable, "path", None) or str(variable.name).replace(":", "_")
    return f"{path.replace('/', '_')}_"


def _slots_of(inner: Any, variable: Any) -> dict[str, Any]:
    prefix = _prefix(variable)
    return {v.name[len(prefix) :]: v for v in inner.variables if v.name.startswith(prefix)}


def get_slot_names(inner: Any, trainable_variables: Sequence[Any]) -> list[str]:
    """The Keras 3 names of the inner optimizer's per-variable state (Adam: ``["momentum", "velocity"]``)."""
    names: list[str] = []
    for variable in trainable_variables:
        for name in _slots_of(inner, variable):
            if name not in names:
                names.append(name)
    return names


def get_slot(inner: Any, variable: Any, slot_name: str) -> Any:
    """The inner optimizer's ``slot_name`` variable for ``variable`` (Keras 3's name, or tf-keras's)."""
    slots = _slots_of(inner, variable)
    name = _TF_KERAS_SLOTS.get(type(inner).__name__, {}).get(slot_name, slot_name)
    if name in slots:
        return slots[name]
    if not inner.built:
        raise ValueError("The optimizer has no slots yet: call optimizer.build(variables) before get_slot().")
    raise KeyError(
        f"No slot {slot_name!r} for variable {getattr(variable, 'path', variable)!r} in {type(inner).__name__}; "
        f"its slots are {sorted(slots)} (see get_slot_names()). Keras 3 keeps no slot for some tf-keras ones: "
        "read optimizer.variables instead."
    )


def add_slot(inner: Any, variable: Any, slot_name: str, initializer: Any = "zeros") -> Any:
    """The ``slot_name`` variable for ``variable``: the existing one, or a new one shaped like ``variable``.

    A new slot is Keras 3's ``inner.add_variable_from_reference(variable,
    slot_name, initializer)``: saved with the optimizer, not used by its
    update rule.
    """
    existing = _slots_of(inner, variable)
    name = _TF_KERAS_SLOTS.get(type(inner).__name__, {}).get(slot_name, slot_name)
    if name in existing:
        return existing[name]
    return inner.add_variable_from_reference(variable, name, initializer=initializer)


class TFMethods:
    """tf-keras's TensorFlow-era methods on the loss-scale optimizer; the functions above do the work.

    The host class provides ``inner_optimizer`` and Keras' own ``_trainable_variables`` (set by ``build``).
    """

    inner_optimizer: Any
    _trainable_variables: Any

    def minimize(self, loss: Any, var_list: Sequence[Any], tape: Any = None) -> Any:
        """TF's ``minimize`` (TensorFlow backend): scale, differentiate, unscale, apply."""
        return minimize(self, loss, var_list, tape)

    def get_gradients(self, loss: Any, params: Sequence[Any]) -> list[Any]:
        """TF's ``get_gradients``: unscaled gradients of the scaled loss (TensorFlow, in a tf.function)."""
        return get_gradients(self, loss, params)

    def get_slot_names(self) -> list[str]:
        """The inner optimizer's per-variable state names (Keras 3's: Adam's ``momentum``, ``velocity``)."""
        return get_slot_names(self.inner_optimizer, self._trainable_variables)

    def get_slot(self, var: Any, slot_name: str) -> Any:
        """The inner optimizer's ``slot_name`` variable for ``var`` (Keras 3's or tf-keras's name: ``"m"``)."""
        return get_slot(self.inner_optimizer, var, slot_name)

    def add_slot(self, var: Any, slot_name: str, initializer: Any = "zeros") -> Any:
        """The inner optimizer's ``slot_name`` variable for ``var``, created if new."""
        return add_slot(self.inner_optimizer, var, slot_name, initializer)
