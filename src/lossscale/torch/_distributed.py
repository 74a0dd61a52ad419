"""lossscale under ``torch.distributed``: one skip decision for every rank.

Loss scaling has one hard rule across ranks: either every rank skips the
step or none does, and the scale and its counters stay identical
everywhere. Plain DDP gets this for free (its gradients are all-reduced
before ``step()``). Sharded setups do not: under FSDP2 (``fully_shard``),
ZeRO-style sharded optimizers and tensor/pipeline parallelism each rank
checks different gradients, so its found-inf flag must be combined with
the others' before the decision. This module does that with one scalar
all-reduce (MAX) per step, and offers a debug check that the replicated
loss-scale state really agrees.

Which group the flag is reduced over:

* the ``process_group`` given to :class:`~lossscale.torch.LossScaleOptimizer`
  (a ``ProcessGroup``, or a ``DeviceMesh``, meaning all of its ranks);
* otherwise, when parameters are DTensors (FSDP2, tensor parallel with
  DTensor), their device meshes: the default (world) group when a mesh spans
  every rank, else one group per mesh dimension;
* otherwise none: the flag stays local (single process, DDP).

Nothing here imports ``torch.distributed.tensor`` unless torch itself has:
a process that never built a DTensor pays nothing for the check.
"""

from __future__ import annotations

import json
import weakref
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .._errors import LossScaleError
from .._policy import LossScale
from .._resolve import serialize
from .._rule import LossScaleState
from .._torch_compat import device_mesh_type, dtensor_type

__all__ = [
    "FlagAgreement",
    "agreement_groups",
    "all_reduce_max",
    "check_replicas_agree",
    "validate_process_group",
]


def validate_process_group(process_group: Any) -> Any:
    """Returns ``process_group`` if it is None, a ``ProcessGroup`` or a ``DeviceMesh``; TypeError otherwise."""
    if process_group is None:
        return None
    if not torch.distributed.is_available():
        raise RuntimeError(
            "process_group was given but this torch build has no torch.distributed; "
            "drop process_group, or install a torch build with distributed support."
        )
    mesh_type = device_mesh_type()
    if isinstance(process_group, torch.distributed.ProcessGroup) or (
        mesh_type is not None and isinstance(process_group, mesh_type)
    ):
        return process_group
    raise TypeError(
        f"process_group must be a torch.distributed.ProcessGroup (e.g. dist.new_group(ranks) or "
        f"dist.group.WORLD) or a DeviceMesh, got {type(process_group).__name__}."
    )


def _require_initialized() -> None:
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise RuntimeError(
            "The found-inf flag must be agreed across ranks, but torch.distributed is not initialized. "
            "Call torch.distributed.init_process_group(...) before the first step(), or drop process_group."
        )


# DeviceMesh -> the groups its flag is reduced over (computed once per mesh).
_MESH_GROUPS: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _mesh_groups(mesh: Any) -> list[Any]:
    """Groups whose successive MAX all-reduces cover every rank of ``mesh``.

    One group (the default one) when the mesh spans the whole world, else one
    per mesh dimension (``ndim`` scalar reductions; each rank's line along
    every dimension, which together cover the mesh).
    """
    cached = _MESH_GROUPS.get(mesh)
    if cached is not None:
        return cached
    dist = torch.distributed
    ranks = sorted(int(r) for r in mesh.mesh.flatten().tolist())
    if ranks == list(range(dist.get_world_size())):
        groups = [dist.group.WORLD]
    else:
        groups = [mesh.get_group(dim) for dim in range(mesh.ndim)]
    _MESH_GROUPS[mesh] = groups
    return groups


def agreement_groups(process_group: Any, params: Iterable[torch.Tensor]) -> list[Any]:
    """The process groups the found-inf flag is MAX-reduced over, in order; empty when none is needed.

    Cost: one Python pass over ``params`` (an ``isinstance`` each) when no
    group was given; no collective, no sync.
    """
    if process_group is not None:
        mesh_type = device_mesh_type()
        if mesh_type is not None and isinstance(process_group, mesh_type):
            return list(_mesh_groups(process_group))
        return [process_group]
    dtensor = dtensor_type()
    if dtensor is None:
        return []
    meshes: dict[int, Any] = {}
    for p in params:
        if isinstance(p, dtensor):
            meshes.setdefault(id(p.device_mesh), p.device_mesh)
    groups: list[Any] = []
    for mesh in meshes.values():
        for group in _mesh_groups(mesh):
            if not any(group is g for g in groups):
                groups.append(group)
    default = None
    if len(groups) > 1 and torch.distributed.is_initialized():
        default = torch.distributed.group.WORLD
    if default is not None and any(g is default for g in groups):
        return [default]
    return groups


