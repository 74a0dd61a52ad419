"""Opt-in per-step work on the host: the :class:`lossscale.History` record and the stall guard."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from numbers import Integral
from typing import Any

import numpy as np
from keras import ops
from keras.backend import backend as keras_backend

from .. import History, LossScaleError
from .._history import STATS_COLUMNS
from ._backend import is_symbolic, on_host

__all__ = ["StepObserver"]


class StepObserver:
    """Records each step in a :class:`lossscale.History` and/or raises after too many skips in a row.

    Off (no cost) unless ``history`` or ``max_consecutive_skips`` is set. On,
    each step passes three scalars to the host: directly in eager code (one
    sync), through ``tf.py_function``/``jax.debug.callback`` in compiled
    steps. Losses are recorded when :meth:`note_loss` got a concrete one
    (eager code); compiled steps record NaN.
    """

    def __init__(self, history: Any = None, max_consecutive_skips: int | None = None) -> None:
        if history is None or history is False:
            self.history: History | None = None
        elif history is True:
            self.history = History()
        elif isinstance(history, History):
            self.history = history
        else:
            raise TypeError(f"history must be True, False/None or a lossscale.History, got {type(history).__name__}.")
        if max_consecutive_skips is not None:
            if isinstance(max_consecutive_skips, bool) or not isinstance(max_consecutive_skips, Integral):
                raise TypeError(f"max_consecutive_skips must be an int or None, got {max_consecutive_skips!r}.")
            if max_consecutive_skips < 1:
                raise ValueError(
                    f"max_consecutive_skips must be at least 1 (or None to disable), got {max_consecutive_skips}."
                )
            max_consecutive_skips = int(max_consecutive_skips)
        self.max_consecutive_skips = max_consecutive_skips
        self._step = 0
        self._loss: Any = None
        self._defer = False
        self._pending: LossScaleError | None = None

    @property
    def active(self) -> bool:
        return self.history is not None or self.max_consecutive_skips is not None

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Within the block the stall guard's error is held, and raised on leaving it, after the step's callbacks.

        For an eager call that runs a compiled step (JAX ``apply``): raised from
        a host callback inside the step, :class:`lossscale.LossScaleError`
        would reach the caller wrapped in the framework's runtime error; held
        and raised here, it reaches the caller as itself. Cost when on: waits
        for the step's callbacks (one sync).
        """
        if not self.active:
            yield
            return
        self._defer = True
        try:
            yield
            if keras_backend() == "jax":
                import jax

                jax.effects_barrier()
        finally:
            self._defer = False
        pending, self._pending = self._pending, None
        if pending is not None:
            raise pending

    def note_loss(self, loss: Any) -> None:
        """Keeps a concrete (eager) 1-element loss for the next recorded step."""
        if self.history is not None and not is_symbolic(loss) and int(np.prod(getattr(loss, "shape", ()))) == 1:
            self._loss = ops.stop_gradient(loss)

    def observe(
        self, scale_used: Any, finite: Any, consecutive_skips: Any, new_scale: Any, stats: tuple[Any, ...] = ()
    ) -> None:
        """Called once per step with the scale the step used, its finite flag and the new state.

        Two host calls: the record (never raises) and the guard (stateless, so
        that on several JAX devices each device's copy can run it and raise
        together instead of leaving the others waiting in a collective).
        """
        if self.history is not None:  # ``stats``: (sampled, headroom_bits, zero_fraction, subnormal_fraction)
            on_host(self._record, scale_used, finite, *stats)
        if self.max_consecutive_skips is not None:
            on_host(self._guard, consecutive_skips, new_scale, every_device=True)

    def _record(self, scale_used: Any, finite: Any, sampled: Any = False, *stats: Any) -> None:
        step, self._step = self._step, self._step + 1
        loss, self._loss = self._loss, None
        loss_value = None if loss is None else float(np.asarray(ops.convert_to_numpy(loss), np.float64).reshape(()))
        if self.history is not None:
            columns = dict(zip(STATS_COLUMNS, map(float, stats)))
            self.history.append(step, float(scale_used), not bool(finite), loss_value, columns if sampled else None)

    def _guard(self, consecutive_skips: Any, new_scale: Any) -> None:
        limit = self.max_consecutive_skips
        if limit is not None and int(consecutive_skips) >= limit:
            error = LossScaleError(
                f"{int(consecutive_skips)} steps in a row were skipped because gradients held NaN or Inf (loss "
                f"scale now {float(new_scale):g}; max_consecutive_skips={limit}). Lowering the scale has not helped, "
                "so the cause is likely not an overflow of the scaled loss:\n"
                "  * a NaN in the loss itself (bad inputs or labels, log(0), 0/0): check keras.ops.isfinite(loss);\n"
                "  * a learning rate too high, so the weights diverged: lower it or add warm-up;\n"
                "  * activations that overflow float16's 65504: keep those layers in float32 (dtype='float32'), "
                "or train in mixed_bfloat16 with loss_scale=1;\n"
                "  * gradients of the unscaled loss applied as if scaled, or the reverse (see docs/keras.md, "
                "'Two gradient contracts').\n"
                "Pass max_consecutive_skips=None to disable this check."
            )
            if not self._defer:
                raise error
            self._pending = self._pending or error
