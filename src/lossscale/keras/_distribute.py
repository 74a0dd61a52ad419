"""The step under ``tf.distribute`` (``MirroredStrategy``, ``MultiWorkerMirroredStrategy``), TensorFlow backend.

Per step, in each replica (the replica context ``strategy.run`` and ``fit``
give)::

    g = all_reduce(SUM, g) if experimental_aggregate_gradients else g   # one all-reduce
    u = g if already unscaled else g * (1/S); finite = all(isfinite(u))
    merge_call:                                        # cross-replica, once per step
        finite = finite of replica 0 (all equal: every replica holds the same sums)
        if finite: each replica runs inner.apply(u)    # its own all-reduce switched off
        S, counters = next_state(...)                  # one assign of the mirrored state

With ``experimental_aggregate_gradients=False`` the replicas' gradients may
differ (the user aggregated them, or did not), so the flags are summed over
the replicas instead (one scalar all-reduce). Either way every replica takes
the same branch: on a skip the weights, the inner optimizer's slots and
``iterations`` stay as they were everywhere, and the scale backs off once.

The branch is taken in the cross-replica context, as tf-keras did: a ``cond``
whose branch reaches a ``merge_call`` (the inner optimizer's update) cannot
run in a replica context. Host syncs: none under ``tf.function``.
"""

from __future__ import annotations

from typing import Any

from keras import ops

from ._compat import inner_aggregation_off
from ._state import ScaleState
from ._step import unscale_and_check

__all__ = ["in_replica_of_strategy", "replica_apply"]


def in_replica_of_strategy() -> bool:
    """True inside ``strategy.run`` (or ``fit``) of a non-default strategy; raises in its cross-replica context."""
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return False
    if tf.distribute.in_cross_replica_context():
        raise ValueError(
            "apply() must be called in a replica context: call it inside strategy.run(step_fn, ...) (model.fit "
            "does), not directly under strategy.scope()."
        )
    return True


def _all_reduce_sum(context: Any, grads: list[Any]) -> list[Any]:
    present = [g for g in grads if g is not None]
    if not present:
        return grads
    import tensorflow as tf

    summed = iter(context.all_reduce(tf.distribute.ReduceOp.SUM, present))
    return [None if g is None else next(summed) for g in grads]


def replica_apply(
    state: ScaleState, inner: Any, grads: list[Any], variables: list[Any], already: bool, aggregate: bool
) -> None:
    """One step from a replica; see the module docstring. Returns nothing (the inner's updates are assigned)."""
    if state.stats is not None:
        raise ValueError(
            "stats_every (and loss_scale='auto') is not supported under tf.distribute yet: train without "
            "a strategy, or on the JAX backend, or drop stats_every/loss_scale='auto'."
        )
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if aggregate:
        grads = _all_reduce_sum(context, grads)
    scale = ops.convert_to_tensor(state.variables[0])
    unscaled, finite = unscale_and_check(grads, variables, scale, already, state.at_least_one)
    if not aggregate:
        bad = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32))
        finite = tf.equal(bad, 0.0)

    def inner_apply(replica_grads: list[Any]) -> None:
        inner.apply(replica_grads, variables)

    def cross_replica(strategy: Any, unscaled: Any, finite: Any) -> None:
        flag = strategy.experimental_local_results(finite)[0]
        current = state.read()

        def apply() -> None:
            with inner_aggregation_off(inner):  # here, not per replica: the replicas run in threads
                strategy.extended.call_for_each_replica(inner_apply, args=(unscaled,))

        ops.cond(flag, apply, lambda: None)
        state.finish(current, flag)

    context.merge_call(cross_replica, args=(unscaled, finite))
