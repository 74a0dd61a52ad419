"""Every JAX API that is private, unstable or version-dependent, in one place.

Each shim names its public replacement; when the oldest supported JAX has it,
the shim becomes a one-line alias and then goes.
"""

from __future__ import annotations

from typing import Any

import jax
from jax import lax

__all__ = ["is_tracer", "jaxpr_as_fun", "like", "typeof", "varying_axes"]

# Public replacement: ``jax.typeof`` (JAX >= 0.6). ``jax.core.get_aval`` is its older, deprecated spelling.
typeof = getattr(jax, "typeof", None) or jax.core.get_aval


def is_tracer(x: Any) -> bool:
    """Whether ``x`` is a value being traced (under ``jit``, ``grad``, ``vmap``, ...) rather than a concrete array.

    ``jax.core.Tracer`` is public; ``jax.core`` is the module JAX keeps shrinking, hence the shim.
    """
    return isinstance(x, jax.core.Tracer)


def varying_axes(aval: Any) -> frozenset:
    """The shard_map axes over which a value varies (empty outside shard_map and on old JAX).

    Public replacement: ``jax.typeof(x).manual_axis_type.varying`` (JAX >= 0.9). JAX 0.6 - 0.8 kept the
    same set in the then-private ``aval.vma``.
    """
    manual = getattr(aval, "manual_axis_type", None)
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", None) or ())


def like(x: Any, aval: Any) -> Any:
    """``x`` marked as varying over the same shard_map axes as ``aval``, so that both cond branches agree.

    Public replacement: ``lax.pcast(x, axes, to="varying")`` (JAX >= 0.9); ``lax.pvary`` was its
    experimental predecessor (JAX 0.6 - 0.8).
    """
    missing = varying_axes(aval) - varying_axes(typeof(x))
    if not missing:
        return x
    axes = tuple(sorted(missing))
    return lax.pcast(x, axes, to="varying") if hasattr(lax, "pcast") else lax.pvary(x, axes)


def jaxpr_as_fun(closed: Any) -> Any:
    """A function that evaluates a ``ClosedJaxpr`` on flat arguments, binding its primitives in the current trace.

    Public (in ``jax.extend``, JAX's API for library authors, with weaker stability promises):
    ``jax.extend.core.jaxpr_as_fun``; older JAX had it only as ``jax.core.jaxpr_as_fun``.
    """
    try:
        from jax.extend.core import jaxpr_as_fun as public
    except ImportError:  # pragma: no cover - JAX < 0.4.36
        public = jax.core.jaxpr_as_fun
    return public(closed)
