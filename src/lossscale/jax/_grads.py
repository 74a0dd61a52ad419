"""Kernels over gradient pytrees: scale the loss, unscale, check; each a JAX array (no host sync)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .._jax._kernels import by_platform, cond, finite_by_max
from ._compat import like, typeof, varying_axes

__all__ = ["all_finite", "by_platform", "check_gradients", "in_float32_range", "scale_loss", "squared_norm", "unscale"]


def scale_loss(loss: Any, scale: Any) -> jax.Array:
    """``loss * scale`` formed in at least float32 and rounded once to ``loss``'s dtype."""
    wide = jnp.promote_types(loss.dtype, jnp.float32)
    return (loss.astype(wide) * jnp.asarray(scale).astype(wide)).astype(loss.dtype)


def _inverses(scale: Any, factor: Any = None) -> Any:
    """``dtype -> (wide, factor / scale)``, ``wide`` the dtype widened to at least float32, once per ``wide``. ``1/S``
    in float32 equals torch's float64 reciprocal rounded to float32 (53 > 2 * 24 + 2; Figueroa 1995), so both
    bindings unscale to the same bits."""
    cache: dict[Any, jax.Array] = {}

    def inverse(dtype: Any) -> tuple[Any, jax.Array]:
        wide = jnp.promote_types(dtype, jnp.float32)
        if wide not in cache:
            value = jnp.reciprocal(jnp.asarray(scale).astype(jnp.finfo(wide).dtype))
            cache[wide] = value if factor is None else value * jnp.asarray(factor).astype(wide)
        return wide, cache[wide]

    return inverse


def check_gradients(grads: Any) -> list[Any]:
    """The leaves of ``grads``, after checking each is a floating-point array."""
    leaves = jax.tree_util.tree_leaves(grads)
    for leaf in leaves:
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
            raise TypeError(
                f"Every gradient must be a floating-point array, got {type(leaf).__name__}"
                f"{'' if dtype is None else f' of dtype {dtype}'}. Pass what jax.grad returns for float "
                "parameters; keep integer state out of the parameters you differentiate."
            )
    return leaves


def in_float32_range(leaves: list[Any]) -> bool:
    """Whether every leaf is float32, float16 or bfloat16 (its values fit float32: a float32 ``max |g|`` of a float64
    leaf above float32's range would read as an overflow). Trace time only, no device work."""
    return all(leaf.dtype in (jnp.float32, jnp.float16, jnp.bfloat16) for leaf in leaves)


def unscale(grads: Any, scale: Any, factor: Any = None) -> Any:
    """Each gradient times ``factor / scale`` in at least float32, rounded once to its dtype: one multiply."""
    inverse = _inverses(scale, factor)

    def one(g: Any) -> Any:
        wide, value = inverse(g.dtype)
        return (g.astype(wide) * value).astype(g.dtype)

    check_gradients(grads)
    return jax.tree_util.tree_map(one, grads)


def _exactly_finite(leaves: list[Any]) -> jax.Array:
    flag = jnp.ones((), jnp.bool_)
    for leaf in leaves:
        flag = flag & jnp.all(jnp.isfinite(leaf))
    return flag


def _by_sums(leaves: list[Any]) -> jax.Array:
    """:func:`sum_checks`, with the exact check of the float32/float64 leaves in a ``lax.cond`` taken only when
    their sum is not finite (outside any trace, a Python ``if`` on the sum: one host read)."""
    flag, summed, wide = sum_checks(leaves)
    if summed is None:
        return flag
    # The taken branch returns the flag, not a constant: both then vary over the gradients' shard_map axes.
    return flag & cond(summed, lambda: summed, lambda: _exactly_finite(wide))


def _varying_as(x: Any, leaves: list[Any]) -> Any:
    """``x`` marked as varying over every shard_map axis any of ``leaves`` varies over (no op elsewhere)."""
    for leaf in leaves:
        x = like(x, typeof(leaf))
    return x


