"""Checkpoints and pickles of the torch binding: tensors <-> the core's one load rule, and the atomic inner load.
Every field is checked and copied before anything loads (one ``.item()`` and one 0-d copy each)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch

from .._checkpoint import FIELDS, check_counter, check_scale, plain, read_policy, read_record, refuse_extra
from .._policy import DynamicLossScale, LossScale
from .._resolve import built_in_names, serialize
from .._rule import COUNTER_MAX, LossScaleState

__all__ = ["Checkpoint", "CounterRecord", "ScaleRecord", "gradscaler_record", "gradscaler_state_dict", "load_inner",
           "read_policy", "replace_policy", "with_torch_names"]

_NOT_OURS = "Not a lossscale state dict"


def _not_a_state_dict(detail: str) -> ValueError:
    return ValueError(f"{_NOT_OURS} ({detail}); pass what state_dict() returned.")


def _tensor(value: Any, saved: Any) -> torch.Tensor:
    """A new 0-d tensor of a checked numpy value, on the device of the saved value."""
    return torch.tensor(value, device=saved.device if isinstance(saved, torch.Tensor) else "cpu")


def _refused(error: Exception) -> ValueError:
    return ValueError(f"{_NOT_OURS}: {error}")


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
    def from_dict(cls, saved: Any, custom_objects: Mapping[str, type] | None = None,
                  current: LossScale | None = None) -> ScaleRecord:
        if not isinstance(saved, Mapping):
            raise _not_a_state_dict(f"the loss scale entry is a {type(saved).__name__}")
        if "policy" in saved and "loss_scale" in saved:
            raise _not_a_state_dict("it holds both 'policy' and the older 'loss_scale' key; keep 'policy'")
        key = "policy" if "policy" in saved else "loss_scale"  # "loss_scale": checkpoints before one key
        if key not in saved or not isinstance(saved.get("state"), Mapping):
            raise _not_a_state_dict(f"missing 'policy' or 'state' among {sorted(map(str, saved))}")
        refuse_extra(saved, (key, "state", "optimizer"), "the 'lossscale' entry", f"{_NOT_OURS}: ")
        policy, state = read_policy(saved[key], custom_objects, current), saved["state"]
        try:
            values = read_record(state, policy, where="the 'lossscale' entry's state", extra="refuse")[1]
        except (TypeError, ValueError) as error:
            raise _refused(error) from error
        return cls(policy, LossScaleState(*(_tensor(values[name], state[name]) for name in FIELDS)))


@dataclass(frozen=True)
class CounterRecord:
    """One optimizer's ``step()`` calls, skips and skip streak (the last two None in older checkpoints)."""

    steps: int = 0
    skipped_steps: torch.Tensor | None = None
    consecutive_skips: torch.Tensor | None = None

    def to_dict(self) -> dict[str, Any]:
        copy = lambda t: None if t is None else t.detach().clone()
        return {"steps": self.steps, "skipped_steps": copy(self.skipped_steps),
                "consecutive_skips": copy(self.consecutive_skips)}

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
            raise ValueError(f"{_NOT_OURS}: its step count is {steps!r}; pass what state_dict() returned.")
        refuse_extra(saved, ("steps", "skipped_steps", "consecutive_skips"), "the 'lossscale' entry's optimizer",
                     f"{_NOT_OURS}: ")
        try:
            where = "the 'lossscale' entry's optimizer"
            counts = {name: _tensor(np.int32(check_counter(f"{where}[{name!r}]", saved[name])), saved[name])
                      for name in ("skipped_steps", "consecutive_skips") if saved.get(name) is not None}
        except (TypeError, ValueError) as error:
            raise _refused(error) from error
        return cls(int(steps), **counts)


@dataclass(frozen=True)
class Checkpoint:
    """A ``LossScaleOptimizer`` state dict, split and validated: the inner part and the lossscale records."""

    inner: dict[str, Any]
    scale: ScaleRecord | None
    counters: CounterRecord | None

    @classmethod
    def from_state_dict(cls, state_dict: Any, custom_objects: Mapping[str, type] | None = None,
                        current: LossScale | None = None) -> Checkpoint:
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


TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
_COUNTERS = ("bad_steps", "skipped_steps", "consecutive_skips")

_TORCH_NAMES = (("initial_loss_scale", "init_scale"), ("increment_period", "growth_interval"),
                ("multiplier", "growth_factor"))
#: ``with_torch_names(build, *args, **kwargs)``: ``build(...)``, a validation error in torch GradScaler's names.
with_torch_names = functools.partial(built_in_names, _TORCH_NAMES)


def growth_interval(value: Any) -> int:
    """torch's ``growth_interval``: any int >= 1, saturated at 2**31 - 1 (torch's "huge interval" idiom works)."""
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
        "scale": scale, "growth_factor": policy.multiplier, "backoff_factor": policy.backoff_factor,
        "growth_interval": policy.increment_period, "_growth_tracker": int(good),
        "lossscale": {"policy": serialize(policy), "bad_steps": int(bad), "skipped_steps": int(skipped),
                      "consecutive_skips": int(streak)},
    }


