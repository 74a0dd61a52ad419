"""``stats_every``, ``gradient_stats`` and ``loss_scale="auto"`` on lossscale.keras, per backend (KERAS_BACKEND).

The numbers are checked against the numpy core (:mod:`lossscale._stats`, :mod:`lossscale._auto`) on the same
gradients, eagerly and through each backend's compiled path (``tf.function``; ``stateless_apply`` under
``jax.jit``; ``stateless_apply`` on torch).
"""

from __future__ import annotations

import copy

import keras
import numpy as np
import pytest
from keras import ops

import lossscale
import lossscale.keras as lsk
from lossscale._advance import advance
from lossscale._auto import initial_auto_state, next_auto_state
from lossscale._sampler import initial_sampler_state, is_due
from lossscale._stats import gradient_stats

BACKEND = keras.backend.backend()
SHAPES = [(3,), (2, 2)]
KEYS = ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms_min")
TENSOR_KEYS = ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms")


def variables():
    return [keras.Variable(np.zeros(s, np.float32), name=f"w{i}") for i, s in enumerate(SHAPES)]


def known_grads(factor=1.0):
    return [
        np.array([0.0, 1.0, 2.0**-20], np.float32) * np.float32(factor),
        np.array([[4.0, 0.0], [0.0, 1e-3]], np.float32) * np.float32(factor),
    ]


def driver(opt, ws, compiled):
    """``step(list of numpy gradients)``: one apply, eager or through the backend's compiled path."""
    opt.build(ws)
    if not compiled:
        return lambda grads: opt.apply([ops.convert_to_tensor(g) for g in grads], ws)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        fn = tf.function(lambda *g: opt.apply(list(g), ws))
        return lambda grads: fn(*(tf.constant(g) for g in grads))
    if BACKEND == "jax":
        import jax

        fn = jax.jit(opt.stateless_apply)
    else:
        fn = opt.stateless_apply

    def step(grads):
        new_w, new_opt = fn([v.value for v in opt.variables], [ops.convert_to_tensor(g) for g in grads],
                            [w.value for w in ws])
        for variable, value in zip(list(ws) + list(opt.variables), list(new_w) + list(new_opt)):
            variable.assign(value)

    return step


def host(stats):
    out = {k: np.asarray(ops.convert_to_numpy(stats[k])) for k in ("step", *KEYS)}
    out["per_tensor"] = {k: np.asarray(ops.convert_to_numpy(stats["per_tensor"][k])) for k in TENSOR_KEYS}
    return out


def assert_matches(stats, ref):
    got = host(stats)
    for key in KEYS:
        np.testing.assert_allclose(got[key], np.asarray(getattr(ref, key)), rtol=1e-6, err_msg=key)
    for key in TENSOR_KEYS:
        np.testing.assert_allclose(got["per_tensor"][key], np.asarray(getattr(ref, "tensor_" + key)), rtol=1e-6,
                                   err_msg=key)


# ------------------------------------------------------------------ arguments


@pytest.mark.parametrize("bad", ["3", 1.5, True])
def test_stats_every_type_error(bad):
    with pytest.raises(TypeError, match=r"stats_every must be an int \(measure every N-th step\) or None"):
        lsk.LossScaleOptimizer(keras.optimizers.SGD(), stats_every=bad)


@pytest.mark.parametrize("bad", [0, -2])
def test_stats_every_value_error(bad):
    with pytest.raises(ValueError, match="stats_every must be at least 1"):
        lsk.LossScaleOptimizer(keras.optimizers.SGD(), stats_every=bad)


def test_off_by_default_and_one_with_auto():
    assert lsk.LossScaleOptimizer(keras.optimizers.SGD()).gradient_stats is None
    assert lsk.LossScaleOptimizer(keras.optimizers.SGD()).stats_every is None
    assert lsk.LossScaleOptimizer(keras.optimizers.SGD(), "auto").stats_every == 16
    assert lsk.LossScaleOptimizer(keras.optimizers.SGD(), lossscale.AutoLossScale(), stats_every=4).stats_every == 4


