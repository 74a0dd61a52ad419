"""torch's stats_every through the core sampler: every entry point, every gradient kind, GradScaler with two optimizers.

Each sample is compared with the numpy core (``lossscale._stats.gradient_stats``) on ``.numpy()`` copies of the
scaled gradients; each ``AutoLossScale`` scale with the core rule run in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lossscale
import lossscale.torch as lst
from lossscale._auto import initial_auto_state, next_auto_state
from lossscale._stats import gradient_stats as numpy_stats
from tests.torch.sync_counter import count_syncs

FIELDS = ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms_min")
PER_TENSOR = ("amax", "headroom_bits", "zero_fraction", "subnormal_fraction", "rms")


def dense(g: torch.Tensor) -> np.ndarray:
    """A gradient as numpy: a sparse one coalesced (duplicates summed) and densified, bfloat16 widened exactly."""
    g = g.detach()
    if g.layout == torch.sparse_coo:
        g = g.coalesce().to_dense()
    return (g.float() if g.dtype == torch.bfloat16 else g).numpy().copy()


def assert_sample(got, scaled, step=None, names=None):
    """``got`` (a ``gradient_stats`` mapping) equals the numpy core's sample of the ``scaled`` gradients."""
    assert got is not None, "no sample was taken"
    ref = numpy_stats([dense(g) if isinstance(g, torch.Tensor) else g for g in scaled], np)
    for name in FIELDS:
        np.testing.assert_allclose(float(got[name]), float(getattr(ref, name)), rtol=1e-5, err_msg=name)
    for name in PER_TENSOR:
        np.testing.assert_allclose(np.asarray(got["per_tensor"][name]), getattr(ref, "tensor_" + name), rtol=1e-5,
                                   err_msg=name)
    if step is not None:
        assert int(got["step"]) == step
    if names is not None:
        assert got["per_tensor"]["names"] == tuple(names)


def auto_scale_after(policy, scaled, finite=True, micro_batches=1):
    """The scale after one step from the policy's initial state, by the core rule in numpy."""
    kwargs = {} if micro_batches == 1 else {"micro_batches": micro_batches}
    with np.errstate(all="ignore"):
        state, _ = next_auto_state(policy, lossscale.initial_state(policy, np), initial_auto_state(policy, np),
                                   np.bool_(finite), numpy_stats([dense(g) for g in scaled], np), True, np, **kwargs)
    return float(state.loss_scale)


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _loss(model, seed=1, scale=1e-4):
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed))
    return (model(x) ** 2).mean() * scale


# ----------------------------------------------------------------------------- every entry point, with auto

POLICY = lossscale.AutoLossScale(2.0**10)


def _auto_opt(model, inner=torch.optim.SGD, **kwargs):
    return lst.LossScaleOptimizer(inner(model.parameters(), lr=0.0), POLICY, stats_every=1, **kwargs)


def _backward(opt, model):
    opt.zero_grad()
    opt.get_scaled_loss(_loss(model)).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("entry", ["step", "unscale_", "clip_grad_norm_"])
def test_step_unscale_and_clip_measure_the_scaled_gradients_and_set_the_auto_scale(entry):
    model = _model()
    opt = _auto_opt(model)
    scaled = _backward(opt, model)
    if entry != "step":
        getattr(opt, entry)(*([1e9] if entry == "clip_grad_norm_" else []))
    opt.step()
    assert_sample(opt.gradient_stats, scaled, step=0)
    expected = auto_scale_after(POLICY, scaled)
    assert float(opt.loss_scale) == expected != 2.0**10  # the auto rule moved it


def test_step_with_a_closure_measures_the_first_evaluation_and_sets_the_auto_scale():
    model = _model()
    opt = _auto_opt(model, inner=lambda p, lr: torch.optim.LBFGS(p, lr=1e-3, max_iter=3))
    evaluations = []

    def closure():
        opt.zero_grad()
        loss = _loss(model)
        opt.get_scaled_loss(loss).backward()
        evaluations.append([p.grad.clone() for p in model.parameters()])
        return loss

    opt.step(closure)
    assert len(evaluations) > 1  # LBFGS evaluated again: the sample is still the first evaluation's
    assert_sample(opt.gradient_stats, evaluations[0], step=0)
    assert float(opt.loss_scale) == auto_scale_after(POLICY, evaluations[0]) != 2.0**10
    assert opt._sampler.state.count == 1


