"""The optimizer's config (``get_config``/``from_config``, pickling) and the configs tf-keras wrote.

Pickling and ``copy.deepcopy`` go through the config and the variables' values, as a ``.keras`` file does: a custom
:class:`lossscale.LossScale` comes back through ``custom_objects``, never by import. tf-keras's wrapper shapes and
Keras 2 inner optimizers are translated as docs/keras.md's "Configs from tf-keras" lists.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from typing import Any

import keras

from .. import DynamicLossScale, FixedLossScale, LossScale, get, serialize
from .._resolve import stable_form
from .._sampler import check_stats_every

__all__ = ["BASE_DEFAULTS", "read_config", "restore", "write_config"]

#: The base optimizer's settings (the inner's), which Keras 3's own wrapper writes at these defaults.
BASE_DEFAULTS = {
    "weight_decay": None, "clipnorm": None, "global_clipnorm": None, "clipvalue": None, "use_ema": False,
    "ema_momentum": 0.99, "ema_overwrite_frequency": None, "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}


def read_config(config: Mapping[str, Any], custom_objects: Any = None) -> tuple[Any, dict[str, Any]]:
    """The inner optimizer and the constructor's keywords of a config (any tf-keras shape, Keras 3's, ours)."""
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
    for key, default in BASE_DEFAULTS.items():
        if key in config and (value := config.pop(key)) != default:
            raise ValueError(
                f"This LossScaleOptimizer config sets {key}={value!r}, which only the inner optimizer can "
                f"hold: move it into the inner optimizer's config."
            )
    inner = inner_from_config(config.pop("inner_optimizer"), custom_objects)
    value = config.get("loss_scale")
    if isinstance(value, Mapping):  # ours, or TF's {"class_name", "config"} with Keras' extra keys
        value = {k: v for k, v in value.items() if k in ("class_name", "config")}
        config["loss_scale"] = get(value, custom_objects=_merged(custom_objects))  # a class of one's own: found only there
        if config["loss_scale"] is None:
            raise ValueError("loss_scale=None in a config: drop the key for the default dynamic scale.")
    return inner, config


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
        config.setdefault("learning_rate", config.pop("lr"))
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
    builtin: type[Any] | None = getattr(keras.optimizers, class_name, None)
    module = str(inner.get("module") or "")
    # Keras 2 names its built-in optimizers "keras.optimizers.legacy"/"...experimental"; Keras 3 knows the same
    # classes by name only.
    from_keras = not module or module.startswith("keras.") or module == "keras"
    if from_keras and isinstance(builtin, type) and issubclass(builtin, keras.optimizers.Optimizer):
        try:
            return builtin.from_config(config, custom_objects=custom_objects)
        except (TypeError, ValueError, KeyError) as error:  # KeyError: e.g. a LossScaleOptimizer without its inner
            raise ValueError(
                f"Cannot rebuild the inner optimizer {class_name} from {config!r}: {error}. Its config carries a "
                "setting Keras 3 does not have; remove it (see docs/keras.md, 'Configs from tf-keras')."
            ) from error
    # A config names modules, it doesn't import them: Keras would import a "keras.*" module the config names, so it
    # gets one only if it is imported already (registered classes are found by registered_name).
    inner = {key: value for key, value in inner.items() if key != "module" or value in sys.modules}
    return keras.saving.deserialize_keras_object({**inner, "config": config}, custom_objects=custom_objects)


_EXTRAS = ("min_loss_scale", "max_loss_scale", "hysteresis")


def _stable(policy: LossScale) -> dict[str, Any] | None:
    """The keys that rebuild ``policy`` without ``loss_scale: serialize(policy)``, or None: Keras 3's own class's
    (``initial_scale``, ``dynamic_growth_steps``, plus the three extensions when set) for a dynamic scale; the
    number as ``loss_scale`` (the experimental form) for a fixed one. Never tf-keras's ``dynamic`` key: Keras 3
    writes none (and refuses ``dynamic=False``), and the configs TF's pages call equal stay equal without it."""
    if type(policy) is FixedLossScale:
        return {"loss_scale": stable_form(policy)["initial_scale"]}
    if type(policy) is DynamicLossScale and policy.multiplier == 2.0 and policy.backoff_factor is None:
        default, form = DynamicLossScale(), stable_form(policy)
        extras = {k: getattr(policy, k) for k in _EXTRAS if getattr(policy, k) != getattr(default, k)}
        return {"initial_scale": form["initial_scale"], "dynamic_growth_steps": form["dynamic_growth_steps"], **extras}
    return None


def write_config(
    name: str, inner: Any, policy: LossScale, max_consecutive_skips: int | None, stats_every: int | None
) -> dict[str, Any]:
    """Keras 3's keys (``name``, ``inner_optimizer``, ``initial_scale``, ``dynamic_growth_steps``) when they say it
    all, else ``loss_scale``; then ours (``max_consecutive_skips``, ``stats_every``) when set."""
    config = {"name": name, "inner_optimizer": keras.saving.serialize_keras_object(inner)}
    config.update(_stable(policy) or {"loss_scale": serialize(policy)})
    if max_consecutive_skips is not None:
        config["max_consecutive_skips"] = max_consecutive_skips
    if stats_every is not None and stats_every != check_stats_every(None, policy):  # the default is not written
        config["stats_every"] = stats_every
    return config


def _merged(custom_objects: Any) -> dict[str, Any]:
    """``custom_objects`` plus those of an enclosing ``keras.saving.custom_object_scope``."""
    merged = {**keras.saving.get_custom_objects(), **(custom_objects or {})}
    classes = {k: v for k, v in merged.items() if isinstance(v, type) and issubclass(v, LossScale)}
    return {**{v.__name__: v for v in classes.values()}, **classes}


def restore(cls: Any, config: dict[str, Any], custom: dict[str, Any], values: Any, history: Any) -> Any:
    """The optimizer of a pickled record (what ``LossScaleOptimizer.__reduce__`` returns, and every pickle names:
    this function stays here, with this signature, for the pickles of older versions to load).

    Args:
        cls: the optimizer's class.
        config: its :meth:`get_config`.
        custom: the custom objects the config needs (the policy's class).
        values: the variables' values (numpy, in ``optimizer.variables``' order), or None before build.
        history: the :class:`lossscale.History` being recorded, or None.

    Returns:
        The optimizer; ``values`` are assigned when it is built (by the model's variables).
    """
    return cls._unpickled(config, custom, values, history)
