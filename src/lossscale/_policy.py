"""Loss-scale policies (TF's v1 and contrib classes and config keys): immutable, read by the rule as
:class:`RuleParams`. Arguments are checked and normalised to Python ``float``/``int``; 0-d int/float arrays of any
framework are accepted (one host read), bools and numbers the float32 rule cannot use are refused."""

from __future__ import annotations

import abc
import contextlib
import math
import operator
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import KW_ONLY, dataclass, fields
from numbers import Integral, Real
from typing import Any

import numpy as np

from ._errors import ArgumentTypeError, whole

__all__ = ["DynamicLossScale", "ExponentialUpdateLossScaleManager", "FixedLossScale", "FixedLossScaleManager",
           "LossScale", "RuleParams"]

#: Counters are int32 (JAX's default integer) and saturate here instead of wrapping.
COUNTER_MAX = 2**31 - 1
#: The largest float32 (the state holds the scale as float32).
FLOAT32_MAX = 3.4028234663852886e38
#: The smallest positive normal float32: a smaller scale rounds to 0 or loses precision.
FLOAT32_TINY = 1.1754943508222875e-38

#: The caller's names for the policies' arguments while a policy is built on its behalf (the stable form's
#: ``initial_scale``, torch GradScaler's ``init_scale``...). Every validation message names an argument through
#: :func:`caller_name`, so each message is written once and speaks the caller's words.
_CALLER_NAMES: ContextVar[Mapping[str, str] | None] = ContextVar("lossscale_caller_names", default=None)


def caller_name(name: str) -> str:
    """``name`` as the caller spells it (itself outside :func:`caller_names`)."""
    names = _CALLER_NAMES.get()
    return name if names is None else names.get(name, name)


@contextlib.contextmanager
def caller_names(names: Mapping[str, str]) -> Iterator[None]:
    """Within the block, validation messages name a policy's argument ``k`` as ``names[k]``.

    Args:
        names: the policy's argument name -> the caller's.
    """
    token = _CALLER_NAMES.set(dict(names))
    try:
        yield
    finally:
        _CALLER_NAMES.reset(token)

def float32(value: float) -> float:
    """``value`` rounded to float32, as the rule's arithmetic sees it (inf beyond float32's range)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _kind(value: Any) -> str:
    """``"bool"``, ``"complex"``, ``"int"``, ``"float"`` or ``""`` from a dtype's name (numpy, JAX, torch spellings)."""
    dtype = str(getattr(value, "dtype", "")).lower()
    for kind in ("bool", "complex", "int", "float"):  # in this order: "complex64" has no "int", "uint8" has
        if kind in dtype:
            return kind
    return ""


def _scalar(name: str, value: Any, fix: str, what: str) -> Any:
    """``value`` if it is a real scalar or a 0-d int/float array, else an :class:`ArgumentTypeError` (a TypeError
    and a ValueError) naming ``fix``."""
    name = caller_name(name)
    if isinstance(value, bool) or _kind(value) == "bool":
        raise ArgumentTypeError(f"{name} must be {what}, got the bool {value!r}. {fix}")
    if isinstance(value, Real):
        return value
    shape = getattr(value, "shape", None)
    if shape is None or isinstance(value, (str, bytes)):
        raise ArgumentTypeError(f"{name} must be {what}, got {value!r} of type {type(value).__name__}. {fix}")
    if tuple(shape) != ():
        raise ArgumentTypeError(
            f"{name} must be {what} or a 0-d array, got an array of shape {tuple(shape)}. "
            f"Pass a single number (e.g. x.item() or x[0]). {fix}"
        )
    if _kind(value) not in ("int", "float"):
        raise ArgumentTypeError(f"{name} must be {what}, got a 0-d array of dtype {getattr(value, 'dtype', None)}. {fix}")
    return value


def _concrete(name: str, value: Any, convert: Any, fix: str) -> Any:
    name = caller_name(name)
    try:
        return convert(value)
    except OverflowError as error:  # an int beyond float64 (10**400): a value error, not a tracer
        raise ValueError(f"{name} must be finite, got an int of {len(str(value))} digits. {fix}") from error
    except Exception as error:  # e.g. a JAX tracer: the value is not known when tracing
        raise TypeError(
            f"{name} must be a concrete number, got {type(value).__name__} ({error.__class__.__name__}); "
            f"build the policy outside jit. {fix}"
        ) from error


def number(name: str, value: Any, fix: str) -> float:
    """``value`` as a finite Python float."""
    name = caller_name(name)
    value = _concrete(name, _scalar(name, value, fix, "a real number"), float, fix)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}. {fix}")
    return value


