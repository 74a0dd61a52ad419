"""The one load rule: a saved loss scale (checkpoint, pickle, restore) -> a policy and numpy values, all checked first.

Bindings read saved fields through :func:`read_record` before changing anything, so a load succeeds whole or raises
(naming the field, the value and the fix). Cost: one host read (``.item()``) per field still on a device."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from numbers import Integral, Real
from typing import Any

import numpy as np

from ._policy import COUNTER_MAX, FLOAT32_MAX, FLOAT32_TINY, LossScale, float32
from ._resolve import _BUILTINS, get

__all__ = ["COUNTERS", "FIELDS", "check_counter", "check_policy", "check_scale", "plain", "read_policy", "read_record",
           "refuse_extra"]

#: The integer fields of :class:`lossscale.LossScaleState`, in order; :data:`FIELDS` adds the scale.
COUNTERS = ("good_steps", "bad_steps", "skipped_steps", "consecutive_skips")
FIELDS = ("loss_scale", *COUNTERS)


def _fix(field: str, what: str) -> str:
    return f"set {field} to {what}, or load a checkpoint that state_dict()/save wrote."


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text[:77] + '...' if len(text) > 80 else text} ({type(value).__name__})"


def plain(value: Any) -> Any:
    """A one-element array of any framework (duck-typed: ``shape`` and ``item``) as a Python scalar, else ``value``."""
    shape = getattr(value, "shape", None)
    if shape is None or not hasattr(value, "item") or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if int(np.prod(tuple(shape), dtype=np.int64)) != 1:
        return value  # refused by the checks
    item = value.item()
    return bool(item) if "bool" in str(getattr(value, "dtype", "")).lower() else item


def check_counter(field: str, value: Any) -> int:
    """``value`` as a Python int (not a bool or a float) in ``[0, 2**31 - 1]``, else TypeError/ValueError."""
    value = plain(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Integral, np.integer)):
        raise TypeError(f"{field} must be a non-negative int (int32), got {_describe(value)}; {_fix(field, 'an int')}")
    value = operator.index(value)
    if not 0 <= value <= COUNTER_MAX:
        raise ValueError(
            f"{field} must be an int in [0, 2**31 - 1] (the counters are int32; a larger int64 would wrap), "
            f"got {value}; {_fix(field, 'an int in that range')}"
        )
    return value


def check_scale(field: str, value: Any, policy: Any = None, *, clamp: bool = False) -> float:
    """``value`` as a Python float: finite, ``> 0``, a normal float32 and within ``policy``'s ``[min, max]`` compared
    in float32 (None: no bounds). ``clamp`` (torch's GradScaler files) moves a finite scale into them instead."""
    value = plain(value)
    fix = _fix(field, "a finite number")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Real, np.integer, np.floating)):
        raise TypeError(f"{field} must be a positive finite number (the loss scale), got {_describe(value)}; {fix}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float64
        number = math.inf
    if not math.isfinite(float32(number)):
        raise ValueError(
            f"{field} must be finite in float32 (the loss scale's dtype, max about 3.4e38), got {value!r}; {fix}"
        )
    params = None if policy is None else check_policy(policy).rule_params()
    low = FLOAT32_TINY if params is None else max(params.min_scale, FLOAT32_TINY)
    high = FLOAT32_MAX if params is None or params.max_scale is None else params.max_scale
    if clamp:
        return min(max(number, low), high)
    if number <= 0:
        raise ValueError(f"{field} must be positive, got {value!r}: a scale of 0 or below breaks the rule; {fix}")
    if float32(number) < FLOAT32_TINY:
        raise ValueError(
            f"{field}={value!r} is below float32's smallest normal number (about 1.2e-38): it would round to 0 or "
            f"lose precision; {fix}"
        )
    if params is not None and not float32(low) <= float32(number) <= float32(high):  # float32(0.3) > 0.3
        raise ValueError(
            f"{field}={value!r} is outside the policy's bounds [{low!r}, {high!r}]; "
            f"{_fix(field, 'a finite number in those bounds')} To change the bounds, change the policy "
            "(min_loss_scale/max_loss_scale)."
        )
    return number


def check_policy(policy: Any, field: str = "policy") -> LossScale:
    """A :class:`~lossscale.LossScale` from ``policy`` (an instance, or its ``serialize`` dict; built-ins only)."""
    if isinstance(policy, LossScale):
        return policy
    if not isinstance(policy, Mapping):
        raise TypeError(
            f"{field} must be a serialized loss scale policy ({{'class_name': ..., 'config': {{...}}}}, as "
            f"lossscale.serialize() returns), got {_describe(policy)}; {_fix(field, 'one')}"
        )
    try:
        return get(policy)  # type: ignore[return-value]  # None only for None
    except (TypeError, ValueError) as error:
        raise type(error)(f"{field} is not a valid policy: {error}") from error


def read_policy(saved: Any, custom_objects: Mapping[str, type] | None, current: LossScale | None) -> LossScale:
    """The policy a checkpoint holds: a policy object, or its ``serialize`` dict, rebuilt without imports (the class
    from ``custom_objects``, the built-ins, or the class of ``current``, the policy in use)."""
    if isinstance(saved, LossScale):
        return saved
    own = current is not None and type(current).__module__ != LossScale.__module__
    custom = {type(current).__name__: type(current)} if own else {}
    if custom_objects is not None:
        if not isinstance(custom_objects, Mapping):
            raise TypeError(
                f"custom_objects must be a dict of class name to class, got {type(custom_objects).__name__}."
            )
        custom.update(custom_objects)
    try:
        policy = get(saved, custom_objects=custom or None)
    except (TypeError, ValueError) as error:
        name = saved.get("class_name") if isinstance(saved, Mapping) else None
        if isinstance(name, str) and name not in custom and name not in _BUILTINS:
            raise ValueError(
                f"This checkpoint's loss scale policy is unreadable: its class {name!r} is not a built-in policy. Pass "
                f"the class: load_state_dict(state_dict, custom_objects={{{name!r}: {name}}}). No class is imported by name."
            ) from error
        raise ValueError(f"This checkpoint's loss scale policy is unreadable: {error}") from error
    if policy is None:
        raise ValueError("Not a lossscale state dict (it holds no loss scale policy); pass what state_dict() returned.")
    return policy


def refuse_extra(saved: Mapping[str, Any], known: Iterable[str], where: str, prefix: str = "") -> None:
    """ValueError naming the keys of ``saved`` outside ``known`` (refused, not ignored: an unknown key may change
    what the others mean); a ``prefix`` (torch's ``"Not a lossscale state dict: "``) also names the library."""
    unknown = sorted(map(str, set(saved) - set(known)))
    if unknown:
        raise ValueError(
            f"{prefix}{where} has keys this version{' of lossscale' if prefix else ''} does not know: {unknown}. "
            "Remove them, or load the checkpoint with the lossscale version that wrote it."
        )


def read_record(
    record: Mapping[str, Any], policy: Any = None, clamp: bool = False, *, where: str = "state",
    required: tuple[str, ...] = FIELDS, extra: str = "ignore",
) -> tuple[LossScale | None, dict[str, Any]]:
    """``(policy, values)``: the policy checked, and the fields of :data:`FIELDS` in ``record`` as np.float32/int32.

    ``record`` maps names to numbers or one-element arrays; ``policy``: a policy, its ``serialize`` dict or None
    (no bounds); ``where`` names ``record`` in errors; ``extra``: ``"ignore"`` or ``"refuse"`` other keys."""
    if not isinstance(record, Mapping):
        raise TypeError(f"{where} must be a dict of the loss scale's fields, got {_describe(record)}; {_fix(where, 'one')}")
    missing = [name for name in required if name not in record]
    if missing:
        raise ValueError(f"{where} is missing {missing}; add them, or load a checkpoint that state_dict()/save wrote.")
    if extra == "refuse":
        refuse_extra(record, FIELDS, where)
    policy = None if policy is None else check_policy(policy)
    values: dict[str, Any] = {}
    if "loss_scale" in record:
        values["loss_scale"] = np.float32(check_scale(f"{where}['loss_scale']", record["loss_scale"], policy, clamp=clamp))
    for name in COUNTERS:
        if name in record:
            values[name] = np.int32(check_counter(f"{where}[{name!r}]", record[name]))
    return policy, values

