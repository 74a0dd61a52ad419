"""Property tests (hypothesis) of lossscale.torch: LossScaleOptimizer (fused, foreach and for-loop inner optimizers),
SharedLossScale with two optimizers, and GradScaler driven as torch's. Profiles: tests/properties.py.

Each example draws a policy, a plan of steps (Inf/NaN in a drawn gradient element at drawn steps) and a checkpoint
step, and checks: a skipped step leaves weights and optimizer state bit-identical; the finite steps equal a control
run that never saw the bad steps (bit-identical when every scale is a power of two, so that ``g * S * (1/S) == g``;
otherwise within rtol 1e-5: the unscaled gradients then differ from ``g`` by an ulp); save, load into fresh objects
and continue gives the uninterrupted run's trajectory bit for bit; the scale stays finite, positive, in bounds.
"""

from __future__ import annotations

import copy
import io
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lossscale
import lossscale.torch as lst
from tests import properties as props

SHAPES = [(3,), (2, 2)]
POISON = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
INNER = {
    "fused": lambda ps: torch.optim.AdamW(ps, lr=0.05, fused=True),
    "foreach": lambda ps: torch.optim.Adam(ps, lr=0.05, foreach=True),
    "for-loop": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False),
}


def true_grads(step: int, group: int = 0) -> list[torch.Tensor]:
    rng = np.random.default_rng(1000 * group + step)
    return [torch.from_numpy(rng.normal(size=s).astype(np.float32)) for s in SHAPES]


def set_grads(params, step, entry, scale, group=0) -> None:
    grads = [g * torch.tensor(scale, dtype=torch.float32) for g in true_grads(step, group)]
    if entry is not None:
        kind, which = entry
        flat = grads[which % len(grads)].view(-1)
        flat[which % flat.numel()] = POISON[kind]
    for p, g in zip(params, grads):
        p.grad = g


def exact(policy) -> bool:
    p = policy.rule_params()
    return all(
        float(np.log2(x)).is_integer() for x in (p.initial_scale, p.growth_factor, p.backoff_multiplier, p.backoff_divisor)
    )


