"""The loss-scale policy's settings as attributes (TF's and Keras's names), for ``LossScaleOptimizer``.

``dynamic``, ``initial_scale``, ``dynamic_growth_steps``, ``dynamic_counter``
and the three refinements (``min_loss_scale``, ``max_loss_scale``,
``hysteresis``), as a mixin that reads only the public
``shared_loss_scale`` of the class it is mixed into. All are read from the
policy (immutable) or, for ``dynamic_counter``, copied from the live
state: no host sync.
"""

from __future__ import annotations

import torch

from .._resolve import stable_form
from ._scale import ScaleOwner

__all__ = ["PolicyAttributes"]


class PolicyAttributes:
    """The policy's settings under TF's and Keras's attribute names; mixed into ``LossScaleOptimizer``."""

    @property
    def shared_loss_scale(self) -> ScaleOwner:
        raise NotImplementedError  # defined by the class this is mixed into

    @property
    def dynamic(self) -> bool:
        """Whether the loss scale is dynamic."""
        return self.shared_loss_scale.policy.dynamic

    @property
    def dynamic_counter(self) -> torch.Tensor | None:
        """Finite steps since the scale last changed (0-d int32 tensor, no sync), or None if fixed."""
        return self.shared_loss_scale.state.good_steps.clone() if self.dynamic else None

    @property
    def dynamic_growth_steps(self) -> int | None:
        """Finite steps it takes to grow the scale, or None if fixed."""
        return stable_form(self.shared_loss_scale.policy)["dynamic_growth_steps"]

    @property
    def initial_scale(self) -> float:
        """The initial loss scale (the only one, when fixed)."""
        return self.shared_loss_scale.policy.initial_scale

    @property
    def min_loss_scale(self) -> float | None:
        """The floor of a dynamic scale (None if fixed)."""
        return getattr(self.shared_loss_scale.policy, "min_loss_scale", None) if self.dynamic else None

    @property
    def max_loss_scale(self) -> float | None:
        """The ceiling of a dynamic scale (None: none, or fixed)."""
        return getattr(self.shared_loss_scale.policy, "max_loss_scale", None) if self.dynamic else None

    @property
    def hysteresis(self) -> int | None:
        """Non-finite steps a dynamic scale tolerates before backing off (None if fixed)."""
        return getattr(self.shared_loss_scale.policy, "hysteresis", None) if self.dynamic else None
