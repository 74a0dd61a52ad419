"""``stats_every`` for torch: measuring and keeping samples (the decisions are :mod:`lossscale._sampler`'s)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from .. import _sampler as core
from .._auto import AutoLossScale, AutoState
from .._policy import LossScale
from .._stats import GradientStats, Sizes, as_mapping, sizes_of, summarize_columns
from .._torch._kernels import sample_columns

__all__ = ["StatsSampler", "Taken"]

Triples = list[tuple[Any, torch.Tensor, torch.Tensor]]  # (where, parameter, gradient); ``where`` gives the name


class _Measured(NamedTuple):
    """One optimizer's measurement of a sampled step: the four ``(T,)`` columns, the gradients' names and sizes, and
    the micro-batches summed into them."""

    columns: list[torch.Tensor]
    names: tuple[str, ...]
    sizes: Sizes
    micro_batches: int


class Taken(NamedTuple):
    """One step's sample for the core's ``advance``: ``sample`` (summarized, or None where no rule reads it),
    ``sampled`` (a Python bool: the step is known on the host) and ``micro_batches`` (backward passes summed)."""

    sample: GradientStats | None
    sampled: bool
    micro_batches: int


class StatsSampler:
    """One optimizer's (or GradScaler's) samples and ``state``; ``backwards``: the ``get_scaled_loss``/``scale()``
    calls since the last step, read as the micro-batches summed into the gradients (at least 1)."""

    def __init__(self, every: int, policy: LossScale, count: int = 0, auto: AutoState | None = None) -> None:
        self.every, self.policy, self.backwards = every, policy, 0
        self.names: tuple[str, ...] | None = None
        self.state = core.initial_sampler_state(policy, 0, torch, count=count)
        if auto is not None:  # a checkpoint's (numpy, from read_sampler_record)
            self.state = self.state._replace(auto=AutoState(*(torch.as_tensor(v).clone() for v in auto)))
        self._calm_from = (0 if auto is None else int(auto.calm_steps), count)  # host values: no sync
        self._sums: dict[int, _Measured] = {}  # optimizer index -> its measurement of this step
        self._columns: tuple | None = None  # (columns, sizes, count) of a sample not summarized yet (see take)
        self._sets: dict[Any, tuple[tuple[str, ...], Sizes]] = {}  # parameter set -> (names, sizes)

    def calm_bound(self) -> int:
        """An upper bound of an ``AutoLossScale``'s ``calm_steps``, known on the host: the value it started from
        (0, or a checkpoint's) plus the steps counted since (it grows by at most one a step)."""
        calm, count = self._calm_from
        return calm + self.state.count - count

    @property
    def due(self) -> bool:
        """Whether this step is sampled (a Python int's modulo: no device work)."""
        return core.is_due(self.every, self.state.count)

    def measure(self, index: int, grads: Triples, name_of: Callable[[Any], str], factor: Any = None) -> None:
        """Keeps the sums of one optimizer's scaled gradients for this step's sample; call it when :attr:`due`.

        Args:
            index: the optimizer's index among those sharing this sampler (a GradScaler's; 0 for one optimizer).
            grads: ``(where, parameter, gradient)`` triples; ``where`` is handed to ``name_of``.
            name_of: gives a gradient's name in :attr:`gradient_stats` (called once per parameter set).
            factor: a 0-d tensor the gradients are multiplied by first (None: 1).

        Cost: one read of the gradients and about 12 multi-tensor launches per chunk (about 9 kernels per tensor
        on the CPU); no sync.
        """
        if not grads:
            return
        key = (index, grads[0][2].device, tuple((where, id(p), g.numel()) for where, p, g in grads))
        known = self._sets.get(key)
        if known is None:  # a new parameter set: its names and sizes, once (the sizes' one copy to the device)
            self._sets = dict(list(self._sets.items())[-7:])
            sizes = sizes_of([g.numel() for _, _, g in grads], torch, device=key[1])
            known = self._sets[key] = (tuple(name_of(where) for where, _, _ in grads), sizes)
        self._sums[index] = _Measured(sample_columns([g for _, _, g in grads], factor), *known, max(1, self.backwards))

    def forget(self) -> None:
        """``zero_grad()``: this step's measurements and backward count are dropped (the kept sample stays)."""
        self._sums, self.backwards = {}, 0

    def take(self, recorder: Any = None) -> Taken:
        """Ends a step's measuring: what :meth:`measure` kept becomes the sample (kept unsummarized until something
        reads it), its statistics are noted to ``recorder`` (a history row's), and the measurements and backward
        count start afresh. The caller (``_state``) then advances :attr:`state` with what this returns.

        Args:
            recorder: the optimizer's history recorder, or None.

        Returns:
            A :class:`Taken`: the summarized sample where an ``AutoLossScale``'s rule reads it (None otherwise or
            on an unsampled step), whether this step was sampled, and its micro-batches.
        """
        parts, self._sums, self.backwards = [self._sums[k] for k in sorted(self._sums)], {}, 0
        if not parts:
            return Taken(None, False, 1)
        if len(parts) == 1:
            columns, sizes = parts[0].columns, parts[0].sizes
        else:
            columns = [torch.cat([p.columns[k] for p in parts]) for k in range(4)]
            sizes = Sizes(torch.cat([p.sizes.safe for p in parts]), sum(p.sizes.total for p in parts))
        self.names = tuple(n for p in parts for n in p.names)
        self._columns = (columns, sizes, self.state.count)
        if recorder is not None:
            latest = self._summarized().sample
            recorder.note_stats(torch.stack([latest.headroom_bits, latest.zero_fraction, latest.subnormal_fraction]))
        reads = self.state.auto is not None and isinstance(self.policy, AutoLossScale)
        return Taken(self._summarized().sample if reads else None, True, parts[0].micro_batches)

    def _summarized(self) -> core.SamplerState:
        """:attr:`state` with the latest sample summarized (about 20 kernels on ``(T,)`` columns, once per sample).
        A step that does not read its sample (no ``auto``, no History) keeps the columns and leaves this to the
        first read: about half of a sampled step's kernels on a GPU."""
        if self._columns is not None:
            columns, sizes, count = self._columns
            tag = torch.full((), count, dtype=torch.int32, device=sizes.safe.device)  # a fill, not a copy
            self.state, self._columns = self.state._replace(sample=summarize_columns(columns, sizes, tag, torch)), None
        return self.state

    @property
    def gradient_stats(self) -> dict[str, Any] | None:
        """The latest sample as :func:`lossscale._stats.as_mapping` (tensors; None before the first)."""
        return None if self.names is None else as_mapping(self._summarized().sample, self.names)

    def state_dict(self) -> dict[str, Any]:
        """The core's ``"lossscale_stats"`` record (:func:`~lossscale._sampler.sampler_record`; tensors, copied)."""
        return core.sampler_record(self.state, lambda t: t.detach().clone())

    def restored(self, record: Mapping[str, Any] | None, policy: LossScale) -> StatsSampler:
        """A sampler over ``policy`` holding ``record`` (validated; None: the count stays) and this sample."""
        count, auto = (self.state.count, None) if record is None else core.read_sampler_record(record, policy)
        fresh = StatsSampler(self.every, policy, count, auto)
        fresh.state, fresh.names = fresh.state._replace(sample=self._summarized().sample), self.names
        return fresh
