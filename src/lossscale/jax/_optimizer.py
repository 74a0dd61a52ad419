"""``loss_scale_optimizer``: TF's ``LossScaleOptimizer`` as an optax transformation, its state and the loop's verbs."""

from __future__ import annotations

import collections
import functools
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.tree_util import SequenceKey

from .._errors import check_skip_limit
from .._resolve import resolve_loss_scale
from .._rule import LossScaleState, initial_state
from .._sampler import check_stats_every
from .._stats import GradientStats, as_mapping
from ._checkpoint import restore_state_dict
from ._compat import eval_jaxpr_choosing, is_tracer, like, serialize_namedtuples_with
from ._diagnostics import StepRecorder, guard_skip
from ._grads import all_finite, check_gradients, scale_loss, squared_norm, unscale
from ._stats import init_stats, sample_if_due, step_scale

__all__ = [
    "LossScaleOptimizerState", "apply_gradients", "find_state", "get_scaled_loss", "get_unscaled_gradients",
    "loss_scale_optimizer", "value_and_grad",
]

# The two layouts; the classes below give both the name LossScaleOptimizerState in repr.
_Fields = collections.namedtuple("_Fields", ["inner_state", "loss_scale_state"])
_FieldsWithStats = collections.namedtuple("_FieldsWithStats", ["inner_state", "loss_scale_state", "stats"])


class LossScaleOptimizerState(_Fields):
    """The state of :func:`~lossscale.jax.loss_scale_optimizer`: a NamedTuple pytree of arrays, without the policy.

    Attributes:
        inner_state: the wrapped transformation's state, untouched by skipped steps.
        loss_scale_state: a :class:`lossscale.LossScaleState` of 0-d arrays.
        stats: with ``stats_every``, a third field, the core's ``SamplerState``; None otherwise (0.1's two fields).

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> state = lsj.loss_scale_optimizer(optax.sgd(0.1)).init({"w": jnp.ones(2)})
    >>> float(state.loss_scale), int(state.skipped_steps), state._fields, state.stats
    (32768.0, 0, ('inner_state', 'loss_scale_state'), None)
    """

    __slots__ = ()

    # Not Self: without statistics it returns cls, with them the three-field subclass.
    def __new__(  # noqa: PYI034
        cls, inner_state: Any, loss_scale_state: LossScaleState, stats: Any = None
    ) -> LossScaleOptimizerState:
        if stats is None:
            return _Fields.__new__(cls, inner_state, loss_scale_state)
        return tuple.__new__(_StatsOptimizerState, (inner_state, loss_scale_state, stats))

    @property
    def stats(self) -> Any:
        """``stats_every``'s sampler state (None when off)."""
        return None

    # jnp.asarray: under flax.nnx.Optimizer the leaves are OptArray wrappers, which have no operators.
    @property
    def loss_scale(self) -> jax.Array:
        """The current scale ``S``, a 0-d float32 array."""
        return jnp.asarray(self.loss_scale_state.loss_scale)

    @property
    def skipped_steps(self) -> jax.Array:
        """Steps skipped so far, a 0-d int32 array (saturating)."""
        return jnp.asarray(self.loss_scale_state.skipped_steps)

    @property
    def consecutive_skips(self) -> jax.Array:
        """Steps skipped in a row up to now (0 after a finite step), a 0-d int32 array."""
        return jnp.asarray(self.loss_scale_state.consecutive_skips)

    @property
    def gradient_stats(self) -> dict[str, Any] | None:
        """The latest sample of ``stats_every`` (see docs/gradient_stats.md), or None when off."""
        return None if self.stats is None else as_mapping(GradientStats(*map(jnp.asarray, self.stats.sample)))

    @property
    def last_step_skipped(self) -> jax.Array:
        """Whether the last step was skipped, a 0-d bool array."""
        return self.consecutive_skips > 0


# Both bases are tuples with empty __slots__, so their layouts agree; mypy refuses any two tuple bases.
class _StatsOptimizerState(_FieldsWithStats, LossScaleOptimizerState):  # type: ignore[misc]
    """The state with ``stats_every``: the three-field tuple's fields, ``_make`` and ``_replace``, the accessors."""

    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self))
        return f"LossScaleOptimizerState({fields})"


def _owns(node: Any) -> bool:
    return isinstance(node, LossScaleOptimizerState)


def register_with_flax() -> None:
    """Lets flax restore a state saved with ``stats_every`` on into one with it off, and the other way (see
    :func:`~lossscale.jax._checkpoint.restore_state_dict`); a no-op until flax is imported, never imports it.
    Called at import and by each ``init()``, so it is in place whichever is imported first."""
    serialize_namedtuples_with(restore_state_dict, _owns)


