"""The constructor's scale arguments, resolved to one policy; the policy written back as config keys."""

from __future__ import annotations

from typing import Any

from .. import AutoLossScale, DynamicLossScale, FixedLossScale, LossScale, resolve_loss_scale, serialize

__all__ = ["policy_config", "refuse_stats_every", "resolve_policy"]

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
    policy = resolve_loss_scale(
        loss_scale, dynamic=dynamic, initial_scale=initial_scale, dynamic_growth_steps=dynamic_growth_steps,
        min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale, hysteresis=hysteresis,
    )
    if isinstance(policy, AutoLossScale):  # a valid policy, just not one this binding runs: ValueError
        raise ValueError(  # noqa: TRY004
            f"loss_scale={loss_scale!r} (lossscale.AutoLossScale, experimental) is not supported by the Keras "
            "binding: it sets the scale from sampled gradient statistics, which only lossscale.torch "
            "(LossScaleOptimizer) and lossscale.jax (loss_scale_optimizer) measure. On Keras use the default dynamic "
            'rule: drop loss_scale= (or pass loss_scale="dynamic").'
        )
    return policy


def refuse_stats_every(stats_every: Any) -> None:
    """Raises for ``stats_every`` other than None: the Keras binding samples no gradient statistics (yet).

    >>> refuse_stats_every(None)
    """
    if stats_every is not None:
        raise ValueError(
            f"stats_every={stats_every!r} is not supported by the Keras binding: sampled gradient statistics are "
            "measured by lossscale.torch (LossScaleOptimizer, GradScaler) and lossscale.jax (loss_scale_optimizer) "
            "only (docs/gradient_stats.md). Drop stats_every= (or pass None) on Keras."
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
