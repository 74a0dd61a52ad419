"""``stats_every`` for torch: :class:`StatsSampler`, the sampled statistics and ``AutoLossScale``'s state.

One per ``LossScaleOptimizer`` (or ``GradScaler``). Per iteration:

* :meth:`StatsSampler.measure` (before the gradients are unscaled): on every
  ``N``-th iteration, the core's statistics of the *scaled* gradients
  (:func:`lossscale.torch._stats.gradient_stats`), kept as tensors. The
  count is a Python int, so an unsampled iteration does nothing at all.
* :meth:`StatsSampler.advance` (after the step): with ``AutoLossScale``,
  the scale state becomes :func:`lossscale._auto.next_auto_state` of the
  state *before* the step, written in place into the owner's tensors
  (replacing the fallback TF rule's result, which the binding computed).

No host sync: every value stays a tensor; the finite flag is the step's
``found_inf`` tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._auto import AutoLossScale, AutoState, check_stats_every, initial_auto_state, next_auto_state
from .._policy import LossScale
from .._rule import LossScaleState
from .._stats import GradientStats, as_mapping
from ._stats import gradient_stats

__all__ = ["StatsSampler", "check_stats_every", "measure_scaled", "restored_sampler", "sampler_for"]


class StatsSampler:
    """The sampled statistics of one optimizer's gradients, and ``AutoLossScale``'s extra state.

    Args:
        every: measure every ``every``-th iteration.
        policy: the optimizer's policy; an :class:`~lossscale.AutoLossScale`
            makes :meth:`advance` set the scale from the samples.
    """

    def __init__(self, every: int, policy: LossScale) -> None:
        self.every = every
        self.policy = policy
        self.iteration = 0
        self.sample: GradientStats | None = None
        self.names: tuple[str, ...] | None = None
        self.sampled = False
        self._measured = False
        self._before: LossScaleState | None = None
        self.auto: AutoState | None = initial_auto_state(policy, torch) if isinstance(policy, AutoLossScale) else None

    def measure(self, grads: list[torch.Tensor], names: list[str] | None, state: LossScaleState) -> None:
        """Measures this iteration's scaled ``grads`` if it is a sampled one; once per iteration.

        Cost on a sampled iteration: see :func:`lossscale.torch._stats.gradient_stats`
        (a few passes of arithmetic kernels); otherwise nothing. No sync.
        """
        if self._measured:
            return
        self._measured = True
        self.sampled = self.iteration % self.every == 0 and bool(grads)
        if self.sampled:
            self.sample = gradient_stats(grads, self.iteration)
            self.names = tuple(names) if names is not None and len(names) == len(grads) else None
        if self.auto is not None:
            self._before = LossScaleState(*(t.detach().clone() for t in state))

    def advance(self, state: LossScaleState, found_inf: torch.Tensor | None) -> None:
        """Ends the iteration; with ``AutoLossScale`` writes the auto rule's state into ``state`` in place.

        ``found_inf`` is the step's 0-d flag (None: no gradient, not a step).
        """
        before, self._before, self._measured = self._before, None, False
        if found_inf is None:
            return
        self.iteration += 1
        if self.auto is None or before is None:
            return
        device = state.loss_scale.device
        before = LossScaleState(*(t.to(device) for t in before))
        finite = found_inf.to(device) == 0
        auto = AutoState(*(t.to(device) for t in self.auto))
        sample = None if self.sample is None else GradientStats(*(t.to(device) for t in self.sample))
        new, self.auto = next_auto_state(self.policy, before, auto, finite, sample, self.sampled, torch)  # type: ignore[arg-type]
        with torch.no_grad():
            for live, value in zip(state, new):
                live.copy_(value)

    @property
    def due(self) -> bool:
        """Whether :meth:`measure` needs this iteration's gradients (a sampled iteration, or the auto rule's state)."""
        return not self._measured and (self.auto is not None or self.iteration % self.every == 0)

    def following(self, policy: LossScale) -> StatsSampler:
        """This sampler, or a new one over ``policy`` when a load changed the owner's policy (same ``every``).

        The count and the latest sample carry over; an ``AutoLossScale`` state
        starts afresh (a checkpoint without ``"lossscale_stats"`` holds none).
        """
        if policy == self.policy:
            return self
        fresh = StatsSampler(self.every, policy)
        fresh.iteration, fresh.sample, fresh.names = self.iteration, self.sample, self.names
        return fresh

    def forget(self) -> None:
        """``zero_grad()`` before a step: the iteration's measurement is dropped (the sample stays)."""
        self._measured, self._before = False, None

    @property
    def gradient_stats(self) -> dict[str, Any] | None:
        """The latest sample as :func:`lossscale._stats.as_mapping` (tensors; None before the first)."""
        return None if self.sample is None else as_mapping(self.sample, self.names)

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """``iteration`` and, with ``AutoLossScale``, its state (tensors, copied)."""
        out: dict[str, Any] = {"iteration": self.iteration}
        if self.auto is not None:
            out["auto"] = {k: v.detach().clone() for k, v in self.auto._asdict().items()}
        return out

    def load_state_dict(self, record: Mapping[str, Any]) -> None:
        """Takes over :meth:`state_dict`'s output (validated first: a bad record changes nothing)."""
        if not isinstance(record, Mapping) or not isinstance(record.get("iteration"), int):
            raise ValueError(  # noqa: TRY004 - a malformed record is a bad value, as every checkpoint error
                f"Invalid stats record {record!r}: expected StatsSampler.state_dict()'s output."
            )
        auto = None
        if self.auto is not None:
            saved = record.get("auto")
            if not isinstance(saved, Mapping) or set(saved) != set(AutoState._fields):
                raise ValueError(
                    "The checkpoint has no AutoLossScale state (saved with another policy?); "
                    f"expected the keys {', '.join(AutoState._fields)}."
                )
            auto = AutoState(**{k: torch.as_tensor(saved[k]).clone() for k in AutoState._fields})
            if auto.window.shape != self.auto.window.shape:
                raise ValueError(
                    f"The checkpoint's AutoLossScale window has {auto.window.shape[0]} entries, the policy "
                    f"{self.auto.window.shape[0]}: load it with the policy it was saved with."
                )
        self.iteration = record["iteration"]
        if auto is not None:
            self.auto = auto


