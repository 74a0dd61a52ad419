"""tf.distribute on the TensorFlow backend, what tests/keras/distributed does not cover: seed 001's loop with the
user's own all-reduce (experimental_aggregate_gradients=False) under MirroredStrategy over two logical CPUs, and
the aggregating loop checked against one device's update. One scenario per subprocess (strategy_worker.py holds
them and their assertions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kutil import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute is the TensorFlow backend's")

WORKER = Path(__file__).with_name("strategy_worker.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "KERAS_BACKEND": "tensorflow", **extra}


@pytest.mark.parametrize("case", ["mirrored_loop", "mirrored_loop_user_sum"])
def test_seed_loop_under_mirrored_strategy_unscales_once_per_replica(case):
    # mirrored_loop_user_sum: the user's all-reduce sits between get_unscaled_gradients and apply_gradients; the
    # unscale record is per replica, so no replica divides by the scale twice (issue 23 defect 6). Both cases: an
    # Inf on replica 1 skips everywhere, then a clean step matches one device's update of the whole batch.
    proc = subprocess.run(
        [sys.executable, str(WORKER), case], env=env(), capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, f"{case} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert f"ok {case}" in proc.stdout


def test_fit_under_mirrored_strategy_skips_everywhere_and_reads_tfs_properties_as_numbers():
    # An Inf on one replica skips on both (weights, slots, iterations, the scale halved once), then a finite fit
    # matches one device's; between them float(opt.loss_scale) and the other properties read as numbers, which a
    # mirrored variable refuses.
    proc = subprocess.run(
        [sys.executable, str(WORKER), "mirrored_fit"], env=env(), capture_output=True, text=True, timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"mirrored_fit failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "ok mirrored_fit" in proc.stdout
