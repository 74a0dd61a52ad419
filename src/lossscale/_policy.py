"""Loss-scale policies: immutable, validated configurations.

A policy says *how* the loss scale evolves; it holds no state. The state (the
current scale and its counters) lives in the framework binding as framework
arrays, and every policy is turned into the same :class:`RuleParams` that the
one update rule in :mod:`lossscale._rule` reads.

The classes and their config keys follow TensorFlow's
``tf.compat.v1.mixed_precision.{FixedLossScale, DynamicLossScale}`` and
``tf.contrib.mixed_precision.{FixedLossScaleManager,
ExponentialUpdateLossScaleManager}``. Keyword-only extensions keep TF's
behaviour at their defaults.
"""

from __future__ import annotations

import abc
import inspect
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar, Mapping

__all__ = [
    "LossScale",
    "FixedLossScale",
    "DynamicLossScale",
    "FixedLossScaleManager",
    "ExponentialUpdateLossScaleManager",
    "RuleParams",
    "get",
    "serialize",
]

_INT32_MAX = 2**31 - 1
#: The largest float32; the state holds the scale as float32.
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class RuleParams:
    """What the update rule needs to know of a policy; plain Python numbers.

    On a non-finite step the scale becomes
    ``max(scale * backoff_multiplier / backoff_divisor, min_scale)`` once
    ``hysteresis`` non-finite steps have been seen since the scale last
    changed. On the ``growth_interval``-th finite step in a row the scale
    becomes ``min(scale * growth_factor, max_scale)`` if that is finite.
    Two backoff constants let TF's ``scale / multiplier`` and contrib's
    ``scale * decr_ratio`` both be computed exactly (the other one is 1).
    """

    dynamic: bool
    initial_scale: float
    growth_interval: int = 1
    growth_factor: float = 1.0
    backoff_multiplier: float = 1.0
    backoff_divisor: float = 1.0
    hysteresis: int = 1
    min_scale: float = 1.0
    max_scale: float | None = None


# ---------------------------------------------------------------- validation


def _number(name: str, value: Any, fix: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}. {fix}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}. {fix}")
    return value


def _scale(name: str, value: Any, *, at_least: float | None = None, example: str = "2**15") -> float:
    fix = f"Pass a positive finite number, for example {name}={example}."
    value = _number(name, value, fix)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}. {fix}")
    if value > FLOAT32_MAX:
        raise ValueError(f"{name}={value!r} is not finite in float32, the loss scale's dtype (max about 3.4e38). {fix}")
    if at_least is not None and value < at_least:
        raise ValueError(f"{name} must be at least {at_least:g}, got {value!r}.")
    return value


