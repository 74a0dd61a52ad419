"""Checks a built wheel the way a user's `pip install` sees it; run by .ci/wheel_check.sh inside a fresh venv.

`python .ci/wheel_check.py dist/lossscale-*.whl`, with only the wheel and numpy installed. It checks that:
- the installed lossscale is the wheel's (not a source tree) and its version is the wheel's metadata version;
- `import lossscale` works and imports no framework;
- importing each binding without its framework raises an ImportError that names the extra to install;
- the wheel holds py.typed and no tests.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

FRAMEWORKS = ("torch", "jax", "jaxlib", "optax", "flax", "keras", "tensorflow")
BINDINGS = {  # module -> the extra its error must name
    "lossscale.torch": "lossscale[torch]",
    "lossscale.torch.integrations.accelerate": "lossscale[torch]",
    "lossscale.jax": "lossscale[jax]",
    "lossscale.keras": "lossscale[keras]",
}


def fail(message: str) -> None:
    print(f"FAIL {message}")
    sys.exit(1)


def main(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    if "lossscale/py.typed" not in names:
        fail(f"{wheel.name} holds no lossscale/py.typed")
    tests = [n for n in names if n.startswith(("tests/", "lossscale/tests/")) or "/conftest.py" in n or "test_" in n]
    if tests:
        fail(f"{wheel.name} holds tests: {tests[:5]}")
    print(f"ok  {wheel.name}: {len(names)} files, py.typed, no tests")

    for framework in FRAMEWORKS:
        if importlib.util.find_spec(framework) is not None:
            fail(f"{framework} is installed in this venv: the check needs numpy only")
    code = (
        "import sys, lossscale\n"
        "p = lossscale.get('dynamic')\n"
        f"print(lossscale.__version__, lossscale.__file__, sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout
    version, location, loaded = out.split(" ", 2)
    if loaded.strip() != "[]":
        fail(f"import lossscale loaded {loaded.strip()}")
    if "site-packages" not in location:
        fail(f"import lossscale found {location}, not the installed wheel")
    if version != importlib.metadata.version("lossscale"):
        fail(f"lossscale.__version__ {version} != the wheel's {importlib.metadata.version('lossscale')}")
    print(f"ok  import lossscale {version} from the wheel, no framework loaded")

    for module, extra in BINDINGS.items():
        probe = f"import {module}"
        result = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, cwd="/")
        last = (result.stderr.strip().splitlines() or [""])[-1]
        if result.returncode == 0 or not last.startswith(("ImportError", "ModuleNotFoundError")):
            fail(f"{probe}: expected an ImportError, got rc={result.returncode} {last!r}")
        if extra not in last:
            fail(f"{probe}: the ImportError does not name {extra!r}: {last!r}")
        print(f"ok  {probe} -> {last}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python .ci/wheel_check.py dist/lossscale-*.whl")
    main(Path(sys.argv[1]))
