"""Helpers for training frameworks; import only the one you use: ``integrations.accelerate.attach`` (accelerate,
the transformers Trainer), ``integrations.lightning.LossScaleMonitor``. Lightning and timm take a GradScaler
without a helper (docs/how-to/trainers.md). Private framework names are all in ``_compat.py``.
"""
