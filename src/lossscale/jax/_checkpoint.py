"""Restoring a JAX state: ``check_state`` checks a restored one (flax, orbax, pickle) on the host by the core's one
load rule; :func:`restore_state_dict` with :func:`register_with_flax` lets flax restore across ``stats_every``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from .._checkpoint import COUNTERS, check_counter, check_policy, plain, read_record
from .._policy import LossScale
from .._resolve import get
from ._compat import serialize_namedtuples_with
from ._state import LossScaleOptimizerState

__all__ = ["check_state", "register_with_flax", "restore_state_dict"]


def _fields(node: Any) -> dict[str, Any] | None:
    """A node's fields by name if it is a loss scale's state (NamedTuple, flax dataclass or dict), else None."""
    fields = node if isinstance(node, Mapping) else node._asdict() if hasattr(node, "_asdict") else {}
    if "loss_scale_state" in fields or ("loss_scale" in fields and "good_steps" in fields):
        return dict(fields)
    return None


def check_state(state: Any, policy: Any = None) -> Any:
    """Raises if ``state`` holds a loss scale no step could have produced; returns ``state`` unchanged.

    Call it on a restored state (flax, orbax, pickle; or anything holding it) before the first step: each scale is
    checked by the core's rule (docs/checkpoints.md), a finite, positive, normal float32 within ``policy``'s bounds
    (any ``loss_scale=`` value) if given; counters ints in ``[0, 2**31 - 1]``. One host read per field; not in jit.

    Args:
        state: a :class:`LossScaleOptimizerState`, or any pytree holding one or more (a ``TrainState``, a chain's
            state, an orbax-restored dict with the same field names).
        policy: optional (default None: the scale is checked as a scale, not against bounds): the policy the state
            will be stepped with, as ``loss_scale_optimizer``'s ``loss_scale`` takes it (a number, ``"dynamic"``, a
            :class:`lossscale.LossScale` or its ``serialize`` dict).

    Returns:
        ``state`` itself, unchanged.

    Raises:
        TypeError: ``state`` holds no loss scale, or a field of the wrong type.
        ValueError: a field of the wrong value; the error names its path in ``state``, the value and the fix.

    >>> import jax.numpy as jnp, optax, lossscale.jax as lsj
    >>> state = lsj.loss_scale_optimizer(optax.sgd(0.1)).init({"w": jnp.ones(2)})
    >>> lsj.check_state(state) is state
    True
    >>> lsj.check_state(state._replace(loss_scale_state=state.loss_scale_state._replace(loss_scale=jnp.nan)))
    Traceback (most recent call last):
    ...
    ValueError: state.loss_scale_state['loss_scale'] must be finite in float32 ...
    """
    if policy is not None:  # also "dynamic" or a number, as loss_scale_optimizer takes them
        policy = check_policy(policy) if isinstance(policy, (LossScale, Mapping)) else get(policy)
    found, _ = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda node: _fields(node) is not None)
    nodes = [(path, fields) for path, node in found if (fields := _fields(node)) is not None]
    if not nodes:
        raise TypeError(
            f"check_state() needs the state of a lossscale.jax.loss_scale_optimizer (or a TrainState/chain "
            f"state holding it), got {type(state).__name__} holding no loss scale."
        )
    for path, fields in nodes:
        where = "state" + jax.tree_util.keystr(path)
        inner = fields.get("loss_scale_state")
        if inner is not None:
            if (inner_fields := _fields(inner)) is None:
                raise TypeError(f"{where}.loss_scale_state is a {type(inner).__name__}, not a LossScaleState.")
            read_record(inner_fields, policy, where=f"{where}.loss_scale_state")
            for name in COUNTERS:  # counters kept next to the scale's own (the optimizer's skip counters)
                if name in fields:
                    check_counter(f"{where}.{name}", fields[name])
        else:
            read_record(fields, policy, where=where)
        if "last_step_skipped" in fields:
            flag = plain(fields["last_step_skipped"])
            if not isinstance(flag, bool) and type(flag).__name__ != "bool_":
                raise TypeError(f"{where}.last_step_skipped must be a bool, got {flag!r}.")
    return state


_SAVED_FIELDS = ("inner_state", "loss_scale_state", "stats")


def _layout(tree: Any) -> tuple[Any, list[tuple[int, ...]]]:
    leaves, structure = jax.tree_util.tree_flatten(tree)
    return structure, [tuple(np.shape(leaf)) for leaf in leaves]


def restore_state_dict(target: Any, state: Any, from_state_dict: Callable[..., Any]) -> Any:
    """flax's ``from_state_dict`` for a ``LossScaleOptimizerState`` ``target``, across ``stats_every`` on or off and
    ``"dynamic"``/``"auto"``: the inner state, the scale and the counters come from ``state``; the statistics too
    when ``state`` holds them in ``target``'s layout, else ``target``'s own (as ``init()`` made them: empty).

    ``state`` is what flax's ``to_state_dict`` made of a state of any release (two fields, or three with
    statistics). Host-side, no device work. Raises ValueError for a state dict that is not an optimizer state's."""
    if not isinstance(state, Mapping):
        raise TypeError(f"Restoring a LossScaleOptimizerState needs a state dict, got {type(state).__name__}.")
    keys = set(state)
    if keys == {"name", "fields", "values"}:  # flax's old NamedTuple layout
        state = {state["fields"][str(i)]: state["values"][str(i)] for i in range(len(state["fields"]))}
        keys = set(state)
    if not {"inner_state", "loss_scale_state"} <= keys <= set(_SAVED_FIELDS):
        raise ValueError(
            f"The field names of the state dict and the named tuple do not match, got {keys} and "
            f"{set(target._fields)}: not a saved loss_scale_optimizer state. Restore it into the state of the "
            "transformation that saved it."
        )
    inner = from_state_dict(target.inner_state, state["inner_state"], name="inner_state")
    scale = from_state_dict(target.loss_scale_state, state["loss_scale_state"], name="loss_scale_state")
    stats, saved = target.stats, state.get("stats")
    if stats is not None and saved is not None:
        import flax.serialization

        if _layout(flax.serialization.to_state_dict(stats)) == _layout(saved):
            stats = from_state_dict(stats, saved, name="stats")
    return LossScaleOptimizerState(inner, scale, stats)


def _owns(node: Any) -> bool:
    return isinstance(node, LossScaleOptimizerState)


def register_with_flax() -> None:
    """Lets flax restore a state saved with ``stats_every`` on into one with it off, and the other way (see
    :func:`restore_state_dict`); a no-op until flax is imported, never imports it. Called at import of
    ``lossscale.jax`` and by each ``init()``, so it is in place whichever is imported first."""
    serialize_namedtuples_with(restore_state_dict, _owns)
