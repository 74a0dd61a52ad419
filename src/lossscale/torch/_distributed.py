"""One skip decision for every rank (the found-inf flag MAX-all-reduced), and a check that the replicas agree."""

from __future__ import annotations

import json
import sys
import weakref
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .._errors import LossScaleError
from .._policy import LossScale
from .._resolve import serialize
from .._rule import LossScaleState
from .._torch._kernels import dtensor_type

__all__ = ["FlagAgreement", "agree_flag", "agreement_groups", "all_reduce_max", "check_replicas_agree", "validate_process_group"]


def device_mesh_type() -> type | None:
    """``torch.distributed.device_mesh.DeviceMesh`` if torch has imported it, else None."""
    module = sys.modules.get("torch.distributed.device_mesh")
    return getattr(module, "DeviceMesh", None) if module is not None else None


def validate_process_group(process_group: Any) -> Any:
    """Returns ``process_group`` if it is None, a ``ProcessGroup`` or a ``DeviceMesh``; TypeError otherwise."""
    if process_group is None:
        return None
    if not torch.distributed.is_available():
        raise RuntimeError("process_group was given but this torch build has no torch.distributed; "
                           "drop process_group, or install a torch build with distributed support.")
    mesh_type = device_mesh_type()
    if isinstance(process_group, torch.distributed.ProcessGroup) or (
        mesh_type is not None and isinstance(process_group, mesh_type)
    ):
        return process_group
    raise TypeError(f"process_group must be a torch.distributed.ProcessGroup (e.g. dist.new_group(ranks) or "
                    f"dist.group.WORLD) or a DeviceMesh, got {type(process_group).__name__}.")


# DeviceMesh -> the groups its flag is reduced over (computed once per mesh).
_MESH_GROUPS: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _mesh_groups(mesh: Any) -> list[Any]:
    """Groups whose successive MAX all-reduces cover ``mesh``: the world's if it spans every rank, else one per dim."""
    groups = _MESH_GROUPS.get(mesh)
    if groups is None:
        dist = torch.distributed
        spans_world = sorted(int(r) for r in mesh.mesh.flatten().tolist()) == list(range(dist.get_world_size()))
        groups = [dist.group.WORLD] if spans_world else [mesh.get_group(d) for d in range(mesh.ndim)]
        _MESH_GROUPS[mesh] = groups
    return groups


def agreement_groups(process_group: Any, params: Iterable[torch.Tensor]) -> list[Any]:
    """The groups the flag is MAX-reduced over: ``process_group``'s, else the parameters' DTensor meshes', else none."""
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
    world = torch.distributed.group.WORLD if len(groups) > 1 and torch.distributed.is_initialized() else None
    return [world] if world is not None and any(g is world for g in groups) else groups


def all_reduce_max(flag: torch.Tensor, groups: Sequence[Any]) -> torch.Tensor:
    """A copy of ``flag`` MAX-all-reduced over each of ``groups`` in turn: one scalar all-reduce per group (NCCL:
    no host sync; gloo: the host blocks)."""
    if not groups:
        return flag
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise RuntimeError("The found-inf flag must be agreed across ranks, but torch.distributed is not "
                           "initialized. Call torch.distributed.init_process_group(...) before the first step(), or "
                           "drop process_group.")
    dist = torch.distributed
    agreed = flag.clone()
    for group in groups:
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group, async_op=True).wait()
    return agreed


def agree_flag(agree: FlagAgreement | None, found_inf: torch.Tensor) -> torch.Tensor:
    """``found_inf`` agreed across the ranks of ``agree`` (None: one process, the flag itself): one scalar
    all-reduce per group, the groups resolved once (again after :meth:`FlagAgreement.reset`)."""
    if agree is None:
        return found_inf
    groups = agree.groups if agree.groups is not None else agree.resolve()
    return all_reduce_max(found_inf, groups) if groups else found_inf


class FlagAgreement:
    """The groups one optimizer's flag is reduced over; ``groups``: None until :meth:`resolve`, after :meth:`reset`.

    Args:
        process_group: a ``ProcessGroup``, a ``DeviceMesh``, or None (the parameters' DTensor meshes, if any).
        params: a zero-argument callable returning the optimizer's parameters.
    """

    def __init__(self, process_group: Any, params: Any) -> None:
        self.process_group = validate_process_group(process_group)
        self._params = params  # a zero-argument callable returning the parameters
        self.groups: list[Any] | None = None

    def resolve(self) -> list[Any]:
        self.groups = agreement_groups(self.process_group, self._params())
        return self.groups

    def reset(self) -> None:
        self.groups = None


_FIELDS = LossScaleState._fields


def _policy_fingerprint(policy: LossScale) -> float:
    text = json.dumps(serialize(policy), sort_keys=True, default=repr)
    return float(zlib.crc32(text.encode("utf-8")))


def check_replicas_agree(state: LossScaleState, policy: LossScale, groups: Sequence[Any]) -> None:
    """Raises :class:`~lossscale.LossScaleError` unless every rank of ``groups`` (empty: the world) holds the same
    scale, counters and policy (a checksum of its config). Cost: an all-gather of 6 float64 per group, one sync."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise RuntimeError("check_replicas_agree() compares ranks, but torch.distributed is not initialized. "
                           "Call torch.distributed.init_process_group(...) first.")
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
        for i, name in enumerate([*_FIELDS, "policy"]):
            values = [row[i] for row in rows]
            if name == "policy" and len(set(values)) > 1:
                problems.append("the loss scale policies (their configs) differ")
            elif len(set(values)) > 1:
                shown = ", ".join(f"rank {r}: {v:g}" if name == "loss_scale" else f"rank {r}: {int(v)}"
                                  for r, v in zip(ranks, values))
                problems.append(f"{name} differs ({shown})")
        if problems:
            raise LossScaleError(f"The loss scale has drifted apart across ranks: {'; '.join(problems)}. Every rank "
                                 "must take the same skip decision: pass process_group= (or use DTensor parameters) "
                                 "when ranks hold different gradients, and load the same checkpoint on every rank.")
