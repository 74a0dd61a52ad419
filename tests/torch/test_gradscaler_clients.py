"""What client code of ``torch.amp.GradScaler`` relies on, run against torch's scaler and lossscale's alike:

- optimizers that declare ``_step_supports_amp_scaling`` get what torch's scaler hands them: the scaled gradients
  with ``grad_scale = S`` and ``found_inf``, or the scaler itself as ``grad_scaler=`` when ``step`` takes it
  (torch's own ``test_grad_scaler_pass_itself``, on the CPU);
- ``_per_optimizer_states[id(opt)]`` and ``_unscale_grads_`` as the clients found with the code search use them:
  a loop that reads ``found_inf_per_device`` after ``step()`` to see a skip, Megatron-style code that unscales
  with its own factor and writes the flag and the stage, apex's ``DistributedFusedAdam`` (``step(grad_scaler=)``
  writes its own flag and skips by itself), SAM loops that mark the stage ``STEPPED`` by hand, and a pipeline
  that all-reduces the flags in place;
- an optimizer (``LossScaleOptimizer``) is hashable and weak-referenceable, as LR schedulers and Lightning need;
- a pickled ``GradScaler`` keeps its overflow reports' step numbering;
- ``SharedLossScale.load_state_dict`` refuses an ``"auto"`` record with the constructor's words.
"""

from __future__ import annotations

import copy
import gc
import math
import pickle
import weakref

import pytest
import torch
from torch.amp.grad_scaler import OptState

import lossscale.torch as lst

SCALERS = {"torch": torch.amp.GradScaler, "lossscale": lst.GradScaler}


@pytest.fixture(params=list(SCALERS))
def make_scaler(request):
    return lambda **kw: SCALERS[request.param]("cpu", **kw)


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def _backward(scaler, model, x=None):
    x = torch.ones(4, 4) if x is None else x
    scaler.scale(model(x).mean()).backward()


class _AmpScaling(torch.optim.Optimizer):
    """An optimizer that unscales in its own step, as torch's fused ones (and apex's) declare."""

    def __init__(self, params):
        super().__init__(params, {})
        self._step_supports_amp_scaling = True


# ----------------------------------------------------------------------------- _step_supports_amp_scaling


def test_grad_scaler_pass_itself(make_scaler):
    """torch's test_grad_scaler_pass_itself (test_cuda.py) on the CPU, for both scalers."""
    calls = {}

    class TakesScaler(_AmpScaling):
        def step(self, closure=None, *, grad_scaler=None):
            calls["takes"] = (grad_scaler, hasattr(self, "grad_scale"), hasattr(self, "found_inf"))

    class ReadsAttributes(_AmpScaling):
        def step(self, closure=None):
            calls["reads"] = (self.grad_scale, self.found_inf)

    model = _model()
    first, second = TakesScaler(model.parameters()), ReadsAttributes(model.parameters())
    scaler = make_scaler(init_scale=2.0)
    _backward(scaler, model)
    with pytest.warns(FutureWarning, match="GradScaler is going to stop passing itself as a keyword argument"):
        scaler.step(first)
    scaler.step(second)
    scaler.update()
    assert calls["takes"] == (scaler, False, False)
    grad_scale, found_inf = calls["reads"]
    assert isinstance(grad_scale, torch.Tensor) and float(grad_scale) == 2.0
    assert isinstance(found_inf, torch.Tensor) and float(found_inf) == 0.0
    assert not hasattr(second, "grad_scale") and not hasattr(second, "found_inf")  # removed after the step
    assert scaler.get_scale() == 2.0


def _seen_by_kernel(step_fn, make_opt):
    """(grad_scale, found_inf, gradients) an amp-scaling optimizer's step sees, and whether it ran."""
    seen = {}

    class Recording(_AmpScaling):
        def step(self, closure=None):
            seen["grad_scale"] = None if self.grad_scale is None else float(self.grad_scale)
            seen["found_inf"] = float(self.found_inf)
            seen["grads"] = [p.grad.clone() for g in self.param_groups for p in g["params"]]

    model = _model()
    opt = Recording(model.parameters())
    step_fn(make_opt(opt), model)
    return seen, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("kind", ["torch", "lossscale", "LossScaleOptimizer"])
