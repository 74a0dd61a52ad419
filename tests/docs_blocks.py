"""Runs the ```python blocks of a page of the user's manual (docs/), for tests/test_docs_examples.py and
tests/keras/test_docs_examples_keras.py.

A page's blocks run in page order in one namespace, as a reader runs them one after another. What a block leaves to
the reader (a model, a loader, a file to load) is defined by the test, visibly, in code run just before that block;
a line of a block that is only ``...`` (the reader's training) is replaced by code the test names. A block that
cannot run here is compiled (its syntax is checked) and skipped, by name, with its reason.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: The pages whose blocks tests/keras/test_docs_examples_keras.py runs (once per Keras backend); every other page
#: with a python block is run by tests/test_docs_examples.py.
KERAS_PAGES = ("getting-started/keras.md", "keras.md", "migration/keras3.md", "migration/tf-keras.md")

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
_ELLIPSIS = re.compile(r"^(\s*)\.\.\.(\s*#.*)?$", re.MULTILINE)


def pages_with_python() -> list[str]:
    """Every page of docs/ with a ```python block, as a path relative to docs/."""
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if _BLOCK.search(p.read_text("utf-8")))


def python_blocks(page: str) -> list[str]:
    """The ```python blocks of ``docs/<page>``, in page order."""
    return _BLOCK.findall((DOCS / page).read_text(encoding="utf-8"))


def fill_ellipsis(code: str, fill: str) -> str:
    """``code`` with its one ``...`` line (the reader's own code) replaced by ``fill``, at that line's indent."""
    hits = _ELLIPSIS.findall(code)
    if len(hits) != 1:
        raise AssertionError(f"expected one '...' line to fill, found {len(hits)} in:\n{code}")
    indent = hits[0][0]
    return _ELLIPSIS.sub(lambda _: textwrap.indent(textwrap.dedent(fill).strip("\n"), indent), code, count=1)


def run_page(
    page: str,
    *,
    setup: Mapping[tuple[str, int], str],
    fill: Mapping[tuple[str, int], str],
    skip: Mapping[tuple[str, int], str],
    after: Mapping[tuple[str, int], Callable[[dict], None]] | None = None,
    shrink: Mapping[tuple[str, int], tuple[tuple[str, str], ...]] | None = None,
    namespace: dict | None = None,
) -> tuple[dict, list[int]]:
    """Runs the blocks of ``docs/<page>`` in order in one namespace; returns it and the indices of the blocks run.

    Args:
        page: the page, relative to docs/.
        setup: ``(page, i) -> code`` run in the namespace just before block ``i`` (the reader's own names).
        fill: ``(page, i) -> code`` that replaces block ``i``'s ``...`` line.
        skip: ``(page, i) -> reason``: block ``i`` is compiled, not run.
        after: ``(page, i) -> check(namespace)``, called right after block ``i`` (before a later block
            rebinds the names it checks).
        shrink: ``(page, i) -> ((old, new), ...)``: text of block ``i`` replaced before it runs, to make a run
            the page sizes for real use (a number of steps) small enough for the test suite; each ``old`` must
            occur in the block.
        namespace: the namespace to start from (default: a new one).
    """
    blocks = python_blocks(page)
    for key in (*setup, *fill, *skip, *(after or ()), *(shrink or ())):
        if key[0] == page and key[1] >= len(blocks):
            raise AssertionError(f"{key}: the page has only {len(blocks)} python blocks; update the test")
    ns: dict = {"__name__": "__docs__"} if namespace is None else namespace
    ran = []
    for i, code in enumerate(blocks):
        if (page, i) in fill:
            code = fill_ellipsis(code, fill[page, i])
        for old, new in (shrink or {}).get((page, i), ()):
            if old not in code:
                raise AssertionError(f"docs/{page}[{i}] no longer holds {old!r}; update the test")
            code = code.replace(old, new)
        compiled = compile(code, f"docs/{page}[{i}]", "exec")
        if (page, i) in skip:
            continue
        if (page, i) in setup:
            exec(compile(textwrap.dedent(setup[page, i]), f"setup of docs/{page}[{i}]", "exec"), ns)  # noqa: S102
        exec(compiled, ns)  # noqa: S102 - the manual's code is the test
        if after and (page, i) in after:
            after[page, i](ns)
        ran.append(i)
    return ns, ran
