"""The constructor's scale arguments, resolved to one policy; the policy written back as config keys."""

from __future__ import annotations

from typing import Any

from .. import DynamicLossScale, FixedLossScale, LossScale, resolve_loss_scale, serialize

__all__ = ["policy_config", "resolve_policy"]

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
    """The policy the arguments describe: :func:`lossscale.resolve_loss_scale` (the one resolver of every binding).

    >>> resolve_policy(dynamic_growth_steps=500, min_loss_scale=0.5) == DynamicLossScale(2**15, 500, min_loss_scale=0.5)
    True
    """
    return resolve_loss_scale(
        loss_scale, dynamic=dynamic, initial_scale=initial_scale, dynamic_growth_steps=dynamic_growth_steps,
        min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale, hysteresis=hysteresis,
    )


def _stable(policy: LossScale) -> dict[str, Any] | None:
    """The stable form's keys (and the three extensions) that rebuild ``policy``, or None if they cannot."""
    if type(policy) is FixedLossScale:
        return {"dynamic": False, "initial_scale": policy.loss_scale_value, "dynamic_growth_steps": None}
    if type(policy) is DynamicLossScale and policy.multiplier == 2.0 and policy.backoff_factor is None:
        config: dict[str, Any] = {
            "dynamic": True,
            "initial_scale": policy.initial_loss_scale,
            "dynamic_growth_steps": policy.increment_period,
        }
        defaults = DynamicLossScale()
        for key in _EXTRAS:
            if getattr(policy, key) != getattr(defaults, key):
                config[key] = getattr(policy, key)
        return config
    return None


def policy_config(policy: LossScale) -> dict[str, Any]:
    """Config keys for ``policy``: tf-keras's stable keys when they say it all, else ``loss_scale``.

    >>> policy_config(FixedLossScale(123))
    {'dynamic': False, 'initial_scale': 123.0, 'dynamic_growth_steps': None}
    """
    stable = _stable(policy)
    return stable if stable is not None else {"loss_scale": serialize(policy)}
