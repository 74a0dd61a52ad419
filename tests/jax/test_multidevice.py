"""Two CPU devices (in a subprocess, so XLA_FLAGS is set before jax starts): an Inf on one device's shard."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    script = pathlib.Path(__file__).with_name("_multidevice_script.py")
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_devices(results):
    assert results["devices"] == 2


def test_pmap_without_axis_name_decides_per_device(results):
    # The control: without axis_name device 0 steps and device 1 skips; the replicas drift apart.
    local = results["pmap_local"]
    assert local["skipped"] == [0, 1] and local["count"] == [1, 0] and local["scale"] == [1024, 1024]
    assert all(u != 0 for u in local["updates"][0]) and local["updates"][1] == [0, 0, 0, 0]


def test_pmap_with_axis_name_skips_everywhere(results):
    glob = results["pmap_global"]
    assert glob["skipped"] == [1, 1] and glob["count"] == [0, 0]
    assert glob["updates"] == [[0, 0, 0, 0], [0, 0, 0, 0]]
    assert glob["history"] == [[0], [True]]  # recorded by the first device only


def test_shard_map_with_axis_name_skips_everywhere(results):
    res = results["shard_map"]
    assert res["updates"] == [0] * 8 and res["skipped"] == 1 and res["count"] == 0 and res["scale"] == 1024
    assert res["history"] == [[0], [True]]


def test_sharded_jit_is_global_without_axis_name(results):
    assert results["grad_shards_finite"] == [True, False]  # device 0 alone would have stepped
    res = results["sharded_jit"]
    assert res["updates"] == [0] * 8 and res["skipped"] == 1 and res["count"] == 0
    assert res["update_sharding"].endswith("('d',)")  # the updates stay sharded
    nxt = results["sharded_jit_next"]
    assert nxt["skipped"] == 1 and nxt["count"] == 1 and all(u < 0 for u in nxt["updates"])


@pytest.mark.parametrize("every", [1, 2])
def test_pmap_statistics_are_those_of_the_gradients_of_both_devices(results, every):
    """Under pmap with axis_name, every device holds the sample of all the devices' gradients (numpy reference)."""
    import numpy as np

    from lossscale._stats import gradient_stats

    rows = [np.array([0.0, 2.0**-20, 1.0, -3.0], np.float32), np.array([0.0, 0.0, 2.0**-30, 7.0], np.float32)]
    ref = gradient_stats([np.concatenate(rows)], np)
    got = results[f"pmap_stats_{every}"]
    assert got["step"] == [0, 0]
    for key in ("amax", "zero_fraction", "subnormal_fraction", "rms_min"):
        np.testing.assert_allclose(got[key], [float(getattr(ref, key))] * 2, rtol=1e-6, err_msg=key)


def test_shard_map_statistics_skip_an_inf_on_one_shard_with_either_finite_check(results):
    """stats_every=2 under shard_map: the unsampled step's Inf on one device skips the step everywhere, with the
    CPU's sum check and with the GPU's ``all(isfinite)`` in the unsampled branch alike, and with ``auto``."""
    for path in ("cpu", "gpu", "auto"):
        # step 0's sample is that of both shards: amax from device 1's, 1 zero of 8 from device 0's
        assert results[f"shard_map_stats_{path}"] == {"skipped": [0, 1], "step": 0, "amax": 2048.0,
                                                      "zero_fraction": 0.125}, path


def test_clip_by_global_norm_with_axis_name_clips_by_the_whole_gradients_norm(results):
    """Under shard_map with axis_name the clip reads the norm of the whole gradient: the shards' squares summed over
    the devices, a replicated leaf counted once (each device clipped by its own shard's norm before)."""
    np.testing.assert_allclose(results["clip_shard_map_w_only"], results["clip_reference_w_only"], rtol=1e-6)
    if results["vma_known"]:  # JAX types say which leaves are replicated
        np.testing.assert_allclose(results["clip_shard_map_mixed"], results["clip_reference"], rtol=1e-6)
