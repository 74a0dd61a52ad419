"""Untrusted configs stay inert (hypothesis): lossscale.get and from_config never import or call a drawn name."""

from __future__ import annotations

import lossscale as ls
from tests import properties as props

given, st = props.hypothesis.given, props.st


def configs(data):
    module, class_name = data.draw(props.hostile_names(), label="names")
    config = data.draw(
        st.fixed_dictionaries({}, optional={"initial_loss_scale": st.just(8.0), "module": st.just(module),
                                            "fn": st.just(f"{module}.{class_name}")}),
        label="config",
    )
    identifier = {"class_name": class_name, "config": config, "module": module, "registered_name": class_name}
    if data.draw(st.booleans(), label="plain"):
        identifier = {"class_name": class_name, "config": config}
    return module, class_name, identifier


def check(data) -> None:
    module, class_name, identifier = configs(data)
    props.run_inert([module], [class_name], (lambda: ls.get(identifier), lambda: ls.DynamicLossScale.from_config(identifier["config"])))


@props.fast(60)
@given(st.data())
def test_get_and_from_config_import_and_call_nothing_named(data):
    check(data)


@props.slow(60)
@given(st.data())
def test_get_and_from_config_import_and_call_nothing_named_slow(data):
    check(data)


def test_the_guard_catches_an_import_and_a_call():
    import importlib
    import os

    guard = props.Inert(["lossscale_probe_x"])
    try:
        with guard:
            try:
                importlib.import_module("lossscale_probe_x")
            except ImportError:
                pass
            os.system("true")
    except AssertionError as error:
        assert "import_module('lossscale_probe_x')" in str(error) and "os.system" in str(error)
    else:
        raise AssertionError("the guard missed an import and a call")
