"""The TF methods of seeds 000-004 on `lossscale.torch.LossScaleOptimizer`."""

from __future__ import annotations

import math

import pytest
import torch

from lossscale import DynamicLossScale, ExponentialUpdateLossScaleManager, FixedLossScaleManager
from lossscale.torch import LossScaleOptimizer

NONFINITE = [math.nan, math.inf, -math.inf]


def param(*values, dtype=torch.float32) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor(values, dtype=dtype))


# ----------------------------------------------------------------------------- seed 002's examples


def test_seed_002_minimize_example():
    var = param(1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([var], lr=0.25), "dynamic")
    opt.minimize(lambda: (var**2).sum(), var_list=[var])
    assert var.item() == 0.5


def test_seed_002_gradient_tape_example():
    var = param(1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([var], lr=0.25), "dynamic")
    opt.minimize(lambda: (var**2).sum(), var_list=[var])
    loss = (var**2).sum()
    scaled_loss = opt.get_scaled_loss(loss)
    assert scaled_loss.item() == 0.25 * 2.0**15
    (scaled_grad,) = torch.autograd.grad(scaled_loss, [var])
    assert scaled_grad.item() == 2.0**15
    (grad,) = opt.get_unscaled_gradients([scaled_grad])
    assert grad.item() == 1.0
    opt.apply_gradients([(grad, var)])
    assert var.item() == 0.25


# ----------------------------------------------------------------------------- get_scaled_loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_get_scaled_loss_keeps_dtype(dtype):
    opt = LossScaleOptimizer(torch.optim.SGD([param(1.0)], lr=0.1), initial_scale=1024)
    loss = torch.tensor(1.5, dtype=dtype)
    scaled = opt.get_scaled_loss(loss)
    assert scaled.dtype == dtype and scaled.shape == loss.shape
    assert scaled.item() == 1536.0
    vector = torch.tensor([0.5, 2.0], dtype=dtype)
    assert opt.get_scaled_loss(vector).dtype == dtype
    assert opt.get_scaled_loss(vector).tolist() == [512.0, 2048.0]


def test_get_scaled_loss_float16_overflow_is_inf_not_error():
    opt = LossScaleOptimizer(torch.optim.SGD([param(1.0)], lr=0.1))  # 2**15
    scaled = opt.get_scaled_loss(torch.tensor(4.0, dtype=torch.float16))
    assert scaled.dtype == torch.float16 and math.isinf(scaled.item())


def test_get_scaled_loss_backprops_the_scale():
    w = param(3.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), initial_scale=8)
    opt.get_scaled_loss((w**2).sum()).backward()
    assert w.grad.item() == 48.0


def test_get_scaled_loss_callable():
    w = param(2.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), initial_scale=8)
    calls = []

    def loss_fn():
        calls.append(1)
        return (w**2).sum()

    scaled_fn = opt.get_scaled_loss(loss_fn)
    assert callable(scaled_fn) and not isinstance(scaled_fn, torch.Tensor)
    assert calls == []  # not evaluated until called
    assert scaled_fn().item() == 32.0 and calls == [1]


@pytest.mark.parametrize("bad", [1.0, "loss", None, torch.tensor(3)], ids=repr)
def test_get_scaled_loss_rejects_non_float_tensors(bad):
    opt = LossScaleOptimizer(torch.optim.SGD([param(1.0)], lr=0.1))
    with pytest.raises(TypeError, match="get_scaled_loss"):
        opt.get_scaled_loss(bad)


# ----------------------------------------------------------------------------- get_unscaled_gradients


