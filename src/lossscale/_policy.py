"""Loss-scale policies: immutable, validated configurations.

A policy says *how* the loss scale evolves; it holds no state. The state (the
current scale and its counters) lives in the framework binding as framework
arrays, and every policy is turned into the same :class:`RuleParams` that the
one update rule in :mod:`lossscale._rule` reads.

The classes and their config keys follow TensorFlow's
``tf.compat.v1.mixed_precision.{FixedLossScale, DynamicLossScale}`` and
``tf.contrib.mixed_precision.{FixedLossScaleManager,
ExponentialUpdateLossScaleManager}``. Keyword-only extensions keep TF's
behaviour at their defaults. Every policy is a frozen dataclass whose fields
are TF's config keys, validated and normalised to ``float``/``int`` in
``__post_init__`` (:mod:`lossscale._numbers`).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, fields
from typing import Any

from . import _numbers as _n

__all__ = [
    "DynamicLossScale",
    "ExponentialUpdateLossScaleManager",
    "FixedLossScale",
    "FixedLossScaleManager",
    "LossScale",
    "RuleParams",
]


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


# ------------------------------------------------------------------- classes


class LossScale(abc.ABC):
    """Base class of every loss-scale policy.

    A policy is an immutable value: the built-in policies are frozen
    dataclasses whose fields are TF's config keys, validated and normalised
    (to ``float``/``int``) when built, so two policies with equal configs are
    equal and hash alike. Subclasses define :attr:`dynamic`,
    :meth:`get_config` and :meth:`rule_params`; :meth:`from_config` calls the
    constructor with the config as keyword arguments. A policy pickles as its
    class and config, and is validated again when unpickled.
    """

    __slots__ = ()

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

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __reduce__(self) -> tuple[Any, ...]:
        # The class travels by reference (module and qualified name), never by a bare name, so no other class
        # of the same name can stand in for it; the config is validated again on load.
        return (_rebuild, (type(self), self.get_config()))


def _rebuild(cls: type[LossScale], config: Mapping[str, Any]) -> LossScale:
    return cls.from_config(config)


def _from_config(class_name: str, config: Mapping[str, Any]) -> LossScale:
    """Unpickles policies pickled by lossscale 0.1 (by class name): built-in classes only."""
    return _PICKLED_BY_NAME[class_name].from_config(config)


def _set(policy: LossScale, **fields: Any) -> None:
    """Stores the validated, normalised fields on a frozen dataclass (in ``__post_init__`` only)."""
    for name, value in fields.items():
        object.__setattr__(policy, name, value)


def _fixed_value(name: str, value: Any) -> float:
    """A fixed scale, checked under the name the caller passed it as (``loss_scale_value`` or ``loss_scale``)."""
    value = _n.scale(name, value)
    if value < 1:
        raise ValueError(
            f"{name} must be at least 1, got {value!r}: a scale below 1 makes small gradients "
            "underflow sooner instead of later. Use FixedLossScale(1) for no scaling."
        )
    return value


@dataclass(frozen=True, repr=False)
class FixedLossScale(LossScale):
    """A loss scale that never changes.

    Args:
        loss_scale_value: the scale, a finite number >= 1 (as in TF). Use
            ``FixedLossScale(1)`` for skip-only mode: no scaling, but steps with
            a non-finite gradient are still skipped (useful with bfloat16).

    >>> FixedLossScale(128).get_config()
    {'loss_scale_value': 128.0}
    """

    loss_scale_value: float

    def __post_init__(self) -> None:
        _set(self, loss_scale_value=_fixed_value("loss_scale_value", self.loss_scale_value))

    @property
    def dynamic(self) -> bool:
        return False

    def rule_params(self) -> RuleParams:
        value = self.loss_scale_value
        return RuleParams(dynamic=False, initial_scale=value, min_scale=value, max_scale=value)

    def get_config(self) -> dict[str, Any]:
        return {"loss_scale_value": self.loss_scale_value}


@dataclass(frozen=True, repr=False)
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
        min_loss_scale: the floor (TF: 1). Any positive number that is a
            normal float32 (at least about 1.2e-38).
        max_loss_scale: an optional ceiling; growth is clamped to it.
        backoff_factor: if given, the scale is *multiplied* by this number in
            (0, 1) on backoff instead of divided by ``multiplier``.
        hysteresis: how many non-finite steps, counted since the scale last
            changed, it takes to back off. 1 backs off at every overflow (TF).
            This is contrib's ``decr_every_n_nan_or_inf``; see docs/concepts.md for
            how it compares with DeepSpeed's and Megatron's ``hysteresis``.

    Every number may also be a 0-d array (numpy, JAX, torch).

    >>> DynamicLossScale(initial_loss_scale=2048, increment_period=500).get_config()
    {'initial_loss_scale': 2048.0, 'increment_period': 500, 'multiplier': 2.0}
    """

    initial_loss_scale: float = 2.0**15
    increment_period: int = 2000
    multiplier: float = 2.0
    _: KW_ONLY
    min_loss_scale: float = 1.0
    max_loss_scale: float | None = None
    backoff_factor: float | None = None
    hysteresis: int = 1

    def __post_init__(self) -> None:
        initial, min_scale, max_scale = _n.scale_bounds(self.initial_loss_scale, self.min_loss_scale, self.max_loss_scale)
        backoff = self.backoff_factor
        _set(
            self,
            initial_loss_scale=initial,
            increment_period=_n.count("increment_period", self.increment_period),
            multiplier=_n.above_one("multiplier", self.multiplier),
            min_loss_scale=min_scale,
            max_loss_scale=max_scale,
            backoff_factor=None if backoff is None else _n.fraction("backoff_factor", backoff),
            hysteresis=_n.count("hysteresis", self.hysteresis),
        )

    @property
    def dynamic(self) -> bool:
        return True

    def rule_params(self) -> RuleParams:
        backoff = self.backoff_factor
        return RuleParams(
            dynamic=True,
            initial_scale=self.initial_loss_scale,
            growth_interval=self.increment_period,
            growth_factor=self.multiplier,
            backoff_multiplier=1.0 if backoff is None else backoff,
            backoff_divisor=self.multiplier if backoff is None else 1.0,
            hysteresis=self.hysteresis,
            min_scale=self.min_loss_scale,
            max_scale=self.max_loss_scale,
        )

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "initial_loss_scale": self.initial_loss_scale,
            "increment_period": self.increment_period,
            "multiplier": self.multiplier,
        }
        # Extensions appear only when they differ from TF, so a TF-style policy has exactly TF's config.
        for f in fields(self):
            if f.kw_only and getattr(self, f.name) != f.default:
                config[f.name] = getattr(self, f.name)
        return config