def test_an_amp_scaling_optimizer_gets_the_scaled_gradients_and_the_scale(kind):
    def run(wrapped, model):
        if kind == "LossScaleOptimizer":
            wrapped.get_scaled_loss(model(torch.ones(4, 4)).mean()).backward()
            wrapped.step()
            return
        scaler = SCALERS[kind]("cpu", init_scale=8.0)
        _backward(scaler, model)
        for p in model.parameters():
            assert torch.count_nonzero(p.grad)  # the scaled gradients, not yet unscaled
        scaler.step(wrapped)
        scaler.update()

    make = (lambda opt: lst.LossScaleOptimizer(opt, 8.0)) if kind == "LossScaleOptimizer" else (lambda opt: opt)
    seen, _ = _seen_by_kernel(run, make)
    model = _model()
    true = torch.autograd.grad(model(torch.ones(4, 4)).mean(), list(model.parameters()))
    assert seen["grad_scale"] == 8.0 and seen["found_inf"] == 0.0
    for got, want in zip(seen["grads"], true):
        torch.testing.assert_close(got, want * 8.0, rtol=0, atol=0)  # scaled: the kernel divides by grad_scale


@pytest.mark.parametrize("kind", list(SCALERS))
def test_after_unscale_the_optimizer_gets_unscaled_gradients_and_no_scale(kind):
    def run(opt, model):
        scaler = SCALERS[kind]("cpu", init_scale=8.0)
        _backward(scaler, model)
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()

    seen, _ = _seen_by_kernel(run, lambda opt: opt)
    model = _model()
    true = torch.autograd.grad(model(torch.ones(4, 4)).mean(), list(model.parameters()))
    assert seen["grad_scale"] is None and seen["found_inf"] == 0.0
    for got, want in zip(seen["grads"], true):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_fused_adamw_trains_bit_for_bit_as_under_torchs_scaler(kind):
    """torch's fused AdamW on the CPU through both scalers, an overflow at step 2: the same weights and scales."""
    def train(scaler_cls):
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        scaler = scaler_cls("cpu", init_scale=2.0**10, growth_interval=2)
        scales = []
        for i in range(6):
            opt.zero_grad()
            x = torch.full((4, 4), float(i + 1))
            _backward(scaler, model, x)
            if i == 2:
                model.weight.grad[0, 0] = math.inf
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        return [p.detach().clone() for p in model.parameters()], scales

    (want, want_scales), (got, got_scales) = train(torch.amp.GradScaler), train(SCALERS[kind])
    assert got_scales == want_scales == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["lossscale", "LossScaleOptimizer"])
def test_torchs_fused_optimizers_get_unscaled_float32_gradients(kind):
    """torch's own fused kernels compute the same update from unscaled gradients (above: bit for bit), and given
    ``grad_scale`` they write the unscaled gradients back: lossscale's check pass unscales instead, one write less."""
    model = _model()
    inner = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    seen = []
    inner.register_step_pre_hook(lambda opt, args, kwargs: seen.append(
        (opt.grad_scale, [p.grad.clone() for p in model.parameters()])))
    reference = _model()
    true = torch.autograd.grad(reference(torch.ones(4, 4)).mean(), list(reference.parameters()))
    opt = lst.LossScaleOptimizer(inner, 8.0) if kind == "LossScaleOptimizer" else None
    scaler = lst.GradScaler("cpu", init_scale=8.0)
    for _ in range(2):  # the first step is decided on the host, the second on the device
        inner.zero_grad()
        if opt is not None:
            opt.get_scaled_loss(model(torch.ones(4, 4)).mean()).backward()
            opt.step()
        else:
            _backward(scaler, model)
            scaler.step(inner)
            scaler.update()
    assert len(seen) == 2 and all(grad_scale is None for grad_scale, _ in seen)
    _, grads = seen[0]
    for got, want in zip(grads, true):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_loss_scale_optimizer_unscales_for_an_optimizer_that_takes_grad_scaler():
    """A LossScaleOptimizer has no scaler to pass: such an inner optimizer gets unscaled gradients, and a skip
    calls no step (it would otherwise step on scaled gradients, ignoring grad_scale)."""
    calls = []

    class TakesScaler(_AmpScaling):
        def step(self, closure=None, *, grad_scaler=None):
            calls.append((grad_scaler, [p.grad.clone() for g in self.param_groups for p in g["params"]]))

    model = _model()
    opt = lst.LossScaleOptimizer(TakesScaler(model.parameters()), 8.0)
    opt.get_scaled_loss(model(torch.ones(4, 4)).mean()).backward()
    opt.step()
    reference = _model()
    true = torch.autograd.grad(reference(torch.ones(4, 4)).mean(), list(reference.parameters()))
    [(scaler, grads)] = calls
    assert scaler is None
    for got, want in zip(grads, true):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    opt.zero_grad()
    opt.get_scaled_loss(model(torch.ones(4, 4)).mean() * math.inf).backward()
    opt.step()
    assert len(calls) == 1 and bool(opt.last_step_skipped)