def scale(name: str, value: Any, *, at_least: float | None = None, example: str = "2**15") -> float:
    """A loss scale: positive, and a normal float32 number (between about 1.2e-38 and 3.4e38)."""
    name = caller_name(name)
    fix = f"Pass a positive finite number, for example {name}={example}."
    value = number(name, value, fix)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}. {fix}")
    if value > FLOAT32_MAX:
        raise ValueError(f"{name}={value!r} is not finite in float32, the loss scale's dtype (max about 3.4e38). {fix}")
    if value < FLOAT32_TINY:
        raise ValueError(
            f"{name}={value!r} is below float32's smallest normal number (about 1.2e-38): in the float32 state it "
            f"would round to 0 (every step then skipped) or lose precision. {fix}"
        )
    if at_least is not None and value < at_least:
        raise ValueError(f"{name} must be at least {at_least:g}, got {value!r}.")
    return value


def count(name: str, value: Any, *, at_least: int = 1) -> int:
    """A step count: a whole number in ``[at_least, 2**31 - 1]`` (the counters are int32), as a Python int. A
    float that is whole (``2000.0``, ``2e3``, a 0-d float array of one) is taken as that int, as TensorFlow's
    ``int()`` took it; one that is not (``2.5``) is refused, where TensorFlow truncated it."""
    name = caller_name(name)
    example = max(at_least, 2)
    fix = f"Pass a whole number, for example {name}={example}."
    value = _scalar(name, value, fix, "an int")
    if not (isinstance(value, Integral) or (not isinstance(value, Real) and _kind(value) == "int")):
        number = whole(_concrete(name, value, float, fix))  # a whole float (2000.0, 2e3) is the int it spells
        if not isinstance(number, int):
            dtype = "" if isinstance(value, Real) else f" (dtype {value.dtype})"
            raise ArgumentTypeError(
                f"{name} must be an int, got {value!r} of type {type(value).__name__}{dtype}. {fix}"
            )
        value = number
    value = _concrete(name, value, operator.index, fix)
    if not at_least <= value <= COUNTER_MAX:
        shown = value if abs(value) < 10**30 else f"an int of {len(str(abs(value)))} digits"
        raise ValueError(
            f"{name} must be an int in [{at_least}, 2**31 - 1] (the counters are int32), got {shown}. "
            f"Pass for example {name}={example}."
        )
    return value


def factor(name: str, value: Any, *, grows: bool) -> float:
    """A growth factor (``grows``: above 1) or a backoff factor (in (0, 1)), that stays one once rounded to float32."""
    name = caller_name(name)
    example = "2.0" if grows else "0.5"
    fix = f"Use for example {name}={example}."
    what = "a finite number above 1" if grows else "a number in (0, 1)"
    value = number(name, value, f"Pass {what}, for example {name}={example}.")
    if grows and value <= 1.0:
        raise ValueError(f"{name} must be greater than 1 so the scale can grow, got {value!r}. {fix}")
    if not grows and not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in the open interval (0, 1) so the scale shrinks, got {value!r}. {fix}")
    rounded = float32(value)
    if (rounded == 1.0 or math.isinf(rounded)) if grows else not 0.0 < rounded < 1.0:
        never = ("grow" if rounded == 1.0 else "grow (the grown scale is never finite)") if grows else (
            "shrink" if rounded == 1.0 else "back off to anything but the floor")
        raise ValueError(f"{name}={value!r} is {rounded!r} in float32, the loss scale's dtype: the scale would never "
                         f"{never}. {fix}")
    return value


def scale_bounds(initial: Any, min_loss_scale: Any, max_loss_scale: Any) -> tuple[float, float, float | None]:
    """``(initial, min, max)`` checked as loss scales, with ``min <= initial <= max`` (``max`` None: no ceiling)."""
    min_scale = scale("min_loss_scale", min_loss_scale, example="1.0")
    max_scale = None
    if max_loss_scale is not None:
        max_scale = scale("max_loss_scale", max_loss_scale, at_least=min_scale, example="2**24")
    initial_scale = scale("initial_loss_scale", initial)
    initial_name, min_name, max_name = map(caller_name, ("initial_loss_scale", "min_loss_scale", "max_loss_scale"))
    if initial_scale < min_scale:
        raise ValueError(
            f"{initial_name}={initial_scale!r} is below {min_name}={min_scale!r}; "
            f"raise {initial_name} or lower {min_name}."
        )
    if max_scale is not None and initial_scale > max_scale:
        raise ValueError(
            f"{initial_name}={initial_scale!r} is above {max_name}={max_scale!r}; "
            f"lower {initial_name} or raise {max_name}."
        )
    return initial_scale, min_scale, max_scale


