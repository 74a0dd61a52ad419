"""torch's gradient statistics and StatsSampler against the numpy core."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import lossscale
from lossscale._auto import initial_auto_state, next_auto_state
from lossscale._sampler import check_stats_every
from lossscale._stats import gradient_stats as numpy_stats
from lossscale._torch._kernels import gradient_stats
from lossscale.torch._state import PrivateLossScale, count_sampler
from lossscale.torch._stats import StatsSampler
from tests.torch.op_counter import count_ops


def tensors():
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(64, 32, generator=g) * 2.0**-18).half().float()  # autocast-style: float16 values in float32
    a[0, :5] = 0
    return [
        a,
        torch.tensor([0.0, 2.0**-20, -(2.0**-14), 3.0]),
        torch.zeros(0),
        torch.tensor([float("inf"), 1.0]),
        (torch.randn(7, generator=g) * 100).half(),
    ]


def test_equal_to_the_numpy_core():
    grads = tensors()
    got = gradient_stats(grads, step=3)
    ref = numpy_stats([g.numpy() for g in grads], np, step=3)
    for name in ref._fields:
        np.testing.assert_allclose(
            np.asarray(getattr(got, name), np.float64), np.asarray(getattr(ref, name), np.float64),
            rtol=1e-5, err_msg=name,
        )
    assert math.isinf(float(got.amax)) and float(got.tensor_zero_fraction[1]) == 0.25


def test_does_not_touch_the_gradients():
    grads = tensors()
    copies = [g.clone() for g in grads]
    gradient_stats(grads)
    for g, c in zip(grads, copies):
        assert torch.equal(g, c)


def test_stats_every_is_validated():
    assert check_stats_every(None, lossscale.DynamicLossScale()) is None
    assert check_stats_every(None, lossscale.AutoLossScale()) == 16
    with pytest.raises(TypeError, match="stats_every must be an int"):
        check_stats_every("4", lossscale.DynamicLossScale())
    with pytest.raises(ValueError, match="at least 1"):
        check_stats_every(0, lossscale.DynamicLossScale())
    assert check_stats_every(2**31 - 1, lossscale.DynamicLossScale()) == 2**31 - 1
    with pytest.raises(ValueError, match=r"stats_every must be at most 2\*\*31 - 1 \(the step counter is int32\)"):
        check_stats_every(2**40, lossscale.DynamicLossScale())


def test_stats_stay_on_the_gradients_device():
    # "meta" stands for an accelerator here: torch refuses to mix it with CPU tensors, as it refuses CUDA.
    grads = [torch.ones(3, device="meta"), torch.ones(2, 2, device="meta")]
    got = gradient_stats(grads, 5)
    assert {t.device.type for t in got} == {"meta"}
    assert got.tensor_zero_fraction.shape == (2,)


def test_sampler_runs_the_core_auto_rule():
    policy = lossscale.AutoLossScale(1.0)
    sampler = StatsSampler(2, policy)
    owner = PrivateLossScale(policy)
    live = owner.state
    ref, ref_auto = lossscale.initial_state(policy, np), initial_auto_state(policy, np)
    g = torch.Generator().manual_seed(1)
    true = [torch.randn(256, generator=g) * 2.0**-20, torch.randn(16, generator=g) * 2.0**-8]
    for i in range(6):
        scale = float(live.loss_scale)
        grads = [(t * scale).half().float() for t in true]
        if i == 4:
            grads[1][0] = float("inf")
        if sampler.due:
            sampler.measure(0, [("w", None, grads[0]), ("b", None, grads[1])], str)
        found_inf = torch.tensor(float(not all(torch.isfinite(x).all() for x in grads)))
        owner.advance(found_inf, sampler)
        with np.errstate(all="ignore"):
            ref, ref_auto = next_auto_state(
                policy, ref, ref_auto, np.bool_(float(found_inf) == 0),
                numpy_stats([x.numpy() for x in grads], np, i), np.bool_(i % 2 == 0), np,
            )
        assert float(live.loss_scale) == float(ref.loss_scale), i
        assert int(live.skipped_steps) == int(ref.skipped_steps)
    assert float(live.loss_scale) > 1.0 and int(live.skipped_steps) == 1
    assert sampler.gradient_stats["per_tensor"]["names"] == ("w", "b")
    assert int(sampler.gradient_stats["step"]) == 4


def test_sampler_checkpoint_round_trip():
    policy = lossscale.AutoLossScale(2.0**4, window=4)
    a = StatsSampler(1, policy)
    a.measure(0, [(0, None, torch.full((8,), 2.0**-3))], str)
    PrivateLossScale(policy).advance(torch.tensor(0.0), a)
    b = StatsSampler(1, policy).restored(a.state_dict(), policy)
    assert b.state.count == 1 and all(torch.equal(x, y) for x, y in zip(a.state.auto, b.state.auto))
    with pytest.raises(ValueError, match="window"):
        StatsSampler(1, policy).restored(a.state_dict(), lossscale.AutoLossScale(window=8))
    with pytest.raises(ValueError, match="no AutoLossScale state"):
        StatsSampler(1, policy).restored({"iteration": 3}, policy)


# ----------------------------------------------------------------------------- LossScaleOptimizer(stats_every=N)

import lossscale.torch as lst
from tests.torch.sync_counter import count_syncs


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))


def _backward(opt, model, scale_of_loss=1e-6):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(torch.randn(32, 16, generator=torch.Generator().manual_seed(opt_calls(opt))))
    opt.get_scaled_loss((out.float() ** 2).mean() * scale_of_loss).backward()


def opt_calls(opt, _count={}):  # noqa: B006 - a per-optimizer batch counter
    _count[id(opt)] = _count.get(id(opt), 0) + 1
    return _count[id(opt)]


def test_optimizer_samples_every_n_steps_on_the_scaled_gradients():
    model = _model()
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), stats_every=2)
    assert opt.gradient_stats is None
    for step in range(3):
        _backward(opt, model)
        scaled = [p.grad.clone() for p in model.parameters()]
        opt.step()
        if step % 2 == 0:
            ref = numpy_stats([g.numpy() for g in scaled], np, step)
            got = opt.gradient_stats
            assert int(got["step"]) == step
            np.testing.assert_allclose(float(got["amax"]), float(ref.amax), rtol=1e-6)
            np.testing.assert_allclose(np.asarray(got["per_tensor"]["rms"]), ref.tensor_rms, rtol=1e-5)
    assert int(opt.gradient_stats["step"]) == 2
    assert opt.gradient_stats["per_tensor"]["names"][0] == "param_groups[0]['params'][0]"


def test_unscale_before_step_still_measures_scaled_values():
    model = _model()
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), stats_every=1)
    _backward(opt, model)
    scaled = [p.grad.clone() for p in model.parameters()]
    opt.unscale_()
    opt.step()
    ref = numpy_stats([g.numpy() for g in scaled], np)
    np.testing.assert_allclose(float(opt.gradient_stats["amax"]), float(ref.amax), rtol=1e-6)


def test_no_host_sync_added_on_unsampled_or_sampled_steps():
    def run(**kwargs):
        model = _model()
        opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), **kwargs)
        _backward(opt, model)
        opt.step()  # the first step creates state
        _backward(opt, model)
        return count_syncs(opt.step)

    plain = run()
    assert run(stats_every=1000) == plain  # unsampled step
    assert run(stats_every=1) == plain  # sampled step: the statistics stay tensors
    assert run(loss_scale="auto") == plain  # and the auto rule too


def test_auto_in_the_optimizer_follows_the_core_rule():
    model = _model()
    policy = lossscale.AutoLossScale(1.0)
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), policy, stats_every=1)
    ref, ref_auto = lossscale.initial_state(policy, np), initial_auto_state(policy, np)
    for step in range(4):
        _backward(opt, model)
        scaled = [p.grad.clone() for p in model.parameters()]
        if step == 2:
            next(iter(model.parameters())).grad[0, 0] = float("nan")
            scaled[0][0, 0] = float("nan")
        opt.step()
        finite = np.bool_(all(torch.isfinite(g).all() for g in scaled))
        with np.errstate(all="ignore"):
            ref, ref_auto = next_auto_state(
                policy, ref, ref_auto, finite, numpy_stats([g.numpy() for g in scaled], np, step), True, np
            )
        assert float(opt.loss_scale) == float(ref.loss_scale), step
    assert int(opt.skipped_steps) == 1 and float(opt.loss_scale) > 1.0


def test_auto_checkpoint_resumes_exactly():
    def make():
        model = _model()
        return model, lst.LossScaleOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), "auto")

    model_a, a = make()
    for _ in range(3):
        _backward(a, model_a)
        a.step()
    saved = a.state_dict()
    model_b, b = make()
    model_b.load_state_dict(model_a.state_dict())
    b.load_state_dict(saved)
    assert b._sampler.state.count == 3
    assert all(torch.equal(x, y) for x, y in zip(a._sampler.state.auto, b._sampler.state.auto))
    for _ in range(3):
        batch = opt_calls(a)
        for model, opt in ((model_a, a), (model_b, b)):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(torch.randn(32, 16, generator=torch.Generator().manual_seed(batch)))
            opt.get_scaled_loss((out.float() ** 2).mean() * 1e-6).backward()
            opt.step()
        assert float(a.loss_scale) == float(b.loss_scale)


def test_a_dynamic_checkpoint_loaded_into_auto_follows_the_dynamic_rule():
    # The checkpoint's policy replaces the optimizer's; the statistics must not keep driving the old auto rule.
    model = _model()
    source = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), "dynamic")
    target = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), "auto")
    target.load_state_dict(source.state_dict())
    assert isinstance(target.loss_scale_policy, lossscale.DynamicLossScale)
    assert not isinstance(target._sampler.policy, lossscale.AutoLossScale) and target._sampler.every == 16
    for _ in range(3):
        _backward(target, model)
        target.step()
    assert float(target.loss_scale) == 2.0**15 and int(target.skipped_steps) == 0
    assert int(target.gradient_stats["step"]) == 0 and target._sampler.state.count == 3


def test_auto_refuses_a_shared_scale_at_construction_and_at_load():
    with pytest.raises(ValueError, match="shared by several optimizers .SharedLossScale. is not supported"):
        lst.SharedLossScale("auto")
    model = _model()
    own = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "auto")
    _backward(own, model)
    own.step()
    shared = lst.SharedLossScale(dynamic=True, initial_scale=8.0)
    member = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), shared)
    for target in (shared, member):
        with pytest.raises(ValueError, match="SharedLossScale"):
            target.load_state_dict(own.state_dict()["lossscale"] if target is shared else own.state_dict())
        assert type(shared.policy) is lossscale.DynamicLossScale and float(shared.loss_scale) == 8.0


def test_gradscaler_samples_the_scaled_gradients_without_syncs():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = lst.GradScaler("cpu", stats_every=2)
    plain = lst.GradScaler("cpu")

    def iteration(s):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(torch.randn(8, 16, generator=torch.Generator().manual_seed(0)))
        s.scale((out.float() ** 2).mean()).backward()
        scaled = [p.grad.clone() for p in model.parameters()]
        syncs = count_syncs(lambda: (s.step(opt), s.update()))
        return scaled, syncs

    _, base = iteration(plain)
    _, base = iteration(plain)
    for i in range(3):
        scaled, syncs = iteration(scaler)
        assert syncs == base
        if i % 2 == 0:
            ref = numpy_stats([g.numpy() for g in scaled], np)
            np.testing.assert_allclose(float(scaler.gradient_stats["amax"]), float(ref.amax), rtol=1e-6)
            assert int(scaler.gradient_stats["step"]) == i


def test_history_gets_the_stats_columns_on_sampled_steps():
    model = _model()
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), stats_every=2, history=True)
    for _ in range(4):
        _backward(opt, model)
        opt.step()
    h = opt.history
    assert len(h) == 4 and h.has_stats
    zeros = h.stat("zero_fraction")
    assert np.isfinite(zeros[[0, 2]]).all() and np.isnan(zeros[[1, 3]]).all()
    assert float(h.stat("headroom_bits")[2]) == pytest.approx(float(opt.gradient_stats["headroom_bits"]))


def test_a_nan_gradient_has_nan_headroom_not_infinite():
    got = gradient_stats([torch.tensor([1.0, float("nan")]), torch.tensor([0.5], dtype=torch.float16)])
    assert math.isnan(float(got.headroom_bits)) and math.isnan(float(got.tensor_headroom_bits[0]))
    assert float(got.tensor_headroom_bits[1]) == pytest.approx(math.log2(65504 / 0.5))


def test_nan_and_inf_count_as_neither_zero_nor_subnormal_as_in_the_core():
    """The torch kernel's counts equal the numpy core's with NaN and Inf present (they were NaN before)."""
    g = [torch.tensor([0.0, float("nan"), 1e-6, 1.0, float("inf"), -0.0, 2.0**-130, 2.0**-14, float("-inf")])]
    got, ref = gradient_stats(g), numpy_stats([t.numpy() for t in g], np)
    for field in ("zero_fraction", "subnormal_fraction", "tensor_zero_fraction", "tensor_subnormal_fraction"):
        np.testing.assert_array_equal(getattr(got, field).numpy(), getattr(ref, field), err_msg=field)
    assert float(got.zero_fraction) == pytest.approx(2 / 9) and float(got.subnormal_fraction) == pytest.approx(2 / 9)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def awkward(device):
    """Every kind of gradient the sample meets, in an order that interleaves the multi-tensor runs and the rest."""
    g = torch.Generator().manual_seed(3)
    nan, inf = float("nan"), float("inf")
    dense = (torch.randn(40, 8, generator=g) * 2.0**-16).half().float()
    dense[0, :6] = 0
    dense[1, 0] = nan
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 3, 3]]), torch.tensor([2.0**-20, 1.0, 0.5]), (6,))
    out = [
        dense,
        torch.tensor([0.0, nan, 1e-6, 1.0, inf, -0.0, 2.0**-130, 2.0**-14, -inf]),
        (torch.randn(33, generator=g) * 1e-5).half(),
        torch.tensor([0.0, 2.0**-24, 3.0, nan, 6e4], dtype=torch.float16),  # 6e4 * 2**14: -inf in float16
        torch.zeros(0),
        sparse,
        torch.tensor([2.0**-20, 0.0, 7.0], dtype=torch.float64),
        (torch.randn(5, generator=g) * 1e-3).bfloat16(),
        torch.tensor([[1e-7, 0.0], [4.0, -2.0]]),
    ]
    return [t.to(device) for t in out]


def numpy_columns(grads, factor=1.0):
    from lossscale._stats import tensor_sums as numpy_sums

    rows = []
    for t in grads:
        a = (t.to_dense() if t.layout == torch.sparse_coo else t).detach().cpu().double().numpy().astype(np.float32)
        a = a.reshape(-1) * np.float32(factor)
        rows.append([float(v) for v in numpy_sums(a, np)] if a.size else [0.0, 0.0, 0.0, 0.0])
    return np.asarray(rows, np.float64).T


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk", [2**23, 40])  # 40: every multi-tensor run is cut into several chunks
@pytest.mark.parametrize("factor", [None, 8.0])
@pytest.mark.parametrize("multi_tensor", [True, None])  # None: the device's default (one by one on the CPU)
def test_sample_columns_equal_the_numpy_core_on_every_kind_of_gradient(device, chunk, factor, multi_tensor,
                                                                       monkeypatch):
    """NaN, Inf, -0, subnormals of both types, float16/bfloat16/float64, sparse, empty; chunked or not; with a
    ``factor`` (half types then go one by one, in float32). Each column equals the core's ``tensor_sums``."""
    from lossscale._torch import _kernels as _torch_kernels

    monkeypatch.setattr(_torch_kernels, "CHUNK_ELEMENTS", chunk)
    grads = awkward(device)
    copies = [t.clone() for t in grads]
    scale = None if factor is None else torch.tensor(factor, device=device)
    got = _torch_kernels.sample_columns(grads, scale, multi_tensor)
    assert all(c.dtype == torch.float32 and c.shape == (len(grads),) and c.device.type == device for c in got)
    ref = numpy_columns(grads, 1.0 if factor is None else factor)
    for k, name in enumerate(("amax", "zeros", "subnormals", "sumsq")):
        np.testing.assert_allclose(got[k].cpu().double().numpy(), ref[k], rtol=2e-6, err_msg=name)
    for t, c in zip(grads, copies):  # the caller's gradients are not touched
        dense, copy = (t.to_dense(), c.to_dense()) if t.is_sparse else (t, c)
        assert torch.allclose(dense, copy, rtol=0, atol=0, equal_nan=True)


