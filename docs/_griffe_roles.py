"""Griffe extensions for `make docs`: Sphinx roles render as code, doctest examples as code blocks.

The docstrings are Google style but name other objects with Sphinx roles (:class:`X`, :func:`~a.b`), which
Markdown would show as written. ``SphinxRolesAsCode`` rewrites each role to inline code (``~`` keeps the last
component, as Sphinx does).

Their examples are doctests in the running text (``>>> call()`` and the output below it), which Markdown reads as
three nested quotes: the line breaks are lost, and an output such as ``{'a': 1.0}`` turns into junk HTML
attributes. ``DoctestsAsCode`` fences each run of doctest lines (from a ``>>>`` line to the next blank line, as
doctest reads them) as a ```` ```pycon ```` block, so the example and its output render as highlighted code;
``# doctest: +ELLIPSIS``-style directives are dropped from what is shown. ``make docs-check`` fails on any API
page where a ``>>>`` is still plain text.

Both run once the package is loaded, on each docstring's text; the source is not touched.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

DIRECTIVE = re.compile(r"\s*#\s*doctest:.*$")
FENCE = re.compile(r"^\s*(```|~~~)")
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


def fence_doctests(text: str) -> str:
    """``text`` with each run of doctest lines wrapped in a ```` ```pycon ```` fence at the run's indentation.

    A run starts at a ``>>>`` line outside a fence and ends before the next blank line (its last output line).
    """
    out: list[str] = []
    lines = text.split("\n")
    i, in_fence = 0, False
    while i < len(lines):
        line = lines[i]
        if FENCE.match(line):
            in_fence = not in_fence
        stripped = line.lstrip()
        if in_fence or not (stripped == ">>>" or stripped.startswith(">>> ")):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(stripped)]
        if out and out[-1].strip():  # a fence opens a block: after text, it needs a blank line first
            out.append("")
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip():
            out.append(DIRECTIVE.sub("", lines[i]) if lines[i].lstrip().startswith((">>>", "...")) else lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


def _docstrings(pkg: Object) -> list[Any]:
    """Every docstring of ``pkg`` and its members (aliases are the objects' own, reached once)."""
    found, seen, stack = [], set(), [pkg]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if obj.docstring is not None:
            found.append(obj.docstring)
        stack.extend(m for m in obj.members.values() if not m.is_alias)
    return found


class SphinxRolesAsCode(Extension):
    def on_package(self, *, pkg: Object, **kwargs: Any) -> None:
        for docstring in _docstrings(pkg):
            docstring.value = ROLE.sub(_code, docstring.value)


class DoctestsAsCode(Extension):
    def on_package(self, *, pkg: Object, **kwargs: Any) -> None:
        for docstring in _docstrings(pkg):
            docstring.value = fence_doctests(docstring.value)
