"""The JAX passes shared by ``lossscale.jax`` and Keras on JAX (as :mod:`lossscale._torch._kernels` is for torch):
the choice of a computation by the platform XLA compiles for, and the finite check that takes no conditional."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ._compat import is_tracer

__all__ = ["by_platform", "cond", "finite_by_max"]


def by_platform(cpu: Callable[[], Any], other: Callable[[], Any], like: Sequence[Any] = ()) -> Any:
    """``cpu()`` where the program runs on a CPU, ``other()`` on any other platform, chosen when XLA lowers it
    (``lax.platform_dependent``): right also for a program exported or traced on one machine for another, where
    ``jax.default_backend()`` at trace time is not. Both are traced; the lowering keeps only the chosen one, as a
    conditional of one branch that XLA inlines (no conditional runs).

    Outside any trace (eager code: the arrays ``like`` are all concrete) the platform is theirs, read on the host,
    and only the chosen one runs: ``lax.platform_dependent`` there would compile a new program at every call (its
    branches are new closures each time), about 100 ms a call."""
    if like and not any(is_tracer(x) for x in like):
        devices = getattr(like[0], "devices", None)
        platform = next(iter(devices())).platform if callable(devices) else jax.default_backend()
        return cpu() if platform == "cpu" else other()
    return lax.platform_dependent(cpu=cpu, default=other)


def cond(pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any], *operands: Any) -> Any:
    """``lax.cond(pred, true_fn, false_fn, *operands)``, except outside any trace (``pred`` concrete: eager code), where
    it is a Python ``if`` on ``pred``, one host read: there a ``lax.cond`` of new closures (the callers' branches are)
    compiles a new program at every call, about 100 ms."""
    if is_tracer(pred):
        return lax.cond(pred, true_fn, false_fn, *operands)
    return (true_fn if bool(pred) else false_fn)(*operands)


def finite_by_max(leaves: Sequence[Any]) -> Any:
    """Exactly whether every leaf is finite, with no conditional: ``isfinite(max(|x|))`` per real leaf (XLA's max
    propagates NaN; ``|x|`` of a real float overflows nowhere), ``all(isfinite)`` per complex one. One read pass;
    the off-CPU check of both bindings, whose sum check's ``lax.cond`` would have XLA's GPU runtime read its
    predicate on the host on every step."""
    flag = jnp.ones((), jnp.bool_)
    for leaf in leaves:
        if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
            flag = flag & jnp.all(jnp.isfinite(leaf))
        else:
            flag = flag & jnp.isfinite(jnp.max(jnp.abs(leaf), initial=0))
    return flag