def test_apply_gradients_measures_the_given_gradients_times_the_scale_and_sets_the_auto_scale():
    model = _model()
    opt = _auto_opt(model)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(3)
    unscaled = [torch.randn(p.shape, generator=g) * 2.0**-20 for p in params]
    unscaled[1][0] = 0.0
    scaled = [u * 2.0**10 for u in unscaled]  # exact: a power of two
    applied = opt.apply_gradients(list(zip(unscaled, params)))
    assert bool(applied)
    assert_sample(opt.gradient_stats, scaled, step=0, names=[f"param_groups[0]['params'][{i}]" for i in range(4)])
    assert float(opt.loss_scale) == auto_scale_after(POLICY, scaled) != 2.0**10


def test_minimize_measures_the_scaled_gradients_and_sets_the_auto_scale():
    model = _model()
    twin = _model()
    opt = _auto_opt(model)
    scaled = torch.autograd.grad(_loss(twin) * 2.0**10, list(twin.parameters()))  # the same backward, scaled
    opt.minimize(lambda: _loss(model))
    assert_sample(opt.gradient_stats, scaled, step=0)
    assert float(opt.loss_scale) == auto_scale_after(POLICY, scaled) != 2.0**10


def test_accumulated_backward_passes_are_the_auto_rules_micro_batches():
    model = _model()
    opt = _auto_opt(model)
    opt.zero_grad()
    for seed in (1, 2, 3):  # three micro-batches summed into .grad
        opt.get_scaled_loss(_loss(model, seed, scale=1e-5)).backward()
    scaled = [p.grad.clone() for p in model.parameters()]
    opt.step()
    three, one = auto_scale_after(POLICY, scaled, micro_batches=3), auto_scale_after(POLICY, scaled)
    assert three != one  # the count matters here
    assert float(opt.loss_scale) == three
    # zero_grad() starts the count again: one backward is one micro-batch
    scaled = _backward(opt, model)
    assert opt._sampler.backwards == 1


def test_the_accumulation_count_restarts_at_zero_grad_and_at_each_step():
    model = _model()
    opt = _auto_opt(model)
    opt.get_scaled_loss(_loss(model))  # discarded by zero_grad
    opt.zero_grad()
    assert opt._sampler.backwards == 0
    opt.get_scaled_loss(_loss(model)).backward()
    opt.step()
    assert opt._sampler.backwards == 0


# ----------------------------------------------------------------------------- gradient kinds


def _sparse_model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"emb": torch.nn.Embedding(10, 4, sparse=True), "out": torch.nn.Linear(4, 1)})


def _sparse_loss(model):
    idx = torch.tensor([1, 3, 3, 7, 1, 1])  # duplicates: their rows sum
    return model["out"](model["emb"](idx)).pow(2).mean() * 1e-3


def test_sparse_gradients_count_as_their_dense_form_in_the_optimizer():
    model = _sparse_model()
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), stats_every=1)
    opt.zero_grad()
    opt.get_scaled_loss(_sparse_loss(model)).backward()
    assert model["emb"].weight.grad.layout == torch.sparse_coo and not model["emb"].weight.grad.is_coalesced()
    scaled = [p.grad.clone() for p in model.parameters()]
    opt.step()
    assert_sample(opt.gradient_stats, scaled, step=0)
    assert float(opt.gradient_stats["per_tensor"]["zero_fraction"][0]) == pytest.approx(28 / 40)  # 7 of 10 rows unused


def test_sparse_gradients_count_as_their_dense_form_in_gradscaler():
    model = _sparse_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = lst.GradScaler("cpu", init_scale=2.0**8, stats_every=1)
    opt.zero_grad()
    scaler.scale(_sparse_loss(model)).backward()
    scaled = [p.grad.clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    assert_sample(scaler.gradient_stats, scaled, step=0)


def test_bfloat16_gradients():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3).to(torch.bfloat16)
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), stats_every=1)
    x = torch.randn(4, 6, dtype=torch.bfloat16)
    opt.get_scaled_loss(model(x).float().pow(2).mean() * 1e-6).backward()
    scaled = [p.grad.clone() for p in model.parameters()]
    assert scaled[0].dtype == torch.bfloat16
    opt.step()
    assert_sample(opt.gradient_stats, scaled, step=0)


