"""Passes over gradient pytrees: the reciprocal of the scale, unscale, check.

Nothing here syncs with the host: every result is a JAX array. The functions
are written so that, under ``jit``, XLA fuses the multiply by ``1/S`` into
whatever reads its result (the finiteness reduction, the inner optimizer's
element-wise update) instead of writing the unscaled gradients to memory.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["all_finite", "check_gradients", "reciprocal", "squared_norm", "unscale"]


def _compute_dtype(dtype: Any) -> Any:
    """The dtype a gradient is unscaled in: its own, promoted to at least float32."""
    return jnp.promote_types(dtype, jnp.float32)


def reciprocal(scale: Any, dtype: Any = jnp.float32) -> jax.Array:
    """``1 / scale`` rounded once to ``dtype`` (float32 unless the gradients are wider).

    The division is done in ``dtype``. IEEE division is correctly rounded and,
    because float64 has more than ``2 * 24 + 2`` significand bits, rounding the
    float64 quotient to float32 gives the same number (Figueroa, 1995, "When
    is double rounding innocuous?"): this is bit for bit the float64-exact
    reciprocal that :mod:`lossscale.torch` computes, without needing
    ``jax_enable_x64``. For powers of two it is exact.

    >>> float(reciprocal(jnp.float32(2.0**15))) == 2.0**-15
    True
    """
    real = jnp.finfo(dtype).dtype
    return jnp.reciprocal(jnp.asarray(scale).astype(real))


def _check_leaf(leaf: Any) -> None:
    dtype = getattr(leaf, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
        raise TypeError(
            f"Every gradient must be a floating-point array, got {type(leaf).__name__}"
            f"{'' if dtype is None else f' of dtype {dtype}'}. Pass what jax.grad returns for float parameters; "
            "keep integer state out of the parameters you differentiate."
        )


def check_gradients(grads: Any) -> list[Any]:
    """The leaves of ``grads``, after checking each is a floating-point array."""
    leaves = jax.tree_util.tree_leaves(grads)
    for leaf in leaves:
        _check_leaf(leaf)
    return leaves


def unscale(grads: Any, scale: Any, factor: Any = None) -> Any:
    """Each gradient times ``1/scale`` (and times ``factor`` when given), in at least float32, in its own dtype.

    A float16 or bfloat16 gradient is widened, multiplied by the float32
    reciprocal and rounded back once, so small values do not flush to zero
    on the way. ``factor`` (a 0-d float32 array, e.g. a clipping factor) is
    folded into the reciprocal, so it costs no pass of its own. Cost: one
    element-wise multiply per element (R+W when it is materialized; free when
    XLA fuses it into the consumer). No host sync.
    """
    inverses: dict[Any, jax.Array] = {}

    def one(g: Any) -> Any:
        dtype = _compute_dtype(g.dtype)
        if dtype not in inverses:
            inverse = reciprocal(scale, dtype)
            inverses[dtype] = inverse if factor is None else inverse * jnp.asarray(factor).astype(dtype)
        return (g.astype(dtype) * inverses[dtype]).astype(g.dtype)

    check_gradients(grads)
    return jax.tree_util.tree_map(one, grads)


def _exactly_finite(leaves: list[Any]) -> jax.Array:
    flag = jnp.ones((), jnp.bool_)
    for leaf in leaves:
        flag = flag & jnp.all(jnp.isfinite(leaf))
    return flag


def all_finite(tree: Any) -> jax.Array:
    """A 0-d bool array: True iff no leaf of ``tree`` holds a NaN or an Inf.

    float32 and float64 leaves are checked through one float32 sum of their
    sums: a finite sum implies that every element is finite (a NaN
    propagates, an Inf makes the sum +-Inf, or NaN beside an opposite Inf).
    Only when that sum is not finite (a NaN or Inf, or finite values whose
    sum overflows) does the exact ``all(isfinite(x))`` run, in a
    ``lax.cond``, so the answer is always the exact one. XLA reduces a plain
    sum at memory speed, several times faster on CPU than
    ``all(isfinite(x))`` or ``sum(x * 0)``. float16 and bfloat16 leaves,
    whose own sums are slow on CPU, are checked through ``max(|x|)``, which
    is NaN or Inf exactly when an element is; complex leaves through the
    exact check (``|z|`` can overflow where ``z`` does not).

    Cost: one read pass over the leaves (a second one only on a step that
    holds a NaN or an Inf, or whose sum overflows float32); no host sync. An
    empty tree is finite.

    >>> bool(all_finite({"w": jnp.ones(3), "b": jnp.array([1.0, jnp.inf])}))
    False
    >>> bool(all_finite([jnp.array([jnp.nan], jnp.float16), jnp.zeros(2)]))
    False
    >>> bool(all_finite([jnp.full(2, 3e38), jnp.full(2, 3e38)]))      # the sum overflows; the values are finite
    True
    """
    leaves = [jnp.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]
    wide = [leaf for leaf in leaves if leaf.dtype in (jnp.float32, jnp.float64)]
    half = [leaf for leaf in leaves if leaf.dtype in (jnp.float16, jnp.bfloat16)]
    other = [leaf for leaf in leaves if leaf.dtype not in (jnp.float32, jnp.float64, jnp.float16, jnp.bfloat16)]
    flag = _exactly_finite(other)  # complex (|z| can overflow where z does not), and any other dtype
    for leaf in half:
        flag = flag & jnp.isfinite(jnp.max(jnp.abs(leaf), initial=0).astype(jnp.float32))
    if wide:
        total = jnp.zeros((), jnp.float32)
        for leaf in wide:
            total = total + jnp.sum(leaf).astype(jnp.float32)
        summed = jnp.isfinite(total)
        # The taken branch returns the sum's flag (True there) rather than a constant, so that under shard_map
        # both branches vary over the same mesh axes as the gradients.
        flag = flag & lax.cond(summed, lambda: summed, lambda: _exactly_finite(wide))
    return flag


def squared_norm(tree: Any, scale: Any) -> jax.Array:
    """``sum(x**2)`` over every leaf of ``tree * (1/scale)``, accumulated in float32 (a 0-d array).

    Each leaf is widened to at least float32 before it is unscaled and
    squared, so float16 gradients neither overflow nor flush on the way.
    The result is NaN or Inf if any leaf holds a NaN or an Inf, so it serves
    as the finiteness check too (an overflow of the sum itself, a true norm
    above about 1.8e19, also reads as non-finite: a spurious skip). Cost: one
    read pass over the leaves; no host sync.

    >>> float(squared_norm({"a": jnp.array([6.0, 8.0])}, 2.0))
    25.0
    """
    total = jnp.zeros((), jnp.float32)
    inverses: dict[Any, jax.Array] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        dtype = _compute_dtype(leaf.dtype)
        if dtype not in inverses:
            inverses[dtype] = reciprocal(scale, dtype)
        u = leaf.astype(dtype) * inverses[dtype]
        total = total + jnp.sum(u * u).astype(jnp.float32)
    return total
