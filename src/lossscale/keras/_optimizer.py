"""``LossScaleOptimizer`` for Keras 3: TF's API and rule, on the TensorFlow, JAX and torch backends."""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import weakref
from collections.abc import Sequence
from numbers import Real
from typing import Any

import keras
from keras import ops

from .. import LossScale
from .._resolve import resolve_loss_scale, stable_form
from .._sampler import check_stats_every
from ._checkpoint import check_store, guard_restores, keras3_store
from ._compat import (
    HIDDEN_FROM_DIR,
    CheckpointParts,
    LegacyCheckpoint,
    built_variables,
    checkpoint_node,
    install_checkpoint_hooks,
    no_automatic_dependency_tracking,
    own_variables,
    trace_of,
)
from ._config import BASE_DEFAULTS, read_config, restore, write_config
from ._diagnostics import StepObserver
from ._distributed import in_replica_of_strategy, replica_apply
from ._grads import all_finite, scale_loss, unscale
from ._state import ScaleVariables
from ._stats import StatsVariables
from ._step import Stateful, eager, stateless, traced

__all__ = ["LossScaleOptimizer"]

#: Base-optimizer settings that are the inner optimizer's: refused by the constructor, read and written through.
_INNER_SETTINGS = tuple(k for k in BASE_DEFAULTS if k != "loss_scale_factor")

_OWNERS: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()  # inner -> its one wrapper


#: The constructor's keywords, named in the error for an unknown one.
_KEYWORDS = (
    "loss_scale", "dynamic", "initial_scale", "dynamic_growth_steps", "min_loss_scale", "max_loss_scale", "hysteresis",
    "max_consecutive_skips", "history", "stats_every", "name",
)


def _at_default(key: str, value: Any) -> bool:
    """Whether ``value`` is base-optimizer setting ``key``'s default, as Keras 3's class compares (``0 == False``)."""
    default = BASE_DEFAULTS[key]
    if default is None:
        return value is None
    try:
        return bool(value == default)
    except (TypeError, ValueError):  # an array: not a default
        return False


def _check_arguments(inner: Any, kwargs: dict[str, Any]) -> None:
    """Raises unless ``inner`` is a Keras 3 optimizer without a scale of its own, and ``kwargs`` holds only
    base-optimizer settings at their defaults (which Keras 3's class accepts, and its older configs carry)."""
    settings = [k for k in kwargs if (k in BASE_DEFAULTS and not _at_default(k, kwargs[k])) or k == "learning_rate"]
    if settings:
        shown = ", ".join(f"{k}={kwargs[k]!r}" for k in settings)
        example = shown if "learning_rate" in settings else f"1e-3, {shown}"
        raise ValueError(
            f"LossScaleOptimizer does not support {shown}: the update is the inner optimizer's. Instead, set it on "
            f"the inner_optimizer, e.g. LossScaleOptimizer(keras.optimizers.Adam({example}))"
            + (" (a loss scale goes in loss_scale= here instead)." if "loss_scale_factor" in settings else ".")
        )
    unknown = [k for k in kwargs if k not in BASE_DEFAULTS]
    if unknown:
        raise ValueError(
            f"LossScaleOptimizer does not support arguments: `{'`, `'.join(unknown)}`. It takes inner_optimizer and "
            f"the keywords {', '.join(_KEYWORDS)} (and the base optimizer's settings at their defaults)."
        )
    if isinstance(inner, keras.optimizers.LossScaleOptimizer):
        raise TypeError(
            "inner_optimizer is already a LossScaleOptimizer; wrapping it again would scale twice. Use it as it "
            "is, or wrap its inner_optimizer."
        )
    if not isinstance(inner, keras.optimizers.Optimizer):
        raise TypeError(
            f"inner_optimizer must be a keras.optimizers.Optimizer instance (Keras 3), got {type(inner).__name__}. "
            "Build it first, e.g. LossScaleOptimizer(keras.optimizers.AdamW(1e-3)); for a serialized Keras 2 "
            "optimizer use LossScaleOptimizer.from_config."
        )
    if inner.loss_scale_factor is not None:
        raise ValueError(
            f"inner_optimizer has loss_scale_factor={inner.loss_scale_factor!r}, a second, fixed loss scale. "
            "Drop it from the inner optimizer and pass it here instead: "
            f"LossScaleOptimizer(inner, loss_scale={inner.loss_scale_factor!r})."
        )


