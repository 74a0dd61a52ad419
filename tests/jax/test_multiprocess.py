"""lossscale.jax under multi-controller JAX: two processes on 127.0.0.1, one CPU device each, gloo collectives.

A sharded ``jit`` step (``value_and_grad`` + ``update``) gets an Inf in process 1's shard of the batch only. Process
0's own gradients are finite, so only the optimizer's global check makes it skip. Issue 19, item 7.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale.jax as lsj
from tests.jax._multiprocess_data import INITIAL_SCALE, batch, init_params, loss_fn

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # about 15-25 s on a loaded 2-core machine

TIMEOUT_S = 180  # per run of both workers; JAX's own init/heartbeat/shutdown timeouts are shorter (see the worker)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    env.pop("XLA_FLAGS", None)  # one CPU device per process
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_multiprocess_worker.py"), str(port), str(pid)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for pid in (0, 1)
    ]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            assert proc.returncode == 0, f"worker failed (rc {proc.returncode}):\n{err[-3000:]}"
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:  # never leave a worker behind, whatever failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outs


def reference():
    """The same two steps (the skipped one, then a clean one) in this one process, unsharded."""
    w, b = init_params()
    params = {"w": jnp.asarray(w), "b": jnp.asarray(b)}
    opt = lsj.loss_scale_optimizer(optax.adam(0.1), initial_scale=INITIAL_SCALE)
    state = opt.init(params)
    grad_fn = lsj.value_and_grad(loss_fn)
    for inf_on in (1, None):
        loss, grads = grad_fn(params, jnp.asarray(batch(inf_on)), opt_state=state)
        updates, state = opt.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state, loss


def test_only_process_1_saw_the_inf(results):
    assert [r["pid"] for r in results] == [0, 1]
    assert [r["grads_finite_here"] for r in results] == [True, False]


@pytest.mark.parametrize("pid", [0, 1])
def test_every_process_skips_once(results, pid):
    r = results[pid]
    assert r["w_unchanged"] and r["b_unchanged"]  # bit for bit
    assert r["scale"] == INITIAL_SCALE / 2  # exactly one backoff
    assert r["skipped"] == 1 and r["last_step_skipped"]
    assert r["count"] == 0  # Adam's step count did not move


def test_the_scale_is_identical_on_both_processes(results):
    assert results[0]["scale"] == results[1]["scale"]
    assert results[0]["clean"] == results[1]["clean"]  # and so is everything after the clean step


@pytest.mark.parametrize("pid", [0, 1])
def test_the_clean_step_matches_one_process(results, pid):
    params, state, loss = reference()
    clean = results[pid]["clean"]
    np.testing.assert_allclose(clean["w"], np.asarray(params["w"]), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(clean["b"], np.asarray(params["b"]), rtol=1e-6, atol=1e-7)
    assert clean["loss"] == pytest.approx(float(loss), rel=1e-6)
    assert clean["scale"] == float(state.loss_scale) == INITIAL_SCALE / 2
    assert clean["skipped"] == 1 and clean["count"] == 1


def test_history_is_recorded_by_the_process_holding_device_0(results):
    # jax.debug.callback in a whole-array (jit) program runs once, on device 0: process 0 records, process 1 not.
    assert results[0]["history"] == {"steps": [0, 1], "skipped": [True, False]}
    assert results[1]["history"] == {"steps": [], "skipped": []}
    assert jax.process_count() == 1  # this test process itself stayed single-process
