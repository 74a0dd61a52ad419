"""``stats_every`` for Keras: sampled gradient statistics and ``AutoLossScale``'s state, as Keras variables.

The statistics are the core's (:mod:`lossscale._stats`) and the auto rule is
the core's :func:`lossscale._auto.next_auto_state`, both run over the
backend's namespace (:mod:`._xp`). Per apply::

    sampled = count % N == 0
    sample  = cond(sampled, core statistics of the scaled gradients, previous sample)
    S, ...  = next_auto_state(...) with AutoLossScale, else the TF rule (lossscale.next_state)
    count  += 1                                      # every apply, skipped ones included

Everything lives in non-trainable variables created with the optimizer's
own (``stats_count``, the sample's 11 values, and with ``AutoLossScale`` its
5), so ``fit``'s compiled step (``tf.function``, JAX ``stateless_apply``)
carries them, ``.keras`` files and pickles save them, and no value leaves
the device. The branch is ``ops.cond``: ``tf.cond``/``lax.cond`` (an
unsampled step runs no reduction), a Python ``if`` on torch (one host read
of the flag per step, as the torch backend's own step branch).

Cost on a sampled step: one read pass over each gradient (four reductions,
the core's), about 15 ops per tensor plus 60 scalar ops. Unsampled: the
``cond`` and about 10 scalar ops. With gradients already unscaled by
``get_unscaled_gradients``, one more multiply per element (``g * S``).
Measured (``benchmarks/bench_keras_stats.py``, 1M-parameter MLP, Adam,
``mixed_float16``, loaded 2-core VM): ``stats_every=1`` makes the whole
``train_on_batch`` step 1.32x (JAX), 1.23x (TF), 1.34-1.46x (torch) as
long; ``stats_every=16`` 1.01-1.08x, 1.01-1.03x, 1.13x.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from .._auto import AutoLossScale, AutoState, check_stats_every, initial_auto_state, next_auto_state
from .._policy import LossScale
from .._rule import LossScaleState
from .._stats import GradientStats, as_mapping, empty_stats, summarize, tensor_sums
from ._backend import advance
from ._xp import namespace, unwrap, wrap

__all__ = ["StatsVariables", "check_stats_every"]

Measured = tuple[GradientStats | None, Any]


def _read(variable: Any) -> Any:
    """A variable's value; a copy except on JAX (torch updates in place; TF may hand over the variable)."""
    value = ops.convert_to_tensor(variable)
    return value if keras.backend.backend() == "jax" else ops.copy(value)


