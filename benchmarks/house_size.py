"""The size of the house: lines per concern, modules, imports among them, circles, cross-binding imports.

Reads ``src/lossscale`` (the demo left out) as text with ``ast``: every ``import`` anywhere in a module (a
function-level import counts, it is still an edge) that names another lossscale module is an edge. A circle is a
strongly connected group of more than one module. A cross-binding import is a module of one binding
(``torch/``, ``keras/``, ``jax/``) importing a private module (``_name``) of another.

Run::

    python benchmarks/house_size.py                     # this checkout
    python benchmarks/house_size.py --src OTHER/src     # another one (e.g. a `git worktree add` of an old commit)
"""

from __future__ import annotations

import argparse
import ast
import pathlib
from collections import defaultdict

#: concern -> module names (paths under lossscale/ without .py); the first matching concern wins.
CONCERNS = {
    "rule, policies, resolve": ["_rule", "_policy", "_resolve", "_numbers", "_errors", "__init__", "__main__"],
    "statistics + auto": ["_stats", "_auto", "_sampler", "torch/_sampler", "torch/_stats", "keras/_stats",
                          "keras/_xp", "jax/_stats"],
    "validated loads": ["_validate", "_checkpoint", "torch/_validated", "torch/_checkpoint", "torch/_inner_load",
                        "torch/_legacy_pickles", "torch/_scale", "torch/_gradscaler_scale", "keras/_loaded",
                        "keras/_checkpoint", "jax/_check", "jax/_checkpoint"],
    "kernels and compat": ["_torch/_kernels", "_torch/_compat", "_jax/_kernels", "torch/_grads", "torch/_compat", "torch/_fused",
                           "keras/_grads", "keras/_compat", "jax/_grads", "jax/_compat"],
    "diagnostics": ["_history", "_report", "torch/_diagnostics", "keras/_observer", "keras/_diagnostics",
                    "jax/_record", "jax/_guard", "jax/_diagnostics"],
    "TF v1 surface": ["torch/_tf_methods", "keras/_tf_methods", "keras/_tf_keras"],
    "distributed": ["torch/_distributed", "keras/_distribute", "keras/_distributed"],
    "integrations": ["torch/integrations/"],
    "torch step, scale, optimizer": ["torch/"],
    "keras step, state, optimizer": ["keras/"],
    "jax step, state, optimizer": ["jax/"],
}


def concern(name: str) -> str:
    for label, names in CONCERNS.items():
        if any(name == n or (n.endswith("/") and name.startswith(n)) for n in names):
            return label
    return "other"


def imports(path: pathlib.Path, name: str, known: set[str]) -> set[str]:
    """The lossscale modules ``name`` imports (as module names like ``torch/_step``)."""
    package = name.split("/")[:-1]  # the package a relative import starts from (also for an __init__)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[list[str]] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else list(package)
            elif node.module and node.module.split(".")[0] == "lossscale":
                base = []
            else:
                continue
            mod = (node.module or "").split(".") if node.module else []
            if not node.level:
                mod = mod[1:]
            for alias in node.names:  # `from .pkg import mod` names a module; `from .mod import name`, a name in one
                targets.append(base + mod + [alias.name] if "/".join(base + mod + [alias.name]) in known
                               else base + mod)
        elif isinstance(node, ast.Import):
            targets += [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "lossscale"]
        for parts in targets:
            for candidate in ("/".join(parts), "/".join(parts + ["__init__"])):
                if candidate in known and candidate != name:
                    out.add(candidate)
                    break
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    root = pathlib.Path(parser.parse_args().src) / "lossscale"
    files = {str(p.relative_to(root).with_suffix("")): p for p in sorted(root.rglob("*.py"))
             if "demo" not in p.relative_to(root).parts}
    lines = {name: len(p.read_text().splitlines()) for name, p in files.items()}
    graph = {name: imports(p, name, set(files)) for name, p in files.items()}
    per: dict[str, list[str]] = defaultdict(list)
    for name in files:
        per[concern(name)].append(name)
    print(f"{root}: {sum(lines.values())} lines in {len(files)} modules, "
          f"{sum(len(v) for v in graph.values())} imports among them\n")
    print("| concern | lines | modules |\n|---|---|---|")
    for label in [*CONCERNS, "other"]:
        if per[label]:
            print(f"| {label} | {sum(lines[n] for n in per[label])} | {len(per[label])} |")
    print(f"\ncircles: {circles(graph) or 'none'}")
    binding = {n: n.split("/")[0] for n in files if n.split("/")[0] in ("torch", "jax", "keras")}  # _torch, _jax: shared
    cross = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                   if a in binding and b in binding and binding[a] != binding[b]
                   and b.split("/")[-1].startswith("_") and b.split("/")[-1] != "__init__")
    print(f"cross-binding private imports: {cross or 'none'}")


if __name__ == "__main__":
    main()