register_with_flax()


def _is_scale_node(node: Any) -> bool:
    return isinstance(node, (LossScaleOptimizerState, LossScaleState))


# optax's stateless transforms (the clips, scale, ...) keep an EmptyState; zero_nans hides the skip's NaNs.
_HIDE_SCALED_GRADIENTS = (optax.EmptyState, optax.ZeroNansState)


def _find(state: Any, caller: str) -> LossScaleOptimizerState:
    """The one loss scale in ``state`` (a bare ``LossScaleState`` wrapped), or :func:`find_state`'s refusals."""
    leaves = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda n: _is_scale_node(n) or isinstance(n, _HIDE_SCALED_GRADIENTS)
    )[0]
    found = [(path, node) for path, node in leaves if _is_scale_node(node)]
    if not found:
        raise TypeError(
            f"{caller} needs the state of a lossscale.jax.loss_scale_optimizer (what its init()/update() "
            f"returned, or a flax TrainState's opt_state), got {type(state).__name__} holding no loss scale."
        )
    if len(found) > 1:
        raise ValueError(
            f"{caller} found {len(found)} loss scales in the state; pass the one you mean "
            "(the LossScaleOptimizerState of the transformation whose gradients these are)."
        )
    [(scale_path, scale_node)] = found
    for path, node in leaves:
        if not isinstance(node, _HIDE_SCALED_GRADIENTS):
            continue
        # where the two paths part: a lower index in the same chain runs first; that transformation is wholly
        # stateless (a clip, a chain of them), not another optimizer's state beside this one in a tuple
        k = next((i for i, (a, b) in enumerate(zip(path, scale_path)) if a != b), None)
        if k is None:
            continue
        mine, theirs, sibling = path[k], scale_path[k], path[:k + 1]
        stateless = all(isinstance(n, _HIDE_SCALED_GRADIENTS) for p, n in leaves if p[:k + 1] == sibling)
        if stateless and isinstance(mine, SequenceKey) and isinstance(theirs, SequenceKey) and mine.idx < theirs.idx:
            raise ValueError(
                f"{caller}: an optax.chain runs a transformation ({type(node).__name__} at "
                f"{jax.tree_util.keystr(path)}; e.g. optax.clip_by_global_norm) before loss_scale_optimizer, "
                "so it sees the SCALED gradients (a clip would clip S * g). Put it inside: "
                "loss_scale_optimizer(optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))), or use "
                "loss_scale_optimizer(optax.adamw(1e-3), clip_by_global_norm=1.0)."
            )
    return scale_node if isinstance(scale_node, LossScaleOptimizerState) else LossScaleOptimizerState(None, scale_node)


def find_state(opt_state: Any) -> LossScaleOptimizerState:
    """The :class:`LossScaleOptimizerState` inside ``opt_state`` (an ``optax.chain``'s, a flax ``TrainState``, ...).

    Cost: a walk of the tree in Python, at trace time under ``jit``. Raises TypeError if it holds no loss scale,
    ValueError if more than one or if a chain clips before it.

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> opt = optax.chain(lsj.loss_scale_optimizer(optax.sgd(0.1), 8), optax.scale(1.0))
    >>> int(lsj.find_state(opt.init(jnp.ones(2))).consecutive_skips)
    0
    """
    return _find(opt_state, "find_state()")


def get_scaled_loss(loss: Any, state: Any) -> jax.Array:
    """``loss * S``, with ``S`` the scale in ``state`` (as :func:`find_state`), formed in float32, in ``loss``'s dtype.

    Differentiate this: the gradients are ``S`` times the true ones. Cost: one scalar multiply. Raises TypeError
    for a loss that is not a floating-point array, and :func:`find_state`'s errors.

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> state = lsj.loss_scale_optimizer(optax.sgd(0.1), 1024).init(jnp.ones(2))
    >>> float(lsj.get_scaled_loss(jnp.float32(0.5), state))
    512.0
    """
    scale = _find(state, "get_scaled_loss()").loss_scale
    dtype = getattr(loss, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"get_scaled_loss() needs a floating-point JAX array, got {type(loss).__name__}"
            f"{'' if dtype is None else f' of dtype {dtype}'}. Compute the loss with jax.numpy first."
        )
    return scale_loss(loss, scale)


