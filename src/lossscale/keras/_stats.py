"""``stats_every`` for Keras: the scaled gradients' :func:`lossscale._stats.tensor_sums` and the sampler's variables
(the decisions are :mod:`lossscale._sampler`'s). Cost, sampled: one read pass, ~60 scalar ops; unsampled: the
``cond`` (torch: a Python ``if`` on a host copy of the count) and the count's ~7 ops; where the ``cond`` returns
the sample (JAX, TensorFlow with a History) also the kept sample's 11 variables read and written back."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import keras
import numpy as np
from keras import ops

from .._auto import AutoLossScale, AutoState, initial_auto_state
from .._policy import LossScale
from .._sampler import SamplerState, is_due
from .._stats import GradientStats, as_mapping, empty_stats, sizes_of, summarize_columns, tensor_sums
from .._stats import _headroom as headroom
from ._compat import in_xla_trace, not_inlined, version_counter
from ._grads import XP, cond

__all__ = ["Measurement", "StatsVariables"]


def _read(variable: Any) -> Any:
    """A variable's value now: a copy except on JAX (torch updates in place; TF may hand over the variable)."""
    value = ops.convert_to_tensor(variable)
    return value if keras.backend.backend() == "jax" else ops.copy(value)


def _host_int(tensor: Any) -> int:
    """A 0-d torch tensor's value on the host: a view of its memory on the CPU, a copy (one host sync) elsewhere."""
    return int(tensor.detach().cpu().numpy())


def _sum_of_bools(mask: Any) -> Any:
    return ops.sum(ops.cast(mask, "float32"))


class Measurement(NamedTuple):
    """What :meth:`StatsVariables.measure` took of one step, for the core's sampler.

    Attributes:
        sample: the step's :class:`~lossscale._stats.GradientStats` where sampled (traced: the kept sample
            otherwise; torch: None otherwise).
        sampled: whether the step is sampled (a 0-d bool tensor; torch: a Python bool).
        count: the sampler's count before the step, read once (torch: a Python int).
    """

    sample: GradientStats | None
    sampled: Any
    count: Any


