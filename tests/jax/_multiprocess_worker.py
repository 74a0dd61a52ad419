"""One of two JAX processes (multi-controller, CPU, gloo collectives), run by test_multiprocess.py.

Usage: python _multiprocess_worker.py PORT PROCESS_ID. Prints one JSON line of results on success.
Every socket is on 127.0.0.1: the coordinator's bind address, and gloo's (see ``use_gloo_on_loopback``).
"""

import inspect
import json
import sys

import jax
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lossscale
import lossscale.jax as lsj
from tests.jax._multiprocess_data import INITIAL_SCALE, batch, init_params, loss_fn


def use_gloo_on_loopback():
    """Gloo TCP collectives listening on 127.0.0.1 instead of the address the host name resolves to.

    JAX picks gloo with ``jax_cpu_collectives_implementation`` (the default since 0.4.3x) but lets no public
    option choose its address, so the CPU client factory is re-registered with the same collectives bound to
    loopback (test-only use of ``jax._src``; if that moved, the default gloo setup is used).
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax
    except ImportError:  # pragma: no cover - private layout changed
        return

    def factory():
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client, hostname="127.0.0.1"
        )
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", factory, priority=0, fail_quietly=False)


def local(x):
    """This process's part of a global array, as a list (its one shard)."""
    return np.concatenate([np.asarray(s.data).ravel() for s in x.addressable_shards]).tolist()


def main(port, pid):
    use_gloo_on_loopback()
    # Newer JAX takes the heartbeat and shutdown timeouts; older releases keep their defaults.
    known = inspect.signature(jax.distributed.initialize).parameters
    timeouts = {k: 30 for k in ("heartbeat_timeout_seconds", "shutdown_timeout_seconds") if k in known}
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        coordinator_bind_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=pid,
        local_device_ids=[0],
        initialization_timeout=60,
        **timeouts,
    )
    try:
        run(pid)
    finally:
        jax.distributed.shutdown()


def run(pid):
    assert jax.process_count() == 2 and jax.device_count() == 2 and jax.local_device_count() == 1
    # jax.sharding.AxisType (JAX >= 0.5.2); older JAX's meshes are all "Auto".
    axis_types = {"axis_types": (jax.sharding.AxisType.Auto,)} if hasattr(jax.sharding, "AxisType") else {}
    mesh = jax.make_mesh((2,), ("d",), **axis_types)
    rows = NamedSharding(mesh, P("d"))

    def global_array(full, sharding=rows):
        # Each process passes only its own rows (its "data loader"); jax assembles the global array.
        mine = full[pid : pid + 1]
        return jax.make_array_from_process_local_data(sharding, mine, full.shape)

    w, b = init_params()
    params = {"w": global_array(w, rows), "b": global_array(b, rows)}  # row i of each on process i
    history = lossscale.History()
    opt = lsj.loss_scale_optimizer(optax.adam(0.1), initial_scale=INITIAL_SCALE, history=history)
    state = jax.jit(opt.init)(params)
    grad_fn = lsj.value_and_grad(loss_fn)

    @jax.jit
    def step(params, state, x):
        loss, grads = grad_fn(params, x, opt_state=state)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss, grads

    x_bad = global_array(batch(inf_on=1), rows)  # the Inf sits in process 1's rows only
    before = {k: local(v) for k, v in params.items()}
    new_params, state, _, grads = step(params, state, x_bad)
    out = {
        "pid": pid,
        "grads_finite_here": bool(all(np.isfinite(local(g)).all() for g in grads.values())),
        "w_unchanged": local(new_params["w"]) == before["w"],
        "b_unchanged": local(new_params["b"]) == before["b"],
        "scale": float(state.loss_scale),
        "skipped": int(state.skipped_steps),
        "last_step_skipped": bool(state.last_step_skipped),
        "count": int(state.inner_state[0].count),
    }
    # a clean step afterwards, gathered on every process for comparison with one process
    new_params, state, loss, _ = step(new_params, state, global_array(batch(inf_on=None), rows))
    gathered = multihost_utils.process_allgather(new_params, tiled=True)
    out["clean"] = {
        "w": np.asarray(gathered["w"]).tolist(),
        "b": np.asarray(gathered["b"]).tolist(),
        "scale": float(state.loss_scale),
        "skipped": int(state.skipped_steps),
        "count": int(state.inner_state[0].count),
        "loss": float(loss),
    }
    multihost_utils.sync_global_devices("done")
    out["history"] = {"steps": history.steps.tolist(), "skipped": history.skipped.tolist()}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