# ------------------------------------------------------------------ statistics


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_stats_equal_the_numpy_reference(compiled):
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), stats_every=1)
    ws = variables()
    step = driver(opt, ws, compiled)
    before = host(opt.gradient_stats)
    assert int(before["step"]) == -1 and np.isnan(before["amax"])
    step(known_grads())
    ref = gradient_stats(known_grads(), np)
    assert_matches(opt.gradient_stats, ref)
    assert opt.gradient_stats["per_tensor"]["names"] == tuple(w.path for w in ws)
    assert float(ref.amax) == 4.0 and float(ref.zero_fraction) == float(np.float32(3 / 7))  # the reference is not trivial


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_nan_gradient_has_nan_headroom_not_infinite(compiled):
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), stats_every=1)
    step = driver(opt, variables(), compiled)
    grads = known_grads()
    grads[0][1] = np.nan
    step(grads)
    got = host(opt.gradient_stats)
    assert np.isnan(got["headroom_bits"]) and np.isnan(got["per_tensor"]["headroom_bits"][0])
    assert float(got["per_tensor"]["headroom_bits"][1]) == pytest.approx(np.log2(65504 / 4.0))


def test_stats_of_already_unscaled_gradients_are_in_scaled_units():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0**4, stats_every=1)
    ws = variables()
    opt.build(ws)
    unscaled = opt.get_unscaled_gradients([ops.convert_to_tensor(g) for g in known_grads(2.0**4)])
    opt.apply(unscaled, ws)
    assert_matches(opt.gradient_stats, gradient_stats(known_grads(2.0**4), np))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_sampled_only_every_n_steps(compiled):
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), stats_every=3)
    step = driver(opt, variables(), compiled)
    steps, amaxes = [], []
    for i in range(7):
        step(known_grads(2.0**i))
        got = host(opt.gradient_stats)
        steps.append(int(got["step"]))
        amaxes.append(float(got["amax"]))
    assert steps == [0, 0, 0, 3, 3, 3, 6]
    assert amaxes == [4.0 * 2.0**s for s in steps]


@pytest.mark.skipif(BACKEND != "torch", reason="the eager torch step decides the sample on the host")
def test_an_unsampled_eager_torch_step_does_not_walk_the_gradients(monkeypatch):
    """The torch backend's step reads the count first: the gradients are sorted into the sampler's order (about
    3 us per tensor) only when the step is sampled."""
    from lossscale.keras import _stats

    walked = []
    in_build_order = _stats.StatsVariables.in_build_order
    monkeypatch.setattr(_stats.StatsVariables, "in_build_order",
                        lambda self, *a: walked.append(1) or in_build_order(self, *a))
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), stats_every=3)
    step = driver(opt, variables(), compiled=False)
    for i in range(7):
        step(known_grads(2.0**i))
    assert len(walked) == 3  # steps 0, 3, 6
    assert int(host(opt.gradient_stats)["step"]) == 6


@pytest.mark.skipif(BACKEND != "torch", reason="the eager torch step decides the sample on the host")
def test_the_eager_torch_step_reads_the_count_from_the_device_only_after_another_write(monkeypatch):
    """The count's host copy follows this sampler's own writes; an ``assign`` from elsewhere (a load) makes the next
    step read the variable again (on a GPU each read is a host sync), and the sampling follows the new count."""
    from lossscale.keras import _stats

    reads = []
    host_int = _stats._host_int
    monkeypatch.setattr(_stats, "_host_int", lambda t: reads.append(1) or host_int(t))
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), stats_every=3)
    step = driver(opt, variables(), compiled=False)
    for i in range(7):
        step(known_grads(2.0**i))
    assert (len(reads), int(host(opt.gradient_stats)["step"])) == (1, 6)
    count = next(v for v in opt.variables if v.path.endswith("stats_count"))
    assert int(ops.convert_to_numpy(count)) == 7
    count.assign(2)  # as a load would
    step(known_grads())  # count 2: not sampled
    step(known_grads(8.0))  # count 3: sampled
    step(known_grads())  # count 4
    assert len(reads) == 2
    got = host(opt.gradient_stats)
    assert (int(got["step"]), float(got["amax"])) == (3, 32.0)
    assert int(ops.convert_to_numpy(count)) == 5


def _off_the_cpu(monkeypatch):
    """The torch step as with its variables on a GPU: no numpy path (``advance_on_host`` declines)."""
    from lossscale.keras._state import ScaleVariables

    monkeypatch.setattr(ScaleVariables, "advance_on_host", lambda *args, **kwargs: None)


