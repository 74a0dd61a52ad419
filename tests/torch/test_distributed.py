"""lossscale under torch.distributed: 2 gloo processes on loopback, spawned once for the whole file.

``dist_worker.py`` runs every scenario on both ranks (DDP, rank-local
overflow with ``process_group``, FSDP2 ``fully_shard``, save and resume) and
saves what each rank saw; the tests compare that with single-process
references. The spawn is bounded by a subprocess timeout and the process
group's own 45 s timeout.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import lossscale
from lossscale.torch import LossScaleOptimizer

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="needs torch.distributed with the gloo backend",
)

WORLD = 2
SPAWN_TIMEOUT_S = 180

_WORKER_PATH = pathlib.Path(__file__).with_name("dist_worker.py")
_spec = importlib.util.spec_from_file_location("lossscale_dist_worker", _WORKER_PATH)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Runs the worker on WORLD ranks once; returns each rank's results."""
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ)
    env.update(
        GLOO_SOCKET_IFNAME="lo",  # loopback only
        MASTER_ADDR="127.0.0.1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(pathlib.Path(lossscale.__file__).parents[1]), env.get("PYTHONPATH", "")]),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(_WORKER_PATH), str(rank), str(WORLD), str(out / "rendezvous"), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=SPAWN_TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail(f"distributed workers did not finish within {SPAWN_TIMEOUT_S} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} exited with {proc.returncode}:\n{logs[rank][-4000:]}"
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD)]


def results(ranks, name):
    for rank, res in enumerate(ranks):
        assert "error" not in res[name], f"rank {rank}, scenario {name}:\n{res[name].get('error')}"
    return [res[name] for res in ranks]


def assert_params_close(actual, expected):
    assert len(actual) == len(expected)
    for step, (got, want) in enumerate(zip(actual, expected)):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, msg=lambda m, step=step: f"step {step}: {m}")


# ---------------------------------------------------------------- DDP


def test_ddp_trajectory_matches_single_process_on_global_batch(ranks):
    ref_params, ref_scales, _ = worker.reference_global(worker.STEPS, clip=None, poison_input=True)
    assert ref_scales == worker.expected_scales(worker.STEPS)  # the reference did skip INF_STEP
    for res in results(ranks, "ddp"):
        run = res["plain"]
        assert_params_close(run["params"], ref_params)
        assert [s["loss_scale"] for s in run["scales"]] == ref_scales
        assert [s["skipped_steps"] for s in run["scales"]] == [0.0] * worker.INF_STEP + [1.0] * (
            worker.STEPS - worker.INF_STEP
        )


def test_ddp_save_on_rank0_load_everywhere_resumes_the_same_trajectory(ranks):
    ref_params, ref_scales, _ = worker.reference_global(worker.STEPS, clip=None, poison_input=True)
    runs = [res["resumed"] for res in results(ranks, "ddp")]
    # Loaded scale state is identical on every rank and equals what was saved (policy included:
    # the fresh optimizers were built with the default policy, 2**15 and 2000 growth steps).
    assert runs[0]["loaded"] == runs[1]["loaded"] == runs[0]["scales"][worker.RESUME_AT - 1]
    for run in runs:
        assert_params_close(run["params"], ref_params)
        assert [s["loss_scale"] for s in run["scales"]] == ref_scales
    assert runs[0]["scales"] == runs[1]["scales"]


# ---------------------------------------------------------------- rank-local overflow


@pytest.mark.parametrize("kind", ["sgd", "adamw_fused"])
def test_rank_local_overflow_skips_on_every_rank(ranks, kind):
    per_rank = [res[kind] for res in results(ranks, "local_overflow")]
    expected = worker.expected_scales(worker.STEPS)
    for rank, run in enumerate(per_rank):
        # Both ranks skip INF_STEP (rank 0's own gradients were finite) and halve the scale.
        assert run["skipped"] == [step == worker.INF_STEP for step in range(worker.STEPS)], f"rank {rank}"
        assert run["scales"] == expected, f"rank {rank}"
        assert run["scales"][worker.INF_STEP] == run["scales"][worker.INF_STEP - 1] / 2
        # Weights equal a plain optimizer on the unscaled gradients that skipped the same step.
        assert_params_close([[w] for w in run["params"]], [[w] for w in worker.reference_shard(rank, kind)])
        assert run["check_error"] is None


def test_without_process_group_ranks_drift_and_the_debug_check_says_so(ranks):
    rank0, rank1 = (res["control"] for res in results(ranks, "local_overflow"))
    assert rank0["skipped"][worker.INF_STEP] is False and rank1["skipped"][worker.INF_STEP] is True
    # Rank 1 backs off; rank 0 saw a third finite step and grows instead: the scales have drifted apart.
    assert rank1["scales"] == worker.expected_scales(worker.STEPS)
    before = rank0["scales"][worker.INF_STEP - 1]
    assert (rank0["scales"][worker.INF_STEP], rank1["scales"][worker.INF_STEP]) == (2 * before, before / 2)
    for run in (rank0, rank1):
        assert run["check_error"] is not None
        assert "loss_scale differs" in run["check_error"]
        assert "rank 0:" in run["check_error"] and "rank 1:" in run["check_error"]


# ---------------------------------------------------------------- FSDP2


def _has_public_fully_shard() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


needs_fully_shard = pytest.mark.skipif(
    not _has_public_fully_shard(), reason="fully_shard (FSDP2) is public in torch.distributed.fsdp from torch 2.6"
)


@needs_fully_shard
def test_fsdp2_fully_shard_overflow_in_one_shard_matches_unsharded_reference(ranks):
    total = worker.STEPS + worker.EXTRA
    ref_params, ref_scales, ref_norms = worker.reference_global(total, clip=1.0, poison_input=False)
    assert ref_scales[: worker.STEPS] == worker.expected_scales(worker.STEPS)
    runs = results(ranks, "fsdp2")
    for run in runs:
        assert run["grad_type"] == "DTensor"  # really sharded gradients
        assert [s["loss_scale"] for s in run["scales"]] == ref_scales[: worker.STEPS]
        assert run["scales"][worker.INF_STEP]["skipped_steps"] == 1.0
        assert_params_close(run["params"], ref_params[: worker.STEPS])
        # The clip norm is the norm of the whole gradients, not of the local shard.
        torch.testing.assert_close(torch.tensor(run["norms"]), torch.tensor(ref_norms[: worker.STEPS]))
    assert runs[0]["scales"] == runs[1]["scales"]


@needs_fully_shard
def test_fsdp2_distributed_checkpoint_resume(ranks):
    total = worker.STEPS + worker.EXTRA
    ref_params, ref_scales, _ = worker.reference_global(total, clip=1.0, poison_input=False)
    runs = [res["resumed"] for res in results(ranks, "fsdp2")]
    saved = results(ranks, "fsdp2")[0]["scales"][-1]
    assert runs[0]["loaded"] == runs[1]["loaded"] == saved
    for run in runs:
        assert_params_close(run["params"], ref_params[worker.STEPS :])
        assert [s["loss_scale"] for s in run["scales"]] == ref_scales[worker.STEPS :]


# ---------------------------------------------------------------- single process: argument checks


def test_process_group_of_the_wrong_type_is_a_type_error():
    w = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(TypeError, match="ProcessGroup"):
        LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), process_group="world")


def test_check_replicas_agree_needs_an_initialized_process_group():
    if torch.distributed.is_initialized():
        pytest.skip("a process group is initialized in this process")
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1))
    with pytest.raises(RuntimeError, match="init_process_group"):
        opt.check_replicas_agree()
