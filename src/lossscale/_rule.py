"""The one scale-update rule over an array namespace ``xp`` (numpy, torch, jax.numpy, keras.ops): arithmetic,
comparisons and ``xp.where`` only, so no host sync and traceable under ``jax.jit`` and ``torch.compile``.
A binding does not call it directly: :func:`lossscale._advance.advance` applies it, and
:func:`lossscale._advance.advance_in_place` runs the same arithmetic on numpy scalars on the host (through
:data:`HOST_SCALARS`, about 5x less overhead than numpy's 0-d arrays)."""

from __future__ import annotations

import contextlib
import math
from typing import Any, NamedTuple

import numpy as np

from ._policy import COUNTER_MAX, LossScale, RuleParams

__all__ = ["COUNTER_MAX", "HOST_SCALARS", "KernelForm", "LossScaleState", "count_up", "initial_state", "kernel_form",
           "next_state", "skip_counters"]


class LossScaleState(NamedTuple):
    """The state of a loss scale: five 0-d arrays.

    Attributes:
        loss_scale: float32, the current scale ``S``.
        good_steps: int32, finite steps since the scale last changed (TF's ``dynamic_counter``).
        bad_steps: int32, non-finite steps since the scale last changed (0 when ``hysteresis == 1``).
        skipped_steps: int32, all steps skipped so far (saturating).
        consecutive_skips: int32, non-finite steps in a row (the last step was skipped iff positive).
    """

    loss_scale: Any
    good_steps: Any
    bad_steps: Any
    skipped_steps: Any
    consecutive_skips: Any


def initial_state(policy: LossScale | RuleParams, xp: Any, **array_kwargs: Any) -> LossScaleState:
    """The state at step 0, as ``xp`` arrays: the policy's initial scale, every counter 0.

    Args:
        policy: a :class:`LossScale` or its :class:`RuleParams`.
        xp: the array namespace (numpy, torch, jax.numpy, ``keras.ops``).
        **array_kwargs: passed to ``xp.asarray``, e.g. ``device=``.

    Returns:
        A :class:`LossScaleState` of five 0-d arrays.
    """
    params = policy if isinstance(policy, RuleParams) else policy.rule_params()
    scale = xp.asarray(params.initial_scale, dtype=xp.float32, **array_kwargs)
    return LossScaleState(scale, *(xp.asarray(0, dtype=xp.int32, **array_kwargs) for _ in range(4)))


def next_state(policy: LossScale | RuleParams, state: LossScaleState, finite: Any, xp: Any) -> LossScaleState:
    """The state after one step whose gradients were all finite iff ``finite``.

    Args:
        policy: a :class:`LossScale` or its :class:`RuleParams`.
        state: the current :class:`LossScaleState`.
        finite: a 0-d bool array of ``xp`` or a Python/numpy bool, False if any gradient held NaN or +-Inf;
            anything else raises ``TypeError`` (``~1`` is ``-2``, not False).
        xp: the array namespace of ``state`` (numpy, torch, jax.numpy, or ``keras.ops`` on TensorFlow tensors).

    Cost: about 20 scalar element-wise ops on 0-d arrays; no host sync.

    The rule is :class:`~lossscale.DynamicLossScale`'s, in :class:`RuleParams`' terms (a backoff is
    ``S <- max(S * backoff_multiplier / backoff_divisor, min_scale)``); fixed policies keep the scale and
    ``good_steps``/``bad_steps``.
    The skip counters move in every mode: the step is skipped iff not finite.

    >>> import numpy as np
    >>> from lossscale import DynamicLossScale
    >>> p = DynamicLossScale(1, 2, 2)
    >>> s = initial_state(p, np)
    >>> scales = []
    >>> for _ in range(6):
    ...     s = next_state(p, s, np.asarray(True), np)
    ...     scales.append(float(s.loss_scale))
    >>> scales
    [1.0, 2.0, 2.0, 4.0, 4.0, 8.0]
    """
    params = policy if isinstance(policy, RuleParams) else policy.rule_params()
    finite = _finite_flag(finite, state.loss_scale, xp)
    # A refused growth computes an inf on purpose; numpy would warn about it.
    quiet = xp.errstate(over="ignore") if hasattr(xp, "errstate") else contextlib.nullcontext()
    with quiet:
        return _next_state(params, state, finite, xp)


