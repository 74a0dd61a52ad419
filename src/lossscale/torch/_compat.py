"""Every private torch API the ``lossscale.torch`` binding touches, each with its public replacement or why there is
none. Those Keras on torch uses too are bound once in :mod:`lossscale._torch._compat` (which says, for each, why
there is no public replacement) and re-exported here, so that this binding's other rooms import no private API but
from this module; those only this binding uses are defined here. Oldest torch: 2.5.
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch._compat import (
    AMP_SCALING,
    GRAD_SCALER_WARNING,
    OptState,
    TorchDispatchMode,
    foreach_copy_,
    foreach_mul_,
    init_step_hooks,
    sparse_values,
    step_with_scale,
    takes_grad_scaler,
)

__all__ = [
    "AMP_SCALING", "GRAD_SCALER_WARNING", "SCALAR_READ", "OptState", "TorchDispatchMode", "foreach_copy_",
    "foreach_mul_", "init_step_hooks", "prepared_models", "prepared_optimizers", "sparse_values", "step_with_scale",
    "takes_grad_scaler", "track_step_calls",
]

#: The operator behind every scalar read (``.item()``, ``float(t)``, ``bool(t)``), which
#: :class:`~lossscale.torch.HostSyncCounter` counts without CUDA. No public replacement: the public way to see host
#: syncs, ``torch.cuda.set_sync_debug_mode``, exists only with CUDA (where the counter uses it instead).
SCALAR_READ = torch.ops.aten._local_scalar_dense.default


# accelerate 1.x (``lossscale.torch.integrations.accelerate``); accelerate is imported only when these run.


def prepared_models(accelerator: Any) -> list[Any]:
    """The models ``prepare()`` has wrapped: ``Accelerator._models``. No public accessor: ``prepare()`` returns
    them to the caller, but ``attach`` runs where only the accelerator is at hand."""
    return list(getattr(accelerator, "_models", []))


def prepared_optimizers(accelerator: Any) -> list[Any]:
    """The ``AcceleratedOptimizer`` s ``prepare()`` has made: ``Accelerator._optimizers``. No public accessor (as
    :func:`prepared_models`)."""
    from accelerate.optimizer import AcceleratedOptimizer

    return [opt for opt in getattr(accelerator, "_optimizers", []) if isinstance(opt, AcceleratedOptimizer)]


def track_step_calls(optimizer: Any) -> None:
    """What ``AcceleratedOptimizer.__init__`` sets up when given a scaler: the patched step that sets
    ``_accelerate_step_called`` (``step_was_skipped`` reads it) and the step methods swapped around ``scaler.step``.
    No public replacement: accelerate sets these up only in ``__init__``, before ``attach`` can give it a scaler."""
    from accelerate.optimizer import patch_optimizer_step

    optimizer._accelerate_step_called = False
    optimizer._optimizer_original_step_method = optimizer.optimizer.step
    optimizer._optimizer_patched_step_method = patch_optimizer_step(optimizer, optimizer.optimizer.step)
