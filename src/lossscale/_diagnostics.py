"""The host side of the opt-in diagnostics, written once for every binding: ``history=`` and the stall guard.

A binding decides only how a step's numbers reach the host (torch: device rows copied every 100 steps, and a CUDA
copy read a step late; JAX: a ``jax.debug.callback``; Keras: ``on_host``); what is done with them is here. Numpy
only: no framework is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._errors import check_skip_limit, stall_error
from ._history import History

__all__ = ["HistoryRecorder", "StallGuard", "check_history"]


def check_history(history: Any) -> History | None:
    """``history=`` as every binding accepts it.

    Args:
        history: ``True`` (record into a new :class:`~lossscale.History`), ``False`` or ``None`` (off), or a
            ``History`` to append to (a resumed run continues its steps).

    Returns:
        The ``History`` to record into, or None when off.

    Raises:
        TypeError: anything else.

    >>> check_history(True)
    History(empty)
    >>> check_history(False) is None
    True
    """
    if history is True:
        return History()
    if history is None or history is False:
        return None
    if not isinstance(history, History):
        raise TypeError(
            "history must be a lossscale.History, True (a new one) or False/None (off), "
            f"got {type(history).__name__}."
        )
    return history


class HistoryRecorder:
    """Appends each step's row to a :class:`~lossscale.History`, numbering steps after the last one recorded.

    Args:
        history: the ``History`` to append to (see :func:`check_history`).

    Attributes:
        history: that ``History``.
        next_step: the number the next row gets when the caller gives none: the History's last step + 1, or 0.
    """

    def __init__(self, history: History) -> None:
        if not isinstance(history, History):
            raise TypeError(f"history must be a lossscale.History, got {type(history).__name__}.")
        self.history = history
        self.next_step = int(history.steps[-1]) + 1 if len(history) else 0

    def append(
        self, loss_scale: float, skipped: bool, loss: float | None = None,
        stats: Mapping[str, float] | None = None, *, step: int | None = None,
    ) -> None:
        """Records one step.

        Args:
            loss_scale: the scale the step's gradients were computed with.
            skipped: whether the step was skipped.
            loss: the unscaled loss, or None (stored as NaN).
            stats: the step's sampled statistics by column name, or None on an unsampled step.
            step: the step's number; None: :attr:`next_step`.

        Raises:
            ValueError: ``step`` is not after the last step recorded.
        """
        number = self.next_step if step is None else int(step)
        self.history.append(number, float(loss_scale), bool(skipped), loss, stats)
        self.next_step = number + 1

    def extend(
        self, loss_scales: Any, skipped: Any, losses: Any = None, stats: Mapping[str, Any] | None = None, *,
        steps: Any = None,
    ) -> None:
        """Records a batch of steps (array-likes of equal length); ``steps`` None numbers them from
        :attr:`next_step`. See :meth:`lossscale.History.extend` for the columns and what it raises."""
        scales = np.asarray(loss_scales, dtype=np.float64).reshape(-1)
        numbers = (np.arange(self.next_step, self.next_step + len(scales)) if steps is None
                   else np.asarray(steps, dtype=np.int64).reshape(-1))
        self.history.extend(numbers, scales, skipped, losses, stats)
        if len(numbers):
            self.next_step = int(numbers[-1]) + 1


class StallGuard:
    """Raises :class:`~lossscale.LossScaleError` once ``max_consecutive_skips`` steps in a row were skipped.

    Args:
        max_consecutive_skips: the limit, an int >= 1.
        loss_check: how to check the loss for NaN in this framework (it goes into the message).
        causes: further likely causes in this framework, bullet lines ending in a newline.
        see: a diagnostic the user could pass, ending in ``"or "`` (None: none).

    Raises:
        TypeError, ValueError: ``max_consecutive_skips`` is not an int >= 1.
    """

    def __init__(self, max_consecutive_skips: Any, *, loss_check: str, causes: str, see: str | None = None) -> None:
        limit = check_skip_limit(max_consecutive_skips)
        if limit is None:
            raise TypeError("StallGuard needs a limit; max_consecutive_skips=None means no guard at all.")
        self.limit: int = limit
        self.loss_check, self.causes, self.see = loss_check, causes, see or ""

    def check(self, consecutive_skips: int, loss_scale: float) -> None:
        """Raises iff ``consecutive_skips >= limit``; ``loss_scale`` is the scale after the step (in the message).

        Raises:
            LossScaleError: training has stalled; the message names the likely causes and how to turn the check off.
        """
        if int(consecutive_skips) >= self.limit:
            raise stall_error(int(consecutive_skips), float(loss_scale), self.limit, self.loss_check, self.causes,
                              self.see)