def _finite_flag(finite: Any, like: Any, xp: Any) -> Any:
    """``finite`` as a 0-d bool array of ``xp`` (on ``like``'s device), or a TypeError naming the fix."""
    if isinstance(finite, (bool, np.bool_)):
        # Not xp.asarray(finite): full_like puts it on the state's device (torch, JAX) and traces under jit.
        return xp.full_like(like, bool(finite), dtype=xp.bool)
    dtype = getattr(finite, "dtype", None)
    if dtype is None or "bool" not in str(dtype):
        got = f"dtype {dtype}" if dtype is not None else f"{type(finite).__name__} {finite!r}"
        raise TypeError(
            f"finite must be a bool or a 0-d bool array (True: every gradient finite), got {got}. "
            "Pass e.g. xp.isfinite(grads).all(), or found_inf == 0 for a float flag."
        )
    if getattr(finite, "ndim", 0) != 0:
        raise TypeError(
            f"finite must be a 0-d bool array, got shape {tuple(finite.shape)}: reduce it first, e.g. finite.all()."
        )
    return finite


def skip_counters(skipped: Any, streak: Any, finite: Any, xp: Any) -> tuple[Any, Any]:
    """``skipped += not finite``, ``streak = 0 if finite else streak + 1``, saturating: part of :func:`next_state`,
    also of :func:`~lossscale._auto.next_auto_state`, and all that moves when another rule moved the scale
    (``advance(..., moves_scale=False)``). Cost: about 6 scalar ops."""
    return xp.where(finite, skipped, count_up(skipped, xp)), xp.where(finite, 0, count_up(streak, xp))


def count_up(counter: Any, xp: Any) -> Any:
    """``counter + 1``, saturating at :data:`COUNTER_MAX`: a select, no bool added to an int (TensorFlow refuses
    ``int32 + bool``), no overflow computed (numpy scalars never warn)."""
    return xp.where(counter < COUNTER_MAX, counter, COUNTER_MAX - 1) + 1


def _next_state(params: RuleParams, state: LossScaleState, finite: Any, xp: Any) -> LossScaleState:
    scale, good, bad, skipped, streak = state
    not_finite = ~finite
    skipped, streak = skip_counters(skipped, streak, finite, xp)
    if not params.dynamic:
        return LossScaleState(scale, good, bad, skipped, streak)

    # Branches on static numbers: TF's policy traces to about 20 scalar ops. good/bad stay under their thresholds.
    good_plus = good + 1
    grow_due = good_plus >= params.growth_interval
    grown = scale * params.growth_factor
    grow = finite & grow_due & xp.isfinite(grown)
    if params.max_scale is not None:
        grown = xp.where(grown > params.max_scale, params.max_scale, grown)

    if params.hysteresis == 1:
        backoff_due = not_finite
        new_bad = bad
    else:
        bad_plus = bad + 1
        backoff_due = not_finite & (bad_plus >= params.hysteresis)
        # bad resets when the scale changes (growth period reached, or backoff), else counts overflows.
        new_bad = xp.where(xp.where(finite, grow_due, backoff_due), 0, xp.where(finite, bad, bad_plus))
    backed = scale
    if params.backoff_multiplier != 1.0:
        backed = backed * params.backoff_multiplier
    if params.backoff_divisor != 1.0:
        divisor: Any = params.backoff_divisor
        if math.frexp(divisor)[0] != 0.5:
            # Not a power of two: XLA would multiply by the rounded reciprocal of a constant divisor, 1 ulp off
            # TF's scale / multiplier; a divisor computed from the scale is no constant (two scalar ops).
            divisor = scale * 0 + divisor
        backed = backed / divisor
    backed = xp.where(backed < params.min_scale, params.min_scale, backed)

    return LossScaleState(
        loss_scale=xp.where(grow, grown, xp.where(backoff_due, backed, scale)),
        good_steps=xp.where(finite & ~grow_due, good_plus, 0),
        bad_steps=new_bad,
        skipped_steps=skipped,
        consecutive_skips=streak,
    )