# ----------------------------------------------------------------------------- _per_optimizer_states, _unscale_grads_


def _found(scaler, opt):
    return sum(v.item() for v in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values())


@pytest.mark.parametrize("bad", [False, True])
def test_a_loop_reads_the_skip_from_found_inf_per_device_after_step(make_scaler, bad):
    """Trainers read ``found_inf_per_device`` between ``step()`` and ``update()`` to step their LR schedule only
    when the optimizer stepped."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_scaler(init_scale=4.0)
    _backward(scaler, model)
    if bad:
        model.bias.grad[0] = math.nan
    scaler.step(opt)
    state = scaler._per_optimizer_states[id(opt)]
    assert state["stage"] is OptState.STEPPED
    assert _found(scaler, opt) == float(bad)
    scaler.update()
    assert scaler._per_optimizer_states[id(opt)]["stage"] is OptState.READY
    assert _found(scaler, opt) == 0 and scaler.get_scale() == (2.0 if bad else 4.0)


@pytest.mark.parametrize("bad", [False, True])
def test_megatron_style_own_unscale_writes_flag_and_stage(make_scaler, bad):
    """Unscale by ``1 / (S * tokens)`` with ``_unscale_grads_``, write the flag and ``OptState.UNSCALED``; step()
    then steps on those gradients (or skips) and update() backs off on the written flag."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    scaler = make_scaler(init_scale=8.0)
    tokens = 4.0
    _backward(scaler, model)
    scaled = [p.grad.clone() for p in model.parameters()]
    if bad:
        model.weight.grad[0, 1] = math.inf
    state = scaler._per_optimizer_states[id(opt)]  # before the optimizer's first step(): a fresh READY state
    assert state["stage"] is OptState.READY and state["found_inf_per_device"] == {}
    inverse = scaler._scale.double().reciprocal().float() / tokens
    found = torch.zeros((), dtype=torch.float32)
    state["found_inf_per_device"] = scaler._unscale_grads_(opt, inverse, found, False)
    state["stage"] = OptState.UNSCALED
    assert found.item() == 0.0  # the caller's tensor is copied, not written
    scaler.step(opt)
    scaler.update()
    after = [p.detach() for p in model.parameters()]
    if bad:
        assert all(torch.equal(a, b) for a, b in zip(after, before)) and scaler.get_scale() == 4.0
    else:
        for a, b, g in zip(after, before, scaled):
            torch.testing.assert_close(a, b - g / (8.0 * tokens), rtol=0, atol=0)
        assert scaler.get_scale() == 8.0


@pytest.mark.parametrize("bad", [False, True])
def test_apex_style_optimizer_takes_the_scaler_and_reports_its_own_flag(make_scaler, bad):
    """apex's DistributedFusedAdam: ``step(grad_scaler=)`` computes the flag from its own norm, writes it to
    ``_per_optimizer_states[id(self)]``, skips by itself, else unscales by ``grad_scaler._scale``."""

    class SelfUnscaling(_AmpScaling):
        def step(self, closure=None, *, grad_scaler=None):
            params = [p for g in self.param_groups for p in g["params"]]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
            found_inf = (~torch.isfinite(norm)).float()
            grad_scaler._per_optimizer_states[id(self)]["found_inf_per_device"] = {found_inf.device: found_inf}
            if found_inf.item():
                return
            with torch.no_grad():
                for p in params:
                    p.sub_(p.grad / grad_scaler._scale)

    model = _model()
    opt = SelfUnscaling(model.parameters())
    scaler = make_scaler(init_scale=16.0)
    before = [p.detach().clone() for p in model.parameters()]
    _backward(scaler, model)
    scaled = [p.grad.clone() for p in model.parameters()]
    if bad:
        model.bias.grad[0] = math.inf
    with pytest.warns(FutureWarning, match="stop passing itself"):
        scaler.step(opt)
    scaler.update()
    after = [p.detach() for p in model.parameters()]
    if bad:
        assert all(torch.equal(a, b) for a, b in zip(after, before)) and scaler.get_scale() == 8.0
    else:
        for a, b, g in zip(after, before, scaled):
            torch.testing.assert_close(a, b - g / 16.0, rtol=0, atol=0)
        assert scaler.get_scale() == 16.0


