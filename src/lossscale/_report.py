"""``underflow_report``: which tensors float16 flushes, from one sample of ``gradient_stats`` (any binding)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._auto import AutoLossScale
from ._policy import LossScale
from ._stats import host_array

__all__ = ["UnderflowReport", "underflow_report"]


@dataclass(frozen=True, repr=False)
class UnderflowReport:
    """The tensors of one sample, worst first: the sample's ``step``, its overall values, ``rows`` of
    ``(name, zero_fraction, subnormal_fraction, headroom_bits)`` sorted by zero share, then subnormal share, and
    ``policy``: the loss scale of the optimizer the report was made from (its class name, ``"AutoLossScale"`` for
    ``loss_scale="auto"``, or ``"GradScaler"``), None when only a sample was given. The advice fits it: an optimizer
    on ``loss_scale="auto"`` is not told to use it. ``str()`` and ``repr()`` are the report's text."""

    step: int
    zero_fraction: float
    subnormal_fraction: float
    headroom_bits: float
    rows: tuple[tuple[str, float, float, float], ...]
    policy: str | None = None

    def __str__(self) -> str:
        lines = [(
            f"gradient statistics at step {self.step}: {100 * self.zero_fraction:.2f}% exactly zero, "
            f"{100 * self.subnormal_fraction:.2f}% below float16's smallest normal (2**-14), "
            f"headroom {self.headroom_bits:.1f} bits below float16's max"
        )]
        for name, zeros, subnormal, headroom in self.rows:
            lines.append(f"  {name}: {100 * zeros:.2f}% zero, {100 * subnormal:.2f}% subnormal, headroom {headroom:.1f} bits")
        if self.zero_fraction > 0.01:
            lines.append(_advice(self.policy))
        return "\n".join(lines)

    # A report shown in a REPL or notebook cell is read, not inspected: the same text as print() shows.
    __repr__ = __str__


def _advice(policy: str | None) -> str:
    """What to do about more than 1% zeros, for the loss scale the user already has."""
    if policy == AutoLossScale.__name__:
        return (
            "More than 1% of the gradients are zero, with loss_scale='auto' already setting the scale so that the "
            "smallest tensors stay in float16's normal range: these zeros are most likely true zeros (dead ReLUs, "
            "unused embedding rows, masked inputs), not underflow. Compare a float32 run: zeros it has too, no loss "
            "scale removes."
        )
    if policy == "GradScaler":
        return (
            "More than 1% of the gradients are zero: if these zeros are float16 underflow (compare a float32 run; "
            "zeros it has too are true zeros, e.g. dead ReLUs), raise init_scale, or use "
            "lossscale.torch.LossScaleOptimizer(..., loss_scale='auto') (experimental; GradScaler has no loss_scale=)."
        )
    return (
        "More than 1% of the gradients are zero: if these zeros are float16 underflow (compare a float32 run; zeros "
        "it has too are true zeros, e.g. dead ReLUs), raise the loss scale, or use loss_scale='auto' (experimental)."
    )


def _policy_name(holder: Any) -> str | None:
    """The loss scale ``holder`` follows, by name (see :class:`UnderflowReport`), or None when it cannot say."""
    if holder is None:
        return None
    if type(holder).__name__ == "GradScaler":
        return "GradScaler"
    policy = getattr(holder, "loss_scale_policy", None)  # torch's and Keras's LossScaleOptimizer
    if isinstance(policy, LossScale):
        return type(policy).__name__
    sampler = getattr(holder, "stats", None)  # a JAX state: its sampler state holds an auto state iff "auto"
    if getattr(sampler, "auto", None) is not None:
        return AutoLossScale.__name__
    return None


def _find_holder(obj: Any, depth: int = 0) -> Any:
    """The object with ``gradient_stats`` in ``obj``: ``obj`` itself, a flax ``TrainState``'s or an
    ``nnx.Optimizer``'s ``opt_state``, or the one element of a tuple state (an ``optax.chain``'s) that has it."""
    if hasattr(obj, "gradient_stats") or depth > 16:
        return obj if hasattr(obj, "gradient_stats") else None
    inner = getattr(obj, "opt_state", None)
    if inner is not None:
        return _find_holder(inner, depth + 1)
    if isinstance(obj, (tuple, list)):
        found = [h for h in (_find_holder(x, depth + 1) for x in obj) if h is not None]
        if len(found) > 1:
            raise ValueError(
                f"stats holds {len(found)} loss scale optimizers' states; pass the one you mean (e.g. "
                "lossscale.jax.find_state(...) of the part whose gradients you want reported)."
            )
        return found[0] if found else None
    return None


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
        stats: a binding's ``gradient_stats``, or the optimizer or ``GradScaler`` (on JAX its state, or a flax
            ``TrainState`` or other object whose ``opt_state`` holds it): errors then say when a sample comes, and
            the advice fits the optimizer's loss scale.
        top: how many tensors to list.
        names: tensor names in the order of the sampled gradients, overriding ``stats["per_tensor"]["names"]`` (e.g.
            ``lossscale.jax.tensor_names(params)``; on torch the parameters with a gradient, in ``param_groups`` order).

    Cost: one transfer of the sample to the host (a host sync). Typical use: ``print(underflow_report(opt))``;
    ``str()`` of the report is its text.

    Raises:
        TypeError: ``stats`` is not a sample, or the optimizer records none (no ``stats_every``).
        ValueError: no sample yet (saying when the first comes), a bad ``top``, or ``names`` of the wrong length.
    """
    holder = None
    found = None if isinstance(stats, Mapping) or stats is None else _find_holder(stats)
    if found is not None:
        holder, stats = found, found.gradient_stats
        if stats is None and getattr(holder, "_stats_progress", lambda: None)() is None:
            raise TypeError(
                f"This {type(holder).__name__} records no gradient statistics: build the optimizer with "
                "stats_every=N (e.g. stats_every=100) to sample them every N-th step."
            )
    if stats is None:
        raise (ValueError if holder is not None else TypeError)(_no_sample(holder, None))
    if not isinstance(stats, Mapping) or "per_tensor" not in stats:
        raise TypeError(
            "stats must be an optimizer's gradient_stats mapping (with 'per_tensor'), the optimizer or GradScaler "
            "itself, or on JAX its state (what init() or update() returned, or a flax TrainState holding it); got "
            f"{type(stats).__name__}."
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
        policy=_policy_name(holder),
    )
