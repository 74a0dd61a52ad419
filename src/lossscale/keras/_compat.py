"""The private Keras, TensorFlow, JAX and torch APIs this binding uses, each with the public replacement it is
waiting for (or why there is none).

Everything else in :mod:`lossscale.keras` uses the frameworks' public APIs only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import keras

__all__ = [
    "HIDDEN_FROM_DIR",
    "CheckpointParts",
    "LegacyCheckpoint",
    "before_tf_restore",
    "checkpoint_node",
    "in_xla_trace",
    "inner_aggregation_off",
    "install_checkpoint_hooks",
    "is_jax_tracer",
    "no_automatic_dependency_tracking",
    "not_inlined",
    "version_counter",
]


def no_automatic_dependency_tracking(method: Callable[..., Any]) -> Callable[..., Any]:
    """Keras' private ``tracking.no_automatic_dependency_tracking`` (its own ``LossScaleOptimizer.build`` uses it):
    TensorFlow's checkpoint records the variables once, not also as attributes. Public replacement: none."""
    try:
        from keras.src.utils import tracking
    except ImportError:  # pragma: no cover - a Keras that moved it
        return method
    return tracking.no_automatic_dependency_tracking(method)


def built_variables(optimizer: Any) -> list[Any]:
    """The variables ``optimizer.build`` was given, in that order: Keras' private ``_trainable_variables`` (Keras 3's
    own ``LossScaleOptimizer`` reads it too). Public replacement: none (``optimizer.variables`` are its own)."""
    return optimizer._trainable_variables  # type: ignore[no-any-return]


def own_variables(optimizer: Any) -> list[Any]:
    """The wrapper's own variables, without the inner optimizer's: Keras' private ``_variables``. Public
    replacement: none (Keras 3's ``LossScaleOptimizer.variables`` appends the inner's)."""
    return optimizer._variables  # type: ignore[no-any-return]


