"""The demo's JAX backend: one training run of the digits MLP in a given precision mode.

The same shape as :mod:`lossscale._demo_torch` (``train(mode, data, config,
on_step) -> RunResult``), the same model (6 hidden exact-erf GELU layers of
64, PyTorch's default initialisation distribution), the same Adam settings
(lr, betas 0.9/0.999, ``eps = 1e-8 * loss_weight``), the same loss weight,
batch size, step count and batch-order rule (a fresh permutation of the
training split whenever the next batch would not fit).

Both backends take their batches from :func:`lossscale._demo.batch_order`.
The initial weights are drawn from ``numpy.random.default_rng(seed)`` with
torch's distribution (every weight and bias uniform in +-1/sqrt(fan_in)):
torch's generator cannot be reproduced without importing torch, and a JAX
user need not have it, so a JAX run starts from different (equally
distributed) weights than a torch run with the same seed; within the JAX
backend all three modes share them, which is what the comparison needs.

fp16 here is honest float16 compute, which JAX has no autocast for: the
master parameters stay float32 (Adam updates them in float32), and the loss
function casts them and the inputs to float16, so every matmul, bias add and
GELU of the forward pass, and therefore of the backward pass, runs in
float16. The logits are cast to float32 for the cross-entropy (as
``torch.autocast`` does). The gradient with respect to a float32 parameter is
the transpose of that cast, i.e. the float16 gradient widened to float32:
exactly what ``p.grad`` holds under autocast, so a value float16 flushed is
zero there, and the zero-gradient share is measured on those gradients (of
the scaled loss in the scaled run, as the torch backend measures ``p.grad``
before ``step``).

The train step is one ``jax.jit``-compiled function per mode; its per-step
records (loss, zero share, scale used, skip flag) stay on the device and are
moved to the host once, at the end. ``config.threads`` is torch's intra-op
thread count and does not apply here: XLA's CPU thread pool is fixed when JAX
starts (set ``XLA_FLAGS`` before importing JAX to change it).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ._demo import MODES, DemoConfig, DemoData, RunResult, batch_order, measured_steps
from ._history import History

try:
    import jax
    import jax.numpy as jnp
    import optax
except ImportError as error:  # pragma: no cover - exercised only without jax
    raise ImportError(
        f"The demo's JAX backend needs JAX and optax ({error.name} is missing): pip install 'lossscale[demo,jax]'."
    ) from error

from .jax import get_scaled_loss, loss_scale_optimizer

__all__ = ["train"]


def _init_params(config: DemoConfig, seed: int) -> list[dict[str, np.ndarray]]:
    """PyTorch's ``nn.Linear`` default initialisation (kaiming-uniform with a=sqrt(5)): U(+-1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)
    sizes = [64] + [config.width] * config.depth + [10]
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = 1.0 / np.sqrt(fan_in)
        params.append({
            "w": rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32),
            "b": rng.uniform(-bound, bound, (fan_out,)).astype(np.float32),
        })
    return params


def _forward(params: list[dict[str, Any]], x: Any) -> Any:
    """The MLP; computes in the dtype of ``params`` and ``x``. Exact (erf) GELU, as ``torch.nn.GELU``."""
    for layer in params[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"], approximate=False)
    return x @ params[-1]["w"] + params[-1]["b"]


def _cross_entropy(logits: Any, labels: Any) -> Any:
    """Mean cross-entropy, computed in float32 whatever the logits' dtype (as under ``torch.autocast``)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def _zero_fraction(grads: Any) -> Any:
    """Share of gradient values exactly zero over every parameter, as a 0-d float32 array (no host sync)."""
    leaves = jax.tree.leaves(grads)
    zeros = sum(jnp.sum(g == 0, dtype=jnp.int32) for g in leaves)
    return zeros.astype(jnp.float32) / sum(g.size for g in leaves)


def train(mode: str, data: DemoData, config: DemoConfig, on_step: Callable[[], None] | None = None) -> RunResult:
    """Trains one model in ``mode`` (``"fp32"``, ``"fp16"`` or ``"fp16+lossscale"``).

    Every mode starts from the same weights and sees the same batches (see
    the module docstring for how they relate to the torch backend's). fp16
    runs compute forward and backward in float16 with float32 master
    parameters, so each weight gradient is a float16 value widened to
    float32: what float16 flushed is zero there.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}.")
    w = config.loss_weight
    half = mode != "fp32"
    scaled = mode == "fp16+lossscale"
    # Adam is invariant to a constant factor on the loss when eps scales alike: in exact arithmetic the
    # weighted loss trains exactly as the plain mean does, so fp32 is the same reference for any weight.
    inner = optax.adam(config.lr, b1=0.9, b2=0.999, eps=1e-8 * w)
    opt = loss_scale_optimizer(inner, dynamic_growth_steps=config.growth_steps) if scaled else inner

    x_train, y_train = jnp.asarray(data.x_train), jnp.asarray(data.y_train, jnp.int32)
    params = jax.tree.map(jnp.asarray, _init_params(config, config.seed))
    opt_state = opt.init(params)

    def weighted_loss(params: Any, x: Any, y: Any) -> Any:
        if half:  # float16 compute, float32 master params: the cast's transpose widens the fp16 gradients
            params = jax.tree.map(lambda p: p.astype(jnp.float16), params)
            x = x.astype(jnp.float16)
        return _cross_entropy(_forward(params, x), y) * w

    def step(params: Any, opt_state: Any, idx: Any) -> tuple[Any, Any, tuple[Any, ...]]:
        x, y = x_train[idx], y_train[idx]
        if scaled:
            scale = opt_state.loss_scale  # the scale this step's loss is multiplied by

            def scaled_loss(p: Any) -> tuple[Any, Any]:
                loss = weighted_loss(p, x, y)
                return get_scaled_loss(loss, opt_state), loss

            (_, loss), grads = jax.value_and_grad(scaled_loss, has_aux=True)(params)
        else:
            scale = jnp.float32(1)
            loss, grads = jax.value_and_grad(weighted_loss)(params, x, y)
        zero = _zero_fraction(grads)  # of the gradients update() receives, scaled ones in the scaled run
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        skipped = opt_state.last_step_skipped if scaled else jnp.bool_(False)
        return params, opt_state, (loss, zero, scale, skipped)

    step = jax.jit(step, donate_argnums=(0, 1))
    records = []
    for idx in batch_order(len(data.x_train), config):
        params, opt_state, record = step(params, opt_state, idx)
        records.append(record)
        if on_step is not None:
            on_step()

    # One transfer for the whole run's records instead of a host sync per step.
    losses, zeros, scales, skips = (np.asarray(jnp.stack(column)) for column in zip(*records))
    measured = measured_steps(config)
    history = None
    if scaled:
        history = History()  # losses: the weighted ones given to get_scaled_loss, as the torch optimizer records
        history.extend(np.arange(config.steps), scales, skips, losses)

    final_loss = float(_cross_entropy(_forward(params, x_train), y_train))
    logits = _forward(params, jnp.asarray(data.x_test))
    accuracy = float(jnp.mean(jnp.argmax(logits, axis=1) == jnp.asarray(data.y_test)))
    return RunResult(
        mode=mode,
        losses=(losses / w).astype(np.float32),
        final_loss=final_loss,
        accuracy=accuracy,
        zero_grad_steps=measured,
        zero_grad_fractions=zeros[measured].astype(np.float64),
        skipped_steps=int(opt_state.skipped_steps) if scaled else 0,
        final_scale=float(opt_state.loss_scale) if scaled else None,
        history=history,
    )
