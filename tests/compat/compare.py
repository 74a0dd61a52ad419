"""Shared by the checkpoint compatibility tests: where the fixtures are, what each recorded, and a nested equality.

The fixtures are written by ``make_fixtures.py`` (one folder per lossscale
version); the tests load every one with today's code.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
#: Every version with fixtures, oldest first ("0.1.0", "0.2.0", ...).
VERSIONS = sorted((p.name for p in FIXTURES.iterdir() if (p / "manifest.json").exists()),
                  key=lambda v: tuple(int(x) for x in v.split(".")))


def manifest(version: str) -> dict[str, Any]:
    return json.loads((FIXTURES / version / "manifest.json").read_text())


def fixture(version: str, name: str) -> pathlib.Path:
    """The path of fixture ``name`` of ``version``; a missing one fails (the generator writes them all)."""
    path = FIXTURES / version / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run tests/compat/make_fixtures.py {version} (see its docstring)")
    return path


def at_save(version: str, name: str) -> dict[str, Any]:
    """What the generator read from the objects it saved as ``name``."""
    return manifest(version)["at_save"][name]


def assert_same(mine: Any, theirs: Any, where: str = "", rtol: float = 0.0) -> None:
    """Equal structure, equal keys and bit-equal numbers (tensors and arrays through numpy).

    With ``rtol``, floating-point arrays may differ by that relative amount (integers, and every other value,
    stay exact).
    """
    if isinstance(mine, dict) or isinstance(theirs, dict):
        assert isinstance(mine, dict) and isinstance(theirs, dict), f"{where}: {type(mine)} vs {type(theirs)}"
        assert sorted(map(str, mine)) == sorted(map(str, theirs)), f"{where}: keys {list(mine)} vs {list(theirs)}"
        for key in mine:
            assert_same(mine[key], theirs[key], f"{where}[{key!r}]", rtol)
    elif isinstance(mine, (list, tuple)) and not hasattr(mine, "shape"):
        assert isinstance(theirs, (list, tuple)) and len(mine) == len(theirs), f"{where}: {mine!r} vs {theirs!r}"
        for i, (a, b) in enumerate(zip(mine, theirs)):
            assert_same(a, b, f"{where}[{i}]", rtol)
    elif _is_array(mine) or _is_array(theirs):
        a, b = _numpy(mine), _numpy(theirs)
        assert a.shape == b.shape and a.dtype == b.dtype, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if rtol and np.issubdtype(a.dtype, np.floating):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=0, err_msg=where)
        else:
            np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert mine == theirs, f"{where}: {mine!r} != {theirs!r}"


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu()
    return np.asarray(value)