def get_unscaled_gradients(grads: Any, state: Any) -> Any:
    """Each gradient times ``1/S`` (float32, correctly rounded), in its own dtype: one element-wise multiply.

    ``update()`` unscales for you: use this to look at the true gradients; pass the scaled ones to ``update()``.

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> state = lsj.loss_scale_optimizer(optax.sgd(0.1), 1024).init(jnp.ones(2))
    >>> lsj.get_unscaled_gradients({"w": jnp.array([512.0, 2048.0], jnp.float16)}, state)
    {'w': Array([0.5, 2. ], dtype=float16)}
    """
    return unscale(grads, _find(state, "get_unscaled_gradients()").loss_scale)


def value_and_grad(
    fun: Callable[..., Any], opt_state: Any = None, *, argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """``jax.value_and_grad`` of ``fun``, with the loss scaled by the scale ``S`` of the optimizer state.

    The returned function takes ``fun``'s arguments and returns ``(loss, grads)`` (``((loss, aux), grads)`` with
    ``has_aux``): ``fun``'s own loss ``L`` and ``d(S * L)/d(params)``. ``S`` is read at each call from ``opt_state=``
    (not passed to ``fun``), else from the state given here: a traced one for its trace, a concrete one for one call
    outside any trace. Cost: one scalar multiply more than ``jax.value_and_grad``; composes with jit/pmap/shard_map.
    Raises TypeError (no state at all, no 0-d floating-point loss; :func:`find_state`'s), or RuntimeError (a
    function built with a concrete state called a second time, or inside a trace).

    Args:
        fun: the loss function; returns a 0-d floating-point array (or ``(loss, aux)`` with ``has_aux``).
        opt_state: optional; anything :func:`find_state` takes.
        argnums, has_aux: as in ``jax.value_and_grad``.

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> params = jnp.array([1.0, 2.0])
    >>> state = lsj.loss_scale_optimizer(optax.sgd(0.1), 1024).init(params)
    >>> grad_fn = lsj.value_and_grad(lambda p: jnp.sum(p**2))
    >>> loss, grads = grad_fn(params, opt_state=state)
    >>> float(loss), grads.tolist()                  # true loss, gradients of 1024 * loss
    (5.0, [2048.0, 4096.0])
    """
    if not callable(fun):
        raise TypeError(f"value_and_grad() needs a callable loss function, got {type(fun).__name__}.")
    bound = None if opt_state is None else _find(opt_state, "value_and_grad()")

    def scaled(scale: jax.Array, /, *args: Any, **kwargs: Any) -> tuple[jax.Array, Any]:  # fun may take scale=
        out = fun(*args, **kwargs)
        if has_aux and not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(
                f"with has_aux=True the loss function must return a pair (loss, aux), got {type(out).__name__}."
            )
        loss, aux = out if has_aux else (out, None)
        dtype = getattr(loss, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating) or jnp.ndim(loss) != 0:
            raise TypeError(
                f"value_and_grad() needs a loss function returning a 0-d floating-point array, got "
                f"{type(loss).__name__}{'' if dtype is None else f' of dtype {dtype} and shape {jnp.shape(loss)}'}"
                f"{'' if has_aux else ' (pass has_aux=True if it returns (loss, aux))'}."
            )
        return scale_loss(loss, scale), (loss, aux)

    # The scale is argument 0 of ``scaled``, so fun's argnums shift by one; it is never differentiated.
    shifted = jax.tree_util.tree_map(lambda a: a + 1 if isinstance(a, int) and a >= 0 else a, argnums)
    grad_fn = jax.value_and_grad(scaled, argnums=shifted, has_aux=True)

    # A concrete state given here allows one call, outside any trace (the lock: one call across threads too).
    once = None if bound is None or is_tracer(bound.loss_scale) else threading.Lock()
    used = False

    @functools.wraps(fun)
    def wrapped(*args: Any, opt_state: Any = None, **kwargs: Any) -> tuple[Any, Any]:
        nonlocal used
        if opt_state is not None:
            found = _find(opt_state, "value_and_grad()")
        elif bound is not None:
            found = bound
            if once is not None:
                with once:
                    again, used = used, True
                if again:
                    raise _reuse_error(bound, "called a second time: once update() has replaced that state, it "
                                       "would scale the loss by the old state's loss scale")
        else:
            raise TypeError(
                "value_and_grad(fun) reads the loss scale when it is called: pass the current optimizer state, "
                "grad_fn(params, ..., opt_state=state), or build it inside the step as value_and_grad(fun, state)."
            )
        (scaled_loss, (loss, aux)), grads = grad_fn(found.loss_scale, *args, **kwargs)
        if once is not None and opt_state is None and is_tracer(scaled_loss):
            # Staged out (jit, pmap, scan) even with constant inputs: the compiled step would keep this scale.
            raise _reuse_error(found, "called inside a traced function (jit, pmap, scan, vmap): the "
                               "compiled step would keep that state's loss scale as a constant")
        return ((loss, aux) if has_aux else loss), grads

    return wrapped


def _reuse_error(bound: LossScaleOptimizerState, what: str) -> RuntimeError:
    return RuntimeError(
        f"value_and_grad(fun, opt_state) was built with a concrete optimizer state and {what} "
        f"({float(bound.loss_scale):g}). A function built with a concrete state may be called once, "
        "outside any trace. Build it once without the state and pass the current one at each call: "
        "grad_fn = lsj.value_and_grad(loss_fn); loss, grads = grad_fn(params, batch, opt_state=state)."
    )


def _axis_names(axis_name: Any) -> tuple[Hashable, ...] | None:
    if axis_name is None:
        return None
    names = (axis_name,) if isinstance(axis_name, str) else axis_name
    if isinstance(names, (tuple, list)) and names and all(isinstance(a, str) for a in names):
        return tuple(names)
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
    """``update(*operands)`` where ``finite``, else ``olds`` (None: zeros shaped like that output), leaf by leaf;
    each output chosen by ``jnp.where`` as soon as it is computed, fused into its kernel (no pass, in place)."""
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
        aval, old = avals[i], old_leaves[i]
        kept = jnp.zeros((), aval.dtype) if old is None else jnp.asarray(old)
        return like(jnp.where(finite, new, kept).astype(aval.dtype), aval)

    return jax.tree_util.tree_unflatten(out_tree, eval_jaxpr_choosing(closed, flat, choose))


#: ``update`` function of each transformation built here -> its stepper (for :func:`apply_gradients`).
_STEPPERS: weakref.WeakKeyDictionary[Callable, Callable] = weakref.WeakKeyDictionary()


def loss_scale_optimizer(
    inner: optax.GradientTransformation, loss_scale: Any = None, *, dynamic: bool | None = None,
    initial_scale: float | None = None, dynamic_growth_steps: int | None = None, min_loss_scale: float | None = None,
    max_loss_scale: float | None = None, hysteresis: int | None = None, max_consecutive_skips: int | None = None,
    history: Any = None, axis_name: str | tuple[str, ...] | None = None, clip_by_global_norm: float | None = None,
    stats_every: int | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` in loss scaling; TF's ``LossScaleOptimizer`` for optax (docs/jax.md).

    ``update(grads, state, params)`` takes ``g``, the gradients of the **scaled** loss, and computes::

        finite = all(isfinite(g))              # NaN and +-Inf alike (of g / S when S may be < 1)
        u = g * (1 / S)                        # each leaf in its own dtype
        u = u * min(1, max_norm / norm(u))     # only with clip_by_global_norm
        new_updates, new_inner = inner.update(u, inner_state, params)
        updates = where(finite, new_updates, 0)                # leaf by leaf
        inner_state = where(finite, new_inner, inner_state)
        S, counters = lossscale.next_state(policy, S, counters, finite)

    Every policy skips a non-finite step (``loss_scale=1``: skip only). Cost under ``jit``: plain optax's passes
    plus one read of the gradients; the ``1/S`` multiply and the skip fuse into ``inner``'s kernels; no host sync.

    Args:
        inner: the optax transformation given the unscaled gradients; a clip goes *inside* it.
        loss_scale: a number (fixed), ``"dynamic"``, a :class:`lossscale.LossScale` or its ``serialize`` dict.
        dynamic, initial_scale, dynamic_growth_steps: TF's stable form (default: dynamic, 2**15, 2000).
        min_loss_scale, max_loss_scale, hysteresis: refine the dynamic scale (defaults: 1, none, 1).
        max_consecutive_skips: raise :class:`lossscale.LossScaleError` at the ``N``-th skip in a row (default None).
        history: a :class:`lossscale.History` given one row per step: a ``jax.debug.callback`` (0.4-1.7 ms on CPU);
            under ``jax.vmap`` a ``ValueError`` when traced (one History cannot take a row per member).
        axis_name: under ``pmap``/``shard_map``, the axes over which the finite flag is ``lax.pmin``-ed.
        clip_by_global_norm: clip the true gradients to this global norm, also the finite check: no extra pass;
            with ``axis_name``, the norm of the whole gradient across the devices (one ``psum`` of a scalar).
        stats_every: sample ``state.gradient_stats`` every N-th update, one read pass (default None; "auto": 16).

    Returns:
        An ``optax.GradientTransformationExtraArgs`` with :class:`LossScaleOptimizerState`; ``update``'s extra
        keyword arguments go to ``inner``. Bad arguments raise TypeError or ValueError.

    >>> import jax, jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> opt = lsj.loss_scale_optimizer(optax.sgd(0.5), "dynamic")
    >>> state = opt.init(params)
    >>> grads = jax.grad(lambda p: lsj.get_scaled_loss(jnp.sum(p["w"] ** 2), state))(params)
    >>> updates, state = jax.jit(opt.update)(grads, state, params)
    >>> optax.apply_updates(params, updates)["w"]
    Array([0., 0.], dtype=float32)
    >>> updates, state = opt.update({"w": jnp.array([jnp.inf, 0.0])}, state, params)  # skipped, scale halves
    >>> updates["w"], float(state.loss_scale), int(state.skipped_steps)
    (Array([0., 0.], dtype=float32), 16384.0, 1)
    """
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        raise TypeError(
            f"inner must be an optax.GradientTransformation, got {type(inner).__name__}. "
            "Build the optimizer first, e.g. loss_scale_optimizer(optax.adamw(1e-3))."
        )
    policy = resolve_loss_scale(
        loss_scale, dynamic=dynamic, initial_scale=initial_scale, dynamic_growth_steps=dynamic_growth_steps,
        min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale, hysteresis=hysteresis,
    )
    rule = policy.rule_params()
    axes = _axis_names(axis_name)
    max_norm = _check_max_norm(clip_by_global_norm)
    limit = check_skip_limit(max_consecutive_skips)
    recorder = None if history is None or history is False else StepRecorder(history)
    every = check_stats_every(stats_every, policy)
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: Any) -> LossScaleOptimizerState:
        register_with_flax()
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
        scale = state.loss_scale
        # With S >= 1 (the policy's floor) g / S is finite exactly when g is: the check reads the scaled g.
        factor = measured = None
        if max_norm is None and every is not None and state.stats is not None and rule.min_scale >= 1 and all(
            leaf.dtype in (jnp.float32, jnp.float16, jnp.bfloat16) for leaf in leaves
        ):  # max |g| is the finite check too: a sampled step reads the gradients once
            finite, sample, sampled = sample_if_due(every, leaves, state.stats, axes, all_finite)
            measured = (sample, sampled)
        elif max_norm is None:
            finite = all_finite(grads if rule.min_scale >= 1 else unscale(grads, scale))
        else:  # one pass gives both the global norm and the finite flag
            norm = jnp.sqrt(squared_norm(grads, scale, axes))
            finite = jnp.isfinite(norm)
            factor = jnp.where(norm < max_norm, jnp.float32(1), jnp.float32(max_norm) / norm)
        if axes is not None:
            finite = lax.pmin(finite.astype(jnp.int32), axes) > 0
        new_scale_state, new_stats, sampled = step_scale(
            policy, every, leaves, state.loss_scale_state, state.stats, finite, axes, measured
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

    def update_fn(updates: Any, state: LossScaleOptimizerState, params: Any = None, **extra_args: Any) -> tuple:
        return stepper(updates, state, params, extra_args, False)

    _STEPPERS[update_fn] = stepper
    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def apply_gradients(tx: Any, grads: Any, opt_state: Any, params: Any, **extra_args: Any) -> tuple[Any, Any]:
    """``(new_params, new_opt_state)``: ``tx.update`` then ``optax.apply_updates``, with one skip.

    For a :func:`loss_scale_optimizer` the skip chooses between the new and the old parameters (no updates in
    memory; donated parameters in place); any other ``tx`` takes the two calls. ``extra_args`` go to ``update``.

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> tx = lsj.loss_scale_optimizer(optax.sgd(0.5), 4)
    >>> params = jnp.array([1.0, 2.0])
    >>> params, state = lsj.apply_gradients(tx, jnp.array([4.0, jnp.inf]), tx.init(params), params)   # skipped
    >>> params.tolist(), int(state.skipped_steps)
    ([1.0, 2.0], 1)
    >>> lsj.apply_gradients(tx, jnp.array([4.0, 8.0]), state, params)[0].tolist()
    [0.5, 1.0]
    """
    if params is None:
        raise TypeError("apply_gradients() needs the parameters to update; got params=None.")
    update: Any = getattr(tx, "update", None)
    stepper = _STEPPERS.get(update)
    if stepper is None:
        updates, opt_state = tx.update(grads, opt_state, params, **extra_args)
        return optax.apply_updates(params, updates), opt_state
    return stepper(grads, opt_state, params, extra_args, True)
