"""The array namespace the core's statistics and ``AutoLossScale`` rule run over, per Keras backend.

``jax.numpy`` on JAX and ``torch`` on torch (the namespaces the other
bindings use). TensorFlow's tensors refuse numpy's promotion (``int32 + bool``
raises), so there the core's functions run over :class:`_Ops`: each value a
:class:`_OpsValue` whose operators and functions are ``keras.ops`` calls
(numpy's promotion), plus ``ldexp`` as an exact exponent write. The core's
code is never copied; :func:`wrap`/:func:`unwrap` cross the boundary (no-ops
on JAX and torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
from keras import ops

__all__ = ["namespace", "unwrap", "wrap"]


def _raw(x: Any) -> Any:
    return x.x if isinstance(x, _OpsValue) else x


def _op(fn: Callable[..., Any], reflected: bool = False) -> Callable[[Any, Any], _OpsValue]:
    if reflected:
        return lambda self, other: _OpsValue(fn(_raw(other), self.x))
    return lambda self, other: _OpsValue(fn(self.x, _raw(other)))


class _OpsValue:
    """A TensorFlow tensor whose Python operators are ``keras.ops`` calls."""

    __slots__ = ("x",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, x: Any) -> None:
        self.x = x

    __add__ = _op(ops.add)
    __radd__ = _op(ops.add, reflected=True)
    __sub__ = _op(ops.subtract)
    __rsub__ = _op(ops.subtract, reflected=True)
    __mul__ = _op(ops.multiply)
    __rmul__ = _op(ops.multiply, reflected=True)
    __truediv__ = _op(ops.divide)
    __mod__ = _op(ops.mod)
    __rtruediv__ = _op(ops.divide, reflected=True)
    __lt__ = _op(ops.less)
    __le__ = _op(ops.less_equal)
    __gt__ = _op(ops.greater)
    __ge__ = _op(ops.greater_equal)
    __eq__ = _op(ops.equal)  # type: ignore[assignment]
    __ne__ = _op(ops.not_equal)  # type: ignore[assignment]
    __and__ = _op(ops.logical_and)
    __rand__ = _op(ops.logical_and, reflected=True)
    __or__ = _op(ops.logical_or)

    def __invert__(self) -> _OpsValue:
        return _OpsValue(ops.logical_not(self.x))

    def __neg__(self) -> _OpsValue:
        return _OpsValue(ops.negative(self.x))

    @property
    def dtype(self) -> Any:
        return self.x.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape)

    @property
    def ndim(self) -> int:
        return len(self.x.shape)


def _unary(fn: Callable[[Any], Any]) -> Callable[[Any], _OpsValue]:
    return staticmethod(lambda x: _OpsValue(fn(_raw(x))))  # type: ignore[return-value]


class _Ops:
    """The part of numpy's namespace the core's statistics and auto rule call, over ``keras.ops``."""

    float32 = "float32"
    int32 = "int32"
    bool = "bool"

    abs = _unary(ops.abs)
    sqrt = _unary(ops.sqrt)
    log2 = _unary(ops.log2)
    floor = _unary(ops.floor)
    ceil = _unary(ops.ceil)
    isfinite = _unary(ops.isfinite)
    ones_like = _unary(ops.ones_like)

    @staticmethod
    def max(x: Any) -> _OpsValue:
        return _OpsValue(ops.max(_raw(x)))

    @staticmethod
    def min(x: Any) -> _OpsValue:
        return _OpsValue(ops.min(_raw(x)))

    @staticmethod
    def sum(x: Any) -> _OpsValue:
        return _OpsValue(ops.sum(_raw(x)))

    @staticmethod
    def where(condition: Any, a: Any, b: Any) -> _OpsValue:
        return _OpsValue(ops.where(_raw(condition), _raw(a), _raw(b)))

    @staticmethod
    def stack(values: Any) -> _OpsValue:
        return _OpsValue(ops.stack([_raw(v) for v in values]))

    @staticmethod
    def asarray(x: Any, dtype: Any = None) -> _OpsValue:
        x = _raw(x)
        if isinstance(x, (list, tuple, int, float)):
            return _OpsValue(ops.convert_to_tensor(x, dtype=dtype))
        return _OpsValue(ops.cast(x, dtype) if dtype is not None else ops.convert_to_tensor(x))

    @staticmethod
    def full(shape: Any, value: Any, dtype: Any = None) -> _OpsValue:
        return _OpsValue(ops.full(shape, value, dtype=dtype))

    @staticmethod
    def full_like(x: Any, value: Any, dtype: Any = None) -> _OpsValue:
        return _OpsValue(ops.full_like(_raw(x), value, dtype=dtype))

    @staticmethod
    def cumsum(x: Any, axis: int) -> _OpsValue:
        return _OpsValue(ops.cumsum(_raw(x), axis=axis))

    @staticmethod
    def roll(x: Any, shift: int) -> _OpsValue:
        return _OpsValue(ops.roll(_raw(x), shift))

    @staticmethod
    def ldexp(x: Any, e: Any) -> _OpsValue:
        """``x * 2**e`` with ``2**e`` written as float32 bits (exact; ``e`` clamped to [-126, 127])."""
        import tensorflow as tf

        e = tf.clip_by_value(tf.cast(_raw(e), tf.int32), -126, 127)
        return _OpsValue(ops.multiply(_raw(x), tf.bitcast((e + 127) * (1 << 23), tf.float32)))


def namespace() -> Any:
    """The namespace of the current backend: ``jax.numpy``, ``torch``, or :class:`_Ops` on TensorFlow."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax.numpy as jnp

        return jnp
    if backend == "torch":
        import torch

        return torch
    return _Ops


def wrap(x: Any) -> Any:
    """``x`` as a value of :func:`namespace` (wrapped on TensorFlow only)."""
    return _OpsValue(x) if keras.backend.backend() == "tensorflow" and x is not None else x


def unwrap(x: Any) -> Any:
    """The backend tensor of a value of :func:`namespace`."""
    return _raw(x)

