"""The binding's passes over the gradients and what decides them: which pass a (fused) inner optimizer gets, and
how its step runs or skips. The passes themselves, shared with Keras on torch, are :mod:`lossscale._torch._kernels`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .._torch._kernels import GradGroups, check_finite, unscale_and_check_
from ._compat import AMP_SCALING, step_with_scale, takes_grad_scaler

if TYPE_CHECKING:
    from ._state import ScaleState

__all__ = ["CheckedGrads", "FusedStateTracker", "check_fused_kernels", "check_step_grads",
           "fused_sgd_skips_half_on_cpu", "hands_scale", "is_fused", "kernel_unscales", "require_unscalable",
           "run_inner_step"]

_SETTING_TYPES = (bool, int, float, str, tuple, type(None))


def hands_scale(inner: torch.optim.Optimizer) -> bool:
    """Whether a fused ``inner`` gets float32 gradients scaled, with ``grad_scale = S`` (``torch.amp.GradScaler``'s
    contract, which an optimizer of your own may rely on), rather than unscaled by the check pass with
    ``grad_scale = None``. torch's own fused optimizers get the latter: their kernels compute the same update from
    either (bit for bit at power-of-two scales), and given ``grad_scale`` they also write the unscaled gradients
    back, one more write over the gradients in the step."""
    return not type(inner).__module__.startswith("torch.optim.")


def is_fused(inner: torch.optim.Optimizer) -> bool:
    """Whether ``inner.step()`` reads ``grad_scale``/``found_inf`` (torch's fused optimizers). One whose ``step``
    takes ``grad_scaler=`` (the older contract) is not: it would ignore them, so it gets unscaled gradients and a
    skip decided on the host (a ``GradScaler`` passes itself to it instead, as torch's does)."""
    return bool(getattr(inner, AMP_SCALING, False)) and not takes_grad_scaler(inner)


class FusedStateTracker:
    """Which parameters of a fused optimizer still lack state: their step is decided on the host.

    A fused kernel skips on the device (it reads ``found_inf``), but a parameter's first step creates its state
    (SGD's momentum buffer is ``empty_like``, filled by the kernel; Adam's moments and step), and a skip decided
    on the device would leave that half-made state behind: the next real step would read garbage. So until every
    parameter with a gradient has state, the step reads the flag on the host (one sync) and a skip calls no
    ``inner.step`` at all.

    Parameters that a real step left stateless (SGD without momentum) are remembered, keyed by their group's
    settings too (``lr`` aside, which schedulers change every step): a changed setting (momentum switched on) may
    make them keep state. An empty state entry counts as none (``optimizer.state`` is a defaultdict, which a mere
    read of ``state[p]`` fills).

    Cost: once every parameter has state, one comparison of counts per step; until then one dict lookup per
    parameter.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forgets what it learned (after a load: the inner state may be another)."""
        self._stateless: set[tuple[int, tuple]] = set()
        self._all_stateful: tuple[Any, int] | None = None  # (state dict, parameter count)
        self._checked_count = -1

    def needs_host_decision(self, inner: torch.optim.Optimizer) -> bool:
        """Whether this step of ``inner`` must be decided on the host: a parameter with a gradient lacks state and
        was not seen stateless after a real step. Checks the fused kernels once per parameter count.

        Raises:
            ValueError: a fused SGD that this torch leaves unchanged (:func:`check_fused_kernels`).
        """
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
        self._stateless |= {key for p, key in _params_without_state(inner) if p.grad is not None}


def _params_without_state(inner: torch.optim.Optimizer) -> Iterable[tuple[torch.Tensor, tuple[int, tuple]]]:
    state = inner.state
    for group in inner.param_groups:
        settings = tuple(sorted((k, v) for k, v in group.items()
                                if k not in ("params", "lr") and isinstance(v, _SETTING_TYPES)))
        for p in group["params"]:
            if not state.get(p):
                yield p, (id(p), settings)


@functools.cache
def fused_sgd_skips_half_on_cpu(dtype: torch.dtype) -> bool:
    """Whether this torch's fused SGD on CPU leaves a 16-element ``dtype`` parameter unchanged (probed once)."""
    p = torch.nn.Parameter(torch.zeros(16, dtype=dtype))
    p.grad = torch.ones_like(p)
    torch.optim.SGD([p], lr=1.0, fused=True).step()
    return bool((p.detach() == 0).any())


def check_fused_kernels(inner: torch.optim.Optimizer) -> None:
    """Refuses a fused SGD with float16/bfloat16 CPU parameters where torch's kernel skips them (torch 2.13).

    Raises:
        ValueError: naming the fix (``foreach=True`` with float32 parameters, or a fused AdamW).
    """
    if not isinstance(inner, torch.optim.SGD):
        return
    for group in inner.param_groups:
        if not group.get("fused"):
            continue
        for p in group["params"]:
            half = p.dtype in (torch.float16, torch.bfloat16)
            if half and p.device.type == "cpu" and p.numel() >= 16 and fused_sgd_skips_half_on_cpu(p.dtype):
                raise ValueError(f"torch {torch.__version__}'s fused SGD on CPU does not update {p.dtype} parameters "
                                 "of 16 or more elements (it leaves them unchanged, with or without loss scaling). "
                                 "Use torch.optim.SGD(..., foreach=True) with float32 parameters under "
                                 "torch.autocast, or torch.optim.AdamW(..., fused=True), whose CPU kernel works.")


def require_unscalable(grads: GradGroups, what: str) -> None:
    """Refuses to unscale float16 gradients in float16 (small values would flush to zero).

    Args:
        grads: the step's gradients.
        what: the call that would unscale them, named in the message (e.g. ``"step()"``).

    Raises:
        ValueError: ``grads`` hold float16 gradients.
    """
    if grads.has_float16:
        broken = ""
        if fused_sgd_skips_half_on_cpu(torch.float16):
            broken = (f" (not SGD(fused=True) on CPU: torch {torch.__version__}'s kernel leaves float16 parameters "
                      "unchanged)")
        raise ValueError(f"Attempting to unscale FP16 gradients. {what} would unscale float16 gradients in float16, "
                         "flushing to zero the small values loss "
                         "scaling exists to keep. Keep float32 parameters and run the model under torch.autocast, "
                         "or use a fused inner optimizer (e.g. torch.optim.AdamW(..., fused=True))"
                         f"{broken} and call step() directly: it unscales inside its float32 kernel.")


def kernel_unscales(grads: GradGroups, *, fused: bool, recheck: bool, contract: bool = True) -> bool:
    """Whether a step leaves the gradients scaled and hands ``grad_scale = S`` to a fused kernel, as
    ``torch.amp.GradScaler`` does: always for float16 gradients (unscaled in float32 inside the kernel); for the
    others with ``contract`` (an optimizer that may rely on torch's contract), unless ``recheck`` (``S`` may be
    below 1, where ``g / S`` can overflow after the check)."""
    return fused and (grads.has_float16 or (contract and not recheck))


class CheckedGrads(NamedTuple):
    """One step's checked gradients: their ``found_inf`` flag, the ``grad_scale`` a fused kernel gets (None: the
    gradients are unscaled already), and whether ``inner`` is ``fused`` (None: not known yet)."""

    found_inf: torch.Tensor
    grad_scale: torch.Tensor | None
    fused: bool | None


def check_step_grads(inner: torch.optim.Optimizer, scale: ScaleState, unscaled: Any = None) -> CheckedGrads | None:
    """Checks the ``.grad`` of ``inner``'s parameters for a step: a fused ``inner`` gets a check only and the
    scaled gradients with ``grad_scale = S``, as ``torch.amp.GradScaler`` gives (its kernel unscales in float32),
    except float32 gradients where :func:`hands_scale` says no (torch's own fused optimizers) or with
    ``min_loss_scale < 1`` (``g / S`` may overflow inside the kernel): unscaled here, ``grad_scale`` None.

    Args:
        inner: the inner optimizer.
        scale: the step's scale (a :class:`~lossscale.torch._state.ScaleState`), moved to the gradients' device.
        unscaled: the optimizer's step progress when ``unscale_()``, a clip or client code checked the gradients
            already (its flag and ``grad_scale`` are taken, nothing is read); None otherwise.

    Returns:
        The :class:`CheckedGrads`, or None when no parameter has a gradient.

    Raises:
        ValueError: float16 gradients an unfused ``inner`` would unscale in float16 (:func:`require_unscalable`).
        RuntimeError: ``unscaled`` holds no flag (client code set the stage alone).

    Cost: one R+W pass over the gradients (two with ``min_loss_scale < 1``); no sync.
    """
    if unscaled is not None:
        if unscaled.found_inf is None:  # a client set the stage through _per_optimizer_states without a flag
            raise RuntimeError("No inf checks were recorded for this optimizer. Set its "
                               "_per_optimizer_states[id(optimizer)]['found_inf_per_device'] along with its "
                               "stage, or call unscale_(optimizer) instead.")
        return CheckedGrads(unscaled.found_inf, unscaled.grad_scale, None)
    fused = is_fused(inner)
    contract = fused and hands_scale(inner)
    grads = GradGroups.of(inner.param_groups)
    if not grads.tensors:
        return None
    unscales = kernel_unscales(grads, fused=fused, recheck=scale.can_go_below_one, contract=contract)
    if not unscales:
        require_unscalable(grads, "step()")
    at = scale.for_step(grads.device)  # the scale follows the gradients
    if unscales:  # the kernel unscales in float32: a check only
        return CheckedGrads(check_finite(grads, out_device=at.device), at.loss_scale, fused)
    return CheckedGrads(unscale_and_check_(grads, at.inv_scale, out_device=at.device, recheck=at.can_go_below_one),
                        None, fused)

def run_inner_step(inner: torch.optim.Optimizer, found_inf: torch.Tensor, grad_scale: torch.Tensor | None,
                   tracker: FusedStateTracker, *, fused: bool | None, on_host: bool, args: tuple = (),
                   kwargs: dict | None = None) -> tuple[bool | None, Any]:
    """Steps ``inner`` or skips it on the agreed ``found_inf``.

    Unfused, a parameter without state (:class:`FusedStateTracker`), or ``on_host``: one host sync reads the flag,
    and a skip calls no ``inner.step``. Otherwise the fused kernel gets ``grad_scale``/``found_inf`` and skips by
    itself, with no sync.

    Args:
        inner: the inner optimizer.
        found_inf: the step's agreed 0-d float32 flag.
        grad_scale: what a fused kernel multiplies by ``1 /`` (None: the gradients are unscaled already).
        tracker: ``inner``'s :class:`FusedStateTracker`.
        fused: whether ``inner`` is fused; None: :func:`is_fused` decides.
        on_host: decide the skip on the host even for a fused ``inner`` (``GradScaler(sync_skips=True)``).
        args, kwargs: ``inner.step``'s arguments.

    Returns:
        ``(skipped, inner.step's result)``; ``skipped`` is None where the kernel decided on the device.
    """
    fused = is_fused(inner) if fused is None else fused
    on_host = on_host or not fused or tracker.needs_host_decision(inner)
    if on_host and bool(found_inf.item()):  # the one host sync of the unfused path
        return True, None
    if on_host and not fused:
        return False, inner.step(*args, **(kwargs or {}))
    result = step_with_scale(inner, grad_scale, found_inf, args, kwargs)
    if on_host:
        tracker.note_host_step(inner)
        return False, result
    return None, result
