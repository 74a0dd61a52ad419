"""One vocabulary across the bindings (issue 23, /work/notes/VOCAB.md), pinned by introspection.

Every binding's constructor, ``lossscale.torch.LossScaleOptimizer``, ``lossscale.jax.loss_scale_optimizer``
and ``lossscale.keras.LossScaleOptimizer``, must take the same keywords with the same defaults, expose the same
attributes on a built instance (on JAX: on the optimizer state, ``history`` being the keyword's object), and raise
the same error type for the same bad value, naming the keyword. The probe of each binding runs in its own
process for Keras (one backend per process: ``KERAS_BACKEND``, default ``torch`` here), in this one otherwise.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import installed

#: (keyword, default): every keyword of the vocabulary; ``loss_scale`` is the one positional.
KEYWORDS = (
    "loss_scale", "dynamic", "initial_scale", "dynamic_growth_steps", "min_loss_scale", "max_loss_scale",
    "hysteresis", "max_consecutive_skips", "history", "stats_every",
)
ATTRIBUTES = ("loss_scale", "skipped_steps", "last_step_skipped", "consecutive_skips", "history", "gradient_stats")
#: The value each attribute has on a freshly built instance with no arguments.
FRESH = {"loss_scale": 2.0**15, "skipped_steps": 0, "last_step_skipped": False, "consecutive_skips": 0, "history": None,
         "gradient_stats": None}
#: (keyword, bad value, an error class it raises): one vocabulary of errors.
BAD = (
    ("dynamic", "yes", "TypeError"),
    ("initial_scale", -1.0, "ValueError"),
    ("initial_scale", "big", "TypeError"),
    ("dynamic_growth_steps", 0, "ValueError"),
    ("dynamic_growth_steps", 2.5, "TypeError"),
    ("min_loss_scale", -1.0, "ValueError"),
    ("min_loss_scale", "big", "TypeError"),
    ("max_loss_scale", 0.5, "ValueError"),
    ("hysteresis", 0, "ValueError"),
    ("hysteresis", 1.5, "TypeError"),
    ("max_consecutive_skips", 0, "ValueError"),
    ("max_consecutive_skips", 1.5, "TypeError"),
    ("history", "yes", "TypeError"),
    ("stats_every", 0, "ValueError"),
    ("stats_every", "4", "TypeError"),
)
BINDINGS = ("torch", "jax", "keras")
_ROOT = pathlib.Path(__file__).resolve().parent.parent

# ------------------------------------------------------------ the probes: what each binding offers, as plain data


def _builder(binding: str) -> tuple[Any, Any]:
    """``(constructor, build(**kwargs) -> object whose attributes are read)`` for a binding."""
    if binding == "torch":
        import torch

        import lossscale.torch as lst

        def build(**kwargs: Any) -> Any:
            return lst.LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), **kwargs)

        return lst.LossScaleOptimizer, build
    if binding == "jax":
        import jax.numpy as jnp
        import optax

        import lossscale.jax as lsj

        def build(**kwargs: Any) -> Any:
            history = kwargs.get("history")
            opt = lsj.loss_scale_optimizer(optax.sgd(0.1), **kwargs)
            return _JaxView(opt.init({"w": jnp.ones(2)}), history)

        return lsj.loss_scale_optimizer, build
    import keras

    import lossscale.keras as lsk

    def build(**kwargs: Any) -> Any:
        opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), **kwargs)
        opt.build([keras.Variable([1.0, 1.0])])
        return opt

    return lsk.LossScaleOptimizer, build


class _JaxView:
    """The JAX state's fields, with ``history`` the keyword's object (the state holds arrays only)."""

    def __init__(self, state: Any, history: Any) -> None:
        self._state, self.history = state, history

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


def _plain(value: Any) -> Any:
    if value is None:
        return None
    try:
        import numpy as np

        array = np.asarray(value)
        return array.item() if array.shape == () else repr(value)
    except Exception:  # noqa: BLE001 - anything else is compared by its repr
        return repr(value)


def probe(binding: str) -> dict[str, Any]:
    """What ``binding`` offers: its signature, a fresh instance's attributes, and its errors for the bad values."""
    ctor, build = _builder(binding)
    params = inspect.signature(ctor).parameters
    signature = {
        name: {"kind": str(p.kind), "default": repr(p.default)} for name, p in params.items() if name in KEYWORDS
    }
    names = list(params)
    out: dict[str, Any] = {"signature": signature, "second": names[1] if len(names) > 1 else None}
    fresh = build()
    out["attributes"] = {name: _plain(getattr(fresh, name)) if hasattr(fresh, name) else "<missing>"
                         for name in ATTRIBUTES}
    errors = {}
    for keyword, value, _ in BAD:
        kwargs = {keyword: value}
        if keyword == "max_loss_scale":
            kwargs["min_loss_scale"] = 1.0
        try:
            build(**kwargs)
            errors[f"{keyword}={value!r}"] = [["no error"], ""]
        except Exception as error:  # noqa: BLE001 - the type is what is compared
            errors[f"{keyword}={value!r}"] = [[c.__name__ for c in type(error).__mro__], str(error)]
    out["errors"] = errors
    return out


