"""The demo's settings, validated once: :class:`DemoConfig`."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ALL_MODES", "AUTO_MODE", "FRAMEWORKS", "MODES", "SWEEP_FACTORS", "DemoConfig"]

#: The three runs of every comparison, in order.
MODES = ("fp32", "fp16", "fp16+lossscale")
#: The opt-in fourth run (``--auto``): float16 with the EXPERIMENTAL ``loss_scale="auto"``
#: (:class:`lossscale.AutoLossScale`), which sets the scale from sampled gradient statistics.
AUTO_MODE = "fp16+auto"
#: Every mode a trainer accepts.
ALL_MODES = (*MODES, AUTO_MODE)
#: The frameworks the demo can train with; the default runs both.
FRAMEWORKS = ("torch", "jax")
#: ``--sweep``'s global-batch factors: K = 2**0 ... 2**10.
SWEEP_FACTORS = tuple(2**i for i in range(11))

_POSITIVE_INTS = ("steps", "global_batch_factor", "batch_size", "growth_steps", "measure_every", "threads")


@dataclass(frozen=True)
class DemoConfig:
    """The demo's settings; the defaults are what ``python -m lossscale demo`` runs.

    Attributes:
        steps: optimizer steps per run.
        seed: seeds the train/test split, the initial weights and the batch order.
        frameworks: which of :data:`FRAMEWORKS` to train with, in order.
        global_batch_factor: K, the number of micro-batches in one global
            batch. Each step's loss is one micro-batch's share of the global
            batch's mean loss, i.e. its mean squared error divided by K (see
            :mod:`lossscale.demo`). 1024 is where plain float16 fails.
        batch_size: examples per micro-batch.
        widths: the hidden layers' widths (GELU after each); 64 in and out.
        lr: Adam's learning rate. Adam's ``eps`` is ``1e-8 / K``, so that K
            changes nothing in exact arithmetic.
        growth_steps: finite steps before the dynamic loss scale doubles.
            Shorter than the library's 2000 so that 1000 steps show the scale
            climbing; 2000 gives the same PSNR here (the initial 2**15 is enough).
        measure_every: steps between measurements of the zero-gradient shares.
        threads: torch intra-op threads while training (1 is fastest for this
            small model on a shared 2-core CPU). XLA fixes JAX's thread pool
            when JAX starts, so the JAX backend ignores it.
        k1_reference: also train plain fp16 at K = 1, to show that this
            model's own gradients fit float16.
        auto: also train :data:`AUTO_MODE` (float16 with the experimental
            ``loss_scale="auto"``, default settings; ``growth_steps`` does not
            apply to it). Off by default: the default demo is the three modes.
    """

    steps: int = 1000
    seed: int = 0
    frameworks: tuple[str, ...] = FRAMEWORKS
    global_batch_factor: int = 1024
    batch_size: int = 256
    widths: tuple[int, ...] = (64, 64, 64, 64, 16, 64, 64, 64, 64)
    lr: float = 3e-3
    growth_steps: int = 50
    measure_every: int = 10
    threads: int = 1
    k1_reference: bool = True
    auto: bool = False

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int; got {type(value).__name__}.")
            if value < 1:
                raise ValueError(f"{name} must be at least 1; got {value}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int; got {self.seed!r}.")
        if isinstance(self.frameworks, str):
            raise TypeError(f"frameworks must be a tuple of names, e.g. ('torch',); got the string {self.frameworks!r}.")
        frameworks = tuple(self.frameworks)
        unknown = [name for name in frameworks if name not in FRAMEWORKS]
        if not frameworks or unknown or len(set(frameworks)) != len(frameworks):
            raise ValueError(
                f"frameworks must be distinct names out of {', '.join(FRAMEWORKS)}; got {self.frameworks!r}."
            )
        object.__setattr__(self, "frameworks", frameworks)
        widths = tuple(self.widths)
        if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
            raise ValueError(f"widths must be positive ints, one per hidden layer; got {self.widths!r}.")
        object.__setattr__(self, "widths", widths)
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, e.g. 3e-3; got {self.lr!r}.")
        if not isinstance(self.auto, bool):
            raise TypeError(f"auto must be True or False; got {self.auto!r}.")
        if self.batch_size > 1437:
            raise ValueError(f"batch_size must be at most 1437, the size of the training split; got {self.batch_size}.")
        if self.global_batch_factor > 2**24:
            raise ValueError(f"global_batch_factor must be at most 2**24; got {self.global_batch_factor}.")

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes each comparison trains: :data:`MODES`, and :data:`AUTO_MODE` when ``auto``."""
        return ALL_MODES if self.auto else MODES

    @property
    def layers(self) -> int:
        """Number of weight layers: the hidden ones and the output layer."""
        return len(self.widths) + 1
