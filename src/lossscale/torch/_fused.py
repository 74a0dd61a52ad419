"""Fused inner optimizers: when a skip can be left to the kernel, and which kernels to distrust.

A fused torch optimizer (``fused=True``: Adam, AdamW, SGD, Adagrad) reads
``grad_scale`` and ``found_inf`` in its kernel and skips the update on the
device when ``found_inf`` is 1: no host sync. One case breaks that: a
parameter that has no optimizer state yet. Its step creates the state
(Adam's zero moments; SGD's momentum buffer, made with
``torch.empty_like`` and filled by the kernel), and a step skipped on the
device would leave it behind, garbage in SGD's case. So such a step is
decided on the host (one sync). :class:`FusedStateTracker` keeps track of
which parameters still lack state.

It is usable by anything that steps a torch optimizer (a wrapper, a
GradScaler-style facade): one tracker per inner optimizer, and
``tracker.needs_host_decision(inner)`` before each fused step,
``tracker.note_host_step(inner)`` after a host-decided one ran,
``tracker.reset()`` after the inner optimizer's state was replaced.

:func:`check_fused_kernels` refuses a known-broken kernel: torch's fused SGD
on CPU (seen in torch 2.13) leaves float16 and bfloat16 parameters of 16
or more elements unchanged, even with no scaling at all. It is probed
once per process (a 16-element step), so a fixed torch passes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

from .._torch_compat import supports_amp_scaling

__all__ = ["FusedStateTracker", "check_fused_kernels", "fused_sgd_skips_half_on_cpu", "is_fused"]

_SETTING_TYPES = (bool, int, float, str, tuple, type(None))


def is_fused(inner: torch.optim.Optimizer) -> bool:
    """Whether ``inner.step()`` takes ``grad_scale``/``found_inf`` (torch's fused optimizers)."""
    return supports_amp_scaling(inner)


class FusedStateTracker:
    """Which parameters of one fused optimizer still lack state; whether this step must be decided on the host.

    Parameters that a real step left stateless (SGD without momentum) are
    remembered, keyed by their group's settings too: a changed setting
    (momentum switched on) may make them keep state. An empty state entry
    counts as none (``optimizer.state`` is a defaultdict, which a mere read
    of ``state[p]`` fills).

    Cost: once every parameter has state, one comparison of counts per
    step; until then one dict lookup per parameter.
    """

    def __init__(self) -> None:
        self._stateless: set[tuple[int, tuple]] = set()
        self._all_stateful: tuple[Any, int] | None = None  # (state dict, parameter count): the fast path
        self._checked_count = -1

    def needs_host_decision(self, inner: torch.optim.Optimizer) -> bool:
        """True when a parameter with a gradient has no inner state yet (and was not seen stateless)."""
        state = inner.state
        count = sum(len(group["params"]) for group in inner.param_groups)
        known = self._all_stateful
        if known is not None and known[0] is state and known[1] == count:
            return False
        if count != self._checked_count:
            check_fused_kernels(inner)
            self._checked_count = count
        missing = list(_params_without_state(inner))
        if not missing:
            self._all_stateful = (state, count)
        return any(key not in self._stateless for p, key in missing if p.grad is not None)

    def note_host_step(self, inner: torch.optim.Optimizer) -> None:
        """After a host-decided step ran: parameters with a gradient still without state are stateless."""
        self._stateless.update(key for p, key in _params_without_state(inner) if p.grad is not None)

    def reset(self) -> None:
        """Forget everything (the inner optimizer's state was loaded or replaced)."""
        self._stateless.clear()
        self._all_stateful = None
        self._checked_count = -1


def _params_without_state(inner: torch.optim.Optimizer) -> Iterable[tuple[torch.Tensor, tuple[int, tuple]]]:
    """``(p, (id(p), settings))`` per parameter with no (or an empty) state entry.

    ``settings`` are its group's hyperparameters but ``lr`` (which schedulers
    change every step), as a hashable tuple.
    """
    state = inner.state
    for group in inner.param_groups:
        settings = tuple(
            sorted((k, v) for k, v in group.items() if k not in ("params", "lr") and isinstance(v, _SETTING_TYPES))
        )
        for p in group["params"]:
            if not state.get(p):
                yield p, (id(p), settings)


@functools.cache
def fused_sgd_skips_half_on_cpu(dtype: torch.dtype) -> bool:
    """Whether this torch's fused SGD on CPU fails to update a 16-element ``dtype`` parameter (probed once)."""
    p = torch.nn.Parameter(torch.zeros(16, dtype=dtype))
    p.grad = torch.ones_like(p)
    torch.optim.SGD([p], lr=1.0, fused=True).step()
    return bool((p.detach() == 0).any())


def check_fused_kernels(inner: torch.optim.Optimizer) -> None:
    """Raises ``ValueError`` for a fused SGD with float16/bfloat16 CPU parameters if torch's kernel skips them."""
    if not isinstance(inner, torch.optim.SGD):
        return
    for group in inner.param_groups:
        if not group.get("fused"):
            continue
        for p in group["params"]:
            half = p.dtype in (torch.float16, torch.bfloat16)
            if half and p.device.type == "cpu" and p.numel() >= 16 and fused_sgd_skips_half_on_cpu(p.dtype):
                raise ValueError(
                    f"torch {torch.__version__}'s fused SGD on CPU does not update {p.dtype} parameters of 16 or "
                    "more elements (it leaves them unchanged, with or without loss scaling). Use "
                    "torch.optim.SGD(..., foreach=True) with float32 parameters under torch.autocast, or "
                    "torch.optim.AdamW(..., fused=True), whose CPU kernel works."
                )


def fused_sgd_warning() -> str:
    """A clause for error messages recommending fused optimizers: empty unless fused SGD on CPU is broken here."""
    if fused_sgd_skips_half_on_cpu(torch.float16):
        return f" (not SGD(fused=True) on CPU: torch {torch.__version__}'s kernel leaves float16 parameters unchanged)"
    return ""
