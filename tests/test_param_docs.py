"""Every public callable documents every parameter by name, as a Google-style ``Args:`` entry (``name: ...`` or
``name (type): ...`` at the start of a line): the functions in ``__all__`` of each public module, and the
constructors of its classes (the class docstring or ``__init__``'s). A module whose framework is not installed is
skipped, as its tests are."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

from tests.conftest import installed

#: public module -> the modules it needs beyond numpy. The integrations are checked in tests/torch/integrations,
#: whose conftest lets their frameworks import next to a CPU torch.
MODULES = {
    "lossscale": [],
    "lossscale.torch": ["torch"],
    "lossscale.jax": ["jax", "optax"],
    "lossscale.jax.train_state": ["jax", "optax", "flax"],
    "lossscale.keras": ["keras"],
}


def _documented(name: str, doc: str) -> bool:
    """An entry ``name: ...``, ``name (type): ...``, or one shared by a few, ``a, name, c: ...``."""
    entry = re.compile(r"^\s*((?:\**\w+,\s*)*\**\w+)(\s*\([^)]*\))?\s*:", re.MULTILINE)
    return any(name.lstrip("*") in (n.strip().lstrip("*") for n in m.group(1).split(",")) for m in entry.finditer(doc))


def _parameters(obj: object) -> tuple[list[str], str]:
    """The parameter names a user passes, and the docstring(s) that must name them."""
    if inspect.isclass(obj) and hasattr(obj, "_fields"):  # a NamedTuple: its fields, in the class docstring
        return list(obj._fields), inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__") or obj.__dict__.get("__new__")
        if init is None:  # inherited (an exception, a dataclass's generated __init__): the class docstring
            init = obj
        target, doc = init, (inspect.getdoc(obj) or "") + "\n" + (init.__doc__ or "")
    else:
        target, doc = obj, inspect.getdoc(obj) or ""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return [], doc
    names = [p.name for p in signature.parameters.values()
             if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return names, doc


def _public(module_name: str) -> list[tuple[str, object]]:
    module = importlib.import_module(module_name)
    out = []
    for name in module.__all__:
        obj = getattr(module, name)
        if callable(obj) and (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismethod(obj)):
            out.append((name, obj))
    return out


@pytest.mark.parametrize("module_name", list(MODULES))
def test_every_parameter_of_every_public_callable_is_documented(module_name):
    if not all(installed(m) for m in MODULES[module_name]):
        pytest.skip(f"{module_name} needs {', '.join(MODULES[module_name])}")
    missing = undocumented(module_name)
    assert not missing, "parameters without an Args entry: " + ", ".join(missing)


def undocumented(module_name: str) -> list[str]:
    """``module.callable(parameter)`` for every parameter of a public callable of ``module_name`` without an entry."""
    missing = []
    for name, obj in _public(module_name):
        params, doc = _parameters(obj)
        missing += [f"{module_name}.{name}({p})" for p in params if not _documented(p, doc)]
    return missing


def test_the_check_reads_google_style_entries():
    doc = "Args:\n    policy: the policy.\n    xp (module): the namespace.\n    **kwargs: more.\n    a, b_c: both."
    assert _documented("policy", doc) and _documented("xp", doc) and _documented("kwargs", doc)
    assert _documented("b_c", doc) and _documented("a", doc) and not _documented("b", doc)
    assert not _documented("state", doc) and not _documented("pol", doc)
