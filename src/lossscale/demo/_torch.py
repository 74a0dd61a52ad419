"""The demo's PyTorch trainer: one run of the digits autoencoder in fp32, fp16, fp16 + lossscale or fp16 + auto.

fp16 is ``torch.autocast("cpu", float16)`` over float32 parameters: every
matmul of the forward and backward pass runs in float16, and each weight
gradient is a float16 value cast to float32, so what float16 flushed is
exactly zero in ``p.grad``. (A pure ``.half()`` model with float32 master
weights gave bit-identical results on this model.) The scaled run wraps Adam
in :class:`lossscale.torch.LossScaleOptimizer`, public API only; the
opt-in ``"fp16+auto"`` run does the same with ``loss_scale="auto"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .._torch._kernels import gradient_stats
from ..torch import LossScaleOptimizer
from ._config import AUTO_MODE, DemoConfig
from ._data import DemoData, batch_order, measured_steps, psnr_db
from ._results import RunResult, check_modes

__all__ = ["build_model", "micro_batch_loss", "train", "weight_zero_shares"]


def build_model(config: DemoConfig) -> torch.nn.Sequential:
    """The autoencoder: 64 pixels -> ``config.widths`` (GELU after each) -> 64 pixels, seeded by ``config.seed``."""
    torch.manual_seed(config.seed)  # the same initial weights in every mode
    layers: list[torch.nn.Module] = []
    width_in = 64
    for width in config.widths:
        layers += [torch.nn.Linear(width_in, width), torch.nn.GELU()]
        width_in = width
    layers.append(torch.nn.Linear(width_in, 64))
    return torch.nn.Sequential(*layers)


def micro_batch_loss(model: torch.nn.Module, x: torch.Tensor, global_batch_factor: int, half: bool) -> torch.Tensor:
    """One micro-batch's share of a global batch's mean squared error: ``mse(model(x), x) / K``.

    With K micro-batches of equal size, the global batch's mean loss is the
    sum of these shares, so this is exactly the loss whose backward each
    micro-batch runs under gradient accumulation (torch's recipe) or data
    parallelism with gradient averaging.
    """
    with torch.autocast("cpu", dtype=torch.float16, enabled=half):
        reconstruction = model(x)
    return F.mse_loss(reconstruction.float(), x) / global_batch_factor


def weight_zero_shares(model: torch.nn.Module) -> torch.Tensor:
    """Per linear layer, the share of its weight gradient's values that are exactly zero (a float32 tensor).

    The library's gradient statistics (``stats_every``'s ``zero_fraction`` per tensor), not demo code.
    """
    grads = [m.weight.grad for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if any(g is None for g in grads):
        raise ValueError("weight_zero_shares() needs every linear layer's weight gradient: call it after backward().")
    return gradient_stats([g for g in grads if g is not None]).tensor_zero_fraction


def train(
    mode: str,
    global_batch_factor: int,
    data: DemoData,
    config: DemoConfig,
    on_step: Callable[[], None] | None = None,
) -> RunResult:
    """Trains the autoencoder once in ``mode`` (``"fp32"``, ``"fp16"``, ``"fp16+lossscale"`` or ``"fp16+auto"``).

    Every mode starts from the same weights and sees the same micro-batches.
    Cost: one host sync per measured step (the zero shares), none otherwise
    (the loss-scale history moves to the host in batches).
    """
    check_modes(mode)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _train(mode, global_batch_factor, data, config, on_step)
    finally:
        torch.set_num_threads(previous_threads)


def _train(
    mode: str, k: int, data: DemoData, config: DemoConfig, on_step: Callable[[], None] | None
) -> RunResult:
    start = time.perf_counter()
    model = build_model(config)
    # Adam divides by sqrt(v) + eps: with eps scaled by 1/K too, K changes nothing in exact arithmetic.
    inner = torch.optim.Adam(model.parameters(), lr=config.lr, eps=1e-8 / k)
    scaled = mode in ("fp16+lossscale", AUTO_MODE)
    opt: Any = inner
    if mode == AUTO_MODE:  # EXPERIMENTAL: the scale set from sampled statistics (a sample every 16 steps by default)
        opt = LossScaleOptimizer(inner, loss_scale="auto", history=True)
    elif scaled:
        opt = LossScaleOptimizer(inner, dynamic_growth_steps=config.growth_steps, history=True)
    half = mode != "fp32"

    x_train = torch.from_numpy(data.x_train)
    measured = measured_steps(config.steps, config.measure_every)
    measure = set(measured.tolist())
    losses: list[torch.Tensor] = []
    zeros: list[torch.Tensor] = []
    for step, idx in enumerate(torch.from_numpy(batch_order(len(x_train), config.steps, config.batch_size, config.seed))):
        opt.zero_grad()
        loss = micro_batch_loss(model, x_train[idx], k, half)
        (opt.get_scaled_loss(loss) if scaled else loss).backward()
        if step in measure:
            zeros.append(weight_zero_shares(model))  # of the gradients step() receives (scaled ones when scaled)
        opt.step()
        losses.append(loss.detach())
        if on_step is not None:
            on_step()

    with torch.no_grad():  # evaluated in float32, whatever the training precision
        x_test = torch.from_numpy(data.x_test)
        reconstruction = model(x_test).numpy()
    sizes = [m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return RunResult(
        framework="torch",
        mode=mode,
        global_batch_factor=k,
        psnr_db=psnr_db(reconstruction, data.x_test),
        losses=(torch.stack(losses).double() * k).numpy(),
        zero_grad_steps=measured,
        zero_grad_by_layer=torch.stack(zeros).double().numpy(),
        layer_sizes=np.asarray(sizes),
        reconstructions=reconstruction[data.shown],
        skipped_steps=int(opt.skipped_steps) if scaled else 0,
        final_scale=float(opt.loss_scale) if scaled else None,
        history=opt.history if scaled else None,
        seconds=time.perf_counter() - start,
    )
