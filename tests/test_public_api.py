"""The package root's public surface, and that importing it pulls in no framework."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import lossscale

FRAMEWORKS = ("torch", "jax", "jaxlib", "tensorflow", "optax", "flax", "keras")


def test_all_is_pinned():
    assert sorted(lossscale.__all__) == [
        "AutoLossScale",
        "DynamicLossScale",
        "ExponentialUpdateLossScaleManager",
        "FixedLossScale",
        "FixedLossScaleManager",
        "History",
        "LossScale",
        "LossScaleError",
        "LossScaleState",
        "RuleParams",
        "get",
        "initial_state",
        "next_state",
        "resolve_loss_scale",
        "serialize",
        "underflow_report",
    ]
    for name in lossscale.__all__:
        assert getattr(lossscale, name) is not None


def test_dir_shows_the_public_names_only():
    # `from __future__ import annotations` in the package root would leave a public `annotations` attribute.
    public = {name for name in dir(lossscale) if not name.startswith("_")}
    assert "annotations" not in public
    assert public - set(lossscale.__all__) <= {"demo", "jax", "keras", "torch"}  # submodules, once imported


def test_version():
    # One version: the package's equals pyproject.toml's (what the wheel's metadata says).
    # Read with a pattern, not tomllib (Python 3.11+): the core's tests run on Python 3.10 too.
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    project = text[text.index("[project]") :]
    version = re.search(r'^version = "([^"]+)"$', project, re.MULTILINE)
    assert version is not None, "pyproject.toml's [project] table has no version"
    assert lossscale.__version__ == version.group(1) and lossscale.__version__.count(".") == 2


def test_import_lossscale_imports_no_framework():
    code = (
        "import sys, json, lossscale\n"
        "from lossscale import DynamicLossScale, get, initial_state, next_state\n"
        "import numpy as np\n"
        "p = get('dynamic'); s = next_state(p, initial_state(p, np), np.asarray(True), np)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_torch_binding_imports_torch_only_when_imported():
    pytest.importorskip("torch")
    code = (
        "import sys, json, lossscale.torch\n"
        "print(json.dumps(['torch' in sys.modules, 'jax' in sys.modules, 'tensorflow' in sys.modules]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [True, False, False]


def test_torch_binding_all():
    pytest.importorskip("torch")
    import lossscale.torch as lst


    # Other issues add names to the torch binding; these are the ones issue 2 requires.
    assert set(lst.__all__) >= {
        "DynamicLossScale",
        "ExponentialUpdateLossScaleManager",
        "FixedLossScale",
        "FixedLossScaleManager",
        "LossScale",
        "LossScaleError",
        "LossScaleOptimizer",
        "SharedLossScale",
    }
    assert "GradScaler" in lst.__all__  # issue 12: the drop-in for torch.amp.GradScaler
    assert lst.DynamicLossScale is lossscale.DynamicLossScale


@pytest.mark.parametrize("binding,extra", [("torch", "torch"), ("jax", "jax")])
def test_a_binding_without_its_framework_names_the_extra(binding, extra):
    code = (
        f"import sys; sys.modules[{binding!r}] = None\n"  # as if the framework were not installed
        "try:\n"
        f"    import lossscale.{binding}\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert f"pip install 'lossscale[{extra}]'" in result.stdout
