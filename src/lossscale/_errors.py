"""Errors raised by lossscale, and the stall guard's framework-free part: its limit check and its message."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, overload

__all__ = ["ArgumentTypeError", "LossScaleError", "check_skip_limit", "stall_error", "whole"]


class LossScaleError(RuntimeError):
    """Training cannot go on as asked, e.g. too many skipped steps in a row."""


class ArgumentTypeError(TypeError, ValueError):
    """A number-valued argument that is not a number (``"big"``, a bool, an array) or not whole where a count is
    asked (``2.5``). A ``TypeError``, as Python raises for the wrong type, and a ``ValueError``, as TensorFlow's
    constructors raised for the same arguments (they convert with ``float()``; its Keras optimizer documents
    "ValueError in case of any invalid argument"): code written for either catches it."""


def whole(value: Any) -> Any:
    """``value`` as an int where it is a whole Python or numpy float (``2000.0``, ``2e3``), else ``value`` as given: a
    count spelled as a float is the int it spells, as TensorFlow's ``int()`` took it (a fraction is then refused
    by the caller's int check)."""
    if isinstance(value, Real) and not isinstance(value, (Integral, bool)):
        number = float(value)
        if math.isfinite(number) and number.is_integer():
            return int(number)
    return value


@overload
def check_skip_limit(max_consecutive_skips: None) -> None: ...
@overload
def check_skip_limit(max_consecutive_skips: int) -> int: ...
def check_skip_limit(max_consecutive_skips: Any) -> int | None:
    """``max_consecutive_skips`` validated: None (no guard) or an int >= 1 (a whole float is its int)."""
    if max_consecutive_skips is None:
        return None
    max_consecutive_skips = whole(max_consecutive_skips)
    if isinstance(max_consecutive_skips, bool) or not isinstance(max_consecutive_skips, Integral):
        raise ArgumentTypeError(f"max_consecutive_skips must be an int or None, got {max_consecutive_skips!r}.")
    if max_consecutive_skips < 1:
        raise ValueError(f"max_consecutive_skips must be at least 1 (or None to disable), got {max_consecutive_skips}.")
    return int(max_consecutive_skips)


def stall_error(streak: int, scale: float, limit: int, loss_check: str, causes: str, see: str = "") -> LossScaleError:
    """The stall guard's error after ``streak`` skips in a row; a binding names its ``loss_check`` and further
    ``causes`` (bullet lines), and ``see`` (a diagnostic to pass, ending in ``"or "``)."""
    return LossScaleError(
        f"{streak} steps in a row were skipped because gradients held NaN or Inf (loss scale now {scale:g}; "
        f"max_consecutive_skips={limit}). Lowering the scale has not helped, so the cause is likely not an overflow "
        "of the scaled loss:\n"
        f"  * a NaN in the loss itself (bad inputs or labels, log(0), 0/0): check {loss_check};\n"
        "  * a learning rate too high, so the weights diverged: lower it or add warm-up;\n"
        f"{causes}Pass {see}max_consecutive_skips=None to disable this check."
    )