def _count(name: str, value: Any, *, at_least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(
            f"{name} must be an int, got {value!r} of type {type(value).__name__}. Pass a whole number, "
            f"for example {name}={max(at_least, 2)}."
        )
    value = int(value)
    if not at_least <= value <= _INT32_MAX:
        raise ValueError(
            f"{name} must be an int in [{at_least}, 2**31 - 1] (the counters are int32), got {value}. "
            f"Pass for example {name}={max(at_least, 2)}."
        )
    return value


def _above_one(name: str, value: Any) -> float:
    value = _number(name, value, f"Pass a finite number above 1, for example {name}=2.0.")
    if value <= 1.0:
        raise ValueError(f"{name} must be greater than 1 so the scale can grow, got {value!r}. Use for example {name}=2.0.")
    return value


def _fraction(name: str, value: Any) -> float:
    value = _number(name, value, f"Pass a number in (0, 1), for example {name}=0.5.")
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in the open interval (0, 1) so the scale shrinks, got {value!r}. Use for example {name}=0.5.")
    return value


# ------------------------------------------------------------------- classes


class LossScale(abc.ABC):
    """Base class of every loss-scale policy.

    A policy is an immutable value: two policies with equal configs are equal
    and hash alike. Subclasses define :meth:`get_config` and
    :meth:`rule_params`; :meth:`from_config` calls the constructor with the
    config as keyword arguments.
    """

    __slots__ = ()
    _registry: ClassVar[dict[str, type[LossScale]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        LossScale._registry[cls.__name__] = cls

    @property
    @abc.abstractmethod
    def dynamic(self) -> bool:
        """Whether the scale changes during training."""

    @property
    def initial_scale(self) -> float:
        """The scale at step 0."""
        return self.rule_params().initial_scale

    @abc.abstractmethod
    def rule_params(self) -> RuleParams:
        """The numbers the update rule reads (see :class:`RuleParams`)."""

    @abc.abstractmethod
    def get_config(self) -> dict[str, Any]:
        """The constructor's keyword arguments, TF's keys."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LossScale:
        """Rebuilds the policy from :meth:`get_config`'s output."""
        return cls(**dict(config))

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.get_config() == other.get_config()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; build a new one instead of setting {name!r}.")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; {name!r} cannot be deleted.")

    def _init(self, **fields: Any) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_config, (type(self).__name__, self.get_config()))


def _from_config(class_name: str, config: Mapping[str, Any]) -> LossScale:
    return LossScale._registry[class_name].from_config(config)


class FixedLossScale(LossScale):
    """A loss scale that never changes.

    Args:
        loss_scale_value: the scale, a finite number >= 1 (as in TF). Use
            ``FixedLossScale(1)`` for skip-only mode: no scaling, but steps with
            a non-finite gradient are still skipped (useful with bfloat16).

    >>> FixedLossScale(128).get_config()
    {'loss_scale_value': 128.0}
    """

    __slots__ = ("_value",)

    def __init__(self, loss_scale_value: float) -> None:
        value = _scale("loss_scale_value", loss_scale_value)
        if value < 1:
            raise ValueError(
                f"loss_scale_value must be at least 1, got {value!r}: a scale below 1 makes small gradients "
                "underflow sooner instead of later. Use FixedLossScale(1) for no scaling."
            )
        self._init(_value=value)

    @property
    def dynamic(self) -> bool:
        return False

    @property
    def loss_scale_value(self) -> float:
        """The fixed scale."""
        return self._value

    def rule_params(self) -> RuleParams:
        return RuleParams(dynamic=False, initial_scale=self._value, min_scale=self._value, max_scale=self._value)

    def get_config(self) -> dict[str, Any]:
        return {"loss_scale_value": self._value}


class DynamicLossScale(LossScale):
    """TF's dynamic loss scale, with keyword-only extensions.

    The rule, per step, with ``n`` the count of finite steps since the scale
    last changed and ``b`` the count of non-finite ones::

        if all gradients are finite:
            n += 1
            if n >= increment_period:
                if isfinite(scale * multiplier):
                    scale = min(scale * multiplier, max_loss_scale)
                n = b = 0
        else:                                  # NaN and +-Inf alike
            n = 0
            b += 1
            if b >= hysteresis:
                scale = max(scale / multiplier, min_loss_scale)   # or * backoff_factor
                b = 0

    With the defaults (``hysteresis=1``, ``min_loss_scale=1``, no maximum,
    backoff by ``multiplier``) this is exactly TF's rule.

    Args:
        initial_loss_scale: the scale at step 0.
        increment_period: finite steps in a row before the scale grows.
        multiplier: the growth factor, and TF's backoff divisor.
        min_loss_scale: the floor (TF: 1). Any positive number.
        max_loss_scale: an optional ceiling; growth is clamped to it.
        backoff_factor: if given, the scale is *multiplied* by this number in
            (0, 1) on backoff instead of divided by ``multiplier``.
        hysteresis: how many non-finite steps, counted since the scale last
            changed, it takes to back off. 1 backs off at every overflow (TF).
            This is contrib's ``decr_every_n_nan_or_inf``; see the README for
            how it compares with DeepSpeed's and Megatron's ``hysteresis``.

    >>> DynamicLossScale(initial_loss_scale=2048, increment_period=500).get_config()
    {'initial_loss_scale': 2048.0, 'increment_period': 500, 'multiplier': 2.0}
    """

    __slots__ = ("_initial", "_period", "_multiplier", "_min", "_max", "_backoff", "_hysteresis")

    def __init__(
        self,
        initial_loss_scale: float = 2**15,
        increment_period: int = 2000,
        multiplier: float = 2.0,
        *,
        min_loss_scale: float = 1.0,
        max_loss_scale: float | None = None,
        backoff_factor: float | None = None,
        hysteresis: int = 1,
    ) -> None:
        min_scale = _scale("min_loss_scale", min_loss_scale, example="1.0")
        max_scale = (
            None if max_loss_scale is None else _scale("max_loss_scale", max_loss_scale, at_least=min_scale, example="2**24")
        )
        initial = _scale("initial_loss_scale", initial_loss_scale)
        if initial < min_scale:
            raise ValueError(
                f"initial_loss_scale={initial!r} is below min_loss_scale={min_scale!r}; "
                "raise initial_loss_scale or lower min_loss_scale."
            )
        if max_scale is not None and initial > max_scale:
            raise ValueError(
                f"initial_loss_scale={initial!r} is above max_loss_scale={max_scale!r}; "
                "lower initial_loss_scale or raise max_loss_scale."
            )
        self._init(
            _initial=initial,
            _period=_count("increment_period", increment_period),
            _multiplier=_above_one("multiplier", multiplier),
            _min=min_scale,
            _max=max_scale,
            _backoff=None if backoff_factor is None else _fraction("backoff_factor", backoff_factor),
            _hysteresis=_count("hysteresis", hysteresis),
        )

    @property
    def dynamic(self) -> bool:
        return True

    @property
    def initial_loss_scale(self) -> float:
        return self._initial

    @property
    def increment_period(self) -> int:
        return self._period

    @property
    def multiplier(self) -> float:
        return self._multiplier

    @property
    def min_loss_scale(self) -> float:
        return self._min

    @property
    def max_loss_scale(self) -> float | None:
        return self._max

    @property
    def backoff_factor(self) -> float | None:
        return self._backoff

    @property
    def hysteresis(self) -> int:
        return self._hysteresis

    def rule_params(self) -> RuleParams:
        return RuleParams(
            dynamic=True,
            initial_scale=self._initial,
            growth_interval=self._period,
            growth_factor=self._multiplier,
            backoff_multiplier=1.0 if self._backoff is None else self._backoff,
            backoff_divisor=self._multiplier if self._backoff is None else 1.0,
            hysteresis=self._hysteresis,
            min_scale=self._min,
            max_scale=self._max,
        )

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "initial_loss_scale": self._initial,
            "increment_period": self._period,
            "multiplier": self._multiplier,
        }
        # Extensions appear only when they differ from TF, so a TF-style policy
        # has exactly TF's config.
        extensions = {
            "min_loss_scale": (self._min, 1.0),
            "max_loss_scale": (self._max, None),
            "backoff_factor": (self._backoff, None),
            "hysteresis": (self._hysteresis, 1),
        }
        config.update({k: v for k, (v, default) in extensions.items() if v != default})
        return config


