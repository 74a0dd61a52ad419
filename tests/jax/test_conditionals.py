"""What a jitted step runs on a GPU, counted on this CPU: the conditionals of the step exported for CUDA, and the
finite check that takes no conditional there (``isfinite(max|g|)`` per leaf) agreeing with the CPU's sum check.

XLA's GPU runtime reads each conditional's predicate on the host before it launches the branch: a wait on every
step. ``benchmarks/kernel_count_jax.py`` counts those reached on every step (outside any branch) of the StableHLO
``jax.export`` gives for CUDA, on any machine."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lossscale
import lossscale.jax as lsj
import lossscale.jax._grads as grads_module
from benchmarks.kernel_count_jax import count_conditionals
from lossscale._jax._kernels import finite_by_max


def _params():
    return {"b": jnp.zeros(8, jnp.float32), "w": jnp.zeros((16, 8), jnp.float16), "v": jnp.ones((4, 4), jnp.float32)}


def _step(opt, apply=False):
    def step(p, s, g):
        if apply:
            return lsj.apply_gradients(opt, g, s, p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    return step


@pytest.mark.parametrize("apply", [False, True], ids=["update", "apply_gradients"])
@pytest.mark.parametrize(("kwargs", "most"), [
    ({}, 0), ({"loss_scale": 2.0**10}, 0), ({"loss_scale": 1}, 0), ({"min_loss_scale": 2.0**-4}, 0),
    ({"stats_every": 16}, 1), ({"loss_scale": "auto"}, 1), ({"loss_scale": "auto", "stats_every": 1}, 0),
    ({"clip_by_global_norm": 1.0}, 0),
], ids=["default", "fixed", "skip-only", "scale-below-1", "stats_every=16", "auto", "auto-every-step", "clip"])
def test_on_a_gpu_a_step_runs_no_conditional_but_the_samples(kwargs, most, apply):
    """Exported for CUDA: no conditional on every step by default, one (the sample's) with statistics."""
    opt = lsj.loss_scale_optimizer(optax.adam(1e-3), **kwargs)
    params = _params()
    grads = jax.tree_util.tree_map(lambda p: p + 1, params)
    assert count_conditionals(_step(opt, apply), params, opt.init(params), grads) == most


def test_on_the_cpu_the_exact_check_stays_behind_the_sum_check():
    """Exported for the CPU, the faster sum check keeps its exact fallback: one conditional (the count sees it)."""
    opt = lsj.loss_scale_optimizer(optax.adam(1e-3))
    params = _params()
    assert count_conditionals(_step(opt), params, opt.init(params), params, platform="cpu") == 1


def _leaves(case):
    """Gradient leaves: normal values, then one poisoned, or huge values whose float32 sum overflows."""
    rng = np.random.default_rng(len(case))
    leaves = [rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=7).astype(np.float16),
              rng.normal(size=4).astype(np.float64),  # float32 unless x64 is on
              np.zeros((0,), np.float32),
              (rng.normal(size=3) + 1j * rng.normal(size=3)).astype(np.complex64),
              rng.normal(size=6).astype(jnp.bfloat16)]
    where, value = case
    if value == "huge":  # every entry finite, the float32 sum of the sums is not
        leaves[0][:] = 3e38
    elif value is not None:
        leaves[where].reshape(-1)[1] = value
    return [jnp.asarray(x) for x in leaves]


CASES = [(0, None), (0, np.nan), (0, np.inf), (0, -np.inf), (1, np.nan), (1, np.inf), (2, np.nan), (2, -np.inf),
         (4, complex(np.inf, 0)), (4, complex(0, np.nan)), (5, np.nan), (5, -np.inf), (0, "huge")]


@pytest.mark.parametrize("case", CASES, ids=[f"leaf{w}-{v}" for w, v in CASES])
def test_the_check_without_a_conditional_is_exact_as_the_cpus(case):
    """``isfinite(max|g|)`` per leaf (off the CPU) and the sum check with its exact fallback (on it) give the
    exact answer, jitted and not: NaN, +-Inf in any dtype, and a float32 sum that overflows while every entry is
    finite."""
    leaves = _leaves(case)
    expected = all(bool(np.isfinite(np.asarray(x, np.complex128 if x.dtype == np.complex64 else np.float64)).all())
                   for x in leaves)
    assert expected == (case[1] is None or str(case[1]).startswith("huge"))
    for fn in (finite_by_max, grads_module._by_sums, grads_module.all_finite):
        assert bool(fn(leaves)) == expected, fn.__name__
        assert bool(jax.jit(fn)(leaves)) == expected, fn.__name__


@pytest.mark.parametrize("loss_scale,every", [("dynamic", None), ("dynamic", 3), ("auto", None)])
def test_the_steps_off_the_cpu_are_the_cpus_bit_for_bit(loss_scale, every, monkeypatch):
    """The optimizer with the finite check it takes off the CPU, run here, equals the CPU's step for step, bit for
    bit: updates, Adam's state, scale, counters and sample, over NaN, Inf and overflowing sums, sampled or not."""
    policy = lossscale.DynamicLossScale(2.0**8, 2) if loss_scale == "dynamic" else "auto"

    def run():
        opt = lsj.loss_scale_optimizer(optax.adam(0.1), policy, stats_every=every)
        params = {"b": jnp.zeros(8, jnp.float32), "w": jnp.ones((16, 8), jnp.float32)}
        state, out = opt.init(params), []
        step = jax.jit(_step(opt))
        for i, bad in enumerate([None, np.nan, None, "huge", np.inf, None, None, -np.inf, None, "huge", None]):
            rng = np.random.default_rng(i)
            g = {"b": rng.normal(size=8).astype(np.float32), "w": rng.normal(size=(16, 8)).astype(np.float32)}
            g = {k: v * np.float32(float(state.loss_scale) * 2.0**-8) for k, v in g.items()}
            if bad == "huge":
                g["w"][:] = 3e38
            elif bad is not None:
                g["b"][i % 8] = bad
            params, state = step(params, state, {k: jnp.asarray(v) for k, v in g.items()})
            out.append([np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves((params, state))])
        return out, int(state.skipped_steps)

    on_cpu, skipped = run()
    monkeypatch.setattr(grads_module, "by_platform", lambda cpu, other, like=(): other())
    off_cpu, _ = run()
    assert skipped == 3  # NaN, Inf, -Inf; the overflowing sums are finite
    assert off_cpu == on_cpu
