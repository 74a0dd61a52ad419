"""One step, per backend: unscale, check, apply or skip, advance the scale.

Every function takes what it works on as arguments (the :class:`ScaleState`,
the inner optimizer, the variables); none reads the optimizer's attributes.
The tf.distribute form lives in :mod:`._distribute`.

Keras' own class calls the stateful inner ``apply`` inside ``lax.cond`` on
JAX, which leaks tracers into the variables in an eager JAX loop; here the JAX
step is computed statelessly and the results are assigned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from ._backend import no_grad
from ._grads import all_finite, unscale
from ._state import ScaleState

__all__ = [
    "apply_step",
    "check_apply_args",
    "check_stateless_args",
    "jax_apply",
    "stateless_step",
    "torch_apply",
    "unscale_and_check",
]


def _keep(variables: Sequence[Any]) -> list[bool]:
    return [getattr(v, "overwrite_with_gradient", False) for v in variables]


def unscale_and_check(
    grads: list[Any], variables: Sequence[Any], scale: Any, already: bool, scale_at_least_one: bool
) -> tuple[list[Any], Any]:
    """The gradients times ``1/scale`` (unless ``already`` unscaled) and whether all are finite (0-d bool).

    With ``scale_at_least_one`` (the policy keeps ``S >= 1``) the check reads
    the scaled gradients instead: ``0 < 1/S <= 1`` in float32, so ``g * (1/S)``
    is finite exactly when ``g`` is (no overflow, NaN and Inf stay), and the
    check no longer waits for the multiply (under ``jit`` the multiply then
    happens only inside the update).
    """
    unscaled = grads if already else unscale(grads, scale, _keep(variables))
    return unscaled, all_finite(grads if scale_at_least_one else unscaled)


def apply_step(state: ScaleState, inner: Any, grads: list[Any], variables: list[Any], already: bool) -> None:
    """The stateful step (TensorFlow without a strategy, torch): ``inner.apply`` in the taken branch only.

    On TensorFlow the scale rule runs inside each branch with its flag a
    constant (as in :func:`stateless_step`), unless ``stats_every`` or an
    observer needs the flag itself. Cost: one multiply and one read pass over
    the gradients; host syncs: none under ``tf.function``, two in eager
    TensorFlow (the check's ``cond``, the branch). On torch, where the branch is a Python ``if`` anyway, the
    step is :func:`torch_apply`.
    """
    with no_grad():
        if keras.backend.backend() == "torch":
            torch_apply(state, inner, grads, variables, already)
            return
        current = state.read()
        unscaled, finite = unscale_and_check(grads, variables, current.loss_scale, already, state.at_least_one)
        measured = state.measure(grads, variables, current.loss_scale, already)
        if measured is not None or state.observer.active:
            ops.cond(finite, lambda: inner.apply(unscaled, variables), lambda: None)
            state.finish(current, finite, measured)
            return

        def apply_and_advance() -> None:
            inner.apply(unscaled, variables)
            state.assign(state.next_values(current, True))

        ops.cond(finite, apply_and_advance, lambda: state.assign(state.next_values(current, False)))


def torch_apply(state: ScaleState, inner: Any, grads: list[Any], variables: list[Any], already: bool) -> None:
    """The eager step on the torch backend: torch's multi-tensor kernels, the branch and the rule on the host.

    Scaled gradients are unscaled into new tensors and those are checked, with
    the kernels behind :class:`lossscale.torch.GradScaler`
    (``lossscale._torch_kernels.unscaled_copies``: one multi-tensor call each
    per (device, dtype)); the caller's tensors are only read. Gradients that
    already went through ``get_unscaled_gradients``, and those of variables
    Keras overwrites with their "gradient", are checked as they are. The
    branch is a Python ``if`` (one host sync, on the found-inf flag); then
    :meth:`ScaleState.finish_host` runs the rule on the host, or, with
    ``stats_every``, :meth:`ScaleState.finish` runs it (with the statistics)
    on the device.

    Cost: two passes over the gradients (R+W each: the multiply into new
    tensors, then the check of the copies); one host sync.
    """
    import torch

    from .._torch_kernels import combine_flags, reciprocal, unscaled_copies

    scale = state.variables[0].value
    measured = state.measure(grads, variables, ops.convert_to_tensor(scale), already)
    before = None if measured is None else state.read()
    as_given = [already or k for k in _keep(variables)]
    flags: list[Any] = []
    copies = unscaled_copies([None if a else g for g, a in zip(grads, as_given)], reciprocal(scale), flags)
    unscaled = [g if a else u for g, u, a in zip(grads, copies, as_given)]
    read = [g for g, a in zip(grads, as_given) if a and g is not None]  # the caller's: checked without a write
    found = combine_flags(flags, scale.device)
    finite = not bool(found) and (not read or bool(all_finite(read)))
    if finite:
        inner.apply(unscaled, variables)
    if before is None:
        state.finish_host(finite)
    else:
        state.finish(before, torch.as_tensor(finite, device=scale.device), measured)


def check_apply_args(grads: list[Any], given: Sequence[Any] | None, built: bool, trainable: Sequence[Any]) -> list[Any]:
    """The variables an ``apply`` updates (``given``, else those built with), checked against the gradients."""
    if given is None and not built:
        raise ValueError(
            "apply(grads) without trainable_variables needs a built optimizer: pass the variables, "
            "or call optimizer.build(model.trainable_variables) first."
        )
    variables = list(trainable if given is None else given)
    if len(grads) != len(variables):
        raise ValueError(f"Got {len(grads)} gradients for {len(variables)} variables; pass one per variable.")
    return variables


def check_stateless_args(
    built: bool, values: Sequence[Any], variables: Sequence[Any], weights: Sequence[Any], trainable: Sequence[Any]
) -> None:
    """Raises unless ``stateless_apply`` runs off TensorFlow, with one value per optimizer and trainable variable."""
    if keras.backend.backend() == "tensorflow":
        raise ValueError(
            "stateless_apply is not supported with the TensorFlow backend (as it is incompatible with "
            "tf.distribute): use apply() or apply_gradients()."
        )
    if not built:
        raise ValueError(
            "stateless_apply needs a built optimizer: call optimizer.build(model.trainable_variables) first."
        )
    if len(values) != len(variables) or len(weights) != len(trainable):
        raise ValueError(
            f"stateless_apply takes one value per optimizer variable ({len(variables)}, got {len(values)}) and "
            f"per trainable variable it was built with ({len(trainable)}, got {len(weights)})."
        )


def stateless_step(
    state: ScaleState,
    inner: Any,
    own_variables: Sequence[Any],
    trainable_variables: Sequence[Any],
    optimizer_values: Sequence[Any],
    grads: list[Any],
    trainable_values: Sequence[Any],
    already: bool,
) -> tuple[list[Any], list[Any]]:
    """New weights and optimizer values for one step, without touching a variable.

    ``own_variables`` are the wrapper's (its iteration counter, the scale
    state), listed before the inner optimizer's in ``optimizer_values``. The
    inner optimizer's ``stateless_apply`` runs in the taken branch of
    ``ops.cond`` (``lax.cond`` on JAX), the other branch returns the values
    unchanged. The scale rule runs inside each branch with its flag a
    constant (True in the taken branch, False in the other), so that XLA folds
    it to the few scalar ops that branch needs; with ``stats_every`` or an
    observer on (their inputs are the flag and the sample), it runs once
    before the branch, inside a ``keras.StatelessScope``.
    """
    own = len(own_variables)
    mapping = list(zip(list(own_variables) + list(inner.variables), optimizer_values))
    with keras.StatelessScope(state_mapping=mapping) as scope:
        current = state.read()
        # The scaled gradients when 1/S <= 1 (see unscale_and_check); under jit the unscale in ``step`` fuses anyway.
        checked = grads if already or state.at_least_one else unscale(grads, current.loss_scale, _keep(trainable_variables))
        finite = all_finite(checked)
        measured = state.measure(grads, trainable_variables, current.loss_scale, already)
        branched = measured is None and not state.observer.active
        if not branched:
            state.finish(current, finite, measured)
    new_own = [scope.get_current_value(v) for v in own_variables]
    inner_values = [ops.convert_to_tensor(x, v.dtype) for x, v in zip(optimizer_values[own:], inner.variables)]
    weights = [ops.convert_to_tensor(x, v.dtype) for x, v in zip(trainable_values, trainable_variables)]
    positions = [[id(o) for o in own_variables].index(id(v)) for v in state.variables]

    def own_after(flag: bool) -> list[Any]:
        values = list(new_own)
        if branched:
            for position, value in zip(positions, state.next_values(current, flag)):
                values[position] = value
        return values

    def step() -> tuple[list[Any], list[Any], list[Any]]:
        # Unscaled again inside the branch (not passed in), so that XLA fuses the multiply into the check
        # above and into the inner update here instead of writing the unscaled gradients out.
        again = grads if already else unscale(grads, current.loss_scale, _keep(trainable_variables))
        new_weights, new_inner = inner.stateless_apply(inner_values, again, weights)
        return list(new_weights), list(new_inner), own_after(True)

    def skip() -> tuple[list[Any], list[Any], list[Any]]:
        return weights, inner_values, own_after(False)

    new_weights, new_inner, new_own = ops.cond(finite, step, skip)
    return list(new_weights), list(new_own) + list(new_inner)


def jax_apply(
    state: ScaleState,
    inner: Any,
    own_variables: Sequence[Any],
    trainable_variables: Sequence[Any],
    cache: dict[bool, Any],
    grads: list[Any],
    variables: list[Any],
    already: bool,
) -> None:
    """``apply`` on JAX: :func:`stateless_step` compiled once per contract (``cache``), then assigned.

    Host syncs: none in the step; the stall guard raises
    :class:`lossscale.LossScaleError` here, after the step, from the host.
    """
    import jax

    known = {id(v) for v in trainable_variables}
    for variable in variables:
        if id(variable) not in known:  # Keras' own error; otherwise its gradient would be dropped silently
            raise ValueError(
                f"Unknown variable: {variable}. This optimizer can only be called for the variables it was "
                "originally built with. For a new set of variables, build a new optimizer."
            )
    by_id = {id(v): g for v, g in zip(variables, grads)}
    full = [by_id.get(id(v)) for v in trainable_variables]
    all_variables = list(own_variables) + list(inner.variables)
    step = cache.get(already)
    if step is None:

        def pure(o: Any, g: Any, t: Any) -> Any:
            return stateless_step(state, inner, own_variables, trainable_variables, o, g, t, already)

        step = cache[already] = jax.jit(pure)
    with state.observer.deferred():
        new_trainable, new_optimizer = step(
            [v.value for v in all_variables], full, [v.value for v in trainable_variables]
        )
    for variable, value in zip(trainable_variables, new_trainable):
        variable.assign(value)
    for variable, value in zip(all_variables, new_optimizer):
        variable.assign(value)
