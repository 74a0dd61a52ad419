"""Every private framework name ``lossscale.torch.integrations`` uses (accelerate 1.x), each with why."""

from __future__ import annotations

from typing import Any

from accelerate.optimizer import AcceleratedOptimizer, patch_optimizer_step

__all__ = ["prepared_models", "prepared_optimizers", "track_step_calls"]


def prepared_models(accelerator: Any) -> list[Any]:
    """The models ``prepare()`` has wrapped: ``Accelerator._models``, which has no public accessor."""
    return list(getattr(accelerator, "_models", []))


def prepared_optimizers(accelerator: Any) -> list[AcceleratedOptimizer]:
    """The ``AcceleratedOptimizer`` s ``prepare()`` has made: ``Accelerator._optimizers`` (no public accessor)."""
    return [opt for opt in getattr(accelerator, "_optimizers", []) if isinstance(opt, AcceleratedOptimizer)]


def track_step_calls(optimizer: AcceleratedOptimizer) -> None:
    """What ``AcceleratedOptimizer.__init__`` sets up when given a scaler: the patched step that sets
    ``_accelerate_step_called`` (``step_was_skipped`` reads it) and the step methods swapped around ``scaler.step``."""
    optimizer._accelerate_step_called = False
    optimizer._optimizer_original_step_method = optimizer.optimizer.step
    optimizer._optimizer_patched_step_method = patch_optimizer_step(optimizer, optimizer.optimizer.step)