def test_get_unscaled_gradients_new_list_none_kept_dtype_kept():
    opt = LossScaleOptimizer(torch.optim.SGD([param(1.0)], lr=0.1), initial_scale=1024)
    grads = [
        torch.tensor([2048.0, -512.0]),
        None,
        torch.tensor([1024.0], dtype=torch.float16),
        torch.tensor([3072.0], dtype=torch.bfloat16),
        torch.tensor([[1.0]], dtype=torch.float64),
        None,
    ]
    originals = [None if g is None else g.clone() for g in grads]
    out = opt.get_unscaled_gradients(grads)
    assert isinstance(out, list) and out is not grads and len(out) == len(grads)
    assert out[1] is None and out[5] is None
    assert [None if g is None else g.dtype for g in out] == [None if g is None else g.dtype for g in grads]
    assert out[0].tolist() == [2.0, -0.5]
    assert out[2].tolist() == [1.0] and out[3].tolist() == [3.0] and out[4].tolist() == [[1.0 / 1024]]
    # the inputs are left alone
    for g, o in zip(grads, originals):
        if g is not None:
            assert torch.equal(g, o)
    for g, o in zip(grads, out):
        if g is not None:
            assert o is not g and o.data_ptr() != g.data_ptr()


def test_get_unscaled_gradients_float16_small_values_survive():
    # 4 / 2**26 = 2**-24 is float16's smallest subnormal; 1/2**26 itself is 0 in float16, so unscaling
    # in float16 would give 0. Unscaled in float32 and rounded once, it survives, in float16.
    opt = LossScaleOptimizer(torch.optim.SGD([param(1.0)], lr=0.1), initial_scale=2**26)
    assert float(torch.tensor([4.0], dtype=torch.float16) * torch.tensor(2.0**-26).half()) == 0.0
    (g,) = opt.get_unscaled_gradients([torch.tensor([4.0], dtype=torch.float16)])
    assert g.dtype == torch.float16 and g.item() == 2.0**-24


def test_get_unscaled_gradients_accepts_tuple_and_non_finite():
    opt = LossScaleOptimizer(torch.optim.SGD([param(1.0)], lr=0.1), initial_scale=2)
    out = opt.get_unscaled_gradients((torch.tensor([math.inf, math.nan, 4.0]),))
    assert isinstance(out, list)
    assert math.isinf(out[0][0].item()) and math.isnan(out[0][1].item()) and out[0][2].item() == 2.0


# ----------------------------------------------------------------------------- compute_gradients


def _linear_problem():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(5, 3), torch.randn(5, 2)
    return model, x, y


def test_compute_gradients_tensor_loss_and_default_var_list():
    model, x, y = _linear_problem()
    frozen = torch.nn.Parameter(torch.ones(1), requires_grad=False)
    opt = LossScaleOptimizer(torch.optim.SGD([*model.parameters(), frozen], lr=0.1), initial_scale=256)
    loss = torch.nn.functional.mse_loss(model(x), y)
    want = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
    pairs = opt.compute_gradients(loss)
    assert [v for _, v in pairs] == list(model.parameters())  # frozen parameters are not included
    for (g, v), w in zip(pairs, want):
        assert g.dtype == v.dtype
        torch.testing.assert_close(g, w, rtol=1e-6, atol=0)
    assert all(p.grad is None for p in model.parameters())  # .grad is not touched
    assert float(opt.loss_scale) == 256  # computing gradients does not update the scale


def test_compute_gradients_callable_and_var_list_and_none():
    model, x, _y = _linear_problem()
    unused = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([*model.parameters(), unused], lr=0.1))
    pairs = opt.compute_gradients(lambda: model(x).sum(), var_list=[model.bias, unused])
    assert len(pairs) == 2 and pairs[0][1] is model.bias and pairs[1][1] is unused
    assert pairs[0][0].tolist() == [5.0, 5.0]
    assert pairs[1][0] is None  # variable always present, gradient may be None


def test_compute_gradients_grad_loss():
    w = param(1.0, 2.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), initial_scale=64)
    loss = w * 3.0  # a non-scalar loss needs grad_loss
    pairs = opt.compute_gradients(loss, grad_loss=torch.tensor([0.5, -2.0]))
    assert pairs[0][0].tolist() == [1.5, -6.0]


