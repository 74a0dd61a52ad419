"""``history=``: one row per step in a :class:`lossscale.History`, written on the host by a JAX callback."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._history import STATS_COLUMNS, History

__all__ = ["StepRecorder", "recorder_for"]


class StepRecorder:
    """Appends ``(step, loss_scale used, skipped)``, and with ``stats_every`` the sample's columns, to a History.

    The step numbers count the steps this transformation recorded, after
    the last one already in the history (0 for an empty one). Losses are not
    seen by ``update`` and are recorded as NaN.

    Cost: one ``jax.debug.callback`` per step, outside the skip branch: a
    device-to-host copy of two scalars and a Python call on the host
    (``History.append``, about 40 us). JAX's callback machinery dominates:
    on a loaded 2-core CPU it added 0.4-1.7 ms per step even as a no-op,
    and ``history=`` took a 1,000-parameter Adam step from 0.1 to 1.3-1.8 ms
    (``benchmarks/bench_jax_history.py``). Off (``history=None``), nothing
    is staged.

    Under ``pmap``/``shard_map`` (with ``axis_name``) only the first device
    along the axes calls back; under ``jit`` over sharded arrays JAX runs
    the callback once, on the process that holds device 0.
    """

    def __init__(self, history: History) -> None:
        self.history = history
        self._next = int(history.steps[-1]) + 1 if len(history) else 0

    def _append(self, scale: Any, finite: Any, sampled: Any = False, *columns: Any) -> None:
        step, self._next = self._next, self._next + 1
        stats = None
        if bool(np.asarray(sampled)):  # the History's stats columns, from this step's sample
            stats = {name: float(np.asarray(value)) for name, value in zip(STATS_COLUMNS, columns)}
        self.history.append(step, float(np.asarray(scale)), not bool(np.asarray(finite)), stats=stats)

    def record(
        self, scale: jax.Array, finite: jax.Array, axes: tuple[Hashable, ...] | None, measured: Any = None
    ) -> None:
        """Stages the callback (under ``jit``) or runs it (eagerly).

        ``measured``: ``(sampled, sample)`` with ``stats_every``: a sampled step's row carries the sample's
        ``headroom_bits``, ``zero_fraction`` and ``subnormal_fraction`` (three more scalars to the host).
        """
        args: tuple[Any, ...] = (scale, finite)
        if measured is not None:
            sampled, sample = measured
            args += (jnp.asarray(sampled), *(getattr(sample, name) for name in STATS_COLUMNS))
        if axes is None:
            jax.debug.callback(self._append, *args)
        else:
            lax.cond(
                lax.axis_index(axes) == 0,
                lambda: jax.debug.callback(self._append, *args),
                lambda: None,
            )


def recorder_for(history: Any) -> StepRecorder | None:
    """The recorder for the ``history`` keyword (None/False: off), or a TypeError naming the fix."""
    if history is None or history is False:
        return None
    if history is True:
        raise TypeError(
            "history=True has nowhere to keep the record on JAX (an optax transformation has no attributes): "
            "pass your own, history = lossscale.History(); loss_scale_optimizer(inner, history=history)."
        )
    if not isinstance(history, History):
        raise TypeError(f"history must be a lossscale.History or None, got {type(history).__name__}.")
    return StepRecorder(history)
