"""Diagnostics under ``jit``: the stall guard and ``history=``, each a ``jax.debug.callback`` to the host."""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap

from .._errors import stall_error
from .._history import STATS_COLUMNS, History

__all__ = ["Recorder", "guard_skip"]


def _raise(streak: Any, scale: Any, *, limit: int) -> None:
    if int(np.asarray(streak)) < limit:  # under vmap the lax.cond runs as a select: the callback runs every step
        return
    raise stall_error(
        int(streak), float(scale), limit, "jnp.isfinite(loss), or run with jax.config.update('jax_debug_nans', True)",
        "  * a model pretrained in bfloat16 and run in float16, whose activations overflow 65504: "
        "run it in bfloat16 with loss_scale=1, or keep the overflowing layers in float32;\n"
        "  * gradients clipped or transformed *before* loss_scale_optimizer in an optax.chain.\n",
    )


def guard_skip(streak: jax.Array, scale: jax.Array, limit: int) -> None:
    """Raise on the host iff ``streak`` (skips in a row after this step) ``>= limit``; else no host code runs."""
    _call_back_if(streak >= limit, functools.partial(_raise, limit=limit), streak, scale)


def _call_back_if(pred: jax.Array, fn: Any, *args: Any) -> None:
    """``fn(*args)`` on the host where ``pred`` holds: a ``jax.debug.callback`` behind a ``lax.cond``."""
    lax.cond(pred, lambda: jax.debug.callback(fn, *args), lambda: None)


VMAP_HISTORY = (
    "history= does not support jax.vmap over the optimizer: every member would append its own row to the one "
    "History, N rows per step with their step numbers interleaved. Drop history= and record outside vmap: after "
    "each vmapped step, state.loss_scale and state.last_step_skipped hold one value per member (e.g. keep "
    "np.asarray(state.loss_scale) per step), or run each member's optimizer with its own History without vmap."
)


@custom_vmap
def _unbatched(finite: jax.Array) -> jax.Array:
    """``finite`` itself; traced under ``vmap`` with ``finite`` batched, raises :data:`VMAP_HISTORY` (at trace time,
    before anything runs: ``jax.debug.callback`` would run once per member)."""
    return finite


@_unbatched.def_vmap
def _unbatched_vmap(axis_size: int, in_batched: Any, finite: jax.Array) -> tuple[jax.Array, bool]:
    if any(jax.tree_util.tree_leaves(in_batched)):
        raise ValueError(VMAP_HISTORY)
    return finite, False


class Recorder:
    """Appends ``(step, scale used, skipped)`` and sampled statistics to a History, continuing its steps (loss: NaN).
    One ``jax.debug.callback`` per step, from the first device along the axes (across processes: device 0's)."""

    def __init__(self, history: Any) -> None:
        if history is True:
            raise TypeError(
                "history=True has nowhere to keep the record on JAX (an optax transformation has no attributes): "
                "pass your own, history = lossscale.History(); loss_scale_optimizer(inner, history=history)."
            )
        if not isinstance(history, History):
            raise TypeError(f"history must be a lossscale.History or None, got {type(history).__name__}.")
        self.history = history
        self._next = int(history.steps[-1]) + 1 if len(history) else 0

    def _append(self, scale: Any, finite: Any, sampled: Any = False, *columns: Any) -> None:
        step, self._next = self._next, self._next + 1
        stats = None
        if bool(np.asarray(sampled)):
            stats = {name: float(np.asarray(value)) for name, value in zip(STATS_COLUMNS, columns)}
        self.history.append(step, float(np.asarray(scale)), not bool(np.asarray(finite)), stats=stats)

    def record(
        self, scale: jax.Array, finite: jax.Array, axes: tuple[Hashable, ...] | None, sample: Any = None,
        sampled: Any = False,
    ) -> None:
        """Stages the callback (runs it, eagerly); ``sample`` and ``sampled``: the step's (with ``stats_every``)."""
        args: tuple[Any, ...] = (scale, _unbatched(finite))
        if sample is not None:
            args += (jnp.asarray(sampled), *(getattr(sample, name) for name in STATS_COLUMNS))
        if axes is None:
            jax.debug.callback(self._append, *args)
        else:
            _call_back_if(lax.axis_index(axes) == 0, self._append, *args)
