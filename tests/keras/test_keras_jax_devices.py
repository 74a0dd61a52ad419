"""Keras on JAX with two (forced host) devices, in a subprocess: fit with history= and max_consecutive_skips=
under keras.distribution.DataParallel (issue 23 defect 5: it raised)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kutil import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution is the JAX backend's")

SRC = str(Path(__file__).resolve().parents[2] / "src")

SCRIPT = textwrap.dedent(
    """
    import jax, keras, numpy as np
    import lossscale.keras as lsk
    assert jax.device_count() == 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = rng.standard_normal((64, 1)).astype(np.float32)
    x[3, 1] = np.inf  # batch 0, first device's shard
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-2), history=True, max_consecutive_skips=3)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert opt.history.skipped.tolist() == [True, False, False, False], opt.history.skipped
    assert int(opt.skipped_steps) == 1 and int(opt.iterations) == 3
    assert float(opt.loss_scale) == 2.0**14
    print("ok")
    """
)


def test_fit_on_two_jax_devices_with_history_and_stall_guard():
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]
