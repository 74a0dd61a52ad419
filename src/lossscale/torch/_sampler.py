"""``stats_every`` for torch: measuring and keeping the samples; the decisions are the core's :mod:`lossscale._sampler`.

Every entry point, before it unscales (``step()``, ``step(closure)``, ``unscale_``, ``clip_grad_norm_``,
``apply_gradients``, ``minimize``), calls :meth:`StatsSampler.measure` on a due step (:func:`~lossscale._sampler.is_due`
of a Python count): the per-tensor sums of one optimizer's scaled gradients. :meth:`StatsSampler.advance` ends the
step (a ``GradScaler``'s iteration): every optimizer's sums become one sample, which the core's
:func:`~lossscale._sampler.next_sampler_state` keeps while it counts the step and, for ``AutoLossScale``, sets the scale.

Cost: an unsampled step does no device work and no walk over the parameters. A sampled one: about 8 arithmetic
kernels per gradient (:func:`~lossscale.torch._stats.tensor_sums`: one pass) and about 30 on ``(T,)`` tensors; names
and sizes are built once per parameter set, so no Python value is copied to the device. No host sync (a sparse
gradient's coalesce is one on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._auto import AutoLossScale, AutoState
from .._policy import LossScale
from .._rule import LossScaleState
from .._sampler import (check_stats_every, counted_sampler_state, initial_sampler_state, is_due, next_sampler_state,
                        read_sampler_record, sampler_record)
from .._stats import as_mapping, summarize
from ._stats import tensor_sums

__all__ = ["StatsSampler", "check_stats_every"]

Triples = list[tuple[Any, torch.Tensor, torch.Tensor]]  # (where, parameter, gradient); ``where`` gives the name


class StatsSampler:
    """One optimizer's (or GradScaler's) samples and sampler state (``state``: :class:`~lossscale._sampler.SamplerState`).

    ``backwards``: the owner's ``get_scaled_loss``/``scale()`` calls since the last step, read as the
    ``micro_batches`` summed into the gradients (gradient accumulation; none counted reads as 1).
    """

    def __init__(self, every: int, policy: LossScale, count: int = 0, auto: AutoState | None = None) -> None:
        self.every, self.policy, self.names, self.backwards = every, policy, None, 0
        self.state = initial_sampler_state(policy, 0, torch, count=count)
        if auto is not None:  # a checkpoint's (numpy, from read_sampler_record)
            self.state = self.state._replace(auto=AutoState(*(torch.as_tensor(v).clone() for v in auto)))
        self._sums: dict[int, tuple] = {}  # optimizer slot -> (sums, names, sizes, micro-batches) of this step
        self._sets: dict[Any, tuple[tuple[str, ...], torch.Tensor]] = {}  # parameter set -> (names, sizes)

    due = property(lambda self: is_due(self.every, self.state.count), doc="Whether this step is sampled (no device work).")

    def measure(self, slot: int, grads: Triples, name_of: Callable[[Any], str], factor: torch.Tensor | None = None) -> None:
        """Keeps the sums of optimizer ``slot``'s scaled gradients (times ``factor`` if given); call only when :attr:`due`."""
        if not grads:
            return
        key = (slot, grads[0][2].device, tuple((where, id(p), g.numel()) for where, p, g in grads))
        known = self._sets.get(key)
        if known is None:  # a new parameter set: its names and sizes, once (the sizes' one copy to the device)
            self._sets = dict(list(self._sets.items())[-7:])
            sizes = torch.tensor([float(g.numel()) for _, _, g in grads], device=key[1])
            known = self._sets[key] = (tuple(name_of(where) for where, _, _ in grads), sizes)
        self._sums[slot] = ([tensor_sums(g, factor) for _, _, g in grads], *known, max(1, self.backwards))

    def forget(self) -> None:
        """``zero_grad()``: this step's measurements and backward count are dropped (the kept sample stays)."""
        self._sums, self.backwards = {}, 0

    def advance(self, scale: LossScaleState | None, found_inf: torch.Tensor | None, recorder: Any = None) -> Any:
        """Ends a step: the auto rule's new scale state from ``scale`` (the step's) and ``found_inf``, for the caller
        to write; None where the caller's own rule advances the scale. ``recorder`` gets a sample's history columns."""
        parts, self._sums, self.backwards = [self._sums[k] for k in sorted(self._sums)], {}, 0
        sample = None
        if parts:
            sizes = parts[0][2] if len(parts) == 1 else torch.cat([p[2] for p in parts])
            tag = torch.full((), self.state.count, dtype=torch.int32, device=sizes.device)  # a fill, not a copy
            sample = summarize([s for p in parts for s in p[0]], sizes, tag, torch)
            self.names = tuple(n for p in parts for n in p[1])
            if recorder is not None:
                recorder.note_stats(torch.stack([sample.headroom_bits, sample.zero_fraction, sample.subnormal_fraction]))
        auto = self.state.auto
        if scale is None or found_inf is None or auto is None or not isinstance(self.policy, AutoLossScale):
            self.state = counted_sampler_state(self.state, sample, sample is not None, torch)
            return None
        device = scale.loss_scale.device
        if auto.margin.device != device:  # once, after the scale moved
            self.state = self.state._replace(auto=AutoState(*(t.to(device) for t in auto)))
        new, self.state = next_sampler_state(self.policy, scale, self.state, found_inf.to(device) == 0, sample,
                                             sample is not None, torch, micro_batches=parts[0][3] if parts else 1)
        return new

    @property
    def gradient_stats(self) -> dict[str, Any] | None:
        """The latest sample as :func:`lossscale._stats.as_mapping` (tensors; None before the first)."""
        return None if self.names is None else as_mapping(self.state.sample, self.names)

    def state_dict(self) -> dict[str, Any]:
        """The core's ``"lossscale_stats"`` record (:func:`~lossscale._sampler.sampler_record`; tensors, copied)."""
        return sampler_record(self.state, lambda t: t.detach().clone())

    def restored(self, record: Mapping[str, Any] | None, policy: LossScale) -> StatsSampler:
        """A new sampler over ``policy`` holding ``record`` (validated; None: the count stays, auto afresh); the sample stays."""
        count, auto = (self.state.count, None) if record is None else read_sampler_record(record, policy)
        fresh = StatsSampler(self.every, policy, count, auto)
        fresh.state, fresh.names = fresh.state._replace(sample=self.state.sample), self.names
        return fresh
