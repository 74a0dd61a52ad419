"""Diagnostics under ``jit``: ``history=`` and the stall guard, each a ``jax.debug.callback`` to the host. What is
done with the numbers there is the core's (:mod:`lossscale._diagnostics`); how they get there is this module's."""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap

from .._diagnostics import HistoryRecorder, StallGuard
from .._history import STATS_COLUMNS

__all__ = ["VMAP_HISTORY", "Recorder", "guard_skip", "stall_guard"]

#: The JAX words of the stall guard's message (:func:`lossscale._errors.stall_error`).
LOSS_CHECK = "jnp.isfinite(loss), or run with jax.config.update('jax_debug_nans', True)"
CAUSES = (
    "  * a model pretrained in bfloat16 and run in float16, whose activations overflow 65504: "
    "run it in bfloat16 with loss_scale=1, or keep the overflowing layers in float32;\n"
    "  * gradients clipped or transformed *before* loss_scale_optimizer in an optax.chain.\n"
)


def stall_guard(max_consecutive_skips: Any) -> StallGuard | None:
    """``max_consecutive_skips=`` validated into the core's guard with the JAX words (None: no guard).

    Raises:
        TypeError, ValueError: not None and not an int >= 1 (the error names the keyword).
    """
    if max_consecutive_skips is None:
        return None
    return StallGuard(max_consecutive_skips, loss_check=LOSS_CHECK, causes=CAUSES)


def _raise(streak: Any, scale: Any, *, guard: StallGuard) -> None:
    """The host side of :func:`guard_skip`. The guard checks the streak again: under ``vmap`` the ``lax.cond`` runs
    as a select, so the callback runs on every step, for every member."""
    guard.check(int(np.asarray(streak)), float(np.asarray(scale)))


def guard_skip(guard: StallGuard, streak: jax.Array, scale: jax.Array) -> None:
    """Raise on the host iff ``streak`` (skips in a row after this step) ``>= guard.limit``; else no host code runs
    (a ``jax.debug.callback`` behind a ``lax.cond``: on a GPU its predicate is read on the host on every step). JAX
    re-raises the error wrapped in its runtime error, at the latest when the step's results are read."""
    _call_back_if(streak >= guard.limit, functools.partial(_raise, guard=guard), streak, scale)


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


class Recorder(HistoryRecorder):
    """The core's :class:`~lossscale._diagnostics.HistoryRecorder` fed from inside ``jit``: :meth:`stage` stages one
    ``jax.debug.callback`` per step that appends ``(step, scale used, skipped)`` and, on a sampled step, the sample's
    columns (loss: NaN). Under ``pmap``/``shard_map`` only the first device along the axes calls back (across
    processes: the process holding device 0), so the History gets one row per step."""

    def _append_row(self, scale: Any, finite: Any, sampled: Any = False, *columns: Any) -> None:
        stats = None
        if bool(np.asarray(sampled)):
            stats = {name: float(np.asarray(value)) for name, value in zip(STATS_COLUMNS, columns)}
        self.append(float(np.asarray(scale)), not bool(np.asarray(finite)), stats=stats)

    def stage(
        self, scale: jax.Array, finite: jax.Array, axes: tuple[Hashable, ...] | None, sample: Any = None,
        sampled: Any = False,
    ) -> None:
        """Stages the step's row (runs it, eagerly).

        Args:
            scale: the scale the step's gradients were computed with.
            finite: the step's finite flag (the devices' common one under ``axes``).
            axes: the ``pmap``/``shard_map`` axes, or None.
            sample: with ``stats_every``, the kept sample after the step (a ``GradientStats``), else None.
            sampled: whether ``sample`` was taken on this step (True, or a 0-d bool array).
        """
        args: tuple[Any, ...] = (scale, _unbatched(finite))
        if sample is not None:
            args += (jnp.asarray(sampled), *(getattr(sample, name) for name in STATS_COLUMNS))
        if axes is None:
            jax.debug.callback(self._append_row, *args)
        else:
            _call_back_if(lax.axis_index(axes) == 0, self._append_row, *args)
