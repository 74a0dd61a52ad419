"""Test-suite wiring: markers, and bindings skipped when their framework is missing.

Markers (see ``pyproject.toml``): ``torch``, ``jax``, ``keras``, ``slow``,
``distributed``, ``cuda``. Tests under ``tests/<framework>/`` get their
framework's marker automatically, so ``pytest -m "not torch"`` works.

With numpy and pytest alone (``pip install -e . pytest``), the core's tests and
doctests run; the bindings' tests and doctests are not collected.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

_FRAMEWORKS = {"torch": "torch", "jax": "jax", "keras": "keras"}
_HERE = pathlib.Path(__file__).parent



def installed(module: str) -> bool:
    """Whether ``module`` is really installed. ``tests/`` is on sys.path, so ``find_spec("jax")`` alone would
    take the directory tests/jax for a namespace package named jax."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin is not None


# The binding's doctests under src/ are ignored by the root conftest.py.
# The directory itself, not only its files: its conftest.py imports the framework.
collect_ignore = [marker for marker, module in _FRAMEWORKS.items() if not installed(module)]

# hypothesis profiles of the property tests (tests/*/test_property*.py), see tests/properties.py. Without
# hypothesis (`make test-core`) those tests skip themselves.
if installed("hypothesis"):
    from tests.properties import register_profiles

    register_profiles()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for marker in _FRAMEWORKS:
            if marker in parts:
                item.add_marker(getattr(pytest.mark, marker))
