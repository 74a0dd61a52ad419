"""Untrusted Keras configs stay inert (hypothesis): from_config imports and calls nothing a config names."""

from __future__ import annotations

import keras
from hypothesis import given
from hypothesis import strategies as st

import lossscale.keras as lsk
from tests import properties as props


def check(data) -> None:
    module, class_name = data.draw(props.hostile_names(), label="names")
    inner = {"class_name": class_name, "config": {"learning_rate": 0.1}, "module": module,
             "registered_name": data.draw(st.sampled_from([None, class_name, f"pkg>{class_name}"]), label="registered")}
    if data.draw(st.booleans(), label="builtin inner"):
        inner = {"class_name": "SGD", "config": {"learning_rate": 0.1}, "module": module, "registered_name": None}
    config = {"inner_optimizer": inner}
    where = data.draw(st.sampled_from(["inner", "loss_scale", "outer"]), label="where")
    if where == "loss_scale":
        config["loss_scale"] = {"class_name": class_name, "config": {}, "module": module}
    props.run_inert([module], [class_name], (
        lambda: lsk.LossScaleOptimizer.from_config(dict(config)),
        lambda: keras.saving.deserialize_keras_object(
            {"class_name": "LossScaleOptimizer", "module": "lossscale.keras", "config": dict(config),
             "registered_name": "lossscale>LossScaleOptimizer"}
        ),
    ))


@props.fast(30)
@given(st.data())
def test_from_config_imports_and_calls_nothing_named(data):
    check(data)


@props.slow(30)
@given(st.data())
def test_from_config_imports_and_calls_nothing_named_slow(data):
    check(data)
