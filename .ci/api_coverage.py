"""How many public names the built API reference documents: every name in ``__all__`` of each public module.

Run after ``make docs``: ``python .ci/api_coverage.py [site]``. It reads ``__all__`` statically (no framework
is imported) and the site's ``objects.inv`` (the inventory mkdocstrings writes: one entry per rendered object),
prints one line per module and the total, and exits 1 if any public name is missing.
"""

from __future__ import annotations

import ast
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The public modules and their files; a module without __all__ (integrations' package) is covered by its submodules.
MODULES = {
    "lossscale": "src/lossscale/__init__.py",
    "lossscale.torch": "src/lossscale/torch/__init__.py",
    "lossscale.torch.integrations.accelerate": "src/lossscale/torch/integrations/accelerate.py",
    "lossscale.torch.integrations.lightning": "src/lossscale/torch/integrations/lightning.py",
    "lossscale.jax": "src/lossscale/jax/__init__.py",
    "lossscale.jax.train_state": "src/lossscale/jax/train_state.py",
    "lossscale.keras": "src/lossscale/keras/__init__.py",
}


def public_names(path: Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            return list(ast.literal_eval(node.value))
    raise ValueError(f"{path} has no literal __all__")


def documented(site: Path) -> set[str]:
    raw = (site / "objects.inv").read_bytes()
    header_end = 0
    for _ in range(4):  # four header lines, then zlib
        header_end = raw.index(b"\n", header_end) + 1
    lines = zlib.decompress(raw[header_end:]).decode().splitlines()
    return {line.split(" ", 1)[0] for line in lines if " py:" in line}


def coverage(site: Path) -> tuple[int, int, list[str]]:
    inventory = documented(site)
    covered = total = 0
    missing: list[str] = []
    for module, file in MODULES.items():
        names = public_names(ROOT / file)
        here = [n for n in names if f"{module}.{n}" in inventory]
        missing += [f"{module}.{n}" for n in names if f"{module}.{n}" not in inventory]
        covered += len(here)
        total += len(names)
        print(f"{module:42s} {len(here):3d} / {len(names):3d}")
    return covered, total, missing


if __name__ == "__main__":
    covered, total, missing = coverage(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "site")
    print(f"{'total':42s} {covered:3d} / {total:3d} public names documented")
    if missing:
        print("missing:", ", ".join(missing))
    sys.exit(1 if missing else 0)
