"""``loss_scale_optimizer``: TF's ``LossScaleOptimizer`` as an optax transformation, its state and the loop's verbs."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.tree_util import SequenceKey

from .._diagnostics import check_history
from .._history import History
from .._resolve import resolve_loss_scale
from .._rule import LossScaleState
from .._sampler import check_stats_every
from ._checkpoint import register_with_flax
from ._compat import is_tracer, nnx_value_and_grad
from ._diagnostics import Recorder, stall_guard
from ._grads import scale_loss, unscale
from ._state import (
    LossScaleOptimizerState,
    _StatsOptimizerState,  # noqa: F401 - pickles of 0.3 name lossscale.jax._optimizer for it
    init_state,
)
from ._step import StepSettings, step

__all__ = [
    "LossScaleOptimizerState", "LossScaleTransformation", "apply_gradients", "find_state", "get_scaled_loss",
    "get_unscaled_gradients", "loss_scale_optimizer", "value_and_grad",
]

register_with_flax()


def _is_scale_node(node: Any) -> bool:
    return isinstance(node, (LossScaleOptimizerState, LossScaleState))


# optax's stateless transforms (the clips, scale, ...) keep an EmptyState; zero_nans hides the skip's NaNs.
_HIDE_SCALED_GRADIENTS = (optax.EmptyState, optax.ZeroNansState)


def _find(state: Any, caller: str) -> LossScaleOptimizerState:
    """The one loss scale in ``state`` (a bare ``LossScaleState`` wrapped), or :func:`find_state`'s refusals."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda n: _is_scale_node(n) or isinstance(n, _HIDE_SCALED_GRADIENTS)
    )
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

    Cost: a walk of the tree in Python, at trace time under ``jit``; no device work.

    Args:
        opt_state: any pytree holding the state of one :func:`loss_scale_optimizer` (what its ``init``/``update``
            returned, a chain's or ``optax.multi_transform``'s state, a flax ``TrainState``'s ``opt_state``); a bare
            :class:`lossscale.LossScaleState` comes back wrapped, with ``inner_state=None``.

    Returns:
        The :class:`LossScaleOptimizerState` itself (not a copy).

    Raises:
        TypeError: ``opt_state`` holds no loss scale.
        ValueError: it holds more than one, or an ``optax.chain`` runs a stateless transformation (a clip) before
            the loss scale, which would see the scaled gradients.

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> opt = optax.chain(lsj.loss_scale_optimizer(optax.sgd(0.1), 8), optax.scale(1.0))
    >>> int(lsj.find_state(opt.init(jnp.ones(2))).consecutive_skips)
    0
    """
    return _find(opt_state, "find_state()")


def get_scaled_loss(loss: Any, state: Any) -> jax.Array:
    """``loss * S``, with ``S`` the scale in ``state`` (as :func:`find_state`), formed in float32, in ``loss``'s dtype.

    Differentiate this: the gradients are ``S`` times the true ones, above float16's underflow. Cost: one scalar
    multiply.

    Args:
        loss: the loss, a floating-point JAX array (any shape; usually 0-d).
        state: anything :func:`find_state` takes.

    Returns:
        ``loss * S`` in ``loss``'s dtype (rounded once from float32, or wider for a float64 loss).

    Raises:
        TypeError: ``loss`` is not a floating-point array; and :func:`find_state`'s errors.

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

    Args:
        grads: a pytree of floating-point arrays, the gradients of the scaled loss.
        state: anything :func:`find_state` takes.

    Returns:
        A pytree of ``grads``' structure, each leaf ``g * (1/S)`` computed in at least float32 and rounded once to
        its own dtype (a new pytree; ``grads`` is not modified).

    Raises:
        TypeError: a leaf is not a floating-point array; and :func:`find_state`'s errors.

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
    ``has_aux``): ``fun``'s own loss ``L`` and ``d(S * L)/d(params)``, what ``update`` expects. ``S`` is read at each
    call from the keyword ``opt_state=`` (not passed to ``fun``), else from the state given here: a traced one for
    any number of calls in its trace, a concrete one for one call outside any trace (a later call would use an old
    ``S``). Given an nnx ``Module`` (any flax nnx graph node) to differentiate, it is ``flax.nnx.value_and_grad``
    instead: the grads are the ``nnx.State`` of its ``nnx.Param`` variables, and what the forward pass writes to the module
    (BatchNorm's running statistics, Dropout's RNG count) reaches the caller's module, which ``jax.value_and_grad``
    would drop. Cost: one scalar multiply more than ``jax.value_and_grad``; composes with jit/pmap/shard_map.

    Args:
        fun: the loss function; returns a 0-d floating-point array (or ``(loss, aux)`` with ``has_aux``). It may
            take a keyword named ``scale``: the scale is passed positionally, never as ``fun``'s keyword.
        opt_state: optional (default None), anything :func:`find_state` takes: the state ``S`` is read from when the
            returned function is called without ``opt_state=``.
        argnums: which positional arguments of ``fun`` to differentiate, an int or a sequence of ints (default 0),
            as in ``jax.value_and_grad``.
        has_aux: whether ``fun`` returns ``(loss, aux)`` (default False), as in ``jax.value_and_grad``.

    Returns:
        ``grad_fn(*args, opt_state=None, **kwargs)``, returning ``(loss, grads)`` or ``((loss, aux), grads)``.

    Raises:
        TypeError: ``fun`` is not callable; at call time, no state at all, or ``fun`` returned no 0-d floating-point
            loss (or no pair with ``has_aux``); and :func:`find_state`'s errors.
        RuntimeError: at call time, a function built with a concrete state called a second time, or inside a
            trace (``jit``, ``pmap``, ``scan``, ``vmap``).

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
    # nnx.value_and_grad of the same, built at the first nnx call per number of arguments: nnx does not count a
    # negative argnums from the end (with a Dropout's RNG state it differentiated the key), so it gets positions.
    nnx_grad_fns: dict[int, Callable[..., Any]] = {}

    # A concrete state given here allows one call, outside any trace; the lock makes the flag's test-and-set atomic,
    # so two threads cannot both make the one call.
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
        differentiate, transform = grad_fn, nnx_value_and_grad(args, argnums)
        if transform is not None:  # an nnx Module among the differentiated arguments
            count = len(args) + 1  # scaled's arguments: the scale, then fun's
            if count not in nnx_grad_fns:
                positions = jax.tree_util.tree_map(lambda a: a + count if isinstance(a, int) and a < 0 else a, shifted)
                nnx_grad_fns[count] = transform(scaled, argnums=positions, has_aux=True)
            differentiate = nnx_grad_fns[count]
        (scaled_loss, (loss, aux)), grads = differentiate(found.loss_scale, *args, **kwargs)
        if once is not None and opt_state is None and is_tracer(scaled_loss):
            # Under jit/pmap/scan every op is staged out, so the scaled loss is a tracer even when every input is a
            # constant: the compiled step would keep this state's scale as a constant.
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