@pytest.mark.skipif(BACKEND != "torch", reason="the eager torch step decides the sample on the host")
def test_an_unsampled_torch_step_off_the_cpu_reads_no_sample(monkeypatch):
    """With the variables off the CPU an unsampled step neither reads nor writes the kept sample and adds 1 to the
    count: two torch operators that launch kernels more than without statistics (it copied each of the 11 sample
    variables and the count, and ran the count's rule: 16 more)."""
    from tests.torch.op_counter import count_ops

    _off_the_cpu(monkeypatch)

    def launched(every):
        opt, ws = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), stats_every=every), variables()
        step = driver(opt, ws, compiled=False)
        for _ in range(2):  # steps 0 (sampled) and 1
            step(known_grads())
        grads = [ops.convert_to_tensor(g) for g in known_grads()]
        return count_ops(lambda: opt.apply(grads, ws), views=False)  # step 2 of 16: not sampled

    assert launched(16) - launched(None) == 2


@pytest.mark.skipif(BACKEND != "torch", reason="the eager torch step decides the sample on the host")
def test_a_stateless_unsampled_torch_step_leaves_the_given_values_alone(monkeypatch):
    """``stateless_apply`` off the CPU: the count comes back advanced, and no tensor handed in has changed."""
    _off_the_cpu(monkeypatch)
    opt, ws = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), stats_every=3), variables()
    step = driver(opt, ws, compiled=False)
    step(known_grads())  # step 0, sampled
    given = [v.value.clone() for v in opt.variables]
    kept = [t.clone() for t in given]
    _, new = opt.stateless_apply(given, [ops.convert_to_tensor(g) for g in known_grads()], [w.value for w in ws])
    for before, after in zip(kept, given):
        np.testing.assert_array_equal(ops.convert_to_numpy(after), ops.convert_to_numpy(before))
    position = next(i for i, v in enumerate(opt.variables) if v.path.endswith("stats_count"))
    assert (int(ops.convert_to_numpy(given[position])), int(ops.convert_to_numpy(new[position]))) == (1, 2)


@pytest.mark.skipif(BACKEND != "torch", reason="the eager torch step decides the sample on the host")
@pytest.mark.parametrize("loss_scale", ["dynamic", "auto"])
def test_the_torch_step_off_the_cpu_moves_as_the_numpy_path(loss_scale, monkeypatch):
    """The scale, the count and the kept sample off the CPU equal the numpy path's on the same gradients, an Inf
    on an unsampled step included."""

    def run():
        opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), loss_scale, stats_every=3)
        step, seen = driver(opt, variables(), compiled=False), []
        for i in range(8):
            grads = known_grads(2.0**i)
            if i == 4:
                grads[1][0, 0] = np.inf
            step(grads)
            seen.append((float(opt.loss_scale), int(ops.convert_to_numpy(opt.iterations)),
                         [float(ops.convert_to_numpy(v)) for v in opt.variables if v.path.endswith("stats_count")]))
        return seen, host(opt.gradient_stats)

    on_host, stats_on_host = run()
    _off_the_cpu(monkeypatch)
    off_cpu, stats_off_cpu = run()
    assert off_cpu == on_host
    assert [c for _, _, [c] in on_host] == list(range(1, 9))
    np.testing.assert_equal(stats_off_cpu, stats_on_host)
    assert int(stats_on_host["step"]) == 6


def test_a_variable_it_was_not_built_with_raises_on_unsampled_steps_too():
    ws = variables()
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(1.0), stats_every=4, initial_scale=1)
    driver(opt, ws, compiled=False)(known_grads())  # step 0: sampled; the next one is not
    stranger = keras.Variable(np.ones(2, "float32"), name="stranger")
    before = [np.array(ops.convert_to_numpy(v)) for v in [*ws, *opt.variables]]
    with pytest.raises(ValueError, match="Unknown variable|not one"):
        opt.apply([ops.ones(3), ops.ones(2)], [ws[0], stranger])
    for v, b in zip([*ws, *opt.variables], before):
        np.testing.assert_array_equal(ops.convert_to_numpy(v), b)
    np.testing.assert_array_equal(ops.convert_to_numpy(stranger), np.ones(2, "float32"))


