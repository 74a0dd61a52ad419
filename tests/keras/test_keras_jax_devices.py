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


SKIP_SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, keras, numpy as np
    import lossscale.keras as lsk
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.standard_normal((32, 1)).astype(np.float32)
    x[20, 3] = np.inf  # the second half of the one batch: device 1's shard under DataParallel
    devices = keras.distribution.list_devices()
    if sys.argv[1] == "data":
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    else:
        mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices=devices)
        layouts = keras.distribution.LayoutMap(mesh)
        layouts[".*d1.*kernel"] = (None, "model")
        layouts[".*d1.*bias"] = ("model",)
        keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch"))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="d1"), keras.layers.Dense(1, name="d2")])
    opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-2))
    model.compile(optimizer=opt, loss="mse")
    opt.build(model.trainable_variables)
    before = [np.array(v.numpy()) for v in model.trainable_variables + opt.inner_optimizer.variables]
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    after = [np.array(v.numpy()) for v in model.trainable_variables + opt.inner_optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after)), "weights or slots changed on a skipped step"
    assert int(opt.iterations) == 0 and int(opt.skipped_steps) == 1 and float(opt.loss_scale) == 2.0**14
    assert opt.dynamic_scale.value.sharding.is_fully_replicated
    print("ok")
    """
)


def run(script: str, *args: str) -> None:
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


@pytest.mark.parametrize("distribution", ["data", "model"])
def test_an_inf_on_one_device_shard_skips_the_step_everywhere(distribution):
    run(SKIP_SCRIPT, distribution)


def test_fit_on_two_jax_devices_with_history_and_stall_guard():
    run(SCRIPT)
