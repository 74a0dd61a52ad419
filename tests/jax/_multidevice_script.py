"""Run by test_multidevice.py in a fresh process with two CPU devices; prints JSON results."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lossscale
import lossscale.jax as lsj

try:
    from jax import shard_map  # public in newer JAX
except ImportError:  # older JAX: jax.experimental's, whose replication check knows no rule for lax.pmin
    import functools

    from jax.experimental.shard_map import shard_map as _experimental

    shard_map = functools.partial(_experimental, check_rep=False)


def summary(updates, state):
    return {
        "updates": np.asarray(updates).tolist(),
        "scale": np.asarray(state.loss_scale).tolist(),
        "skipped": np.asarray(state.skipped_steps).tolist(),
        "count": np.asarray(state.inner_state[0].count).tolist(),
    }


def main():
    assert "--xla_force_host_platform_device_count=2" in os.environ.get("XLA_FLAGS", "")
    out = {"devices": jax.device_count()}
    good = jnp.ones((2, 4))  # one row per device
    bad = good.at[1, 3].set(jnp.inf)  # an Inf on device 1 only

    # pmap: each device holds different gradients.
    for name, axis in (("pmap_local", None), ("pmap_global", "d")):
        history = lossscale.History() if axis else None
        opt = lsj.loss_scale_optimizer(optax.adam(0.1), 1024.0, axis_name=axis, history=history)
        state = jax.pmap(opt.init)(jnp.zeros((2, 4)))
        updates, state = jax.pmap(opt.update, axis_name="d")(bad * 1024, state)
        out[name] = summary(updates, state)
        if history is not None:  # one row per step, not one per device
            jax.effects_barrier()
            out[name]["history"] = [history.steps.tolist(), history.skipped.tolist()]

    # shard_map: the parameters are sharded over the mesh axis.
    mesh = jax.make_mesh((2,), ("d",))
    history = lossscale.History()
    opt = lsj.loss_scale_optimizer(optax.adam(0.1), 1024.0, axis_name="d", history=history)
    params = jnp.zeros(8)
    state = opt.init(params)
    state_spec = jax.tree.map(lambda x: P("d") if x.ndim else P(), state)
    f = shard_map(opt.update, mesh=mesh, in_specs=(P("d"), state_spec), out_specs=(P("d"), state_spec))
    state = jax.tree.map(lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec)), state, state_spec)
    grads = jax.device_put(bad.reshape(8) * 1024, NamedSharding(mesh, P("d")))
    updates, state = jax.jit(f)(grads, state)
    out["shard_map"] = summary(updates, state)
    jax.effects_barrier()
    out["shard_map"]["history"] = [history.steps.tolist(), history.skipped.tolist()]

    # jit over sharded arrays: no axis_name; the check is global by construction.
    opt = lsj.loss_scale_optimizer(optax.adam(0.1), 1024.0)
    sharded = NamedSharding(mesh, P("d"))
    params = jax.device_put(jnp.zeros(8), sharded)
    state = opt.init(params)
    grads = jax.device_put(bad.reshape(8) * 1024, sharded)
    out["grad_shards_finite"] = [bool(np.isfinite(np.asarray(s.data)).all()) for s in grads.addressable_shards]
    updates, state = jax.jit(opt.update)(grads, state, params)
    out["sharded_jit"] = summary(updates, state)
    out["sharded_jit"]["update_sharding"] = str(updates.sharding.spec)
    updates, state = jax.jit(opt.update)(jax.device_put(good.reshape(8) * 1024, sharded), state, params)
    out["sharded_jit_next"] = summary(updates, state)

    # shard_map with stats_every=2: an Inf on one device's shard on the unsampled step 1, with the finite check of
    # the CPU and that of a GPU (no lax.cond of its own: the branches must still agree on the varying axes).
    import lossscale.jax._grads as grads_module

    shipped = grads_module.by_platform
    for path, backend, loss_scale in (("cpu", "cpu", 1024.0), ("gpu", "gpu", 1024.0), ("auto", "cpu", "auto")):
        grads_module.by_platform = shipped if backend == "cpu" else (lambda cpu, other, like=(): other())
        opt = lsj.loss_scale_optimizer(optax.sgd(0.1), loss_scale, axis_name="d", stats_every=2)
        state = opt.init(params)
        spec = jax.tree.map(lambda x: P("d") if x.shape == params.shape else P(), state)  # the sample replicated
        state = jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), state, spec)
        f = jax.jit(shard_map(opt.update, mesh=mesh, in_specs=(P("d"), spec), out_specs=(P("d"), spec)))
        skipped = []
        mixed = good.at[1].multiply(2.0).at[0, 0].set(0.0)  # the shards differ: amax 2 on device 1, a zero on 0
        for g in (mixed, bad):
            updates, state = f(jax.device_put(g.reshape(8) * 1024, NamedSharding(mesh, P("d"))), state)
            skipped.append(int(state.skipped_steps))
        sample = state.gradient_stats
        out[f"shard_map_stats_{path}"] = {"skipped": skipped, "step": int(sample["step"]), "amax": float(sample["amax"]),
                                          "zero_fraction": float(sample["zero_fraction"])}
    grads_module.by_platform = shipped

    # Statistics across devices (pmap with axis_name, every step and every 2nd): the global gradient's sample.
    rows = np.stack([np.array([0.0, 2.0**-20, 1.0, -3.0], np.float32), np.array([0.0, 0.0, 2.0**-30, 7.0], np.float32)])
    for every in (1, 2):
        opt = lsj.loss_scale_optimizer(optax.sgd(0.0), 1.0, axis_name="d", stats_every=every)
        state = jax.pmap(opt.init)(jnp.zeros((2, 4)))
        _, state = jax.pmap(opt.update, axis_name="d")(jnp.asarray(rows), state)
        sample = state.gradient_stats
        out[f"pmap_stats_{every}"] = {
            k: np.asarray(sample[k]).tolist() for k in ("step", "amax", "zero_fraction", "subnormal_fraction", "rms_min")
        }
    # clip_by_global_norm with axis_name: the norm of the whole gradient, shards summed across the devices, a
    # replicated leaf counted once (where JAX types say it is replicated); against one device's clip of all of it.
    grads = {"w": jnp.array([3.0, 4.0, 0.0, 1.0]), "b": jnp.array([1.0, 2.0])}
    zeros = jax.tree.map(jnp.zeros_like, grads)
    one = lsj.loss_scale_optimizer(optax.sgd(1.0), 1.0, clip_by_global_norm=1.0)
    out["clip_reference"] = np.asarray(jax.jit(one.update)(grads, one.init(zeros))[0]["w"]).tolist()
    out["clip_reference_w_only"] = np.asarray(
        jax.jit(one.update)({"w": grads["w"]}, one.init({"w": zeros["w"]}))[0]["w"]).tolist()
    opt = lsj.loss_scale_optimizer(optax.sgd(1.0), 1.0, axis_name="d", clip_by_global_norm=1.0)
    for name, specs in (("w_only", {"w": P("d")}), ("mixed", {"w": P("d"), "b": P()})):
        g = {k: grads[k] for k in specs}
        state = opt.init({k: zeros[k] for k in specs})
        state_spec = jax.tree.map(lambda x: P(), state)
        f = jax.jit(shard_map(opt.update, mesh=mesh, in_specs=(specs, state_spec), out_specs=(specs, state_spec)))
        sharded = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in g.items()}
        out[f"clip_shard_map_{name}"] = np.asarray(f(sharded, state)[0]["w"]).tolist()
    out["vma_known"] = hasattr(jax, "typeof") and getattr(jax.typeof(jnp.zeros(1)), "vma", None) is not None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