def _executed_nodes(every, tensors, loss_scale="dynamic"):
    """The nodes TensorFlow's executor runs for one traced ``apply`` (its partitioned, optimized graph)."""
    import tensorflow as tf
    from tensorflow.python.eager import context  # the run metadata's graphs: no public API

    ws = [keras.Variable(np.zeros((3, 3), np.float32), name=f"w{i}") for i in range(tensors)]
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), loss_scale, stats_every=every)
    opt.build(ws)
    step = tf.function(lambda *g: opt.apply(list(g), ws))
    context.context().enable_run_metadata()
    try:
        step(*(tf.ones((3, 3)) for _ in ws))
        metadata = context.context().export_run_metadata()
    finally:
        context.context().disable_run_metadata()
    return max(sum(len(p.node) for p in f.partition_graphs) for f in metadata.function_graphs)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's executor")
def test_an_unsampled_tf_step_runs_few_nodes_more_than_without_stats():
    """TensorFlow's executor visits every node of a lowered cond's untaken branch: the sample sits in one function
    call, so each gradient adds about 3 nodes to the step (its sample's output), not the ~18 of the sums inlined
    into the branch. Each branch runs the rule itself, so the update's cond holds no second copy of it: about 25
    nodes beyond those (8 gradients: 50, 32: 121; with the rule in the update's cond they were 82 and 154)."""
    for tensors in (8, 32):
        extra = _executed_nodes(16, tensors) - _executed_nodes(None, tensors)
        assert 0 < extra <= 40 + 3 * tensors, (tensors, extra)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's executor")
def test_an_unsampled_tf_auto_step_runs_the_backoff_not_the_sample_rule():
    """``auto`` goes through the same branch: the sampled one runs the sample and the whole rule in one function
    call, the other the check and the rule's overflow backoff. 32 gradients add about 230 nodes, not the ~740 of
    the rule and the kept sample's selects and writes on every step."""
    extra = _executed_nodes(None, 32, "auto") - _executed_nodes(None, 32)
    assert 0 < extra <= 300, extra


@pytest.mark.skipif(BACKEND != "jax", reason="jax.transfer_guard and trace counting")
def test_jax_step_compiles_once_and_never_transfers():
    import jax

    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), stats_every=2)
    ws = variables()
    opt.build(ws)
    traces = []

    def pure(o, g, w):
        traces.append(1)
        return opt.stateless_apply(o, g, w)

    fn = jax.jit(pure)
    o, w = [v.value for v in opt.variables], [v.value for v in ws]
    grads = [jax.device_put(g) for g in known_grads()]
    with jax.transfer_guard("disallow"):
        for _ in range(5):
            w, o = fn(o, grads, w)
    assert len(traces) == 1
    for variable, value in zip(opt.variables, o):
        variable.assign(value)
    assert int(opt.gradient_stats["step"]) == 4


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("loss_scale", [None, "auto"])
def test_fit_compiles_and_runs_with_stats_every(mixed_float16, loss_scale):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = rng.standard_normal((64, 1)).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1, dtype="float32")]
    )
    opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-3), loss_scale, stats_every=3)
    model.compile(optimizer=opt, loss="mse")
    assert model.optimizer is opt
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)  # 8 steps: sampled at 0, 3, 6
    got = host(opt.gradient_stats)
    assert int(got["step"]) == 6
    assert 0.0 < float(got["amax"]) < 65504.0
    np.testing.assert_allclose(got["headroom_bits"], np.log2(65504.0 / got["amax"]), rtol=1e-5)
    assert got["per_tensor"]["amax"].shape == (4,)
    assert float(got["amax"]) == got["per_tensor"]["amax"].max()
    assert int(ops.convert_to_numpy(opt.iterations)) + int(ops.convert_to_numpy(opt.skipped_steps)) == 8


