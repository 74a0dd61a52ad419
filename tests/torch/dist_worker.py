"""One rank of the 2-process gloo tests in ``test_distributed.py``, plus their single-process references.

Run as a script: ``python dist_worker.py RANK WORLD INIT_FILE OUT_DIR``. It
runs every scenario on one process group (one spawn for the whole file) and
saves what it saw to ``OUT_DIR/rank{RANK}.pt``; the test process compares
that with the references below, computed without torch.distributed.
Scenarios catch their own errors, so one failure is reported, not hung on;
the process group's timeout and the test's subprocess timeout bound the rest.
"""

from __future__ import annotations

import os
import sys
import traceback
from datetime import timedelta

import numpy as np
import torch
import torch.nn.functional as F

import lossscale
from lossscale.torch import LossScaleError, LossScaleOptimizer

STEPS = 8  # steps of every trajectory
INF_STEP = 2  # the step whose gradients overflow
RESUME_AT = 4  # the DDP resume scenario saves after this many steps
EXTRA = 2  # FSDP2: steps after the DCP resume
POLICY = {"initial_scale": 2.0**10, "dynamic_growth_steps": 3}
GLOBAL_BATCH = 8
FSDP_INF_INDEX = (8, 0)  # first Linear's weight is (16, 6); rows 8..15 are rank 1's shard


# ---------------------------------------------------------------- shared data and models


def make_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def data(steps: int, poison_input: bool):
    """Global batches; with ``poison_input`` an Inf in sample 5 (rank 1's half) at INF_STEP."""
    gen = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, GLOBAL_BATCH, 6, generator=gen)
    ys = torch.randn(steps, GLOBAL_BATCH, 3, generator=gen)
    if poison_input:
        xs[INF_STEP, 5, 0] = float("inf")
    return xs, ys


def local(batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    per = batch.shape[0] // world
    return batch[rank * per : (rank + 1) * per]


def expected_scales(steps: int) -> list[float]:
    """The scale after each step, from the framework-free core (numpy), with one overflow at INF_STEP."""
    policy = lossscale.resolve_loss_scale(None, dynamic=True, **POLICY)
    state = lossscale.initial_state(policy, np)
    out = []
    for step in range(steps):
        state = lossscale.next_state(policy, state, np.asarray(step != INF_STEP), np)
        out.append(float(state.loss_scale))
    return out


def snapshot(params) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in params]


def scale_record(opt: LossScaleOptimizer) -> dict:
    state = opt.shared_loss_scale.state
    return {name: float(t) for name, t in state._asdict().items()}


# ---------------------------------------------------------------- references (single process)


def reference_global(steps: int, *, clip: float | None, poison_input: bool):
    """One process on the global batch: params, scales and clip norms after every step."""
    model = make_mlp()
    opt = LossScaleOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True), **POLICY)
    xs, ys = data(steps, poison_input)
    params, scales, norms = [], [], []
    for step in range(steps):
        opt.zero_grad()
        opt.get_scaled_loss(F.mse_loss(model(xs[step]), ys[step])).backward()
        if not poison_input and step == INF_STEP:
            model[0].weight.grad[FSDP_INF_INDEX] = float("inf")
        if clip is not None:
            norms.append(float(opt.clip_grad_norm_(clip)))
        opt.step()
        params.append(snapshot(model.parameters()))
        scales.append(float(opt.loss_scale))
    return params, scales, norms


def shard_weight(rank: int) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(10 + rank))


def shard_batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(100 * rank + step))


def shard_loss(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (x @ w.t()).tanh().pow(2).mean()


def make_shard_opt(kind: str, params, **kwargs):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, fused=(kind == "adamw_fused"), **kwargs)


def reference_shard(rank: int, kind: str) -> list[torch.Tensor]:
    """Rank ``rank``'s shard trained without loss scaling, skipping INF_STEP outright."""
    w = torch.nn.Parameter(shard_weight(rank))
    opt = make_shard_opt("sgd" if kind == "sgd" else "adamw", [w])
    out = []
    for step in range(STEPS):
        opt.zero_grad()
        shard_loss(w, shard_batch(rank, step)).backward()
        if step != INF_STEP:
            opt.step()
        out.append(w.detach().clone())
    return out


# ---------------------------------------------------------------- scenarios (one rank)


