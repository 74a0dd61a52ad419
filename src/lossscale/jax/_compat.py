"""Every JAX API that is private, unstable or version-dependent; each shim names its public replacement."""

from __future__ import annotations

import collections
import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import lax

__all__ = ["eval_jaxpr_choosing", "is_tracer", "like", "serialize_namedtuples_with"]

# Public replacement: ``jax.typeof`` (JAX >= 0.6). ``jax.core.get_aval`` is its older, deprecated spelling.
typeof = getattr(jax, "typeof", None) or jax.core.get_aval

try:  # jax.extend.core: JAX's API for library authors, with weaker stability promises
    from jax.extend.core import Literal
except ImportError:  # pragma: no cover - JAX < 0.4.36
    Literal = jax.core.Literal  # type: ignore[misc]


def is_tracer(x: Any) -> bool:
    """Whether ``x`` is a tracer (``jit``, ``grad``, ``vmap``, ...); ``jax.core`` is the module JAX keeps shrinking."""
    return isinstance(x, jax.core.Tracer)


def varying_axes(aval: Any) -> frozenset | None:
    """The shard_map axes an abstract value varies over (its ``vma`` type; None where JAX does not say)."""
    manual = getattr(aval, "manual_axis_type", None)
    if manual is not None:
        return frozenset(manual.varying)
    vma = getattr(aval, "vma", None)
    return None if vma is None else frozenset(vma)


def like(x: Any, aval: Any) -> Any:
    """``x`` marked as varying over the same shard_map axes as ``aval``, so that both cond branches agree."""

    def varying(a: Any) -> frozenset:
        return varying_axes(a) or frozenset()

    missing = varying(aval) - varying(typeof(x))
    if not missing:
        return x
    axes = tuple(sorted(missing))
    return lax.pcast(x, axes, to="varying") if hasattr(lax, "pcast") else lax.pvary(x, axes)


def eval_jaxpr_choosing(closed: Any, args: Sequence[Any], choose: Callable[[int, Any], Any]) -> list[Any]:
    """Evaluates a ``ClosedJaxpr`` on ``args``, its ``i``-th output replaced by ``choose(i, value)`` as soon as it is
    computed (an input, a literal or a repeated output: at the end)."""
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