@pytest.mark.skipif(BACKEND != "tensorflow", reason="jit_compile of a TensorFlow train step")
def test_fit_under_xla_samples_as_without(mixed_float16, monkeypatch):
    """``jit_compile=True`` (Keras's default on a GPU) compiles the sampled branch's function call into the step,
    with the core's sums; TensorFlow's executor uses its own kernels' form: the same sample, count and weights."""
    from lossscale.keras import _stats

    traced = []
    sum_of_bools = _stats._sum_of_bools
    monkeypatch.setattr(_stats, "_sum_of_bools", lambda mask: traced.append(mask) or sum_of_bools(mask))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.standard_normal((32, 1)).astype(np.float32)
    results = []
    for jit in (False, True):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1, dtype="float32")])
        opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-3), stats_every=3)
        model.compile(optimizer=opt, loss="mse", jit_compile=jit)
        traced.clear()
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)  # 8 steps: sampled at 0, 3, 6
        assert (len(traced) > 0) != jit, jit  # the executor's counting traced for each gradient, not under XLA
        results.append((host(opt.gradient_stats), int(ops.convert_to_numpy(opt._scale_variables.stats.count)),
                        [ops.convert_to_numpy(w) for w in model.weights]))
    (plain, count, weights), (xla, xla_count, xla_weights) = results
    assert int(plain["step"]) == int(xla["step"]) == 6 and count == xla_count == 8
    # The sampled gradients are float16: XLA and the executor may round a float16 product differently (CPUs with
    # AVX-512 FP16 compute it natively under XLA), so they agree to float16's resolution, 2**-11.
    np.testing.assert_allclose(xla["per_tensor"]["amax"], plain["per_tensor"]["amax"], rtol=2.0**-10)
    np.testing.assert_allclose(xla["per_tensor"]["rms"], plain["per_tensor"]["rms"], rtol=2.0**-10)
    for a, b in zip(xla_weights, weights):  # 8 Adam steps of 1e-3 from those gradients: within 1% of one step
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ auto


def true_grads():
    rng = np.random.default_rng(1)
    return [(rng.normal(size=s) * 2.0**e).astype(np.float32) for s, e in zip(SHAPES, (-4, -22))]


def scale_of(opt):
    return float(ops.convert_to_numpy(opt.loss_scale))


@pytest.mark.parametrize("start", [1.0, 2.0**30])
def test_auto_reaches_the_target_within_two_samples(start):
    policy = lossscale.AutoLossScale(start)
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), policy, stats_every=1)
    step = driver(opt, variables(), compiled=True)
    scales = [scale_of(opt)]
    for _ in range(2):
        step([g * np.float32(scales[-1]) for g in true_grads()])
        scales.append(scale_of(opt))
    scaled16 = [(g * np.float32(scales[-1])).astype(np.float16) for g in true_grads()]
    after = gradient_stats(scaled16, np)
    assert float(after.zero_fraction) == 0.0
    assert float(after.headroom_bits) >= policy.margin_bits
    assert all(policy.min_loss_scale <= s <= policy.ceiling for s in scales)
    assert scales[1] != start  # one jump, not the TF rule's doubling after 2000 steps
    assert int(ops.convert_to_numpy(opt.skipped_steps)) == 0


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_auto_follows_the_core_rule_and_skips_on_inf_and_nan(compiled):
    policy = lossscale.AutoLossScale(1.0)
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.5), policy, stats_every=1)
    ws = variables()
    step = driver(opt, ws, compiled)
    ref_state, ref_auto = lossscale.initial_state(policy, np), initial_auto_state(policy, np)
    for i, bad in enumerate([None, None, np.inf, None, np.nan, None]):
        scale = scale_of(opt)
        grads = [g * np.float32(scale) for g in true_grads()]
        if bad is not None:
            grads[0][1] = bad
        weights = [np.array(ops.convert_to_numpy(w)) for w in ws]
        iterations = int(ops.convert_to_numpy(opt.iterations))
        step(grads)
        finite = np.bool_(bad is None)
        with np.errstate(all="ignore"):
            ref_state, ref_auto = next_auto_state(
                policy, ref_state, ref_auto, finite, gradient_stats(grads, np, i), True, np
            )
        assert scale_of(opt) == float(ref_state.loss_scale)
        assert int(ops.convert_to_numpy(opt.skipped_steps)) == int(ref_state.skipped_steps)
        if bad is not None:  # skipped: weights and iterations untouched, the scale backed off at least one bit
            assert int(ops.convert_to_numpy(opt.iterations)) == iterations
            for w, before in zip(ws, weights):
                np.testing.assert_array_equal(ops.convert_to_numpy(w), before)
            assert scale_of(opt) <= max(scale / 2.0, policy.min_loss_scale)
            assert bool(ops.convert_to_numpy(opt.last_step_skipped))
        else:
            assert int(ops.convert_to_numpy(opt.iterations)) == iterations + 1
    assert int(ops.convert_to_numpy(opt.skipped_steps)) == 2
    margin = float(ops.convert_to_numpy(opt._scale_variables.stats.auto[0]))  # AutoState.margin
    assert margin == float(ref_auto.margin) > policy.margin_bits  # the overflows were remembered


