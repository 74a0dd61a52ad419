"""Keras on torch off the CPU (GPU, meta): the scale moves by GradScaler's update kernel where that gives the core
rule's bits, and what ``fit``'s step adds is counted on ``meta`` tensors (``benchmarks/kernel_count_keras.py``) and
pinned.

The kernel form runs here on CPU tensors with the numpy host path switched off (``_state.on_host``), so that the host
bookkeeping choosing between the kernel form and the rule is what a GPU runs."""

from __future__ import annotations

import random

import keras
import numpy as np
import pytest
from keras import ops

import lossscale.keras as lsk
from lossscale import DynamicLossScale, ExponentialUpdateLossScaleManager, FixedLossScale
from lossscale._rule import COUNTER_MAX, kernel_form
from tests.keras.kutil import BACKEND, grad_for, numbers, state_variables
from tests.reference import POLICIES, trajectory

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="the eager torch step off the CPU")

#: torch.amp.GradScaler's own cost over a fused AdamW step (tests/torch/test_launch_counts.py): the bar.
GRADSCALER = 10
#: Keras 3's own LossScaleOptimizer over Adam on 4 variables (a Dense 32-64-4): 30 operators, and its two
#: ``ops.cond`` predicates read on the host.
KERAS3 = (30, 2)

COVERED = [
    DynamicLossScale(),
    DynamicLossScale(2.0**15, 3, 2.0),
    DynamicLossScale(2.0**126, 1, 2.0),  # growth refused at float32's max
    DynamicLossScale(123.456, 5, 1.7, backoff_factor=0.6),
    DynamicLossScale(3.0, 2, 2.0, min_loss_scale=2.5),  # the floor after a backoff
    ExponentialUpdateLossScaleManager(5000.0, 4, 1, 1.5, 0.8),
    FixedLossScale(512.0),
]


def _pattern(seed: int, n: int, p_bad: float) -> list[bool]:
    rng = random.Random(seed)
    return [rng.random() >= p_bad for _ in range(n)]


@pytest.fixture
def kernel_calls(monkeypatch):
    """The device's path on CPU tensors; returns the list of the kernel form's calls (their ``finite``)."""
    from lossscale._torch import _kernels
    from lossscale.keras import _state

    monkeypatch.setattr(_state, "on_host", lambda value: False)
    calls: list[bool] = []
    real = _kernels.advance_scale_

    def spy(*args, **kwargs):
        calls.append(kwargs["finite"])
        real(*args, **kwargs)

    monkeypatch.setattr(_kernels, "advance_scale_", spy)
    return calls


def _stepper(policy):
    opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), policy)
    w = keras.Variable(np.zeros(2, np.float32))
    opt.build([w])

    def step(finite):
        opt.apply([ops.convert_to_tensor(grad_for(finite))], [w])
        return numbers(opt)

    return opt, step


def _covered(policy) -> bool:
    return kernel_form(policy.rule_params()) is not None


@pytest.mark.parametrize("policy", COVERED + POLICIES, ids=repr)
def test_trajectory_off_the_cpu_equals_the_rule_bit_for_bit(policy, kernel_calls):
    pattern = _pattern(hash(repr(policy)) % 2**32, 300, 0.3)
    expected = trajectory(policy, pattern, "numpy")
    assert trajectory(policy, pattern, lambda p: _stepper(p)[1]) == expected
    assert kernel_calls == (pattern if _covered(policy) else [])  # every step by the kernel form where it applies


@pytest.mark.parametrize(("policy", "written"), [
    (DynamicLossScale(8.0, 10), {"step_counter": 13}),  # past the interval (the kernel would wait for == forever)
    (DynamicLossScale(8.0, 4), {"skipped_steps": COUNTER_MAX - 2, "consecutive_skips": COUNTER_MAX - 2}),
    (DynamicLossScale(16.0, 2, min_loss_scale=4.0), {"dynamic_scale": 0.5}),  # below the floor
    (DynamicLossScale(16.0, 3), {"consecutive_skips": 5}),  # a streak the host did not see
    (FixedLossScale(4.0), {"consecutive_skips": 7, "skipped_steps": COUNTER_MAX - 1}),
], ids=["past-interval", "counters-at-limit", "below-floor", "streak", "fixed"])
def test_after_another_writer_the_state_is_read_once_and_the_trajectory_stays_the_rules(policy, written, kernel_calls,
                                                                                         monkeypatch):
    """A load or an ``assign`` between steps: seen by the tensors' version, then one host read, one step of the rule
    (``good_steps`` back below the interval), then the kernel form again."""
    from lossscale.keras._state import ScaleVariables

    reads = []
    learn = ScaleVariables._learn
    monkeypatch.setattr(ScaleVariables, "_learn", lambda self, *a: (reads.append(1), learn(self, *a))[1])
    opt, step = _stepper(policy)
    for finite in _pattern(1, 20, 0.3) + [True]:  # the host knows the streak is 0
        step(finite)
    by_name = {v.name: v for v in state_variables(opt)}
    for name, value in written.items():
        by_name[name].assign(value)
    start = numbers(opt)
    pattern = [True, True, True, False, False, True] + _pattern(2, 40, 0.3)
    calls_before = len(kernel_calls)

    def from_start(p):
        state = [start]

        def ref_step(finite):
            from lossscale import LossScaleState, next_state

            current = LossScaleState(np.float32(state[0][0]), *(np.int32(v) for v in state[0][1:]))
            with np.errstate(over="ignore"):
                state[0] = next_state(p, current, np.bool_(finite), np)
            return state[0]

        return ref_step

    assert reads == []
    assert [step(f) for f in pattern] == trajectory(policy, pattern, from_start)
    assert reads == [1]  # the state read once, at the first step after the writes
    assert numbers(opt)[3] <= COUNTER_MAX
    taken = len(kernel_calls) - calls_before
    assert taken >= len(pattern) - 3 if "skipped_steps" not in written else taken <= 2  # the form resumes