class _HostScalars:
    """The namespace :func:`_next_state` needs for numpy scalars (their arithmetic keeps dtypes, NEP 50)."""

    @staticmethod
    def where(condition: Any, a: Any, b: Any) -> Any:
        return a if condition else b

    @staticmethod
    def isfinite(x: Any) -> bool:
        return math.isfinite(x)


#: The array namespace of the host twin: the rule's ``where``/``isfinite`` on numpy scalars and Python bools.
HOST_SCALARS = _HostScalars()


class KernelForm(NamedTuple):
    """:func:`next_state` of one policy as GradScaler's update kernel and a floor (see :func:`kernel_form`).

    Attributes:
        dynamic: False for a fixed scale (only the skip counters move).
        growth_factor: the kernel's ``S * growth_factor``: the policy's, rounded to float32 (a Python float).
        backoff_factor: the kernel's ``S * backoff_factor``: ``1 / divisor`` or the multiplier, rounded to float32.
        growth_interval: the policy's growth interval.
        floor: ``min_scale`` as float32: after a backoff ``S <- max(S, floor)``.
    """

    dynamic: bool
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    floor: float


def _float32(value: float) -> float | None:
    """``value`` rounded to float32 as the rule's arithmetic rounds a constant, or None where that is not finite."""
    with np.errstate(over="ignore"):
        rounded = np.float32(value)
    return float(rounded) if np.isfinite(rounded) else None


def kernel_form(params: RuleParams) -> KernelForm | None:
    """:func:`next_state` for ``params`` as the few fused operations an accelerator runs, or None where they would
    not give the same bits (the binding then runs :func:`next_state` itself).

    The form, per step, with ``inf`` the step's found-inf flag (1.0 or 0.0)::

        S, good = amp_update(S, good, inf, growth_factor, backoff_factor, growth_interval)   # torch's GradScaler kernel
        S = max(S, inf * floor)                                                               # the floor, on a backoff
        skipped += inf;  streak = inf + inf * streak                                          # the skip counters

    ``amp_update`` is ``S *= backoff_factor; good = 0`` on an overflow; otherwise ``good += 1`` and, when ``good``
    reaches ``growth_interval``, ``good = 0`` and ``S *= growth_factor`` unless that is not finite. That is this
    module's rule exactly when:

    - ``hysteresis == 1`` and there is no ``max_scale`` (the kernel knows neither);
    - the backoff is one multiplication (a multiplier with no divisor, or a power-of-two divisor). The rule
      multiplies the float32 scale by a constant rounded to float32; the kernel multiplies in float64 by the
      factor it is given and rounds once to float32. Given the same float32-rounded factor, both round the same
      exact product (two float32 significands multiply exactly in float64) once, so the bits agree;
    - and, checked by the binding on the host, not here: ``good < growth_interval`` before the step (the kernel
      grows at ``==``, the rule at ``>=``; one step of :func:`next_state` restores it after a change of policy or
      a load), and the counters are far enough below :data:`COUNTER_MAX` that adding 1 cannot pass it (the form
      does not saturate).

    >>> from lossscale import DynamicLossScale
    >>> kernel_form(DynamicLossScale().rule_params())
    KernelForm(dynamic=True, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, floor=1.0)
    >>> kernel_form(DynamicLossScale(hysteresis=2).rule_params()) is None
    True
    """
    floor = _float32(params.min_scale)
    if floor is None:
        return None
    if not params.dynamic:
        return KernelForm(False, 1.0, 1.0, 1, floor)
    growth = _float32(params.growth_factor)
    if params.hysteresis != 1 or params.max_scale is not None or growth is None:
        return None
    multiplier, divisor = params.backoff_multiplier, params.backoff_divisor
    if divisor == 1.0:
        backoff = _float32(multiplier)
    elif multiplier == 1.0 and math.frexp(divisor)[0] == 0.5:
        backoff = _float32(1.0 / divisor)
    else:
        return None
    if backoff is None or backoff == 0.0:
        return None
    return KernelForm(True, growth, backoff, params.growth_interval, floor)
