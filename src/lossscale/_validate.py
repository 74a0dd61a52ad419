"""The one validation rule for loss-scale state brought in from outside (checkpoints, pickles, restores).

Every binding reads the saved values into plain Python/numpy values and
calls :func:`check_state` (or its parts) *before* it changes anything, so a
load either succeeds whole or raises and leaves the object as it was. The
rules:

* the scale is a real number, finite, ``> 0``, a normal float32 (at least
  about 1.2e-38, at most about 3.4e38) and within the policy's
  ``[min, max]`` (compared in float32, the state's dtype). A binding that
  documents clamping (``lossscale.torch.GradScaler`` reading torch's files)
  passes ``clamp=True``: a finite scale outside the bounds is then moved
  into them instead of refused;
* every counter is an integer (not a bool, not a float) in ``[0, 2**31 - 1]``
  (the counters are int32). An int64 value that would wrap in int32 is
  refused, not wrapped;
* the policy is a :class:`~lossscale.LossScale`, or its ``serialize`` dict,
  which :func:`lossscale.get` reads (built-in classes only).

Errors are ``TypeError`` (wrong type) or ``ValueError`` (wrong value) and
name the field, the bad value and the fix. Cost: a handful of Python
comparisons; the caller has already brought the values to the host.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any

import numpy as np

from . import _numbers as _n
from ._policy import LossScale, RuleParams
from ._resolve import get

__all__ = ["COUNTERS", "check_counter", "check_policy", "check_scale", "check_state", "plain"]

#: The integer fields of :class:`lossscale.LossScaleState`, in order.
COUNTERS = ("good_steps", "bad_steps", "skipped_steps", "consecutive_skips")

def _fix(field: str, what: str) -> str:
    return f"set {field} to {what}, or load a checkpoint that state_dict()/save wrote."


def plain(value: Any) -> Any:
    """``value`` as a Python scalar if it is a one-element array of a framework (read with ``.item()``), else itself.

    Arrays are recognised by duck typing (``shape`` and ``item``), so no
    framework is imported. A tensor with more than one element stays as it is
    (and is then refused by the checks). Cost: one host read per array.
    """
    if isinstance(value, (bool, int, float, str, bytes)) or value is None:
        return value
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "item"):
        size = int(np.prod(tuple(shape), dtype=np.int64)) if tuple(shape) else 1
        if size == 1:
            kind = str(getattr(value, "dtype", "")).lower()
            item = value.item()
            if "bool" in kind:
                return bool(item)
            return item
    return value


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def check_counter(field: str, value: Any) -> int:
    """``value`` as a Python int in ``[0, 2**31 - 1]``, else TypeError/ValueError naming ``field``."""
    value = plain(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Integral, np.integer)):
        raise TypeError(f"{field} must be a non-negative int (int32), got {_describe(value)}; {_fix(field, 'an int')}")
    value = operator.index(value)
    if not 0 <= value <= _n.INT32_MAX:
        raise ValueError(
            f"{field} must be an int in [0, 2**31 - 1] (the counters are int32; a larger int64 would wrap), "
            f"got {value}; {_fix(field, 'an int in that range')}"
        )
    return value


def _params(policy: Any) -> RuleParams | None:
    if policy is None:
        return None
    if isinstance(policy, RuleParams):
        return policy
    return check_policy(policy).rule_params()


def check_scale(field: str, value: Any, policy: Any = None, *, clamp: bool = False) -> float:
    """``value`` as a Python float that is a valid loss scale for ``policy`` (if given).

    Args:
        field: the name to put in the error (e.g. ``"state['loss_scale']"``).
        value: a Python/numpy number or a one-element array.
        policy: a :class:`~lossscale.LossScale`, its :class:`~lossscale.RuleParams`,
            or None (then only finiteness, sign and float32 range are checked).
        clamp: move a finite scale outside the policy's ``[min, max]`` (or below
            float32's smallest normal) into it instead of refusing it.
    """
    value = plain(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Real, np.integer, np.floating)):
        raise TypeError(
            f"{field} must be a positive finite number (the loss scale), got {_describe(value)}; "
            f"{_fix(field, 'a finite number')}"
        )
    try:
        number = float(value)
    except OverflowError:  # an int beyond float64
        number = math.inf
    if not math.isfinite(number) or not math.isfinite(_n.float32(number)):
        raise ValueError(
            f"{field} must be finite in float32 (the loss scale's dtype, max about 3.4e38), got {value!r}; "
            f"{_fix(field, 'a finite number')}"
        )
    params = _params(policy)
    low = _n.FLOAT32_TINY if params is None else max(params.min_scale, _n.FLOAT32_TINY)
    high = _n.FLOAT32_MAX if params is None or params.max_scale is None else params.max_scale
    as_f32 = _n.float32(number)
    if clamp:
        return min(max(number, low), high)
    if number <= 0:
        raise ValueError(
            f"{field} must be positive, got {value!r}: a scale of 0 or below breaks the rule; "
            f"{_fix(field, 'a finite number')}"
        )
    if as_f32 < _n.FLOAT32_TINY:
        raise ValueError(
            f"{field}={value!r} is below float32's smallest normal number (about 1.2e-38): it would round to 0 or "
            f"lose precision; {_fix(field, 'a finite number')}"
        )
    # Compared in float32: the state is float32, and float32(0.3) > 0.3.
    if params is not None and (as_f32 < _n.float32(low) or as_f32 > _n.float32(high)):
        raise ValueError(
            f"{field}={value!r} is outside the policy's bounds [{low!r}, {high!r}]; "
            f"{_fix(field, 'a finite number in those bounds')} To change the bounds, change the policy "
            "(min_loss_scale/max_loss_scale)."
        )
    return number


def check_policy(policy: Any, field: str = "policy") -> LossScale:
    """A :class:`~lossscale.LossScale` from ``policy`` (an instance, or its ``serialize`` dict).

    Only built-in classes are found by name (:func:`lossscale.get`); nothing
    is imported. None, numbers and strings are refused here: a checkpoint
    stores a serialized policy.
    """
    if isinstance(policy, LossScale):
        return policy
    if not isinstance(policy, Mapping):
        raise TypeError(
            f"{field} must be a serialized loss scale policy ({{'class_name': ..., 'config': {{...}}}}, as "
            f"lossscale.serialize() returns), got {_describe(policy)}; {_fix(field, 'one')}"
        )
    try:
        result = get(policy)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{field} is not a valid policy: {error}") from error
    if result is None:  # pragma: no cover - get() returns None only for None
        raise TypeError(f"{field} holds no policy; {_fix(field, 'one')}")
    return result


def check_state(
    state: Mapping[str, Any],
    policy: Any = None,
    *,
    where: str = "state",
    clamp: bool = False,
    required: tuple[str, ...] = ("loss_scale", *COUNTERS),
    extra: str = "ignore",
) -> dict[str, Any]:
    """Validates a loss scale's state fields by name; returns them as plain Python numbers.

    Args:
        state: a mapping of field name to value (``loss_scale`` and the
            counters of :class:`lossscale.LossScaleState`; arrays are read).
        policy: the policy the state belongs to (bounds of the scale), or None.
        where: how the error names the mapping (``"state_dict['lossscale']['state']"``).
        clamp: see :func:`check_scale`.
        required: the fields that must be present.
        extra: ``"ignore"`` (fields this function does not know are left
            alone and not returned) or ``"refuse"`` (ValueError naming them).

    Returns:
        ``{"loss_scale": float, "good_steps": int, ...}`` for the fields present.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"{where} must be a dict of the loss scale's fields, got {_describe(state)}; {_fix(where, 'one')}")
    missing = [name for name in required if name not in state]
    if missing:
        raise ValueError(f"{where} is missing {missing}; add them, or load a checkpoint that state_dict()/save wrote.")
    known = ("loss_scale", *COUNTERS)
    if extra == "refuse":
        unknown = sorted(map(str, set(state) - set(known)))
        if unknown:
            raise ValueError(
                f"{where} has keys this version does not know: {unknown}. Remove them, or load the checkpoint with "
                "the lossscale version that wrote it."
            )
    out: dict[str, Any] = {}
    if "loss_scale" in state:
        out["loss_scale"] = check_scale(f"{where}['loss_scale']", state["loss_scale"], policy, clamp=clamp)
    for name in COUNTERS:
        if name in state:
            out[name] = check_counter(f"{where}[{name!r}]", state[name])
    return out
