"""Opt-in per-step work on the host: the :class:`lossscale.History` record and the stall guard.

Recording only: what is recorded and when the guard raises is the core's (:mod:`lossscale._diagnostics`); this
room decides how a step's numbers reach the host from each backend's step (:func:`on_host`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
from keras import ops

from .. import History, LossScaleError
from .._diagnostics import HistoryRecorder, StallGuard, check_history
from .._errors import check_skip_limit
from .._history import STATS_COLUMNS
from ._compat import is_jax_tracer

__all__ = ["StepObserver", "is_symbolic", "on_host"]


def is_symbolic(x: Any) -> bool:
    """Whether ``x`` is being traced (a ``tf.function`` graph tensor, a JAX tracer), so not readable on the host.

    Args:
        x: a tensor or value of the current backend.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return not tf.executing_eagerly()
    if backend == "jax":
        return is_jax_tracer(x)
    return False


def on_host(fn: Callable[..., None], *args: Any, every_device: bool = False) -> None:
    """Calls ``fn`` with ``args`` as numpy values: now when they are concrete, else from the compiled step.

    Inside ``tf.function`` a ``tf.py_function`` op, under ``jax.jit`` an ordered ``jax.debug.callback``: one
    device-to-host transfer per call.

    Args:
        fn: the host function (returns nothing).
        *args: tensors of the step.
        every_device: on several JAX devices, call ``fn`` once per device (``fn`` must be stateless): a raise then
            stops every device's program, none left waiting in a collective. Otherwise once per step.
    """
    if not any(is_symbolic(a) for a in args):
        fn(*(ops.convert_to_numpy(a) for a in args))
        return
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        def run(*tensors: Any) -> list[Any]:
            fn(*(t.numpy() for t in tensors))
            return []

        tf.py_function(run, list(args), Tout=[])
        return
    import jax

    if jax.device_count() == 1:
        jax.debug.callback(fn, *args, ordered=True)
    elif every_device:  # ``fn`` stateless: a raise stops every device's program
        jax.debug.callback(fn, *args, partitioned=True)
    else:  # ordered effects are refused over several devices; this runs once per step
        jax.debug.callback(fn, *args)


#: Keras's words in the stall guard's message (the core's :func:`lossscale._errors.stall_error`).
_LOSS_CHECK = "keras.ops.isfinite(loss)"
_CAUSES = (
    "  * activations that overflow float16's 65504: keep those layers in float32 (dtype='float32'), "
    "or train in mixed_bfloat16 with loss_scale=1;\n"
    "  * gradients of the unscaled loss applied as if scaled, or the reverse (see docs/keras.md, "
    "'Two gradient contracts').\n"
)


class StepObserver:
    """Hands each step's numbers to the core's :class:`~lossscale._diagnostics.HistoryRecorder` and
    :class:`~lossscale._diagnostics.StallGuard` on the host (:func:`on_host`); the logic is theirs.

    Losses are recorded where the step runs eagerly; a compiled step records NaN.

    Args:
        history: ``history=`` as the core's :func:`~lossscale._diagnostics.check_history` takes it (True, a
            :class:`lossscale.History`, False/None).
        max_consecutive_skips: the stall guard's limit, or None (off).

    Raises:
        TypeError, ValueError: a ``history`` or ``max_consecutive_skips`` the core refuses.
    """

    def __init__(self, history: Any = None, max_consecutive_skips: int | None = None) -> None:
        history = check_history(history)
        limit = check_skip_limit(max_consecutive_skips)
        self.guard = None if limit is None else StallGuard(limit, loss_check=_LOSS_CHECK, causes=_CAUSES)
        self.history = history
        self._loss: Any = None
        self._defer = False
        self._pending: LossScaleError | None = None

    @property
    def max_consecutive_skips(self) -> int | None:
        """The stall guard's limit (None: off)."""
        return None if self.guard is None else self.guard.limit

    @property
    def history(self) -> History | None:
        """The record (None: off); setting it also sets ``active``, a plain attribute the step reads for free."""
        return None if self._recorder is None else self._recorder.history

    @history.setter
    def history(self, history: History | None) -> None:
        self._recorder = None if history is None else HistoryRecorder(history)
        self.active = history is not None or self.guard is not None

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Around an eager call of a compiled JAX step: the stall guard's error is held and raised on leaving, after
        the step's callbacks, as itself rather than wrapped in JAX's runtime error. Cost: waits for the step's
        callbacks (one sync)."""
        self._defer = True
        try:
            yield
            if keras.backend.backend() == "jax":
                import jax

                jax.effects_barrier()
        finally:
            self._defer = False
        pending, self._pending = self._pending, None
        if pending is not None:
            raise pending

    def note_loss(self, loss: Any) -> None:
        """Keeps a concrete (eager) 1-element loss for the next recorded step (a traced one is not readable: NaN).

        Args:
            loss: the loss given to ``get_scaled_loss``/``scale_loss``.
        """
        if self.history is not None and not is_symbolic(loss) and int(np.prod(getattr(loss, "shape", ()))) == 1:
            self._loss = ops.stop_gradient(loss)

    def observe(self, scale_used: Any, finite: Any, new: Any, measured: Any = None, kept: Any = None) -> None:
        """Once per step: the record, and the guard (stateless: every JAX device raises); nothing when neither is
        on (no op added to a traced step).

        Args:
            scale_used: the scale the step's gradients were computed with.
            finite: whether they were all finite (the step was applied).
            new: the :class:`~lossscale.LossScaleState` after the step (its ``consecutive_skips`` and
                ``loss_scale`` go to the guard).
            measured: the step's :class:`._stats.Measurement` with ``stats_every``, else None.
            kept: the sample kept after the step (with ``measured``): its columns go to the History on a sampled step.

        Cost: one transfer of these scalars to the host per step (traced: a callback from the compiled step).
        """
        if self.history is not None:
            stats = () if measured is None else (measured.sampled, kept.headroom_bits, kept.zero_fraction,
                                                 kept.subnormal_fraction)
            on_host(self._append, scale_used, finite, *stats)
        if self.guard is not None:
            on_host(self._guard, new.consecutive_skips, new.loss_scale, every_device=True)

    def _append(self, scale_used: Any, finite: Any, sampled: Any = False, *stats: Any) -> None:
        loss, self._loss = self._loss, None
        loss_value = None if loss is None else float(np.asarray(ops.convert_to_numpy(loss), np.float64).reshape(()))
        if self._recorder is not None:
            columns = dict(zip(STATS_COLUMNS, map(float, stats)))
            self._recorder.append(float(scale_used), not bool(finite), loss_value, columns if sampled else None)

    def _guard(self, consecutive_skips: Any, new_scale: Any) -> None:
        if self.guard is None:
            return
        try:
            self.guard.check(int(consecutive_skips), float(new_scale))
        except LossScaleError as error:
            if not self._defer:
                raise
            self._pending = self._pending or error
