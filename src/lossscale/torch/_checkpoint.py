"""The checkpoint records: built and validated in one place, used by ``state_dict``, ``load_state_dict`` and pickle.

A ``LossScaleOptimizer.state_dict()`` is the inner optimizer's state dict
plus one ``"lossscale"`` entry (a ``SharedLossScale.state_dict()`` is its
first two keys)::

    {"policy": serialize(policy),                # ScaleRecord (older checkpoints: "loss_scale")
     "state": {"loss_scale": f32, "good_steps": i32, "bad_steps": i32,
               "skipped_steps": i32, "consecutive_skips": i32},
     "optimizer": {"steps": int,                 # CounterRecord: this optimizer's own counters
                   "skipped_steps": i32 | None,
                   "consecutive_skips": i32 | None}}

Every reader goes through :meth:`ScaleRecord.from_dict`,
:meth:`CounterRecord.from_dict`, :meth:`Checkpoint.from_state_dict` or
:func:`gradscaler_record`, which check *everything* and copy every tensor
before anything is loaded: a malformed entry raises ``ValueError`` and
leaves the object as it was. Pickling and ``deepcopy`` use the same records
(the policy then travels as the object itself, by reference to its class,
as pickle does). A policy class of your own is rebuilt from a checkpoint
only through ``custom_objects`` or when it is the class already in use:
no class is imported by a name read from a checkpoint.

``lossscale.torch.GradScaler``'s record is torch's five keys plus one
``"lossscale"`` entry, plain values only (see :func:`gradscaler_state_dict`).
Cost: a handful of 0-d tensor copies; no host sync for tensors already on
the CPU (a checkpoint read from disk).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import torch

from .._policy import DynamicLossScale, LossScale
from .._resolve import _BUILTINS, built_in_names, get, serialize
from .._rule import COUNTER_MAX, LossScaleState
from .._validate import check_counter, check_scale, plain
from ._validated import counter_tensor, refuse_extra, state_tensors

__all__ = [
    "Checkpoint",
    "CounterRecord",
    "ScaleRecord",
    "gradscaler_record",
    "gradscaler_state_dict",
    "read_policy",
    "replace_policy",
    "with_torch_names",
]

def _not_a_state_dict(detail: str) -> ValueError:
    return ValueError(f"Not a lossscale state dict ({detail}); pass what state_dict() returned.")


def read_policy(saved: Any, custom_objects: Mapping[str, type] | None, current: LossScale | None) -> LossScale:
    """The policy a record holds: a policy object (pickling), or a serialized one, rebuilt without imports.

    The class is looked up in ``custom_objects``, then among the built-in
    policies; the class of ``current`` (the policy in use) counts as given.
    """
    if isinstance(saved, LossScale):
        return saved
    custom = {} if current is None or type(current).__module__ == LossScale.__module__ else {
        type(current).__name__: type(current)
    }
    if custom_objects is not None:
        if not isinstance(custom_objects, Mapping):
            raise TypeError(
                f"custom_objects must be a dict of class name to class, got {type(custom_objects).__name__}."
            )
        custom.update(custom_objects)
    try:
        policy = get(saved, custom_objects=custom or None)
    except (TypeError, ValueError) as error:
        name = saved.get("class_name") if isinstance(saved, Mapping) else None
        if isinstance(name, str) and name not in custom and name not in _BUILTINS:
            raise ValueError(
                f"This checkpoint's loss scale policy is unreadable: its class {name!r} is not a built-in policy. "
                f"Pass the class: "
                f"load_state_dict(state_dict, custom_objects={{{name!r}: {name}}}). No class is imported by name."
            ) from error
        raise ValueError(f"This checkpoint's loss scale policy is unreadable: {error}") from error
    if policy is None:
        raise _not_a_state_dict("it holds no loss scale policy")
    return policy


@dataclass(frozen=True)
class ScaleRecord:
    """A loss scale's policy and state tensors (copies), validated."""

    policy: LossScale
    state: LossScaleState

    def to_dict(self, *, policy_object: bool = False) -> dict[str, Any]:
        """``{"policy", "state"}``; ``policy_object`` keeps the policy itself (pickling) instead of its config."""
        return {
            "policy": self.policy if policy_object else serialize(self.policy),
            "state": {name: t.detach().clone() for name, t in self.state._asdict().items()},
        }

    @classmethod
    def from_dict(
        cls, saved: Any, custom_objects: Mapping[str, type] | None = None, current: LossScale | None = None
    ) -> ScaleRecord:
        if not isinstance(saved, Mapping):
            raise _not_a_state_dict(f"the loss scale entry is a {type(saved).__name__}")
        if "policy" in saved and "loss_scale" in saved:
            raise _not_a_state_dict("it holds both 'policy' and the older 'loss_scale' key; keep 'policy'")
        key = "policy" if "policy" in saved else "loss_scale"  # "loss_scale": checkpoints before one key
        if key not in saved or not isinstance(saved.get("state"), Mapping):
            raise _not_a_state_dict(f"missing 'policy' or 'state' among {sorted(map(str, saved))}")
        refuse_extra(saved, (key, "state", "optimizer"), "the 'lossscale' entry")
        policy = read_policy(saved[key], custom_objects, current)
        return cls(policy, state_tensors(saved["state"], policy, "the 'lossscale' entry's state"))


