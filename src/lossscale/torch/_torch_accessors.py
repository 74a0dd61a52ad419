"""``torch.amp.GradScaler``'s accessors (``get_scale``, the factor getters and setters, ...) for :class:`GradScaler`.

A mixin over the two attributes ``GradScaler`` sets: ``_owner`` (its
:class:`~lossscale.torch._scale.IterationScale`) and ``_enabled``. Getters
of a Python number sync once (they read the live state); setters replace
the policy and keep the state.
"""

from __future__ import annotations

from typing import Any

import torch

from ._checkpoint import replace_policy

__all__ = ["TorchScalerAccessors"]


class TorchScalerAccessors:
    """torch's names for reading and changing the scale and its factors."""

    _owner: Any
    _enabled: bool

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled). One host sync."""
        return float(self._owner.state.loss_scale) if self._enabled else 1.0

    @property
    def _scale(self) -> torch.Tensor | None:
        """torch's attribute: the live 0-d float32 scale tensor (None when disabled); torch's own tests read it."""
        return self._owner.state.loss_scale if self._enabled else None

    # torch's lazy-init attributes, which its own tests set and read around load_state_dict(): here they are
    # views of the live state (the scale and the growth tracker), read on the host (one sync each).
    _init_scale = property(lambda self: self.get_scale(), lambda self, v: self._owner.overwrite(scale=v))
    _init_growth_tracker = property(
        lambda self: self._get_growth_tracker(), lambda self, v: self._owner.overwrite(growth_tracker=v)
    )

    def _get_growth_tracker(self) -> int:
        """Finite steps since the scale last changed, a Python int (0 when disabled). One host sync."""
        return int(self._owner.state.good_steps) if self._enabled else 0

    def get_growth_factor(self) -> float:
        return self._owner.policy.multiplier

    def set_growth_factor(self, new_factor: float) -> None:
        self._owner.set_policy(replace_policy(self._owner.policy, growth_factor=new_factor))

    def get_backoff_factor(self) -> float:
        """The factor a skip multiplies the scale by (``1 / growth_factor`` where the policy leaves it unset)."""
        policy = self._owner.policy
        return 1.0 / policy.multiplier if policy.backoff_factor is None else policy.backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._owner.set_policy(replace_policy(self._owner.policy, backoff_factor=new_factor))

    def get_growth_interval(self) -> int:
        return self._owner.policy.increment_period

    def set_growth_interval(self, new_interval: int) -> None:
        self._owner.set_policy(replace_policy(self._owner.policy, growth_interval=new_interval))

    def is_enabled(self) -> bool:
        return self._enabled
