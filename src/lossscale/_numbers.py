"""Validation of the numbers a policy is built from.

Every policy argument goes through one of the functions here, which return a
plain Python ``float`` or ``int`` or raise a ``TypeError``/``ValueError`` that
names the argument and the fix.

Accepted: Python and numpy numbers, and 0-d arrays of any framework (numpy,
JAX, torch) of a real or integer dtype, as jmp users write them
(``DynamicLossScale(jnp.float32(2**15))``). Arrays are recognised by duck
typing (a ``shape`` and a ``dtype``), so no framework is imported. Rejected:
bools (``True`` is not a scale), bool/complex arrays and arrays with more
than one dimension or element. Reading a device array's value is one host
sync, at construction only.
"""

from __future__ import annotations

import math
import operator
from numbers import Integral, Real
from typing import Any

import numpy as np

__all__ = ["FLOAT32_MAX", "FLOAT32_TINY", "INT32_MAX", "above_one", "count", "float32", "fraction", "number", "scale", "scale_bounds"]

INT32_MAX = 2**31 - 1
#: The largest float32; the state holds the scale as float32.
FLOAT32_MAX = 3.4028234663852886e38
#: The smallest positive normal float32. A smaller scale rounds to 0 (below about 1.4e-45) or loses precision in
#: float32 (a subnormal), so it is refused like one above FLOAT32_MAX.
FLOAT32_TINY = 1.1754943508222875e-38


def _kind(value: Any) -> str:
    """``"bool"``, ``"complex"``, ``"int"``, ``"float"`` or ``""`` from a dtype's name (numpy, JAX, torch spellings)."""
    dtype = str(getattr(value, "dtype", "")).lower()
    for kind in ("bool", "complex", "int", "float"):  # in this order: "complex64" has no "int", "uint8" has
        if kind in dtype:
            return kind
    return ""


def _scalar(name: str, value: Any, fix: str, what: str) -> Any:
    """``value`` if it is a real scalar or a 0-d int/float array, else a TypeError naming ``fix``."""
    if isinstance(value, bool) or _kind(value) == "bool":
        raise TypeError(f"{name} must be {what}, got the bool {value!r}. {fix}")
    if isinstance(value, Real):
        return value
    shape = getattr(value, "shape", None)
    if shape is None or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be {what}, got {value!r} of type {type(value).__name__}. {fix}")
    if tuple(shape) != ():
        raise TypeError(
            f"{name} must be {what} or a 0-d array, got an array of shape {tuple(shape)}. "
            f"Pass a single number (e.g. x.item() or x[0]). {fix}"
        )
    if _kind(value) not in ("int", "float"):
        raise TypeError(f"{name} must be {what}, got a 0-d array of dtype {getattr(value, 'dtype', None)}. {fix}")
    return value


def _concrete(name: str, value: Any, convert: Any, fix: str) -> Any:
    try:
        return convert(value)
    except OverflowError as error:  # an int beyond float64 (10**400): a value error, not a tracer
        raise ValueError(f"{name} must be finite, got an int of {len(str(value))} digits. {fix}") from error
    except Exception as error:  # e.g. a JAX tracer: the value is not known when tracing
        raise TypeError(
            f"{name} must be a concrete number, got {type(value).__name__} ({error.__class__.__name__}); "
            f"build the policy outside jit. {fix}"
        ) from error


def number(name: str, value: Any, fix: str) -> float:
    """``value`` as a finite Python float."""
    value = _concrete(name, _scalar(name, value, fix, "a real number"), float, fix)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}. {fix}")
    return value


def scale(name: str, value: Any, *, at_least: float | None = None, example: str = "2**15") -> float:
    """A loss scale: positive, and a normal float32 number (between about 1.2e-38 and 3.4e38)."""
    fix = f"Pass a positive finite number, for example {name}={example}."
    value = number(name, value, fix)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}. {fix}")
    if value > FLOAT32_MAX:
        raise ValueError(f"{name}={value!r} is not finite in float32, the loss scale's dtype (max about 3.4e38). {fix}")
    if value < FLOAT32_TINY:
        raise ValueError(
            f"{name}={value!r} is below float32's smallest normal number (about 1.2e-38): in the float32 state it "
            f"would round to 0 (every step then skipped) or lose precision. {fix}"
        )
    if at_least is not None and value < at_least:
        raise ValueError(f"{name} must be at least {at_least:g}, got {value!r}.")
    return value