def test_the_sample_launches_the_same_ops_for_5_or_200_tensors():
    """The dense gradients go through multi-tensor kernels (a GPU's default; forced here on the CPU): the ops
    dispatched do not grow with their number (one by one they were about 9 per tensor: on a GPU, 1,500 launches
    for 100 tensors). 11 operators that launch kernels (16 before the counts were marked by ceil and sign)."""
    from lossscale._torch._kernels import sample_columns

    def ops(n):
        grads = [torch.randn(10) for _ in range(n)]
        return count_ops(lambda: sample_columns(grads, multi_tensor=True), views=False)

    assert ops(200) == ops(5) <= 11


def test_a_step_that_reads_no_sample_leaves_its_summary_to_the_first_read():
    """Without ``auto`` or a History nothing in the step reads the sample: ``advance`` keeps the four columns and
    dispatches nothing (it ran about 25 operators of summary, half of a sampled step's kernels on a GPU). The first
    read summarizes the latest sample, tagged with the step it was taken at."""
    sampler = StatsSampler(1, lossscale.get("dynamic"))
    steps = [[torch.tensor([0.0, 1.0, -4.0]), torch.full((2, 2), 2.0**-20)],
             [torch.tensor([0.0, 0.0, 8.0]), torch.full((2, 2), 2.0**-3)]]
    for grads in steps:
        sampler.measure(0, [((0, i), None, g) for i, g in enumerate(grads)], str)
        assert count_ops(lambda: count_sampler(sampler)) == 0
    got, ref = sampler.gradient_stats, numpy_stats([g.numpy() for g in steps[-1]], np)
    assert int(got["step"]) == 1 and sampler.state.count == 2
    for field in ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms_min"):
        np.testing.assert_allclose(float(got[field]), float(getattr(ref, field)), rtol=1e-6, err_msg=field)
    assert count_ops(lambda: sampler.gradient_stats) == 0  # summarized once