def test_sam_style_loop_marks_the_stage_stepped_by_hand(make_scaler):
    """SAM's two halves, each: unscale_, read the flag, step by hand if finite, mark ``stage = 2`` (STEPPED),
    update(). The flag of each half decides its update; the first overflows, the second does not."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_scaler(init_scale=4.0)
    halves = []
    for bad in (True, False):
        opt.zero_grad()
        _backward(scaler, model)
        if bad:
            model.weight.grad[0, 0] = math.inf
        scaler.unscale_(opt)
        state = scaler._per_optimizer_states[id(opt)]
        assert state["stage"] is OptState.UNSCALED
        finite = not sum(v.item() for v in state["found_inf_per_device"].values())
        if finite:
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.1 * p.grad)
        state["stage"] = 2
        assert OptState(scaler._per_optimizer_states[id(opt)]["stage"]) is OptState.STEPPED
        scaler.update()
        halves.append((finite, scaler.get_scale()))
    assert halves == [(False, 2.0), (True, 2.0)]


def test_pipeline_all_reduces_the_flags_in_place(make_scaler):
    """A pipeline stage copies the flag all stages agree on into ``found_inf_per_device``'s tensors in place
    (an all-reduce MAX); that flag decides the step."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scaler = make_scaler(init_scale=4.0)
    _backward(scaler, model)
    scaler.unscale_(opt)
    for value in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values():
        value.copy_(torch.ones(()))  # another stage overflowed
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))
    assert scaler.get_scale() == 2.0


def test_check_inf_per_device_checks_without_unscaling(make_scaler):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_scaler(init_scale=4.0)
    _backward(scaler, model)
    scaled = [p.grad.clone() for p in model.parameters()]
    flags = scaler._check_inf_per_device(opt)
    assert {d: float(t) for d, t in flags.items()} == {torch.device("cpu"): 0.0}
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), scaled))
    assert scaler._per_optimizer_states[id(opt)]["stage"] is OptState.READY
    model.bias.grad[0] = math.inf
    assert float(sum(scaler._check_inf_per_device(opt).values())) == 1.0


def test_unscale_grads_dense_sparse_and_fp16_as_torch(make_scaler):
    """torch's own checks of ``_unscale_grads_`` (test_grad_scaling_unscale_sparse), on the CPU."""
    scaler = make_scaler()
    inv_scale = torch.full((1,), 0.25, dtype=torch.float)
    found_inf = torch.full((1,), 0.0, dtype=torch.float)
    i = torch.tensor([[0, 1, 1], [2, 0, 2]], dtype=torch.int64)
    v = torch.tensor([16.0, 32.0, 64.0], dtype=torch.float)
    s = torch.sparse_coo_tensor(i, v, torch.Size([2, 3]), dtype=torch.float)
    p = s.clone()
    p.grad = s.clone()
    opt = torch.optim.SGD([p], lr=1.0)
    flags = scaler._unscale_grads_(opt, inv_scale, found_inf, False)
    assert float(flags[torch.device("cpu")]) == 0.0 and float(found_inf) == 0.0
    torch.testing.assert_close(p.grad.to_dense(), (s / 4).to_dense())
    p.grad = torch.sparse_coo_tensor(i, torch.tensor([16.0, 32.0, math.inf]), torch.Size([2, 3]))
    assert float(scaler._unscale_grads_(opt, inv_scale, found_inf, False)[torch.device("cpu")]) == 1.0
    # float16: refused unless allow_fp16; an uncoalesced float16 gradient is coalesced (its sum overflows)
    p16 = torch.zeros(3, dtype=torch.float16, requires_grad=True)
    p16.grad = torch.ones(3, dtype=torch.float16)
    opt16 = torch.optim.SGD([p16], lr=1.0)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        scaler._unscale_grads_(opt16, inv_scale, found_inf, False)
    i2 = torch.tensor([[0, 1, 0]], dtype=torch.int64)
    sp = torch.sparse_coo_tensor(i2, torch.tensor([60000.0, 1.0, 60000.0], dtype=torch.float16), (3,))
    w = torch.zeros(3, dtype=torch.float16).to_sparse().requires_grad_()
    w.grad = sp
    flags = scaler._unscale_grads_(torch.optim.SGD([w], lr=1.0), torch.ones(()), torch.zeros(()), True)
    assert float(flags[torch.device("cpu")]) == 1.0