class StatsVariables:
    """The sampler of one optimizer (``every``: measure every ``every``-th apply) as Keras variables."""

    def __init__(self, every: int, policy: LossScale) -> None:
        self.every, self.policy = every, policy
        self.count: Any = None  # the sampler's step count, a variable once built
        self.names: tuple[str, ...] = ()
        self.sample: list[Any] = []
        self.auto: list[Any] = []
        self.initial: list[Any] = []  # the built variables' initial values (numpy), in build's order
        self._sizes: dict[Any, Any] = {}  # torch: (device, sizes) -> the sizes as a tensor there
        self._host_count: tuple[Any, Any, int] | None = None  # torch: (count tensor, its version, its value)

    @property
    def built(self) -> bool:
        return self.count is not None

    def build(self, add_variable: Callable[..., Any], trainable: Sequence[Any]) -> list[Any]:
        """Creates the variables for the gradients of ``trainable`` (in that order); returns them."""
        self._ids = {id(v): i for i, v in enumerate(trainable)}  # the gradients' order
        self.initial = []
        self.names = tuple(str(getattr(v, "path", None) or v.name) for v in trainable)

        def make(name: str, value: Any) -> Any:
            value = np.asarray(value)
            first = value.flat[0].item() if value.size else 0
            self.initial.append(np.full(value.shape, first, value.dtype))  # what the initializer writes
            init = keras.initializers.Constant(first)
            return add_variable(shape=value.shape, dtype=str(value.dtype), initializer=init, aggregation="none", name=name)

        self.count = make("stats_count", np.int32(0))
        self.sample = [make(f"stats_{k}", v) for k, v in zip(GradientStats._fields, empty_stats(len(trainable), np))]
        if isinstance(self.policy, AutoLossScale):
            self.auto = [make(f"auto_{k}", v) for k, v in zip(AutoState._fields, initial_auto_state(self.policy, np))]
        return [self.count, *self.sample, *self.auto]

    @property
    def variables(self) -> list[Any]:
        """The variables :meth:`build` created, in its order (empty before)."""
        return [] if self.count is None else [self.count, *self.sample, *self.auto]

    def due(self) -> tuple[Any, Any]:
        """``(count, sampled)``: a copy of the count (the sample's step) and whether this apply is sampled."""
        count = _read(self.count)
        return count, is_due(self.every, count)

    def stored(self) -> tuple[Any, ...]:
        return tuple(_read(v) for v in self.sample)

    def when_due(self, sampled: Any, take: Callable[[], Any], otherwise: Callable[[], Any]) -> Any:
        """``take()`` on a sampled apply, else ``otherwise()``: a ``cond`` unless every apply is sampled."""
        return take() if self.every == 1 else cond(sampled, take, otherwise)

    def in_build_order(self, grads: Sequence[Any], variables: Sequence[Any]) -> tuple[list[Any], list[int]]:
        """The gradients in build order and their sizes (a variable not given, or a None gradient: None, size 0)."""
        ordered: list[Any] = [None] * len(self.names)
        for g, v in zip(grads, variables):
            index = self._ids.get(id(v))
            if index is None:
                raise ValueError(
                    f"stats_every measures the variables the optimizer was built with; {v.name!r} is not one. "
                    "Build a new optimizer for a new set of variables."
                )
            ordered[index] = g
        return ordered, [0 if g is None else math.prod(g.shape) for g in ordered]

    def table(self, ordered: Sequence[Any], sizes: Sequence[int], scale: Any, already: bool) -> Any:
        """The ``(4, T)`` float32 :func:`~lossscale._stats.tensor_sums` of the scaled gradients (empty ones: 0). On
        TensorFlow's executor (not XLA) the counts are sums of converted bools, which it runs faster than the default
        ``where`` (1.0 ms against 1.5 ms for 1M float32 elements on one thread); under XLA, the default."""
        count = _sum_of_bools if keras.backend.backend() == "tensorflow" and not in_xla_trace() else None

        def sums(g: Any) -> Any:
            g = ops.multiply(ops.cast(g, "float32"), ops.cast(scale, "float32")) if already else g
            return ops.stack(list(tensor_sums(g, XP, count)))

        return ops.stack([sums(g) if n else ops.zeros((4,), "float32") for g, n in zip(ordered, sizes)], axis=1)

    def summary(self, sums: Any, sizes: Sequence[int], count: Any, replicas: int = 1) -> tuple[Any, ...]:
        """The :class:`GradientStats` values of :meth:`table`'s sums (over ``replicas`` tensors of each size; in a
        graph, not on torch: the sizes are constants).

        Under TensorFlow's XLA (``jit_compile=True``) a max drops NaN (XLA's fast min/max), so ``max|g|`` of a
        tensor holding NaN came out finite, and a sampled step whose flag is ``isfinite(amax)`` applied it. There a
        NaN sum of squares (NaN only from a NaN: squares are >= 0) makes the tensor's and the overall amax NaN, as
        eagerly: about 10 ops on the ``(T,)`` columns, no pass over the gradients."""
        columns = ops.unstack(sums, 4)
        stats = GradientStats(*summarize_columns(columns, [n * replicas for n in sizes], count, XP))
        if in_xla_trace():
            nan = ops.isnan(columns[3])
            tensor_amax = ops.where(nan, math.nan, stats.tensor_amax)
            amax = ops.where(ops.any(nan), math.nan, stats.amax)
            stats = stats._replace(amax=amax, headroom_bits=headroom(amax, XP), tensor_amax=tensor_amax,
                                   tensor_headroom_bits=headroom(tensor_amax, XP))
        return tuple(stats)

    def measure(
        self, grads: Sequence[Any], variables: Sequence[Any], scale: Any, already: bool, *,
        check: Callable[[], Any] | None = None, fuse: bool = False,
        in_branch: Callable[[Any, Measurement], None] | None = None, eager: bool = False,
    ) -> tuple[Any, Measurement | None]:
        """This step's sample, in a ``cond`` on whether it is due (the kept sample otherwise), and the finite flag.

        Args:
            grads: the gradients as the optimizer got them (scaled unless ``already``), one per variable.
            variables: their variables (any subset of those the optimizer was built with, in any order).
            scale: the loss scale the gradients were computed with (a 0-d tensor).
            already: whether ``grads`` are already unscaled (then the sums are taken of ``grads * scale``).
            check: computes the finite flag (the step's own check); None on torch, whose step checks by itself.
            fuse: the scale is at least 1 on every step: then on a sampled step whose gradients are scaled and
                float32 or narrower the flag is ``isfinite(amax)`` of the sample instead of ``check()`` (max
                propagates NaN, and float32 holds their amax: one read pass for both).
            in_branch: TensorFlow with nothing recorded: called in each branch of the sample's ``cond`` with that
                branch's flag and measurement (the step advances there), so that an unsampled step neither reads
                nor writes the sample (for 8 gradients, 50 nodes more than without statistics; 215 when the kept
                sample was selected and written on every step).
            eager: torch's eager step, which writes the variables in place, the count after the sample: the
                sample's ``step`` is then the count variable's tensor, not a copy of it (one operator fewer). Under
                a ``StatelessScope`` the caller may write the values back in any order, so a copy is kept.

        Returns:
            ``(finite, measured)``: ``finite`` the flag (None on torch); ``measured`` the :class:`Measurement`
            (None when ``in_branch`` took it). On torch the step is decided on the host: ``sampled`` is a Python
            bool and ``count`` an int.

        Cost, sampled: one read pass over the gradients, about 60 scalar ops; unsampled: the ``cond`` (torch: a
        Python ``if`` on a host copy of the count, no host sync).
        """
        if keras.backend.backend() == "torch":  # eager: the flag from the count on the host, a Python bool
            count = self.host_count()
            flag = is_due(self.every, count)
            sample = self._torch_sample(*self.in_build_order(grads, variables), scale, already, eager) if flag else None
            return None, Measurement(sample, flag, count)
        ordered, sizes = self.in_build_order(grads, variables)
        count, sampled = self.due()
        fused = fuse and not already and all(
            g is None or keras.backend.standardize_dtype(g.dtype) in ("float16", "bfloat16", "float32") for g in grads
        )

        def branch(sample: GradientStats | None) -> Any:
            finite = ops.isfinite(sample.amax) if fused and sample is not None else check()  # type: ignore[misc]
            if in_branch is None:
                return (finite, *(sample or self.stored()))
            in_branch(finite, Measurement(sample, sample is not None, count))
            return finite

        def take() -> Any:
            return branch(GradientStats(*self.summary(self.table(ordered, sizes, scale, already), sizes, count)))

        # Sampled, one TensorFlow function call that is not inlined: the unsampled branch stays one node to skip.
        out = self.when_due(sampled, not_inlined(take) if in_branch and self.every > 1 else take, lambda: branch(None))
        return (out, None) if in_branch else (out[0], Measurement(GradientStats(*out[1:]), sampled, count))

    def sampler_state(self, measured: Measurement) -> SamplerState:
        """The core's :class:`~lossscale._sampler.SamplerState` before the step: ``measured``'s count, the kept
        sample's variables (not read: the core keeps them on an unsampled step), the auto state read."""
        auto = AutoState(*(_read(v) for v in self.auto)) if self.auto else None
        return SamplerState(measured.count, self.kept(measured), auto)

    def kept(self, measured: Measurement) -> GradientStats:
        """The sample as the step leaves it: the step's where sampled, else the kept sample's variables (not read)."""
        return measured.sample or GradientStats(*self.sample)

    def store(self, measured: Measurement, after: SamplerState) -> None:
        """Writes the core sampler's state ``after`` the step: the auto state, the sample where the step gave one (an
        unsampled step leaves the sample variables alone), then the count (last: on torch the sample's ``step`` is
        the count variable's own tensor). torch counts on the host and adds 1 with ``assign_add`` unless saturated:
        no copy from the host, two kernels on a GPU for an unsampled step."""
        on_host = keras.backend.backend() == "torch"
        given = after.sample if measured.sample is not None else ()
        for variable, value in [*zip(self.auto, after.auto or ()), *zip(self.sample, given)]:
            variable.assign(value)
        if on_host and after.count != measured.count:  # saturates at 2**31 - 1
            self.count.assign_add(1)  # not in place on the tensor: under a StatelessScope it is the caller's
        elif not on_host:
            self.count.assign(after.count)
        if on_host:
            self.host_count(after.count)

    def store_eager(self, measured: Measurement, count: int) -> None:
        """:meth:`store` for torch's eager step off the CPU, whose scale another form moved: the count + 1 in place
        (``count``: the new count, saturating) and on a sampled step the sample by one multi-tensor copy, written as
        :meth:`store` writes them. 1 operator unsampled, 2 sampled (:meth:`store`: 2 and 13). Not under a
        ``StatelessScope`` (its variables are the caller's values there)."""
        from .._torch._compat import foreach_copy_

        if measured.sample is not None:  # first: its step is the count variable's tensor
            foreach_copy_([v.value for v in self.sample], list(measured.sample))
        if count != measured.count:
            self.count.value.add_(1)
        self.host_count(count)

    def auto_views(self) -> AutoState | None:
        """torch CPU: writable numpy views of the auto state's variables (None without ``AutoLossScale``)."""
        return AutoState(*(v.value.detach().numpy() for v in self.auto)) if self.auto else None

    def store_on_host(self, count: int) -> None:
        """torch CPU: writes the count the core's host twin computed into the count's variable, in place."""
        self.count.value.detach().numpy()[...] = count  # type: ignore[attr-defined]
        self.host_count(count)

    def host_count(self, written: int | None = None) -> int:
        """torch: the step count as a Python int (``written``: this sampler just wrote it to the variable). The copy
        is kept with the variable's tensor and version; the variable is read (one host sync on a GPU) only when they
        changed since (a load, an ``assign``), so a step adds no sync to the step's own."""
        value, known = self.count.value, self._host_count  # type: ignore[attr-defined]
        if (written is not None or known is None or known[0] is not value or known[1] is None
                or known[1] != version_counter(value)):
            known = self._host_count = (value, version_counter(value), _host_int(value) if written is None else written)
        return known[2]

    def _torch_sample(self, ordered: Sequence[Any], sizes: list[int], scale: Any, already: bool,
                      eager: bool) -> GradientStats:
        """The sample on torch: the torch binding's kernels (multi-tensor off the CPU), the sizes copied once."""
        from .._torch._kernels import sample_columns

        count = ops.convert_to_tensor(self.count) if eager else _read(self.count)  # see measure's ``eager``
        key = (count.device, tuple(sizes))
        if key not in self._sizes:
            self._sizes = {key: sizes_of(sizes, XP, device=count.device)}
        empty: Any = count.new_zeros((0,), dtype=scale.dtype) if 0 in sizes else None  # a None gradient: sums 0
        columns = sample_columns([g if n else empty for g, n in zip(ordered, sizes)], scale if already else None)
        return summarize_columns(columns, self._sizes[key], count, XP)

    def mapping(self) -> dict[str, Any] | None:
        """``gradient_stats``: the kept sample as :func:`lossscale._stats.as_mapping` (None until built)."""
        if not self.built:
            return None
        return as_mapping(GradientStats(*(ops.convert_to_tensor(v) for v in self.sample)), self.names)
