"""The optimizer's one record: its config (``get_config``/``from_config``) and its variables' values.

``.keras`` files save the config and, through ``save_own_variables``, the
values; pickling and ``copy.deepcopy`` go through the same two, so a custom
:class:`lossscale.LossScale` subclass is rebuilt from ``custom_objects`` (a
class is never imported by name) and a restored optimizer holds the same
numbers once built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
from keras import ops

from .. import DynamicLossScale, FixedLossScale, LossScale, get, serialize
from .._resolve import stable_form
from ._tf_keras import inner_from_config, translate_config

__all__ = ["read_config", "restore", "values_record", "write_config"]


_EXTRAS = ("min_loss_scale", "max_loss_scale", "hysteresis")


def _stable(policy: LossScale) -> dict[str, Any] | None:
    """The stable form's keys (and the three extensions) that rebuild ``policy``, or None if they cannot."""
    if type(policy) is FixedLossScale:
        return stable_form(policy)
    if type(policy) is DynamicLossScale and policy.multiplier == 2.0 and policy.backoff_factor is None:
        default = DynamicLossScale()
        return {**stable_form(policy), **{k: getattr(policy, k) for k in _EXTRAS if getattr(policy, k) != getattr(default, k)}}
    return None


def write_config(name: str, inner: Any, policy: LossScale, max_consecutive_skips: int | None) -> dict[str, Any]:
    """tf-keras's keys (``inner_optimizer``, and the stable form's when they say it all) and ours (``loss_scale``)."""
    config = {"name": name, "inner_optimizer": keras.saving.serialize_keras_object(inner)}
    config.update(_stable(policy) or {"loss_scale": serialize(policy)})
    if max_consecutive_skips is not None:
        config["max_consecutive_skips"] = max_consecutive_skips
    return config


def read_config(config: Mapping[str, Any], custom_objects: Any = None) -> tuple[Any, dict[str, Any]]:
    """The inner optimizer and the constructor's keywords of a config (any tf-keras shape, Keras 3's, ours)."""
    config = translate_config(config)
    inner = inner_from_config(config.pop("inner_optimizer"), custom_objects)
    value = config.get("loss_scale")
    if isinstance(value, Mapping):  # ours, or TF's {"class_name", "config"} with Keras' extra keys
        value = {k: v for k, v in value.items() if k in ("class_name", "config")}
        config["loss_scale"] = get(value, custom_objects=_merged(custom_objects))  # a class of one's own: found only there
        if config["loss_scale"] is None:
            raise ValueError("loss_scale=None in a config: drop the key for the default dynamic scale.")
    return inner, config


def _merged(custom_objects: Any) -> dict[str, Any]:
    """``custom_objects`` plus those of an enclosing ``keras.saving.custom_object_scope``."""
    merged = dict(keras.saving.get_custom_objects())
    merged.update(custom_objects or {})
    classes = {k: v for k, v in merged.items() if isinstance(v, type) and issubclass(v, LossScale)}
    return {**{v.__name__: v for v in classes.values()}, **classes}


def values_record(variables: list[Any]) -> dict[str, Any]:
    """``save_own_variables``'s store: ``{"0": array, ...}`` for ``variables`` in order."""
    return {str(i): ops.convert_to_numpy(v) for i, v in enumerate(variables)}


def restore(cls: Any, config: dict[str, Any], custom: dict[str, Any], values: Any, history: Any) -> Any:
    """The optimizer of a pickled record: ``from_config``; ``values`` wait for :meth:`build` (the model's variables)."""
    opt = cls.from_config(dict(config), custom_objects=custom)
    opt.restore_on_build(values, history)
    return opt