class FixedLossScaleManager(LossScale):
    """contrib's fixed manager: the same as ``FixedLossScale(loss_scale)``."""

    __slots__ = ("_value",)

    def __init__(self, loss_scale: float) -> None:
        value = _scale("loss_scale", loss_scale)
        if value < 1:
            raise ValueError(f"loss_scale must be at least 1, got {value!r}. Use FixedLossScaleManager(1) for no scaling.")
        self._init(_value=value)

    @property
    def dynamic(self) -> bool:
        return False

    @property
    def loss_scale(self) -> float:
        return self._value

    def rule_params(self) -> RuleParams:
        return FixedLossScale(self._value).rule_params()

    def get_config(self) -> dict[str, Any]:
        return {"loss_scale": self._value}


class ExponentialUpdateLossScaleManager(LossScale):
    """contrib's dynamic manager, with contrib's exact rule.

    The scale is multiplied by ``incr_ratio`` (if the product is finite) after
    ``incr_every_n_steps`` finite steps in a row, and multiplied by
    ``decr_ratio`` (floored at 1) after ``decr_every_n_nan_or_inf`` non-finite
    steps counted since the scale last changed. A non-finite step resets the
    good count; a finite step resets the bad count only when the scale
    changes. This is :class:`DynamicLossScale` with ``hysteresis`` and
    ``backoff_factor`` set.
    """

    __slots__ = ("_init_scale", "_incr_every", "_decr_every", "_incr_ratio", "_decr_ratio")

    def __init__(
        self,
        init_loss_scale: float,
        incr_every_n_steps: int,
        decr_every_n_nan_or_inf: int = 2,
        incr_ratio: float = 2,
        decr_ratio: float = 0.8,
    ) -> None:
        self._init(
            _init_scale=_scale("init_loss_scale", init_loss_scale, at_least=1.0),
            _incr_every=_count("incr_every_n_steps", incr_every_n_steps),
            _decr_every=_count("decr_every_n_nan_or_inf", decr_every_n_nan_or_inf),
            _incr_ratio=_above_one("incr_ratio", incr_ratio),
            _decr_ratio=_fraction("decr_ratio", decr_ratio),
        )

    @property
    def dynamic(self) -> bool:
        return True

    @property
    def init_loss_scale(self) -> float:
        return self._init_scale

    @property
    def incr_every_n_steps(self) -> int:
        return self._incr_every

    @property
    def decr_every_n_nan_or_inf(self) -> int:
        return self._decr_every

    @property
    def incr_ratio(self) -> float:
        return self._incr_ratio

    @property
    def decr_ratio(self) -> float:
        return self._decr_ratio

    def rule_params(self) -> RuleParams:
        return RuleParams(
            dynamic=True,
            initial_scale=self._init_scale,
            growth_interval=self._incr_every,
            growth_factor=self._incr_ratio,
            backoff_multiplier=self._decr_ratio,
            backoff_divisor=1.0,
            hysteresis=self._decr_every,
            min_scale=1.0,
            max_scale=None,
        )

    def get_config(self) -> dict[str, Any]:
        return {
            "init_loss_scale": self._init_scale,
            "incr_every_n_steps": self._incr_every,
            "decr_every_n_nan_or_inf": self._decr_every,
            "incr_ratio": self._incr_ratio,
            "decr_ratio": self._decr_ratio,
        }


