"""Errors raised by lossscale."""

from __future__ import annotations

__all__ = ["LossScaleError"]


class LossScaleError(RuntimeError):
    """Training cannot go on as asked, e.g. too many skipped steps in a row."""
