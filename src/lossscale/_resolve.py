"""The two constructor forms every binding accepts, resolved to one policy.

TF has two: the experimental ``LossScaleOptimizer(opt, loss_scale)`` and the
stable ``LossScaleOptimizer(opt, dynamic=True, initial_scale=None,
dynamic_growth_steps=None)``; TF's API pages state which pairs are the same.
:func:`resolve_loss_scale` maps both onto one :class:`LossScale` so the
bindings never handle them separately.
"""

from __future__ import annotations

from typing import Any, cast

from ._policy import DynamicLossScale, FixedLossScale, LossScale, get

__all__ = ["built_in_names", "resolve_loss_scale", "stable_form"]

DEFAULT_INITIAL_SCALE = 2.0**15
DEFAULT_GROWTH_STEPS = 2000


_EXTRAS = ("min_loss_scale", "max_loss_scale", "hysteresis")


def resolve_loss_scale(
    loss_scale: Any = None,
    *,
    dynamic: bool | None = None,
    initial_scale: float | None = None,
    dynamic_growth_steps: int | None = None,
    min_loss_scale: float | None = None,
    max_loss_scale: float | None = None,
    hysteresis: int | None = None,
) -> LossScale:
    """The policy that either constructor form describes.

    ``min_loss_scale``, ``max_loss_scale`` and ``hysteresis`` (None: the
    :class:`DynamicLossScale` defaults, 1, none and 1) refine the dynamic
    scale of the stable form (``dynamic=True``, the default) or
    ``loss_scale="dynamic"``; a policy object carries its own. Errors:
    ``TypeError`` for a value of the wrong type, ``ValueError`` for a wrong
    value or a conflicting pair, each naming the keyword and the fix.

    >>> resolve_loss_scale(123) == resolve_loss_scale(dynamic=False, initial_scale=123)
    True
    >>> stable = resolve_loss_scale(initial_scale=2048, dynamic_growth_steps=500)
    >>> resolve_loss_scale(DynamicLossScale(2048, 500)) == stable
    True
    >>> refined = resolve_loss_scale(dynamic_growth_steps=500, min_loss_scale=0.5)
    >>> refined == DynamicLossScale(2**15, 500, min_loss_scale=0.5)
    True
    """
    extras = {k: v for k, v in zip(_EXTRAS, (min_loss_scale, max_loss_scale, hysteresis)) if v is not None}
    if extras:
        named = ", ".join(f"{k}=" for k in extras)
        if loss_scale is not None and not (isinstance(loss_scale, str) and loss_scale == "dynamic"):
            raise ValueError(
                f"{named} refine the dynamic scale of the stable form; loss_scale={loss_scale!r} carries its own "
                f"settings. Pass them to the policy instead, e.g. DynamicLossScale(2**15, 2000, {named}...)."
            )
        if dynamic is False:
            raise ValueError(f"{named} only apply to a dynamic loss scale: drop them, or set dynamic=True.")
        if loss_scale is not None:
            if initial_scale is not None or dynamic_growth_steps is not None or dynamic is not None:
                given = [k for k, v in (("dynamic", dynamic), ("initial_scale", initial_scale),
                                        ("dynamic_growth_steps", dynamic_growth_steps)) if v is not None]
                raise _not_both(loss_scale, given)
            loss_scale = None  # "dynamic" with extras: the stable form's dynamic scale
    stable = {"dynamic": dynamic, "initial_scale": initial_scale, "dynamic_growth_steps": dynamic_growth_steps}
    given = [k for k, v in stable.items() if v is not None]
    if loss_scale is not None:
        if given:
            raise _not_both(loss_scale, given)
        return cast(LossScale, get(loss_scale))  # only get(None) is None
    if dynamic is None:
        dynamic = True
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be True or False, got {dynamic!r}.")
    if dynamic:
        return _in_stable_names(
            DynamicLossScale,
            initial_loss_scale=DEFAULT_INITIAL_SCALE if initial_scale is None else initial_scale,
            increment_period=DEFAULT_GROWTH_STEPS if dynamic_growth_steps is None else dynamic_growth_steps,
            **extras,
        )
    if initial_scale is None:
        raise ValueError(
            "dynamic=False needs initial_scale, the fixed loss scale: for example dynamic=False, initial_scale=1024."
        )
    if dynamic_growth_steps is not None:
        raise ValueError(
            "dynamic_growth_steps only applies to a dynamic loss scale: drop it, or set dynamic=True."
        )
    return _in_stable_names(FixedLossScale, initial_scale)


def _not_both(loss_scale: Any, given: list[str]) -> ValueError:
    return ValueError(
        f"Pass either loss_scale={loss_scale!r} or {', '.join(f'{k}=' for k in given)}, not both: "
        "loss_scale is the experimental form and dynamic/initial_scale/dynamic_growth_steps the stable "
        "form of the same setting."
    )


# The policies' argument names in validation errors, and the stable form's names for them.
_STABLE_NAMES = (
    ("initial_loss_scale", "initial_scale"),
    ("loss_scale_value", "initial_scale"),
    ("increment_period", "dynamic_growth_steps"),
)


def built_in_names(names: tuple[tuple[str, str], ...], build: Any, *args: Any, **kwargs: Any) -> Any:
    """``build(*args, **kwargs)``, a validation error re-raised with each policy argument name renamed.

    ``names`` pairs a policy's argument name with the caller's (``("initial_loss_scale", "initial_scale")``),
    so that an error names the argument the caller passed. Used for the stable form here and for
    ``torch.amp.GradScaler``'s names in ``lossscale.torch.GradScaler``.
    """
    try:
        return build(*args, **kwargs)
    except (TypeError, ValueError) as error:
        message = str(error)
        for ours, theirs in names:
            message = message.replace(ours, theirs)
        raise type(error)(message) from None


def _in_stable_names(build: Any, *args: Any, **kwargs: Any) -> LossScale:
    """``build(*args, **kwargs)``, a validation error re-raised in the names the caller passed (``initial_scale``)."""
    return cast(LossScale, built_in_names(_STABLE_NAMES, build, *args, **kwargs))


def stable_form(policy: LossScale) -> dict[str, Any]:
    """``dynamic``, ``initial_scale`` and ``dynamic_growth_steps`` of a policy (Keras's attributes)."""
    params = policy.rule_params()
    return {
        "dynamic": params.dynamic,
        "initial_scale": params.initial_scale,
        "dynamic_growth_steps": params.growth_interval if params.dynamic else None,
    }
