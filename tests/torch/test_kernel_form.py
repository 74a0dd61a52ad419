"""The torch scale update off the CPU (``kernel_form``'s fused form, GradScaler's update kernel) against the core rule
in numpy, bit for bit, on random sequences that reach float32's max, the floor and the counters' limit; and the
one-op reciprocal against the float64 route.

The fused form runs here on CPU tensors: ``advance_scale_`` directly, and ``PrivateLossScale`` with its numpy host
path switched off, so the host bookkeeping that chooses between the fused form and the rule is what a GPU runs."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from lossscale import (
    DynamicLossScale,
    ExponentialUpdateLossScaleManager,
    FixedLossScale,
    FixedLossScaleManager,
    LossScaleState,
    initial_state,
    next_state,
)
from lossscale._rule import COUNTER_MAX, kernel_form
from lossscale._torch._kernels import advance_scale_, reciprocal
from lossscale.torch import _state
from lossscale.torch._checkpoint import ScaleRecord
from lossscale.torch._state import PrivateLossScale
from tests.reference import POLICIES, as_numbers

F32_MAX = float(np.finfo(np.float32).max)

COVERED = [
    DynamicLossScale(),
    DynamicLossScale(2.0**15, 3, 2.0),
    DynamicLossScale(1.0, 1, 2.0),  # into float32's max: growth refused there, and back
    DynamicLossScale(2.0**126, 2, 2.0),
    DynamicLossScale(123.456, 5, 1.7, backoff_factor=0.6),  # factors that are not powers of two, rounded to float32 as the rule rounds
    DynamicLossScale(3.0, 2, 2.0, min_loss_scale=2.5),  # the floor after a backoff
    DynamicLossScale(2.0, 1, 2.0, min_loss_scale=0.25),
    DynamicLossScale(300.0, 3, 2.0, backoff_factor=0.7),
    DynamicLossScale(2.0**-100, 2, 3.0, min_loss_scale=2.0**-126, backoff_factor=0.1),  # down to the smallest normal
    ExponentialUpdateLossScaleManager(5000.0, 4, 1, 1.5, 0.8),
    FixedLossScale(512.0),
    FixedLossScaleManager(3.0),
]


def _pattern(seed: int, n: int, p_bad: float) -> list[bool]:
    rng = random.Random(seed)
    return [rng.random() >= p_bad for _ in range(n)]


def _numbers(state: LossScaleState) -> tuple:
    return as_numbers(tuple(np.asarray(t) if not isinstance(t, torch.Tensor) else t.numpy() for t in state))


def _flag(finite: bool) -> torch.Tensor:
    return torch.tensor(0.0 if finite else 1.0)


def test_kernel_form_covers_the_default_policies_and_refuses_what_the_kernel_cannot_do():
    assert kernel_form(DynamicLossScale().rule_params()) == (True, 2.0, 0.5, 2000, 1.0)
    assert kernel_form(ExponentialUpdateLossScaleManager(4.0, 5, 1, 2.0, 0.5).rule_params()) == (True, 2.0, 0.5, 5, 1.0)
    assert kernel_form(FixedLossScale(8.0).rule_params()).dynamic is False
    for policy in [
        DynamicLossScale(hysteresis=2),
        DynamicLossScale(max_loss_scale=2.0**20),
        DynamicLossScale(multiplier=3.0),  # TF's backoff divides by 3: not one multiplication
        ExponentialUpdateLossScaleManager(4.0, 5, 2, 2.0, 0.5),
    ]:
        assert kernel_form(policy.rule_params()) is None, policy
    for policy in POLICIES:  # every policy of the shared reference table is either covered or refused, never wrong
        form = kernel_form(policy.rule_params())
        assert form is None or form.growth_interval >= 1


@pytest.mark.parametrize("policy", COVERED, ids=repr)
@pytest.mark.parametrize("p_bad", [0.05, 0.4, 0.9])
def test_fused_form_equals_the_rule_bit_for_bit(policy, p_bad):
    form = kernel_form(policy.rule_params())
    assert form is not None
    ref = initial_state(policy, np)
    live = initial_state(policy, torch)
    for i, finite in enumerate(_pattern(hash((repr(policy), p_bad)) % 2**32, 700, p_bad)):
        ref = next_state(policy, ref, np.bool_(finite), np)
        advance_scale_(form, live, _flag(finite), above_floor=True)
        assert _numbers(live) == _numbers(ref), (i, finite)


@pytest.mark.parametrize("policy", COVERED, ids=repr)
@pytest.mark.parametrize("p_bad", [0.05, 0.4, 0.9])
@pytest.mark.parametrize("track_streak", [True, False], ids=["streak-known", "streak-unknown"])
def test_form_with_the_flag_read_on_the_host_equals_the_rule_bit_for_bit(policy, p_bad, track_streak):
    """Keras on torch reads the flag for its Python ``if``: the operators it makes no-ops are left out. From the
    initial state and from a scale set below the floor (a backoff lands on the floor, growth from below it)."""
    form = kernel_form(policy.rule_params())
    low = np.float32(policy.rule_params().min_scale / 4) if policy.rule_params().dynamic else None
    for start in [None, low] if low is not None else [None]:
        ref, live = initial_state(policy, np), initial_state(policy, torch)
        if start is not None:
            ref, live = ref._replace(loss_scale=start), live._replace(loss_scale=torch.tensor(start))
        streak_zero = True
        for i, finite in enumerate(_pattern(hash((repr(policy), p_bad, 1)) % 2**32, 500, p_bad)):
            ref = next_state(policy, ref, np.bool_(finite), np)
            advance_scale_(form, live, _flag(finite), finite=finite, streak_is_zero=streak_zero and track_streak)
            streak_zero = finite
            assert _numbers(live) == _numbers(ref), (start, i, finite)


def test_form_with_the_flag_read_on_the_host_finite_step_is_one_operator():
    from tests.torch.op_counter import count_ops

    policy = DynamicLossScale()
    form = kernel_form(policy.rule_params())
    live = initial_state(policy, torch, device="meta")
    zero, one = torch.zeros((), device="meta"), torch.ones((), device="meta")
    assert count_ops(lambda: advance_scale_(form, live, zero, finite=True, streak_is_zero=True), False) == 1
    assert count_ops(lambda: advance_scale_(form, live, zero, finite=True, streak_is_zero=False), False) == 2
    assert count_ops(lambda: advance_scale_(form, live, one, finite=False, streak_is_zero=True), False) == 4


@pytest.mark.parametrize("policy", COVERED[:9], ids=repr)
def test_the_two_operator_floor_equals_the_rule_from_a_scale_below_the_floor(policy):
    form = kernel_form(policy.rule_params())
    below = np.float32(policy.rule_params().min_scale / 4)
    ref = initial_state(policy, np)._replace(loss_scale=below)
    live = initial_state(policy, torch)._replace(loss_scale=torch.tensor(below))
    for finite in _pattern(7, 300, 0.3):
        ref = next_state(policy, ref, np.bool_(finite), np)
        advance_scale_(form, live, _flag(finite), above_floor=False)
        assert _numbers(live) == _numbers(ref)


def _device_path(owner, monkeypatch):
    """The owner as on a GPU: its numpy host path off, so advance() chooses between the fused form and the rule."""
    real = _state._host_views
    monkeypatch.setattr(_state, "_host_views", lambda holder, tensors: None if holder is owner else real(holder, tensors))
    return owner


@pytest.mark.parametrize("policy", [DynamicLossScale(4.0, 2), DynamicLossScale(2.0**127, 1, 2.0)], ids=repr)
def test_owner_near_the_counters_limit_saturates_as_the_rule(policy, monkeypatch):
    top = COUNTER_MAX - 3
    ref = initial_state(policy, np)._replace(skipped_steps=np.int32(top), consecutive_skips=np.int32(top))
    owner = _device_path(PrivateLossScale(policy), monkeypatch)
    owner.load(ScaleRecord(policy, LossScaleState(*(torch.as_tensor(np.asarray(v)) for v in ref))))
    for finite in [False] * 6 + [True] + [False] * 4:
        ref = next_state(policy, ref, np.bool_(finite), np)
        owner.advance(_flag(finite))
        assert _numbers(owner.tensors) == _numbers(ref)
    assert int(owner.tensors.skipped_steps) == COUNTER_MAX


def test_owner_after_a_shorter_growth_interval_grows_as_the_rule(monkeypatch):
    """GradScaler's set_growth_interval: good_steps may already be past the new interval; the kernel would wait
    for ``==`` forever, the rule grows at ``>=``."""
    from lossscale.torch._state import IterationScale

    long, short = DynamicLossScale(8.0, 10), DynamicLossScale(8.0, 3)
    owner = _device_path(IterationScale(long), monkeypatch)
    ref = initial_state(long, np)
    for _ in range(6):
        ref = next_state(long, ref, np.bool_(True), np)
        owner.advance(_flag(True))
    owner.set_policy(short)
    for finite in _pattern(3, 60, 0.2):
        ref = next_state(short, ref, np.bool_(finite), np)
        owner.advance(_flag(finite))
        assert _numbers(owner.tensors) == _numbers(ref)


def test_owner_after_a_scale_set_below_the_floor_keeps_it_until_a_backoff(monkeypatch):
    from lossscale.torch._state import IterationScale

    policy = DynamicLossScale(16.0, 2, min_loss_scale=4.0)
    owner = _device_path(IterationScale(policy), monkeypatch)
    owner.set_scale(torch.tensor(0.5))
    ref = initial_state(policy, np)._replace(loss_scale=np.float32(0.5))
    for finite in [True, True, True, False, True, False] + _pattern(5, 40, 0.3):
        ref = next_state(policy, ref, np.bool_(finite), np)
        owner.advance(_flag(finite))
        assert _numbers(owner.tensors) == _numbers(ref)


@pytest.mark.parametrize("policy", COVERED[:6], ids=repr)
def test_owner_trajectory_after_a_load_equals_the_rule(policy, monkeypatch):
    """A load (any good_steps, counters, scale) runs one step of the rule, then the fused form."""
    ref = LossScaleState(np.float32(policy.initial_scale * 2), np.int32(policy.rule_params().growth_interval - 1),
                         np.int32(0), np.int32(17), np.int32(2))
    owner = _device_path(PrivateLossScale(policy), monkeypatch)
    owner.load(ScaleRecord(policy, LossScaleState(*(torch.as_tensor(np.asarray(v)) for v in ref))))
    for finite in _pattern(11, 200, 0.2):
        ref = next_state(policy, ref, np.bool_(finite), np)
        owner.advance(_flag(finite))
        assert _numbers(owner.tensors) == _numbers(ref)


def test_reciprocal_in_one_op_equals_the_float64_route():
    powers = torch.tensor([2.0**e for e in range(-149, 128)], dtype=torch.float32)
    rng = np.random.default_rng(0)
    randoms = torch.from_numpy(np.concatenate([
        rng.uniform(1, 2, 20000).astype(np.float32) * np.float32(2.0) ** rng.integers(-126, 127, 20000).astype(np.float32),
        np.array([F32_MAX, 1e-45, 1.17549435e-38, 3.0, 0.1, 65504.0], dtype=np.float32),
    ]))
    for scales in (powers, randoms):
        one_op = torch.stack([reciprocal(s) for s in scales[:300]]) if scales is powers else reciprocal(scales)
        via_float64 = scales.double().reciprocal().float()
        assert torch.equal(one_op.view(torch.int32), via_float64.view(torch.int32))


@pytest.mark.parametrize("above_floor", [True, False])
def test_a_flag_summed_over_ranks_counts_as_one_overflow(above_floor):
    """DDP code may all-reduce found-inf flags with SUM (2.0 on two ranks): the rule reads ``found_inf == 0``."""
    policy = DynamicLossScale(8.0, 2, min_loss_scale=2.0)
    form = kernel_form(policy.rule_params())
    ref, live = initial_state(policy, np), initial_state(policy, torch)
    for flag in [2.0, 0.0, 0.0, 3.0, 2.0, 2.0, 0.0, 4.0]:
        ref = next_state(policy, ref, np.bool_(flag == 0.0), np)
        advance_scale_(form, live, torch.tensor(flag), above_floor=above_floor)
        assert _numbers(live) == _numbers(ref)


# ----------------------------------------------------------------------------- AutoLossScale's unsampled step by table


@pytest.mark.parametrize("seed", range(4))
def test_an_unsampled_auto_step_by_table_is_the_core_rule_bit_for_bit(seed):
    """``advance_auto_unsampled_`` against ``next_auto_state`` (numpy, no sample) on random runs of overflows and
    finite steps, from random windows and bounds (measured or not), scales that are or are not powers of two, the
    floor, margins up to the limit, and the flag summed over ranks (2.0)."""
    from lossscale import AutoLossScale
    from lossscale._auto import AutoState, next_auto_state, overflow_grid, overflow_key, overflow_table
    from lossscale._torch._kernels import AUTO_COUNTER_MOVES, AutoTable, advance_auto_unsampled_

    r = random.Random(seed)
    for _ in range(12):
        policy = AutoLossScale(2.0 ** r.randint(2, 40), min_loss_scale=r.choice([2.0**-126, 2.0**-3, 1.0, 3.0]),
                               max_margin_bits=r.randint(4, 16), margin_bits=r.randint(1, 4), window=r.randint(1, 6),
                               start_backoff_bits=r.randint(1, 20))
        filled = r.randint(0, policy.window)
        window = np.full(policy.window, -np.inf, np.float32)
        window[:filled] = [r.uniform(-60, 10) for _ in range(filled)]
        lo = np.float32(np.nan if r.random() < 0.3 else r.randint(-40, 60))
        auto = AutoState(np.float32(r.randint(policy.margin_bits, 40)), window, np.int32(r.randint(0, 90)), lo,
                         np.float32(r.randint(-40, 60)))
        scale = np.float32(max(policy.min_loss_scale, np.ldexp(r.choice([1.0, 1.5, 1.25]), r.randint(-20, 120))))
        state = LossScaleState(scale, *(np.int32(r.randint(0, 50)) for _ in range(2)), np.int32(r.randint(0, 9)),
                               np.int32(r.randint(0, 3)))

        floats = torch.tensor([float(scale), float(auto.margin), 0.0])
        floats[2] = overflow_key(floats[0], floats[1], torch)
        counters = torch.tensor([int(state.good_steps), int(auto.calm_steps), int(state.consecutive_skips),
                                 int(state.skipped_steps)], dtype=torch.int32)
        with np.errstate(all="ignore"):
            rows = overflow_table(policy, AutoState(*(torch.as_tensor(np.asarray(v)) for v in auto)), torch)
        table = AutoTable(floats, counters, rows, torch.tensor(AUTO_COUNTER_MOVES, dtype=torch.int32),
                          overflow_grid(floats, torch))
        for _ in range(20):
            finite = r.random() < 0.6
            with np.errstate(all="ignore"):
                state, auto = next_auto_state(policy, state, auto, np.bool_(finite), None, False, np)
            advance_auto_unsampled_(table, torch.tensor(0.0 if finite else r.choice([1.0, 2.0])))
            assert floats[0].numpy().tobytes() == np.float32(state.loss_scale).tobytes()
            assert float(floats[1]) == float(auto.margin)
            assert counters.tolist() == [int(state.good_steps), int(auto.calm_steps), int(state.consecutive_skips),
                                         int(state.skipped_steps)]
            assert float(floats[2]) == float(overflow_key(np.float32(state.loss_scale), auto.margin, np))
