"""``stats_every`` for Keras: the scaled gradients' :func:`lossscale._stats.tensor_sums` and the sampler's variables.
Cost, sampled: one read pass, ~60 scalar ops; unsampled: the ``cond`` (torch: a Python ``if`` on a host copy of the
count) and the count's ~7 ops (TensorFlow without a strategy or a record: :meth:`StatsVariables.sample_or_check`,
``auto``'s rule without the sample's ops), or ~25 small ops (``history=``, JAX, ``tf.distribute``: the kept sample
read, selected and written)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from .._auto import AutoLossScale, AutoState, initial_auto_state
from .._policy import LossScale
from .._rule import LossScaleState, advance_in_place
from .._sampler import SamplerState, counted_sampler_state, is_due, next_sampler_state
from .._stats import GradientStats, as_mapping, empty_stats, sizes_of, summarize_columns, tensor_sums
from ._compat import in_xla_trace, not_inlined, version_counter
from ._step import XP

__all__ = ["StatsVariables"]


def _read(variable: Any) -> Any:
    """A variable's value now: a copy except on JAX (torch updates in place; TF may hand over the variable)."""
    value = ops.convert_to_tensor(variable)
    return value if keras.backend.backend() == "jax" else ops.copy(value)


def _host_int(tensor: Any) -> int:
    """A 0-d torch tensor's value on the host: a view of its memory on the CPU, a copy (one host sync) elsewhere."""
    return int(tensor.detach().cpu().numpy())


def _sum_of_bools(mask: Any) -> Any:
    return ops.sum(ops.cast(mask, "float32"))


