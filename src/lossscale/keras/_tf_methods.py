"""tf-keras's TensorFlow-era methods over Keras 3: ``minimize``, ``get_gradients`` and the slot accessors (a slot is
the inner's variable ``{variable.path with "/" as "_"}_{prefix}``; Adam's ``momentum``, or tf-keras's ``m``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

__all__ = ["TFMethods"]

# tf-keras slot name -> Keras 3 variable prefix, per optimizer class, where they differ.
_TF_KERAS_SLOTS = {
    "Adam": {"m": "momentum", "v": "velocity", "vhat": "velocity_hat"},
    "AdamW": {"m": "momentum", "v": "velocity", "vhat": "velocity_hat"},
    "Nadam": {"m": "momentum", "v": "velocity"},
    "Lamb": {"m": "momentum", "v": "velocity"},
    "Adamax": {"m": "momentum", "v": "norm"},
    "RMSprop": {"rms": "velocity", "mg": "average_gradient"},
    "Adadelta": {"accum_grad": "accumulated_grad", "accum_var": "accumulated_delta_var"},
}


def _tensorflow_only(method: str, needs: str) -> None:
    if (backend := keras.backend.backend()) != "tensorflow":
        raise NotImplementedError(
            f"{method}() needs {needs} (TensorFlow backend); on {backend} compute the gradients of "
            "get_scaled_loss(loss) and call apply(grads, variables), which unscales them."
        )


def _slots_of(inner: Any, variable: Any) -> dict[str, Any]:
    path = getattr(variable, "path", None) or str(variable.name).replace(":", "_")
    prefix = f"{path.replace('/', '_')}_"
    return {v.name[len(prefix) :]: v for v in inner.variables if v.name.startswith(prefix)}


def _slot_name(inner: Any, slot_name: str) -> str:
    return _TF_KERAS_SLOTS.get(type(inner).__name__, {}).get(slot_name, slot_name)


class TFMethods:
    """tf-keras's methods on the loss-scale optimizer, which provides the attributes below."""

    inner_optimizer: Any
    _trainable_variables: Any
    get_scaled_loss: Any
    get_unscaled_gradients: Any
    apply_gradients: Any

    def minimize(self, loss: Any, var_list: Any, tape: Any = None) -> Any:
        """TF's ``minimize`` (TensorFlow backend): scale, differentiate, unscale, apply; returns ``iterations``.
        ``var_list``: a variable, a list or tuple of them, or a callable returning one (called after ``loss``)."""
        _tensorflow_only("minimize", "tf.GradientTape")
        import tensorflow as tf

        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            scaled = self.get_scaled_loss(loss() if callable(loss) else loss)
        variables = tf.nest.flatten(var_list() if callable(var_list) else var_list)
        grads = tape.gradient(scaled, variables)
        return self.apply_gradients(zip(self.get_unscaled_gradients(grads), variables))

    def get_gradients(self, loss: Any, params: Sequence[Any]) -> list[Any]:
        """TF's ``get_gradients``: ``tf.gradients`` of ``get_scaled_loss(loss)``, unscaled (TensorFlow backend,
        inside a ``tf.function``). Cost: one backward pass, one multiply per gradient element."""
        _tensorflow_only("get_gradients", "tf.gradients")
        import tensorflow as tf

        if tf.executing_eagerly():
            raise RuntimeError(
                "get_gradients() uses tf.gradients, which works inside a tf.function only (as in tf-keras). In eager "
                "code use minimize(loss, var_list), or tf.GradientTape on get_scaled_loss(loss) and "
                "get_unscaled_gradients(grads)."
            )
        variables = [v.value if isinstance(v, keras.Variable) else v for v in params]
        scaled = self.get_scaled_loss(loss() if callable(loss) else loss)
        return self.get_unscaled_gradients(tf.gradients(scaled, variables))

    def get_slot_names(self) -> list[str]:
        """The inner optimizer's per-variable state names (Keras 3's: Adam's ``["momentum", "velocity"]``)."""
        inner = self.inner_optimizer
        return list(dict.fromkeys(name for v in self._trainable_variables for name in _slots_of(inner, v)))

    def get_slot(self, var: Any, slot_name: str) -> Any:
        """The inner optimizer's ``slot_name`` variable for ``var`` (Keras 3's name, or tf-keras's: ``"m"``)."""
        inner = self.inner_optimizer
        slots, name = _slots_of(inner, var), _slot_name(inner, slot_name)
        if name in slots:
            return slots[name]
        if not inner.built:
            raise ValueError("The optimizer has no slots yet: call optimizer.build(variables) before get_slot().")
        raise KeyError(
            f"No slot {slot_name!r} for variable {getattr(var, 'path', var)!r} in {type(inner).__name__}; "
            f"its slots are {sorted(slots)} (see get_slot_names()). Keras 3 keeps no slot for some tf-keras ones: "
            "read optimizer.variables instead."
        )

    def add_slot(self, var: Any, slot_name: str, initializer: Any = "zeros") -> Any:
        """The ``slot_name`` variable for ``var``: the existing one, or a new one shaped like ``var`` (Keras 3's
        ``inner.add_variable_from_reference``): saved with the optimizer, not used by its update rule."""
        inner = self.inner_optimizer
        slots, name = _slots_of(inner, var), _slot_name(inner, slot_name)
        return slots[name] if name in slots else inner.add_variable_from_reference(var, name, initializer=initializer)
