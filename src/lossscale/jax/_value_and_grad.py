"""``value_and_grad``: the true loss and the gradients of the scaled loss, in one call."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._rule import LossScaleState
from ._compat import is_tracer
from ._grads import scale_loss
from ._optimizer import find_loss_scale_state

__all__ = ["value_and_grad"]


def value_and_grad(
    fun: Callable[..., Any], opt_state: Any = None, *, argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """``jax.value_and_grad`` of ``fun``, with the loss scaled by the scale of the optimizer state.

    The returned function takes ``fun``'s arguments and returns ``(loss, grads)`` (``((loss, aux), grads)``
    with ``has_aux``): ``fun``'s own loss ``L`` and ``d(S * L)/d(params)``, what ``update`` expects. ``S`` is
    read when the function is *called*: from ``opt_state=`` given then (recommended: build once, pass the
    current state at each call; the keyword is not passed to ``fun``), else from the state given here. Built
    inside the step with that step's traced state it may be called any number of times in that trace; with a
    *concrete* state (eager code) once, outside any trace, since a later call would scale the loss by that
    old state's ``S`` (a second call, or one inside a trace, raises ``RuntimeError``). It composes with
    ``jax.jit``, ``jax.pmap`` and ``jax.shard_map``. Cost: one scalar multiply more than
    ``jax.value_and_grad``.

    Args:
        fun: the loss function; returns a 0-d floating-point array (or ``(loss, aux)`` with ``has_aux``).
        opt_state: optional; anything :func:`find_state` takes.
        argnums: as in ``jax.value_and_grad`` (indices into ``fun``'s arguments).
        has_aux: as in ``jax.value_and_grad``.

    Raises:
        TypeError: no loss scale in ``opt_state``; no state at all; ``fun`` returned something other than a
            0-d floating-point array (or a pair with ``has_aux``).
        ValueError: more than one loss scale, or an ``optax.chain`` that clips before the loss scale.
        RuntimeError: a function built with a concrete state called a second time, or inside a trace.

    >>> import jax, jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> opt = lsj.loss_scale_optimizer(optax.sgd(0.1), 1024)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> grad_fn = lsj.value_and_grad(lambda p: jnp.sum(p**2))
    >>> loss, grads = grad_fn(params, opt_state=state)
    >>> float(loss), grads.tolist()                  # true loss, gradients of 1024 * loss
    (5.0, [2048.0, 4096.0])
    >>> built = lsj.value_and_grad(lambda p: jnp.sum(p**2), state)  # a concrete state: one call
    >>> built(params)[1].tolist()
    [2048.0, 4096.0]
    >>> built(params)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    RuntimeError: value_and_grad(fun, opt_state) was built with a concrete optimizer state ...
    """
    if not callable(fun):
        raise TypeError(f"value_and_grad() needs a callable loss function, got {type(fun).__name__}.")
    bound = None if opt_state is None else find_loss_scale_state(opt_state, "value_and_grad()")

    def scaled(scale: jax.Array, *args: Any, **kwargs: Any) -> tuple[jax.Array, Any]:
        out = fun(*args, **kwargs)
        if has_aux:
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise TypeError(
                    f"with has_aux=True the loss function must return a pair (loss, aux), got {type(out).__name__}."
                )
            loss, aux = out
        else:
            loss, aux = out, None
        dtype = getattr(loss, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating) or jnp.ndim(loss) != 0:
            raise TypeError(
                f"value_and_grad() needs a loss function returning a 0-d floating-point array, got "
                f"{type(loss).__name__}{'' if dtype is None else f' of dtype {dtype} and shape {jnp.shape(loss)}'}"
                f"{'' if has_aux else ' (pass has_aux=True if it returns (loss, aux))'}."
            )
        return scale_loss(loss, scale), (loss, aux)

    # The scale is argument 0 of ``scaled``, so fun's argnums shift by one; it is never differentiated.
    def shift(a: Any) -> Any:
        return a + 1 if isinstance(a, int) and a >= 0 else a

    shifted = shift(argnums) if isinstance(argnums, int) else tuple(shift(a) for a in argnums)
    grad_fn = jax.value_and_grad(scaled, argnums=shifted, has_aux=True)

    # A concrete state given here allows one call, outside any trace; the lock makes the flag's test-and-set
    # atomic, so two threads cannot both make the one call.
    once = None if bound is None or is_tracer(jnp.asarray(bound.loss_scale)) else threading.Lock()
    used = False

    @functools.wraps(fun)
    def wrapped(*args: Any, opt_state: Any = None, **kwargs: Any) -> tuple[Any, Any]:
        nonlocal used
        if opt_state is not None:
            scale_state = find_loss_scale_state(opt_state, "value_and_grad()")
        elif bound is not None:
            scale_state = bound
            if once is not None:
                with once:
                    again, used = used, True
                if again:
                    raise _reuse_error(bound, "called a second time: once update() has replaced that state, it "
                                       "would scale the loss by the old state's loss scale")
        else:
            raise TypeError(
                "value_and_grad(fun) reads the loss scale when it is called: pass the current optimizer state, "
                "grad_fn(params, ..., opt_state=state), or build it inside the step as value_and_grad(fun, state)."
            )
        (scaled_loss, (loss, aux)), grads = grad_fn(jnp.asarray(scale_state.loss_scale), *args, **kwargs)
        if once is not None and opt_state is None and is_tracer(scaled_loss):
            # Under jit/pmap/scan every op is staged out, so the scaled loss is a tracer even when every input
            # is a constant: the compiled step would keep this state's scale as a constant.
            raise _reuse_error(scale_state, "called inside a traced function (jit, pmap, scan, vmap): the "
                               "compiled step would keep that state's loss scale as a constant")
        return ((loss, aux) if has_aux else loss), grads

    return wrapped


def _reuse_error(bound: LossScaleState, what: str) -> RuntimeError:
    return RuntimeError(
        f"value_and_grad(fun, opt_state) was built with a concrete optimizer state and {what} "
        f"({float(jnp.asarray(bound.loss_scale)):g}). A function built with a concrete state may be called once, "
        "outside any trace. Build it once without the state and pass the current one at each call: "
        "grad_fn = lsj.value_and_grad(loss_fn); loss, grads = grad_fn(params, batch, opt_state=state)."
    )
