"""The torch side of the core's one check of loaded state: saved values -> checked plain values -> new tensors.

Every torch loader (``LossScaleOptimizer``, ``SharedLossScale``,
``GradScaler``, unpickling) reads a record's fields with these functions
before it changes anything. A saved tensor is read in its own dtype (an
int64 counter of 2**32 is refused, never wrapped to 0 in int32), checked by
:mod:`lossscale._validate`, and only then turned into a new float32/int32
tensor on the saved tensor's device. Cost: one ``.item()`` per field (a
host sync for a tensor on an accelerator; none for a checkpoint read to the
CPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .._rule import LossScaleState
from .._validate import COUNTERS, check_counter, check_state

__all__ = ["counter_tensor", "refuse_extra", "state_tensors"]


def _device(value: Any) -> torch.device:
    return value.device if isinstance(value, torch.Tensor) else torch.device("cpu")


def refuse_extra(saved: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    """ValueError naming the keys of ``saved`` outside ``known``.

    Unknown keys are refused rather than ignored: a key this version does not
    know may change what the others mean, and loading without it would give
    a different state than the one saved, silently.
    """
    unknown = sorted(map(str, set(saved) - set(known)))
    if unknown:
        raise ValueError(
            f"Not a lossscale state dict: {where} has keys this version of lossscale does not know: {unknown}. Remove them, or load the "
            "checkpoint with the lossscale version that wrote it."
        )


def _refused(error: Exception) -> ValueError:
    # LossScaleOptimizer and SharedLossScale document one error for a malformed checkpoint: ValueError.
    return ValueError(f"Not a lossscale state dict: {error}")


def state_tensors(state: Any, policy: Any, where: str) -> LossScaleState:
    """A new :class:`LossScaleState` of tensors from ``state``'s five fields, checked by the core's rule first.

    Raises:
        ValueError: a field is missing, unknown or bad (the core's TypeError included), naming it.
    """
    try:
        values = check_state(state, policy, where=where, extra="refuse")
    except (TypeError, ValueError) as error:
        raise _refused(error) from error
    return LossScaleState(
        torch.tensor(values["loss_scale"], dtype=torch.float32, device=_device(state["loss_scale"])),
        *(torch.tensor(values[name], dtype=torch.int32, device=_device(state[name])) for name in COUNTERS),
    )


def counter_tensor(where: str, value: Any) -> torch.Tensor:
    """A new int32 0-d tensor from a saved counter, checked first (an int in ``[0, 2**31 - 1]``); else ValueError."""
    try:
        return torch.tensor(check_counter(where, value), dtype=torch.int32, device=_device(value))
    except (TypeError, ValueError) as error:
        raise _refused(error) from error