def snapshot(params, opt) -> list[torch.Tensor]:
    """Weights and every tensor of the inner optimizer's state, cloned."""
    tensors = [p.detach().clone() for p in params]
    for state in opt.state_dict()["state"].values():
        tensors += [v.clone() for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def assert_same(a, b, bitwise: bool) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if bitwise:
            assert torch.equal(x, y), (x, y)
        else:
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def roundtrip(obj):
    """A state dict through torch.save/torch.load (weights_only, as accelerate and Lightning load them)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def scale_ok(opt, policy) -> None:
    assert props.in_bounds(float(opt.loss_scale), policy), (float(opt.loss_scale), policy)


class Run:
    def __init__(self, policy, kind):
        self.params = [torch.nn.Parameter(torch.ones(s)) for s in SHAPES]
        self.inner = INNER[kind](self.params)
        self.opt = lst.LossScaleOptimizer(self.inner, policy)

    def step(self, i, entry):
        set_grads(self.params, i, entry, float(self.opt.loss_scale))
        self.opt.step()
        self.opt.zero_grad()


def optimizer_property(data, kind) -> None:
    policy = data.draw(props.policies(), label="policy")
    plan = data.draw(props.step_plans(8), label="plan")
    stop = data.draw(st.integers(0, len(plan)), label="checkpoint step")
    run, control, resumed = Run(policy, kind), Run(policy, kind), None
    bitwise = exact(policy)
    for i, entry in enumerate(plan):
        if i == stop:
            saved = roundtrip(run.opt.state_dict())
            resumed = Run(lossscale.FixedLossScale(1), kind)  # the saved policy replaces this one
            with torch.no_grad():
                for p, q in zip(resumed.params, run.params):
                    p.copy_(q)
            resumed.opt.load_state_dict(saved)
            assert resumed.opt.loss_scale_policy == policy
        before = snapshot(run.params, run.inner)
        run.step(i, entry)
        if resumed is not None:
            resumed.step(i, entry)
        scale_ok(run.opt, policy)
        if entry is not None:
            assert bool(run.opt.last_step_skipped)
            assert_same(before, snapshot(run.params, run.inner), bitwise=True)
        else:
            assert not bool(run.opt.last_step_skipped)
            control.step(i, None)
            assert_same(snapshot(run.params, run.inner), snapshot(control.params, control.inner), bitwise)
    if resumed is not None:
        assert_same(snapshot(run.params, run.inner), snapshot(resumed.params, resumed.inner), bitwise=True)
        assert float(run.opt.loss_scale) == float(resumed.opt.loss_scale)
        assert int(run.opt.skipped_steps) == int(resumed.opt.skipped_steps)


@pytest.mark.parametrize("kind", sorted(INNER))
@props.fast(8)
@given(data=st.data())
def test_optimizer_skips_control_and_resume(kind, data):
    optimizer_property(data, kind)


@pytest.mark.parametrize("kind", sorted(INNER))
@props.slow(4)
@given(data=st.data())
def test_optimizer_skips_control_and_resume_slow(kind, data):
    optimizer_property(data, kind)


# ------------------------------------------------------------------ SharedLossScale, two optimizers


class SharedRun:
    def __init__(self, policy):
        self.scale = lst.SharedLossScale(policy)
        self.params = [[torch.nn.Parameter(torch.ones(s)) for s in SHAPES] for _ in range(2)]
        self.inners = [INNER["fused"](self.params[0]), INNER["for-loop"](self.params[1])]
        self.opts = [lst.LossScaleOptimizer(inner, loss_scale=self.scale) for inner in self.inners]

    def step(self, i, entries):
        scale = float(self.scale.loss_scale)
        for group, (params, opt, entry) in enumerate(zip(self.params, self.opts, entries)):
            set_grads(params, i, entry, scale, group)
            opt.step()
            opt.zero_grad()
        self.scale.update()

    def snapshot(self, group):
        return snapshot(self.params[group], self.inners[group])


def shared_property(data) -> None:
    policy = data.draw(props.policies(), label="policy")
    plan = data.draw(st.lists(st.tuples(*[st.none() | st.tuples(st.sampled_from(sorted(POISON)), st.integers(0, 7))]
                                        * 2), min_size=1, max_size=6), label="plan")
    stop = data.draw(st.integers(0, len(plan)), label="checkpoint step")
    run, resumed = SharedRun(policy), None
    # control g: optimizer g alone, stepped only where its gradients were finite
    controls = []
    for group, kind in enumerate(["fused", "for-loop"]):
        params = [torch.nn.Parameter(torch.ones(s)) for s in SHAPES]
        inner = INNER[kind](params)
        controls.append((params, inner, lst.LossScaleOptimizer(inner, policy)))
    bitwise = exact(policy)
    for i, entries in enumerate(plan):
        if i == stop:
            saved = roundtrip({"scale": run.scale.state_dict(), "opts": [o.state_dict() for o in run.opts]})
            resumed = SharedRun(policy)
            with torch.no_grad():
                for ps, qs in zip(resumed.params, run.params):
                    for p, q in zip(ps, qs):
                        p.copy_(q)
            resumed.scale.load_state_dict(saved["scale"])
            for opt, state in zip(resumed.opts, saved["opts"]):
                opt.load_state_dict(state)
        before = [run.snapshot(g) for g in range(2)]
        run.step(i, entries)
        if resumed is not None:
            resumed.step(i, entries)
        assert props.in_bounds(float(run.scale.loss_scale), policy)
        for g in range(2):
            if entries[g] is not None:  # this optimizer skipped: its weights and state unchanged
                assert bool(run.opts[g].last_step_skipped)
                assert_same(before[g], run.snapshot(g), bitwise=True)
            else:
                params, inner, opt = controls[g]
                set_grads(params, i, None, float(opt.loss_scale), g)
                opt.step()
                opt.zero_grad()
                assert_same(run.snapshot(g), snapshot(params, inner), bitwise)
    if resumed is not None:
        for g in range(2):
            assert_same(run.snapshot(g), resumed.snapshot(g), bitwise=True)
        assert float(run.scale.loss_scale) == float(resumed.scale.loss_scale)


@props.fast(10)
@given(st.data())
def test_shared_scale_two_optimizers(data):
    shared_property(data)


@props.slow(5)
@given(st.data())
def test_shared_scale_two_optimizers_slow(data):
    shared_property(data)


# ------------------------------------------------------------------ GradScaler, driven as torch's


def scaler_policies():
    return st.builds(
        lambda init, period, growth, backoff, top: lst.GradScaler(
            "cpu", init_scale=2.0**init, growth_interval=period, growth_factor=growth, backoff_factor=backoff,
            **({} if top is None else {"max_loss_scale": 2.0 ** (init + top)})
        ),
        st.integers(0, 20), st.integers(1, 4), st.sampled_from([2.0, 4.0]), st.sampled_from([0.5, 0.25]),
        st.none() | st.integers(0, 4),
    )


def gradscaler_property(data) -> None:
    make = data.draw(st.sampled_from(["a", "b"]).flatmap(lambda _: scaler_policies()), label="scaler")
    config = make.state_dict()
    plan = data.draw(props.step_plans(8), label="plan")
    stop = data.draw(st.integers(0, len(plan)), label="checkpoint step")

    def fresh():
        scaler = lst.GradScaler("cpu")
        scaler.load_state_dict(copy.deepcopy(config))
        scaler.scale(torch.zeros(()))  # the gradients below are set as a scaled loss's would be
        params = [torch.nn.Parameter(torch.ones(s)) for s in SHAPES]
        return scaler, params, INNER["foreach"](params)

    run, control, resumed = fresh(), fresh(), None

    def step(r, i, entry):
        scaler, params, opt = r
        set_grads(params, i, entry, scaler.get_scale())
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    for i, entry in enumerate(plan):
        if i == stop:
            resumed = fresh()
            resumed[0].load_state_dict(roundtrip(run[0].state_dict()))
            resumed[2].load_state_dict(roundtrip(run[2].state_dict()))
            with torch.no_grad():
                for p, q in zip(resumed[1], run[1]):
                    p.copy_(q)
        before = snapshot(run[1], run[2])
        step(run, i, entry)
        if resumed is not None:
            step(resumed, i, entry)
        scale = run[0].get_scale()
        top = run[0].state_dict()["lossscale"]["policy"]["config"].get("max_loss_scale", math.inf)
        assert math.isfinite(scale) and 1.0 <= scale <= top
        if entry is not None:
            assert_same(before, snapshot(run[1], run[2]), bitwise=True)
        else:
            step(control, i, None)
            assert_same(snapshot(run[1], run[2]), snapshot(control[1], control[2]), bitwise=True)
    if resumed is not None:
        assert_same(snapshot(run[1], run[2]), snapshot(resumed[1], resumed[2]), bitwise=True)
        assert run[0].state_dict() == resumed[0].state_dict()


@props.fast(10)
@given(st.data())
def test_gradscaler_skips_control_and_resume(data):
    gradscaler_property(data)


@props.slow(5)
@given(st.data())
def test_gradscaler_skips_control_and_resume_slow(data):
    gradscaler_property(data)
