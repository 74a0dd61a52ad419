"""The policy written back as config keys (tf-keras's stable form when it says it all).

The constructor resolves its scale arguments with :func:`lossscale.resolve_loss_scale`, the one resolver of every
binding.
"""

from __future__ import annotations

from typing import Any

from .. import DynamicLossScale, FixedLossScale, LossScale, serialize

__all__ = ["policy_config"]

_EXTRAS = ("min_loss_scale", "max_loss_scale", "hysteresis")


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
