"""Helpers for training frameworks: a GradScaler where there is no public way to pass one, and logging.

Each module imports its framework at the top; import only the one you use::

    from lossscale.torch.integrations.accelerate import attach              # accelerate, transformers Trainer
    from lossscale.torch.integrations.lightning import LossScaleMonitor     # log the scale in Lightning

Lightning (``MixedPrecision(..., scaler=...)``) and timm (``NativeScaler``)
take the scaler without a helper: see docs/how-to/trainers.md.
Private framework names used here are all in ``_compat.py``.
"""
