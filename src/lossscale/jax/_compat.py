"""Every JAX and flax API this binding uses that is private, unstable or version-dependent, each behind one shim that
names its public replacement, or says why there is none. No other module of the binding reaches past the public
API.

| shim | what it touches | public replacement |
|---|---|---|
| :data:`typeof` | ``jax.core.get_aval`` before JAX 0.6 | ``jax.typeof`` (JAX >= 0.6) |
| ``Literal`` | ``jax.extend.core.Literal`` (``jax.core.Literal`` before 0.4.36) | none: jaxprs are internals |
| :func:`is_tracer` | ``jax.core.Tracer`` | none: JAX has no public "is this traced" predicate |
| :func:`varying_axes` | an aval's ``manual_axis_type`` (JAX 0.9) or ``vma`` (0.6 - 0.8) | none stable yet: the field was renamed |
| :func:`like` | ``lax.pcast(..., to="varying")`` (JAX 0.9), ``lax.pvary`` (0.6 - 0.8) | ``lax.pcast`` |
| :func:`eval_jaxpr_choosing` | jaxpr equations, ``Primitive.bind`` | none: see its docstring |
| :func:`serialize_namedtuples_with` | flax's ``_NamedTuple`` registry entry | none: see its docstring |
| :func:`nnx_value_and_grad` | ``flax.nnx.graph.is_graph_node`` | none: nnx exports no "is this a graph node" |
"""

from __future__ import annotations

import collections
import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import lax

from .._jax._compat import is_tracer

__all__ = ["eval_jaxpr_choosing", "is_tracer", "like", "nnx_value_and_grad", "serialize_namedtuples_with"]

#: Public replacement: ``jax.typeof`` (JAX >= 0.6). ``jax.core.get_aval`` is its older, deprecated spelling.
typeof = getattr(jax, "typeof", None) or jax.core.get_aval

try:  # jax.extend.core: JAX's API for library authors, with weaker stability promises
    from jax.extend.core import Literal
except ImportError:  # pragma: no cover - JAX < 0.4.36
    Literal = jax.core.Literal  # type: ignore[misc]


def varying_axes(aval: Any) -> frozenset | None:
    """The shard_map axes an abstract value varies over (None where JAX does not say: before 0.6). JAX 0.9 keeps it
    as ``manual_axis_type.varying``, 0.6 - 0.8 as ``vma``; no public accessor is stable across them."""
    manual = getattr(aval, "manual_axis_type", None)
    if manual is not None:
        return frozenset(manual.varying)
    vma = getattr(aval, "vma", None)
    return None if vma is None else frozenset(vma)


def like(x: Any, aval: Any) -> Any:
    """``x`` marked as varying over the same shard_map axes as ``aval``, so that both cond branches agree (and a
    skip's ``where`` returns the type its output had): JAX 0.9's ``lax.pcast(x, axes, to="varying")``, the public
    spelling; 0.6 - 0.8's ``lax.pvary``; nothing before (no axis is varying there)."""

    def varying(a: Any) -> frozenset:
        return varying_axes(a) or frozenset()

    missing = varying(aval) - varying(typeof(x))
    if not missing:
        return x
    axes = tuple(sorted(missing))
    return lax.pcast(x, axes, to="varying") if hasattr(lax, "pcast") else lax.pvary(x, axes)