def _device_and_host_runs(monkeypatch, policy, stats_every: int, grads: list) -> list[tuple]:
    """The same steps with the device's path (on CPU tensors) and then with the CPU's numpy path: each run's state,
    variables and History (scales, skips, headroom)."""
    from lossscale.keras import _state

    runs = []
    for device in (True, False):
        if device:
            monkeypatch.setattr(_state, "on_host", lambda value: False)
        else:
            monkeypatch.setattr(_state, "on_host", lambda value: value.device.type == "cpu")
        opt = lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), policy, stats_every=stats_every, history=True)
        w = keras.Variable(np.zeros((2, 3), np.float32))
        opt.build([w])
        for g in grads:
            opt.apply([ops.convert_to_tensor(g)], [w])
        history = opt.history
        runs.append((numbers(opt), [ops.convert_to_numpy(v).tolist() for v in opt.variables],
                     history.loss_scales.tolist(), history.skipped.tolist(),
                     np.nan_to_num(history.stat("headroom_bits"), nan=-1.0).tolist()))
    return runs


def test_statistics_off_the_cpu_equal_the_host_path(monkeypatch, kernel_calls):
    """``stats_every``: the count and the kept sample, the state and the history, as the CPU's numpy path keeps them."""
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(2, 3)).astype(np.float32) * 2.0**k for k in range(30)]
    for i in (4, 11, 12, 25):
        grads[i][0, 0] = np.inf
    runs = _device_and_host_runs(monkeypatch, DynamicLossScale(2.0**10, 3), 4, grads)
    assert len(kernel_calls) == len(grads)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("shapes", ["Dense 32-64-4", "100 x 10000"])
def test_default_step_adds_no_more_than_gradscaler_and_reads_the_flag_once(shapes):
    from benchmarks.kernel_count_keras import MODELS, count_steps

    theirs = count_steps("Keras 3 LossScaleOptimizer", MODELS[shapes], steps=2)
    ours = count_steps("lossscale.keras, default", MODELS[shapes], steps=2)
    assert len(set(ours)) == 1 and len(set(theirs)) == 1, (ours, theirs)  # every step alike
    if shapes == "Dense 32-64-4":
        assert theirs[0] == KERAS3
    assert ours[0][0] <= GRADSCALER and ours[0][0] < theirs[0][0]
    assert ours[0][1] == 1 < theirs[0][1]  # the Python if's read; Keras 3's class reads two predicates


@pytest.mark.parametrize("shapes", ["Dense 32-64-4", "100 x 10000"])
def test_statistics_cost_no_more_than_gradscaler_unsampled_and_40_sampled_at_any_number_of_tensors(shapes):
    from benchmarks.kernel_count_keras import MODELS, SAMPLED_ROW, count_steps

    rows = count_steps("lossscale.keras, stats_every=16", MODELS[shapes])
    unsampled, sampled = rows[0], rows[SAMPLED_ROW]
    assert unsampled[0] <= GRADSCALER and sampled[0] <= 40
    assert {r for i, r in enumerate(rows) if i != SAMPLED_ROW} == {unsampled} and unsampled[1] == sampled[1] == 1


@pytest.mark.parametrize("shapes", ["Dense 32-64-4", "100 x 10000"])
def test_an_unsampled_finite_auto_step_adds_at_most_gradscalers_cost_plus_two(shapes):
    """Between two samples a finite ``AutoLossScale`` step only counts (its flag is read on the host for the skip):
    the counters in place, saturating as the rule's. An overflow or a sample runs the rule eagerly: the sampled
    step is not at its bar of 40, pinned so that it can only fall."""
    from benchmarks.kernel_count_keras import MODELS, SAMPLED_ROW, count_steps

    rows = count_steps('lossscale.keras, loss_scale="auto"', MODELS[shapes])
    unsampled = rows[0]
    assert unsampled[0] <= GRADSCALER + 2 and all(r[1] == 1 for r in rows)
    assert {r for i, r in enumerate(rows) if i != SAMPLED_ROW} == {unsampled}
    assert rows[SAMPLED_ROW][0] <= 241


def test_auto_off_the_cpu_equals_the_host_path(monkeypatch):
    """``loss_scale="auto"`` with overflows, samples every 3rd step and a History: the device's path (counters in
    place between samples, the rule otherwise) keeps the numbers and the rows the CPU's numpy path keeps."""
    from lossscale import AutoLossScale

    rng = np.random.default_rng(1)
    grads = [rng.normal(size=(2, 3)).astype(np.float32) * 2.0 ** (k % 7 - 20) for k in range(40)]
    for i in (2, 5, 6, 13, 27):
        grads[i][1, 1] = np.nan if i % 2 else np.inf
    runs = _device_and_host_runs(monkeypatch, AutoLossScale(2.0**20, relax_steps=4), 3, grads)
    assert runs[0] == runs[1]
    assert len(set(runs[0][2])) > 2 and sum(runs[0][3]) == 5  # the scale moved; the five overflows skipped
