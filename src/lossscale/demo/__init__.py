"""``python -m lossscale demo``: why loss scaling exists, on a CPU in about a minute.

The task: an autoencoder (9 hidden GELU layers, a 16-wide middle) learns to
reconstruct scikit-learn's 8x8 handwritten digits (they ship inside
scikit-learn: no download), trained with Adam in float32, in plain float16
and in float16 with lossscale's dynamic loss scale, in torch and in JAX,
from the same weights on the same micro-batches. The headline number is the
reconstruction's PSNR on held-out digits.

What makes float16 fail is what makes it fail in large models: the loss is
one micro-batch's share of a **large global batch**. With gradient
accumulation over K micro-batches (or K data-parallel replicas averaging
their gradients) every micro-batch's backward sees its loss divided by K, so
every gradient value is K times smaller, and float16 rounds what falls below
2**-25 (about 3e-8, half its smallest positive value) to zero. The demo cannot run K = 1024 micro-batches per
step on a CPU, so it runs one: each step is exactly one micro-batch backward
of a K-micro-batch run (loss divided by K), and Adam, whose ``eps`` is scaled
by 1/K too and which is otherwise invariant to the gradient's scale, steps on
it. In exact arithmetic K changes nothing; every difference between the runs
is float16 underflow. At K = 1 this model's gradients fit float16 (the demo
prints that row too); at K = 1024 plain float16 loses almost every encoder
gradient and learns one grey blob, and the loss scale brings them back.

The API: :func:`run_demo` and :func:`run_sweep` return every number of the
tables and figures; :func:`plot_history` and :func:`write_tensorboard` draw or
log any :class:`lossscale.History`.
"""

from __future__ import annotations

from ._backends import BACKENDS, Backend, Trainer
from ._cli import main
from ._config import ALL_MODES, AUTO_MODE, FRAMEWORKS, MODES, SWEEP_FACTORS, DemoConfig
from ._data import DemoData, load_data
from ._results import DemoResult, RunResult, SweepResult
from ._runner import run_demo, run_sweep
from .plot import plot_demo, plot_history, plot_sweep, write_tensorboard

__all__ = [
    "ALL_MODES",
    "AUTO_MODE",
    "BACKENDS",
    "FRAMEWORKS",
    "MODES",
    "SWEEP_FACTORS",
    "Backend",
    "DemoConfig",
    "DemoData",
    "DemoResult",
    "RunResult",
    "SweepResult",
    "Trainer",
    "load_data",
    "main",
    "plot_demo",
    "plot_history",
    "plot_sweep",
    "run_demo",
    "run_sweep",
    "write_tensorboard",
]
