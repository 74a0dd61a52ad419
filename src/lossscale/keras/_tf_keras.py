"""Configs written by tf-keras's ``LossScaleOptimizer`` (Keras 2), translated for Keras 3.

Three wrapper shapes: TF <= 2.3's (``optimizer``, ``loss_scale``), TF 2.4+'s
(``inner_optimizer``, ``dynamic``, ``initial_scale``, ``dynamic_growth_steps``)
and Keras 3's own (older releases add the base optimizer's keys at their
defaults). A Keras 2 inner optimizer's ``is_legacy_optimizer`` and
``jit_compile`` are dropped, ``lr`` is ``learning_rate``, and ``decay`` is
``InverseTimeDecay(lr, 1, decay)`` exactly. The table is docs/keras.md's
"Configs from tf-keras".
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from typing import Any

import keras

__all__ = ["inner_from_config", "translate_config"]

# Keras 3's LossScaleOptimizer once wrote these base-optimizer keys, at these values, into its config.
_KERAS3_BASE_DEFAULTS = {
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}


def translate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` (any of the three wrapper shapes, or ours) in this class's keys."""
    config = dict(config)
    if "optimizer" in config:
        if "inner_optimizer" in config:
            raise ValueError("A LossScaleOptimizer config has both 'optimizer' (TF <= 2.3) and 'inner_optimizer'.")
        config["inner_optimizer"] = config.pop("optimizer")
    if "inner_optimizer" not in config:
        raise ValueError(
            f"Not a LossScaleOptimizer config: no 'inner_optimizer' (or TF 2.3's 'optimizer') among "
            f"{sorted(config)}. Pass what get_config() returned."
        )
    for key, default in _KERAS3_BASE_DEFAULTS.items():
        if key in config:
            value = config.pop(key)
            if value != default:
                raise ValueError(
                    f"This LossScaleOptimizer config sets {key}={value!r}, which only the inner optimizer can "
                    f"hold: move it into the inner optimizer's config."
                )
    return config


def _translate_inner(config: dict[str, Any], class_name: str) -> dict[str, Any]:
    config = dict(config)
    config.pop("is_legacy_optimizer", None)
    if config.pop("jit_compile", False):
        warnings.warn(
            f"{class_name}: jit_compile=True (a Keras 2 optimizer setting) is dropped; Keras 3 compiles the whole "
            "train step instead: model.compile(..., jit_compile=True) ('auto', the default, already does where "
            "it can).",
            stacklevel=4,
        )
    if "lr" in config:
        lr = config.pop("lr")
        config.setdefault("learning_rate", lr)
    decay = config.pop("decay", None)
    if decay:
        learning_rate = config.get("learning_rate", 0.001)
        if isinstance(learning_rate, (int, float)):
            schedule = keras.optimizers.schedules.InverseTimeDecay(float(learning_rate), 1, float(decay))
            config["learning_rate"] = keras.saving.serialize_keras_object(schedule)
        else:
            warnings.warn(
                f"{class_name}: decay={decay!r} is dropped: Keras 3 has no decay argument, and the learning rate "
                "is already a schedule, which Keras 2 combined with decay. Fold the decay into the schedule.",
                stacklevel=4,
            )
    return config


def inner_from_config(inner: Any, custom_objects: Any = None) -> Any:
    """The inner optimizer of a config: an instance as it is, or a serialized Keras 2 or 3 optimizer."""
    if isinstance(inner, keras.optimizers.Optimizer):
        return inner
    if not isinstance(inner, Mapping) or not isinstance(inner.get("class_name"), str):
        raise TypeError(
            f"inner_optimizer must be an optimizer or a serialized one ({{'class_name': ..., 'config': {{...}}}}), "
            f"got {inner!r}."
        )
    class_name = inner["class_name"]
    config = _translate_inner(dict(inner.get("config") or {}), class_name)
    builtin = getattr(keras.optimizers, class_name, None)
    module = str(inner.get("module") or "")
    from_keras = not module or module.startswith("keras.") or module == "keras"
    if from_keras and isinstance(builtin, type) and issubclass(builtin, keras.optimizers.Optimizer):
        # Keras 2 names its built-in optimizers "keras.optimizers.legacy"/"...experimental"; Keras 3 knows the
        # same classes by name only.
        try:
            return builtin.from_config(config, custom_objects=custom_objects)
        except (TypeError, ValueError, KeyError) as error:  # KeyError: e.g. a LossScaleOptimizer without its inner
            raise ValueError(
                f"Cannot rebuild the inner optimizer {class_name} from {config!r}: {error}. Its config carries a "
                "setting Keras 3 does not have; remove it (see docs/keras.md, 'Configs from tf-keras')."
            ) from error
    # A config names modules, it doesn't import them: Keras would import a "keras.*" module the config names, so
    # it gets one only if it is imported already (registered classes are found by registered_name).
    inner = {key: value for key, value in inner.items() if key != "module" or value in sys.modules}
    return keras.saving.deserialize_keras_object({**inner, "config": config}, custom_objects=custom_objects)