def test_compute_gradients_bad_var_list():
    w = param(1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1))
    with pytest.raises(ValueError, match="var_list must hold tensors that require grad"):
        opt.compute_gradients((w * 2).sum(), var_list=[torch.ones(1)])


def test_compute_gradients_scales_to_avoid_float16_underflow():
    # d(loss)/dw = 2**-26, below float16's smallest subnormal (2**-24): it flushes to 0 without scaling.
    w = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float16))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), initial_scale=2**15)
    plain = torch.autograd.grad((w * 2.0**-26).sum(), [w])[0]
    assert plain.item() == 0.0
    (g, _), = opt.compute_gradients(lambda: (w * 2.0**-26).sum())
    assert g.dtype == torch.float16 and g.item() == 0.0  # unscaled back in float16: still below its range
    # ... but in float32 the gradient is resolved exactly
    w32 = param(1.0)
    opt32 = LossScaleOptimizer(torch.optim.SGD([w32], lr=0.1), initial_scale=2**15)
    (g32, _), = opt32.compute_gradients(lambda: (w32.half() * 2.0**-26).float().sum())
    assert g32.item() == 2.0**-26


# ----------------------------------------------------------------------------- apply_gradients


def _adam_setup(fused: bool, **scale_kwargs):
    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.randn(4))
    b = torch.nn.Parameter(torch.randn(2))
    inner = torch.optim.Adam([w, b], lr=0.1, fused=fused) if fused else torch.optim.Adam([w, b], lr=0.1, foreach=True)
    return w, b, inner, LossScaleOptimizer(inner, **scale_kwargs)


def _snapshot(opt):
    state = {
        id(p): {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()} for p, s in opt.state.items()
    }
    params = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    return params, state


def _assert_same_snapshot(a, b):
    assert len(a[0]) == len(b[0])
    for x, y in zip(a[0], b[0]):
        assert torch.equal(x, y)
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        assert a[1][k].keys() == b[1][k].keys()
        for name in a[1][k]:
            assert torch.equal(torch.as_tensor(a[1][k][name]), torch.as_tensor(b[1][k][name])), name


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_apply_gradients_finite_steps_and_counts(fused):
    w, b, _inner, opt = _adam_setup(fused, initial_scale=4, dynamic_growth_steps=2)
    # a control optimizer fed the same gradients
    w2, b2 = torch.nn.Parameter(w.detach().clone()), torch.nn.Parameter(b.detach().clone())
    control = torch.optim.Adam([w2, b2], lr=0.1)
    global_step = torch.zeros((), dtype=torch.int64)
    for i in range(3):
        gw, gb = torch.full((4,), 0.1 * (i + 1)), torch.full((2,), -0.2)
        applied = opt.apply_gradients([(gw, w), (gb, b)], global_step=global_step)
        assert isinstance(applied, torch.Tensor) and bool(applied)
        w2.grad, b2.grad = gw.clone(), gb.clone()
        control.step()
    torch.testing.assert_close(w.detach(), w2.detach())
    torch.testing.assert_close(b.detach(), b2.detach())
    assert int(global_step) == 3
    assert float(opt.loss_scale) == 8 and int(opt.dynamic_counter) == 1
    assert w.grad is None and b.grad is None  # the parameters' own .grad are left as they were


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
@pytest.mark.parametrize("bad", NONFINITE, ids=["nan", "+inf", "-inf"])
def test_apply_gradients_non_finite_means_no_update_at_all(fused, bad):
    w, b, _inner, opt = _adam_setup(fused, initial_scale=64, dynamic_growth_steps=2)
    global_step = torch.zeros((), dtype=torch.int64)
    opt.apply_gradients([(torch.ones(4), w), (torch.ones(2), b)], global_step=global_step)  # one good step first
    before = _snapshot(opt)
    assert int(global_step) == 1 and int(opt.dynamic_counter) == 1
    gw = torch.ones(4)
    gw[2] = bad
    applied = opt.apply_gradients([(gw, w), (torch.ones(2), b)], global_step=global_step)
    assert not bool(applied)
    _assert_same_snapshot(before, _snapshot(opt))  # weights, exp_avg(_sq) and step counts untouched
    assert int(global_step) == 1
    assert float(opt.loss_scale) == 32 and int(opt.dynamic_counter) == 0  # the scale is updated either way
    # and the next good step continues as if the bad one never happened
    opt.apply_gradients([(torch.ones(4), w), (torch.ones(2), b)], global_step=global_step)
    assert int(global_step) == 2
    assert all(float(s["step"]) == 2 for s in opt.state.values())


