"""The constructor's scale arguments resolved to one policy, the vocabulary's three refinements included."""

from __future__ import annotations

import inspect
from typing import Any, cast

from .._policy import DynamicLossScale, LossScale
from .._resolve import resolve_loss_scale

__all__ = ["resolve_policy"]

_EXTRAS = ("min_loss_scale", "max_loss_scale", "hysteresis")


def resolve_policy(
    loss_scale: Any = None,
    *,
    dynamic: bool | None = None,
    initial_scale: float | None = None,
    dynamic_growth_steps: int | None = None,
    min_loss_scale: float | None = None,
    max_loss_scale: float | None = None,
    hysteresis: int | None = None,
) -> LossScale:
    """:func:`lossscale.resolve_loss_scale` with ``min_loss_scale``, ``max_loss_scale`` and ``hysteresis``.

    The three refine the dynamic scale of the stable form (``dynamic=True``,
    the default) or of ``loss_scale="dynamic"``; a policy object carries its
    own. Bad values raise the policy's ``TypeError``/``ValueError``, which
    name the keyword.

    >>> resolve_policy(dynamic_growth_steps=500, min_loss_scale=0.5) == DynamicLossScale(2**15, 500, min_loss_scale=0.5)
    True
    """
    stable = {"dynamic": dynamic, "initial_scale": initial_scale, "dynamic_growth_steps": dynamic_growth_steps}
    extras = {k: v for k, v in zip(_EXTRAS, (min_loss_scale, max_loss_scale, hysteresis)) if v is not None}
    if not extras or set(_EXTRAS) <= set(inspect.signature(resolve_loss_scale).parameters):
        return resolve_loss_scale(loss_scale, **stable, **extras)
    return _refined(loss_scale, stable, extras)


# replace with resolve_loss_scale(...) once torch23 lands (it extends the core function with these three keywords,
# with the semantics of lossscale/keras/_args.py::resolve_policy, which this follows).
def _refined(loss_scale: Any, stable: dict[str, Any], extras: dict[str, Any]) -> LossScale:
    named = ", ".join(f"{k}=" for k in extras)
    if loss_scale is not None and loss_scale != "dynamic":
        raise ValueError(
            f"{named} refine the dynamic scale of the stable form; loss_scale={loss_scale!r} carries its own "
            f"settings. Pass them to the policy instead, e.g. DynamicLossScale(2**15, 2000, {named}...)."
        )
    if stable["dynamic"] is False:
        raise ValueError(f"{named} only apply to a dynamic loss scale: drop them, or set dynamic=True.")
    if loss_scale is not None and stable["initial_scale"] is not None:  # resolve_loss_scale's "not both" error
        resolve_loss_scale(loss_scale, initial_scale=stable["initial_scale"])
    base = cast(
        DynamicLossScale,
        resolve_loss_scale(loss_scale, dynamic=stable["dynamic"], dynamic_growth_steps=stable["dynamic_growth_steps"]),
    )
    initial = base.initial_loss_scale if stable["initial_scale"] is None else stable["initial_scale"]
    return DynamicLossScale(initial, base.increment_period, base.multiplier, **extras)
