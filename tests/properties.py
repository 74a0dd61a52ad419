"""Shared pieces of the property-based tests (hypothesis): profiles, example counts and drawn bad values.

Profiles (registered in ``tests/conftest.py``; choose one with the environment
variable ``HYPOTHESIS_PROFILE=NAME``, which also sets the example counts below):

* ``lossscale`` (the default): derandomized (the same examples on every run,
  so CI cannot flake), no deadline (the machine is shared), no example
  database. Each test states its own small example count; the whole set adds
  about a minute to ``make test``.
* ``lossscale-slow``: the tests marked ``slow`` (the same properties with five
  times the examples) run under it; derandomized too, so CI gives one answer.
* ``lossscale-deep``: for fuzzing locally: random, and every example count
  multiplied by ``LOSSSCALE_FUZZ`` (default 20), e.g.
  ``HYPOTHESIS_PROFILE=lossscale-deep LOSSSCALE_FUZZ=50 pytest -k property``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")  # without it (`make test-core`) the property tests skip
st = pytest.importorskip("hypothesis.strategies")
HealthCheck, settings = hypothesis.HealthCheck, hypothesis.settings

_COMMON = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
}


def register_profiles() -> None:
    settings.register_profile("lossscale", derandomize=True, **_COMMON)
    settings.register_profile("lossscale-slow", derandomize=True, **_COMMON)
    settings.register_profile("lossscale-deep", derandomize=False, **_COMMON)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "lossscale"))


def _deep() -> int:
    """``LOSSSCALE_FUZZ`` (default 20) under the ``lossscale-deep`` profile, else 1."""
    return int(os.environ.get("LOSSSCALE_FUZZ", "20")) if os.environ.get("HYPOTHESIS_PROFILE") == "lossscale-deep" else 1


def fast(examples: int) -> Callable[[Any], Any]:
    """The loaded profile with ``examples`` examples (times LOSSSCALE_FUZZ under ``lossscale-deep``)."""
    return settings(max_examples=examples * _deep())


def slow(examples: int) -> Callable[[Any], Any]:
    """``lossscale-slow`` (or ``lossscale-deep``) with five times ``examples``, and the ``slow`` mark."""
    parent = "lossscale-deep" if _deep() > 1 else "lossscale-slow"

    def wrap(test: Any) -> Any:
        limit = 5 * examples * _deep()
        return pytest.mark.slow(settings(settings.get_profile(parent), max_examples=limit)(test))

    return wrap


# ------------------------------------------------------------------ drawn values

#: What a hand-edited or damaged checkpoint may hold in place of one number (the issue's list).
BAD_SCALARS = [math.nan, math.inf, -math.inf, -1, -1.0, 0, 0.0, 1e-45, "2", None, True, [1.0], 2**40, 1e39]


def bad_values(two_element: Callable[[], Any] | None = None) -> st.SearchStrategy:
    """One bad value for a field; ``two_element`` builds the binding's 2-element tensor."""
    values = st.sampled_from(BAD_SCALARS)
    if two_element is not None:
        values = values | st.just("two-element").map(lambda _: two_element())
    return values


def policies() -> st.SearchStrategy:
    """A drawn dynamic or fixed policy, small growth interval so that growth happens in a short run."""
    import lossscale as ls

    dynamic = st.builds(
        lambda initial, period, multiplier, hysteresis, bounded, backoff: ls.DynamicLossScale(
            initial_loss_scale=2.0**initial,
            increment_period=period,
            multiplier=multiplier,
            hysteresis=hysteresis,
            min_loss_scale=1.0,
            max_loss_scale=2.0 ** (initial + 3) if bounded else None,
            backoff_factor=backoff,
        ),
        st.integers(0, 24),
        st.integers(1, 4),
        st.sampled_from([2.0, 4.0, 1.5]),
        st.integers(1, 3),
        st.booleans(),
        st.none() | st.sampled_from([0.5, 0.25]),
    )
    fixed = st.sampled_from([1.0, 128.0, 2.0**15]).map(ls.FixedLossScale)
    manager = st.builds(
        lambda n, k: ls.ExponentialUpdateLossScaleManager(2.0**10, n, decr_every_n_nan_or_inf=k),
        st.integers(1, 4),
        st.integers(1, 3),
    )
    return st.one_of(dynamic, dynamic, fixed, manager)


def step_plans(max_steps: int = 8) -> st.SearchStrategy:
    """A list of steps; each is None (finite) or ``(kind, which)``: inject NaN/+inf/-inf into gradient ``which``."""
    bad = st.tuples(st.sampled_from(["nan", "inf", "-inf"]), st.integers(0, 7))
    return st.lists(st.none() | bad, min_size=1, max_size=max_steps)