def loss_scale_optimizer(
    inner: optax.GradientTransformation, loss_scale: Any = None, *, dynamic: bool | None = None,
    initial_scale: float | None = None, dynamic_growth_steps: int | None = None, min_loss_scale: float | None = None,
    max_loss_scale: float | None = None, hysteresis: int | None = None, max_consecutive_skips: int | None = None,
    history: Any = None, axis_name: str | tuple[str, ...] | None = None, clip_by_global_norm: float | None = None,
    stats_every: int | None = None,
) -> LossScaleTransformation:
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
    plus one read of the gradients (the finite check); the ``1/S`` multiply and the skip fuse into ``inner``'s
    kernels; no host sync, and no conditional off the CPU (on the CPU one, taken only on a step whose gradient sum
    is not finite; ``stats_every`` adds the sample's).

    Args:
        inner: the optax transformation given the unscaled gradients; a clip goes *inside* it.
        loss_scale: a number (fixed), ``"dynamic"``, ``"auto"``, a :class:`lossscale.LossScale` or its ``serialize``
            dict (default None: TF's stable form below).
        dynamic: TF's stable form: a dynamic scale (default None: True), or a fixed one with False.
        initial_scale: the first (with ``dynamic=False``: the fixed) scale (default None: 2**15).
        dynamic_growth_steps: finite steps in a row before a dynamic scale doubles (default None: 2000).
        min_loss_scale: the floor of a dynamic scale (default None: 1).
        max_loss_scale: the ceiling of a dynamic scale (default None: none).
        hysteresis: non-finite steps before a dynamic scale backs off (default None: 1).
        max_consecutive_skips: raise :class:`lossscale.LossScaleError` at the ``N``-th skip in a row (default None:
            never). Staged as a ``jax.debug.callback`` behind a ``lax.cond`` taken only at the limit.
        history: a :class:`lossscale.History` given one row per step, or True for a new one, readable as the
            returned transformation's ``history`` (default None: off; False too). Costs one ``jax.debug.callback``
            per step, a host round trip (docs/jax.md, "History"); under ``pmap``/``shard_map`` only the first
            device along ``axis_name`` records, under ``jax.vmap`` tracing raises ``ValueError`` (one History
            cannot take a row per member).
        axis_name: under ``pmap``/``shard_map``, the axis or axes over which the finite flag is ``lax.pmin``-ed
            (one collective of a scalar), so every device skips together (default None: under ``jit`` alone).
        clip_by_global_norm: clip the true gradients to this global norm (default None: no clip); its norm is also
            the finite check, so no extra pass; with ``axis_name``, the norm of the whole gradient across the
            devices (one ``psum`` of a scalar).
        stats_every: sample ``state.gradient_stats`` every N-th update (default None: off; 16 with ``"auto"``):
            about one read pass on a sampled step, which is also the finite check; one ``lax.cond`` per step
            (none with 1).

    Returns:
        A :class:`LossScaleTransformation`, an ``optax.GradientTransformationExtraArgs`` whose ``init`` makes a
        :class:`LossScaleOptimizerState`; ``update``'s extra keyword arguments go to ``inner``. Its ``history`` is the
        History recorded into (None when off).

    Raises:
        TypeError: ``inner`` is not a transformation, or an argument of the wrong type (the error names it).
        ValueError: an argument of the wrong value (the error names it and the fix).

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
    axes = _axis_names(axis_name)
    max_norm = _check_max_norm(clip_by_global_norm)
    guard = stall_guard(max_consecutive_skips)
    recorded = check_history(history)
    recorder = None if recorded is None else Recorder(recorded)
    every = check_stats_every(stats_every, policy)
    settings = StepSettings(optax.with_extra_args_support(inner), policy, every, axes, max_norm, recorder, guard)
    return LossScaleTransformation(functools.partial(_init, settings), settings.update)


def _init(settings: StepSettings, params: Any) -> LossScaleOptimizerState:
    """The transformation's ``init``: :func:`~lossscale.jax._state.init_state`, refusing an inner transformation
    that holds a loss scale already."""
    register_with_flax()
    state = init_state(settings.policy, settings.every, settings.inner, params)
    if any(_is_scale_node(n) for n in jax.tree_util.tree_leaves(state.inner_state, is_leaf=_is_scale_node)):
        raise TypeError(
            "inner already holds a loss_scale_optimizer; nesting them would scale and unscale twice. "
            "Wrap the plain optimizer once: loss_scale_optimizer(optax.adamw(...))."
        )
    return state


def _settings(tx: Any) -> StepSettings | None:
    """The :class:`~lossscale.jax._step.StepSettings` whose ``update`` is ``tx``'s (a :func:`loss_scale_optimizer`, or any
    ``GradientTransformation`` rebuilt from its two functions), else None."""
    settings = getattr(getattr(tx, "update", None), "__self__", None)
    return settings if isinstance(settings, StepSettings) else None


class LossScaleTransformation(optax.GradientTransformationExtraArgs):
    """What :func:`loss_scale_optimizer` returns: optax's ``(init, update)`` pair (it unpacks, chains and jits as
    any ``GradientTransformationExtraArgs``), plus the :attr:`history` it records into."""

    __slots__ = ()

    @property
    def history(self) -> History | None:
        """The :class:`lossscale.History` given one row per step: the one passed as ``history=``, the one created for
        ``history=True``, or None when off. Read through ``update``, so a transformation rebuilt from the two
        functions (``_replace``, ``GradientTransformationExtraArgs(tx.init, tx.update)``) has it too."""
        settings = _settings(self)
        return None if settings is None or settings.recorder is None else settings.recorder.history


def apply_gradients(tx: Any, grads: Any, opt_state: Any, params: Any, **extra_args: Any) -> tuple[Any, Any]:
    """``(new_params, new_opt_state)``: ``tx.update`` then ``optax.apply_updates``, with one skip.

    For a :func:`loss_scale_optimizer` (found through ``tx.update``, so also one rebuilt from its two functions) the
    skip chooses between the new and the old parameters as they are computed (no updates in memory; donated
    parameters in place): one pass over the parameters fewer than ``update`` then ``optax.apply_updates``. Any other
    ``tx`` takes the two calls.

    Args:
        tx: the transformation: a :func:`loss_scale_optimizer`, or any optax ``GradientTransformation``.
        grads: the gradients of the scaled loss, a pytree shaped like ``params``.
        opt_state: ``tx``'s state.
        params: the parameters to update (required).
        **extra_args: keyword arguments for ``tx.update`` (the inner transformation's, e.g. ``value=`` for
            ``optax.contrib.reduce_on_plateau``).

    Returns:
        ``(new_params, new_opt_state)``; on a skipped step ``new_params`` are ``params``' values.

    Raises:
        TypeError: ``params`` is None; and ``update``'s errors.

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
    settings = _settings(tx)
    if settings is None:
        updates, opt_state = tx.update(grads, opt_state, params, **extra_args)
        return optax.apply_updates(params, updates), opt_state
    return step(settings, grads, opt_state, params, extra_args, apply=True)