def _fail(detail: str) -> ValueError:
    return ValueError(f"Not a GradScaler state dict ({detail}). Pass what state_dict() of lossscale.torch.GradScaler "
                      "or torch.amp.GradScaler returned.")


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


def gradscaler_record(saved: Any, policy: DynamicLossScale, state: LossScaleState,
                      custom_objects: Mapping[str, type] | None = None) -> ScaleRecord:
    """The validated record ``saved`` describes, for a GradScaler now at ``policy``/``state``. Raises RuntimeError
    if ``saved`` is empty (torch's message), ValueError naming a missing or malformed key."""
    if not isinstance(saved, Mapping):
        raise TypeError(f"load_state_dict() takes a dict, as state_dict() returns; got {type(saved).__name__}.")
    if len(saved) == 0:
        raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled instance "
                           "of GradScaler.")
    missing = [key for key in TORCH_KEYS if key not in saved]
    if missing:
        raise _fail(f"missing {missing}")
    ours = saved.get("lossscale")
    if ours is not None:
        if not isinstance(ours, Mapping):
            raise _fail(f"its 'lossscale' entry is a {type(ours).__name__}")
        base = read_policy(ours.get("policy"), custom_objects, policy)
        if not isinstance(base, DynamicLossScale):
            raise _fail(f"its policy is {base!r}, not a DynamicLossScale")
        policy = base
    policy = replace_policy(policy, growth_factor=_number(saved, "growth_factor"),
                            backoff_factor=_number(saved, "backoff_factor"),
                            growth_interval=_number(saved, "growth_interval", integral=True))
    if ours is not None:
        refuse_extra(ours, ("policy", *_COUNTERS), "state_dict['lossscale']", f"{_NOT_OURS}: ")
    ours = ours or {}
    # torch's scale can fall to 0 or below 1: a finite one is clamped into [min, max]; one not finite in float32
    # (NaN, inf, 1e39, 10**400) is refused. Counters: ints in [0, 2**31 - 1], refused otherwise (never wrapped).
    _number(saved, "_growth_tracker", integral=True)  # type errors in torch's words first
    for name in _COUNTERS:
        if name in ours:
            _number(ours, name, integral=True)
    try:
        scale = check_scale("state_dict['scale']", plain(saved["scale"]), policy, clamp=True)
        tracker = check_counter("state_dict['_growth_tracker']", plain(saved["_growth_tracker"]))
        counts = {name: check_counter(f"state_dict['lossscale'][{name!r}]", plain(ours[name]))
                  for name in _COUNTERS if name in ours}
    except (TypeError, ValueError) as error:
        raise _fail(str(error)) from error
    count = lambda value: torch.tensor(value, dtype=torch.int32)
    # torch keeps no overflow or skip counts: the former starts afresh with torch's scale, ours go on
    kept = [count(0), state.skipped_steps.detach().clone(), state.consecutive_skips.detach().clone()]
    counters = [count(counts[name]) if name in counts else old for name, old in zip(_COUNTERS, kept)]
    return ScaleRecord(policy, LossScaleState(torch.tensor(scale, dtype=torch.float32), count(tracker), *counters))



def _check_groups(inner: torch.optim.Optimizer, groups: Any) -> None:
    name = type(inner).__name__
    needed = set(getattr(inner, "defaults", {}) or {})
    for index, group in enumerate(groups if isinstance(groups, (list, tuple)) else []):
        missing = sorted(needed - set(group)) if isinstance(group, Mapping) else []
        if missing:
            raise ValueError(f"the saved param_groups[{index}] lacks {missing}, which {name} needs: the state dict "
                             f"was saved from another kind of optimizer. Load a state dict saved from {name} (or "
                             "build the optimizer it was saved from); the optimizer is unchanged.")


def _check(inner: torch.optim.Optimizer) -> None:
    _check_groups(inner, inner.param_groups)
    for group in inner.param_groups:
        for param in group["params"]:
            for key, value in inner.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                    raise ValueError(f"the saved state {key!r} of a parameter of shape {tuple(param.shape)} has "
                                     f"shape {tuple(value.shape)}: not this model's optimizer state. Load the state "
                                     "dict saved with this model.")


def load_inner(inner: torch.optim.Optimizer, saved: Mapping[str, Any]) -> None:
    """``inner.load_state_dict(saved)``, all or nothing: each group must hold every key of ``defaults`` and each
    state tensor be shaped like its parameter, else the kept state is loaded back and a ValueError names the cause."""
    kept = inner.state_dict()
    try:
        inner.load_state_dict(dict(saved))
        _check(inner)
    except Exception as error:
        inner.load_state_dict(kept)
        _check_groups(inner, saved.get("param_groups"))  # the likely cause, named (torch's own defaults filled in)
        if isinstance(error, ValueError):
            raise
        raise ValueError(
            f"Cannot load this state dict into {type(inner).__name__} ({type(error).__name__}: {error}); the "
            "optimizer is unchanged. Load a state dict saved from the same optimizer and model."
        ) from error