def not_inlined(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` as a ``tf.function`` that TensorFlow calls instead of inlining (the private ``_noinline`` attribute), so
    that a ``cond`` branch holding it is one node to skip. Eager code, other backends, or a TF that refuses the
    attribute: ``fn`` (eagerly a new function would trace on every call). Public replacement: none (TensorFlow
    inlines every ``tf.function`` it calls from a graph)."""
    if keras.backend.backend() != "tensorflow":
        return fn
    import tensorflow as tf

    if tf.executing_eagerly():
        return fn

    try:
        return tf.function(fn, autograph=False, experimental_attributes={"_noinline": True})  # type: ignore[no-any-return]
    except (TypeError, ValueError):  # pragma: no cover - a TF without the attribute
        return fn


def in_xla_trace() -> bool:
    """Whether TensorFlow is tracing a step that XLA compiles (``jit_compile=True``; Keras's default on a GPU): TF's
    private ``control_flow_util.GraphOrParentsInXlaContext``. False eagerly, on other backends, or where TF moved it.
    Public replacement: none (a ``tf.function`` does not say whether XLA compiles it)."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    if tf.executing_eagerly():
        return False
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - a TF that moved it
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def version_counter(tensor: Any) -> int | None:
    """A torch tensor's in-place write count (the private ``_version`` autograd keeps; no public API), or None where it
    keeps none (inference tensors)."""
    try:
        return int(tensor._version)
    except (AttributeError, RuntimeError):
        return None


def before_tf_restore(variable: Any, check: Callable[[Any], None]) -> None:
    """Calls ``check(value)`` (a numpy value) before ``tf.train.Checkpoint`` restores ``variable``, so that a refused
    value raises and is never assigned: wraps TensorFlow's private ``Trackable._restore_from_tensors`` on the
    instance. Public replacement: none (no restore callback per variable)."""
    restore = getattr(variable, "_restore_from_tensors", None)
    if restore is None:  # pragma: no cover - a Keras/TF that moved it
        return

    def checked_restore(tensors: Any) -> Any:
        value = tensors.get("VARIABLE_VALUE") if hasattr(tensors, "get") else None
        if value is not None and hasattr(value, "numpy"):
            check(value.numpy())
        return restore(tensors)

    variable._restore_from_tensors = checked_restore


@contextlib.contextmanager
def inner_aggregation_off(inner: Any) -> Iterator[None]:
    """Within the block, Keras' private ``TFOptimizer._all_reduce_sum_gradients`` of ``inner`` sums nothing: the
    gradients are summed already, and a second sum would multiply them by the replicas. Public replacement: none."""
    object.__setattr__(inner, "_all_reduce_sum_gradients", list)
    try:
        yield
    finally:
        object.__delattr__(inner, "_all_reduce_sum_gradients")


def checkpoint_node() -> Any:
    """A TensorFlow ``AutoTrackable`` to hang the scale variables on for ``tf.train.Checkpoint``, else None.
    Public replacement: none (``tf.Module`` also tracks itself by name)."""
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    return tf.__internal__.tracking.AutoTrackable()


class CheckpointParts(NamedTuple):
    """What the checkpoint hooks of :func:`install_checkpoint_hooks` read from the optimizer."""

    inner: Any  # the inner optimizer
    node: Any  # checkpoint_node(): the scale variables' node (None off TensorFlow)
    legacy: LegacyCheckpoint  # restores of 0.1's and Keras 3's layouts
    scale_variables: list[Any]  # the five scale variables (empty before build)


def install_checkpoint_hooks(cls: Any) -> None:
    """Gives ``cls`` (the wrapper) TensorFlow's three private ``tf.train.Checkpoint`` hooks. Public replacement: none
    (``tf.train.Checkpoint`` takes an object's children and its restore lookups only from these methods).

    - ``_trackable_children``: the inner optimizer's children as the wrapper's own, so that plain checkpoints
      restore into the wrapper and back (as tf-keras), plus ``loss_scale`` (the node of the scale variables).
    - ``_checkpoint_adapter``: TensorFlow's restore asks it first: a checkpoint of 0.1, or of Keras 3's class?
      (:meth:`LegacyCheckpoint.adapter`).
    - ``_lookup_dependency``: restores pass the node's children (``cached_dependencies``); TF's own tracking (a name
      already taken?) passes none, and is left to the base class.

    The hooks read the optimizer through its ``_checkpoint_parts()`` (a :class:`CheckpointParts`, or None while its
    ``__init__`` runs: Keras tracks attributes as they are set).
    """

    def _trackable_children(self: Any, save_type: str = "checkpoint", **kwargs: Any) -> dict[str, Any]:
        parts = self._checkpoint_parts()
        return {**parts.inner._trackable_children(save_type, **kwargs), "loss_scale": parts.node}

    def _checkpoint_adapter(self: Any, path: str) -> Any:
        if (parts := self._checkpoint_parts()) is not None:
            parts.legacy.adapter(path)
        return super(cls, self)._checkpoint_adapter(path)

    def _lookup_dependency(self: Any, name: str, cached_dependencies: Any = None) -> Any:
        parts = self._checkpoint_parts()
        if parts is not None and cached_dependencies is not None:
            handled, found = parts.legacy.lookup(name, parts.inner, parts.scale_variables, self)
            if handled:
                return found
        return super(cls, self)._lookup_dependency(name, cached_dependencies)

    cls._trackable_children = _trackable_children  # type: ignore[attr-defined]
    cls._checkpoint_adapter = _checkpoint_adapter  # type: ignore[attr-defined]
    cls._lookup_dependency = _lookup_dependency  # type: ignore[attr-defined]


#: Names hidden from ``dir()``: TensorFlow's checkpoint writer (``checkpoint/util.py``) takes any object whose
#: ``dir()`` lists ``get_slot_names`` for a tf-keras optimizer and saves what ``get_slot`` returns a second time,
#: as slot variables; Keras 3 already saves these variables as the inner optimizer's, and TF refuses the
#: duplicate. Public replacement: none.
HIDDEN_FROM_DIR = ("get_slot_names",)


#: lossscale 0.1's names of the five scale variables, tracked on the wrapper itself.
LEGACY_SCALE_NAMES = (
    "dynamic_scale", "step_counter", "_bad_steps_variable", "_skipped_steps_variable", "_consecutive_skips_variable"
)


class LegacyCheckpoint:
    """Restores a ``tf.train.Checkpoint`` of lossscale 0.1 or of Keras 3's own class (TF's private
    ``_checkpoint_adapter``, ``_lookup_dependency``, ``_deferred_dependencies``, ``_restore_from_tensors``; public
    replacement: none).

    0.1's wrapper node held ``inner_optimizer``, the scale under :data:`LEGACY_SCALE_NAMES`, and its own unused
    ``_variables``, ``_iterations`` and ``_learning_rate``, which today are the inner's names: restored by name they
    would zero ``iterations`` and give int32 counters to float slots. So 0.1's scale names map to today's
    variables, and the unused three to throwaway ones (``assert_consumed`` passes).

    Keras 3's ``dynamic_scale`` is ours; its int64 ``step_counter`` restores into our int32 one through a sink; its
    wrapper's own ``_iterations``, ``_learning_rate`` and ``_variables`` map to our wrapper's own (our children are
    the inner's), and ``inner_optimizer`` to the inner."""

    _UNUSED = ("_iterations", "_learning_rate", "_variables")

    def __init__(self) -> None:
        self.active = False
        self.keras3_counter: Any = None  # the dtype of the step_counter of Keras 3's own class's checkpoint, or None
        self._sinks: dict[str, Any] = {}

    def adapter(self, path: str) -> None:
        """Notes whether ``path`` holds 0.1's wrapper (children ``inner_optimizer`` and ``_bad_steps_variable``), or
        Keras 3's own class (children ``inner_optimizer``, ``dynamic_scale``, ``step_counter``; none of ours)."""
        import tensorflow as tf
        from google.protobuf.message import DecodeError
        from tensorflow.core.protobuf import trackable_object_graph_pb2

        self.active, self.keras3_counter = False, None
        try:
            reader = tf.train.load_checkpoint(path)
            graph = trackable_object_graph_pb2.TrackableObjectGraph()
            graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
        except (tf.errors.OpError, ValueError, KeyError, DecodeError):  # no object graph there: nothing of 0.1's
            return
        for node in graph.nodes:
            children = {child.local_name: child.node_id for child in node.children}
            self.active = self.active or {"inner_optimizer", "_bad_steps_variable"} <= set(children)
            ours = {"loss_scale", "_bad_steps_variable"} & set(children)  # today's and 0.1's
            if {"inner_optimizer", "dynamic_scale", "step_counter"} <= set(children) and not ours:
                attributes = graph.nodes[children["step_counter"]].attributes
                dtypes = reader.get_variable_to_dtype_map()
                if attributes and attributes[0].checkpoint_key in dtypes:
                    self.keras3_counter = dtypes[attributes[0].checkpoint_key]

    def lookup(self, name: str, inner: Any, scale_variables: list[Any], wrapper: Any = None) -> tuple[bool, Any]:
        """``(handled, dependency)`` for ``name`` of a 0.1 checkpoint, or of Keras 3's ``step_counter``; ``(False,
        None)``: today's lookup decides."""
        if self.keras3_counter is not None and name == "inner_optimizer":
            return True, inner  # ours lists the inner's children as its own (tf-keras's layout)
        if self.keras3_counter is not None and name in ("_iterations", "_learning_rate"):
            return True, getattr(wrapper, name)  # Keras 3's wrapper's own (0), not the inner's, which ours lists
        if self.keras3_counter is not None and name in ("step_counter", "_variables"):
            if not scale_variables:
                return True, None  # restored when built (see built)
            if name == "step_counter":
                return True, self._counter_sink(scale_variables)
            return True, self._keras3_list(wrapper, scale_variables)
        if not self.active:
            return False, None
        if name == "inner_optimizer":
            return True, inner
        if name in LEGACY_SCALE_NAMES:
            return True, scale_variables[LEGACY_SCALE_NAMES.index(name)] if scale_variables else None
        if name in self._UNUSED:
            return True, self._sink(name, scale_variables)
        return False, None

    def _sink(self, name: str, scale_variables: list[Any]) -> Any:
        import tensorflow as tf

        if "_iterations" not in self._sinks:
            self._sinks["_iterations"] = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._sinks["_learning_rate"] = tf.Variable(0.0, dtype=tf.float32, trainable=False)
        if name != "_variables":
            return self._sinks[name]
        sinks = self._sinks

        class UnusedList(tf.__internal__.tracking.Trackable):  # 0.1's own list: its 2 unused values, then the scale
            def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict[str, Any]:
                found = [sinks["_iterations"], sinks["_learning_rate"], *scale_variables]
                return {str(i): v for i, v in enumerate(found)}

            def _lookup_dependency(self, name: str, cached_dependencies: Any = None) -> Any:
                return self._trackable_children().get(name)

        return UnusedList()

    def _counter_sink(self, scale_variables: list[Any]) -> Any:
        """A variable of the dtype Keras 3's class saved its ``step_counter`` in (int64 on TensorFlow; ours is
        int32, and TF restores only into the saved dtype) that restores into our counter, through its checks."""
        import tensorflow as tf

        counter = scale_variables[1]
        if "step_counter" in self._sinks:  # one object: the checkpoint names the node twice (also as _variables/2)
            return self._sinks["step_counter"]
        sink = self._sinks["step_counter"] = tf.Variable(0, dtype=self.keras3_counter, trainable=False)

        def restore_into_counter(tensors: Any) -> Any:
            return counter._restore_from_tensors({"VARIABLE_VALUE": tf.cast(tensors["VARIABLE_VALUE"], counter.dtype)})

        sink._restore_from_tensors = restore_into_counter
        return sink

    def _keras3_list(self, wrapper: Any, scale_variables: list[Any]) -> Any:
        """Keras 3's wrapper's own ``_variables`` (``iteration``, ``learning_rate``, ``step_counter``,
        ``dynamic_scale``) as ours; our ``_variables`` child is the inner optimizer's (tf-keras's layout)."""
        import tensorflow as tf

        found = [wrapper._iterations, wrapper._learning_rate, self._counter_sink(scale_variables), scale_variables[0]]

        class Keras3List(tf.__internal__.tracking.Trackable):
            def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict[str, Any]:
                return {str(i): v for i, v in enumerate(found)}

            def _lookup_dependency(self, name: str, cached_dependencies: Any = None) -> Any:
                return self._trackable_children().get(name)

        return Keras3List()

    def before_build(self, optimizer: Any) -> None:
        """Holds back a waiting restore of Keras 3's ``step_counter``, which TF would hand to our int32 counter when
        ``build`` sets it as an attribute (and fail: the saved one is int64); :meth:`built` hands it to a sink."""
        waiting = getattr(optimizer, "_deferred_dependencies", None)
        if self.keras3_counter is not None and waiting and "step_counter" in waiting:
            self._sinks["waiting_counter"] = waiting.pop("step_counter")

    def built(self, optimizer: Any, scale_variables: list[Any]) -> None:
        """Hands the scale variables to restorations of a 0.1 or a Keras 3 checkpoint that waited for ``build``."""
        waiting = getattr(optimizer, "_deferred_dependencies", None) or {}
        if "waiting_counter" in self._sinks:
            waiting["step_counter"] = self._sinks.pop("waiting_counter")
        for name, variable in zip(LEGACY_SCALE_NAMES, scale_variables):
            if name in waiting:
                if name == "step_counter" and self.keras3_counter is not None:
                    variable = self._counter_sink(scale_variables)
                optimizer._handle_deferred_dependencies(name=name, trackable=variable)
        if self.keras3_counter is not None and "_variables" in waiting:
            optimizer._handle_deferred_dependencies(name="_variables", trackable=self._keras3_list(optimizer, scale_variables))


def is_jax_tracer(x: Any) -> bool:
    """:func:`lossscale._jax._compat.is_tracer`, imported only when asked (Keras may run on another backend)."""
    from .._jax._compat import is_tracer

    return is_tracer(x)


def trace_of(tensor: Any) -> Any:
    """The trace ``tensor`` belongs to: TensorFlow's graph of a symbolic tensor (the public ``.graph``), JAX's trace
    of a tracer (the private ``_trace``), else None (an eager value). Public replacement for JAX: none (a tracer does
    not say publicly which trace made it)."""
    try:
        graph = getattr(tensor, "graph", None)  # an EagerTensor raises AttributeError: None
    except AttributeError:
        graph = None
    return graph if graph is not None else getattr(tensor, "_trace", None)
