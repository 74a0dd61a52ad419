"""The step under ``tf.distribute`` (``MirroredStrategy``, ``MultiWorkerMirroredStrategy``), in each replica::

    sums = cond(sampled, this replica's tensor_sums of g, 0)   # stats_every only, before the all-reduce
    g = all_reduce(SUM, g) if experimental_aggregate_gradients else g
    u = g if already unscaled else g * (1/S); finite = all(isfinite(u))
    merge_call:                                        # cross-replica, once per step
        finite = replica 0's (all equal); without aggregation: no replica's flag is False (a scalar all-reduce)
        sample = cond(sampled, summarize(gather(sums)), kept)   # stats_every only: one gather of 4 * T floats
        if finite: each replica runs inner.apply(u)    # its own all-reduce switched off
        S, counters = advance(...)                     # one assign of the mirrored state (._state)

Every replica takes the same branch (chosen in the cross-replica context, as tf-keras: a ``cond`` whose branch
reaches a ``merge_call`` cannot run in a replica), so a skip leaves every replica alike and the scale backs off
once. The sample treats the replicas' backward passes as side by side. Host syncs: none under ``tf.function``.
"""

from __future__ import annotations

from typing import Any

from keras import ops

from .._stats import GradientStats
from ._compat import inner_aggregation_off
from ._diagnostics import StepObserver
from ._grads import unscale_and_check
from ._state import ScaleVariables
from ._stats import Measurement, StatsVariables

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
    state: ScaleVariables, observer: StepObserver, inner: Any, grads: list[Any], variables: list[Any], already: bool,
    aggregate: bool,
) -> None:
    """One step from a replica; see the module docstring.

    Args:
        state: the optimizer's scale variables (mirrored).
        observer: the optimizer's history and stall guard.
        inner: the inner optimizer (its own all-reduce is switched off while it applies).
        grads: this replica's gradients, one per variable (None for none), scaled unless ``already``.
        variables: the variables they are for.
        already: whether the gradients went through ``get_unscaled_gradients``.
        aggregate: sum the gradients over the replicas before the check (``experimental_aggregate_gradients``);
            False: the caller summed them, and a step is skipped if any replica's flag is False.
    """
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    scale = ops.convert_to_tensor(state.fields().loss_scale)
    stats = state.stats
    if stats is not None:  # this replica's own gradients, before the all-reduce
        sums, sizes = _replica_sums(stats, grads, variables, scale, already)
    if aggregate:
        grads = _all_reduce_sum(context, grads)
    unscaled, finite = unscale_and_check(grads, variables, scale, already, state.at_least_one)
    if not aggregate:
        bad = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32))
        finite = tf.equal(bad, 0.0)

    def inner_apply(replica_grads: list[Any]) -> None:
        inner.apply(replica_grads, variables)

    def cross_replica(strategy: Any, unscaled: Any, finite: Any, sums: Any) -> None:
        flag = strategy.experimental_local_results(finite)[0]
        current = state.read()
        measured = None if stats is None else _global_sample(strategy, stats, sums, sizes)

        def apply() -> None:
            with inner_aggregation_off(inner):  # here, not per replica: the replicas run in threads
                strategy.extended.call_for_each_replica(inner_apply, args=(unscaled,))

        ops.cond(flag, apply, lambda: None)
        new, kept = state.advance(current, flag, measured)
        observer.observe(current.loss_scale, flag, new, measured, kept)

    context.merge_call(cross_replica, args=(unscaled, finite, None if stats is None else sums))


def _replica_sums(stats: StatsVariables, grads: list[Any], variables: list[Any], scale: Any, already: bool) -> Any:
    """This replica's ``(1, 4, T)`` sums when sampled (else zeros), and the sizes."""
    ordered, sizes = stats.in_build_order(grads, variables)

    def take() -> Any:
        return stats.table(ordered, sizes, scale, already)[None]

    return stats.when_due(stats.due()[1], take, lambda: ops.zeros((1, 4, len(sizes)), "float32")), sizes


def _global_sample(strategy: Any, stats: StatsVariables, sums: Any, sizes: list[int]) -> Measurement:
    """The :class:`._stats.Measurement` of all replicas' sums: max of the maxima, sums of the rest."""
    count, sampled = stats.due()
    replicas = strategy.num_replicas_in_sync

    def take() -> tuple[Any, ...]:
        table = strategy.gather(sums, axis=0)  # (replicas, 4, T)
        combined = ops.concatenate([ops.max(table[:, :1], axis=0), ops.sum(table[:, 1:], axis=0)], axis=0)
        return stats.summary(combined, sizes, count, replicas)  # a NaN or Inf max propagates

    return Measurement(GradientStats(*stats.when_due(sampled, take, stats.stored)), sampled, count)
