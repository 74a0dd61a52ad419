"""The demo's PyTorch backend: one training run of the digits MLP in a given precision mode.

Kept apart from :mod:`lossscale._demo` so that the demo's data, table and
plot stay framework-free and a JAX backend is one more module of this shape
(``train(mode, data, config, on_step) -> RunResult``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ._demo import MODES, DemoConfig, DemoData, RunResult, batch_order, measured_steps
from .torch import LossScaleOptimizer

__all__ = ["train"]


def _model(config: DemoConfig, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # the same initial weights in every mode
    layers: list[torch.nn.Module] = []
    width_in = 64
    for _ in range(config.depth):
        layers += [torch.nn.Linear(width_in, config.width), torch.nn.GELU()]
        width_in = config.width
    layers.append(torch.nn.Linear(width_in, 10))
    return torch.nn.Sequential(*layers)


def train(mode: str, data: DemoData, config: DemoConfig, on_step: Callable[[], None] | None = None) -> RunResult:
    """Trains one model in ``mode`` (``"fp32"``, ``"fp16"`` or ``"fp16+lossscale"``).

    Every mode starts from the same weights and sees the same batches. fp16
    runs use ``torch.autocast("cpu", float16)`` with float32 parameters, so
    the forward and backward matmuls run in float16 and each weight gradient
    is a float16 value cast to float32: what fp16 flushed is zero there.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}.")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _train(mode, data, config, on_step)
    finally:
        torch.set_num_threads(previous_threads)


def _train(mode: str, data: DemoData, config: DemoConfig, on_step: Callable[[], None] | None) -> RunResult:
    model = _model(config, config.seed)
    params = list(model.parameters())
    w = config.loss_weight
    # Adam is invariant to a constant factor on the loss when eps scales alike: in exact arithmetic the
    # weighted loss trains exactly as the plain mean does, so fp32 is the same reference for any weight.
    inner = torch.optim.Adam(params, lr=config.lr, eps=1e-8 * w)
    scaled = mode == "fp16+lossscale"
    # history=True: the optimizer records scale, skip flag and loss per step on the device and moves
    # them to a lossscale.History in batches, with no host sync per step.
    opt: Any = LossScaleOptimizer(inner, dynamic_growth_steps=config.growth_steps, history=True) if scaled else inner
    half = mode != "fp32"

    x_train, y_train = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    batches = torch.from_numpy(batch_order(len(x_train), config))
    measured = set(measured_steps(config).tolist())

    losses: list[torch.Tensor] = []
    zero_steps: list[int] = []
    zero_fractions: list[float] = []
    for step, idx in enumerate(batches):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=half):
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx]) * w
        if scaled:
            opt.get_scaled_loss(loss).backward()
        else:
            loss.backward()
        if step in measured:
            grads = torch.cat([p.grad.reshape(-1) for p in params])
            zero_steps.append(step)
            zero_fractions.append(float((grads == 0).float().mean()))
        opt.step()
        losses.append(loss.detach() / w)
        if on_step is not None:
            on_step()

    history = opt.history if scaled else None  # its losses are the weighted ones given to get_scaled_loss
    with torch.no_grad():
        final_loss = float(F.cross_entropy(model(x_train), y_train))
        logits = model(torch.from_numpy(data.x_test))
        accuracy = float((logits.argmax(1) == torch.from_numpy(data.y_test)).float().mean())
    return RunResult(
        mode=mode,
        losses=torch.stack(losses).float().numpy(),
        final_loss=final_loss,
        accuracy=accuracy,
        zero_grad_steps=np.asarray(zero_steps),
        zero_grad_fractions=np.asarray(zero_fractions),
        skipped_steps=int(opt.skipped_steps) if scaled else 0,
        final_scale=float(opt.loss_scale) if scaled else None,
        history=history,
    )
