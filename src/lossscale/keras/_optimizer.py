"""``LossScaleOptimizer`` for Keras 3: the seeds' API and TF's rule, on the TensorFlow, JAX and torch backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from .. import LossScale
from .._resolve import stable_form
from ._args import loss_scale_from_config, policy_config, resolve_policy
from ._compat import no_automatic_dependency_tracking
from ._grads import UnscaleStage, all_finite, unscale
from ._observer import StepObserver
from ._state import STATE_NAMES, ScaleState
from ._distribute import in_replica_of_strategy, replica_apply
from ._step import apply_step, jax_apply, stateless_step
from ._tf_keras import inner_from_config, translate_config

__all__ = ["LossScaleOptimizer"]



@keras.saving.register_keras_serializable(package="lossscale")
class LossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """An optimizer that applies loss scaling; the seeds' ``LossScaleOptimizer`` for Keras 3.

    The loss is multiplied by ``S`` before differentiation and the gradients by
    ``1/S`` (the float32 reciprocal, as TF) before the update, so that float16
    gradients below about 6e-8 do not flush to zero (Micikevicius et al.,
    2018, "Mixed Precision Training"). Per apply, with ``g`` the gradients::

        u = g if g already went through get_unscaled_gradients else g * (1/S)
        finite = all(isfinite(u))
        if finite: inner_optimizer.apply(u)     # iterations += 1
        else:      nothing: weights, inner slots and iterations untouched
        S, counters = lossscale.next_state(policy, S, counters, finite)

    A non-finite step is skipped in every mode, fixed scales included (TF's
    fixed mode applies it). ``iterations`` does not advance on a skipped step
    (Keras 3's convention; tf-keras advanced it).

    A subclass of ``keras.optimizers.LossScaleOptimizer``, so that under the
    ``mixed_float16`` policy ``model.compile`` keeps it as it is. Every piece
    of changing state is a Keras variable (``dynamic_scale``,
    ``step_counter`` = TF's ``dynamic_counter``, ``bad_steps``,
    ``skipped_steps``, ``consecutive_skips``): ``fit`` on JAX carries them
    through ``stateless_apply``, and ``.keras`` files save them.

    Args:
        inner_optimizer: the ``keras.optimizers.Optimizer`` instance to wrap.
        loss_scale: the experimental form: a number (fixed), ``"dynamic"``, a
            :class:`lossscale.LossScale` (contrib's managers included) or its
            ``lossscale.serialize`` dict.
        dynamic, initial_scale, dynamic_growth_steps: the stable form
            (default: dynamic, 2**15, 2000).
        min_loss_scale, max_loss_scale, hysteresis: refine the stable form's
            dynamic scale (defaults: TF's floor 1, no ceiling, back off at
            every overflow).
        max_consecutive_skips: raise :class:`lossscale.LossScaleError` after
            this many skipped steps in a row (default None: never).
        history: True or a :class:`lossscale.History` to record each step's
            scale and skip flag.
        name: the optimizer's name.

    Cost per step: one multiply per gradient element and one read pass for
    the check (fused under ``tf.function``/``jit``), about 20 scalar ops for
    the scale. Host syncs: none under ``tf.function`` and ``jit``; one per
    step in eager TensorFlow and on torch (the branch is a Python ``if``, as
    in Keras' own class); ``history``/``max_consecutive_skips`` add one
    transfer of three scalars per step.
    """

    def __init__(
        self,
        inner_optimizer: Any,
        loss_scale: Any = None,
        *,
        dynamic: bool | None = None,
        initial_scale: float | None = None,
        dynamic_growth_steps: int | None = None,
        min_loss_scale: float | None = None,
        max_loss_scale: float | None = None,
        hysteresis: int | None = None,
        max_consecutive_skips: int | None = None,
        history: Any = None,
        name: str | None = None,
    ) -> None:
        _check_inner(inner_optimizer)
        policy = resolve_policy(
            loss_scale,
            dynamic=dynamic,
            initial_scale=initial_scale,
            dynamic_growth_steps=dynamic_growth_steps,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            hysteresis=hysteresis,
        )
        observer = StepObserver(history, max_consecutive_skips)
        # Keras' own __init__ rejects dynamic=False and takes no policy: initialise its base instead.
        super(keras.optimizers.LossScaleOptimizer, self).__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer
        self._policy = policy
        self._params = policy.rule_params()
        self._observer = observer
        self._scale = ScaleState(self._params, observer)
        self._stage = UnscaleStage()
        self._jax_steps: dict[bool, Any] = {}

    # ------------------------------------------------------------ the seeds' attributes

    @property
    def dynamic(self) -> bool:
        """Whether the loss scale changes during training."""
        return self._params.dynamic

    @property
    def initial_scale(self) -> float:
        """The initial loss scale (the only one, when fixed)."""
        return self._params.initial_scale

    @property
    def dynamic_growth_steps(self) -> int | None:
        """Finite steps in a row before the scale grows, or None if fixed."""
        return stable_form(self._policy)["dynamic_growth_steps"]

    @property
    def loss_scale_policy(self) -> LossScale:
        """The :class:`lossscale.LossScale` followed."""
        return self._policy

    @property
    def loss_scale(self) -> Any:
        """The current loss scale, a 0-d float32 tensor (no sync until converted)."""
        if not self.built:
            return ops.convert_to_tensor(self.initial_scale, "float32")
        return ops.convert_to_tensor(self.dynamic_scale)

    @property
    def dynamic_counter(self) -> Any:
        """Finite steps since the scale last changed (0-d int32 tensor), or None if fixed."""
        return self._scale.value(1, 0) if self.dynamic else None

    @property
    def skipped_steps(self) -> Any:
        """Steps skipped so far, a 0-d int32 tensor (saturating; saved with the optimizer)."""
        return self._scale.value(3, 0)

    @property
    def consecutive_skips(self) -> Any:
        """Steps skipped in a row up to the last one, a 0-d int32 tensor (0 after a finite step)."""
        return self._scale.value(4, 0)

    @property
    def last_step_skipped(self) -> Any:
        """Whether the last step was skipped, a 0-d bool tensor."""
        return ops.greater(self.consecutive_skips, 0)

    @property
    def history(self) -> Any:
        """The :class:`lossscale.History` being recorded, or None."""
        return self._observer.history

    # ------------------------------------------------------------ variables

    @no_automatic_dependency_tracking
    def build(self, var_list: Sequence[Any]) -> None:
        # Keras' own class names its first two variables as attributes; kept for code that reads them.
        self.dynamic_scale, self.step_counter = self._scale.build(self.add_variable)[:2]
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        super(keras.optimizers.LossScaleOptimizer, self).build(var_list)

    def _state_variables(self) -> list[Any]:
        """The scale state's variables, in :data:`STATE_NAMES` order (empty until built)."""
        return list(self._scale.variables)

    # ------------------------------------------------------------ scaling

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * loss_scale``, computed in at least float32 and returned in ``loss``'s dtype.

        A callable gives a callable (the seeds' form). Cost: one scalar multiply.
        """
        if callable(loss):
            return lambda: self.get_scaled_loss(loss())
        self._observer.note_loss(loss)
        loss = ops.convert_to_tensor(loss)
        dtype = keras.backend.standardize_dtype(loss.dtype)
        wide = "float32" if dtype in ("float16", "bfloat16") else dtype
        scaled = ops.multiply(ops.cast(loss, wide), ops.cast(self.loss_scale, wide))
        return scaled if wide == dtype else ops.cast(scaled, dtype)

    def scale_loss(self, loss: Any) -> Any:
        """Keras 3's name for :meth:`get_scaled_loss` (what ``fit`` calls)."""
        return self.get_scaled_loss(loss)

    def get_unscaled_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """A new list: each gradient times ``1/loss_scale`` in its own dtype; None stays None.

        The next apply takes what this returns (or tensors computed from it,
        e.g. clipped) as already unscaled; see docs/keras.md, "Two gradient
        contracts". Cost: one multiply per element; no sync.
        """
        grads = list(grads)
        self._stage.note(grads)
        return unscale(grads, self.loss_scale)

    # ------------------------------------------------------------ applying

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> None:
        """Unscales (unless already unscaled), checks, applies or skips, and updates the scale.

        Under a ``tf.distribute`` strategy the gradients are summed over the
        replicas first (see :meth:`apply_gradients`).
        """
        self._apply(grads, trainable_variables, aggregate=True)

    def _apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None, aggregate: bool) -> None:
        grads = list(grads)
        if not grads:
            return
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "apply(grads) without trainable_variables needs a built optimizer: pass the variables, "
                    "or call optimizer.build(model.trainable_variables) first."
                )
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(variables)
        if len(grads) != len(variables):
            raise ValueError(f"Got {len(grads)} gradients for {len(variables)} variables; pass one per variable.")
        already = self._stage.take(grads)
        backend = keras.backend.backend()
        if backend == "jax":
            jax_apply(
                self._scale, self.inner_optimizer, self._variables, self._trainable_variables, self._jax_steps,
                grads, variables, already,
            )  # fmt: skip
        elif backend == "tensorflow" and in_replica_of_strategy():
            replica_apply(self._scale, self.inner_optimizer, grads, variables, already, aggregate)
        else:
            apply_step(self._scale, self.inner_optimizer, grads, variables, already)

    def stateless_apply(
        self, optimizer_variables: Sequence[Any], grads: Sequence[Any], trainable_variables: Sequence[Any]
    ) -> tuple[list[Any], list[Any]]:
        """The pure form of :meth:`apply` (what ``fit`` on JAX calls): new weights and optimizer variables."""
        if keras.backend.backend() == "tensorflow":
            raise ValueError(
                "stateless_apply is not supported with the TensorFlow backend (as it is incompatible with "
                "tf.distribute): use apply() or apply_gradients()."
            )
        if not self.built:
            raise ValueError(
                "stateless_apply needs a built optimizer: call optimizer.build(model.trainable_variables) first."
            )
        if len(optimizer_variables) != len(self.variables) or len(trainable_variables) != len(
            self._trainable_variables
        ):
            raise ValueError(
                f"stateless_apply takes one value per optimizer variable ({len(self.variables)}, got "
                f"{len(optimizer_variables)}) and per trainable variable it was built with "
                f"({len(self._trainable_variables)}, got {len(trainable_variables)})."
            )
        grads = list(grads)
        already = self._stage.take(grads)
        return stateless_step(
            self._scale, self.inner_optimizer, self._variables, self._trainable_variables,
            optimizer_variables, grads, trainable_variables, already,
        )  # fmt: skip

    def apply_gradients(
        self, grads_and_vars: Any, name: str | None = None, experimental_aggregate_gradients: bool = True
    ) -> Any:
        """Applies ``(gradient, variable)`` pairs; returns ``iterations`` (not advanced on a skip).

        The seeds' signature. Under a ``tf.distribute`` strategy,
        ``experimental_aggregate_gradients=True`` sums the gradients over the
        replicas before the check (so that a NaN or Inf on one replica skips
        the step on all); with False the caller has summed them (e.g.
        ``tf.distribute.get_replica_context().all_reduce("sum", grads)``) and
        they are applied as given. Without a strategy both are the same.
        ``name`` is accepted for the seeds' signature and unused (Keras 3
        names its ops after the optimizer).
        """
        pairs = list(grads_and_vars)
        if not pairs:
            raise ValueError("apply_gradients() got no (gradient, variable) pairs.")
        grads, variables = zip(*pairs)
        self._apply(list(grads), list(variables), aggregate=bool(experimental_aggregate_gradients))
        return self.iterations

    def minimize(self, loss: Any, var_list: Sequence[Any], tape: Any = None) -> Any:
        """The seeds' ``minimize`` (TensorFlow backend): scale, differentiate, unscale, apply."""
        if keras.backend.backend() != "tensorflow":
            raise NotImplementedError(
                f"minimize() needs tf.GradientTape (TensorFlow backend); on {keras.backend.backend()} compute the "
                "gradients of get_scaled_loss(loss) and call apply(grads, variables)."
            )
        import tensorflow as tf

        variables = list(var_list)
        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            if callable(loss):
                loss = loss()
            scaled = self.get_scaled_loss(loss)
        grads = tape.gradient(scaled, variables)
        return self.apply_gradients(zip(self.get_unscaled_gradients(grads), variables))

    def check_finite(self, grads: Sequence[Any]) -> Any:
        """True iff no gradient holds a NaN or an Inf (a 0-d bool tensor)."""
        return all_finite(grads)

    # ------------------------------------------------------------ config

    def get_config(self) -> dict[str, Any]:
        """tf-keras's keys (``inner_optimizer``, ``dynamic``, ``initial_scale``, ``dynamic_growth_steps``) and ours."""
        config = {"name": self.name, "inner_optimizer": keras.saving.serialize_keras_object(self.inner_optimizer)}
        config.update(policy_config(self._policy))
        if self._observer.max_consecutive_skips is not None:
            config["max_consecutive_skips"] = self._observer.max_consecutive_skips
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> LossScaleOptimizer:
        """Rebuilds from :meth:`get_config`, Keras 3's own config, or any tf-keras ``LossScaleOptimizer`` config."""
        config = translate_config(config)
        inner = inner_from_config(config.pop("inner_optimizer"), custom_objects)
        if isinstance(config.get("loss_scale"), dict):
            config["loss_scale"] = loss_scale_from_config(config["loss_scale"])
        return cls(inner, **config)

    def __repr__(self) -> str:
        return f"<lossscale.keras.LossScaleOptimizer {self.name!r} {self._policy!r} inner={type(self.inner_optimizer).__name__}>"


def _check_inner(inner: Any) -> None:
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