def scenario_ddp(rank: int, world: int, tmp: str) -> dict:
    """DDP, uninterrupted and with a save/resume at RESUME_AT; Inf in rank 1's input at INF_STEP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    xs, ys = data(STEPS, poison_input=True)

    def train(model, opt, steps, out):
        for step in steps:
            opt.zero_grad()
            loss = F.mse_loss(model(local(xs[step], rank, world)), local(ys[step], rank, world))
            opt.get_scaled_loss(loss).backward()
            opt.step()
            out["params"].append(snapshot(model.module.parameters()))
            out["scales"].append(scale_record(opt))

    def fresh(**kwargs):
        model = DDP(make_mlp())
        return model, LossScaleOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True), **kwargs)

    plain = {"params": [], "scales": []}
    model, opt = fresh(**POLICY)
    train(model, opt, range(STEPS), plain)
    opt.check_replicas_agree()

    resumed = {"params": [], "scales": []}
    model, opt = fresh(**POLICY)
    train(model, opt, range(RESUME_AT), resumed)
    path = os.path.join(tmp, "ddp.pt")
    if rank == 0:  # rank 0 saves ...
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict()}, path)
    torch.distributed.barrier()
    model, opt = fresh()  # ... every rank loads, into an optimizer built with the default policy
    checkpoint = torch.load(path, weights_only=True)
    model.module.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["opt"])
    resumed["loaded"] = scale_record(opt)
    opt.check_replicas_agree()
    train(model, opt, range(RESUME_AT, STEPS), resumed)
    return {"plain": plain, "resumed": resumed}


def scenario_local_overflow(rank: int, world: int, tmp: str) -> dict:
    """Hand-sharded (model-parallel style) parameters; rank 1 alone gets an Inf gradient at INF_STEP."""
    from torch.distributed.device_mesh import init_device_mesh

    groups = {
        "sgd": torch.distributed.new_group(list(range(world))),  # unfused: host decision
        "adamw_fused": init_device_mesh("cpu", (world,)),  # fused: decision on the device; a DeviceMesh
        "control": None,  # no process_group: the ranks drift apart
    }
    out = {}
    for kind, group in groups.items():
        w = torch.nn.Parameter(shard_weight(rank))
        inner = make_shard_opt("adamw_fused" if kind == "control" else kind, [w])
        opt = LossScaleOptimizer(inner, **POLICY, process_group=group)
        params, scales, skipped = [], [], []
        for step in range(STEPS):
            opt.zero_grad()
            opt.get_scaled_loss(shard_loss(w, shard_batch(rank, step))).backward()
            if step == INF_STEP and rank == 1:
                w.grad[0, 0] = float("inf")
            opt.step()
            params.append(w.detach().clone())
            scales.append(float(opt.loss_scale))
            skipped.append(bool(opt.last_step_skipped))
        try:
            opt.check_replicas_agree()
            error = None
        except LossScaleError as e:
            error = str(e)
        out[kind] = {"params": params, "scales": scales, "skipped": skipped, "check_error": error}
    return out


def scenario_fsdp2(rank: int, world: int, tmp: str) -> dict:
    """FSDP2 fully_shard, fused AdamW, clipping; Inf in rank 1's gradient shard only; then a DCP resume."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    xs, ys = data(STEPS + EXTRA, poison_input=False)

    def build(**kwargs):
        model = make_mlp()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        return model, LossScaleOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True), **kwargs)

    def train(model, opt, steps, out):
        for step in steps:
            opt.zero_grad()
            loss = F.mse_loss(model(local(xs[step], rank, world)), local(ys[step], rank, world))
            opt.get_scaled_loss(loss).backward()
            if step == INF_STEP and rank == 1:
                model[0].weight.grad.to_local()[FSDP_INF_INDEX[0] - 8, FSDP_INF_INDEX[1]] = float("inf")
            out["norms"].append(float(opt.clip_grad_norm_(1.0)))
            opt.step()
            out["params"].append(snapshot(model.parameters()))
            out["scales"].append(scale_record(opt))

    model, opt = build(**POLICY)
    out = {"params": [], "scales": [], "norms": [], "grad_type": None}
    train(model, opt, range(STEPS), out)
    out["grad_type"] = type(next(model.parameters()).grad).__name__
    opt.check_replicas_agree()

    # Distributed checkpoint: the inner optimizer through DCP's helpers, the (replicated) scale beside it.
    ckpt = os.path.join(tmp, "dcp")
    dcp.save(
        {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, opt.inner_optimizer),
            "loss_scale": opt.shared_loss_scale.state_dict(),
        },
        checkpoint_id=ckpt,
    )
    model, opt = build()  # default policy until loaded
    state = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, opt.inner_optimizer),
        "loss_scale": opt.shared_loss_scale.state_dict(),
    }
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt.inner_optimizer, state["optim"])
    opt.shared_loss_scale.load_state_dict(state["loss_scale"])
    resumed = {"params": [], "scales": [], "norms": [], "loaded": scale_record(opt)}
    opt.check_replicas_agree()
    train(model, opt, range(STEPS, STEPS + EXTRA), resumed)
    out["resumed"] = resumed
    return out


SCENARIOS = {"ddp": scenario_ddp, "local_overflow": scenario_local_overflow, "fsdp2": scenario_fsdp2}


def main(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=45)
    )
    results = {}
    for name, scenario in SCENARIOS.items():
        try:
            results[name] = scenario(rank, world, out_dir)
        except Exception:  # noqa: BLE001 - reported by the test, with the traceback
            results[name] = {"error": traceback.format_exc()}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
