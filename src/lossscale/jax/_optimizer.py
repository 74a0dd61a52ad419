"""``loss_scale_optimizer``: TF's ``LossScaleOptimizer`` as an optax transformation."""

from __future__ import annotations

from typing import Any, Hashable

import jax
import jax.numpy as jnp
import optax
from jax import lax

from .._resolve import resolve_loss_scale
from .._rule import initial_state, next_state
from ._grads import all_finite, check_gradients, unscale
from ._state import LossScaleOptimizerState, _is_scale_node

__all__ = ["loss_scale_optimizer"]


def _axis_names(axis_name: Any) -> tuple[Hashable, ...] | None:
    if axis_name is None:
        return None
    if isinstance(axis_name, str):
        return (axis_name,)
    if isinstance(axis_name, (tuple, list)) and axis_name and all(isinstance(a, str) for a in axis_name):
        return tuple(axis_name)
    raise TypeError(
        f"axis_name must be a str or a tuple of str naming pmap/shard_map axes, got {axis_name!r}. "
        "Use the axis_name you gave jax.pmap, or the mesh axes of jax.shard_map; leave it None under jit."
    )


def _varying_axes(aval: Any) -> frozenset:
    """The shard_map axes over which a value varies (empty outside shard_map and on old JAX)."""
    manual = getattr(aval, "manual_axis_type", None)  # JAX >= 0.9
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", None) or ())  # JAX 0.6 - 0.8


def _like(x: Any, aval: Any) -> Any:
    """``x`` marked as varying over the same shard_map axes as ``aval``, so both cond branches agree."""
    typeof = getattr(jax, "typeof", None) or jax.core.get_aval
    missing = _varying_axes(aval) - _varying_axes(typeof(x))
    if not missing:
        return x
    axes = tuple(sorted(missing))
    return lax.pcast(x, axes, to="varying") if hasattr(lax, "pcast") else lax.pvary(x, axes)


