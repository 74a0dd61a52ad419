"""Passes over the gradients (unscale, check), and which of the two gradient contracts a call follows.

Keras 3 (and ``model.fit``) hands ``apply``/``apply_gradients``/``stateless_apply``
the gradients of the *scaled* loss; TF's loop hands ``apply_gradients``
gradients that already went through ``get_unscaled_gradients``.
:class:`UnscaleStage` tells them apart, as torch's ``GradScaler`` remembers an
``unscale_()`` until the next ``step()``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

__all__ = ["UnscaleStage", "all_finite", "reciprocal", "scale_loss", "unscale"]

_NARROW = ("float16", "bfloat16")


def _compute_dtype(dtype: str) -> str:
    """A gradient's own dtype, widened to float32 if narrower."""
    return "float32" if dtype in _NARROW else dtype


def reciprocal(scale: Any, dtype: str = "float32") -> Any:
    """``1 / scale`` computed and rounded once in ``dtype``.

    IEEE division is correctly rounded, and rounding the float64 quotient to
    float32 gives the same number (float64 has more than 2 * 24 + 2 bits), so
    this is bit for bit the float64-exact reciprocal; exact for powers of two.
    TF's ``get_unscaled_gradients`` multiplies by this reciprocal too.
    """
    return ops.divide(ops.ones((), dtype), ops.cast(scale, dtype))


def scale_loss(loss: Any, scale: Any) -> Any:
    """``loss * scale``, computed in at least float32 and returned in ``loss``'s dtype. Cost: one multiply."""
    loss = ops.convert_to_tensor(loss)
    dtype = keras.backend.standardize_dtype(loss.dtype)
    wide = _compute_dtype(dtype)
    scaled = ops.multiply(ops.cast(loss, wide), ops.cast(scale, wide))
    return scaled if wide == dtype else ops.cast(scaled, dtype)


def unscale(grads: Sequence[Any], scale: Any, keep: Sequence[bool] | None = None) -> list[Any]:
    """A new list: each gradient times ``1/scale`` in at least float32, rounded back to its dtype.

    None stays None; where ``keep[i]`` is True (a variable that Keras
    overwrites with its "gradient") the value is passed through as it is.
    Cost: one element-wise multiply per element; under ``tf.function``/``jit``
    it fuses into the finiteness check and the inner update. No host sync.
    """
    inverses: dict[str, Any] = {}
    out = []
    for i, grad in enumerate(grads):
        if grad is None or (keep is not None and keep[i]):
            out.append(grad)
            continue
        dtype = keras.backend.standardize_dtype(grad.dtype)
        wide = _compute_dtype(dtype)
        if wide not in inverses:
            inverses[wide] = reciprocal(scale, wide)
        value = ops.multiply(ops.cast(grad, wide), inverses[wide])
        out.append(value if wide == dtype else ops.cast(value, dtype))
    return out


def _conjunction(flags: Sequence[Any]) -> Any:
    if not flags:
        return ops.convert_to_tensor(True)
    finite = flags[0]
    for flag in flags[1:]:
        finite = ops.logical_and(finite, flag)
    return finite


def _each_finite(grads: Sequence[Any]) -> Any:
    return _conjunction([ops.all(ops.isfinite(g)) for g in grads])


def all_finite(grads: Sequence[Any]) -> Any:
    """A 0-d bool tensor: True iff no gradient holds a NaN or an Inf (NaN and +-Inf alike).

    On TensorFlow and JAX, float32/float64 gradients are first checked
    through one sum of their sums: a finite sum implies every element is finite (a NaN
    propagates; an Inf makes the sum +-Inf, or NaN beside an opposite Inf).
    Only when that sum is not finite (a NaN or Inf, or finite values whose
    sum overflows) does the exact ``all(isfinite(g))`` run, in a ``cond``, so
    the result is always the exact one. Half-precision gradients, whose sums
    overflow at 65504, and the torch backend use the exact check directly.
    (XLA on CPU reduces a plain float32 sum several times faster than
    ``all(isfinite(g))``; see ``lossscale.jax.all_finite``.)

    Cost: one read pass over the gradients (a sum: no intermediate bool
    tensor; a second pass only on a step that holds a non-finite value). No
    host sync under ``tf.function`` and ``jit``; in
    eager TensorFlow the ``cond`` reads the sums' flag (one sync). No
    gradient at all is finite.
    """
    present = [g for g in grads if g is not None]
    if keras.backend.backend() not in ("tensorflow", "jax"):
        return _each_finite(present)
    wide = [g for g in present if keras.backend.standardize_dtype(g.dtype) in ("float32", "float64")]
    narrow = [g for g in present if keras.backend.standardize_dtype(g.dtype) not in ("float32", "float64")]
    if not wide:
        return _each_finite(narrow)
    by_dtype: dict[str, list[Any]] = {}
    for g in wide:
        by_dtype.setdefault(keras.backend.standardize_dtype(g.dtype), []).append(ops.sum(g))
    # The sum of the sums: an overflow here, like one in a sum, only sends the step to the exact check.
    sums = _conjunction([ops.isfinite(ops.sum(ops.stack(group))) for group in by_dtype.values()])
    finite = ops.cond(sums, lambda: ops.convert_to_tensor(True), lambda: _each_finite(wide))
    return ops.logical_and(finite, _each_finite(narrow)) if narrow else finite


class UnscaleStage:
    """Remembers a ``get_unscaled_gradients`` call until the next apply, and what it was given.

    The rule, applied by :meth:`take` to the gradients of an apply:

    * no ``get_unscaled_gradients`` since the last apply: the gradients are
      scaled (Keras 3's contract) and are unscaled;
    * there was one, and every gradient given is one of the *scaled* tensors
      it was given (it was called on the side, e.g. for logging): scaled;
    * there was one, and the gradients are anything else (what it returned,
      or tensors computed from that, e.g. clipped): already unscaled (TF's
      contract), not unscaled again.

    The one pattern it cannot tell apart: calling ``get_unscaled_gradients``
    and then applying *new* tensors computed from the scaled gradients
    (clipping the scaled ones, a second ``tape.gradient``); those are taken
    as unscaled. Under ``tf.function`` and ``jit`` the decision is made when
    the step is traced, from the same Python calls.

    The record is per thread, so per replica under ``tf.distribute``'s
    ``MirroredStrategy`` (each replica runs its step in its own thread): one
    replica's ``get_unscaled_gradients`` does not arm another's apply.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def note(self, scaled: Sequence[Any]) -> None:
        """Records that ``scaled`` went through ``get_unscaled_gradients`` (in this thread)."""
        self._local.inputs = tuple(g for g in scaled if g is not None)  # held so that their ids stay valid

    def forget(self) -> None:
        self._local.inputs = None

    def take(self, grads: Sequence[Any]) -> bool:
        """Whether ``grads`` are already unscaled (see the class docstring); forgets the call either way."""
        inputs = getattr(self._local, "inputs", None)
        self.forget()
        if inputs is None:
            return False
        ids = {id(g) for g in inputs}
        given = [g for g in grads if g is not None]
        side = [id(g) in ids for g in given]
        if given and all(side):
            return False
        if any(side):
            raise ValueError(
                "These gradients mix tensors that went into get_unscaled_gradients() (still scaled) with other "
                "tensors (taken as already unscaled). Apply either all of what get_unscaled_gradients() returned, "
                "or all of the scaled gradients (and let apply unscale them), not a mixture."
            )
        return True