def test_per_optimizer_states_refuses_what_torch_never_holds():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = lst.GradScaler("cpu")
    state = scaler._per_optimizer_states[id(opt)]
    with pytest.raises(ValueError, match="stage must be a torch.amp.grad_scaler.OptState"):
        state["stage"] = 7
    with pytest.raises(TypeError, match="found_inf_per_device must be a dict"):
        state["found_inf_per_device"] = 1.0
    assert dict(state) == {"stage": OptState.READY, "found_inf_per_device": {}}


def test_a_stage_written_without_a_flag_is_refused_at_step():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = lst.GradScaler("cpu")
    _backward(scaler, model)
    scaler._per_optimizer_states[id(opt)]["stage"] = OptState.UNSCALED
    with pytest.raises(RuntimeError, match="No inf checks were recorded for this optimizer"):
        scaler.step(opt)


# ----------------------------------------------------------------------------- _scale, _growth_tracker


def test_scale_is_none_until_placed_and_a_lazy_init_lets_a_stage_unscale(make_scaler):
    """Pipeline stages that never call ``scale()`` (the last stage scaled the loss) do ``if scaler._scale is None:
    scaler._lazy_init_scale_growth_tracker(device)`` and then unscale, step and update their own gradients."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = [p.detach().clone() for p in model.parameters()]
    scaler = make_scaler(init_scale=8.0, growth_interval=1)
    assert scaler._scale is None and scaler._growth_tracker is None and scaler._get_scale_async() is None
    assert scaler.get_scale() == 8.0
    (model(torch.ones(2, 4)).mean() * 8.0).backward()  # scaled by another stage's copy of the scale
    if scaler._scale is None:
        scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    assert float(scaler._scale) == 8.0 and int(scaler._growth_tracker) == 0
    scaler.unscale_(opt)
    torch.testing.assert_close(model.bias.grad, torch.ones(1))
    scaler.step(opt)
    scaler.update()
    torch.testing.assert_close(model.bias.detach(), before[1] - 0.5)
    assert scaler.get_scale() == 16.0


def test_assigning_scale_and_growth_tracker_keeps_a_floor_by_hand(make_scaler):
    """``if scaler._scale < floor: scaler._scale = torch.tensor(floor).to(scaler._scale)`` after update(), and a
    growth counter restored by assignment: the next iteration scales by and grows from what was assigned."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = make_scaler(init_scale=4.0, growth_interval=3)
    _backward(scaler, model)
    model.bias.grad[0] = math.inf
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0
    floor = 64.0
    if scaler._scale < floor:
        scaler._scale = torch.tensor(floor).to(scaler._scale)
    scaler._growth_tracker = torch.tensor(2, dtype=torch.int32)
    assert scaler.get_scale() == floor and scaler._get_growth_tracker() == 2
    opt.zero_grad()
    loss = model(torch.ones(4, 4)).mean()
    scaled = scaler.scale(loss)
    assert torch.equal(scaled, loss * floor)
    scaled.backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2 * floor and scaler._get_growth_tracker() == 0  # the third finite step grew it


