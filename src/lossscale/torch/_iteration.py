"""``GradScaler``'s iteration: one :class:`OptimizerStep` per optimizer, closed together by ``update()``.

torch's GradScaler keeps ``per_optimizer_states`` between ``scale()`` and
``update()``; this is that, keyed weakly by optimizer (a scaler must not
keep an optimizer alive), over the scaler's one
:class:`~lossscale.torch._scale.IterationScale`. Closing the iteration
adds the flag of every optimizer that was unscaled but not stepped (as
torch does), advances the scale once and makes every step object READY
again. Cost: no pass over the gradients, no host sync.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ._diagnostics import Diagnostics
from ._distributed import FlagAgreement
from ._stats import StatsSampler
from ._scale import IterationScale
from ._step import OptimizerStep, Stage

__all__ = ["UNSCALED", "Iteration"]

#: stages in which an optimizer's gradients were unscaled (and maybe clipped) but not yet stepped
UNSCALED = (Stage.UNSCALED, Stage.CLIPPED)


class Iteration:
    """The per-optimizer step objects of one ``GradScaler`` and the ``update()`` that closes them."""

    def __init__(self, owner: IterationScale, diagnostics: Diagnostics, sampler: StatsSampler | None = None) -> None:
        self.owner = owner
        self.diagnostics = diagnostics
        self.sampler = sampler  # the scaler's: each optimizer's step measures into it, under its own slot
        self._slots = 0
        self._steps: weakref.WeakKeyDictionary[torch.optim.Optimizer, OptimizerStep] = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        """The optimizers still alive that this iteration holds a step object for."""
        return len(self._steps)

    def of(self, optimizer: torch.optim.Optimizer) -> OptimizerStep:
        """``optimizer``'s step object, made on first use (its flag agreement reads the live param groups)."""
        step = self._steps.get(optimizer)
        if step is None:
            ref = weakref.ref(optimizer)  # not the optimizer itself: the value would keep its weak key alive
            params = lambda: [p for g in ref().param_groups for p in g["params"]]  # type: ignore[union-attr]
            step = OptimizerStep(self.owner, FlagAgreement(None, params), self.diagnostics, self.sampler, self._slots)
            self._slots += 1
            self._steps[optimizer] = step
        return step

    def close(self, new_scale: Any = None) -> torch.Tensor | None:
        """Advances the scale once (or sets ``new_scale``) and readies every optimizer for the next iteration.

        Returns the iteration's found-inf flag (the MAX over its optimizers;
        None if none was stepped or unscaled). No sync.
        """
        for step in self._steps.values():
            if step.record.stage in UNSCALED:
                self.owner.add_step(step.record.found_inf, step.record)  # type: ignore[arg-type]
        pending = self.owner.pending
        self.owner.update(new_scale)
        for step in self._steps.values():
            step.record.reset()
        return pending

    def reset(self) -> None:
        """Forgets every optimizer's iteration (after a checkpoint is loaded)."""
        for step in self._steps.values():
            step.reset()

    def between_iterations(self) -> bool:
        """Whether no optimizer is part-way through an iteration (all READY)."""
        return all(step.record.stage is Stage.READY for step in self._steps.values())