def test_apply_gradients_skips_in_fixed_mode_too():
    w = param(1.0, 2.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5, momentum=0.9), dynamic=False, initial_scale=128)
    opt.apply_gradients([(torch.tensor([math.nan, 1.0]), w)])
    assert w.tolist() == [1.0, 2.0]
    assert all("momentum_buffer" not in s for s in opt.state.values())
    assert float(opt.loss_scale) == 128


@pytest.mark.parametrize("manager", [FixedLossScaleManager(5000), ExponentialUpdateLossScaleManager(100, 1000)])
def test_apply_gradients_skips_with_managers(manager):
    w = param(1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5), loss_scale=manager)
    opt.apply_gradients([(torch.tensor([math.inf]), w)])
    opt.apply_gradients([(torch.tensor([math.inf]), w)])
    assert w.item() == 1.0
    expected = 5000.0 if not manager.dynamic else 80.0  # contrib: 0.8 after 2 bad steps
    assert float(opt.loss_scale) == pytest.approx(expected, rel=1e-7)


def test_nan_and_inf_count_alike():
    results = []
    for bad in NONFINITE:
        w = param(1.0, 1.0)
        opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5), initial_scale=16, dynamic_growth_steps=3)
        for g in ([1.0, 1.0], [1.0, 1.0], [bad, 1.0], [1.0, bad], [1.0, 1.0]):
            opt.apply_gradients([(torch.tensor(g), w)])
        results.append((w.tolist(), float(opt.loss_scale), int(opt.dynamic_counter), int(opt.skipped_steps)))
    assert results[0] == results[1] == results[2] == ([-0.5, -0.5], 4.0, 1, 2)


def test_apply_gradients_keeps_existing_dot_grad():
    w, v = param(1.0), param(2.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w, v], lr=0.5))
    w.grad = torch.tensor([123.0])
    opt.apply_gradients([(torch.tensor([1.0]), w)])
    assert w.item() == 0.5 and v.item() == 2.0  # only variables given a gradient move
    assert w.grad.item() == 123.0 and v.grad is None


def test_apply_gradients_errors():
    w = param(1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5))
    with pytest.raises(ValueError, match="not a parameter of the inner optimizer.*add_param_group"):
        opt.apply_gradients([(torch.ones(1), torch.nn.Parameter(torch.ones(1)))])
    with pytest.raises(ValueError, match="No gradients provided for any variable"):
        opt.apply_gradients([(None, w)])
    with pytest.raises(TypeError, match="global_step must be a tensor"):
        opt.apply_gradients([(torch.ones(1), w)], global_step=3)
    assert w.item() == 1.0


# ----------------------------------------------------------------------------- minimize


def test_minimize_tensor_loss_global_step_and_skip():
    w = param(1.0, -1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.25), initial_scale=2, dynamic_growth_steps=1)
    step = torch.zeros((), dtype=torch.int32)
    assert bool(opt.minimize((w**2).sum(), global_step=step))
    assert w.tolist() == [0.5, -0.5] and int(step) == 1 and float(opt.loss_scale) == 4
    assert not bool(opt.minimize((w * math.inf).sum(), global_step=step))
    assert w.tolist() == [0.5, -0.5] and int(step) == 1 and float(opt.loss_scale) == 2