class StatsVariables:
    """The sampler of one optimizer (``every``: measure every ``every``-th apply) as Keras variables."""

    def __init__(self, every: int, policy: LossScale) -> None:
        self.every, self.policy = every, policy
        self.count: Any = None  # the sampler's step count, a variable once built
        self.names: tuple[str, ...] = ()
        self.sample: list[Any] = []
        self._sizes: dict[Any, Any] = {}  # torch: (device, sizes) -> the sizes as a tensor there
        self._host_count: tuple[Any, Any, int] | None = None  # torch: (count tensor, its version, its value)
        self.auto: list[Any] = []

    @property
    def built(self) -> bool:
        return self.count is not None

    def build(self, add_variable: Callable[..., Any], trainable: Sequence[Any]) -> list[Any]:
        """Creates the variables for the gradients of ``trainable`` (in that order); returns them."""
        self._ids = {id(v): i for i, v in enumerate(trainable)}  # the gradients' order
        self.names = tuple(str(getattr(v, "path", None) or v.name) for v in trainable)

        def make(name: str, value: Any) -> Any:
            value = np.asarray(value)
            init = keras.initializers.Constant(value.flat[0].item() if value.size else 0)
            return add_variable(shape=value.shape, dtype=str(value.dtype), initializer=init, aggregation="none", name=name)

        self.count = make("stats_count", np.int32(0))
        self.sample = [make(f"stats_{k}", v) for k, v in zip(GradientStats._fields, empty_stats(len(trainable), np))]
        if isinstance(self.policy, AutoLossScale):
            self.auto = [make(f"auto_{k}", v) for k, v in zip(AutoState._fields, initial_auto_state(self.policy, np))]
        return [self.count, *self.sample, *self.auto]

    def due(self) -> tuple[Any, Any]:
        """``(count, sampled)``: a copy of the count (the sample's step) and whether this apply is sampled."""
        count = _read(self.count)
        return count, is_due(self.every, count)

    def stored(self) -> tuple[Any, ...]:
        return tuple(_read(v) for v in self.sample)

    def slots(self, grads: Sequence[Any], variables: Sequence[Any]) -> tuple[list[Any], list[int]]:
        """The gradients in build order and their sizes (a variable not given, or a None gradient: None, size 0)."""
        slots: list[Any] = [None] * len(self.names)
        for g, v in zip(grads, variables):
            index = self._ids.get(id(v))
            if index is None:
                raise ValueError(
                    f"stats_every measures the variables the optimizer was built with; {v.name!r} is not one. "
                    "Build a new optimizer for a new set of variables."
                )
            slots[index] = g
        return slots, [0 if g is None else math.prod(g.shape) for g in slots]

    def table(self, slots: Sequence[Any], sizes: Sequence[int], scale: Any, already: bool) -> Any:
        """The ``(4, T)`` float32 :func:`~lossscale._stats.tensor_sums` of the scaled gradients (empty ones: 0). On
        TensorFlow's executor (not XLA) the counts are sums of converted bools, which it runs faster than the default
        ``where`` (1.0 ms against 1.5 ms for 1M float32 elements on one thread); under XLA, the default."""
        count = _sum_of_bools if keras.backend.backend() == "tensorflow" and not in_xla_trace() else None

        def sums(g: Any) -> Any:
            g = ops.multiply(ops.cast(g, "float32"), ops.cast(scale, "float32")) if already else g
            return ops.stack(list(tensor_sums(g, XP, count)))

        return ops.stack([sums(g) if n else ops.zeros((4,), "float32") for g, n in zip(slots, sizes)], axis=1)

    def summary(self, sums: Any, sizes: Sequence[int], count: Any, replicas: int = 1) -> tuple[Any, ...]:
        """The :class:`GradientStats` values of :meth:`table`'s sums (over ``replicas`` tensors of each size)."""
        on = {"device": count.device} if keras.backend.backend() == "torch" else {}
        return tuple(summarize_columns(ops.unstack(sums, 4), [n * replicas for n in sizes], count, XP, **on))

    def measure(
        self, grads: Sequence[Any], variables: Sequence[Any], scale: Any, already: bool, check: Any = None
    ) -> tuple[Any, Any]:
        """``(finite, (sample, sampled))`` of this apply (``sample`` None on torch when not sampled). With ``check``
        (for scaled ``grads``: the flag's function), a sampled apply's flag is ``isfinite(amax)``, max propagating
        NaN: one read pass; an unsampled one's ``check()``. Without, or on torch, ``finite`` is None."""
        if keras.backend.backend() == "torch":  # eager: the flag from the count on the host, a Python bool
            flag = self.every == 1 or self.host_count() % self.every == 0
            return None, ((self._torch_sample(*self.slots(grads, variables), scale, already) if flag else None), flag)
        slots, sizes = self.slots(grads, variables)
        count, sampled = self.due()

        def take() -> tuple[Any, ...]:
            values = self.summary(self.table(slots, sizes, scale, already), sizes, count)
            return values if check is None else (ops.isfinite(values[1]), *values)  # values[1]: the overall amax

        def keep() -> tuple[Any, ...]:
            return self.stored() if check is None else (check(), *self.stored())

        out = take() if self.every == 1 else ops.cond(sampled, take, keep)
        finite, values = (None, out) if check is None else (out[0], out[1:])
        return finite, (GradientStats(*values), sampled)

    def sample_or_check(
        self, grads: Sequence[Any], variables: Sequence[Any], scale: Any, already: bool, check: Callable[[], Any],
        fused: bool, rule: Callable[[Any, GradientStats | None, Any], None] | None = None,
    ) -> Any:
        """The flag of a TensorFlow step that nothing records (the caller checks): ``cond(sampled, sample written to
        its variables, then isfinite(amax) if fused else check(), check())``, and the count advanced. ``rule(finite,
        sample or None, count)``, ``auto``'s, runs in each branch (None: the caller runs the TF rule). An unsampled step
        neither reads nor writes the sample, nor runs the rule's sample ops, and the sampled branch is one function
        call: TensorFlow's executor runs 53 nodes more than without statistics, against 215 through :meth:`measure`
        and :meth:`advance` (which keep the sample with selects and write it on every step)."""
        slots, sizes = self.slots(grads, variables)
        count, sampled = self.due()

        def take() -> Any:
            values = self.summary(self.table(slots, sizes, scale, already), sizes, count)
            for variable, value in zip(self.sample, values):
                variable.assign(value)
            finite = ops.isfinite(values[1]) if fused else check()  # values[1]: the overall amax, NaN propagating
            if rule is not None:
                rule(finite, GradientStats(*values), count)
            return finite

        def skip() -> Any:
            finite = check()
            if rule is not None:
                rule(finite, None, count)
            return finite

        finite = take() if self.every == 1 else ops.cond(sampled, not_inlined(take), skip)
        counted = counted_sampler_state(SamplerState(count, GradientStats(*self.sample), None), None, False, XP)
        self.count.assign(counted.count)
        return finite

    def auto_rule(self, state: LossScaleState, count: Any, finite: Any, sample: GradientStats | None) -> LossScaleState:
        """The core sampler's ``auto`` rule on the step at ``count`` and its ``sample`` (None: not sampled, the rule's
        sample ops skipped), inside :meth:`sample_or_check`'s branches; assigns the auto state, returns the new scale
        state. The count is sample_or_check's to advance (the sampler's next one here is not used)."""
        kept = GradientStats(*self.sample) if sample is None else sample  # the variables themselves: not read
        return self._ruled(state, count, kept, finite, sample, sample is not None)[0]

    def _ruled(self, state: LossScaleState, count: Any, kept: GradientStats, finite: Any,
               sample: GradientStats | None, sampled: Any) -> tuple[LossScaleState, SamplerState]:
        """The core sampler's step from ``count`` and the ``kept`` sample, on the auto variables (read, then
        assigned): the new scale state and the sampler state after it (count and sample for the caller to write)."""
        auto = AutoState(*(_read(v) for v in self.auto)) if self.auto else None
        new, after = next_sampler_state(self.policy, state, SamplerState(count, kept, auto), finite, sample, sampled, XP)
        for variable, value in zip(self.auto, after.auto or ()):
            variable.assign(value)
        return new, after

    def advance(self, state: LossScaleState, finite: Any, measured: Any) -> tuple[LossScaleState, GradientStats]:
        """The new scale state and kept sample by the core's sampler (``measure`` chose the sample); assigns both.
        An eager torch step known on the host to be unsampled neither reads nor writes the kept sample (its
        variables are returned) and adds 1 to the count unless the host copy says it is saturated: two kernels on a
        GPU, where it launched 16 (a copy of each sample variable and of the count, the count's rule)."""
        sample, sampled = measured
        if sampled is False:
            kept, count = GradientStats(*self.sample), self.host_count()
            new, after = self._ruled(state, count, kept, finite, None, False)
            if after.count != count:  # saturates at 2**31 - 1
                self.count.assign_add(1)  # not in place on the tensor: under a StatelessScope it is the caller's
            self._counted_on_host(after.count)
            return new, kept
        given = None if sample is None else GradientStats(*sample)
        kept_in = given if given is not None else GradientStats(*self.stored())
        new, after = self._ruled(state, _read(self.count), kept_in, finite, given, sampled)
        written = list(zip(self.sample, after.sample)) if sample is not None else []
        for variable, value in [(self.count, after.count), *written]:
            variable.assign(value)
        if keras.backend.backend() == "torch":
            self._counted_on_host()
        return new, after.sample

    def host_count(self) -> int:
        """torch: the step count as a Python int. A copy is kept since this sampler last wrote the variable; the
        variable is read (one host sync on a GPU) only when its tensor or version changed since (a load, an
        ``assign``), so an unsampled step adds no sync to the step's own."""
        value, known = self.count.value, self._host_count  # type: ignore[attr-defined]
        if known is None or known[0] is not value or known[1] is None or known[1] != version_counter(value):
            known = self._host_count = (value, version_counter(value), _host_int(value))
        return known[2]

    def _counted_on_host(self, stepped: int | None = None) -> None:
        """After this sampler advanced the count variable: the host copy moves to ``stepped`` (the new count, if the
        caller has it on the host), else by the core's count rule."""
        value, known = self.count.value, self._host_count  # type: ignore[attr-defined]
        if stepped is None and known is not None:
            stepped = counted_sampler_state(SamplerState(known[2], None, None), None, False, np).count  # type: ignore[arg-type]
        if stepped is not None:
            self._host_count = (value, version_counter(value), int(stepped))

    def _torch_sample(self, slots: Sequence[Any], sizes: list[int], scale: Any, already: bool) -> GradientStats:
        """The sample on torch: the torch binding's kernels (multi-tensor off the CPU), the sizes copied once."""
        from .._torch_kernels import sample_columns

        count = _read(self.count)
        key = (count.device, tuple(sizes))
        if key not in self._sizes:
            self._sizes = {key: sizes_of(sizes, XP, device=count.device)}
        empty = count.new_zeros((0,), dtype=scale.dtype)  # a None gradient: size 0, sums 0
        columns = sample_columns([g if n else empty for g, n in zip(slots, sizes)], scale if already else None)
        return summarize_columns(columns, self._sizes[key], count, XP)

    def advance_unsampled_in_place(self, views: LossScaleState, finite: bool) -> None:
        """:meth:`advance` of an unsampled step in numpy on ``views`` of the torch CPU scale variables and on views of
        this sampler's: the rule (an ``AutoLossScale``'s reads no statistics then) and the count, in place."""
        count = self.count.value.detach().numpy()  # type: ignore[attr-defined]
        auto = [v.value.detach().numpy() for v in self.auto]
        sampler = SamplerState(int(count), None, AutoState(*(a.copy() for a in auto)) if auto else None)  # type: ignore[arg-type]
        if auto:
            state = LossScaleState(*(view.copy() for view in views))
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                new, after = next_sampler_state(self.policy, state, sampler, np.bool_(finite), None, False, np)
            for view, value in [*zip(views, new), *zip(auto, after.auto or ())]:
                view[...] = value
        else:
            advance_in_place(self.policy.rule_params(), views, finite)
            after = counted_sampler_state(sampler, None, False, np)
        count[...] = after.count  # the core's saturating count (a Python int here)
        self._counted_on_host(after.count)

    def mapping(self) -> dict[str, Any] | None:
        """``gradient_stats``: the kept sample as :func:`lossscale._stats.as_mapping` (None until built)."""
        if not self.built:
            return None
        return as_mapping(GradientStats(*(ops.convert_to_tensor(v) for v in self.sample)), self.names)