class StatsVariables:
    """The sampled statistics of one optimizer's gradients and, with ``AutoLossScale``, the auto state.

    Args:
        every: measure every ``every``-th apply.
        policy: the optimizer's policy.
    """

    def __init__(self, every: int, policy: LossScale) -> None:
        self.every = every
        self.auto_policy = policy if isinstance(policy, AutoLossScale) else None
        self.count: Any = None
        self.sample: list[Any] = []
        self.auto: list[Any] = []
        self.names: tuple[str, ...] = ()
        self._ids: dict[int, int] = {}

    @property
    def built(self) -> bool:
        return self.count is not None

    def build(self, add_variable: Callable[..., Any], trainable: Sequence[Any]) -> list[Any]:
        """Creates the variables for the gradients of ``trainable`` (in that order); returns them."""
        self._ids = {id(v): i for i, v in enumerate(trainable)}
        self.names = tuple(str(getattr(v, "path", None) or v.name) for v in trainable)

        def make(name: str, value: Any) -> Any:
            value = np.asarray(value)
            return add_variable(
                shape=value.shape,
                dtype=str(value.dtype),
                initializer=keras.initializers.Constant(value.reshape(-1)[0].item() if value.size else 0),
                aggregation="none",
                name=name,
            )

        self.count = make("stats_count", np.int32(0))
        start = empty_stats(len(trainable), np)
        self.sample = [make(f"stats_{k}", v) for k, v in zip(GradientStats._fields, start)]
        if self.auto_policy is not None:
            auto = initial_auto_state(self.auto_policy, np)
            self.auto = [make(f"auto_{k}", v) for k, v in zip(AutoState._fields, auto)]
        return [self.count, *self.sample, *self.auto]

    def measure(self, grads: Sequence[Any], variables: Sequence[Any], scale: Any, already: bool) -> Measured:
        """This apply's sample (the previous one when not sampled) and the 0-d bool ``sampled``.

        ``grads`` are the scaled gradients of ``variables`` (unscaled when ``already``: measured as ``g * S``).
        """
        count = _read(self.count)  # a copy: the sample keeps it as its step while the counter moves on
        sampled = ops.equal(ops.mod(count, self.every), 0)
        slots: list[Any] = [None] * len(self.names)
        for g, v in zip(grads, variables):
            index = self._ids.get(id(v))
            if index is None:
                raise ValueError(
                    f"stats_every measures the variables the optimizer was built with; {v.name!r} is not one. "
                    "Build a new optimizer for a new set of variables."
                )
            slots[index] = g
        sizes = [0 if g is None else int(np.prod(tuple(g.shape))) for g in slots]

        def take() -> tuple[Any, ...]:
            xp = namespace()
            zero = wrap(ops.zeros((), "float32"))
            sums = []
            for g, n in zip(slots, sizes):
                if g is None or n == 0:
                    sums.append((zero, zero, zero, zero))
                    continue
                if already:
                    g = ops.multiply(ops.cast(g, "float32"), ops.cast(scale, "float32"))
                sums.append(tensor_sums(wrap(g), xp))
            on_device = {"device": count.device} if keras.backend.backend() == "torch" else {}
            return tuple(unwrap(x) for x in summarize(sums, sizes, wrap(count), xp, **on_device))

        if self.every == 1:
            return GradientStats(*take()), sampled
        if keras.backend.backend() == "torch":  # eager: the branch is a Python ``if`` anyway; None = not sampled
            return (GradientStats(*take()) if bool(sampled) else None), sampled
        values = ops.cond(sampled, take, lambda: tuple(_read(v) for v in self.sample))
        return GradientStats(*values), sampled

    def advance(self, params: Any, state: LossScaleState, finite: Any, measured: Measured) -> LossScaleState:
        """The new scale state (the auto rule with ``AutoLossScale``, else the TF rule); assigns the statistics."""
        given, sampled = measured
        kept = given is None  # torch, unsampled: the variables keep the previous sample, unwritten
        sample = GradientStats(*(ops.convert_to_tensor(v) for v in self.sample)) if given is None else given
        if self.auto_policy is not None:
            xp = namespace()
            auto = AutoState(*(wrap(_read(v)) for v in self.auto))
            new, new_auto = next_auto_state(
                self.auto_policy,
                LossScaleState(*map(wrap, state)),
                auto,
                wrap(finite),
                GradientStats(*map(wrap, sample)),
                wrap(sampled),
                xp,
            )
            new = LossScaleState(*map(unwrap, new))
            for variable, value in zip(self.auto, new_auto):
                variable.assign(unwrap(value))
        else:
            new = advance(params, state, finite)
        if not kept:
            for variable, value in zip(self.sample, sample):
                variable.assign(value)
        count = ops.convert_to_tensor(self.count)
        self.count.assign(ops.where(ops.less(count, 2**31 - 1), ops.add(count, 1), count))
        return new

    def columns(self, measured: Measured) -> tuple[Any, ...]:
        """``(sampled, headroom_bits, zero_fraction, subnormal_fraction)`` for the History's stats columns."""
        sample, sampled = measured
        if sample is None:  # torch, unsampled
            return (sampled,)
        return (sampled, sample.headroom_bits, sample.zero_fraction, sample.subnormal_fraction)

    def mapping(self) -> dict[str, Any] | None:
        """``gradient_stats``: the latest sample as :func:`lossscale._stats.as_mapping` (None until built).

        Before the first sample ``step`` is -1 and every value NaN. No copy, no host sync.
        """
        if not self.built:
            return None
        return as_mapping(GradientStats(*(ops.convert_to_tensor(v) for v in self.sample)), self.names)