def test_minimize_var_list_and_grad_loss():
    w, v = param(1.0), param(1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w, v], lr=1.0))
    opt.minimize(lambda: w * 2 + v * 3, var_list=[v], grad_loss=torch.tensor([0.5]))
    assert w.item() == 1.0 and v.item() == -0.5


# ----------------------------------------------------------------------------- slots and variables


def test_slots_adam():
    w, b, inner, opt = _adam_setup(False)
    assert opt.get_slot_names() == [] and opt.get_slot(w, "exp_avg") is None
    opt.apply_gradients([(torch.ones(4), w)])
    assert opt.get_slot_names() == ["exp_avg", "exp_avg_sq"]
    assert opt.get_slot(w, "exp_avg") is inner.state[w]["exp_avg"]
    assert opt.get_slot(w, "nope") is None and opt.get_slot(b, "exp_avg") is None


def test_slots_sgd_momentum_and_variables():
    w = param(1.0, 2.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1, momentum=0.9))
    opt.apply_gradients([(torch.ones(2), w)])
    assert opt.get_slot_names() == ["momentum_buffer"]
    buf = opt.get_slot(w, "momentum_buffer")
    assert buf.tolist() == [1.0, 1.0]
    variables = opt.variables()
    assert all(isinstance(v, torch.Tensor) for v in variables)
    assert any(v is buf for v in variables)
    # the loss-scale state is among the variables: the scale, then int32 counters
    scales = [v for v in variables if v.dtype == torch.float32 and v.dim() == 0]
    assert any(float(s) == float(opt.loss_scale) for s in scales)


# ----------------------------------------------------------------------------- seed 000's v1 signatures


def test_seed_000_gate_constants_and_get_name():
    assert (LossScaleOptimizer.GATE_NONE, LossScaleOptimizer.GATE_OP, LossScaleOptimizer.GATE_GRAPH) == (0, 1, 2)
    w = param(1.0)
    # TF: the inner optimizer's name (GradientDescentOptimizer -> "GradientDescent"); torch's: its class name
    assert LossScaleOptimizer(torch.optim.SGD([w], lr=0.5), "dynamic").get_name() == "SGD"
    assert LossScaleOptimizer(torch.optim.AdamW([param(1.0)]), 128).get_name() == "AdamW"


def test_seed_000_compute_gradients_takes_tf_v1_arguments_positionally():
    w, v = param(1.0, 2.0), param(3.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w, v], lr=0.5), initial_scale=2.0**10)
    loss = lambda: (w * w).sum() + v.sum()
    # (loss, var_list, gate_gradients, aggregation_method, colocate_gradients_with_ops, grad_loss)
    pairs = opt.compute_gradients(loss, [w, v], opt.GATE_GRAPH, None, True, torch.tensor(0.5))
    assert [g.tolist() for g, _ in pairs] == [[1.0, 2.0], [0.5]] and pairs[0][1] is w and pairs[1][1] is v
    for gate in (opt.GATE_NONE, opt.GATE_OP):
        assert opt.compute_gradients(loss, var_list=[w], gate_gradients=gate)[0][0].tolist() == [2.0, 4.0]
    with pytest.raises(ValueError, match="gate_gradients must be one of"):
        opt.compute_gradients(loss, var_list=[w], gate_gradients=3)


def test_seed_000_empty_var_list_is_a_value_error():
    # TF: ValueError("No variables to optimize."), not autograd's RuntimeError
    w = param(1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5))
    with pytest.raises(ValueError, match="No variables to optimize"):
        opt.compute_gradients(lambda: w.sum(), var_list=[])
    with pytest.raises(ValueError, match="No variables to optimize"):
        opt.minimize(lambda: w.sum(), var_list=())
    w.requires_grad_(False)
    with pytest.raises(ValueError, match="No variables to optimize"):
        opt.minimize(lambda: (w * 2).sum())
    assert w.item() == 1.0


