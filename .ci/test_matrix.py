"""The version matrix: each binding's tests against the oldest and the newest release of each range we state.

``make test-matrix`` runs every cell; ``make test-matrix ARGS="--cells jax-floor,numpy-floor"`` runs some;
``python .ci/test_matrix.py --list`` lists them. Each cell gets its own virtualenv under ``.venv-matrix/<cell>``
(git-ignored, kept between runs and rebuilt when the cell's packages or lossscale's own dependencies change, or
with ``--rebuild``, which a "newest" cell needs to pick up a later release), with lossscale
installed editable (``-e .``), pytest, hypothesis and the cell's packages, then runs its test paths with
``-m "not slow"``. The table at the end gives each cell's installed versions, its passed/failed/skipped counts,
and the wall time of the install and of the tests; ``--markdown FILE`` writes it as a Markdown table too.

Python versions other than the default come from pyenv (``~/.pyenv/versions/3.10.13/bin/python3``); a cell whose
interpreter is missing is reported as not run. Exit status: 0 when every cell that ran passed, else 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = ROOT / ".venv-matrix"
BASE_PACKAGES = ["pytest>=7", "hypothesis>=6"]
# The core's tests, and the doctests of src/ that the cell can import (the root conftest.py leaves out a binding
# whose framework is missing), so this is the core and the torch binding.
TORCH_PATHS = ("tests/core", "tests/torch", "src/lossscale")


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    what: str  # the range this cell checks, in the table
    packages: tuple[str, ...]
    paths: tuple[str, ...]
    python: str | None = None  # a pyenv version; None: the interpreter running this script
    env: tuple[tuple[str, str], ...] = ()
    show: tuple[str, ...] = ()  # distributions whose installed version the table shows
    ci: bool = False  # part of CI's quick half (.ci/run: --ci)


CELLS = [
    Cell("numpy-floor", "numpy>=2 (oldest)", ("numpy==2.0.0",), ("tests", "src"), show=("numpy",), ci=True),
    Cell("numpy-newest", "numpy>=2 (newest)", ("numpy",), ("tests", "src"), show=("numpy",)),
    Cell("py310-core", "Python 3.10 (oldest), core", ("numpy",), ("tests", "src"), python="3.10.13",
         show=("numpy",), ci=True),
    Cell("py313-core", "Python 3.13 (newest), core", ("numpy",), ("tests", "src"), python="3.13.0",
         show=("numpy",), ci=True),
    Cell("py310", "Python 3.10 (oldest), core + torch (oldest)", ("torch==2.5.1",), TORCH_PATHS,
         python="3.10.13", show=("numpy", "torch")),
    Cell("py313", "Python 3.13 (newest), core + torch (newest)", ("torch",), TORCH_PATHS,
         python="3.13.0", show=("numpy", "torch")),
    Cell("torch-floor", "torch>=2.5,<3 (oldest)", ("torch==2.5.1",), TORCH_PATHS, show=("numpy", "torch")),
    Cell("torch-newest", "torch>=2.5,<3 (newest)", ("torch",), TORCH_PATHS, show=("numpy", "torch")),
    Cell("jax-floor", "jax>=0.4.33, optax>=0.2.2 (oldest)",
         ("jax==0.4.33", "jaxlib==0.4.33", "optax==0.2.2", "numpy==2.0.0"), ("tests/jax", "src/lossscale/jax"),
         show=("numpy", "jax", "jaxlib", "optax", "chex"), ci=True),
    Cell("jax-newest", "jax>=0.4.33, optax>=0.2.2 (newest)", ("jax", "optax"), ("tests/jax", "src/lossscale/jax"),
         show=("numpy", "jax", "jaxlib", "optax", "chex")),
    Cell("keras-floor", "keras>=3.15, tensorflow-cpu>=2.18 (oldest)", ("keras==3.15.0", "tensorflow-cpu==2.18.0"),
         ("tests/keras", "src/lossscale/keras"), env=(("KERAS_BACKEND", "tensorflow"),),
         show=("numpy", "keras", "tensorflow-cpu")),
    Cell("keras-newest", "keras>=3.15, tensorflow-cpu>=2.18 (newest)", ("keras", "tensorflow-cpu"),
         ("tests/keras", "src/lossscale/keras"), env=(("KERAS_BACKEND", "tensorflow"),),
         show=("numpy", "keras", "tensorflow-cpu")),
]


@dataclasses.dataclass
class Result:
    cell: str
    what: str
    python: str = ""
    versions: str = ""
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    install_s: float = 0.0
    test_s: float = 0.0
    status: str = "not run"  # pass | FAIL | not run | install failed
    command: str = ""
    note: str = ""


def interpreter(cell: Cell) -> list[str] | None:
    """The command that starts the cell's Python, or None when it is not on this machine.

    pyenv's own directory of that version when it exists (under ``pyenv exec``, as when this script itself runs
    from a pyenv shim, ``python3`` on PATH is the running version whatever PYENV_VERSION says), else
    ``pyenv exec python3`` with PYENV_VERSION set.
    """
    if cell.python is None:
        return [sys.executable]
    root = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv"))
    candidates = [[str(root / "versions" / cell.python / "bin" / "python3")]]
    if shutil.which("pyenv"):
        candidates.append(["env", f"PYENV_VERSION={cell.python}", "pyenv", "exec", "python3"])
    for command in candidates:
        try:
            out = subprocess.run([*command, "-c", "import sys; print(sys.version.split()[0])"], check=True,
                                 capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            continue
        if out == cell.python:
            return command
    return None


def spec_hash(cell: Cell) -> str:
    """What a cell's venv was built from: its packages, and lossscale's own dependencies (the source is editable)."""
    own = [line for line in (ROOT / "pyproject.toml").read_text().splitlines()
           if line.startswith(("dependencies =", "requires-python ="))]
    text = json.dumps([cell.python, cell.packages, BASE_PACKAGES, own])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def install(cell: Cell, venv: pathlib.Path, log: pathlib.Path, rebuild: bool) -> bool:
    """Builds (or reuses) the cell's venv; True on success. Output goes to ``log``."""
    stamp = venv / ".matrix-installed"
    want = spec_hash(cell)
    if not rebuild and stamp.exists() and stamp.read_text() == want:
        return True
    python = interpreter(cell)
    assert python is not None
    if venv.exists():
        shutil.rmtree(venv)
    py = str(venv / "bin" / "python")
    steps = [
        [*python, "-m", "venv", str(venv)],
        [py, "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [py, "-m", "pip", "install", "-q", "-e", str(ROOT), *BASE_PACKAGES, *cell.packages],
    ]
    with log.open("w") as out:
        for step in steps:
            out.write("$ " + " ".join(step) + "\n")
            out.flush()
            if subprocess.run(step, check=False, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode:
                return False
    stamp.write_text(want)
    return True


def versions(venv: pathlib.Path, names: tuple[str, ...]) -> tuple[str, str]:
    code = ("import importlib.metadata as m, sys\n"
            "out = []\n"
            "for n in sys.argv[1:]:\n"
            "    try: out.append(f'{n} {m.version(n)}')\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(sys.version.split()[0]); print(', '.join(out))")
    lines = subprocess.run([str(venv / "bin" / "python"), "-c", code, *names], check=False, capture_output=True,
                           text=True).stdout.splitlines()
    return (lines[0], lines[1]) if len(lines) == 2 else ("?", "?")


def run_tests(cell: Cell, venv: pathlib.Path, result: Result, log: pathlib.Path, extra: list[str]) -> None:
    junit = venv / "junit.xml"
    if junit.exists():
        junit.unlink()
    env = dict(os.environ, **dict(cell.env))
    env.pop("PYTHONPATH", None)  # the cell's own editable install, nothing else
    args = ["-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", f"--junitxml={junit}", *cell.paths,
            *extra]
    prefix = " ".join(f"{k}={v}" for k, v in cell.env)
    result.command = (prefix + " " if prefix else "") + f".venv-matrix/{cell.name}/bin/python " + " ".join(
        a if " " not in a else f'"{a}"' for a in args if not a.startswith("--junitxml"))
    start = time.monotonic()
    with log.open("a") as out:
        out.write("$ " + result.command + "\n")
        out.flush()
        rc = subprocess.run([str(venv / "bin" / "python"), *args], check=False, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=env).returncode
    result.test_s = time.monotonic() - start
    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        total = int(suite.get("tests", 0))
        result.failed = int(suite.get("failures", 0))
        result.errors = int(suite.get("errors", 0))
        result.skipped = int(suite.get("skipped", 0))
        result.passed = total - result.failed - result.errors - result.skipped
    result.status = "pass" if rc == 0 else "FAIL"
    if rc not in (0, 1):
        result.note = f"pytest exit status {rc}"


def load_results() -> dict[str, Result]:
    """The last result of each cell that has run here (every run updates its cells' entries)."""
    path = CACHE / "results.json"
    if not path.exists():
        return {}
    return {r["cell"]: Result(**r) for r in json.loads(path.read_text())}


def table(results: list[Result], markdown: bool) -> str:
    head = ["cell", "Python", "versions", "passed", "failed", "errors", "skipped", "install s", "tests s", "status"]
    rows = [[r.cell, r.python, r.versions, str(r.passed), str(r.failed), str(r.errors), str(r.skipped),
             f"{r.install_s:.0f}", f"{r.test_s:.0f}", r.status + (f" ({r.note})" if r.note else "")]
            for r in results]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines += ["", "Commands (run from the repository root, after the cell's install):", ""]
        lines += [f"- `{r.cell}`: `{r.command}`" for r in results if r.command]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*row) for row in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", help="comma-separated cell names (default: all; see --list)")
    parser.add_argument("--ci", action="store_true", help="only the cells CI runs (the quick half)")
    parser.add_argument("--list", action="store_true", help="list the cells and exit")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the cells' venvs (the newest releases again)")
    parser.add_argument("--markdown", type=pathlib.Path, nargs="?", const=pathlib.Path("-"),
                        help="also write the table as Markdown to this file (with --report: print it as Markdown)")
    parser.add_argument("--report", action="store_true",
                        help="print the table of the last result of every cell (.venv-matrix/results.json) and exit;"
                             " with --markdown, as Markdown")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = parser.parse_args(argv)
    if args.report:
        stored = load_results()
        results = [stored[c.name] for c in CELLS if c.name in stored]
        print(table(results, markdown=args.markdown is not None))
        return 0
    if args.list:
        for cell in CELLS:
            print(f"{cell.name:<14} {'[ci] ' if cell.ci else '     '}{cell.what}: {' '.join(cell.packages)}; "
                  f"{' '.join(cell.paths[:2])}{' ...' if len(cell.paths) > 2 else ''}")
        return 0
    chosen = CELLS
    if args.cells:
        names = [n.strip() for n in args.cells.split(",") if n.strip()]
        unknown = sorted(set(names) - {c.name for c in CELLS})
        if unknown:
            parser.error(f"unknown cell(s) {', '.join(unknown)}; the cells are {', '.join(c.name for c in CELLS)}")
        chosen = [c for c in CELLS if c.name in names]
    if args.ci:
        chosen = [c for c in chosen if c.ci]
    CACHE.mkdir(exist_ok=True)
    results = []
    for cell in chosen:
        result = Result(cell.name, cell.what)
        results.append(result)
        venv = CACHE / cell.name
        log = CACHE / f"{cell.name}.log"
        if interpreter(cell) is None:
            result.note = f"Python {cell.python} not found (pyenv)"
            print(f"[{cell.name}] skipped: {result.note}", flush=True)
            continue
        print(f"[{cell.name}] installing {' '.join(cell.packages)} (log: {log.relative_to(ROOT)})", flush=True)
        start = time.monotonic()
        ok = install(cell, venv, log, args.rebuild)
        result.install_s = time.monotonic() - start
        if not ok:
            result.status = "install failed"
            print(f"[{cell.name}] install failed; see {log.relative_to(ROOT)}", flush=True)
            continue
        result.python, result.versions = versions(venv, cell.show)
        print(f"[{cell.name}] testing with Python {result.python}, {result.versions}", flush=True)
        run_tests(cell, venv, result, log, args.pytest_args)
        print(f"[{cell.name}] {result.status}: {result.passed} passed, {result.failed} failed, {result.errors} "
              f"errors, {result.skipped} skipped in {result.test_s:.0f} s", flush=True)
    print()
    print(table(results, markdown=False))
    stored = load_results()
    stored.update({r.cell: r for r in results})
    (CACHE / "results.json").write_text(json.dumps([dataclasses.asdict(r) for r in stored.values()], indent=1))
    if args.markdown is not None and str(args.markdown) != "-":
        args.markdown.write_text(table(results, markdown=True) + "\n")
    return 0 if all(r.status == "pass" for r in results if r.status != "not run") else 1


if __name__ == "__main__":
    sys.exit(main())
