"""A `.keras` file saved with lossscale's optimizer loads in a new process as docs/keras.md says: after
`import lossscale.keras` (Keras imports no outside package while loading), with its scale and counters; before the
import, Keras's "Could not locate class" error; with `compile=False`, without lossscale at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np

import lossscale.keras as lsk

ROOT = Path(__file__).resolve().parents[2]

LOADER = """
import json, sys, keras
path, out = sys.argv[1], {}
try:
    keras.saving.load_model(path)
except TypeError as error:
    out["without_import"] = str(error).split(". ")[0]
out["lossscale_imported_by_keras"] = "lossscale" in sys.modules
plain = keras.saving.load_model(path, compile=False)
out["weights_without_lossscale"] = [w.tolist() for w in plain.get_weights()]
import lossscale.keras  # noqa: F401 - the step docs/keras.md asks for
model = keras.saving.load_model(path)
opt = model.optimizer
out["class"] = type(opt).__module__ + "." + type(opt).__name__
out["scale"], out["skipped"] = float(opt.loss_scale), int(opt.skipped_steps)
out["weights"] = [w.tolist() for w in model.get_weights()]
print(json.dumps(out))
"""


def test_a_saved_model_loads_in_a_new_process_after_importing_lossscale_keras(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0**10)
    model.compile(optimizer=opt, loss="mse")
    x = np.ones((8, 4), "float32")
    x[0, 0] = np.inf  # one skipped step: the counters must come back
    model.fit(x, np.ones((8, 2), "float32"), batch_size=8, verbose=0)
    model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), batch_size=8, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    env = {**os.environ, "KERAS_BACKEND": keras.backend.backend(), "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", LOADER, str(path)], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["without_import"] == "Could not locate class 'LossScaleOptimizer'"
    assert out["lossscale_imported_by_keras"] is False
    assert out["class"] == "lossscale.keras._optimizer.LossScaleOptimizer"
    assert (out["scale"], out["skipped"]) == (float(opt.loss_scale), int(opt.skipped_steps)) == (512.0, 1)
    expected = [w.tolist() for w in model.get_weights()]
    assert out["weights"] == expected and out["weights_without_lossscale"] == expected