def sampler_for(stats_every: Any, owner: Any) -> StatsSampler | None:
    """The :class:`StatsSampler` of an optimizer over the scale ``owner`` (None when ``stats_every`` is off).

    ``AutoLossScale`` sets one optimizer's own scale; a scale shared by several optimizers is refused.
    """
    every = check_stats_every(stats_every, owner.policy)
    if every is None:
        return None
    if isinstance(owner.policy, AutoLossScale) and not getattr(owner, "advances_each_step", False):
        raise ValueError(
            "AutoLossScale sets the scale of one optimizer from its own gradients; a scale shared by several "
            "optimizers (SharedLossScale) is not supported yet. Use one LossScaleOptimizer per scale, or "
            "loss_scale='dynamic' with stats_every=N for the statistics alone."
        )
    return StatsSampler(every, owner.policy)


def measure_scaled(sampler: StatsSampler | None, steps: Any, inner: torch.optim.Optimizer) -> None:
    """``sampler.measure`` of ``inner``'s gradients while they are still scaled (the step record is ``READY``).

    Called by ``step()``, ``unscale_()`` and ``clip_grad_norm_()`` before they unscale; the first call of
    an iteration measures, the others do nothing. No sync.
    """
    from ._step import Stage

    if sampler is None or steps.record.stage is not Stage.READY:
        return
    if not sampler.due:  # an unsampled iteration: no walk over the parameters
        sampler.measure([], None, steps.owner.state)
        return
    reporter = steps.diagnostics.reporter
    grads, names = [], []
    for g, group in enumerate(inner.param_groups):
        for i, p in enumerate(group["params"]):
            if p.grad is not None:
                grads.append(p.grad)
                names.append(reporter.name_of(p, g, i) if reporter is not None else f"param_groups[{g}]['params'][{i}]")
    sampler.measure(grads, names, steps.owner.state)
    recorder = steps.diagnostics.recorder
    if recorder is not None and sampler.sampled and sampler.sample is not None:  # the History's stats columns
        sample = sampler.sample
        recorder.note_stats(torch.stack([sample.headroom_bits, sample.zero_fraction, sample.subnormal_fraction]))


def restored_sampler(
    current: StatsSampler | None, state_dict: Mapping[str, Any], record: Any, custom_objects: Any
) -> StatsSampler | None:
    """A new sampler holding a checkpoint's ``"lossscale_stats"`` ``record`` (validated; ``current`` unchanged).

    The policy is the checkpoint's (``state_dict["lossscale"]``), as the scale's is. None when statistics are off.
    """
    if current is None:
        return None
    from ._checkpoint import ScaleRecord

    saved = state_dict.get("lossscale")
    policy = current.policy
    if isinstance(saved, Mapping):
        policy = ScaleRecord.from_dict(saved, custom_objects, current=current.policy).policy
    fresh = StatsSampler(current.every, policy)
    fresh.load_state_dict(record)
    fresh.sample, fresh.names = current.sample, current.names
    return fresh