def test_seed_000_minimize_tf_v1_order_and_name():
    w = param(1.0, -1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.25), initial_scale=2, dynamic_growth_steps=1)
    step = torch.zeros((), dtype=torch.int64)
    # (loss, global_step, var_list, gate_gradients, aggregation_method, colocate_gradients_with_ops, name, grad_loss)
    applied = opt.minimize(lambda: (w**2).sum(), step, [w], opt.GATE_OP, None, False, "train", torch.tensor(2.0))
    assert bool(applied) and w.tolist() == [0.0, 0.0] and int(step) == 1 and float(opt.loss_scale) == 4
    # Keras' order, minimize(loss, var_list), still works
    assert bool(opt.minimize(lambda: (w - 1).sum(), [w])) and w.tolist() == [-0.25, -0.25] and int(step) == 1
    assert bool(opt.minimize(lambda: (w - 1).sum(), [w], step, name=None)) and int(step) == 2
    assert w.tolist() == [-0.5, -0.5]
    assert not bool(opt.minimize(lambda: (w * math.inf).sum(), step, name="train"))
    assert w.tolist() == [-0.5, -0.5] and int(step) == 2
    with pytest.raises(TypeError, match="name must be a string or None"):
        opt.minimize(lambda: w.sum(), step, name=1)
    with pytest.raises(TypeError, match="global_step must be a tensor"):
        opt.minimize(lambda: w.sum(), [w], [w])


def test_seed_000_apply_gradients_name():
    w = param(1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5))
    step = torch.zeros((), dtype=torch.int64)
    assert bool(opt.apply_gradients([(torch.ones(1), w)], step, "apply")) and w.item() == 0.5 and int(step) == 1
    with pytest.raises(TypeError, match="name must be a string or None"):
        opt.apply_gradients([(torch.ones(1), w)], name=3)
    assert w.item() == 0.5


@pytest.mark.parametrize("bad", [1.0, "sgd", None])
def test_seed_000_non_optimizer_is_value_error_and_type_error(bad):
    # TF v1's MixedPrecisionLossScaleOptimizer raised ValueError, Keras' LossScaleOptimizer TypeError
    for error in (ValueError, TypeError):
        with pytest.raises(error, match="optimizer must be a torch.optim.Optimizer instance"):
            LossScaleOptimizer(bad, "dynamic")


# ----------------------------------------------------------------------------- seed 004: contrib's form


def test_seed_004_loss_scale_manager_keyword():
    w = param(1.0)
    manager = FixedLossScaleManager(5000)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5), loss_scale_manager=manager)
    assert opt.loss_scale_policy is manager and float(opt.loss_scale) == 5000
    assert bool(opt.minimize(lambda: w.sum())) and w.item() == 0.5
    with pytest.raises(TypeError, match="not both"):
        LossScaleOptimizer(torch.optim.SGD([param(1.0)], lr=0.5), 8, loss_scale_manager=manager)


def test_seed_004_exponential_manager_trajectory_through_minimize():
    # contrib: good steps reset on a non-finite step, bad steps only when the scale changes
    w = param(1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.0),
                             loss_scale_manager=ExponentialUpdateLossScaleManager(8, 3, 2, incr_ratio=2, decr_ratio=0.5))
    pattern = [1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1]
    scales = []
    for finite in pattern:
        opt.minimize(lambda f=finite: w.sum() * (1.0 if f else math.inf))
        scales.append(float(opt.loss_scale))
    assert scales == [8, 8, 8, 8, 8, 16, 16, 16, 8, 8, 4, 4, 4, 8]