def test_assigning_what_no_scale_can_hold_is_refused():
    scaler = lst.GradScaler("cpu")
    with pytest.raises(TypeError, match=r"one-element real tensor.*scaler\.update\(new_scale\)"):
        scaler._scale = 8.0
    with pytest.raises(TypeError, match="one-element real tensor"):
        scaler._scale = torch.ones(2)
    with pytest.raises(ValueError, match="cannot be negative"):
        scaler._growth_tracker = -1
    with pytest.raises(TypeError, match="int or a one-element integer tensor"):
        scaler._growth_tracker = torch.tensor(1.5)
    assert scaler._scale is None and scaler.get_scale() == 2.0**16  # nothing changed


def test_a_loop_that_scales_only_for_a_torch_gradscaler_scales(make_scaler):
    """Training loops gate scaling on ``isinstance(scaler, torch.amp.GradScaler)`` (a ``nullcontext`` or None
    otherwise); lossscale's scaler must take that branch, or the float16 gradients go unscaled and unchecked."""
    scaler = make_scaler(init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler) and isinstance(scaler, torch.GradScaler)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(4, 4)).mean()
    if isinstance(scaler, torch.amp.GradScaler):
        scaler.scale(loss).backward()
        model.bias.grad[0] = math.inf
        scaler.step(opt)
        scaler.update()
    else:  # pragma: no cover - the branch a scaler that is not torch's would take: trains on the Inf
        loss.backward()
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())) and scaler.get_scale() == 4.0


def test_factor_attributes_read_and_write_as_torchs(make_scaler):
    """accelerate's own tests read ``_init_scale``, ``_growth_factor``, ``_backoff_factor``, ``_growth_interval`` and
    ``_enabled`` of the scaler it built from ``GradScalerKwargs``; other client code writes the factors."""
    scaler = make_scaler(init_scale=1024.0)
    assert (scaler._init_scale, scaler._growth_factor, scaler._backoff_factor, scaler._growth_interval) == (
        1024.0, 2.0, 0.5, 2000)
    assert scaler._enabled is True
    scaler._growth_factor, scaler._backoff_factor, scaler._growth_interval = 4.0, 0.25, 1
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (4.0, 0.25, 1)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _backward(scaler, model)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 4096.0


def test_a_subclass_that_moves_the_scale_by_its_own_update(make_scaler):
    """Subclasses (model-parallel scalers) override ``update()`` with torch's: ``_check_scale_growth_tracker``,
    the flags of ``_per_optimizer_states``, ``torch._amp_update_scale_`` on the live tensors with the factor
    attributes, then a fresh ``_per_optimizer_states``. The trajectory is torch's; each iteration starts READY."""
    from collections import defaultdict

    base = type(make_scaler())

    class OwnUpdate(base):
        def update(self, new_scale=None):
            scale, tracker = self._check_scale_growth_tracker("update")
            flags = [f.to(scale.device) for state in self._per_optimizer_states.values()
                     for f in state["found_inf_per_device"].values()]
            torch._amp_update_scale_(scale, tracker, sum(flags[1:], flags[0].clone()), self._growth_factor,
                                     self._backoff_factor, self._growth_interval)
            self._per_optimizer_states = defaultdict(lambda: {"stage": OptState.READY, "found_inf_per_device": {}})

    scaler = OwnUpdate("cpu", init_scale=4.0, growth_interval=2)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trajectory = []
    for i in range(5):
        opt.zero_grad()
        _backward(scaler, model)
        if i == 2:
            model.bias.grad[0] = math.inf
        scaler.step(opt)
        scaler.update()
        trajectory.append((scaler.get_scale(), scaler._get_growth_tracker(), len(scaler._per_optimizer_states)))
    assert trajectory == [(4.0, 1, 0), (8.0, 0, 0), (4.0, 0, 0), (4.0, 1, 0), (8.0, 0, 0)]