def test_float32_gradients_under_autocast():
    model = _model()
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), stats_every=1)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(torch.randn(8, 6, generator=torch.Generator().manual_seed(0)))
    opt.get_scaled_loss(out.float().pow(2).mean() * 1e-9).backward()
    scaled = [p.grad.clone() for p in model.parameters()]
    assert all(g.dtype == torch.float32 for g in scaled)
    opt.step()
    assert_sample(opt.gradient_stats, scaled, step=0)
    assert float(opt.gradient_stats["zero_fraction"]) > 0  # float16's flushed values, seen in float32


def test_none_and_empty_gradients():
    used, unused, empty = (torch.nn.Parameter(torch.tensor([1.0, 0.0, 2.0**-10])), torch.nn.Parameter(torch.ones(2)),
                           torch.nn.Parameter(torch.ones(0)))
    opt = lst.LossScaleOptimizer(torch.optim.SGD([used, unused, empty], lr=0.1), stats_every=1)
    opt.get_scaled_loss((used**2).sum() + empty.sum()).backward()
    assert unused.grad is None and empty.grad.shape == (0,)
    scaled = [used.grad.clone(), empty.grad.clone()]
    opt.step()
    assert_sample(opt.gradient_stats, scaled, step=0,
                  names=["param_groups[0]['params'][0]", "param_groups[0]['params'][2]"])
    assert float(opt.gradient_stats["per_tensor"]["zero_fraction"][1]) == 0.0


# ----------------------------------------------------------------------------- GradScaler


def _two_optimizers():
    a, b = _model(0), _model(1)
    return a, b, torch.optim.SGD(a.parameters(), lr=0.0), torch.optim.SGD(b.parameters(), lr=0.0)


def _scaler_iteration(scaler, a, b, opt_a, opt_b, order):
    for opt in (opt_a, opt_b):
        opt.zero_grad()
    scaler.scale(_loss(a, scale=1.0) + _loss(b, scale=1e-4)).backward()  # a's gradients 1e4 times b's
    scaled = {"a": [p.grad.clone() for p in a.parameters()], "b": [p.grad.clone() for p in b.parameters()]}
    for name in order:
        scaler.step({"a": opt_a, "b": opt_b}[name])
    scaler.update()
    return scaled


def test_gradscaler_samples_every_optimizer_stepped_whatever_the_order():
    samples = {}
    for order in ("ab", "ba"):
        a, b, opt_a, opt_b = _two_optimizers()
        scaler = lst.GradScaler("cpu", init_scale=2.0**4, stats_every=1)
        scaled = _scaler_iteration(scaler, a, b, opt_a, opt_b, order)
        got = scaler.gradient_stats
        first, second = (scaled["a"], scaled["b"]) if order == "ab" else (scaled["b"], scaled["a"])
        names = [f"opt{k}.param_groups[0]['params'][{i}]" for k in (0, 1) for i in range(4)]
        assert_sample(got, first + second, step=0, names=names)
        samples[order] = got
    for name in FIELDS:  # the overall values do not depend on the order of the step calls
        assert float(samples["ab"][name]) == float(samples["ba"][name]), name


def test_gradscaler_unscaled_but_not_stepped_optimizers_are_in_the_sample():
    a, b, opt_a, opt_b = _two_optimizers()
    scaler = lst.GradScaler("cpu", init_scale=2.0**4, stats_every=1)
    opt_a.zero_grad(), opt_b.zero_grad()
    scaler.scale(_loss(a) + _loss(b)).backward()
    scaled = [p.grad.clone() for p in a.parameters()] + [p.grad.clone() for p in b.parameters()]
    scaler.unscale_(opt_a)
    scaler.unscale_(opt_b)
    scaler.step(opt_a)
    scaler.update()
    assert_sample(scaler.gradient_stats, scaled, step=0)


