"""``python -m lossscale demo --framework jax``: what only the JAX backend has (its batch order, its CLI)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("rich")

from lossscale import _cli, _demo_jax  # noqa: E402
from lossscale._demo import DemoConfig, load_data  # noqa: E402

# The run's numbers, history and picture are checked for both frameworks in test_demo.py.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_train_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode must be one of fp32, fp16, fp16\\+lossscale"):
        _demo_jax.train("bf16", load_data(0), DemoConfig(framework="jax"))


def test_cli_runs_with_framework_jax(tmp_path, capsys):
    out = tmp_path / "tiny.png"
    assert _cli.main(["demo", "--framework", "jax", "--steps", "5", "--no-progress", "-o", str(out)]) == 0
    printed = capsys.readouterr().out.replace("\n", "")
    for word in ("(jax, CPU)", "fp16+lossscale", "final loss", "zero grads", str(out)):
        assert word in printed
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_importing_the_demo_does_not_import_jax():
    code = "import sys, lossscale, lossscale._demo; print('jax' in sys.modules, 'optax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