def in_bounds(scale: float, policy: Any) -> bool:
    """Finite, positive, and within ``policy``'s bounds (compared in float32)."""
    import numpy as np

    params = policy.rule_params()
    high = np.float32(params.max_scale) if params.max_scale is not None else np.float32(3.4028234663852886e38)
    return math.isfinite(scale) and scale > 0 and np.float32(params.min_scale) <= np.float32(scale) <= high


# ------------------------------------------------------------------ untrusted names (issue 22, B7's rule)

#: Callables a hostile config might name. The process-spawning ones are replaced by recorders that run nothing;
#: eval/exec (which dataclasses and namedtuple use legitimately) still run, and are recorded when their source
#: names a drawn module or class.
DANGEROUS = {"os": ["system", "popen", "execv", "execvp"], "subprocess": ["Popen", "run", "call", "check_output"]}
EVALUATORS = ["eval", "exec"]


def hostile_names() -> st.SearchStrategy:
    """``(module, class_name)``: a module that does not exist (or a dangerous real one) and a class name."""
    fresh = st.from_regex(r"lossscale_probe_[a-z]{1,6}(\.[a-z]{1,6})?", fullmatch=True)
    keras_fresh = fresh.map(lambda m: "keras." + m)
    dangerous = st.sampled_from([*sorted(DANGEROUS), "builtins"])
    module = st.one_of(fresh, keras_fresh, dangerous)
    names = [n for ns in DANGEROUS.values() for n in ns] + EVALUATORS
    class_name = st.one_of(
        st.sampled_from(names + ["DynamicLossScale", "SGD", "Adam", "LossScaleOptimizer"]),
        fresh,
        st.builds(lambda m, n: f"{m}.{n}", dangerous, st.sampled_from(names)),
        st.builds(lambda n: f"pkg>{n}", st.sampled_from(names)),
    )
    return st.tuples(module, class_name)


class Inert:
    """Fails the test if, inside the block, a drawn module is imported or a dangerous callable is called.

    ``importlib.import_module`` and ``builtins.__import__`` are wrapped: an import of a name in ``modules``
    (or below it) is recorded. ``os.system``, ``subprocess.Popen``, ``builtins.eval``, ... are replaced by
    functions that record the call. Probe modules (``lossscale_probe_*``) don't exist, so importing one would
    fail anyway; the record catches it even when the code under test swallows the error.
    """

    def __init__(self, modules: list[str], names: list[str] = ()):
        self.modules = [m for m in modules if "lossscale_probe_" in m]
        self.names = [n for n in [*modules, *names] if n not in ("os", "subprocess", "builtins")]
        self.calls: list[str] = []

    def _watched(self, name: Any) -> bool:
        name = str(name)
        return any(name == m or name.startswith(m + ".") or m.startswith(name + ".lossscale_probe_")
                   for m in self.modules)

    def __enter__(self) -> Inert:  # noqa: PYI034
        import builtins
        import importlib
        import sys

        self._saved: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, attr: str, new: Any) -> None:
            self._saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, new)

        real_import_module, real_import = importlib.import_module, builtins.__import__

        def import_module(name: str, package: Any = None) -> Any:
            if self._watched(name):
                self.calls.append(f"importlib.import_module({name!r})")
            return real_import_module(name, package)

        def dunder_import(name: str, *args: Any, **kwargs: Any) -> Any:
            if self._watched(name):
                self.calls.append(f"__import__({name!r})")
            return real_import(name, *args, **kwargs)

        patch(importlib, "import_module", import_module)
        for module_name, attrs in DANGEROUS.items():
            module = sys.modules.get(module_name) or real_import_module(module_name)
            for attr in attrs:
                patch(module, attr, lambda *a, _n=f"{module_name}.{attr}", **k: self.calls.append(_n))
        for attr in EVALUATORS:
            real = getattr(builtins, attr)

            def evaluator(source: Any, *args: Any, _real: Any = real, _n: str = attr, **kwargs: Any) -> Any:
                if isinstance(source, str) and any(name in source for name in self.names):
                    self.calls.append(f"{_n}({source[:60]!r})")
                return _real(source, *args, **kwargs)

            patch(builtins, attr, evaluator)
        patch(builtins, "__import__", dunder_import)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, value in reversed(self._saved):
            setattr(owner, attr, value)
        assert not self.calls, f"untrusted names were imported or called: {self.calls}"


def run_inert(modules: list[str], names: list[str], calls: Any) -> None:
    """Runs each of ``calls`` inside :class:`Inert`: a refusal (TypeError/ValueError) is fine; an import of a drawn
    module or a call of a dangerous callable fails the test."""
    with Inert(modules, names):
        for call in calls:
            try:
                call()
            except (TypeError, ValueError):
                pass
