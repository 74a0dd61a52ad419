"""The deterministic training runs behind the checkpoint compatibility fixtures.

One recipe per binding, written against the public API that every version of
lossscale since 0.1.0 has, so that ``make_fixtures.py`` runs it under an old
release and the tests run it again under today's code:

- parameters ``w`` (3x2) and ``b`` (2,) and the batches come from fixed
  formulas (no random generator), so every run starts from the same numbers;
- the loss is the mean squared error of ``x @ w + b``; at the steps in
  ``INF_STEPS`` it is multiplied by ``inf``, so the gradients overflow and the
  step is skipped (the scale halves);
- the scale starts at ``INITIAL_SCALE`` and doubles after ``GROWTH_STEPS`` good
  steps, so it grows and backs off on both sides of the save.

A fixture is saved after ``SAVED_AFTER`` steps; the tests load it, train
``STEPS_AFTER`` more steps and compare with one uninterrupted run of
``SAVED_AFTER + STEPS_AFTER`` steps.

Frameworks are imported inside the functions: ``pytest --doctest-modules``
imports this module in the numpy-only run too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SAVED_AFTER = 4
STEPS_AFTER = 5
TOTAL_STEPS = SAVED_AFTER + STEPS_AFTER
INF_STEPS = (2, 7)
INITIAL_SCALE = 8.0
GROWTH_STEPS = 2
LEARNING_RATE = 0.1

#: What the scale and its counters are after ``SAVED_AFTER`` steps of every recipe: grown to 16 after steps 0-1,
#: halved back to 8 by the overflow of step 2, one good step since.
AT_SAVE = {"loss_scale": 8.0, "good_steps": 1, "skipped_steps": 1}
#: ... and after ``TOTAL_STEPS``: 16 after steps 4-6 grew it twice and step 7 halved it.
AT_END = {"loss_scale": 16.0, "good_steps": 1, "skipped_steps": 2}

RECIPE = {
    "saved_after": SAVED_AFTER,
    "steps_after": STEPS_AFTER,
    "inf_steps": list(INF_STEPS),
    "initial_scale": INITIAL_SCALE,
    "growth_steps": GROWTH_STEPS,
    "learning_rate": LEARNING_RATE,
}


def initial_weights() -> tuple[np.ndarray, np.ndarray]:
    """``w`` (3, 2) and ``b`` (2,), float32."""
    w = (np.sin(np.arange(6, dtype=np.float64)) / 2).reshape(3, 2).astype(np.float32)
    b = np.array([0.1, -0.2], np.float32)
    return w, b


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The inputs (4, 3) and targets (4, 2) of ``step``, float32."""
    i = np.arange(12, dtype=np.float64) + 12 * step
    x = np.cos(i / 5).reshape(4, 3).astype(np.float32)
    y = np.sin(i[:8] / 3).reshape(4, 2).astype(np.float32)
    return x, y


def loss_factor(step: int) -> float:
    return float("inf") if step in INF_STEPS else 1.0


# ---------------------------------------------------------------- torch


def torch_model() -> Any:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    w, b = initial_weights()
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(w.T.copy()))
        model.bias.copy_(torch.from_numpy(b))
    return model


def torch_loss(model: Any, step: int) -> Any:
    import torch

    x, y = (torch.from_numpy(a) for a in batch(step))
    return ((model(x) - y) ** 2).mean() * loss_factor(step)


#: The diagnostics every release has, for the pickles that keep them (``torch_diagnostics.pkl``).
TORCH_DIAGNOSTICS = {"max_consecutive_skips": 5, "history": True, "overflow_report": True}


def torch_optimizer(lst: Any, model: Any, **options: Any) -> Any:
    """``lossscale.torch.LossScaleOptimizer`` over Adam (``options``: e.g. :data:`TORCH_DIAGNOSTICS`)."""
    import torch

    inner = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    return lst.LossScaleOptimizer(inner, initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS, **options)


