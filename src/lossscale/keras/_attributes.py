"""TF's read-only attributes of :class:`LossScaleOptimizer`: its policy, and its state as tensors.

A mixin over the two attributes the optimizer sets in ``__init__``:
``_policy`` (the :class:`lossscale.LossScale` followed) and ``_scale`` (its
:class:`ScaleState`). Reading an attribute copies nothing and syncs nothing
(the tensors are the variables' current values).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from .. import LossScale
from .._resolve import stable_form

__all__ = ["ScaleAttributes"]


def _state(name: str, doc: str) -> property:
    """A read-only attribute of the scale state (:class:`ScaleState`'s property ``name``)."""
    return property(lambda self: getattr(self._scale, name), doc=doc)


class ScaleAttributes:
    """``dynamic``, ``initial_scale``, ``dynamic_growth_steps``, ``loss_scale`` and the state's counters."""

    _policy: LossScale
    _scale: Any

    @property
    def dynamic(self) -> bool:
        """Whether the loss scale changes during training."""
        return self._scale.params.dynamic

    @property
    def initial_scale(self) -> float:
        """The initial loss scale (the only one, when fixed)."""
        return self._scale.params.initial_scale

    @property
    def dynamic_growth_steps(self) -> int | None:
        """Finite steps in a row before the scale grows, or None if fixed."""
        return stable_form(self._policy)["dynamic_growth_steps"]

    @property
    def loss_scale_policy(self) -> LossScale:
        """The :class:`lossscale.LossScale` followed."""
        return self._policy

    loss_scale = _state("loss_scale", "The current loss scale, a 0-d float32 tensor (no sync until converted).")
    dynamic_counter = _state(
        "dynamic_counter", "Finite steps since the scale last changed (0-d int32), or None if fixed."
    )
    skipped_steps = _state("skipped_steps", "Steps skipped so far, a 0-d int32 tensor (saturating; saved).")
    consecutive_skips = _state("consecutive_skips", "Steps skipped in a row up to the last one (0-d int32).")
    last_step_skipped = _state("last_step_skipped", "Whether the last step was skipped, a 0-d bool tensor.")

    @property
    def stats_every(self) -> int | None:
        """Measure the gradients every N-th apply (None: off)."""
        return None if self._scale.stats is None else self._scale.stats.every

    @property
    def gradient_stats(self) -> dict[str, Any] | None:
        """The latest sample of ``stats_every`` (None when off or before build): 0-d and ``(T,)`` tensors.

        Keys ``step`` (-1 before the first sample), ``amax``, ``headroom_bits``,
        ``zero_fraction``, ``subnormal_fraction``, ``rms_min`` and ``per_tensor``
        (``names``: the variables' paths). No copy, no host sync.
        """
        return None if self._scale.stats is None else self._scale.stats.mapping()

    def _stats_progress(self) -> tuple[int, int] | None:
        """``(stats_every, applies so far)`` for ``lossscale.underflow_report``'s errors; None when off (host read)."""
        stats = self._scale.stats
        if stats is None:
            return None
        return stats.every, int(np.asarray(keras.ops.convert_to_numpy(stats.count))) if stats.built else 0

    @property
    def history(self) -> Any:
        """The :class:`lossscale.History` being recorded, or None."""
        return self._scale.observer.history
