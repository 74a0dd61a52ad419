"""Helpers for training frameworks (``accelerate.attach``, ``lightning.LossScaleMonitor``); docs/how-to/trainers.md."""