@dataclass(frozen=True)
class CounterRecord:
    """One optimizer's own counters: ``step()`` calls that stepped or skipped, its skips, its skip streak.

    ``skipped_steps``/``consecutive_skips`` are None in checkpoints written
    before they were kept per optimizer; the loader then takes the scale's.
    """

    steps: int = 0
    skipped_steps: torch.Tensor | None = None
    consecutive_skips: torch.Tensor | None = None

    def to_dict(self) -> dict[str, Any]:
        copy = lambda t: None if t is None else t.detach().clone()
        return {
            "steps": self.steps,
            "skipped_steps": copy(self.skipped_steps),
            "consecutive_skips": copy(self.consecutive_skips),
        }

    @classmethod
    def from_dict(cls, saved: Any) -> CounterRecord:
        if saved is None:
            return cls()
        if not isinstance(saved, Mapping):
            raise _not_a_state_dict(f"the optimizer entry is a {type(saved).__name__}")
        steps = saved.get("steps", 0)
        if isinstance(steps, torch.Tensor) and steps.numel() == 1 and not steps.is_floating_point():
            steps = int(steps)
        if isinstance(steps, bool) or not isinstance(steps, Integral) or steps < 0:
            raise ValueError(f"Not a lossscale state dict: its step count is {steps!r}; pass what state_dict() returned.")
        refuse_extra(saved, ("steps", "skipped_steps", "consecutive_skips"), "the 'lossscale' entry's optimizer")
        counts = [
            None if saved.get(name) is None else counter_tensor(f"the 'lossscale' entry's optimizer[{name!r}]", saved[name])
            for name in ("skipped_steps", "consecutive_skips")
        ]
        return cls(int(steps), *counts)


@dataclass(frozen=True)
class Checkpoint:
    """A ``LossScaleOptimizer`` state dict, split and validated: the inner part and the lossscale records."""

    inner: dict[str, Any]
    scale: ScaleRecord | None
    counters: CounterRecord | None

    @classmethod
    def from_state_dict(
        cls, state_dict: Any, custom_objects: Mapping[str, type] | None = None, current: LossScale | None = None
    ) -> Checkpoint:
        """Splits and checks ``state_dict`` (not modified). A plain inner state dict has no lossscale records."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict() takes a dict, as state_dict() returns; got {type(state_dict).__name__}.")
        inner = dict(state_dict)
        saved = inner.pop("lossscale", None)
        if saved is None:
            return cls(inner, None, None)
        if not isinstance(saved, Mapping):
            raise _not_a_state_dict(f"its 'lossscale' entry is a {type(saved).__name__}")
        for key in ("state", "param_groups"):
            if key not in inner:
                raise _not_a_state_dict(f"the inner optimizer's {key!r} is missing")
        scale = ScaleRecord.from_dict(saved, custom_objects, current)
        return cls(inner, scale, CounterRecord.from_dict(saved.get("optimizer")))

    def to_state_dict(self) -> dict[str, Any]:
        state = dict(self.inner)
        if self.scale is not None:
            counters = self.counters or CounterRecord()
            state["lossscale"] = {**self.scale.to_dict(), "optimizer": counters.to_dict()}
        return state


# ------------------------------------------------------------ GradScaler's record

TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
_COUNTERS = ("bad_steps", "skipped_steps", "consecutive_skips")

# lossscale's argument names in validation errors, and torch's names for them.
_TORCH_NAMES = (
    ("initial_loss_scale", "init_scale"),
    ("increment_period", "growth_interval"),
    ("multiplier", "growth_factor"),
)


def with_torch_names(build: Any, *args: Any, **kwargs: Any) -> Any:
    """``build(*args, **kwargs)``, with a validation error re-raised in ``torch.amp.GradScaler``'s argument names."""
    return built_in_names(_TORCH_NAMES, build, *args, **kwargs)


def growth_interval(value: Any) -> int:
    """torch's ``growth_interval``: any int >= 1, saturated at 2**31 - 1 (the growth counter is int32).

    A counter that saturates at 2**31 - 1 cannot tell a longer interval from
    that one, so nothing is lost: torch's "huge growth_interval" idiom for a
    fixed scale keeps working.
    """
    fix = "Pass a positive whole number of steps, for example growth_interval=2000 (torch's default)."
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"growth_interval must be an int, got {value!r} of type {type(value).__name__}. {fix}")
    if value < 1:
        raise ValueError(f"growth_interval must be at least 1, got {value!r}. {fix}")
    return min(int(value), COUNTER_MAX)