@dataclass(frozen=True)
class RuleParams:
    """What the update rule (:func:`lossscale.next_state`) reads of a policy, as plain Python numbers; two backoff
    constants keep TF's ``scale / multiplier`` and contrib's ``scale * decr_ratio`` exact (the other is 1).

    Built by :meth:`LossScale.rule_params`; a frozen dataclass, so it can key a cache and be a static argument of
    ``jax.jit``.

    Args:
        dynamic: False: the scale and ``good_steps``/``bad_steps`` never move (only the skip counters do).
        initial_scale: the scale at step 0.
        growth_interval: finite steps in a row before the scale grows.
        growth_factor: what the scale is multiplied by when it grows (a growth to a non-finite scale is refused).
        backoff_multiplier: a backoff multiplies the scale by this (contrib's ``decr_ratio``; else 1).
        backoff_divisor: and divides it by this (TF's ``multiplier``; else 1).
        hysteresis: non-finite steps, counted since the scale last changed, before it backs off.
        min_scale: the floor a backoff stops at.
        max_scale: the ceiling a growth stops at, or None for none.
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


class LossScale(abc.ABC):
    """Base class of every loss-scale policy: an immutable value (equal configs, equal policies).

    Subclasses define :attr:`dynamic`, :meth:`get_config` and :meth:`rule_params`. A policy pickles as its class
    and config, validated again when unpickled."""

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


def _extensions(policy: Any) -> dict[str, Any]:
    """The keyword-only fields that differ from their defaults: a TF-style policy has exactly TF's config."""
    values = {f.name: (getattr(policy, f.name), f.default) for f in fields(policy) if f.kw_only}
    return {name: value for name, (value, default) in values.items() if value != default}


def _fixed_value(name: str, value: Any, cls: str = "FixedLossScale") -> float:
    """A fixed scale, checked under the name the caller passed it as (``loss_scale_value`` or ``loss_scale``)."""
    name = caller_name(name)
    value = scale(name, value)
    if value < 1:
        raise ValueError(
            f"{name} must be at least 1, got {value!r}: a scale below 1 makes small gradients "
            f"underflow sooner instead of later. Use {cls}(1) for no scaling."
        )
    return value


@dataclass(frozen=True, repr=False)
class FixedLossScale(LossScale):
    """A loss scale that never changes.

    Args:
        loss_scale_value: the scale, a finite number >= 1 (as in TF). ``FixedLossScale(1)`` is skip-only mode:
            no scaling, but steps with a non-finite gradient are still skipped (useful with bfloat16).

    >>> FixedLossScale(128).get_config()
    {'loss_scale_value': 128.0}
    """

    dynamic = False
    loss_scale_value: float

    def __post_init__(self) -> None:
        _set(self, loss_scale_value=_fixed_value("loss_scale_value", self.loss_scale_value))

    def rule_params(self) -> RuleParams:
        value = self.loss_scale_value
        return RuleParams(dynamic=False, initial_scale=value, min_scale=value, max_scale=value)

    def get_config(self) -> dict[str, Any]:
        return {"loss_scale_value": self.loss_scale_value}


