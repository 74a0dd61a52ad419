"""What differs between Keras 3's backends: the rule's array namespace, tracing, autograd.

The scale update is :func:`lossscale.next_state`, run over the backend's own
namespace: ``jax.numpy`` for JAX and ``torch`` for PyTorch, whose tensors
already add a bool to an int as numpy does. TensorFlow's tensors do not
(``int32 + bool`` raises), so on TensorFlow the rule runs over ``keras.ops``
through :mod:`lossscale.keras._xp`'s wrapper, whose operators are
``keras.ops`` calls (numpy's type promotion); the statistics and the auto
rule use the same namespace. The rule itself is never copied.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import keras
from keras import ops

from .. import LossScaleState, next_state
from ._xp import namespace, unwrap, wrap

__all__ = ["advance", "is_symbolic", "no_grad", "on_host"]


def advance(policy: Any, state: LossScaleState, finite: Any) -> LossScaleState:
    """``lossscale.next_state(policy, state, finite, xp)`` with ``xp`` the backend's namespace.

    Cost: about 20 scalar ops; no host sync (under ``tf.function``/``jit`` they fuse into the step).
    """
    flag = finite if isinstance(finite, bool) else wrap(finite)  # a Python bool: a constant branch's flag
    new = next_state(policy, LossScaleState(*map(wrap, state)), flag, namespace())
    return LossScaleState(*map(unwrap, new))


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