def test_gradscaler_history_gets_the_stats_columns():
    a, b, opt_a, opt_b = _two_optimizers()
    scaler = lst.GradScaler("cpu", init_scale=2.0**4, stats_every=2, history=True)
    seen = []
    for _ in range(4):
        scaled = _scaler_iteration(scaler, a, b, opt_a, opt_b, "ab")
        seen.append(numpy_stats([g.numpy() for g in scaled["a"] + scaled["b"]], np))
    h = scaler.history
    assert len(h) == 4 and h.has_stats
    for column in ("headroom_bits", "zero_fraction", "subnormal_fraction"):
        values = h.stat(column)
        assert np.isnan(values[[1, 3]]).all(), column
        np.testing.assert_allclose(values[[0, 2]], [float(getattr(s, column)) for s in seen[0::2]], rtol=1e-5)


def test_gradscaler_stats_add_no_host_sync():
    def run(**kwargs):
        a, b, opt_a, opt_b = _two_optimizers()
        scaler = lst.GradScaler("cpu", **kwargs)
        _scaler_iteration(scaler, a, b, opt_a, opt_b, "ab")
        return count_syncs(lambda: _scaler_iteration(scaler, a, b, opt_a, opt_b, "ab"))

    plain = run()
    assert run(stats_every=1) == plain and run(stats_every=5) == plain


# ----------------------------------------------------------------------------- checkpoints


def test_an_auto_checkpoint_is_refused_by_a_shared_scale_member_and_nothing_changes():
    model = _model()
    source = _auto_opt(model, inner=torch.optim.Adam)
    _backward(source, model)
    source.step()
    saved = source.state_dict()
    shared = lst.SharedLossScale(initial_scale=2.0**5)
    target = lst.LossScaleOptimizer(torch.optim.Adam(_model().parameters(), lr=1e-3), shared, stats_every=2)
    before = target.state_dict()
    with pytest.raises(ValueError, match=r"AutoLossScale sets the scale of one optimizer.*SharedLossScale.*Load the "
                                         r"checkpoint into a LossScaleOptimizer with its own scale"):
        target.load_state_dict(saved)
    assert isinstance(shared.policy, lossscale.DynamicLossScale) and float(shared.loss_scale) == 2.0**5
    assert target.state_dict()["state"] == before["state"] == {}
    assert isinstance(target._sampler.policy, lossscale.DynamicLossScale)


# ----------------------------------------------------------------------------- costs


def test_unsampled_steps_neither_walk_nor_name_the_parameters(monkeypatch):
    from lossscale.torch._diagnostics import OverflowReporter

    calls = []
    original = OverflowReporter.name_of
    monkeypatch.setattr(OverflowReporter, "name_of", lambda self, p, g, i: calls.append(i) or original(self, p, g, i))
    model = _model()
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), POLICY, stats_every=4,
                                 overflow_report=True, named_parameters=model.named_parameters())
    _backward(opt, model)
    opt.step()  # sampled: the names of this parameter set, once
    assert len(calls) == 4
    assert opt.gradient_stats["per_tensor"]["names"] == ("0.weight", "0.bias", "2.weight", "2.bias")
    for _ in range(4):  # three unsampled steps, then a sampled one over the same parameters
        _backward(opt, model)
        opt.step()
    assert len(calls) == 4 and int(opt.gradient_stats["step"]) == 4


@pytest.mark.parametrize("owner", ["optimizer", "gradscaler"])
def test_a_sampled_step_copies_no_python_value_to_the_device(monkeypatch, owner):
    copies = []

    def watch(fn):
        def wrapped(data, *args, **kwargs):
            if not isinstance(data, torch.Tensor):  # on a GPU, an array made from Python values is a copy
                copies.append((fn.__name__, data))
            return fn(data, *args, **kwargs)
        return wrapped

    model = _model()
    if owner == "optimizer":
        opt = _auto_opt(model)
        run = lambda: (_backward(opt, model), opt.step())
    else:
        inner, scaler = torch.optim.SGD(model.parameters(), lr=0.0), lst.GradScaler("cpu", stats_every=1)

        def run():
            inner.zero_grad()
            scaler.scale(_loss(model)).backward()
            scaler.step(inner)
            scaler.update()
    run()  # the first sampled step builds the names and sizes of this parameter set
    for name in ("tensor", "as_tensor", "asarray"):
        monkeypatch.setattr(torch, name, watch(getattr(torch, name)))
    run()
    run()
    assert copies == []
    got = (opt if owner == "optimizer" else scaler).gradient_stats
    assert int(got["step"]) == 2