def _inner_argument(inner_optimizer: Any, kwargs: dict[str, Any]) -> Any:
    """The optimizer to wrap, given as ``inner_optimizer`` (the stable form's name, Keras 3's) or as ``optimizer``
    (the experimental form's, ``LossScaleOptimizer(optimizer, loss_scale)``); ``optimizer`` is taken out of
    ``kwargs``."""
    if "optimizer" in kwargs:
        if inner_optimizer is not None:
            raise TypeError(
                "Got both inner_optimizer and optimizer: they name the same argument (the stable form's and TF's "
                "experimental form's name for the optimizer to wrap). Pass one of them."
            )
        inner_optimizer = kwargs.pop("optimizer")
    if inner_optimizer is None:
        raise TypeError(
            "LossScaleOptimizer needs the optimizer to wrap, e.g. LossScaleOptimizer(keras.optimizers.Adam(1e-3)) "
            "(or as inner_optimizer=, or optimizer= as in TF's experimental form)."
        )
    return inner_optimizer


def _below_one(value: Any) -> bool:
    """Whether ``value`` is a number in (0, 1): an initial scale Keras 3 accepts and TF's floor of 1 would refuse."""
    return isinstance(value, Real) and not isinstance(value, bool) and 0 < float(value) < 1


def _claim(inner: Any, wrapper: Any) -> None:
    """Records ``wrapper`` as ``inner``'s only wrapper; raises if another live one holds it (as tf-keras)."""
    owner = _OWNERS.get(inner)
    if owner is not None and owner() is not None:
        gc.collect()  # a wrapper kept only by a reference cycle is gone after this
    holder = owner() if owner is not None else None
    if holder is not None and holder is not wrapper:
        raise ValueError(
            f"inner_optimizer {inner.name!r} is already wrapped by another LossScaleOptimizer ({holder.name!r}): "
            "two wrappers would share its slots and iterations but keep two loss scales. Use that wrapper, or "
            "wrap a new inner optimizer (e.g. keras.optimizers.Adam.from_config(inner.get_config()))."
        )
    _OWNERS[inner] = weakref.ref(wrapper)


def _forward(name: str) -> property:
    """A property reading and writing the inner optimizer's ``name`` (None until the inner is set)."""

    def read(self: Any) -> Any:
        return None if (inner := self.__dict__.get("inner_optimizer")) is None else getattr(inner, name)

    def write(self: Any, value: Any) -> None:
        if (inner := self.__dict__.get("inner_optimizer")) is not None:  # None while the base __init__ runs
            setattr(inner, name, value)

    return property(read, write, doc=f"The inner optimizer's ``{name}``.")


# tf-keras slot name -> Keras 3 variable prefix, per optimizer class, where they differ.
_TF_KERAS_SLOTS = {
    "Adam": {"m": "momentum", "v": "velocity", "vhat": "velocity_hat"},
    "AdamW": {"m": "momentum", "v": "velocity", "vhat": "velocity_hat"},
    "Nadam": {"m": "momentum", "v": "velocity"},
    "Lamb": {"m": "momentum", "v": "velocity"},
    "Adamax": {"m": "momentum", "v": "norm"},
    "RMSprop": {"rms": "velocity", "mg": "average_gradient"},
    "Adadelta": {"accum_grad": "accumulated_grad", "accum_var": "accumulated_delta_var"},
}


def _tensorflow_only(method: str, needs: str) -> None:
    if (backend := keras.backend.backend()) != "tensorflow":
        raise NotImplementedError(
            f"{method}() needs {needs} (TensorFlow backend); on {backend} compute the gradients of "
            "get_scaled_loss(loss) and call apply(grads, variables), which unscales them."
        )


def _slots_of(inner: Any, variable: Any) -> dict[str, Any]:
    path = getattr(variable, "path", None) or str(variable.name).replace(":", "_")
    prefix = f"{path.replace('/', '_')}_"
    return {v.name[len(prefix) :]: v for v in inner.variables if v.name.startswith(prefix)}


def _slot_name(inner: Any, slot_name: str) -> str:
    return _TF_KERAS_SLOTS.get(type(inner).__name__, {}).get(slot_name, slot_name)