def torch_optimizer_steps(model: Any, opt: Any, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        opt.get_scaled_loss(torch_loss(model, step)).backward()
        opt.step()


def torch_shared(lst: Any, model: Any) -> tuple[Any, Any, Any]:
    """A ``SharedLossScale`` and two optimizers over it: Adam on the weight, SGD with momentum on the bias."""
    import torch

    shared = lst.SharedLossScale(initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS)
    opt_a = lst.LossScaleOptimizer(torch.optim.Adam([model.weight], lr=LEARNING_RATE), shared)
    opt_b = lst.LossScaleOptimizer(torch.optim.SGD([model.bias], lr=LEARNING_RATE, momentum=0.9), shared)
    return shared, opt_a, opt_b


def torch_shared_steps(model: Any, shared: Any, opt_a: Any, opt_b: Any, steps: range) -> None:
    for step in steps:
        opt_a.zero_grad()
        opt_b.zero_grad()
        shared.get_scaled_loss(torch_loss(model, step)).backward()
        opt_a.step()
        opt_b.step()
        shared.update()


def torch_gradscaler(lst: Any, model: Any, **options: Any) -> tuple[Any, Any]:
    """``lossscale.torch.GradScaler`` on the CPU and SGD with momentum (``options``: e.g. :data:`TORCH_DIAGNOSTICS`)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9)
    scaler = lst.GradScaler("cpu", init_scale=INITIAL_SCALE, growth_interval=GROWTH_STEPS, **options)
    return scaler, opt


def torch_gradscaler_steps(model: Any, scaler: Any, opt: Any, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        scaler.scale(torch_loss(model, step)).backward()
        scaler.step(opt)
        scaler.update()


# ---------------------------------------------------------------- JAX


def jax_params() -> dict[str, Any]:
    import jax.numpy as jnp

    w, b = initial_weights()
    return {"b": jnp.asarray(b), "w": jnp.asarray(w)}


def jax_loss(params: dict[str, Any], x: Any, y: Any, factor: Any) -> Any:
    import jax.numpy as jnp

    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2) * factor


def _jax_batch(step: int) -> tuple[Any, Any, Any]:
    import jax.numpy as jnp

    x, y = batch(step)
    return jnp.asarray(x), jnp.asarray(y), jnp.float32(loss_factor(step))


def jax_tx(lsj: Any, **options: Any) -> Any:
    """``lossscale.jax.loss_scale_optimizer`` over Adam (``options``: e.g. ``stats_every=2``, from 0.2.0)."""
    import optax

    return lsj.loss_scale_optimizer(
        optax.adam(LEARNING_RATE), initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS, **options
    )


def jax_steps(lsj: Any, tx: Any, params: Any, state: Any, steps: range) -> tuple[Any, Any]:
    """``steps`` of the usual jitted step: grad of ``get_scaled_loss``, ``tx.update``, ``optax.apply_updates``."""
    import jax
    import optax

    @jax.jit
    def step_fn(params: Any, state: Any, x: Any, y: Any, factor: Any) -> tuple[Any, Any]:
        grads = jax.grad(lambda p: lsj.get_scaled_loss(jax_loss(p, x, y, factor), state))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for step in steps:
        params, state = step_fn(params, state, *_jax_batch(step))
    return params, state


def jax_train_state(lsj: Any) -> Any:
    """lossscale's flax ``TrainState`` (``lossscale.jax.train_state``) with :func:`jax_tx`."""
    from lossscale.jax.train_state import TrainState

    return TrainState.create(apply_fn=None, params=jax_params(), tx=jax_tx(lsj))


def jax_train_state_steps(lsj: Any, state: Any, steps: range) -> Any:
    """``steps`` of a jitted ``TrainState.apply_gradients`` step."""
    import jax

    @jax.jit
    def step_fn(state: Any, x: Any, y: Any, factor: Any) -> Any:
        grads = jax.grad(lambda p: lsj.get_scaled_loss(jax_loss(p, x, y, factor), state.opt_state))(state.params)
        return state.apply_gradients(grads=grads)

    for step in steps:
        state = step_fn(state, *_jax_batch(step))
    return state


# ---------------------------------------------------------------- Keras


def keras_model(lsk: Any, compiled: bool = True) -> Any:
    """A one-layer model (Dense(2) on 3 inputs), compiled with :func:`keras_optimizer` and built."""
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.set_weights(list(initial_weights()))
    if compiled:
        model.compile(optimizer=keras_optimizer(lsk), loss="mse")
        model.optimizer.build(model.trainable_variables)
    return model


def keras_optimizer(lsk: Any) -> Any:
    """``lossscale.keras.LossScaleOptimizer`` over Adam."""
    import keras

    return lsk.LossScaleOptimizer(
        keras.optimizers.Adam(LEARNING_RATE), initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS
    )


def keras_gradients(weights: list[np.ndarray], step: int, scale: float) -> list[np.ndarray]:
    """The gradients of ``scale`` times the step's loss, computed in numpy (so every backend gets the same)."""
    w, b = (np.asarray(v, np.float32) for v in weights)
    x, y = batch(step)
    d_out = (np.float32(2.0 / y.size) * (x @ w + b - y)).astype(np.float32)
    factor = np.float32(scale * loss_factor(step))
    with np.errstate(invalid="ignore", over="ignore"):  # the overflowing steps: inf * 0 is nan, as in autodiff
        return [(x.T @ d_out) * factor, d_out.sum(axis=0) * factor]


def keras_steps(model: Any, opt: Any, steps: range) -> None:
    import keras

    for step in steps:
        weights = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
        grads = keras_gradients(weights, step, float(keras.ops.convert_to_numpy(opt.loss_scale)))
        opt.apply([keras.ops.convert_to_tensor(g) for g in grads], model.trainable_variables)
