"""Helpers for the Keras tests: the backend in use, and drivers that step an optimizer on chosen gradients.

The backend is fixed per process by KERAS_BACKEND (set before the first ``import keras``); the suite runs
once per backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import ops

import lossscale.keras as lsk

BACKEND = keras.backend.backend()


STATE_NAMES = ("dynamic_scale", "step_counter", "bad_steps", "skipped_steps", "consecutive_skips")


def state_variables(opt: lsk.LossScaleOptimizer) -> list[Any]:
    """The optimizer's five scale variables (found by name among its variables), in the reference's order."""
    by_name = {v.name: v for v in opt.variables}
    return [by_name[name] for name in STATE_NAMES]


def numbers(opt: lsk.LossScaleOptimizer) -> tuple[float, int, int, int, int]:
    """The five state values of ``opt`` as Python numbers (the reference harness's order)."""
    values = [ops.convert_to_numpy(v) for v in state_variables(opt)]
    return (float(values[0]), *(int(v) for v in values[1:]))  # type: ignore[return-value]


def grad_for(finite: bool, value: float = 1.0) -> np.ndarray:
    return np.array([value, value] if finite else [np.inf, value], np.float32)


def eager_stepper(policy: Any) -> Callable[[lsk.LossScaleOptimizer], Callable[[bool], Any]]:
    """``reference.trajectory`` driver: ``opt.apply`` called eagerly."""

    def make(p: Any) -> Callable[[bool], Any]:
        opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), p)
        w = keras.Variable(np.zeros(2, np.float32))

        def step(finite: bool) -> Any:
            opt.apply([ops.convert_to_tensor(grad_for(finite))], [w])
            return numbers(opt)

        return step

    return make


def compiled_stepper() -> Callable[[Any], Callable[[bool], Any]]:
    """``reference.trajectory`` driver through the backend's compiled path.

    TensorFlow: ``apply`` inside one ``tf.function``; JAX: ``stateless_apply`` under ``jax.jit``;
    torch: ``stateless_apply`` eagerly. The gradients come in as data, so that no graph optimizer can
    fold a multiply-by-scale against a divide-by-scale.
    """

    def make(p: Any) -> Callable[[bool], Any]:
        opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), p)
        w = keras.Variable(np.zeros(2, np.float32))
        opt.build([w])
        if BACKEND == "tensorflow":
            import tensorflow as tf

            apply = tf.function(lambda g: opt.apply([g], [w]))

            def step(finite: bool) -> Any:
                apply(tf.constant(grad_for(finite)))
                return numbers(opt)

            return step
        if BACKEND == "jax":
            import jax

            fn = jax.jit(opt.stateless_apply)
        else:
            fn = opt.stateless_apply
        state = {"opt": [v.value for v in opt.variables], "w": [w.value]}

        def step(finite: bool) -> Any:
            state["w"], state["opt"] = fn(state["opt"], [ops.convert_to_tensor(grad_for(finite))], state["w"])
            for variable, value in zip(opt.variables, state["opt"]):
                variable.assign(value)
            return numbers(opt)

        return step

    return make
