"""The private JAX API shared by :mod:`lossscale.jax` and Keras on JAX, each with its public replacement or why there
is none."""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["is_tracer"]


def is_tracer(x: Any) -> bool:
    """Whether ``x`` is a tracer (``jit``, ``grad``, ``vmap``, ...): a value being traced, not readable on the host.

    ``jax.core.Tracer`` is in the module JAX keeps shrinking. Public replacement: none without a cost (converting
    ``x`` to numpy raises ``jax.errors.TracerArrayConversionError`` for a tracer, at the price of a host copy of a
    concrete array)."""
    return isinstance(x, jax.core.Tracer)