# ------------------------------------------------------------------ get/serialize


def serialize(loss_scale: LossScale) -> dict[str, Any]:
    """``{"class_name": ..., "config": ...}``, the form :func:`get` reads back."""
    if not isinstance(loss_scale, LossScale):
        raise TypeError(f"serialize() takes a LossScale, got {type(loss_scale).__name__}.")
    return {"class_name": type(loss_scale).__name__, "config": loss_scale.get_config()}


def get(identifier: Any) -> LossScale | None:
    """Turns what a user may pass as ``loss_scale`` into a policy.

    * ``None`` -> ``None``;
    * an int or float -> ``FixedLossScale(identifier)``;
    * ``"dynamic"`` -> ``DynamicLossScale()``;
    * a :class:`LossScale` -> itself;
    * ``{"class_name": ..., "config": {...}}`` (see :func:`serialize`) -> that policy.

    Anything else raises ``ValueError``.

    >>> get(128)
    FixedLossScale(loss_scale_value=128.0)
    >>> get("dynamic") == DynamicLossScale()
    True
    """
    if identifier is None or isinstance(identifier, LossScale):
        return identifier
    if isinstance(identifier, Real) and not isinstance(identifier, bool):
        return FixedLossScale(identifier)
    if isinstance(identifier, str):
        if identifier == "dynamic":
            return DynamicLossScale()
        raise ValueError(f'Invalid loss scale string {identifier!r}: the only string accepted is "dynamic".')
    if isinstance(identifier, Mapping):
        class_name = identifier.get("class_name")
        cls = LossScale._registry.get(class_name) if isinstance(class_name, str) else None
        if cls is None or set(identifier) - {"class_name", "config"}:
            known = ", ".join(sorted(LossScale._registry))
            raise ValueError(
                f"Invalid loss scale config {dict(identifier)!r}: expected "
                f'{{"class_name": <one of {known}>, "config": {{...}}}}, as lossscale.serialize() returns.'
            )
        config = identifier.get("config", {})
        if not isinstance(config, Mapping):
            raise ValueError(f"Invalid loss scale config for {class_name}: 'config' must be a dict, got {config!r}.")
        try:
            inspect.signature(cls).bind(**config)
        except TypeError as error:
            raise ValueError(
                f"Invalid loss scale config for {class_name}: {error}. Expected the keys that "
                f"{class_name}(...).get_config() returns."
            ) from error
        return cls.from_config(config)
    raise ValueError(
        f"Invalid loss scale {identifier!r} of type {type(identifier).__name__}: pass a number (fixed scale), "
        '"dynamic", a LossScale instance, a serialized LossScale dict, or None.'
    )