class UnscaleStage:
    """Which gradient contract an apply follows: what ``get_unscaled_gradients`` got, kept per thread (replica).

    A call arms the next apply (its gradients are taken as already unscaled unless they are the call's inputs),
    except a call on the gradients the last apply took (logging after a step), and the note holds only in the
    trace it was made in (a call made eagerly does not reach the first step ``fit`` traces). Cost: one weak
    reference per gradient per apply (eager: about 60 ns each; traced: at trace time only)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def note(self, scaled: Sequence[Any]) -> None:
        inputs = tuple(g for g in scaled if g is not None)  # held so that their ids stay valid
        applied = getattr(self._local, "applied", ())
        logged = bool(inputs) and len(inputs) == len(applied) and all(ref() is g for ref, g in zip(applied, inputs))
        self._local.inputs = None if logged else inputs  # logged: the gradients of the step just taken, arm nothing

    def take(self, grads: Sequence[Any]) -> bool:
        """Whether ``grads`` are already unscaled; forgets the call either way."""
        inputs = getattr(self._local, "inputs", None)
        self._local.inputs = None
        given = [g for g in grads if g is not None]
        try:  # weak: the gradients of the last step must not stay in memory for this
            self._local.applied = tuple(weakref.ref(g) for g in given)
        except TypeError:
            self._local.applied = ()
        if not inputs or (given and trace_of(inputs[0]) is not trace_of(given[0])):
            return False
        ids = {id(g) for g in inputs}
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


@keras.saving.register_keras_serializable(package="lossscale")
class LossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """An optimizer that applies loss scaling; TF's ``tf.keras.mixed_precision.LossScaleOptimizer`` for Keras 3.

    The loss is multiplied by ``S`` and the gradients by ``1/S`` (the float32 reciprocal, as TF), so that float16
    gradients below about 6e-8 do not flush to zero. Per apply, with ``g`` the gradients::

        u = g if g already went through get_unscaled_gradients else g * (1/S)
        finite = all(isfinite(u))
        if finite: inner_optimizer.apply(u)     # iterations += 1
        else:      nothing: weights, inner slots and iterations untouched
        S, counters = advance(policy, S, counters, finite)     # the core's rule, lossscale.next_state

    A non-finite step is skipped in every mode, fixed scales included. A subclass of Keras' own class; the state is
    five Keras variables, which ``.keras`` files save (a file of Keras 3's own class loads too: its scale and step
    counter carry over). Base-optimizer settings (``clipnorm``, ``use_ema``, ...) are the inner optimizer's:
    refused here off their defaults, read and written through as attributes. See docs/keras.md.

    Args:
        inner_optimizer: the ``keras.optimizers.Optimizer`` instance to wrap (not already wrapped by another live
            ``LossScaleOptimizer``: two wrappers would share its slots and ``iterations`` but keep two scales).
            Also accepted as ``optimizer=``, its name in TF's experimental form ``LossScaleOptimizer(optimizer,
            loss_scale)``.
        loss_scale: a number (fixed), ``"dynamic"``, ``"auto"``, a :class:`lossscale.LossScale` or its serialized
            dict. Default None: the stable form's keywords below decide (dynamic).
        dynamic: TF's stable form: whether the scale moves (default None: True). False needs ``initial_scale``.
        initial_scale: the first scale (default None: 2**15 when dynamic). A dynamic ``initial_scale`` below 1
            (which Keras 3 accepts) is also the floor unless ``min_loss_scale`` is given.
        dynamic_growth_steps: finite steps in a row before the scale doubles (default None: 2000).
        min_loss_scale: the dynamic scale's floor (default None: 1).
        max_loss_scale: the dynamic scale's ceiling (default None: none).
        hysteresis: non-finite steps before the scale halves (default None: 1, TF's).
        max_consecutive_skips: raise :class:`lossscale.LossScaleError` after this many skips in a row (default
            None: never). Costs one transfer of two scalars to the host per step.
        history: True (a new :class:`lossscale.History`), a ``History`` to append to, or False/None (default: off):
            each step's scale, skip flag and loss (eager steps; compiled ones record NaN). Costs one transfer of
            three scalars to the host per step.
        stats_every: measure the scaled gradients every N-th apply (default None: never; 16 with
            ``loss_scale="auto"``). A sampled step costs one more read pass over the gradients.
        name: the optimizer's name (default None: Keras picks one).
        **kwargs: base-optimizer settings (``clipnorm``, ``use_ema``, ...) at their defaults, as Keras 3's class
            accepts them (its configs carry them).

    Raises:
        ValueError: a base-optimizer setting off its default, an unknown keyword, an inner optimizer with its own
            ``loss_scale_factor`` or held by another wrapper, or a policy value the core refuses.
        TypeError: ``inner_optimizer`` is missing (or given twice, also as ``optimizer``), is not a Keras 3
            optimizer or is a ``LossScaleOptimizer``; a ``history`` or ``max_consecutive_skips`` of the wrong type.

    Cost per step: one multiply per gradient element, one read pass for the check, about 20 scalar ops for the
    scale (torch off the CPU: GradScaler's update kernel, 1 operator on a finite step). Host syncs: none under
    ``tf.function`` and ``jit``; one in eager TensorFlow and on torch; ``history``/``max_consecutive_skips`` add one
    transfer of three scalars.
    """

    def __init__(
        self, inner_optimizer: Any = None, loss_scale: Any = None, *, dynamic: bool | None = None,
        initial_scale: float | None = None, dynamic_growth_steps: int | None = None,
        min_loss_scale: float | None = None, max_loss_scale: float | None = None, hysteresis: int | None = None,
        max_consecutive_skips: int | None = None, history: Any = None, stats_every: int | None = None,
        name: str | None = None, **kwargs: Any,
    ) -> None:
        inner_optimizer = _inner_argument(inner_optimizer, kwargs)
        _check_arguments(inner_optimizer, kwargs)
        if _below_one(initial_scale) and loss_scale is None and dynamic is not False and min_loss_scale is None:
            min_loss_scale = initial_scale  # Keras 3 takes it (with no floor); TF's floor of 1 would be above it
        policy = resolve_loss_scale(
            loss_scale, dynamic=dynamic, initial_scale=initial_scale, dynamic_growth_steps=dynamic_growth_steps,
            min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale, hysteresis=hysteresis,
        )
        observer = StepObserver(history, max_consecutive_skips)
        every = check_stats_every(stats_every, policy)
        # Keras' own __init__ rejects dynamic=False and takes no policy: initialise its base instead.
        super(keras.optimizers.LossScaleOptimizer, self).__init__(learning_rate=0.0, name=name)
        _claim(inner_optimizer, self)
        self.inner_optimizer = inner_optimizer
        self._policy = policy
        self._scale_variables = ScaleVariables(policy, None if every is None else StatsVariables(every, policy))
        self._observer = observer
        self._stage = UnscaleStage()
        self._jax_steps: dict[bool, Any] = {}
        self._pending: dict[str, Any] | None = None  # variable values restored before build (pickle, deepcopy)
        self._checkpoint_node = checkpoint_node()
        self._legacy_checkpoint = LegacyCheckpoint()  # restores of 0.1's and Keras 3's tf.train.Checkpoint layouts

    @no_automatic_dependency_tracking
    def build(self, var_list: Sequence[Any]) -> None:
        """Creates the scale's variables (and ``stats_every``'s) and builds the inner optimizer.

        Args:
            var_list: the trainable variables the optimizer will update (``model.trainable_variables``).

        Values restored before build (an unpickled optimizer) are loaded here, through the same checks as a file.
        """
        # Keras' own class names its first two variables as attributes; kept for code that reads them.
        variables = self._scale_variables.build(self.add_variable)
        if self._checkpoint_node is not None:
            self._legacy_checkpoint.before_build(self)
        fields = self._scale_variables.fields()
        self.dynamic_scale, self.step_counter = fields.loss_scale, fields.good_steps
        if self._scale_variables.stats is not None and not self._scale_variables.stats.built:
            variables = variables + self._scale_variables.stats.build(self.add_variable, list(var_list))
        if self._checkpoint_node is not None:  # tf.train.Checkpoint: the inner's graph plus "loss_scale"
            for variable in variables:
                setattr(self._checkpoint_node, variable.name, variable)
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        super(keras.optimizers.LossScaleOptimizer, self).build(var_list)
        guard_restores(self, self._scale_variables.variables)
        if self._checkpoint_node is not None:
            self._legacy_checkpoint.built(self, self._scale_variables.variables)
        pending, self._pending = self._pending, None
        if pending is not None:
            self.load_own_variables(pending)

    def load_own_variables(self, store: Any) -> None:
        """Keras' loader (``.keras``, ``load_weights``, pickle) after the core's check: a bad value assigns nothing.

        A file of Keras 3's own ``LossScaleOptimizer`` (its layout: four variables before the inner optimizer's,
        ours seven or more) loads too: its scale and step counter carry over, the skip counters start at 0 and the
        statistics empty (:func:`._checkpoint.keras3_store`).

        Args:
            store: Keras' weights store of this optimizer (``"0"``, ``"1"``, ... -> arrays).

        Raises:
            ValueError: a saved scale state the policy refuses (out of bounds, negative counters, wrong shape), or
                a Keras 3 file whose scale overflowed to inf.
        """
        store = keras3_store(self, self._scale_variables, store) or store
        check_store(self, self._scale_variables.variables, store)
        super().load_own_variables(store)

    def _checkpoint_parts(self) -> CheckpointParts | None:
        """What TensorFlow's checkpoint hooks (:func:`._compat.install_checkpoint_hooks`) need; None while
        ``__init__`` runs (Keras tracks attributes as they are set)."""
        legacy = self.__dict__.get("_legacy_checkpoint")
        if legacy is None:
            return None
        return CheckpointParts(self.inner_optimizer, self._checkpoint_node, legacy, self._scale_variables.variables)

    def __dir__(self) -> list[str]:
        return [name for name in super().__dir__() if name not in HIDDEN_FROM_DIR]

    @property
    def dynamic(self) -> bool:
        """Whether the loss scale changes during training."""
        return self._scale_variables.params.dynamic

    @property
    def initial_scale(self) -> float:
        """The initial loss scale (the only one, when fixed)."""
        return self._scale_variables.params.initial_scale

    @property
    def dynamic_growth_steps(self) -> int | None:
        """Finite steps in a row before the scale grows, or None if fixed."""
        return stable_form(self._policy)["dynamic_growth_steps"]

    @property
    def lr(self) -> Any:
        """tf-keras's alias of ``learning_rate`` (the inner optimizer's), read and written through; Keras 3's
        optimizers dropped it."""
        return self.learning_rate

    @lr.setter
    def lr(self, value: Any) -> None:
        self.learning_rate = value

    @property
    def weights(self) -> list[Any]:
        """tf-keras's name for :attr:`variables`: this optimizer's variables, then the inner optimizer's, in the
        order they were created."""
        return list(self.variables)

    @property
    def loss_scale_policy(self) -> LossScale:
        """The :class:`lossscale.LossScale` followed."""
        return self._policy

    @property
    def loss_scale(self) -> Any:
        """The current loss scale, a 0-d float32 tensor (no sync until converted)."""
        return self._scale_variables.value("loss_scale")

    @property
    def dynamic_counter(self) -> Any:
        """Finite steps since the scale last changed (0-d int32), or None if fixed."""
        return self._scale_variables.value("good_steps") if self.dynamic else None

    @property
    def skipped_steps(self) -> Any:
        """Steps skipped so far, a 0-d int32 tensor (saturating; saved)."""
        return self._scale_variables.value("skipped_steps")

    @property
    def consecutive_skips(self) -> Any:
        """Steps skipped in a row up to the last one (0-d int32)."""
        return self._scale_variables.value("consecutive_skips")

    @property
    def last_step_skipped(self) -> Any:
        """Whether the last step was skipped, a 0-d bool tensor."""
        return ops.greater(self.consecutive_skips, 0)

    @property
    def stats_every(self) -> int | None:
        """Measure the gradients every N-th apply (None: off)."""
        return None if self._scale_variables.stats is None else self._scale_variables.stats.every

    @property
    def gradient_stats(self) -> dict[str, Any] | None:
        """The latest sample of ``stats_every`` (None when off or before build), 0-d and ``(T,)`` tensors; no sync.
        Keys ``step`` (-1 before the first sample), ``amax``, ``headroom_bits``, ``zero_fraction``,
        ``subnormal_fraction``, ``rms_min`` and ``per_tensor`` (``names``: the variables' paths)."""
        return None if self._scale_variables.stats is None else self._scale_variables.stats.mapping()

    def _stats_progress(self) -> tuple[int, int] | None:
        """``(stats_every, applies so far)`` for ``lossscale.underflow_report``'s errors; None when off (host read)."""
        stats = self._scale_variables.stats
        return None if stats is None else (stats.every, int(ops.convert_to_numpy(stats.count)) if stats.built else 0)

    @property
    def history(self) -> Any:
        """The :class:`lossscale.History` being recorded, or None."""
        return self._observer.history

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * loss_scale``, computed in at least float32 and returned in ``loss``'s dtype (TF's).

        Args:
            loss: the loss, a tensor (a scalar, or per example), or a callable returning one (TF's form: then a
                callable comes back).

        Returns:
            The scaled loss. With ``history`` on, an eager 1-element loss is kept for the next step's record.

        Cost: one multiply; no host sync.
        """
        if callable(loss):
            return lambda: self.get_scaled_loss(loss())
        self._observer.note_loss(loss)
        return scale_loss(loss, self.loss_scale)

    def scale_loss(self, loss: Any) -> Any:
        """Keras 3's name for :meth:`get_scaled_loss` (what ``fit`` calls), with Keras 3's dtype.

        Args:
            loss: the loss tensor.

        Returns:
            ``loss * loss_scale``: a float16 or bfloat16 loss comes back in float32 (``3.0 * 2**15`` overflows
            float16), a wider one in its own dtype.

        Cost: one multiply; no host sync.
        """
        self._observer.note_loss(loss)
        return scale_loss(loss, self.loss_scale, keep_dtype=False)

    def get_unscaled_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """A new list: each gradient times ``1/loss_scale`` (the float32 reciprocal, as TF) in its own dtype.

        The next apply takes what this returns (or tensors computed from it) as already unscaled (docs/keras.md,
        "Two gradient contracts"), except when these are the gradients the last apply took (logging after a step).

        Args:
            grads: the scaled gradients; None entries stay None. Not modified.

        Returns:
            The unscaled gradients, a new list.

        Cost: one multiply per element; no host sync.
        """
        grads = list(grads)
        self._stage.note(grads)
        return unscale(grads, self.loss_scale)

    def check_finite(self, grads: Sequence[Any]) -> Any:
        """Whether no gradient holds a NaN or an Inf, the check a step makes.

        Args:
            grads: the gradients (None entries are left out).

        Returns:
            A 0-d bool tensor. Cost: one read pass over the gradients (two on a non-finite step); one host sync in
            eager TensorFlow, none when traced.
        """
        return all_finite(grads)

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> None:
        """One step: unscales (unless already unscaled), checks, applies or skips, and advances the scale.

        Args:
            grads: one gradient per variable (None for none), of the scaled loss, or what
                :meth:`get_unscaled_gradients` returned. Not modified.
            trainable_variables: the variables (default None: those the optimizer was built with; then it must be
                built). An unbuilt optimizer is built with them.

        Raises:
            ValueError: no variables for an unbuilt optimizer, a gradient count that does not match, a variable the
                optimizer was not built with (JAX), every gradient None, or a mixture of scaled and unscaled
                gradients.

        Under ``tf.distribute`` the gradients are summed over the replicas first. Cost: one multiply and one read
        pass over the gradients, about 20 scalar ops (torch off the CPU: 1); host syncs: none when traced, one in
        eager TensorFlow and on torch.
        """
        self._apply(grads, trainable_variables, aggregate=True)

    def _apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None, aggregate: bool) -> None:
        grads = list(grads)
        if not grads:
            return
        if all(g is None for g in grads):  # Keras' own error, raised before the step's cond wraps it
            raise ValueError("No gradients provided for any variable.")
        if not self.built:
            if trainable_variables is None:
                raise ValueError(
                    "apply(grads) without trainable_variables needs a built optimizer: pass the variables, "
                    "or call optimizer.build(model.trainable_variables) first."
                )
            with keras.name_scope(self.name, caller=self):
                self.build(list(trainable_variables))
        variables = list(built_variables(self) if trainable_variables is None else trainable_variables)
        if len(grads) != len(variables):
            raise ValueError(f"Got {len(grads)} gradients for {len(variables)} variables; pass one per variable.")
        already = self._stage.take(grads)
        state, observer, inner = self._scale_variables, self._observer, self.inner_optimizer
        backend = keras.backend.backend()
        if backend == "jax":
            self._apply_jitted(grads, variables, already)
        elif backend == "torch":
            eager(state, observer, inner, grads, variables, already)
        elif backend == "tensorflow" and in_replica_of_strategy():
            replica_apply(state, observer, inner, grads, variables, already, aggregate)
        else:
            traced(state, observer, grads, variables, already, Stateful(inner, variables))

    def _apply_jitted(self, grads: list[Any], variables: list[Any], already: bool) -> None:
        """``apply`` on JAX: the pure step (:func:`._step.stateless`) jitted once per gradient contract, then
        assigned. A stateful ``apply`` would assign inside a ``lax.cond`` and leak its tracers. Host syncs: none in
        the step (with the stall guard: one on leaving, :meth:`._diagnostics.StepObserver.deferred`)."""
        import jax

        trainable = built_variables(self)
        known = {id(v) for v in trainable}
        for variable in variables:
            if id(variable) not in known:  # Keras' own error; otherwise its gradient would be dropped silently
                raise ValueError(
                    f"Unknown variable: {variable}. This optimizer can only be called for the variables it was "
                    "originally built with. For a new set of variables, build a new optimizer."
                )
        by_id = {id(v): g for v, g in zip(variables, grads)}
        full = [by_id.get(id(v)) for v in trainable]
        own, inner, observer = own_variables(self), self.inner_optimizer, self._observer
        all_variables = list(own) + list(inner.variables)
        step = self._jax_steps.get(already)
        if step is None:
            pure = functools.partial(stateless, self._scale_variables, observer, inner, own, trainable, already=already)
            step = self._jax_steps[already] = jax.jit(pure)
        with observer.deferred() if observer.active else contextlib.nullcontext():
            new_trainable, new_optimizer = step([v.value for v in all_variables], full, [v.value for v in trainable])
        for variable, value in zip([*trainable, *all_variables], [*new_trainable, *new_optimizer]):
            variable.assign(value)

    def stateless_apply(
        self, optimizer_variables: Sequence[Any], grads: Sequence[Any], trainable_variables: Sequence[Any]
    ) -> tuple[list[Any], list[Any]]:
        """The pure form of :meth:`apply` (what ``fit`` on JAX calls), touching no variable.

        Args:
            optimizer_variables: the values of ``self.variables``, in that order.
            grads: one gradient per trainable variable, scaled unless from :meth:`get_unscaled_gradients`.
            trainable_variables: the values of the variables the optimizer was built with.

        Returns:
            ``(new trainable values, new optimizer values)``.

        Raises:
            ValueError: on TensorFlow, before build, or when a count does not match.
        """
        if keras.backend.backend() == "tensorflow":
            raise ValueError(
                "stateless_apply is not supported with the TensorFlow backend (as it is incompatible with "
                "tf.distribute): use apply() or apply_gradients()."
            )
        if not self.built:
            raise ValueError(
                f"To call `stateless_apply`, {type(self).__name__} must be built (i.e. its variables must have been "
                "created). You can build it via `optimizer.build(trainable_variables)`."  # Keras 3's words
            )
        values, own, trainable = optimizer_variables, self.variables, built_variables(self)
        if len(values) != len(own) or len(trainable_variables) != len(trainable):
            raise ValueError(
                f"stateless_apply takes one value per optimizer variable ({len(own)}, got {len(values)}) and "
                f"per trainable variable it was built with ({len(trainable)}, got {len(trainable_variables)})."
            )
        grads = list(grads)
        already = self._stage.take(grads)
        state, inner = self._scale_variables, self.inner_optimizer
        return stateless(state, self._observer, inner, own_variables(self), trainable, values, grads, trainable_variables,
                         already)

    def apply_gradients(
        self, grads_and_vars: Any, name: str | None = None, experimental_aggregate_gradients: bool = True
    ) -> Any:
        """Applies ``(gradient, variable)`` pairs, as :meth:`apply`; TF's signature.

        Args:
            grads_and_vars: an iterable of ``(gradient, variable)`` pairs (not empty).
            name: unused (TF's signature).
            experimental_aggregate_gradients: under ``tf.distribute``, True (default) sums the gradients over the
                replicas before the check (a NaN or Inf on one replica skips the step on all); False: the caller
                has summed them (a step is skipped if any replica's are not finite).

        Returns:
            ``iterations`` (not advanced on a skip).

        Raises:
            TypeError: an item that is not a ``(gradient, variable)`` pair (TF's "malformed").
            ValueError: no pairs, or as :meth:`apply` (no gradient for any variable among them).
        """
        pairs = list(grads_and_vars)
        if not pairs:
            raise ValueError("apply_gradients() got no (gradient, variable) pairs.")
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                # Checked here: a 2-row tensor would otherwise unpack as one gradient-and-"variable" pair.
                raise TypeError(
                    f"apply_gradients() takes (gradient, variable) pairs, got an item of type {type(pair).__name__}"
                    f"{f' and length {len(pair)}' if isinstance(pair, (tuple, list)) else ''}. Pass "
                    "zip(grads, variables), or call apply(grads, variables)."
                )
        grads, variables = zip(*pairs)
        self._apply(list(grads), list(variables), aggregate=bool(experimental_aggregate_gradients))
        return self.iterations

    def minimize(self, loss: Any, var_list: Any, tape: Any = None) -> Any:
        """TF's ``minimize`` (TensorFlow backend): scale, differentiate, unscale, apply.

        Args:
            loss: the loss tensor, or a callable returning it (called inside the tape).
            var_list: a variable, a list or tuple of them, or a callable returning one (called after ``loss``).
            tape: a ``tf.GradientTape`` to record in (default None: a new one).

        Returns:
            ``iterations`` (not advanced on a skip).

        Raises:
            NotImplementedError: on another backend (the message names the replacement).

        Cost: one backward pass, then :meth:`apply`'s.
        """
        _tensorflow_only("minimize", "tf.GradientTape")
        import tensorflow as tf

        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            scaled = self.get_scaled_loss(loss() if callable(loss) else loss)
        variables = tf.nest.flatten(var_list() if callable(var_list) else var_list)
        grads = tape.gradient(scaled, variables)
        return self.apply_gradients(zip(self.get_unscaled_gradients(grads), variables))

    def get_gradients(self, loss: Any, params: Sequence[Any]) -> list[Any]:
        """TF's ``get_gradients``: ``tf.gradients`` of ``get_scaled_loss(loss)``, unscaled.

        Args:
            loss: the loss tensor, or a callable returning it.
            params: the variables (Keras or TensorFlow) to differentiate by.

        Returns:
            The unscaled gradients, one per variable.

        Raises:
            NotImplementedError: on another backend.
            RuntimeError: in eager code (``tf.gradients`` works inside a ``tf.function`` only, as in tf-keras).

        Cost: one backward pass, one multiply per gradient element.
        """
        _tensorflow_only("get_gradients", "tf.gradients")
        import tensorflow as tf

        if tf.executing_eagerly():
            raise RuntimeError(
                "get_gradients() uses tf.gradients, which works inside a tf.function only (as in tf-keras). In eager "
                "code use minimize(loss, var_list), or tf.GradientTape on get_scaled_loss(loss) and "
                "get_unscaled_gradients(grads)."
            )
        variables = [v.value if isinstance(v, keras.Variable) else v for v in params]
        scaled = self.get_scaled_loss(loss() if callable(loss) else loss)
        return self.get_unscaled_gradients(tf.gradients(scaled, variables))

    def get_slot_names(self) -> list[str]:
        """The inner optimizer's per-variable state names (Keras 3's: Adam's ``["momentum", "velocity"]``).

        Returns:
            The names, in the order of the first variable that has them (empty before build).
        """
        inner = self.inner_optimizer
        return list(dict.fromkeys(name for v in built_variables(self) for name in _slots_of(inner, v)))

    def get_slot(self, var: Any, slot_name: str) -> Any:
        """The inner optimizer's ``slot_name`` variable for ``var``.

        Args:
            var: the model variable.
            slot_name: Keras 3's name (``"momentum"``) or tf-keras's (``"m"``, translated per optimizer class).

        Returns:
            The slot variable.

        Raises:
            ValueError: before build.
            KeyError: no such slot (the message lists the variable's slots).
        """
        inner = self.inner_optimizer
        slots, name = _slots_of(inner, var), _slot_name(inner, slot_name)
        if name in slots:
            return slots[name]
        if not inner.built:
            raise ValueError("The optimizer has no slots yet: call optimizer.build(variables) before get_slot().")
        raise KeyError(
            f"No slot {slot_name!r} for variable {getattr(var, 'path', var)!r} in {type(inner).__name__}; "
            f"its slots are {sorted(slots)} (see get_slot_names()). Keras 3 keeps no slot for some tf-keras ones: "
            "read optimizer.variables instead."
        )

    def add_slot(self, var: Any, slot_name: str, initializer: Any = "zeros") -> Any:
        """The ``slot_name`` variable for ``var``: the existing one, or a new one shaped like ``var``.

        Args:
            var: the model variable.
            slot_name: Keras 3's or tf-keras's slot name.
            initializer: a Keras initializer or its name for a new slot (default ``"zeros"``).

        Returns:
            The slot variable: a new one comes from Keras 3's ``inner.add_variable_from_reference``, is saved with
            the optimizer and is not used by its update rule.
        """
        inner = self.inner_optimizer
        slots, name = _slots_of(inner, var), _slot_name(inner, slot_name)
        return slots[name] if name in slots else inner.add_variable_from_reference(var, name, initializer=initializer)

    def get_config(self) -> dict[str, Any]:
        """Keras 3's keys (``name``, ``inner_optimizer``, ``initial_scale``, ``dynamic_growth_steps``) when they
        describe the policy, else ``loss_scale`` (a fixed scale's number, or :func:`lossscale.serialize`'s dict);
        and ours when set. No ``dynamic`` key (tf-keras's): :meth:`from_config` still reads one."""
        limit = self._observer.max_consecutive_skips
        return write_config(self.name, self.inner_optimizer, self._policy, limit, self.stats_every)

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> LossScaleOptimizer:
        """Rebuilds from :meth:`get_config`, Keras 3's own config, or any tf-keras ``LossScaleOptimizer`` config.

        Args:
            config: the config dict (tf-keras's shapes and Keras 2 inner optimizers are translated, as
                docs/keras.md's "Configs from tf-keras" lists).
            custom_objects: classes by name for a custom inner optimizer or :class:`lossscale.LossScale` (default
                None: Keras' registry and an enclosing ``custom_object_scope``). A config never imports a module.

        Returns:
            The optimizer.

        Raises:
            ValueError: not a ``LossScaleOptimizer`` config, a base-optimizer setting off its default, or an inner
                optimizer Keras 3 cannot rebuild.
            TypeError: an ``inner_optimizer`` entry that is no optimizer and no serialized one.
        """
        inner, kwargs = read_config(config, custom_objects)
        return cls(inner, **kwargs)

    @classmethod
    def _unpickled(cls, config: dict[str, Any], custom: dict[str, Any], values: Any, history: Any) -> Any:
        """The optimizer of a pickled record (:func:`._config.restore`): ``from_config``; ``values`` wait for
        :meth:`build` (the model's variables), ``history`` is the pickled one."""
        opt = cls.from_config(dict(config), custom_objects=custom)
        opt._pending, opt._observer.history = values, history
        return opt

    def __reduce__(self) -> Any:
        """Pickling and ``copy.deepcopy``: the config and the variables' values, as a ``.keras`` file holds them."""
        custom = {type(self._policy).__name__: type(self._policy)}
        values = {str(i): ops.convert_to_numpy(v) for i, v in enumerate(self.variables)} if self.built else None
        return restore, (type(self), self.get_config(), custom, values, self.history)

    def __repr__(self) -> str:
        inner = type(self.inner_optimizer).__name__
        return f"<lossscale.keras.LossScaleOptimizer {self.name!r} {self._policy!r} inner={inner}>"


for _name in _INNER_SETTINGS:
    setattr(LossScaleOptimizer, _name, _forward(_name))
install_checkpoint_hooks(LossScaleOptimizer)