def test_an_auto_checkpoint_loaded_without_stats_every_samples_and_runs_the_auto_rule():
    model = _model()
    source = _auto_opt(model)
    saved = source.state_dict()
    target = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), "dynamic")
    assert target.gradient_stats is None and target._sampler is None
    target.load_state_dict(saved)
    assert target._sampler.every == 16  # AutoLossScale's default
    scaled = _backward(target, model)
    target.step()
    assert_sample(target.gradient_stats, scaled, step=0)
    assert float(target.loss_scale) == auto_scale_after(POLICY, scaled) != 2.0**10


def test_a_bad_stats_record_is_refused_before_anything_loads():
    model = _model()
    source = _auto_opt(model, inner=torch.optim.Adam)
    _backward(source, model)
    source.step()
    saved = source.state_dict()
    saved["lossscale_stats"] = {"iteration": 1}  # no auto state
    target = _auto_opt(_model(), inner=torch.optim.Adam)
    with pytest.raises(ValueError, match=r"no AutoLossScale state \(saved with another policy\?\)"):
        target.load_state_dict(saved)
    assert target.state_dict()["state"] == {} and target._sampler.state.count == 0


def test_pickled_optimizers_keep_sampling():
    import copy
    import pickle

    model = _model()
    opt = _auto_opt(model)
    _backward(opt, model)
    opt.step()
    clone = pickle.loads(pickle.dumps(opt))
    params = [p for g in clone.param_groups for p in g["params"]]
    clone.zero_grad()
    clone.get_scaled_loss(sum((p**2).sum() for p in params) * 1e-6).backward()
    scaled = [p.grad.clone() for p in params]
    clone.step()
    assert clone._sampler.state.count == 2
    assert_sample(clone.gradient_stats, scaled, step=1)
    a, b, opt_a, opt_b = _two_optimizers()
    scaler = lst.GradScaler("cpu", stats_every=1)
    _scaler_iteration(scaler, a, b, opt_a, opt_b, "ab")
    twin = copy.deepcopy(scaler)
    scaled = _scaler_iteration(twin, a, b, opt_a, opt_b, "ab")
    assert_sample(twin.gradient_stats, scaled["a"] + scaled["b"], step=1)


def test_each_optimizer_on_a_shared_scale_keeps_its_own_sample():
    a, b, _, _ = _two_optimizers()
    shared = lst.SharedLossScale(initial_scale=2.0**6)
    opt_a = lst.LossScaleOptimizer(torch.optim.SGD(a.parameters(), lr=0.0), shared, stats_every=1)
    opt_b = lst.LossScaleOptimizer(torch.optim.SGD(b.parameters(), lr=0.0), shared, stats_every=2)
    for step in range(2):
        opt_a.zero_grad(), opt_b.zero_grad()
        shared.get_scaled_loss(_loss(a) + _loss(b)).backward()
        scaled_a, scaled_b = [p.grad.clone() for p in a.parameters()], [p.grad.clone() for p in b.parameters()]
        opt_a.step()
        opt_b.step()
        shared.update()
        assert_sample(opt_a.gradient_stats, scaled_a, step=step)
        if step == 0:
            assert_sample(opt_b.gradient_stats, scaled_b, step=0)
    assert int(opt_b.gradient_stats["step"]) == 0 and opt_b._sampler.state.count == 2


def test_the_sampler_keeps_every_value_on_the_gradients_device():
    # "meta" stands for an accelerator: torch refuses to mix it with CPU tensors, as it refuses CUDA.
    from lossscale.torch._state import count_sampler
    from lossscale.torch._stats import StatsSampler

    sampler = StatsSampler(1, lossscale.DynamicLossScale())
    grads = [((0, i), None, g) for i, g in enumerate([torch.ones(3, device="meta"), torch.ones(2, 2, device="meta")])]
    sampler.measure(0, grads, str)
    sampler.measure(1, grads, str)
    assert count_sampler(sampler) is None
    sample = sampler._summarized().sample  # a step without auto or History leaves the summary to the first read
    assert {t.device.type for t in sample} == {"meta"} and sample.tensor_amax.shape == (4,)
    assert sampler.names == ("(0, 0)", "(0, 1)", "(0, 0)", "(0, 1)") and sampler.state.count == 1