def count(name: str, value: Any, *, at_least: int = 1) -> int:
    """A step count: a whole number in ``[at_least, 2**31 - 1]`` (the counters are int32)."""
    example = max(at_least, 2)
    fix = f"Pass a whole number, for example {name}={example}."
    value = _scalar(name, value, fix, "an int")
    integral = isinstance(value, Integral) or (not isinstance(value, Real) and _kind(value) == "int")
    if not integral:
        dtype = "" if isinstance(value, Real) else f" (dtype {value.dtype})"
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}{dtype}. {fix}")
    value = _concrete(name, value, operator.index, fix)
    if not at_least <= value <= INT32_MAX:
        shown = value if abs(value) < 10**30 else f"an int of {len(str(abs(value)))} digits"
        raise ValueError(
            f"{name} must be an int in [{at_least}, 2**31 - 1] (the counters are int32), got {shown}. "
            f"Pass for example {name}={example}."
        )
    return value


def float32(value: float) -> float:
    """``value`` rounded to float32, as the rule's float32 arithmetic sees it (inf beyond float32's range)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def above_one(name: str, value: Any) -> float:
    """A growth factor: finite and greater than 1, also once rounded to float32 (the scale's dtype)."""
    fix = f"Use for example {name}=2.0."
    value = number(name, value, f"Pass a finite number above 1, for example {name}=2.0.")
    if value <= 1.0:
        raise ValueError(f"{name} must be greater than 1 so the scale can grow, got {value!r}. {fix}")
    rounded = float32(value)
    if rounded == 1.0 or math.isinf(rounded):
        raise ValueError(
            f"{name}={value!r} is {rounded!r} in float32, the loss scale's dtype: the scale would never "
            f"{'grow' if rounded == 1.0 else 'grow (the grown scale is never finite)'}. {fix}"
        )
    return value


def fraction(name: str, value: Any) -> float:
    """A backoff factor: in the open interval (0, 1)."""
    value = number(name, value, f"Pass a number in (0, 1), for example {name}=0.5.")
    if not 0.0 < value < 1.0:
        raise ValueError(
            f"{name} must be in the open interval (0, 1) so the scale shrinks, got {value!r}. Use for example {name}=0.5."
        )
    rounded = float32(value)
    if not 0.0 < rounded < 1.0:
        raise ValueError(
            f"{name}={value!r} is {rounded!r} in float32, the loss scale's dtype: the scale would never "
            f"{'shrink' if rounded == 1.0 else 'back off to anything but the floor'}. Use for example {name}=0.5."
        )
    return value


def scale_bounds(initial: Any, min_loss_scale: Any, max_loss_scale: Any) -> tuple[float, float, float | None]:
    """``(initial, min, max)`` validated as loss scales, with ``min <= initial <= max`` (``max`` None: no ceiling).

    >>> scale_bounds(2**15, 1, None)
    (32768.0, 1.0, None)
    """
    min_scale = scale("min_loss_scale", min_loss_scale, example="1.0")
    max_scale = None
    if max_loss_scale is not None:
        max_scale = scale("max_loss_scale", max_loss_scale, at_least=min_scale, example="2**24")
    initial_scale = scale("initial_loss_scale", initial)
    if initial_scale < min_scale:
        raise ValueError(
            f"initial_loss_scale={initial_scale!r} is below min_loss_scale={min_scale!r}; "
            "raise initial_loss_scale or lower min_loss_scale."
        )
    if max_scale is not None and initial_scale > max_scale:
        raise ValueError(
            f"initial_loss_scale={initial_scale!r} is above max_loss_scale={max_scale!r}; "
            "lower initial_loss_scale or raise max_loss_scale."
        )
    return initial_scale, min_scale, max_scale
