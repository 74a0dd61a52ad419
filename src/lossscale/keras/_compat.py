"""The private Keras and TensorFlow APIs this binding uses, each with the public replacement it is waiting for."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import keras

__all__ = [
    "HIDDEN_FROM_DIR", "LegacyCheckpoint", "before_tf_restore", "checkpoint_children", "checkpoint_node",
    "in_xla_trace", "inner_aggregation_off", "no_automatic_dependency_tracking", "not_inlined", "version_counter",
]


def no_automatic_dependency_tracking(method: Callable[..., Any]) -> Callable[..., Any]:
    """Keras' private ``no_automatic_dependency_tracking`` (variables not also tracked as attributes)."""
    try:
        from keras.src.utils import tracking
    except ImportError:  # pragma: no cover - a Keras that moved it
        return method
    return tracking.no_automatic_dependency_tracking(method)


def not_inlined(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` as a ``tf.function`` that TensorFlow calls instead of inlining (the private ``_noinline`` attribute), so
    that a ``cond`` branch holding it is one node to skip. Eager code, other backends, or a TF that refuses the
    attribute: ``fn`` (eagerly a new function would trace on every call)."""
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
    private ``control_flow_util.GraphOrParentsInXlaContext``. False eagerly, on other backends, or where TF moved it."""
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
    """Calls ``check(value)`` before ``tf.train.Checkpoint`` restores ``variable`` (TF's ``_restore_from_tensors``)."""
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
    """Within the block, ``inner``'s private ``_all_reduce_sum_gradients`` sums nothing (the caller summed)."""
    object.__setattr__(inner, "_all_reduce_sum_gradients", list)
    try:
        yield
    finally:
        object.__delattr__(inner, "_all_reduce_sum_gradients")


def checkpoint_node() -> Any:
    """A TensorFlow ``AutoTrackable`` to hang the scale variables on for ``tf.train.Checkpoint``, else None."""
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    return tf.__internal__.tracking.AutoTrackable()


def checkpoint_children(inner: Any, node: Any, save_type: str, **kwargs: Any) -> dict[str, Any]:
    """The wrapper's checkpoint children (private ``_trackable_children``): the inner's own, plus ``loss_scale``."""
    return {**inner._trackable_children(save_type, **kwargs), "loss_scale": node}


#: Hidden from ``dir()``: TF's checkpoint writer takes an object listing ``get_slot_names`` for a tf-keras optimizer
#: and saves its slots a second time, which TF then refuses. Public replacement: none.
HIDDEN_FROM_DIR = ("get_slot_names",)


#: lossscale 0.1's names of the five scale variables, tracked on the wrapper itself.
LEGACY_SCALE_NAMES = (
    "dynamic_scale", "step_counter", "_bad_steps_variable", "_skipped_steps_variable", "_consecutive_skips_variable"
)


class LegacyCheckpoint:
    """Restores a ``tf.train.Checkpoint`` of lossscale 0.1 (TF's ``_checkpoint_adapter`` and ``_lookup_dependency``):
    its scale names map to today's variables, its unused ``_iterations``, ... (today the inner's) to throwaway ones."""

    _UNUSED = ("_iterations", "_learning_rate", "_variables")

    def __init__(self) -> None:
        self.active = False
        self._sinks: dict[str, Any] = {}

    def adapter(self, path: str) -> None:
        """Notes whether ``path`` holds 0.1's wrapper (children ``inner_optimizer`` and ``_bad_steps_variable``)."""
        import tensorflow as tf
        from google.protobuf.message import DecodeError
        from tensorflow.core.protobuf import trackable_object_graph_pb2

        try:
            reader = tf.train.load_checkpoint(path)
            graph = trackable_object_graph_pb2.TrackableObjectGraph()
            graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
        except (tf.errors.OpError, ValueError, KeyError, DecodeError):  # no object graph there: nothing of 0.1's
            self.active = False
            return
        names = ({child.local_name for child in node.children} for node in graph.nodes)
        self.active = any({"inner_optimizer", "_bad_steps_variable"} <= children for children in names)

    def lookup(self, name: str, inner: Any, scale_variables: list[Any]) -> tuple[bool, Any]:
        """``(handled, dependency)`` for ``name`` of a 0.1 checkpoint; ``(False, None)``: today's lookup decides."""
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

    @staticmethod
    def built(optimizer: Any, scale_variables: list[Any]) -> None:
        """Hands the scale variables to restorations of a 0.1 checkpoint that waited for ``build``."""
        waiting = getattr(optimizer, "_deferred_dependencies", None) or {}
        for name, variable in zip(LEGACY_SCALE_NAMES, scale_variables):
            if name in waiting:
                optimizer._handle_deferred_dependencies(name=name, trackable=variable)


def trace_of(tensor: Any) -> Any:
    """The trace ``tensor`` belongs to: TensorFlow's graph of a symbolic tensor, JAX's trace of a tracer (both private
    attributes), else None (an eager value)."""
    try:
        graph = getattr(tensor, "graph", None)  # an EagerTensor raises AttributeError: None
    except AttributeError:
        graph = None
    return graph if graph is not None else getattr(tensor, "_trace", None)
