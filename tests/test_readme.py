"""README.md stays true: its quickstart code runs as written, and its claims point at things that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def first_python_block(heading: str) -> str:
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_torch_quickstart_runs(capsys):
    exec(compile(first_python_block("Quickstart: PyTorch"), "README-torch", "exec"), {})
    scale, skipped, count = capsys.readouterr().out.split()
    assert float(scale) == 2.0**15 and skipped in ("True", "False") and int(count) >= 0


def test_jax_quickstart_runs(capsys):
    pytest.importorskip("jax")
    exec(compile(first_python_block("Quickstart: JAX / optax"), "README-jax", "exec"), {})
    scale, skipped = capsys.readouterr().out.split()
    assert float(scale) == 2.0**15 and int(skipped) == 0


def test_the_two_setup_commands_are_the_makefile_targets_ci_runs():
    assert "make demo" in README and "make test" in README
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "\ndemo: " in makefile and "\ntest: " in makefile
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert "make test" in ci


def test_linked_docs_exist():
    root = Path(__file__).resolve().parents[1]
    for link in re.findall(r"\]\((docs/[^)]+)\)", README):
        path, _, anchor = link.partition("#")
        assert (root / path).exists(), link
        if anchor:  # GitHub's anchor of a heading: lower case, spaces as hyphens
            headings = re.findall(r"^#+ (.+)$", (root / path).read_text(encoding="utf-8"), flags=re.M)
            assert anchor in {h.strip().lower().replace(" ", "-") for h in headings}, link