def eval_jaxpr_choosing(closed: Any, args: Sequence[Any], choose: Callable[[int, Any], Any]) -> list[Any]:
    """Evaluates a ``ClosedJaxpr`` on ``args``, its ``i``-th output replaced by ``choose(i, value)`` as soon as it is
    computed (an input, a literal or a repeated output: at the end).

    The skip's choice per output (:func:`lossscale.jax._step._chosen`) needs it: the equations after an output must
    read the chosen value. No public replacement: ``jax.core.eval_jaxpr`` evaluates a jaxpr whole, with no hook
    between equations, so this walks the equations and binds each primitive (``get_bind_params``, ``eqn.ctx``:
    internals whose shape changed across JAX releases, handled here)."""
    jaxpr = closed.jaxpr
    env: dict[Any, Any] = {**dict(zip(jaxpr.constvars, closed.consts)), **dict(zip(jaxpr.invars, args))}
    uses = collections.Counter(v for v in jaxpr.outvars if not isinstance(v, Literal))
    early = {v: i for i, v in enumerate(jaxpr.outvars) if not isinstance(v, Literal) and uses[v] == 1 and v not in env}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, Literal) else env[v]

    for eqn in jaxpr.eqns:
        bind = eqn.primitive.get_bind_params(eqn.params)  # older JAX: (subfuns, params); newer: params
        subfuns, params = ((), bind) if isinstance(bind, dict) else bind
        ctx = getattr(eqn, "ctx", None)
        with contextlib.nullcontext() if ctx is None else ctx.manager:
            answer = eqn.primitive.bind(*subfuns, *map(read, eqn.invars), **params)
        outs = answer if eqn.primitive.multiple_results else [answer]
        for v, x in zip(eqn.outvars, outs):
            env[v] = choose(early[v], x) if v in early else x
    return [
        read(v) if not isinstance(v, Literal) and v in early else choose(i, read(v))
        for i, v in enumerate(jaxpr.outvars)
    ]


def serialize_namedtuples_with(restore: Callable[[Any, Any, Callable], Any], owns: Callable[[Any], bool]) -> bool:
    """Has flax's ``from_state_dict`` restore a NamedTuple for which ``owns(target)`` with ``restore(target, state,
    from_state_dict)``, every other as before; done once, only if ``flax.serialization`` is imported (never
    imports it). Returns whether it is in place.

    flax serializes any NamedTuple through one handler of a private key (``flax.serialization._NamedTuple``), and a
    NamedTuple type cannot be registered apart, so the handler is wrapped (no public replacement)."""
    module = sys.modules.get("flax.serialization")
    if module is None:
        return False
    registry = getattr(module, "_STATE_DICT_REGISTRY", None)
    key = getattr(module, "_NamedTuple", None)
    if registry is None or key not in registry:  # pragma: no cover - a flax that no longer has them
        return False
    to_state_dict, from_state_dict = registry[key]
    if getattr(from_state_dict, "_lossscale_owns", None) is owns:
        return True

    def wrapped(target: Any, state: Any) -> Any:
        if owns(target):
            return restore(target, state, module.from_state_dict)
        return from_state_dict(target, state)

    wrapped._lossscale_owns = owns  # type: ignore[attr-defined]
    module.register_serialization_state(key, to_state_dict, wrapped, override=True)
    return True


def nnx_value_and_grad(args: Sequence[Any], argnums: int | Sequence[int]) -> Callable[..., Any] | None:
    """``flax.nnx.value_and_grad`` when one of the positional ``args`` at ``argnums`` holds an nnx graph node (a
    ``Module``, ``Variable``, ``Optimizer``, ...), else None; None also while ``flax.nnx`` is not imported (never
    imports it). Cost: a Python walk of those arguments' trees per call (at trace time under ``jit``), no device work.

    Why nnx's transform there: its forward pass may write state back (BatchNorm's running statistics, Dropout's RNG
    count), which ``nnx.value_and_grad`` propagates to the caller's module and ``jax.value_and_grad`` drops (it refuses
    an RNG key outright). ``flax.nnx.graph.is_graph_node`` is nnx's own test; no public alias."""
    nnx = sys.modules.get("flax.nnx")
    is_node = getattr(getattr(nnx, "graph", None), "is_graph_node", None)
    if is_node is None:
        return None
    positions = [argnums] if isinstance(argnums, int) else list(argnums)
    for i in positions:
        if -len(args) <= i < len(args) and any(
            is_node(leaf) for leaf in jax.tree_util.tree_leaves(args[i], is_leaf=is_node)
        ):
            return nnx.value_and_grad  # type: ignore[union-attr]
    return None