def test_seed_000_minimize_matches_tf_v1_recorded_trajectory():
    # Recorded from tensorflow 2.21: tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
    #   GradientDescentOptimizer(0.25), DynamicLossScale(8, 2, 2)).minimize(loss, global_step=gs, var_list=[w]),
    # (loss scale, global_step, w) after each step; a non-finite step leaves w and global_step alone.
    tf_recorded = [(8.0, 1, 0.75), (16.0, 2, 0.5), (8.0, 2, 0.5), (8.0, 3, 0.25), (16.0, 4, 0.0), (16.0, 5, -0.25),
                   (8.0, 5, -0.25), (4.0, 5, -0.25), (4.0, 6, -0.5), (8.0, 7, -0.75), (8.0, 8, -1.0),
                   (16.0, 9, -1.25), (8.0, 9, -1.25)]
    w = param(1.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.25), DynamicLossScale(8, 2, 2))
    gs = torch.zeros((), dtype=torch.int64)
    seen = []
    for finite in [1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0]:
        opt.minimize(lambda f=finite: w.sum() * (1.0 if f else math.inf), gs, [w])  # TF v1's positional order
        seen.append((float(opt.loss_scale), int(gs), w.item()))
    assert seen == tf_recorded


def test_apply_gradients_malformed_pairs_are_clear_errors_and_change_nothing():
    w = param(1.0, 2.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5), initial_scale=8, dynamic_growth_steps=1)
    with pytest.raises(TypeError, match=r"gradient must be a tensor or None, got list.*torch.as_tensor"):
        opt.apply_gradients([([1.0, 2.0], w)])
    with pytest.raises(ValueError, match="A variable of type float is not a parameter of the inner optimizer"):
        opt.apply_gradients([(torch.ones(2), 3.0)])
    with pytest.raises(ValueError, match=r"gradient of shape \(3,\) was given for a variable of shape \(2,\)"):
        opt.apply_gradients([(torch.ones(3), w)])
    # one .grad per parameter: the second gradient used to replace the first silently (TF applied both)
    with pytest.raises(ValueError, match="appears twice in grads_and_vars; sum its gradients"):
        opt.apply_gradients([(torch.ones(2), w), (torch.ones(2), w)])
    assert w.tolist() == [1.0, 2.0] and float(opt.loss_scale) == 8 and int(opt.dynamic_counter) == 0


def test_compute_gradients_non_scalar_loss_is_its_sum_as_in_tf():
    # TF (recorded, 2.21): compute_gradients(lambda: w * 2, [w]) -> [2., 2.]
    w = param(1.0, 2.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5), initial_scale=2.0**10)
    (g, var), = opt.compute_gradients(lambda: w * 2, var_list=[w])
    assert var is w and g.tolist() == [2.0, 2.0]
    assert bool(opt.minimize(lambda: w * w)) and w.tolist() == [0.0, 0.0]


def test_get_slot_takes_tf_slot_names():
    # TF (recorded, 2.21): MomentumOptimizer(0.1, 0.9).minimize(sum(w*w)) with w=[1, 2] -> slot "momentum" [2, 4]
    w = param(1.0, 2.0)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1, momentum=0.9), 128)
    opt.minimize(lambda: (w * w).sum(), var_list=[w])
    assert opt.get_slot(w, "momentum").tolist() == [2.0, 4.0]
    assert opt.get_slot(w, "momentum") is opt.get_slot(w, "momentum_buffer")
    assert opt.get_slot_names() == ["momentum_buffer"] and opt.get_slot(w, "m") is None
    v = param(1.0)
    adam = LossScaleOptimizer(torch.optim.Adam([v], amsgrad=True), 8)
    adam.apply_gradients([(torch.ones(1), v)])
    state = adam.inner_optimizer.state[v]
    assert [adam.get_slot(v, n) for n in ("m", "v", "vhat")] == [state[k] for k in ("exp_avg", "exp_avg_sq",
                                                                                     "max_exp_avg_sq")]
    assert adam.get_slot(v, "momentum") is None
