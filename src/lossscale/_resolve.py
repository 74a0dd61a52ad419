"""What a user passes as ``loss_scale``, made a policy: the registry (:func:`get`/:func:`serialize`: built-in
classes by name, your own through ``custom_objects``) and TF's two constructor forms (:func:`resolve_loss_scale`)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from numbers import Real
from typing import Any, cast

from ._auto import AutoLossScale
from ._policy import _PICKLED_BY_NAME, DynamicLossScale, FixedLossScale, LossScale, _fixed_value, caller_names

__all__ = ["built_in_names", "get", "resolve_loss_scale", "serialize", "stable_form"]

_EXTRAS = ("min_loss_scale", "max_loss_scale", "hysteresis")


def resolve_loss_scale(
    loss_scale: Any = None, *, dynamic: bool | None = None, initial_scale: float | None = None,
    dynamic_growth_steps: int | None = None, min_loss_scale: float | None = None, max_loss_scale: float | None = None,
    hysteresis: int | None = None,
) -> LossScale:
    """The policy that TF's experimental ``LossScaleOptimizer(opt, loss_scale)`` or stable
    ``LossScaleOptimizer(opt, dynamic, initial_scale, dynamic_growth_steps)`` form describes.

    Args:
        loss_scale: the experimental form: a number (fixed), ``"dynamic"``, ``"auto"``, a :class:`LossScale`, a
            :func:`serialize` dict, or None (then the stable form decides; all None: ``DynamicLossScale()``).
        dynamic: the stable form: True (default) for a dynamic scale, False for a fixed one.
        initial_scale: the stable form's initial (or fixed) scale; default 2**15.
        dynamic_growth_steps: the stable form's finite steps before the scale grows; default 2000.
        min_loss_scale, max_loss_scale, hysteresis: refine the dynamic scale of the stable form or of
            ``loss_scale="dynamic"`` (None: the :class:`DynamicLossScale` defaults 1, none, 1).

    Returns:
        The policy, a :class:`LossScale`.

    Raises:
        TypeError: a wrong type; ValueError: a wrong value or a conflicting pair. Each names the keyword and the
            fix.

    >>> refined = resolve_loss_scale(dynamic_growth_steps=500, min_loss_scale=0.5)
    >>> refined == DynamicLossScale(2**15, 500, min_loss_scale=0.5)
    True
    """
    extras = {k: v for k, v in zip(_EXTRAS, (min_loss_scale, max_loss_scale, hysteresis)) if v is not None}
    named = ", ".join(f"{k}=" for k in extras)
    if extras and loss_scale is not None and not (isinstance(loss_scale, str) and loss_scale == "dynamic"):
        raise ValueError(
            f"{named} refine the dynamic scale of the stable form; loss_scale={loss_scale!r} carries its own "
            f"settings. Pass them to the policy instead, e.g. DynamicLossScale(2**15, 2000, {named}...)."
        )
    if extras and dynamic is False:
        raise ValueError(f"{named} only apply to a dynamic loss scale: drop them, or set dynamic=True.")
    stable = {"dynamic": dynamic, "initial_scale": initial_scale, "dynamic_growth_steps": dynamic_growth_steps}
    given = [k for k, v in stable.items() if v is not None]
    if loss_scale is not None:
        if given:
            raise ValueError(
                f"Pass either loss_scale={loss_scale!r} or {', '.join(f'{k}=' for k in given)}, not both: "
                "loss_scale is the experimental form and dynamic/initial_scale/dynamic_growth_steps the stable "
                "form of the same setting."
            )
        if not extras:  # "dynamic" with extras is the stable form's dynamic scale
            return cast(LossScale, get(loss_scale))  # only get(None) is None
    dynamic = True if dynamic is None else dynamic
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be True or False, got {dynamic!r}.")
    if dynamic:
        own = {"initial_loss_scale": initial_scale, "increment_period": dynamic_growth_steps}  # None: the defaults
        kwargs = {k: v for k, v in own.items() if v is not None}
        return cast(LossScale, built_in_names(_STABLE_NAMES, DynamicLossScale, **kwargs, **extras))
    if initial_scale is None:
        raise ValueError(
            "dynamic=False needs initial_scale, the fixed loss scale: for example dynamic=False, initial_scale=1024."
        )
    if dynamic_growth_steps is not None:
        raise ValueError("dynamic_growth_steps only applies to a dynamic loss scale: drop it, or set dynamic=True.")
    return cast(LossScale, built_in_names(_STABLE_NAMES, FixedLossScale, initial_scale))


# The policies' argument names in validation errors, and the stable form's names for them.
_STABLE_NAMES = (("initial_loss_scale", "initial_scale"), ("loss_scale_value", "initial_scale"),
                 ("increment_period", "dynamic_growth_steps"))


def built_in_names(names: tuple[tuple[str, str], ...], build: Any, *args: Any, **kwargs: Any) -> Any:
    """``build(*args, **kwargs)`` with validation errors in the caller's argument names: ``names`` pairs a policy's
    name with the caller's (the stable form here, ``torch.amp.GradScaler``'s in the torch binding); the messages
    are written with them (:func:`lossscale._policy.caller_names`), not rewritten afterwards."""
    with caller_names(dict(names)):
        return build(*args, **kwargs)


def stable_form(policy: LossScale) -> dict[str, Any]:
    """``dynamic``, ``initial_scale`` and ``dynamic_growth_steps`` of a policy (Keras's attributes)."""
    params = policy.rule_params()
    growth = params.growth_interval if params.dynamic else None
    return {"dynamic": params.dynamic, "initial_scale": params.initial_scale, "dynamic_growth_steps": growth}


#: The built-in policies by class name; classes of your own are found only through ``custom_objects``.
_BUILTINS: dict[str, type[LossScale]] = {**_PICKLED_BY_NAME, AutoLossScale.__name__: AutoLossScale}


def serialize(loss_scale: LossScale) -> dict[str, Any]:
    """``{"class_name": ..., "config": ...}``, the form :func:`get` reads back.

    Args:
        loss_scale: the :class:`LossScale` to serialize.

    Raises:
        TypeError: ``loss_scale`` is not a :class:`LossScale`.
    """
    if not isinstance(loss_scale, LossScale):
        raise TypeError(f"serialize() takes a LossScale, got {type(loss_scale).__name__}.")
    return {"class_name": type(loss_scale).__name__, "config": loss_scale.get_config()}


def _is_number(value: Any) -> bool:
    """A real number or a 0-d array (not a bool): what ``get`` turns into a fixed scale."""
    if isinstance(value, (bool, str, bytes)) or "bool" in str(getattr(value, "dtype", "")):
        return False
    if isinstance(value, Real):
        return True
    shape = getattr(value, "shape", None)
    return shape is not None and tuple(shape) == () and hasattr(value, "__float__")


def _class_for(identifier: Mapping[str, Any], custom_objects: Mapping[str, Any] | None) -> type[LossScale]:
    class_name = identifier.get("class_name")
    custom = dict(custom_objects or {})
    cls = custom.get(class_name, _BUILTINS.get(class_name)) if isinstance(class_name, str) else None
    if cls is None or set(identifier) - {"class_name", "config"}:
        known = ", ".join(sorted(set(_BUILTINS) | set(custom)))
        raise ValueError(
            f"Invalid loss scale config {dict(identifier)!r}: expected "
            f'{{"class_name": <one of {known}>, "config": {{...}}}}, as lossscale.serialize() returns. '
            "A class of your own is found only through custom_objects={'MyLossScale': MyLossScale}."
        )
    if not (isinstance(cls, type) and issubclass(cls, LossScale)):
        raise TypeError(f"custom_objects[{class_name!r}] must be a LossScale subclass, got {cls!r}.")
    return cls


def get(identifier: Any, custom_objects: Mapping[str, Any] | None = None) -> LossScale | None:
    """Turns what a user may pass as ``loss_scale`` into a policy, as ``keras.*.get`` does.

    * ``None`` -> ``None``; a :class:`LossScale` -> itself;
    * a number or a 0-d array -> ``FixedLossScale(identifier)``;
    * ``"dynamic"`` -> ``DynamicLossScale()``; ``"auto"`` -> ``AutoLossScale()`` (experimental);
    * ``{"class_name": ..., "config": {...}}`` (:func:`serialize`) -> that policy: a built-in class, or one of
      yours given in ``custom_objects`` (``{"MyLossScale": MyLossScale}``, first); no other class is found by name;
    * anything else raises ``ValueError``.

    Args:
        identifier: the value to turn into a policy, as listed above.
        custom_objects: ``{class name: class}`` for your own :class:`LossScale` subclasses in a serialized dict.

    Returns:
        The policy, or None for None.

    Raises:
        TypeError: ``custom_objects`` is not a mapping; ValueError: ``identifier`` names no policy.

    >>> get({"class_name": "DynamicLossScale", "config": {"initial_loss_scale": 1024}})
    DynamicLossScale(initial_loss_scale=1024.0, increment_period=2000, multiplier=2.0)
    """
    if custom_objects is not None and not isinstance(custom_objects, Mapping):
        raise TypeError(f"custom_objects must be a dict of class name to class, got {type(custom_objects).__name__}.")
    if identifier is None or isinstance(identifier, LossScale):
        return identifier
    if _is_number(identifier):
        return FixedLossScale(_fixed_value("loss_scale", identifier))  # passed as loss_scale=: errors name it
    if isinstance(identifier, str):
        if identifier in ("dynamic", "auto"):
            return DynamicLossScale() if identifier == "dynamic" else AutoLossScale()
        raise ValueError(
            f'Invalid loss scale string {identifier!r}: the only string accepted is "dynamic" '
            '(and "auto", the experimental AutoLossScale).'
        )
    if isinstance(identifier, Mapping):
        cls = _class_for(identifier, custom_objects)
        class_name = identifier["class_name"]
        config = identifier.get("config", {})
        if not isinstance(config, Mapping):
            raise ValueError(  # noqa: TRY004 - a malformed config is a bad value, as every config error here
                f"Invalid loss scale config for {class_name}: 'config' must be a dict, got {config!r}."
            )
        try:
            inspect.signature(cls).bind(**config)
        except TypeError as error:
            raise ValueError(
                f"Invalid loss scale config for {class_name}: {error}. Expected the keys that "
                f"{class_name}(...).get_config() returns."
            ) from error
        try:
            return cls.from_config(config)
        except (TypeError, ValueError) as error:  # the constructor's own words name the field and why
            raise type(error)(f"Invalid loss scale config for {class_name}: {error}") from error
    raise ValueError(
        f"Invalid loss scale {identifier!r} of type {type(identifier).__name__}: pass a number (fixed scale), "
        '"dynamic", a LossScale instance, a serialized LossScale dict, or None.'
    )