def _as_on_a_gpu(monkeypatch):
    """This backend's GPU paths on the CPU: JAX's finite check without a cond, torch without the numpy path."""
    if BACKEND == "jax":
        import lossscale.keras._grads as grads_module

        monkeypatch.setattr(grads_module, "by_platform", lambda cpu, other, like=(): other())
    elif BACKEND == "torch":
        _off_the_cpu(monkeypatch)
    else:
        pytest.skip("with TensorFlow lossscale takes the same path on a GPU as on the CPU")


@pytest.mark.parametrize("gpu_path", [False, True], ids=["cpu-path", "gpu-path"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("kind", ["auto", "dynamic"])
def test_unsampled_steps_follow_the_core_sampler(compiled, kind, gpu_path, monkeypatch):
    """stats_every=3 over overflows on sampled and unsampled steps: the scale, counters, count, auto state and kept
    sample of every step equal the numpy core's sampler (torch on CPU runs unsampled steps on host views; with
    ``gpu_path``, as on a GPU)."""
    if gpu_path:
        _as_on_a_gpu(monkeypatch)
    policy = (lossscale.AutoLossScale(2.0**4) if kind == "auto"
              else lossscale.DynamicLossScale(2.0**4, increment_period=2))
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.5), policy, stats_every=3)
    step = driver(opt, variables(), compiled)
    ref, sampler = lossscale.initial_state(policy, np), initial_sampler_state(policy, len(SHAPES), np)
    for i, bad in enumerate([None, np.inf, None, np.nan, None, None, np.inf, None, None, None]):
        grads = [g * np.float32(scale_of(opt)) for g in true_grads()]
        if bad is not None:
            grads[1][0, 0] = bad
        step(grads)
        sampled = is_due(3, i)
        with np.errstate(all="ignore"):
            sample = gradient_stats(grads, np, i) if sampled else None
            finite = np.bool_(bad is None)
            ref, sampler = advance(policy, ref, finite, np, sampler=sampler, sample=sample, sampled=sampled)
        assert scale_of(opt) == float(ref.loss_scale), i
        assert int(ops.convert_to_numpy(opt.skipped_steps)) == int(ref.skipped_steps), i
        assert int(ops.convert_to_numpy(opt._scale_variables.stats.count)) == sampler.count == i + 1
        if kind == "auto":
            for variable, value in zip(opt._scale_variables.stats.auto, sampler.auto):
                np.testing.assert_array_equal(ops.convert_to_numpy(variable), value, err_msg=str(i))
    assert_matches(opt.gradient_stats, sampler.sample)
    assert int(ops.convert_to_numpy(opt.gradient_stats["step"])) == 9


def test_auto_never_leaves_min_and_max():
    policy = lossscale.AutoLossScale(2.0**4, min_loss_scale=2.0**2, max_loss_scale=2.0**8)
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), policy, stats_every=1)
    step = driver(opt, variables(), compiled=True)
    seen = []
    for factor in (2.0**-30, 2.0**-30, 2.0**20, 2.0**20, np.inf, 2.0**-30):
        grads = [g * np.float32(scale_of(opt)) * np.float32(factor) for g in true_grads()]
        step(grads)
        seen.append(scale_of(opt))
    assert min(seen) == 2.0**2 and max(seen) == 2.0**8
    assert all(2.0**2 <= s <= 2.0**8 for s in seen)


# ------------------------------------------------------------------ config and copies


def test_config_round_trip():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(), stats_every=5)
    config = opt.get_config()
    assert config["stats_every"] == 5
    again = lsk.LossScaleOptimizer.from_config(config)
    assert again.stats_every == 5 and again.get_config() == config

    policy = lossscale.AutoLossScale(2.0**10, margin_bits=6, window=4)
    auto = lsk.LossScaleOptimizer(keras.optimizers.SGD(), policy, stats_every=2)
    config = auto.get_config()
    again = lsk.LossScaleOptimizer.from_config(config)
    assert again.loss_scale_policy == policy and again.stats_every == 2
    assert again.get_config() == config
    plain = lsk.LossScaleOptimizer.from_config(lsk.LossScaleOptimizer(keras.optimizers.SGD(), "auto").get_config())
    assert isinstance(plain.loss_scale_policy, lossscale.AutoLossScale) and plain.stats_every == 16


