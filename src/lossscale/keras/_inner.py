"""The wrapped optimizer: what may be wrapped, by one wrapper only, and which settings are the inner's.

The base-optimizer settings (``clipnorm``, ``weight_decay``, ``use_ema``, ...)
belong to the inner optimizer, which does the update: the wrapper refuses
them as constructor arguments and reads and writes them through to the inner
optimizer as attributes (tf-keras's behaviour; Keras 3's own class keeps
separate, unused copies).
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import keras

__all__ = ["INNER_SETTINGS", "check_inner", "claim", "forward_inner_settings", "refuse_base_arguments"]

#: Base-optimizer settings that are the inner optimizer's (read and written through the wrapper).
INNER_SETTINGS = (
    "weight_decay",
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "use_ema",
    "ema_momentum",
    "ema_overwrite_frequency",
    "gradient_accumulation_steps",
)

_OWNERS: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()


def check_inner(inner: Any) -> None:
    """Raises unless ``inner`` is a Keras 3 optimizer without a loss scale of its own."""
    if isinstance(inner, keras.optimizers.LossScaleOptimizer):
        raise TypeError(
            "inner_optimizer is already a LossScaleOptimizer; wrapping it again would scale twice. Use it as it "
            "is, or wrap its inner_optimizer."
        )
    if not isinstance(inner, keras.optimizers.Optimizer):
        raise TypeError(
            f"inner_optimizer must be a keras.optimizers.Optimizer instance (Keras 3), got {type(inner).__name__}. "
            "Build it first, e.g. LossScaleOptimizer(keras.optimizers.AdamW(1e-3)); for a serialized Keras 2 "
            "optimizer use LossScaleOptimizer.from_config."
        )
    if inner.loss_scale_factor is not None:
        raise ValueError(
            f"inner_optimizer has loss_scale_factor={inner.loss_scale_factor!r}, a second, fixed loss scale. "
            "Drop it from the inner optimizer and pass it here instead: "
            f"LossScaleOptimizer(inner, loss_scale={inner.loss_scale_factor!r})."
        )


def claim(inner: Any, wrapper: Any) -> None:
    """Records ``wrapper`` as ``inner``'s only loss-scale wrapper; raises if another live one holds it.

    Two wrappers of one inner optimizer would share its slots and
    ``iterations`` but keep two scales (tf-keras raised here too).
    """
    owner = _OWNERS.get(inner)
    if owner is not None and owner() is not None:
        gc.collect()  # a wrapper kept only by a reference cycle is gone after this
        owner = _OWNERS.get(inner)
    holder = owner() if owner is not None else None
    if holder is not None and holder is not wrapper:
        raise ValueError(
            f"inner_optimizer {inner.name!r} is already wrapped by another LossScaleOptimizer ({holder.name!r}): "
            "two wrappers would share its slots and iterations but keep two loss scales. Use that wrapper, or "
            "wrap a new inner optimizer (e.g. keras.optimizers.Adam.from_config(inner.get_config()))."
        )
    _OWNERS[inner] = weakref.ref(wrapper)


def refuse_base_arguments(kwargs: dict[str, Any]) -> None:
    """Raises for constructor arguments the wrapper does not take, naming the inner optimizer where they belong."""
    if not kwargs:
        return
    settings = [k for k in kwargs if k in INNER_SETTINGS or k in ("loss_scale_factor", "learning_rate")]
    if settings:
        shown = ", ".join(f"{k}={kwargs[k]!r}" for k in settings)
        raise ValueError(
            f"LossScaleOptimizer does not take {shown}: the update is the inner optimizer's, so set it on "
            f"inner_optimizer, e.g. LossScaleOptimizer(keras.optimizers.Adam(1e-3, {shown}))"
            + (" (a loss scale goes in loss_scale= here instead)." if "loss_scale_factor" in kwargs else ".")
        )
    raise TypeError(f"LossScaleOptimizer() got unexpected keyword arguments: {', '.join(sorted(kwargs))}.")


def _forward(name: str) -> property:
    """A property reading and writing the inner optimizer's ``name`` (the base class's default until wrapped)."""

    def read(self: Any) -> Any:
        inner = self.__dict__.get("inner_optimizer")
        return getattr(inner, name) if inner is not None else None

    def write(self: Any, value: Any) -> None:
        inner = self.__dict__.get("inner_optimizer")
        if inner is not None:  # the base class's __init__ writes its defaults before the inner is set
            setattr(inner, name, value)

    return property(read, write, doc=f"The inner optimizer's ``{name}``.")


def forward_inner_settings(cls: type) -> type:
    """Class decorator: each of :data:`INNER_SETTINGS` becomes a property of the inner optimizer's value."""
    for name in INNER_SETTINGS:
        setattr(cls, name, _forward(name))
    return cls