def all_reduce_max(flag: torch.Tensor, groups: Sequence[Any]) -> torch.Tensor:
    """A copy of ``flag`` MAX-all-reduced over each of ``groups`` in turn; ``flag`` itself is left alone.

    Cost: one scalar all-reduce per group (one in every common setup). Each
    is issued with ``async_op=True`` and waited on at once: on NCCL the wait
    only makes the current CUDA stream wait for the communication stream,
    so there is no host sync and the fused optimizer's kernel is the first
    thing to consume the result. On gloo (CPU tensors) the wait blocks the
    host until the reduction is done (microseconds on one host).
    """
    if not groups:
        return flag
    _require_initialized()
    dist = torch.distributed
    agreed = flag.clone()
    for group in groups:
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group, async_op=True).wait()
    return agreed


class FlagAgreement:
    """The found-inf flag every rank agrees on, for one optimizer: a callable ``agree(found_inf) -> flag``.

    The groups are worked out once from ``process_group`` (or the
    parameters' DTensor meshes, see :func:`agreement_groups`) and again
    after :meth:`reset` (call it when parameters are added). Cost: one
    scalar all-reduce per call (none without a group or DTensors); no host
    sync on NCCL (stream-ordered), a blocking wait on gloo.
    """

    def __init__(self, process_group: Any, params: Any) -> None:
        self.process_group = validate_process_group(process_group)
        self._params = params  # a zero-argument callable returning the parameters
        self._groups: list[Any] | None = None

    def __call__(self, found_inf: torch.Tensor) -> torch.Tensor:
        if self._groups is None:
            self._groups = agreement_groups(self.process_group, self._params())
        return all_reduce_max(found_inf, self._groups) if self._groups else found_inf

    def reset(self) -> None:
        self._groups = None


_FIELDS = LossScaleState._fields


def _policy_fingerprint(policy: LossScale) -> float:
    text = json.dumps(serialize(policy), sort_keys=True, default=repr)
    return float(zlib.crc32(text.encode("utf-8")))


def check_replicas_agree(state: LossScaleState, policy: LossScale, groups: Sequence[Any]) -> None:
    """Raises :class:`~lossscale.LossScaleError` unless every rank holds the same loss-scale state.

    Compares the scale, the four counters and the policy (a checksum of its
    config). ``groups`` empty means the default (world) group. Cost: one
    all-gather of 6 float64 numbers per group and one host sync; meant for
    debugging, not for every step.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise RuntimeError(
            "check_replicas_agree() compares ranks, but torch.distributed is not initialized. "
            "Call torch.distributed.init_process_group(...) first."
        )
    dist = torch.distributed
    if not groups:
        groups = [dist.group.WORLD]
    device = state.loss_scale.device
    mine = torch.stack([t.detach().to(device, torch.float64) for t in state])
    mine = torch.cat([mine, torch.tensor([_policy_fingerprint(policy)], dtype=torch.float64, device=device)])
    for group in groups:
        size = dist.get_world_size(group)
        gathered = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(gathered, mine, group=group)
        rows = [g.tolist() for g in gathered]  # the host sync
        ranks = dist.get_process_group_ranks(group)
        problems = []
        for i, name in enumerate(list(_FIELDS) + ["policy"]):
            values = [row[i] for row in rows]
            if any(v != values[0] for v in values[1:]):
                if name == "policy":
                    detail = "the loss scale policies (their configs) differ"
                else:
                    shown = ", ".join(
                        f"rank {r}: {v:g}" if name == "loss_scale" else f"rank {r}: {int(v)}"
                        for r, v in zip(ranks, values)
                    )
                    detail = f"{name} differs ({shown})"
                problems.append(detail)
        if problems:
            raise LossScaleError(
                "The loss scale has drifted apart across ranks: "
                + "; ".join(problems)
                + ". Every rank must take the same skip decision: pass process_group= (or use DTensor "
                "parameters) when ranks hold different gradients, and load the same checkpoint on every rank."
            )