def all_finite(tree: Any) -> jax.Array:
    """A 0-d bool array: True iff no leaf of ``tree`` holds a NaN or an Inf (an empty tree is finite). Exact.

    On a CPU, float32/float64 leaves: one float32 sum of their sums (several times faster there than
    ``all(isfinite(x))``), the exact check in a ``lax.cond`` only when it is not finite (one read pass; two on a
    step with a NaN, an Inf or an overflowing sum). Elsewhere (GPU, TPU): ``isfinite(max(|x|))`` per leaf, one
    read pass and no conditional, whose predicate XLA's GPU runtime would read on the host on every step.
    float16/bfloat16: ``max(|x|)``; complex: ``all(isfinite)``. Chosen when XLA lowers the program
    (:func:`by_platform`). No host sync.

    Args:
        tree: a pytree of arrays (floating-point or complex; integer leaves are finite).

    Returns:
        A 0-d bool JAX array; under ``shard_map``, as varying as the leaves (this device's flag: ``lax.pmin`` it over
        the axes for the devices' common one, as ``loss_scale_optimizer(..., axis_name=...)`` does).

    >>> import jax.numpy as jnp, lossscale.jax as lsj
    >>> bool(lsj.all_finite({"w": jnp.ones(3), "b": jnp.array([1.0, jnp.inf])}))
    False
    >>> bool(lsj.all_finite([jnp.full(2, 3e38), jnp.full(2, 3e38)]))      # the sum overflows; the values do not
    True
    """
    leaves = [jnp.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]
    if not leaves:
        return jnp.ones((), jnp.bool_)
    return by_platform(lambda: _varying_as(_by_sums(leaves), leaves), lambda: _varying_as(finite_by_max(leaves), leaves),
                       like=leaves)


def sum_checks(leaves: list[Any]) -> tuple[jax.Array, jax.Array | None, list[jax.Array]]:
    """:func:`all_finite`'s CPU check before its ``lax.cond``: ``(flag, summed, wide)``, ``flag`` the exact check of
    the float16/bfloat16 (``max(|x|)``) and other leaves, ``summed`` whether the float32 sum of the float32/float64
    leaves' sums is finite (None without such leaves), ``wide`` those leaves (for the exact check)."""
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    wide = [leaf for leaf in leaves if leaf.dtype in (jnp.float32, jnp.float64)]
    half = [leaf for leaf in leaves if leaf.dtype in (jnp.float16, jnp.bfloat16)]
    other = [leaf for leaf in leaves if leaf.dtype not in (jnp.float32, jnp.float64, jnp.float16, jnp.bfloat16)]
    flag = _exactly_finite(other)  # complex (|z| can overflow where z does not), and any other dtype
    for leaf in half:
        flag = flag & jnp.isfinite(jnp.max(jnp.abs(leaf), initial=0).astype(jnp.float32))
    if not wide:
        return flag, None, wide
    total = jnp.zeros((), jnp.float32)
    for leaf in wide:
        total = total + jnp.sum(leaf).astype(jnp.float32)
    return flag, jnp.isfinite(total), wide


def squared_norm(tree: Any, scale: Any, axes: tuple[Hashable, ...] | None = None) -> jax.Array:
    """``sum((g / scale)**2)`` over every leaf, widened to at least float32, accumulated in float32: one read pass.
    NaN or Inf iff a leaf holds one (or a norm above ~1.8e19 overflows: a spurious skip), so the finite check too.
    With ``axes`` (``shard_map``/``pmap``), over the whole gradient: the squares of the leaves that vary over the axes
    (shards) summed across the devices (one ``lax.psum`` of a scalar), those of replicated leaves counted once (a
    leaf's ``vma`` type says which; where JAX does not say, a leaf counts as a shard)."""
    inverse = _inverses(scale)
    shards = replicated = jnp.zeros((), jnp.float32)
    for leaf in jax.tree_util.tree_leaves(tree):
        wide, value = inverse(leaf.dtype)
        u = leaf.astype(wide) * value
        term = jnp.sum(u * u).astype(jnp.float32)
        varying = None if axes is None else varying_axes(typeof(leaf))
        if axes is not None and varying is not None and not varying & set(axes):
            replicated = replicated + term
        else:
            shards = shards + term
    return shards if axes is None else lax.psum(shards, axes) + replicated