@dataclass(frozen=True, repr=False)
class DynamicLossScale(LossScale):
    """TF's dynamic loss scale, with keyword-only extensions.

    The rule per step, exactly TF's at the keyword-only extensions' defaults, with ``n`` the count of finite steps
    since the scale last changed and ``b`` the count of non-finite ones::

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

    Args:
        initial_loss_scale: the scale at step 0.
        increment_period: finite steps in a row before the scale grows.
        multiplier: the growth factor, and TF's backoff divisor.
        min_loss_scale: the floor (TF: 1); any normal float32 (>= about 1.2e-38).
        max_loss_scale: an optional ceiling; growth is clamped to it.
        backoff_factor: if given, in (0, 1): a backoff multiplies the scale by it instead of dividing by ``multiplier``.
        hysteresis: non-finite steps since the scale last changed before it backs off (contrib's
            ``decr_every_n_nan_or_inf``; 1 is TF's rule).

    Every number may also be a 0-d array (numpy, JAX, torch).

    >>> DynamicLossScale(initial_loss_scale=2048, increment_period=500).get_config()
    {'initial_loss_scale': 2048.0, 'increment_period': 500, 'multiplier': 2.0}
    """

    dynamic = True
    initial_loss_scale: float = 2.0**15
    increment_period: int = 2000
    multiplier: float = 2.0
    _: KW_ONLY
    min_loss_scale: float = 1.0
    max_loss_scale: float | None = None
    backoff_factor: float | None = None
    hysteresis: int = 1

    def __post_init__(self) -> None:
        initial, min_scale, max_scale = scale_bounds(self.initial_loss_scale, self.min_loss_scale, self.max_loss_scale)
        backoff = self.backoff_factor
        _set(
            self,
            initial_loss_scale=initial,
            increment_period=count("increment_period", self.increment_period),
            multiplier=factor("multiplier", self.multiplier, grows=True),
            min_loss_scale=min_scale,
            max_loss_scale=max_scale,
            backoff_factor=None if backoff is None else factor("backoff_factor", backoff, grows=False),
            hysteresis=count("hysteresis", self.hysteresis),
        )

    def rule_params(self) -> RuleParams:
        backoff = self.backoff_factor
        return RuleParams(
            True, self.initial_loss_scale, self.increment_period, self.multiplier,
            backoff_multiplier=1.0 if backoff is None else backoff,
            backoff_divisor=self.multiplier if backoff is None else 1.0,
            hysteresis=self.hysteresis, min_scale=self.min_loss_scale, max_scale=self.max_loss_scale,
        )

    def get_config(self) -> dict[str, Any]:
        tf = {"initial_loss_scale": self.initial_loss_scale, "increment_period": self.increment_period}
        return {**tf, "multiplier": self.multiplier, **_extensions(self)}


@dataclass(frozen=True, repr=False)
class FixedLossScaleManager(LossScale):
    """contrib's fixed manager: the same as ``FixedLossScale(loss_scale)``.

    Args:
        loss_scale: the scale, a finite number >= 1.
    """

    dynamic = False
    loss_scale: float

    def __post_init__(self) -> None:
        _set(self, loss_scale=_fixed_value("loss_scale", self.loss_scale, "FixedLossScaleManager"))

    def rule_params(self) -> RuleParams:
        return FixedLossScale(self.loss_scale).rule_params()

    def get_config(self) -> dict[str, Any]:
        return {"loss_scale": self.loss_scale}


@dataclass(frozen=True, repr=False)
class ExponentialUpdateLossScaleManager(LossScale):
    """contrib's dynamic manager, with contrib's exact rule (:class:`DynamicLossScale` with ``hysteresis`` and
    ``backoff_factor`` set): the scale is multiplied by ``incr_ratio`` (if the product is finite) after
    ``incr_every_n_steps`` finite steps in a row, and by ``decr_ratio`` (floored at 1) after
    ``decr_every_n_nan_or_inf`` non-finite steps counted since the scale last changed.

    Args:
        init_loss_scale: the scale at step 0, a finite number >= 1 (contrib accepted less, but its floor of 1
            made the first backoff raise such a scale to 1).
        incr_every_n_steps: finite steps in a row before the scale grows, an int >= 1.
        decr_every_n_nan_or_inf: non-finite steps (since the scale last changed) before it backs off (default 2).
        incr_ratio: the growth factor, > 1 (default 2.0).
        decr_ratio: the backoff factor, in (0, 1) (default 0.8); the scale never goes under 1.
    """

    dynamic = True
    init_loss_scale: float
    incr_every_n_steps: int
    decr_every_n_nan_or_inf: int = 2
    incr_ratio: float = 2.0
    decr_ratio: float = 0.8

    def __post_init__(self) -> None:
        _set(
            self,
            init_loss_scale=scale("init_loss_scale", self.init_loss_scale, at_least=1.0),
            incr_every_n_steps=count("incr_every_n_steps", self.incr_every_n_steps),
            decr_every_n_nan_or_inf=count("decr_every_n_nan_or_inf", self.decr_every_n_nan_or_inf),
            incr_ratio=factor("incr_ratio", self.incr_ratio, grows=True),
            decr_ratio=factor("decr_ratio", self.decr_ratio, grows=False),
        )

    def rule_params(self) -> RuleParams:
        return RuleParams(
            True, self.init_loss_scale, self.incr_every_n_steps, self.incr_ratio,
            backoff_multiplier=self.decr_ratio, hysteresis=self.decr_every_n_nan_or_inf,
        )

    def get_config(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: The classes lossscale 0.1 pickled by name (read by :func:`_from_config`); the registry is in :mod:`._resolve`.
_PICKLED_BY_NAME: dict[str, type[LossScale]] = {
    c.__name__: c for c in (FixedLossScale, DynamicLossScale, FixedLossScaleManager, ExponentialUpdateLossScaleManager)
}