def test_per_optimizer_states_lists_this_iterations_optimizers_only(make_scaler):
    """As torch's defaultdict: empty after update(), an optimizer listed once unscaled, stepped or looked up."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    other = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    scaler = make_scaler(init_scale=4.0)
    _backward(scaler, model)
    scaler.unscale_(opt)
    assert list(scaler._per_optimizer_states) == [id(opt)]
    scaler.step(opt)
    assert scaler._per_optimizer_states[id(other)]["stage"] is OptState.READY  # a lookup lists it, as torch's
    assert set(scaler._per_optimizer_states) == {id(opt), id(other)}
    scaler.update()
    assert len(scaler._per_optimizer_states) == 0 and id(opt) not in scaler._per_optimizer_states
    opt.zero_grad()
    _backward(scaler, model)
    scaler.step(opt)
    assert list(scaler._per_optimizer_states) == [id(opt)]


def test_a_checkpoint_of_the_scalers_dict_resumes(make_scaler, tmp_path):
    """Client checkpoints that save ``scaler.__dict__`` with ``torch.save`` and restore it with
    ``scaler.__dict__.update(...)``: the restored scaler goes on from the saved scale and growth counter."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_scaler(init_scale=4.0, growth_interval=3)
    for _ in range(2):
        opt.zero_grad()
        _backward(scaler, model)
        scaler.step(opt)
        scaler.update()
    torch.save({"scaler_state": scaler.__dict__}, tmp_path / "ckpt.pt")
    restored = make_scaler()
    restored.__dict__.update(torch.load(tmp_path / "ckpt.pt", weights_only=False)["scaler_state"])
    assert restored.get_scale() == 4.0 and restored._get_growth_tracker() == 2
    opt.zero_grad()
    _backward(restored, model)
    restored.step(opt)
    restored.update()
    assert restored.get_scale() == 8.0 and restored._get_growth_tracker() == 0


# ----------------------------------------------------------------------------- hashable, weak-referenceable


def test_loss_scale_optimizer_is_hashable_and_weak_referenceable():
    model = _model()
    opt = lst.LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    assert hash(opt) == hash(opt) and {opt: 1}[opt] == 1 and opt != lst.LossScaleOptimizer(
        torch.optim.SGD(_model().parameters(), lr=1.0))
    ref = weakref.ref(opt)
    assert ref() is opt
    cache = weakref.WeakKeyDictionary({opt: "state"})
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # holds a weak reference of its step
    opt.get_scaled_loss(model(torch.ones(4, 4)).mean()).backward()
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.5
    scaler = lst.GradScaler("cpu")
    _backward(scaler, model)
    scaler.step(opt)  # a scaler keys its records by the optimizer (weakly)
    scaler.update()
    del opt, sched
    gc.collect()
    assert ref() is None and len(cache) == 0


# ----------------------------------------------------------------------------- pickling keeps the report numbering


def _iteration(scaler, model, opt, bad):
    opt.zero_grad()
    _backward(scaler, model)
    if bad:
        model.weight.grad[0, 0] = math.inf
    scaler.step(opt)
    scaler.update()


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_gradscaler_overflow_report_numbering_survives_pickling(how):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = lst.GradScaler("cpu", overflow_report=True, history=True)
    for i in range(3):
        _iteration(scaler, model, opt, bad=i == 1)
    assert scaler.last_overflow_report.step == 1
    clone = pickle.loads(pickle.dumps(scaler)) if how == "pickle" else copy.deepcopy(scaler)
    _iteration(clone, model, opt, bad=True)
    assert clone.last_overflow_report.step == 3
    assert list(clone.history.steps) == [0, 1, 2, 3] and list(clone.history.skipped) == [False, True, False, True]
    # a new optimizer after the restore is numbered by the scaler's iterations, as the history's rows
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    _iteration(clone, model, other, bad=True)
    assert clone.last_overflow_report.step == 4


# ----------------------------------------------------------------------------- SharedLossScale refuses "auto"


def test_shared_loss_scale_load_state_dict_refuses_auto_as_the_constructor():
    with pytest.raises(ValueError) as at_construction:
        lst.SharedLossScale("auto")
    own = lst.LossScaleOptimizer(torch.optim.SGD(_model().parameters(), lr=0.1), "auto")
    record = own.shared_loss_scale.state_dict()
    assert record["policy"]["class_name"] == "AutoLossScale"
    shared = lst.SharedLossScale(dynamic=True, initial_scale=8.0)
    before = shared.state_dict()
    with pytest.raises(ValueError) as at_load:
        shared.load_state_dict(record)
    assert str(at_load.value) == str(at_construction.value)
    after = shared.state_dict()
    assert after["policy"] == before["policy"]
    assert {k: float(v) for k, v in after["state"].items()} == {k: float(v) for k, v in before["state"].items()}