def test_deepcopy_carries_the_sample_and_the_auto_state():
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), lossscale.AutoLossScale(1.0), stats_every=1)
    ws = variables()
    step = driver(opt, ws, compiled=False)
    step([g * np.float32(scale_of(opt)) for g in true_grads()])
    twin = copy.deepcopy(opt)
    twin.build(ws)
    assert scale_of(twin) == scale_of(opt) != 1.0
    for a, b in zip(opt.variables, twin.variables):
        np.testing.assert_array_equal(ops.convert_to_numpy(a), ops.convert_to_numpy(b))
    assert int(host(twin.gradient_stats)["step"]) == 0


def test_keras_file_round_trip_keeps_the_sample_and_the_auto_state(tmp_path, mixed_float16):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, dtype="float32")])
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(1e-3), lossscale.AutoLossScale(2.0**30), stats_every=2)
    model.compile(optimizer=opt, loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 4)).astype(np.float32), rng.standard_normal((16, 2)).astype(np.float32)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert scale_of(opt) < 2.0**30  # the auto state moved (gradients of about 1 overflow float16 at 2**30)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    again = loaded.optimizer
    assert isinstance(again, lsk.LossScaleOptimizer) and again.stats_every == 2
    assert again.loss_scale_policy == opt.loss_scale_policy
    assert [v.name for v in again.variables] == [v.name for v in opt.variables]
    for a, b in zip(opt.variables, again.variables):
        np.testing.assert_array_equal(ops.convert_to_numpy(a), ops.convert_to_numpy(b))


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.train.Checkpoint")
def test_tf_checkpoint_restores_the_sample_and_the_auto_state(tmp_path):
    import tensorflow as tf

    ws = variables()
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), lossscale.AutoLossScale(1.0), stats_every=2)
    step = driver(opt, ws, compiled=False)
    for _ in range(3):
        step([g * np.float32(scale_of(opt)) for g in true_grads()])
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "ckpt"))
    twin = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), lossscale.AutoLossScale(1.0), stats_every=2)
    twin.build(ws)
    tf.train.Checkpoint(optimizer=twin).restore(path).assert_existing_objects_matched()
    assert scale_of(twin) == scale_of(opt) != 1.0
    for a, b in zip(opt.variables, twin.variables):
        np.testing.assert_array_equal(ops.convert_to_numpy(a), ops.convert_to_numpy(b))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_history_records_the_samples_as_columns(compiled):
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.0), stats_every=2, history=True)
    step = driver(opt, variables(), compiled)
    for i in range(4):
        step(known_grads(2.0**i))
    if BACKEND == "jax":
        import jax

        jax.effects_barrier()
    history = opt.history
    assert len(history) == 4 and history.has_stats
    zero = history.stat("zero_fraction")
    headroom = history.stat("headroom_bits")
    assert np.isnan(zero[[1, 3]]).all()
    np.testing.assert_allclose(zero[[0, 2]], float(np.float32(3 / 7)), rtol=1e-6)
    expected = [float(gradient_stats(known_grads(2.0**i), np).headroom_bits) for i in (0, 2)]
    np.testing.assert_allclose(headroom[[0, 2]], expected, rtol=1e-6)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="jit_compile of a TensorFlow step")
@pytest.mark.parametrize("kwargs", [{"stats_every": 1}, {"loss_scale": "auto"}], ids=["stats_every", "auto"])
def test_a_nan_gradient_is_skipped_under_xla(kwargs):
    """Under TensorFlow's XLA (``jit_compile=True``) a max drops NaN (XLA's fast min/max): a sampled step whose
    flag is the sample's ``isfinite(amax)`` applied a NaN gradient (no Inf) and poisoned the weights. The NaN
    tensor's sum of squares is NaN: the sample's amax is NaN there, as eagerly, and the step is skipped."""
    import tensorflow as tf

    v = variables()
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.5), **kwargs)
    opt.build(v)
    grads = known_grads(2.0**10)
    grads[1][0, 1] = np.nan
    tf.function(lambda g: opt.apply(g, v), jit_compile=True)([tf.constant(g) for g in grads])
    assert int(ops.convert_to_numpy(opt.skipped_steps)) == 1
    for w in v:
        np.testing.assert_array_equal(ops.convert_to_numpy(w), np.zeros(w.shape, np.float32))
    got = host(opt.gradient_stats)
    assert np.isnan(float(got["amax"])) and np.isnan(float(got["headroom_bits"]))
    np.testing.assert_array_equal(np.isnan(got["per_tensor"]["amax"]), [False, True])
    np.testing.assert_array_equal(np.isnan(got["per_tensor"]["headroom_bits"]), [False, True])
