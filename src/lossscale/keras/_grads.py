"""Passes over the gradients through ``keras.ops``: the loss's scaling, the unscale, the finiteness check; and
:data:`XP`, the array namespace the core's rule, sampler and statistics run over on this backend."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import keras
from keras import ops

__all__ = [
    "XP", "all_finite", "by_platform", "overwritten", "reciprocal", "scale_loss", "unscale", "unscale_and_check"]


def _namespace() -> Any:
    """``jax.numpy``, ``torch``, or on TensorFlow numpy's names as ``keras.ops`` (TF's operators do the rest)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax.numpy as jnp

        return jnp
    if backend == "torch":
        import torch

        return torch
    import tensorflow as tf

    def asarray(x: Any, dtype: Any = None) -> Any:
        return ops.convert_to_tensor(x) if dtype is None else ops.cast(x, dtype)

    def ldexp(x: Any, e: Any) -> Any:  # x * 2**e, 2**e written as float32 bits (exact; e clamped to [-126, 127])
        e = tf.clip_by_value(tf.cast(e, tf.int32), -126, 127)
        return x * tf.bitcast((e + 127) * (1 << 23), tf.float32)

    names = "abs ceil clip cumsum floor full full_like isfinite log2 max min ones_like roll sqrt stack sum where"
    functions = {name: getattr(ops, name) for name in names.split()}
    return SimpleNamespace(float32="float32", int32="int32", bool="bool", asarray=asarray, ldexp=ldexp, **functions)


#: The array namespace the core's rule, sampler and statistics run over on this backend.
XP = _namespace()


def _times(x: Any, factor: Callable[[str], Any], round_back: bool = True) -> Any:
    """``x * factor(wide)`` in ``wide``, ``x``'s dtype widened to at least float32; rounded back to ``x``'s dtype
    unless ``round_back`` is False."""
    dtype = keras.backend.standardize_dtype(x.dtype)
    wide = "float32" if dtype in ("float16", "bfloat16") else dtype
    value = ops.multiply(ops.cast(x, wide), factor(wide))
    return value if wide == dtype or not round_back else ops.cast(value, dtype)


def reciprocal(scale: Any, dtype: str = "float32") -> Any:
    """``1 / scale``, correctly rounded once in ``dtype`` (TF's ``get_unscaled_gradients`` multiplies by it)."""
    return ops.divide(ops.ones((), dtype), ops.cast(scale, dtype))


def scale_loss(loss: Any, scale: Any, keep_dtype: bool = True) -> Any:
    """``loss * scale``, computed in at least float32 and returned in ``loss``'s dtype (TF's), or in that wider dtype
    if not ``keep_dtype`` (Keras 3's). Cost: one multiply."""
    return _times(ops.convert_to_tensor(loss), lambda wide: ops.cast(scale, wide), keep_dtype)


def unscale(grads: Sequence[Any], scale: Any, keep: Sequence[bool] | None = None) -> list[Any]:
    """A new list: each gradient times ``1/scale`` in at least float32, rounded back to its dtype.

    Args:
        grads: the gradients; None stays None. Not modified.
        scale: the loss scale (a 0-d tensor); its reciprocal is rounded once per dtype (TF's).
        keep: per gradient, pass it as is (a variable Keras overwrites with its "gradient", :func:`overwritten`).

    Cost: one multiply per element (fused into the check and the update when compiled).
    """
    inverse = functools.cache(lambda wide: reciprocal(scale, wide))  # one reciprocal per dtype
    return [g if g is None or (keep is not None and keep[i]) else _times(g, inverse) for i, g in enumerate(grads)]


def overwritten(variables: Sequence[Any]) -> list[bool]:
    """Per variable, whether Keras overwrites it with its "gradient" (``overwrite_with_gradient``, e.g. a float8
    layer's scale history): that value is not a gradient, so it is never unscaled."""
    return [getattr(v, "overwrite_with_gradient", False) for v in variables]


