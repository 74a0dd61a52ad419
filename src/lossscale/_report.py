"""``underflow_report``: which tensors float16 flushes, from one sample of ``gradient_stats`` (any binding)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._stats import host_array

__all__ = ["UnderflowReport", "underflow_report"]


@dataclass(frozen=True)
class UnderflowReport:
    """The tensors of one sample, worst first: the sample's ``step``, its overall values, and ``rows`` of
    ``(name, zero_fraction, subnormal_fraction, headroom_bits)`` sorted by zero share, then subnormal share."""

    step: int
    zero_fraction: float
    subnormal_fraction: float
    headroom_bits: float
    rows: tuple[tuple[str, float, float, float], ...]

    def __str__(self) -> str:
        lines = [(
            f"gradient statistics at step {self.step}: {100 * self.zero_fraction:.2f}% exactly zero, "
            f"{100 * self.subnormal_fraction:.2f}% below float16's smallest normal (2**-14), "
            f"headroom {self.headroom_bits:.1f} bits below float16's max"
        )]
        for name, zeros, subnormal, headroom in self.rows:
            lines.append(f"  {name}: {100 * zeros:.2f}% zero, {100 * subnormal:.2f}% subnormal, headroom {headroom:.1f} bits")
        if self.zero_fraction > 0.01:
            lines.append(
                "More than 1% of the gradients are zero: if these zeros are float16 underflow (compare a float32 "
                "run), raise the loss scale, or use loss_scale='auto' (experimental)."
            )
        return "\n".join(lines)


def _no_sample(holder: Any, step: int | None) -> str:
    """Why there is no sample to report, and when the first one comes."""
    progress = getattr(holder, "_stats_progress", None)
    every, done = progress() if callable(progress) else (None, None)
    if every is not None and done is not None:
        first = -(-done // every) * every  # the next step count that is a multiple of stats_every
        return (
            f"No gradient statistics sample yet: with stats_every={every} the first sample is taken at step {first}; "
            f"{done} step{'' if done == 1 else 's'} so far. Call underflow_report after that step."
        )
    if step == -1:
        return (
            "stats holds no sample yet (step -1): the first sample is taken at the first step (step 0), then "
            "every stats_every-th step. Call underflow_report after a training step."
        )
    return (
        "stats is None: no gradient statistics sample. Either the optimizer records none (pass stats_every=N to "
        "it), or no sample was taken yet: the first is taken at the first step (step 0), then every N-th step. "
        "Pass the optimizer itself, underflow_report(opt), to be told which."
    )


def underflow_report(stats: Any, top: int = 10, names: Sequence[str] | None = None) -> UnderflowReport:
    """The ``top`` tensors that lose the most to underflow in ``stats`` (an optimizer's ``gradient_stats``).

    Args:
        stats: a binding's ``gradient_stats``, or the optimizer or ``GradScaler``: errors then say when a sample comes.
        top: how many tensors to list.
        names: tensor names in the order of the sampled gradients, overriding ``stats["per_tensor"]["names"]`` (e.g.
            ``lossscale.jax.tensor_names(params)``; on torch the parameters with a gradient, in ``param_groups`` order).

    Cost: one transfer of the sample to the host (a host sync). Typical use: ``print(underflow_report(opt))``.

    Raises:
        TypeError: ``stats`` is not a sample, or the optimizer records none (no ``stats_every``).
        ValueError: no sample yet (saying when the first comes), a bad ``top``, or ``names`` of the wrong length.
    """
    holder = None
    if not isinstance(stats, Mapping) and hasattr(stats, "gradient_stats"):
        holder, stats = stats, stats.gradient_stats
        if stats is None and getattr(holder, "_stats_progress", lambda: None)() is None:
            raise TypeError(
                f"This {type(holder).__name__} records no gradient statistics: build the optimizer with "
                "stats_every=N (e.g. stats_every=100) to sample them every N-th step."
            )
    if stats is None:
        raise (ValueError if holder is not None else TypeError)(_no_sample(holder, None))
    if not isinstance(stats, Mapping) or "per_tensor" not in stats:
        raise TypeError(
            "stats must be an optimizer's gradient_stats mapping (with 'per_tensor') or the optimizer itself; got "
            f"{type(stats).__name__}. Pass stats_every=N to the optimizer to record it."
        )
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive int, got {top!r}.")
    step = int(host_array(stats["step"], np.float64))
    if step < 0:
        raise ValueError(_no_sample(holder, step))
    per = stats["per_tensor"]
    zeros, subnormal, headroom = (
        host_array(per[k], np.float64) for k in ("zero_fraction", "subnormal_fraction", "headroom_bits")
    )
    labels = tuple(per["names"] if names is None else names)
    if len(labels) != len(zeros):
        raise ValueError(f"names must name each of the {len(zeros)} tensors, got {len(labels)}.")
    order = sorted(range(len(zeros)), key=lambda i: (-zeros[i], -subnormal[i]))[:top]
    return UnderflowReport(
        step=step,
        zero_fraction=float(host_array(stats["zero_fraction"], np.float64)),
        subnormal_fraction=float(host_array(stats["subnormal_fraction"], np.float64)),
        headroom_bits=float(host_array(stats["headroom_bits"], np.float64)),
        rows=tuple((labels[i], float(zeros[i]), float(subnormal[i]), float(headroom[i])) for i in order),
    )
