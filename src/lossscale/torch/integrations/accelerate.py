"""accelerate and the transformers Trainer: :func:`attach` puts your GradScaler in the place of accelerate's own::

    accelerator = Accelerator(mixed_precision="fp16")
    attach(accelerator, GradScaler("cuda"))          # before prepare(); the Trainer: attach(trainer.accelerator, ...)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
"""

from __future__ import annotations

from typing import Any

try:
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.utils import DistributedType

    from .._compat import prepared_models, prepared_optimizers, track_step_calls
except ImportError as error:  # pragma: no cover - exercised only without accelerate
    raise ImportError("lossscale.torch.integrations.accelerate needs accelerate: pip install accelerate") from error

__all__ = ["attach"]

_SCALER_METHODS = ("scale", "unscale_", "step", "update", "state_dict", "load_state_dict")


def attach(accelerator: Accelerator, scaler: Any, *, sync_skips: bool = True) -> None:
    """Make ``accelerator`` (and the optimizers it already prepared) use ``scaler`` for float16 loss scaling.

    Call it right after creating the ``Accelerator`` (or the Trainer), before ``prepare(model)``; on CPU it turns
    float16 autocast on.

    Args:
        accelerator: an ``accelerate.Accelerator`` with ``mixed_precision="fp16"`` (``TrainingArguments(fp16=True)``).
        scaler: ``lossscale.torch.GradScaler`` or ``torch.amp.GradScaler``.
        sync_skips: set on a lossscale GradScaler (default True): a fused step's skip is then decided on the host
            (one sync a step), so accelerate's ``step_was_skipped`` and the LR schedule see it. Ignored for torch's.

    Raises:
        TypeError: not an ``Accelerator``, or ``scaler`` lacks a GradScaler method.
        ValueError: not float16, or a backend with its own loss scaler (DeepSpeed, Megatron-LM, FSDP v1).
        RuntimeError: a model was prepared before attaching where accelerate had float16 autocast off.
    """
    if not isinstance(accelerator, Accelerator):
        raise TypeError(f"attach() takes an accelerate.Accelerator first, got {type(accelerator).__name__}.")
    missing = [name for name in _SCALER_METHODS if not callable(getattr(scaler, name, None))]
    if missing:
        raise TypeError(f"attach() needs a GradScaler (lossscale.torch.GradScaler or torch.amp.GradScaler); "
                        f"{type(scaler).__name__} has no {', '.join(missing)}.")
    if accelerator.mixed_precision != "fp16":
        raise ValueError("attach() needs Accelerator(mixed_precision='fp16') (TrainingArguments(fp16=True) for the "
                         f"Trainer); this accelerator uses mixed_precision={accelerator.mixed_precision!r}, which "
                         "needs no loss scale.")
    if accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM):
        raise ValueError(f"{accelerator.distributed_type.value} scales the loss itself (its own loss scaler in its "
                         "config); attach() cannot replace it. Configure the loss scale there instead.")
    if accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2:
        raise ValueError("FSDP (v1) needs torch's ShardedGradScaler, which attach() cannot replace; use FSDP2 "
                         "(fsdp_version=2), where accelerate drives a plain GradScaler.")
    if not isinstance(sync_skips, bool):
        raise TypeError(f"sync_skips must be True or False, got {sync_skips!r}.")
    if prepared_models(accelerator) and not accelerator.native_amp:
        raise RuntimeError(f"attach() came after accelerator.prepare(model): on {accelerator.device.type!r} "
                           "accelerate runs no float16 autocast by itself, and prepare() wraps model.forward in "
                           "autocast only when it does. Call attach(accelerator, scaler) right after creating the "
                           "Accelerator (or the Trainer).")

    if hasattr(scaler, "sync_skips"):
        scaler.sync_skips = sync_skips
    accelerator.scaler = scaler  # read by backward, unscale_gradients, save_state/load_state, prepare_optimizer
    accelerator.native_amp = True  # float16 autocast in prepare(model)/autocast(), unscale in clip_grad_norm_
    for optimizer in prepared_optimizers(accelerator):
        _switch_optimizer(optimizer, scaler)


def _switch_optimizer(optimizer: AcceleratedOptimizer, scaler: Any) -> None:
    """Give an already prepared optimizer ``scaler``, with the step tracking accelerate installs for one."""
    if optimizer.scaler is None:
        track_step_calls(optimizer)  # a patched optimizer.step that records that it ran, for step_was_skipped
    optimizer.scaler = scaler