def loss_scale_optimizer(
    inner: optax.GradientTransformation,
    loss_scale: Any = None,
    *,
    dynamic: bool | None = None,
    initial_scale: float | None = None,
    dynamic_growth_steps: int | None = None,
    axis_name: str | tuple[str, ...] | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` in loss scaling; TF's ``LossScaleOptimizer`` for optax.

    Loss scaling multiplies the loss by ``S`` before differentiation and the
    gradients by ``1/S`` before the update, so that float16 gradients below
    about 6e-8 do not flush to zero (Micikevicius et al., 2018, "Mixed
    Precision Training"). ``update(grads, state, params)`` takes the
    gradients of the **scaled** loss, that is ``jax.grad`` of
    ``get_scaled_loss(loss, state)``, and computes, with ``g`` those
    gradients::

        u = g * (1 / S)                        # each leaf in its own dtype
        finite = all(isfinite(u))              # NaN and +-Inf alike
        if finite:  updates, inner_state = inner.update(u, inner_state, params)
        else:       updates, inner_state = zeros, inner_state      # skipped
        S, counters = lossscale.next_state(policy, S, counters, finite)

    A non-finite step is skipped in every mode, fixed scales included (use
    ``loss_scale=1`` for skip-only, e.g. with bfloat16). The branch is a
    ``lax.cond``, so a skipped step costs no inner update and leaves the
    inner state (Adam's moments and count) bit for bit as it was.

    Args:
        inner: the optax transformation that receives the unscaled gradients,
            e.g. ``optax.adamw(1e-3)``. Put gradient clipping *inside* it
            (``optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))``)
            so that it sees the true gradients.
        loss_scale: the experimental form: a number (fixed scale),
            ``"dynamic"``, any :class:`lossscale.LossScale` (managers
            included) or its ``lossscale.serialize`` dict.
        dynamic: the stable form (default True).
        initial_scale: the initial (or, when ``dynamic=False``, fixed) scale;
            default 2**15.
        dynamic_growth_steps: finite steps before the scale doubles; default 2000.
        axis_name: under ``jax.pmap`` or ``jax.shard_map``, the axis name (or
            names) over which the finite flag is reduced (``lax.pmin``), so
            that every device skips or steps together when devices hold
            different gradients. Not needed under ``jit`` with sharded arrays,
            where the check is already global, nor after a ``lax.pmean`` of
            the gradients, which spreads any NaN or Inf.

    Returns:
        An ``optax.GradientTransformationExtraArgs``; extra keyword arguments
        of ``update`` go to ``inner``. Its state is a
        :class:`LossScaleOptimizerState`; the policy is not in it but in the
        transformation, so it cannot be lost on flatten, ``tree_map`` or
        restore. Keep ``lossscale.serialize(policy)`` with your config to
        rebuild the same transformation.

    Raises:
        TypeError, ValueError: as ``lossscale.torch.LossScaleOptimizer`` for
            the scale arguments (both forms at once, a bad policy), and for an
            ``inner`` that is not an optax transformation.

    Cost per ``update`` under ``jit``: one read pass over the gradients for
    the check (the ``1/S`` multiply is fused into the reduction), and the
    multiply fused again into ``inner``'s element-wise update inside the
    taken branch; the ``lax.cond`` boundary materializes the updates (one
    write pass). The scale update is about 20 scalar ops. No host sync
    anywhere: the whole training step can be jitted.

    If you unscale the gradients yourself (to clip them, log them, or in
    code ported from TF's ``get_unscaled_gradients`` + ``apply_gradients``
    loop), don't pass the unscaled ones to ``update``: it would unscale them
    again. Clip inside ``inner``; for logging call
    :func:`get_unscaled_gradients` on the side and pass the scaled gradients
    to ``update`` (under ``jit`` XLA computes the product once).

    >>> import jax, jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> opt = lsj.loss_scale_optimizer(optax.sgd(0.5), "dynamic")
    >>> state = opt.init(params)
    >>> loss = lambda p: jnp.sum(p["w"] ** 2)
    >>> grads = jax.grad(lambda p: lsj.get_scaled_loss(loss(p), state))(params)
    >>> updates, state = jax.jit(opt.update)(grads, state, params)
    >>> optax.apply_updates(params, updates)["w"]
    Array([0., 0.], dtype=float32)
    >>> bad = {"w": jnp.array([jnp.inf, 0.0])}
    >>> updates, state = opt.update(bad, state, params)      # skipped, scale halves
    >>> updates["w"], float(state.loss_scale), int(state.skipped_steps)
    (Array([0., 0.], dtype=float32), 16384.0, 1)
    """
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        raise TypeError(
            f"inner must be an optax.GradientTransformation, got {type(inner).__name__}. "
            "Build the optimizer first, e.g. loss_scale_optimizer(optax.adamw(1e-3))."
        )
    policy = resolve_loss_scale(
        loss_scale, dynamic=dynamic, initial_scale=initial_scale, dynamic_growth_steps=dynamic_growth_steps
    )
    params_of_rule = policy.rule_params()
    axes = _axis_names(axis_name)
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: Any) -> LossScaleOptimizerState:
        inner_state = inner.init(params)
        if any(_is_scale_node(n) for n in jax.tree_util.tree_leaves(inner_state, is_leaf=_is_scale_node)):
            raise TypeError(
                "inner already holds a loss_scale_optimizer; nesting them would scale and unscale twice. "
                "Wrap the plain optimizer once: loss_scale_optimizer(optax.adamw(...))."
            )
        return LossScaleOptimizerState(inner_state, initial_state(params_of_rule, jnp))

    def update_fn(
        updates: Any, state: LossScaleOptimizerState, params: Any = None, **extra_args: Any
    ) -> tuple[Any, LossScaleOptimizerState]:
        if not isinstance(state, LossScaleOptimizerState):
            raise TypeError(
                f"update() needs the LossScaleOptimizerState that init()/update() returned, got "
                f"{type(state).__name__}. Pass this transformation's own state, not the inner optimizer's."
            )
        check_gradients(updates)
        scale_state = state.loss_scale_state
        scale = scale_state.loss_scale
        finite = all_finite(unscale(updates, scale))
        if axes is not None:
            finite = lax.pmin(finite.astype(jnp.int32), axes) > 0

        def step(operands: Any) -> Any:
            grads, inner_state, params = operands
            return inner.update(unscale(grads, scale), inner_state, params, **extra_args)

        def skip(operands: Any) -> Any:
            _, inner_state, _ = operands
            # The true branch's output types, traced (not run) so that the zeros match them exactly,
            # shard_map's varying axes included.
            closed, shapes = jax.make_jaxpr(step, return_shape=True)(operands)
            out_avals = closed.out_avals
            updates_def = jax.tree_util.tree_structure(shapes[0])
            zeros_avals, state_avals = out_avals[: updates_def.num_leaves], out_avals[updates_def.num_leaves :]
            zeros = [_like(jnp.zeros(a.shape, a.dtype), a) for a in zeros_avals]
            kept = [_like(jnp.asarray(x, a.dtype), a) for x, a in zip(jax.tree_util.tree_leaves(inner_state), state_avals)]
            return (
                jax.tree_util.tree_unflatten(updates_def, zeros),
                jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(inner_state), kept),
            )

        new_updates, new_inner = lax.cond(finite, step, skip, (updates, state.inner_state, params))
        new_scale_state = next_state(params_of_rule, scale_state, finite, jnp)
        return new_updates, LossScaleOptimizerState(new_inner, new_scale_state)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
