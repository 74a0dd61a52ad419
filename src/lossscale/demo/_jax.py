"""The demo's JAX trainer: the same autoencoder, data, batches and Adam settings as the torch trainer, in optax.

JAX has no autocast, so fp16 is written out: the master parameters stay
float32 (Adam updates them in float32) and the loss casts them and the
inputs to float16, so every matmul, bias add and GELU of the forward pass,
and so of the backward pass, runs in float16; the reconstruction is cast to
float32 for the squared error, as under ``torch.autocast``. The gradient of a
float32 parameter is the transpose of that cast: the float16 gradient
widened to float32, which is what ``p.grad`` holds under autocast, so a value
float16 flushed is zero there. (XLA's CPU backend multiplies float16 operands
in float32 and rounds the result to float16: every stored activation and
gradient is a float16 value.)

The initial weights follow torch's ``nn.Linear`` distribution (uniform in
+-1/sqrt(fan_in)) drawn from numpy's ``default_rng(seed)``: torch's generator
cannot be reproduced without torch, so the JAX runs start from other (equally
distributed) weights than the torch runs; all JAX modes share them. The
scaled runs wrap Adam in :func:`lossscale.jax.loss_scale_optimizer` (the
opt-in ``"fp16+auto"`` one with ``loss_scale="auto"``) and use
:func:`lossscale.jax.get_scaled_loss` and the state's public fields only.

Each mode's step is one ``jax.jit`` function; its per-step records (loss,
per-layer zero counts, scale used, skip flag) stay on the device and reach the
host once, at the end.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    import optax
except ImportError as error:  # pragma: no cover - exercised only without jax
    raise ImportError(
        f"The demo's JAX trainer needs JAX and optax ({error.name} is missing): pip install 'lossscale[demo]'."
    ) from error

from .._history import History
from .._stats import gradient_stats
from ..jax import get_scaled_loss, loss_scale_optimizer
from ._config import AUTO_MODE, DemoConfig
from ._data import DemoData, batch_order, measured_steps, psnr_db
from ._results import RunResult, check_modes

__all__ = ["init_params", "train"]


def init_params(config: DemoConfig) -> list[dict[str, np.ndarray]]:
    """torch's ``nn.Linear`` initialisation (kaiming-uniform, a=sqrt(5)), U(+-1/sqrt(fan_in)), from numpy's rng."""
    rng = np.random.default_rng(config.seed)
    sizes = [64, *config.widths, 64]
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        bound = 1.0 / np.sqrt(fan_in)
        params.append({
            "w": rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32),
            "b": rng.uniform(-bound, bound, (fan_out,)).astype(np.float32),
        })
    return params


def _forward(params: list[dict[str, Any]], x: Any) -> Any:
    """The autoencoder in the dtype of ``params`` and ``x``; exact (erf) GELU, as ``torch.nn.GELU``."""
    for layer in params[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"], approximate=False)
    return x @ params[-1]["w"] + params[-1]["b"]


def train(
    mode: str,
    global_batch_factor: int,
    data: DemoData,
    config: DemoConfig,
    on_step: Callable[[], None] | None = None,
) -> RunResult:
    """Trains the autoencoder once in ``mode`` (``"fp32"``, ``"fp16"``, ``"fp16+lossscale"`` or ``"fp16+auto"``).

    Cost: one transfer of the run's records to the host, at the end.
    """
    check_modes(mode)
    start = time.perf_counter()
    k = global_batch_factor
    half = mode != "fp32"
    scaled = mode in ("fp16+lossscale", AUTO_MODE)
    # Adam divides by sqrt(v) + eps: with eps scaled by 1/K too, K changes nothing in exact arithmetic.
    inner = optax.adam(config.lr, b1=0.9, b2=0.999, eps=1e-8 / k)
    opt = inner
    if mode == AUTO_MODE:  # EXPERIMENTAL: the scale set from sampled statistics (a sample every 16 steps by default)
        opt = loss_scale_optimizer(inner, loss_scale="auto")
    elif scaled:
        opt = loss_scale_optimizer(inner, dynamic_growth_steps=config.growth_steps)

    x_train = jnp.asarray(data.x_train)
    params = jax.tree.map(jnp.asarray, init_params(config))
    opt_state = opt.init(params)

    def micro_batch_loss(params: Any, x: Any) -> Any:
        """One micro-batch's share of the global batch's mean squared error: ``mse / K``."""
        if half:  # float16 compute, float32 master params: the cast's transpose widens the fp16 gradients
            params = jax.tree.map(lambda p: p.astype(jnp.float16), params)
            reconstruction = _forward(params, x.astype(jnp.float16)).astype(jnp.float32)
        else:
            reconstruction = _forward(params, x)
        return jnp.mean((reconstruction - x) ** 2) / k

    def step(params: Any, opt_state: Any, idx: Any) -> tuple[Any, Any, tuple[Any, ...]]:
        x = x_train[idx]
        if scaled:
            scale = opt_state.loss_scale  # the scale this step's loss is multiplied by

            def scaled_loss(p: Any) -> tuple[Any, Any]:
                loss = micro_batch_loss(p, x)
                return get_scaled_loss(loss, opt_state), loss

            (_, loss), grads = jax.value_and_grad(scaled_loss, has_aux=True)(params)
        else:
            scale = jnp.float32(1)
            loss, grads = jax.value_and_grad(micro_batch_loss)(params, x)
        # Of the gradients update() receives (scaled ones in the scaled run), as the torch trainer measures p.grad.
        zeros = gradient_stats([layer["w"] for layer in grads], jnp).tensor_zero_fraction  # the library's statistics
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        skipped = opt_state.last_step_skipped if scaled else jnp.bool_(False)
        return params, opt_state, (loss, zeros, scale, skipped)

    step = jax.jit(step, donate_argnums=(0, 1))
    records = []
    for idx in batch_order(len(data.x_train), config.steps, config.batch_size, config.seed):
        params, opt_state, record = step(params, opt_state, idx)
        records.append(record)
        if on_step is not None:
            on_step()

    losses, zeros, scales, skips = (np.asarray(jnp.stack(column)) for column in zip(*records))
    history = None
    if scaled:
        history = History()  # the loss given to get_scaled_loss, as the torch optimizer records it
        history.extend(np.arange(config.steps), scales, skips, losses)
    measured = measured_steps(config.steps, config.measure_every)
    reconstruction = np.asarray(_forward(params, jnp.asarray(data.x_test)))  # float32 evaluation
    return RunResult(
        framework="jax",
        mode=mode,
        global_batch_factor=k,
        psnr_db=psnr_db(reconstruction, data.x_test),
        losses=losses.astype(np.float64) * k,
        zero_grad_steps=measured,
        zero_grad_by_layer=zeros[measured].astype(np.float64),
        layer_sizes=np.asarray([p["w"].size for p in params]),
        reconstructions=reconstruction[data.shown],
        skipped_steps=int(opt_state.skipped_steps) if scaled else 0,
        final_scale=float(opt_state.loss_scale) if scaled else None,
        history=history,
        seconds=time.perf_counter() - start,
    )
