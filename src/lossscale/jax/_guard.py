"""The stall guard under ``jit``: a host callback on a skipped step only, once the streak is long enough."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax import lax

from .._errors import LossScaleError

__all__ = ["check_limit", "guard_skip", "stall_message"]


def check_limit(max_consecutive_skips: Any) -> int | None:
    """``max_consecutive_skips`` validated: None or an int >= 1 (the torch binding's messages)."""
    if max_consecutive_skips is None:
        return None
    if isinstance(max_consecutive_skips, bool) or not isinstance(max_consecutive_skips, (int, np.integer)):
        raise TypeError(f"max_consecutive_skips must be an int or None, got {max_consecutive_skips!r}.")
    if max_consecutive_skips < 1:
        raise ValueError(f"max_consecutive_skips must be at least 1 (or None to disable), got {max_consecutive_skips}.")
    return int(max_consecutive_skips)


def stall_message(streak: int, scale: float, limit: int) -> str:
    """What :class:`lossscale.LossScaleError` says when ``streak`` steps in a row were skipped."""
    return (
        f"{streak} steps in a row were skipped because gradients held NaN or Inf (loss scale now {scale:g}; "
        f"max_consecutive_skips={limit}). Lowering the scale has not helped, so the cause is likely not "
        "an overflow of the scaled loss:\n"
        "  * a NaN in the loss itself (bad inputs or labels, log(0), 0/0): check jnp.isfinite(loss), or run "
        "with jax.config.update('jax_debug_nans', True);\n"
        "  * a learning rate too high, so the weights diverged: lower it or add warm-up;\n"
        "  * a model pretrained in bfloat16 and run in float16, whose activations overflow 65504: "
        "run it in bfloat16 with loss_scale=1, or keep the overflowing layers in float32;\n"
        "  * gradients clipped or transformed *before* loss_scale_optimizer in an optax.chain.\n"
        "Pass max_consecutive_skips=None to disable this check."
    )


def _raise(streak: Any, scale: Any, *, limit: int) -> None:
    raise LossScaleError(stall_message(int(streak), float(scale), limit))


def guard_skip(streak: jax.Array, scale: jax.Array, limit: int) -> None:
    """Raise on the host iff ``streak >= limit`` (which only a skipped step reaches).

    ``streak`` is the consecutive-skip count *after* this step. The callback
    is a ``jax.debug.callback`` behind a ``lax.cond``, so a finite step and a
    skip below the limit run no host code at all. When it fires, JAX re-raises
    the error from the jitted call (wrapped in its runtime error, whose text
    ends with this message) at the latest when the step's results are read.
    """
    lax.cond(
        streak >= limit,
        lambda: jax.debug.callback(functools.partial(_raise, limit=limit), streak, scale),
        lambda: None,
    )