def replace_policy(policy: DynamicLossScale, **changes: Any) -> DynamicLossScale:
    """``policy`` with torch-named fields changed (``growth_factor``, ``backoff_factor``, ``growth_interval``)."""
    ours = {"growth_factor": "multiplier", "backoff_factor": "backoff_factor", "growth_interval": "increment_period"}
    if "growth_interval" in changes:
        changes["growth_interval"] = growth_interval(changes["growth_interval"])
    return with_torch_names(dataclasses.replace, policy, **{ours[k]: v for k, v in changes.items()})


def gradscaler_state_dict(policy: DynamicLossScale, state: LossScaleState) -> dict[str, Any]:
    """The state dict of a GradScaler following ``policy`` with ``state`` (one host sync)."""
    scale, good, bad, skipped, streak = torch.stack([t.detach().double() for t in state]).tolist()
    return {
        "scale": scale,
        "growth_factor": policy.multiplier,
        "backoff_factor": policy.backoff_factor,
        "growth_interval": policy.increment_period,
        "_growth_tracker": int(good),
        "lossscale": {
            "policy": serialize(policy),
            "bad_steps": int(bad),
            "skipped_steps": int(skipped),
            "consecutive_skips": int(streak),
        },
    }


def _fail(detail: str) -> ValueError:
    return ValueError(
        f"Not a GradScaler state dict ({detail}). Pass what state_dict() of lossscale.torch.GradScaler or "
        "torch.amp.GradScaler returned."
    )


def _number(saved: Mapping, key: str, integral: bool = False) -> Any:
    value = saved[key]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()  # a 0-d tensor from an old checkpoint: read once, at load time
    if isinstance(value, bool) or not isinstance(value, Integral if integral else Real):
        raise _fail(f"{key!r} is {value!r}, not {'an int' if integral else 'a number'}")
    if integral and value < 0:
        raise _fail(f"{key!r} is {value!r}, not a count")
    if integral:
        return min(int(value), COUNTER_MAX)  # growth_interval: torch's "huge interval" idiom saturates
    try:
        return float(value)
    except OverflowError:  # an int beyond float64 (10**400)
        raise _fail(f"{key!r} is an int of {len(str(value))} digits, not a finite number") from None


def gradscaler_record(
    saved: Any, policy: DynamicLossScale, state: LossScaleState, custom_objects: Mapping[str, type] | None = None
) -> ScaleRecord:
    """The validated record ``saved`` describes, for a GradScaler now at ``policy``/``state``; nothing is changed.

    Raises:
        RuntimeError: ``saved`` is empty (torch's message: a disabled scaler's).
        ValueError: a key is missing or malformed, naming it.
    """
    if not isinstance(saved, Mapping):
        raise TypeError(f"load_state_dict() takes a dict, as state_dict() returns; got {type(saved).__name__}.")
    if len(saved) == 0:
        raise RuntimeError(
            "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
        )
    missing = [key for key in TORCH_KEYS if key not in saved]
    if missing:
        raise _fail(f"missing {missing}")
    ours = saved.get("lossscale")
    if ours is not None and not isinstance(ours, Mapping):
        raise _fail(f"its 'lossscale' entry is a {type(ours).__name__}")
    if ours is not None:
        base = read_policy(ours.get("policy"), custom_objects, policy)
        if not isinstance(base, DynamicLossScale):
            raise _fail(f"its policy is {base!r}, not a DynamicLossScale")
        policy = base
    policy = replace_policy(
        policy,
        growth_factor=_number(saved, "growth_factor"),
        backoff_factor=_number(saved, "backoff_factor"),
        growth_interval=_number(saved, "growth_interval", integral=True),
    )
    if ours is not None:
        refuse_extra(ours, ("policy", *_COUNTERS), "state_dict['lossscale']")
    # torch's scale can fall to 0 or below 1: a finite one is clamped into [min, max]; one not finite in float32
    # (NaN, inf, 1e39, 10**400) is refused. Counters: ints in [0, 2**31 - 1], refused otherwise (never wrapped).
    _number(saved, "_growth_tracker", integral=True)  # type errors in torch's words first
    for name in _COUNTERS:
        if ours is not None and name in ours:
            _number(ours, name, integral=True)
    try:
        scale = check_scale("state_dict['scale']", plain(saved["scale"]), policy, clamp=True)
        tracker = check_counter("state_dict['_growth_tracker']", plain(saved["_growth_tracker"]))
        counts = {
            name: check_counter(f"state_dict['lossscale'][{name!r}]", plain(ours[name]))
            for name in _COUNTERS
            if ours is not None and name in ours
        }
    except (TypeError, ValueError) as error:
        raise _fail(str(error)) from error
    tensors = [torch.tensor(scale, dtype=torch.float32), _count(tracker)]
    for index, name in enumerate(_COUNTERS, start=2):
        if name in counts:
            tensors.append(_count(counts[name]))
        elif name == "bad_steps":
            tensors.append(_count(0))  # torch keeps no overflow count: start afresh with torch's scale
        else:
            tensors.append(state[index].detach().clone())  # torch keeps no skip counts: ours go on
    return ScaleRecord(policy, LossScaleState(*tensors))


def _count(value: int) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.int32)
