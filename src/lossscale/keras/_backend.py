"""What differs between Keras 3's backends: the rule's array namespace, tracing, autograd.

The scale update is :func:`lossscale.next_state`, run over the backend's own
namespace: ``jax.numpy`` for JAX and ``torch`` for PyTorch, whose tensors
already add a bool to an int as numpy does. TensorFlow's tensors do not
(``int32 + bool`` raises), so on TensorFlow the rule runs over ``keras.ops``
through :class:`_OpsArray`, a wrapper whose operators are ``keras.ops``
calls (numpy's type promotion). The rule itself is never copied.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import keras
from keras import ops

from .. import LossScaleState, next_state

__all__ = ["advance", "is_symbolic", "no_grad", "on_host"]


def _raw(x: Any) -> Any:
    return x.x if isinstance(x, _OpsArray) else x


def _binary(fn: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[[Any, Any], _OpsArray]:
    if reflected:
        return lambda self, other: _OpsArray(fn(_raw(other), self.x))
    return lambda self, other: _OpsArray(fn(self.x, _raw(other)))


class _OpsArray:
    """A backend tensor whose Python operators are ``keras.ops`` calls (numpy's promotion rules)."""

    __slots__ = ("x",)

    def __init__(self, x: Any) -> None:
        self.x = x

    __add__ = _binary(ops.add)
    __radd__ = _binary(ops.add, reflected=True)
    __mul__ = _binary(ops.multiply)
    __rmul__ = _binary(ops.multiply, reflected=True)
    __truediv__ = _binary(ops.divide)
    __lt__ = _binary(ops.less)
    __gt__ = _binary(ops.greater)
    __ge__ = _binary(ops.greater_equal)
    __and__ = _binary(ops.logical_and)
    __rand__ = _binary(ops.logical_and, reflected=True)

    def __invert__(self) -> _OpsArray:
        return _OpsArray(ops.logical_not(self.x))

    # What ``next_state`` checks of its ``finite`` argument (a 0-d bool array).
    @property
    def dtype(self) -> Any:
        return self.x.dtype

    @property
    def ndim(self) -> int:
        return len(self.x.shape)


class _OpsNamespace:
    """The two functions :func:`lossscale.next_state` calls on its namespace, over :class:`_OpsArray`."""

    @staticmethod
    def where(condition: Any, a: Any, b: Any) -> _OpsArray:
        return _OpsArray(ops.where(_raw(condition), _raw(a), _raw(b)))

    @staticmethod
    def isfinite(x: Any) -> _OpsArray:
        return _OpsArray(ops.isfinite(_raw(x)))


def advance(policy: Any, state: LossScaleState, finite: Any) -> LossScaleState:
    """``lossscale.next_state(policy, state, finite, xp)`` with ``xp`` the backend's namespace.

    Cost: about 20 scalar ops; no host sync (under ``tf.function``/``jit`` they fuse into the step).
    """
    backend = keras.backend.backend()
    if backend == "jax":
        import jax.numpy as jnp

        return next_state(policy, state, finite, jnp)
    if backend == "torch":
        import torch

        return next_state(policy, state, finite, torch)
    new = next_state(policy, LossScaleState(*map(_OpsArray, state)), _OpsArray(finite), _OpsNamespace)
    return LossScaleState(*map(_raw, new))


def is_symbolic(x: Any) -> bool:
    """True if ``x`` is being traced (``tf.function`` graph tensor, JAX tracer), so not readable on the host."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return not tf.executing_eagerly()
    if backend == "jax":
        import jax

        return isinstance(x, jax.core.Tracer)
    return False


def on_host(fn: Callable[..., None], *args: Any, every_device: bool = False) -> None:
    """Calls ``fn`` with ``args`` as numpy values: now when they are concrete, else from the compiled step.

    Inside ``tf.function`` it is a ``tf.py_function`` op; under ``jax.jit`` an
    ordered ``jax.debug.callback``. Either way one device-to-host transfer
    per call, after the step's values are known. With ``every_device`` on
    several JAX devices, ``fn`` runs once per device.
    """
    if not any(is_symbolic(a) for a in args):
        fn(*(ops.convert_to_numpy(a) for a in args))
        return
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        def run(*tensors: Any) -> list[Any]:
            fn(*(t.numpy() for t in tensors))
            return []

        tf.py_function(run, list(args), Tout=[])
        return
    import jax

    if jax.device_count() == 1:
        jax.debug.callback(fn, *args, ordered=True)
    elif every_device:  # once per device (``fn`` must be stateless): a raise stops every device's program
        jax.debug.callback(fn, *args, partitioned=True)
    else:  # ordered effects are refused over several devices; this runs once per step
        jax.debug.callback(fn, *args)


def no_grad() -> Any:
    """``torch.no_grad()`` on the torch backend (updates must not be recorded by autograd), else nothing."""
    if keras.backend.backend() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()
