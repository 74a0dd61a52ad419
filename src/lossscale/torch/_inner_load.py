"""Loading the inner optimizer's part of a checkpoint atomically, and refusing another optimizer's state dict.

``torch.optim.Optimizer.load_state_dict`` takes the saved hyperparameters
as they are: an ``SGD(momentum=...)`` state dict loads into ``AdamW``, and the
next ``step()`` raises ``KeyError: 'betas'``; a load that fails part way
leaves the optimizer half replaced. Here the load is a transaction: the
current state dict (references, no copies) is kept, the saved one loaded,
and the result checked (every hyperparameter the optimizer's ``defaults``
name is in every group; every state tensor of a parameter has a shape that
fits it); on any failure the kept state dict is loaded back and a
``ValueError`` names the cause. Cost: one extra ``load_state_dict`` on
failure only; on success, a walk over the groups' keys and the state's
shapes (no copy, no host sync).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["load_inner"]


def _check_groups(inner: torch.optim.Optimizer, groups: Any) -> None:
    name = type(inner).__name__
    needed = set(getattr(inner, "defaults", {}) or {})
    for index, group in enumerate(groups if isinstance(groups, (list, tuple)) else []):
        missing = sorted(needed - set(group)) if isinstance(group, Mapping) else []
        if missing:
            raise ValueError(
                f"the saved param_groups[{index}] lacks {missing}, which {name} needs: the state dict was saved from "
                f"another kind of optimizer. Load a state dict saved from {name} (or build the optimizer it was "
                "saved from); the optimizer is unchanged."
            )


def _check(inner: torch.optim.Optimizer) -> None:
    _check_groups(inner, inner.param_groups)
    for group in inner.param_groups:
        for param in group["params"]:
            for key, value in inner.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                    raise ValueError(
                        f"the saved state {key!r} of a parameter of shape {tuple(param.shape)} has shape "
                        f"{tuple(value.shape)}: not this model's optimizer state. Load the state dict saved with "
                        "this model."
                    )


def load_inner(inner: torch.optim.Optimizer, saved: Mapping[str, Any]) -> None:
    """``inner.load_state_dict(saved)``, all or nothing (see the module docstring)."""
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
