"""The loss scale as torch tensors: policy, state, and the once-per-step update.

:class:`SharedLossScale` owns a :class:`~lossscale.LossScaleState` of 0-d
tensors on one device and advances it with the core rule
(:func:`lossscale.next_state` over ``torch``), in place, so its tensors keep
their addresses (friendly to CUDA graphs). Every
:class:`~lossscale.torch.LossScaleOptimizer` has one. By default it is
private and updated inside ``step()``; pass the same ``SharedLossScale`` to
several optimizers and call :meth:`SharedLossScale.update` once per
iteration to share one scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._policy import LossScale, get, serialize
from .._resolve import resolve_loss_scale
from .._rule import LossScaleState, advance_in_place, initial_state, next_state
from ._grads import move, reciprocal

__all__ = ["SharedLossScale"]


class SharedLossScale:
    """A loss scale that one or more optimizers share.

    Args:
        loss_scale, dynamic, initial_scale, dynamic_growth_steps: the policy,
            in either of TF's forms (see :class:`LossScaleOptimizer`).
        device: where the state lives; by default the device of the first
            gradient it sees.

    Several optimizers driven by one loss::

        scale = SharedLossScale("dynamic")
        opt_a = LossScaleOptimizer(adam, loss_scale=scale)
        opt_b = LossScaleOptimizer(sgd, loss_scale=scale)
        scale.get_scaled_loss(loss).backward()
        opt_a.step()   # checks a's gradients, skips a if they overflowed
        opt_b.step()   # checks b's gradients, skips b if they overflowed
        scale.update() # once per iteration: backs off if either overflowed

    Cost of :meth:`update`: about 20 scalar ops on 0-d tensors, no host sync.
    """

    def __init__(
        self,
        loss_scale: Any = None,
        *,
        dynamic: bool | None = None,
        initial_scale: float | None = None,
        dynamic_growth_steps: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        policy = resolve_loss_scale(
            loss_scale, dynamic=dynamic, initial_scale=initial_scale, dynamic_growth_steps=dynamic_growth_steps
        )
        self._set_policy(policy)
        self._set_state(initial_state(policy, torch, device=device))
        self._pending: torch.Tensor | None = None
        self._stepped: set[int] = set()
        self._private = False

    # ----------------------------------------------------------------- reading

    @property
    def policy(self) -> LossScale:
        """The :class:`~lossscale.LossScale` this scale follows."""
        return self._policy

    @property
    def state(self) -> LossScaleState:
        """The live state tensors (do not modify them)."""
        return self._state

    @property
    def device(self) -> torch.device:
        return self._state.loss_scale.device

    @property
    def can_go_below_one(self) -> bool:
        """Whether the policy lets the scale fall below 1 (``min_loss_scale < 1``)."""
        return self._params.min_scale < 1

    @property
    def loss_scale(self) -> torch.Tensor:
        """The current scale, a 0-d float32 tensor (a copy; no host sync)."""
        return self._state.loss_scale.clone()

    # ----------------------------------------------------------------- scaling

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * S`` in ``loss``'s dtype; a callable becomes a callable.

        The product is formed in at least float32 and rounded once to
        ``loss``'s dtype. Cost: one element-wise op; no host sync.
        """
        if callable(loss) and not isinstance(loss, torch.Tensor):
            return lambda: self.get_scaled_loss(loss())
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                f"get_scaled_loss() takes a tensor or a zero-argument callable returning one, got "
                f"{type(loss).__name__}. Compute the loss with torch before scaling it."
            )
        if not loss.is_floating_point():
            raise TypeError(f"get_scaled_loss() needs a floating-point loss, got dtype {loss.dtype}.")
        scale = self._state.loss_scale
        if scale.device != loss.device:
            scale = move(scale, loss.device)
        return torch.mul(loss, scale).to(loss.dtype)

    def inv_scale(self) -> torch.Tensor:
        """``1 / S`` as float32, computed in float64 (on the host for CPU state: one op instead of three)."""
        views = self._current_host_views()
        if views is not None:
            with np.errstate(over="ignore"):  # 1/S beyond float32 is inf, as on the device
                return torch.from_numpy(np.asarray(1.0 / float(views.loss_scale), dtype=np.float32))
        return reciprocal(self._state.loss_scale)

    # ----------------------------------------------------------------- updating

    def to_(self, device: torch.device) -> None:
        """Moves the state to ``device`` (done for you when gradients move)."""
        if self.device != device:
            self._set_state(LossScaleState(*(t.to(device) for t in self._state)))
            if self._pending is not None:
                self._pending = self._pending.to(device)

    def _record(self, found_inf: torch.Tensor, member: object) -> None:
        """Adds one optimizer's found-inf flag; updates at once when private."""
        if self._private:
            self._advance(found_inf)
            return
        if id(member) in self._stepped:
            raise RuntimeError(
                "step() was called twice on the same optimizer since this SharedLossScale's last update(). "
                "Call shared_scale.update() once per iteration, after every optimizer's step()."
            )
        self._stepped.add(id(member))
        self._pending = found_inf if self._pending is None else self._pending + found_inf

    def update(self) -> None:
        """Advances the scale once for this iteration, from every optimizer's flag.

        An iteration in which any optimizer saw a non-finite gradient counts
        as one non-finite step. Calling it with no step since the last update
        does nothing. No host sync.
        """
        if self._private:
            raise RuntimeError(
                "This loss scale belongs to one LossScaleOptimizer, whose step() updates it. "
                "Only a SharedLossScale passed to several optimizers needs update()."
            )
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        self._stepped.clear()
        self._advance(pending)

    def _advance(self, found_inf: torch.Tensor) -> None:
        """Applies the core rule in place: ``state <- next_state(policy, state, found_inf == 0)``.

        On the GPU (and under ``torch.compile``) the rule runs as about 20
        scalar torch ops on the device. For CPU state it runs on the host
        (:func:`lossscale._rule.advance_in_place`) on numpy views of the same
        memory: identical arithmetic (float32 and int32, the same function),
        about 10 microseconds instead of about 30, and no sync, since CPU
        tensors have no queue to wait for.
        """
        found_inf = move(found_inf, self.device)
        views = self._current_host_views()
        if views is not None:
            advance_in_place(self._params, views, float(found_inf.detach().numpy()) == 0.0)
            return
        new = next_state(self._params, self._state, found_inf == 0, torch)
        with torch.no_grad():
            torch._foreach_copy_(list(self._state), list(new))

    # ----------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The policy config and copies of the state tensors."""
        return {
            "loss_scale": serialize(self._policy),
            "state": {name: tensor.detach().clone() for name, tensor in self._state._asdict().items()},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output, policy included."""
        try:
            policy = get(state_dict["loss_scale"])
            saved = state_dict["state"]
            tensors = [torch.as_tensor(saved[name]).clone() for name in LossScaleState._fields]  # never the caller's
        except (KeyError, TypeError) as error:
            raise ValueError(
                f"Not a lossscale state dict (missing or malformed {error}); pass what state_dict() returned."
            ) from error
        if policy is None:
            raise ValueError("The state dict holds no loss scale policy.")
        self._set_policy(policy)
        dtypes = [torch.float32] + [torch.int32] * 4
        self._set_state(LossScaleState(*(t.to(self.device, dtype) for t, dtype in zip(tensors, dtypes))))
        self._pending = None
        self._stepped.clear()

    def _set_state(self, state: LossScaleState) -> None:
        self._state = state
        self._host_views: LossScaleState | None = None
        self._host_pointers: tuple[int, ...] = ()

    def _current_host_views(self) -> LossScaleState | None:
        """Numpy views sharing the CPU state tensors' memory, or None off the CPU and under ``torch.compile``.

        Made once and remade if a tensor's storage was swapped (``.data =``);
        checking costs five pointer reads.
        """
        if self._state.loss_scale.device.type != "cpu" or torch.compiler.is_compiling():
            return None
        pointers = tuple(t.data_ptr() for t in self._state)
        if self._host_views is None or pointers != self._host_pointers:
            self._host_views = LossScaleState(*(t.detach().numpy() for t in self._state))
            self._host_pointers = pointers
        return self._host_views

    def _set_policy(self, policy: LossScale) -> None:
        self._policy = policy
        self._params = policy.rule_params()

    def __getstate__(self) -> dict[str, Any]:
        return {"state_dict": self.state_dict(), "private": self._private}

    def __setstate__(self, state: dict[str, Any]) -> None:
        saved = state["state_dict"]
        self._set_state(initial_state(get(saved["loss_scale"]), torch, device=saved["state"]["loss_scale"].device))  # type: ignore[arg-type]
        self._pending = None
        self._stepped = set()
        self._private = state["private"]
        self.load_state_dict(saved)

    def __repr__(self) -> str:
        return f"SharedLossScale({self._policy!r})"

