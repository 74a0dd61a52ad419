"""``lossscale.torch.GradScaler``'s checkpoint: torch's five keys plus one ``"lossscale"`` entry, plain values only.

::

    {"scale": float, "growth_factor": float, "backoff_factor": float,      # torch.amp.GradScaler's keys,
     "growth_interval": int, "_growth_tracker": int,                      # same meaning
     "lossscale": {"policy": {"class_name": ..., "config": {...}},         # the whole policy (floor, ceiling, ...)
                   "bad_steps": int, "skipped_steps": int, "consecutive_skips": int}}

Floats, ints, strings and dicts only, so ``torch.load(weights_only=True)``
reads it (accelerate, the transformers Trainer, timm and Lightning load
checkpoints that way), and ``==`` compares two of them. ``torch.amp.GradScaler``
loads it (it reads its five keys and ignores the rest), and it loads a
state dict written by ``torch.amp.GradScaler``: torch's keys then set the
scale, the growth counter and the three factors, and lossscale's own
settings (floor, ceiling, hysteresis) and skip counters stay as they were.

Torch's keys always win over the ``"lossscale"`` entry for what they hold,
so a state dict edited the torch way loads as edited. A scale outside
``[min_loss_scale, max_loss_scale]`` (torch's can fall to 0 or below 1) is
clamped into it; a non-finite one is refused. Cost of writing: one host
sync (the five state numbers read at once); of reading: none.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any

import torch

from .._policy import DynamicLossScale, get, serialize
from .._rule import LossScaleState
from .._validate import check_counter, check_scale, plain
from ._checkpoint import ScaleRecord
from ._gradscaler_scale import replace_policy
from ._validated import refuse_extra

__all__ = ["TORCH_KEYS", "load_record", "state_dict_of"]

TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
_COUNTERS = ("bad_steps", "skipped_steps", "consecutive_skips")


def state_dict_of(policy: DynamicLossScale, state: LossScaleState) -> dict[str, Any]:
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
    if integral:
        try:
            return check_counter(f"state_dict[{key!r}]", value)
        except ValueError as error:
            raise _fail(str(error)) from error
    try:
        return float(value)
    except OverflowError:  # an int beyond float64
        raise _fail(f"{key!r} is an int of {len(str(value))} digits, not a finite number") from None


def load_record(saved: Any, policy: DynamicLossScale, state: LossScaleState) -> ScaleRecord:
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
        refuse_extra(ours, ("policy", *_COUNTERS), "state_dict['lossscale']")
        try:
            base = get(ours.get("policy"))
        except (TypeError, ValueError) as error:
            raise _fail(f"its policy is unreadable: {error}") from error
        if not isinstance(base, DynamicLossScale):
            raise _fail(f"its policy is {base!r}, not a DynamicLossScale")
        policy = base
    policy = replace_policy(
        policy,
        growth_factor=_number(saved, "growth_factor"),
        backoff_factor=_number(saved, "backoff_factor"),
        growth_interval=_number(saved, "growth_interval", integral=True),
    )
    # torch's scale can fall to 0 or below 1: clamped into [min, max], as documented; a non-finite one is refused.
    try:
        scale = check_scale("state_dict['scale']", plain(saved["scale"]), policy, clamp=True)
    except (TypeError, ValueError) as error:
        raise _fail(str(error)) from error
    tensors = [torch.tensor(scale, dtype=torch.float32), _count(_number(saved, "_growth_tracker", integral=True))]
    for index, name in enumerate(_COUNTERS, start=2):
        if ours is not None and name in ours:
            tensors.append(_count(_number(ours, name, integral=True)))
        elif name == "bad_steps":
            tensors.append(_count(0))  # torch keeps no overflow count: start afresh with torch's scale
        else:
            tensors.append(state[index].detach().clone())  # torch keeps no skip counts: ours go on
    return ScaleRecord(policy, LossScaleState(*tensors))


def _count(value: int) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.int32)