_CACHE: dict[str, dict[str, Any]] = {}


def probed(binding: str) -> dict[str, Any]:
    if binding not in _CACHE:
        module = {"torch": "torch", "jax": "optax", "keras": "keras"}[binding]
        if not installed(module):
            pytest.skip(f"{module} is not installed")
        if binding != "keras":
            _CACHE[binding] = probe(binding)
        else:
            env = {**os.environ, "KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "torch")}
            code = "import json, tests.test_vocabulary as t; print(json.dumps(t.probe('keras')))"
            run = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, env=env, capture_output=True, text=True,
                                 timeout=300, check=False)
            assert run.returncode == 0, run.stderr[-3000:]
            _CACHE[binding] = json.loads(run.stdout.strip().splitlines()[-1])
    return _CACHE[binding]


def _cases(items: Any) -> list[Any]:
    return [pytest.param(binding, item, id=f"{binding}-{item}") for binding in BINDINGS for item in items]


_BAD_IDS = [f"{k}={v!r}" for k, v, _ in BAD]

# ------------------------------------------------------------ the tests


@pytest.mark.parametrize("binding, keyword", _cases(KEYWORDS))
def test_every_binding_takes_the_keyword_with_default_none(binding, keyword):
    info = probed(binding)
    assert keyword in info["signature"], f"{binding} lacks the keyword {keyword}"
    assert info["signature"][keyword]["default"] == "None"
    expected = "POSITIONAL_OR_KEYWORD" if keyword == "loss_scale" else "KEYWORD_ONLY"
    assert info["signature"][keyword]["kind"] == expected
    if keyword == "loss_scale":
        assert info["second"] == "loss_scale"  # right after the wrapped optimizer


@pytest.mark.parametrize("binding, attribute", _cases(ATTRIBUTES))
def test_every_binding_has_the_attribute_with_the_same_fresh_value(binding, attribute):
    value = probed(binding)["attributes"][attribute]
    assert value != "<missing>", f"{binding} has no attribute {attribute}"
    expected = FRESH[attribute]
    if isinstance(expected, float):
        assert math.isclose(value, expected)
    else:
        assert value == expected


@pytest.mark.parametrize("binding, case", _cases(_BAD_IDS))
def test_every_binding_raises_the_same_error_type_naming_the_keyword(binding, case):
    expected = {f"{k}={v!r}": e for k, v, e in BAD}[case]
    info = probed(binding)
    assert case.split("=")[0] in info["signature"], f"{binding} lacks the keyword"  # not an "unexpected keyword"
    got, message = info["errors"][case]  # the error's classes, its own first
    assert expected in got, f"{binding} raised {got[0]} for {case}: {message}"
    assert case.split("=")[0] in message
