#!/usr/bin/env bash
# `make wheel-check`: build the sdist and the wheel as a release would (python -m build, isolated), check their
# metadata (twine check --strict), then install the wheel into a fresh venv with numpy only and check it
# (.ci/wheel_check.py). TOOLS_PY is a Python with build and twine (the docs venv's, by default).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS_PY=${TOOLS_PY:-.venv-docs/bin/python}
PYTHON=${PYTHON:-python3}
rm -rf dist .venv-wheel
"$TOOLS_PY" -m build --outdir dist . >/dev/null 2>&1 || "$TOOLS_PY" -m build --outdir dist .  # quiet unless it fails
"$TOOLS_PY" -m twine check --strict dist/*
"$PYTHON" -m venv .venv-wheel
.venv-wheel/bin/python -m pip install -q dist/lossscale-*.whl
.venv-wheel/bin/python -m pip list --format=freeze | sed 's/^/    installed: /'
.venv-wheel/bin/python .ci/wheel_check.py dist/lossscale-*.whl
# the sdist carries what builds the wheel, and not the site or a venv
sdist=$(tar tzf dist/lossscale-*.tar.gz)
grep -qE '^lossscale-[^/]+/src/lossscale/py.typed$' <<<"$sdist" || { echo "FAIL sdist lacks py.typed"; exit 1; }
if grep -qE '/(site|\.venv[^/]*)/' <<<"$sdist"; then echo "FAIL sdist holds site/ or a venv"; exit 1; fi
echo "ok  sdist $(basename dist/lossscale-*.tar.gz): $(wc -l <<<"$sdist") entries"
