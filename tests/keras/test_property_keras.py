"""Property tests (hypothesis) of lossscale.keras.LossScaleOptimizer on the backend of this process.

Skips, control runs, save/load (``save_own_variables``/``load_own_variables``, what ``.keras`` files and
``save_weights`` use), and tampered saved values. Profiles: tests/properties.py.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from keras import ops
from kutil import BACKEND

import lossscale
import lossscale.keras as lsk
from tests import properties as props

SHAPES = [(3,), (2, 2)]
POISON = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}
FIELDS = {
    "dynamic_scale": "loss_scale",
    "step_counter": "good_steps",
    "bad_steps": "bad_steps",
    "skipped_steps": "skipped_steps",
    "consecutive_skips": "consecutive_skips",
}
STATE_NAMES = list(FIELDS)


def true_grads(step):
    rng = np.random.default_rng(step)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def exact(policy) -> bool:
    p = policy.rule_params()
    return all(
        float(np.log2(x)).is_integer() for x in (p.initial_scale, p.growth_factor, p.backoff_multiplier, p.backoff_divisor)
    )


class Run:
    def __init__(self, policy):
        self.variables = [keras.Variable(np.ones(s, np.float32)) for s in SHAPES]
        self.opt = lsk.LossScaleOptimizer(keras.optimizers.Adam(0.05), policy)
        self.opt.build(self.variables)

    def scale(self) -> float:
        return float(ops.convert_to_numpy(self.opt.loss_scale))

    def step(self, step, entry):
        grads = [g * np.float32(self.scale()) for g in true_grads(step)]
        if entry is not None:
            kind, which = entry
            flat = grads[which % len(grads)].reshape(-1)
            flat[which % flat.size] = POISON[kind]
        self.opt.apply([ops.convert_to_tensor(g) for g in grads], self.variables)

    def weights(self):
        return [np.array(ops.convert_to_numpy(v)) for v in self.variables]

    def opt_values(self):
        return [np.array(ops.convert_to_numpy(v)) for v in self.opt.variables]

    def store(self):
        store = {}
        self.opt.save_own_variables(store)
        return {k: np.array(v) for k, v in store.items()}


def assert_all(a, b, bitwise):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if bitwise:
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, rtol=2e-6, atol=1e-7)


def run_property(data):
    policy = data.draw(props.policies(), label="policy")
    plan = data.draw(props.step_plans(6), label="plan")
    stop = data.draw(st.integers(0, len(plan)), label="checkpoint step")
    run, control, resumed = Run(policy), Run(policy), None
    bitwise = exact(policy)
    for i, entry in enumerate(plan):
        if i == stop:
            resumed = Run(policy)
            resumed.opt.load_own_variables(run.store())
            for target, value in zip(resumed.variables, run.weights()):
                target.assign(value)
        before = run.weights(), run.opt_values()
        run.step(i, entry)
        if resumed is not None:
            resumed.step(i, entry)
        assert props.in_bounds(run.scale(), policy)
        if entry is not None:  # skipped: weights and every optimizer variable but the scale's own unchanged
            assert bool(ops.convert_to_numpy(run.opt.last_step_skipped))
            after = run.opt_values()
            inner = len(run.opt._variables)
            assert_all(before[0], run.weights(), bitwise=True)
            assert_all(before[1][inner:], after[inner:], bitwise=True)
        else:
            control.step(i, None)
            assert_all(run.weights(), control.weights(), bitwise)
            inner = len(run.opt._variables)
            assert_all(run.opt_values()[inner:], control.opt_values()[inner:], bitwise)
    if resumed is not None:
        assert_all(run.weights(), resumed.weights(), bitwise=True)
        assert_all(run.opt_values(), resumed.opt_values(), bitwise=True)


@props.fast(4)
@given(st.data())
def test_skips_control_and_resume(data):
    run_property(data)


@props.slow(4)
@given(st.data())
def test_skips_control_and_resume_slow(data):
    run_property(data)


def tamper_property(data):
    policy = data.draw(props.policies(), label="policy")
    store = Run(policy).store()
    target = Run(policy)
    index = {id(v): str(i) for i, v in enumerate(target.opt.variables)}
    name = data.draw(st.sampled_from([STATE_NAMES[0], *STATE_NAMES]), label="variable")  # the scale twice as often
    key = index[id(next(v for v in target.opt.variables if v.path.endswith("/" + name)))]
    store[key] = data.draw(props.bad_values(lambda: np.ones(2, np.float32)), label="value")
    before = target.opt_values()
    try:
        target.opt.load_own_variables(store)
    except (TypeError, ValueError) as error:
        assert name in str(error) or FIELDS[name] in str(error)
        assert_all(before, target.opt_values(), bitwise=True)  # refused: nothing assigned
        return
    assert props.in_bounds(target.scale(), policy)  # accepted: a valid state
    for value in target.opt_values()[3:7]:
        assert 0 <= int(value) < 2**31


@props.fast(25)
@given(st.data())
def test_tampered_saved_variables_are_refused_or_valid(data):
    tamper_property(data)


@props.slow(25)
@given(st.data())
def test_tampered_saved_variables_are_refused_or_valid_slow(data):
    tamper_property(data)


def test_keras_file_with_a_nan_scale_is_refused(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    opt = model.optimizer
    opt.build(model.trainable_variables)
    opt.dynamic_scale.assign(np.float32(np.nan))
    path = tmp_path / "m.keras"
    model.save(path)
    with pytest.raises(ValueError, match=r"saved variables\['loss_scale'\] must be finite in float32 .*got nan"):
        keras.saving.load_model(path)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.train.Checkpoint is TensorFlow's")
def test_tf_checkpoint_restore_of_a_bad_scale_is_refused(tmp_path):
    import tensorflow as tf

    run = Run(lossscale.DynamicLossScale(2.0**10, 2, max_loss_scale=2.0**12))
    checkpoint = tf.train.Checkpoint(optimizer=run.opt)
    run.opt.dynamic_scale.assign(2.0**20)  # outside [1, 2**12]: as a hand-edited checkpoint would hold
    path = checkpoint.save(str(tmp_path / "c"))
    run.opt.dynamic_scale.assign(2.0**11)
    with pytest.raises(ValueError, match="outside the policy's bounds"):
        checkpoint.restore(path)
    assert run.scale() == 2.0**11
    fresh = Run(lossscale.DynamicLossScale(2.0**10, 2, max_loss_scale=2.0**12))  # deferred: restored at build
    fresh_ckpt = tf.train.Checkpoint(optimizer=lsk.LossScaleOptimizer(
        keras.optimizers.Adam(0.05), lossscale.DynamicLossScale(2.0**10, 2, max_loss_scale=2.0**12)))
    fresh_ckpt.restore(path)
    with pytest.raises(ValueError, match="outside the policy's bounds"):
        fresh_ckpt.optimizer.build(fresh.variables)


def test_every_state_variable_with_every_bad_value():
    """Exhaustive companion of the tamper property: each state variable, each bad value, through load_own_variables."""
    policy = lossscale.DynamicLossScale(2.0**10, 3, max_loss_scale=2.0**12)
    target = Run(policy)
    store = target.store()
    index = {id(v): str(i) for i, v in enumerate(target.opt.variables)}
    values = [*props.BAD_SCALARS, np.ones(2, np.float32), np.int64(2**32), np.float64(0.0)]
    for name in STATE_NAMES:
        key = index[id(next(v for v in target.opt.variables if v.path.endswith("/" + name)))]
        for value in values:
            before = target.opt_values()
            try:
                target.opt.load_own_variables({**store, key: value})
            except (TypeError, ValueError) as error:
                assert FIELDS[name] in str(error) or name in str(error)
                assert_all(before, target.opt_values(), bitwise=True)
                continue
            assert name != "dynamic_scale" and value in (0, 0.0), (name, value)  # only a count of 0 is valid
            target.opt.load_own_variables(store)


def test_pickled_record_with_a_nan_scale_is_refused_at_build():
    """pickle/deepcopy restore through load_own_variables at build: the same check, nothing assigned."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0**10)
    opt.build(model.trainable_variables)
    restore, (cls, config, custom, values, history) = opt.__reduce__()
    key = str(next(i for i, v in enumerate(opt.variables) if v is opt.dynamic_scale))
    copy = restore(cls, config, custom, {**values, key: np.float32(np.nan)}, history)
    with pytest.raises(ValueError, match=r"saved variables\['loss_scale'\] must be finite in float32 .*got nan"):
        copy.build(model.trainable_variables)
    assert float(ops.convert_to_numpy(copy.loss_scale)) == 2.0**10  # the initial value, not the NaN