@dataclass(frozen=True, repr=False)
class FixedLossScaleManager(LossScale):
    """contrib's fixed manager: the same as ``FixedLossScale(loss_scale)``."""

    loss_scale: float

    def __post_init__(self) -> None:
        value = _n.scale("loss_scale", self.loss_scale)
        if value < 1:
            raise ValueError(f"loss_scale must be at least 1, got {value!r}. Use FixedLossScaleManager(1) for no scaling.")
        _set(self, loss_scale=value)

    @property
    def dynamic(self) -> bool:
        return False

    def rule_params(self) -> RuleParams:
        return FixedLossScale(self.loss_scale).rule_params()

    def get_config(self) -> dict[str, Any]:
        return {"loss_scale": self.loss_scale}


@dataclass(frozen=True, repr=False)
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

    init_loss_scale: float
    incr_every_n_steps: int
    decr_every_n_nan_or_inf: int = 2
    incr_ratio: float = 2.0
    decr_ratio: float = 0.8

    def __post_init__(self) -> None:
        _set(
            self,
            init_loss_scale=_n.scale("init_loss_scale", self.init_loss_scale, at_least=1.0),
            incr_every_n_steps=_n.count("incr_every_n_steps", self.incr_every_n_steps),
            decr_every_n_nan_or_inf=_n.count("decr_every_n_nan_or_inf", self.decr_every_n_nan_or_inf),
            incr_ratio=_n.above_one("incr_ratio", self.incr_ratio),
            decr_ratio=_n.fraction("decr_ratio", self.decr_ratio),
        )

    @property
    def dynamic(self) -> bool:
        return True

    def rule_params(self) -> RuleParams:
        return RuleParams(
            dynamic=True,
            initial_scale=self.init_loss_scale,
            growth_interval=self.incr_every_n_steps,
            growth_factor=self.incr_ratio,
            backoff_multiplier=self.decr_ratio,
            backoff_divisor=1.0,
            hysteresis=self.decr_every_n_nan_or_inf,
            min_scale=1.0,
            max_scale=None,
        )

    def get_config(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: The classes lossscale 0.1 pickled by name (read by :func:`_from_config`); the registry is in :mod:`._resolve`.
_PICKLED_BY_NAME: dict[str, type[LossScale]] = {
    cls.__name__: cls
    for cls in (FixedLossScale, DynamicLossScale, FixedLossScaleManager, ExponentialUpdateLossScaleManager)
}