def unscale_and_check(grads: list[Any], variables: Sequence[Any], scale: Any, already: bool, check_scaled: bool) -> Any:
    """``(unscaled, finite)``: the gradients times ``1/scale`` (as given when ``already``) and whether all are finite.

    Args:
        grads: one gradient per variable (None for none).
        variables: their variables (:func:`overwritten` ones pass as is).
        scale: the loss scale (a 0-d tensor).
        already: the gradients are unscaled already (no multiply).
        check_scaled: check ``grads`` as given, not waiting for the multiply (right when ``0 < 1/S <= 1``: the
            scaled gradients are finite iff the unscaled ones are).

    Cost: one multiply per gradient element, one read pass (:func:`all_finite`).
    """
    unscaled = grads if already else unscale(grads, scale, overwritten(variables))
    return unscaled, all_finite(grads if check_scaled else unscaled)


def _conjunction(flags: Sequence[Any]) -> Any:
    finite = flags[0] if flags else ops.convert_to_tensor(True)
    for flag in flags[1:]:
        finite = ops.logical_and(finite, flag)
    return finite


def _each_finite(grads: Sequence[Any]) -> Any:
    return _conjunction([ops.all(ops.isfinite(g)) for g in grads])


def _summed(present: Sequence[Any]) -> Any:
    """The sum check: float32/float64 gradients' sums summed per dtype, the exact check in a ``cond`` only if that is
    not finite; the other dtypes ``all(isfinite)``."""
    wide = [g for g in present if keras.backend.standardize_dtype(g.dtype) in ("float32", "float64")]
    narrow = [g for g in present if keras.backend.standardize_dtype(g.dtype) not in ("float32", "float64")]
    if not wide:
        return _each_finite(narrow)
    by_dtype: dict[str, list[Any]] = {}
    for g in wide:
        by_dtype.setdefault(keras.backend.standardize_dtype(g.dtype), []).append(ops.sum(g))
    # The sum of the sums: an overflow here, like one in a sum, only sends the step to the exact check.
    sums = _conjunction([ops.isfinite(ops.sum(ops.stack(group))) for group in by_dtype.values()])
    finite = cond(sums, lambda: ops.convert_to_tensor(True), lambda: _each_finite(wide))
    return ops.logical_and(finite, _each_finite(narrow)) if narrow else finite


def by_platform(cpu: Callable[[], Any], other: Callable[[], Any], like: Sequence[Any] = ()) -> Any:
    """JAX: :func:`lossscale._jax._kernels.by_platform` (imported here, at the call: Keras may run on another backend),
    a name of this module so that Keras's step and tests reach it here."""
    from .._jax._kernels import by_platform as choose

    return choose(cpu, other, like)


def cond(pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
    """``keras.ops.cond``; on JAX :func:`lossscale._jax._kernels.cond`, which outside any trace (``run_eagerly``) is a
    Python ``if`` on ``pred``, one host read, as TensorFlow's and torch's eager ``cond`` already are."""
    if keras.backend.backend() == "jax":
        from .._jax._kernels import cond as jax_cond

        return jax_cond(pred, true_fn, false_fn)
    return ops.cond(pred, true_fn, false_fn)


def all_finite(grads: Sequence[Any]) -> Any:
    """A 0-d bool tensor: True iff no gradient holds a NaN or an Inf (None gradients are left out). Exact.

    TensorFlow, and JAX on a CPU: float32/float64 gradients by one sum of sums (finite implies every element is;
    XLA reduces it several times faster than ``isfinite``), the exact check in a ``cond`` only if that is not
    finite (one read pass; two if not finite; eager TF: one host sync). Half precision takes the exact check: its
    sums overflow at 65504. JAX elsewhere (GPU, TPU):
    ``isfinite(max(|g|))`` per gradient, one read pass and no conditional, whose predicate XLA's GPU runtime would
    read on the host on every step; chosen when XLA lowers the step (:func:`by_platform`). torch:
    ``all(isfinite)`` per gradient."""
    present = [g for g in grads if g is not None]
    backend = keras.backend.backend()
    if backend == "jax" and present:
        from .._jax._kernels import finite_by_max

        return by_platform(lambda: _summed(present), lambda: finite_by_max(present), like=present)
    if backend == "tensorflow":
        return _summed(present)
    return _each_finite(present)
