"""The user's pages (docs/, README.md, CHANGELOG.md) carry no internal words, and `.ci/docs_words.py`, which
`make docs` runs, catches them and names the page."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "docs_words.py"


def _checker():
    spec = importlib.util.spec_from_file_location("docs_words", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_user_pages_have_no_internal_words():
    hits = _checker().find_internal_words(ROOT)
    assert [str(hit) for hit in hits] == []


def test_make_docs_runs_the_check_before_the_build():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ndocs: ", 1)[1].split("\n\n", 1)[0]
    assert recipe.index(".ci/docs_words.py") < recipe.index("mkdocs build --strict")


def _sample(tmp_path: Path, page: str, text: str) -> Path:
    (tmp_path / "docs").mkdir(parents=True, exist_ok=True)
    (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / page).write_text(text, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    "text, word",
    [
        ("Fixed in issue 28, see below.", "issue 28"),
        ("The raw output is in issue28's folder.", "issue28"),
        ("Since 35cfbd1 the rule dispatches fewer operators.", "35cfbd1"),
        ("Four more runs in a later session read the same.", "session"),
        ("the design note's §6.4", "design note"),
        ("The issue's bar: within 2%.", "The issue's"),
        ("raw output in `benchmarks/results/gpu/bench_stats.txt`", "benchmarks/results/gpu/bench_stats.txt"),
        ("the core's sampler (`lossscale._sampler.next_sampler_state`)", "lossscale._sampler"),
        ("measures and stores (`lossscale/keras/_stats.py`)", "lossscale/keras/_stats.py"),
        ("see /work/notes/VOCAB.md", "/work/notes/VOCAB.md"),
    ],
)
def test_each_kind_of_internal_word_is_caught_with_its_page_and_line(tmp_path, text, word):
    root = _sample(tmp_path, "docs/how-to/page.md", f"# A page\n\nFine text.\n{text}\n")
    hits = _checker().find_internal_words(root)
    assert [(h.page, h.line, h.word) for h in hits] == [("docs/how-to/page.md", 4, word)]


def test_words_a_user_needs_are_not_caught(tmp_path):
    text = (
        "tf.compat.v1.Session runs it; pytorch #152279 tracks the skip signal; the GPU issued 12 kernels;\n"
        "`torch._foreach_norm` and `torch._amp_update_scale_` are torch's kernels; e4m3 and bf16; 0x7bff is\n"
        "float16's max; 2**15 = 32768; the scale 65536; `lossscale.underflow_report`; deadbeef cafe.\n"
    )
    assert _checker().find_internal_words(_sample(tmp_path, "docs/page.md", text)) == []


def test_the_measurements_page_may_name_results_folders_but_nothing_else(tmp_path):
    root = _sample(tmp_path, "docs/measurements.md", "See `benchmarks/results/gpu/README.md` (since b0369e8).\n")
    assert [h.word for h in _checker().find_internal_words(root)] == ["b0369e8"]


def test_readme_and_changelog_are_user_pages(tmp_path):
    root = _sample(tmp_path, "README.md", "Fixed in issue 7.\n")
    (root / "CHANGELOG.md").write_text("- One rule (`lossscale._checkpoint.read_record`).\n", encoding="utf-8")
    assert [(h.page, h.word) for h in _checker().find_internal_words(root)] == [
        ("README.md", "issue 7"), ("CHANGELOG.md", "lossscale._checkpoint")]


def test_the_script_fails_naming_the_page_and_the_word(tmp_path):
    root = _sample(tmp_path, "docs/benchmarks.md", "Since 35cfbd1 it is faster.\n")
    run = subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, check=False)
    assert run.returncode == 1
    assert run.stdout.splitlines()[0].startswith("docs/benchmarks.md:1: '35cfbd1' (a commit hash")
    clean = _sample(tmp_path / "clean", "docs/index.md", "# lossscale\n")
    ok = subprocess.run([sys.executable, str(SCRIPT), str(clean)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and ok.stdout == "no internal words on 1 user pages\n"
