"""``loss_scale_optimizer``: TF's ``LossScaleOptimizer`` as an optax transformation."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax

from .._resolve import resolve_loss_scale
from .._rule import initial_state
from ._compat import eval_jaxpr_choosing, like
from ._grads import all_finite, check_gradients, squared_norm, unscale
from ._guard import check_limit, guard_skip
from ._record import recorder_for
from ._state import LossScaleOptimizerState, _is_scale_node
from ._stats import _reduce_across, check_stats_every, init_stats, measure, step_scale

__all__ = ["loss_scale_optimizer", "stepper_of"]

#: ``update`` function of each transformation built here -> its stepper (for :func:`apply_gradients`).
_STEPPERS: weakref.WeakKeyDictionary[Callable, Callable] = weakref.WeakKeyDictionary()


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


def _check_max_norm(max_norm: Any) -> float | None:
    if max_norm is None:
        return None
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0 or max_norm == float("inf"):
        raise ValueError(
            f"clip_by_global_norm must be a positive finite number (the largest global norm of the true "
            f"gradients), or None, got {max_norm!r}."
        )
    return float(max_norm)


def _chosen(finite: jax.Array, update: Callable, operands: Any, olds: Any) -> Any:
    """``update(*operands)`` where ``finite``, else ``olds`` (None: zeros shaped like that output), leaf by leaf.

    ``update`` is traced once, to a jaxpr, and evaluated with each output
    leaf chosen by ``jnp.where(finite, new, old)`` as soon as it is computed
    (:func:`~lossscale.jax._compat.eval_jaxpr_choosing`): the equations after
    it, e.g. Adam's parameter update reading the new moments, read the chosen
    value. Under ``jit`` XLA then fuses each choice into the element-wise
    kernel that computes the value and writes every output once, in place
    when the buffers are donated, so the skip costs no pass over the state of
    its own. (A choice made only at the end leaves the parameter update
    reading the moments' new values while they are written in place, and
    XLA copies the moments first; a ``lax.cond`` copies its operands when
    they are not donated, or its results when they are.) On a skipped step
    the update is computed and thrown away; its NaN never reaches an output.
    """
    flat, in_tree = jax.tree_util.tree_flatten(operands)
    closed, shapes = jax.make_jaxpr(
        lambda *xs: update(*jax.tree_util.tree_unflatten(in_tree, xs)), return_shape=True
    )(*flat)
    out_tree = jax.tree_util.tree_structure(shapes)
    old_first, old_rest = olds
    first_tree, rest_tree = out_tree.children()
    if jax.tree_util.tree_structure(old_rest) != rest_tree:
        raise TypeError(
            "The inner optimizer's update() returned a state whose structure differs from the state it was "
            f"given ({rest_tree} vs {jax.tree_util.tree_structure(old_rest)}); a skipped step could not keep "
            "the old state. Use an optax transformation whose update returns the state in the shape init() made."
        )
    old_leaves = (
        [None] * first_tree.num_leaves if old_first is None else jax.tree_util.tree_leaves(old_first)
    ) + jax.tree_util.tree_leaves(old_rest)
    avals = closed.out_avals
    for old, aval in zip(old_leaves, avals):
        if old is not None and tuple(jnp.shape(old)) != tuple(aval.shape):
            raise TypeError(
                f"The inner optimizer's update() returned a state leaf of shape {tuple(aval.shape)} for one of "
                f"shape {tuple(jnp.shape(old))}; a skipped step could not keep the old state. Use an optax "
                "transformation whose update returns the state in the shape init() made."
            )

    def choose(i: int, new: Any) -> Any:
        aval = avals[i]
        old = old_leaves[i]
        kept = jnp.zeros((), aval.dtype) if old is None else jnp.asarray(old)
        return like(jnp.where(finite, new, kept).astype(aval.dtype), aval)

    out = eval_jaxpr_choosing(closed, flat, choose)
    return jax.tree_util.tree_unflatten(out_tree, out)


def loss_scale_optimizer(
    inner: optax.GradientTransformation,
    loss_scale: Any = None,
    *,
    dynamic: bool | None = None,
    initial_scale: float | None = None,
    dynamic_growth_steps: int | None = None,
    min_loss_scale: float | None = None,
    max_loss_scale: float | None = None,
    hysteresis: int | None = None,
    max_consecutive_skips: int | None = None,
    history: Any = None,
    axis_name: str | tuple[str, ...] | None = None,
    clip_by_global_norm: float | None = None,
    stats_every: int | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` in loss scaling; TF's ``LossScaleOptimizer`` for optax.

    Loss scaling multiplies the loss by ``S`` before differentiation and the
    gradients by ``1/S`` before the update, so that float16 gradients below
    about 6e-8 do not flush to zero (Micikevicius et al., 2018, "Mixed
    Precision Training"). ``update(grads, state, params)`` takes the
    gradients of the **scaled** loss, that is ``jax.grad`` of
    ``get_scaled_loss(loss, state)``, and computes, with ``g`` those
    gradients::

        finite = all(isfinite(g))              # NaN and +-Inf alike (of g / S when S may be < 1)
        u = g * (1 / S)                        # each leaf in its own dtype
        u = u * min(1, max_norm / norm(u))     # only with clip_by_global_norm
        new_updates, new_inner = inner.update(u, inner_state, params)
        updates = where(finite, new_updates, 0)                # leaf by leaf
        inner_state = where(finite, new_inner, inner_state)
        S, counters = lossscale.next_state(policy, S, counters, finite)

    A non-finite step is skipped in every mode, fixed scales included (use
    ``loss_scale=1`` for skip-only, e.g. with bfloat16): its updates are
    zero and the inner state (Adam's moments and count) is bit for bit what
    it was. The skip is a ``jnp.where`` on each output of ``inner.update``,
    made as soon as that output is computed, so that the inner update's own
    later reads (Adam's step reading its new moments) see the chosen value:
    XLA then fuses every choice into the kernel that computes it, and the
    skip adds no pass over the state, with or without donated buffers (a
    ``lax.cond`` would copy the state, its operands when they are not
    donated or its results when they are). The inner update runs, and is
    thrown away, on a skipped step too (host callbacks inside ``inner``,
    such as ``jax.debug.print``, run on every step).

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
        min_loss_scale: the floor of a dynamic scale (default 1).
        max_loss_scale: the ceiling of a dynamic scale (default None: none).
        hysteresis: non-finite steps before a dynamic scale backs off
            (default 1, TF's). These three refine the stable form's dynamic
            scale or ``loss_scale="dynamic"``; a policy object carries its own.
        axis_name: under ``jax.pmap`` or ``jax.shard_map``, the axis name (or
            names) over which the finite flag is reduced (``lax.pmin``), so
            that every device skips or steps together when devices hold
            different gradients. Not needed under ``jit`` with sharded arrays,
            where the check is already global, nor after a ``lax.pmean`` of
            the gradients, which spreads any NaN or Inf.
        clip_by_global_norm: clip the *true* (unscaled) gradients to this
            global norm before ``inner`` sees them, as
            ``optax.clip_by_global_norm`` inside ``inner`` would. The norm
            (``sqrt(sum((g/S)**2))`` in float32) also serves as the finite
            check, so clipping adds no pass over the gradients; the factor
            ``min(1, max_norm / norm)`` is folded into the ``1/S`` multiply.
            Never put a clip *before* this transformation in an
            ``optax.chain``: it would clip the scaled gradients
            (:func:`get_scaled_loss` and :func:`value_and_grad` raise when
            they see that order in the state).
        max_consecutive_skips: raise :class:`lossscale.LossScaleError`, with
            likely causes and fixes, from the jitted step in which the
            ``N``-th step in a row is skipped (default None: never). It is a
            ``jax.debug.callback`` behind a ``lax.cond`` on the streak, which
            only a skipped step reaches: a finite step runs no host code and
            adds no sync.
            JAX re-raises it wrapped in its runtime error (the message is
            kept) when the step's results are next read, on CPU at once.
        history: a :class:`lossscale.History` that gets one row per step
            (step number, the scale the step used, whether it was skipped;
            the loss, which ``update`` does not see, as NaN). Default None:
            nothing recorded and nothing staged. Cost when given: one
            ``jax.debug.callback`` per step (two scalars to the host and a
            Python call there; see ``lossscale.jax._record.StepRecorder``).
            Under ``pmap``/``shard_map`` pass ``axis_name`` (the first
            device records); under ``jit`` over several processes the
            process holding device 0 records.
        stats_every: measure the scaled gradients every ``N``-th update
            (default None: never; 16 with ``loss_scale="auto"``): per tensor
            and overall ``amax``, ``headroom_bits = log2(65504 / amax)``,
            the share of exact zeros and of float16 subnormals
            (:mod:`lossscale._stats`). The latest sample is
            ``state.gradient_stats`` (arrays, on the device), and
            ``lossscale.AutoLossScale`` sets the scale from it.
            Cost: on a sampled step four reductions of each gradient (one
            variadic reduction for a large one; with ``N=1`` and no clip
            they also give the finite flag); otherwise a ``lax.cond``. Measured
            (``benchmarks/bench_stats.py``, 2-core CPU, Adam MLP): 1M
            parameters 1.27x the step at ``N=1``, 1.03x at ``N=16``; 10M
            1.14x and 1.00x. The step compiles once; no host sync.

    Returns:
        An ``optax.GradientTransformationExtraArgs``; extra keyword arguments
        of ``update`` go to ``inner``. Its state is a
        :class:`LossScaleOptimizerState`; the policy is not in it but in the
        transformation, so it cannot be lost on flatten, ``tree_map`` or
        restore. Keep ``lossscale.serialize(policy)`` with your config to
        rebuild the same transformation.

    Raises:
        TypeError, ValueError: as ``lossscale.torch.LossScaleOptimizer`` for
            the scale arguments (both forms at once, a bad policy) and
            ``max_consecutive_skips``, and for an ``inner`` that is not an
            optax transformation, a ``clip_by_global_norm`` that is not a
            positive number, or a ``history`` that is not a
            :class:`lossscale.History`.

    Cost per ``update`` under ``jit``: one read pass over the gradients for
    the check (:func:`all_finite`: one sum, with the exact check in a
    ``lax.cond`` only when the sum is not finite); the ``1/S`` multiply and
    the skip's choices are fused into ``inner``'s element-wise update, and
    the updates into the caller's ``optax.apply_updates``. Measured in XLA's
    compiled program (``benchmarks/bench_jax.py --passes-only``, Adam): plain
    optax's passes over the state plus the one read of the gradients, and no
    copy, donated or not. The scale update is about 20 scalar ops. No host
    sync anywhere: the whole training step can be jitted. ``inner.update``
    is traced once per trace of ``update``.

    If you unscale the gradients yourself (to clip them, log them, or in
    code ported from TF's ``get_unscaled_gradients`` + ``apply_gradients``
    loop), don't pass the unscaled ones to ``update``: it would unscale them
    again. Clip with ``clip_by_global_norm=`` (or inside ``inner``); for logging call
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
        loss_scale,
        dynamic=dynamic,
        initial_scale=initial_scale,
        dynamic_growth_steps=dynamic_growth_steps,
        min_loss_scale=min_loss_scale,
        max_loss_scale=max_loss_scale,
        hysteresis=hysteresis,
    )
    rule = policy.rule_params()
    axes = _axis_names(axis_name)
    max_norm = _check_max_norm(clip_by_global_norm)
    limit = check_limit(max_consecutive_skips)
    recorder = recorder_for(history)
    every = check_stats_every(stats_every, policy)
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: Any) -> LossScaleOptimizerState:
        inner_state = inner.init(params)
        if any(_is_scale_node(n) for n in jax.tree_util.tree_leaves(inner_state, is_leaf=_is_scale_node)):
            raise TypeError(
                "inner already holds a loss_scale_optimizer; nesting them would scale and unscale twice. "
                "Wrap the plain optimizer once: loss_scale_optimizer(optax.adamw(...))."
            )
        stats = None if every is None else init_stats(policy, params)
        return LossScaleOptimizerState(inner_state, initial_state(rule, jnp), stats)

    def stepper(grads: Any, state: Any, params: Any, extra_args: dict, apply: bool) -> tuple[Any, Any]:
        if not isinstance(state, LossScaleOptimizerState):
            raise TypeError(
                f"update() needs the LossScaleOptimizerState that init()/update() returned, got "
                f"{type(state).__name__}. Pass this transformation's own state, not the inner optimizer's."
            )
        leaves = check_gradients(grads)
        scale_state = state.loss_scale_state
        scale = jnp.asarray(scale_state.loss_scale)
        sample = None
        if max_norm is None and every == 1 and state.stats is not None and rule.min_scale >= 1:
            # One pass: the statistics' max |g| is NaN or Inf iff a scaled gradient is, and with S >= 1
            # the unscaled ones are finite iff the scaled ones are.
            factor = None
            sample = measure(leaves, jnp.asarray(state.stats.count), None)
            finite = jnp.isfinite(sample.amax)
        elif max_norm is None:
            # With S >= 1 (the policy's floor), 0 < 1/S <= 1: g / S is finite exactly when g is, so the check
            # reads the scaled gradients and the multiply happens only inside the update.
            factor = None
            finite = all_finite(grads if rule.min_scale >= 1 else unscale(grads, scale))
        else:  # one pass gives both the global norm and the finite flag
            norm = jnp.sqrt(squared_norm(grads, scale))
            finite = jnp.isfinite(norm)
            factor = jnp.where(norm < max_norm, jnp.float32(1), jnp.float32(max_norm) / norm)
        if axes is not None:
            finite = lax.pmin(finite.astype(jnp.int32), axes) > 0
        if sample is not None and axes is not None:
            sample = _reduce_across(sample, leaves, axes)
        new_scale_state, new_stats, sampled = step_scale(
            policy, every, leaves, scale_state, state.stats, finite, axes, sample
        )
        if recorder is not None:
            recorder.record(scale, finite, axes, None if new_stats is None else (sampled, new_stats.sample))

        def taken(grads: Any, inner_state: Any, params: Any) -> Any:
            updates, inner_state = inner.update(unscale(grads, scale, factor), inner_state, params, **extra_args)
            return (optax.apply_updates(params, updates) if apply else updates), inner_state

        first, new_inner = _chosen(
            finite, taken, (grads, state.inner_state, params), (params if apply else None, state.inner_state)
        )
        if limit is not None:  # the streak reaches the limit only on a skipped step
            guard_skip(new_scale_state.consecutive_skips, new_scale_state.loss_scale, limit)
        return first, LossScaleOptimizerState(new_inner, new_scale_state, new_stats)

    def update_fn(
        updates: Any, state: LossScaleOptimizerState, params: Any = None, **extra_args: Any
    ) -> tuple[Any, LossScaleOptimizerState]:
        return stepper(updates, state, params, extra_args, False)

    _STEPPERS[update_fn] = stepper
    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def stepper_of(update: Callable) -> Callable | None:
    """The internal stepper of a transformation built by :func:`loss_scale_optimizer` (None for others)."""
    return _STEPPERS.get(update)