def test_an_unsampled_auto_step_runs_only_the_backoff():
    """A step known on the host to be unsampled gives the core's auto rule no statistics: it computes the overflow
    backoff and the counters, 82 operators where the masked sample's path runs 176 (109 and 200 before the scale's
    exponent came from ``frexp`` and the bounds from ``clip``). The torch binding looks that backoff up instead (tests/torch/test_kernel_form.py);
    this is the rule it falls back to."""
    from lossscale._advance import advance
    from lossscale._sampler import initial_sampler_state
    from lossscale._torch._kernels import gradient_stats

    policy = lossscale.AutoLossScale()
    state, sampler = lossscale.initial_state(policy, torch), initial_sampler_state(policy, 1, torch)
    finite, sample = torch.tensor(True), gradient_stats([torch.full((4,), 2.0**-3)])
    unsampled = count_ops(lambda: advance(policy, state, finite, torch, sampler=sampler, sample=None, sampled=False))
    sampled = count_ops(lambda: advance(policy, state, finite, torch, sampler=sampler, sample=sample, sampled=True))
    assert unsampled <= 82, unsampled
    assert sampled - unsampled >= 80, (sampled, unsampled)


def test_fractions_over_several_optimizers_count_each_element_once():
    """Two optimizers' samples are one: the fractions divide by the elements of both, an empty gradient adding none
    (the per-set sizes once gave each set's total a floor of 1, so a set of empty tensors counted one element)."""
    sampler = StatsSampler(1, lossscale.get("dynamic"))
    first, second = torch.zeros(0), torch.tensor([0.0, 1.0, 0.0, 2.0**-20])
    sampler.measure(0, [("a", None, first)], str)
    sampler.measure(1, [("b", None, second)], str)
    count_sampler(sampler)
    ref = numpy_stats([first.numpy(), second.numpy()], np)
    for field in ("zero_fraction", "subnormal_fraction", "tensor_zero_fraction", "tensor_subnormal_fraction"):
        np.testing.assert_array_equal(getattr(sampler._summarized().sample, field).numpy(), getattr(ref, field),
                                      err_msg=field)
    assert float(sampler._summarized().sample.zero_fraction) == 0.5
