"""torch.amp.GradScaler's own behaviours, run against every GradScaler under test (``scaler_factory``), on CPU.

Ported (re-written, not copied) from the behaviours that torch's grad-scaling
tests check (test/test_cuda.py and test/test_torch.py ``test_grad_scaling_*``)
and from the contract of ``torch/amp/grad_scaler.py``: scaling tensors and
nested lists/tuples, ``unscale_``/``step``/``update`` ordering and their error
messages, ``state_dict`` keys and round trips (across implementations and
through ``torch.load(weights_only=True)``), the disabled pass-through, several
optimizers with one ``update``, ``update(new_scale=...)``, the growth/backoff
getters and setters, argument forwarding to ``optimizer.step``, fused
optimizers, and a control run against a scaled run with an Inf at a known step.

Where lossscale deliberately differs, the test checks each implementation's own
contract (``scaler_factory.is_lossscale``):

* TF's floor of 1: torch lets a backoff take the scale below 1, lossscale stops
  at 1 (``min_loss_scale=1`` by default).
* growth only while the grown scale stays finite: torch 2.13's
  ``_amp_update_scale_`` already refuses to grow past float32's maximum, so this
  one is the same for both and is checked for both.
"""

from __future__ import annotations

import math

import pytest
import torch

TORCH_KEYS = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}


def _param_and_sgd(value=1.0, n=3, lr=0.5, **kwargs):
    param = torch.nn.Parameter(torch.full((n,), value))
    return param, torch.optim.SGD([param], lr=lr, **kwargs)


def _backward(scaler, param, grad_value=1.0):
    """Gives ``param`` the scaled gradient of ``grad_value * sum(param)`` (or Inf)."""
    loss = (param * grad_value).sum()
    scaler.scale(loss).backward()


def _one_step(scaler, param, optimizer, grad_value=1.0):
    optimizer.zero_grad()
    _backward(scaler, param, grad_value)
    out = scaler.step(optimizer)
    scaler.update()
    return out


# ---- scale ---------------------------------------------------------------------------------------------------------


def test_scale_multiplies_a_tensor_without_touching_it(scaler_factory):
    scaler = scaler_factory(init_scale=2.0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        t = torch.full((2,), 4.0, dtype=dtype)
        out = scaler.scale(t)
        assert out.dtype == dtype and torch.equal(out, torch.full((2,), 8.0, dtype=dtype))
        assert torch.equal(t, torch.full((2,), 4.0, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scale_of_a_0d_half_loss_is_float32_as_torchs_promotion(scaler_factory, dtype):
    """A 0-d float16 loss (``model(x).mean()`` under float16 autocast) times the 0-d float32 scale is float32 in
    torch: 2.0 * 2**16 stays finite, where a product rounded back to float16 would be Inf. A tensor with a
    dimension keeps its dtype (the scale is 0-d); the gradients are those of torch either way."""
    scaler = scaler_factory()
    leaf = torch.tensor(2.0, requires_grad=True)
    scaled = scaler.scale(leaf.to(dtype))
    assert scaled.dtype == torch.float32 and float(scaled) == 2.0 * 2.0**16
    scaled.backward()
    assert float(leaf.grad) == (math.inf if dtype == torch.float16 else 2.0**16)  # 2**16 is Inf in float16
    scaled_list = scaler.scale([torch.tensor(3.0, dtype=dtype), torch.full((1,), 3.0, dtype=dtype)])
    assert [t.dtype for t in scaled_list] == [torch.float32, dtype]
    assert [float(t) for t in scaled_list] == [3.0 * 2.0**16, 3.0 * 2.0**16 if dtype == torch.bfloat16 else math.inf]


def test_scale_keeps_nested_list_and_tuple_structure(scaler_factory):
    scaler = scaler_factory(init_scale=2.0)
    t0, t1 = torch.full((1,), 4.0), torch.full((1,), 4.0)
    outputs = scaler.scale((t1.clone(), (t0.clone(), t1.clone()), [t0.clone(), (t1.clone(), t0.clone())]))
    assert type(outputs) is tuple and type(outputs[1]) is tuple and type(outputs[2]) is list
    assert type(outputs[2][1]) is tuple
    flat = [outputs[0], *outputs[1], outputs[2][0], *outputs[2][1]]
    assert all(torch.equal(t, torch.full((1,), 8.0)) for t in flat)


def test_scale_rejects_what_is_not_a_tensor(scaler_factory):
    scaler = scaler_factory(init_scale=2.0)
    with pytest.raises(ValueError, match="Tensor"):
        scaler.scale([torch.ones(1), 3.0])


# ---- unscale_ / step / update ordering -----------------------------------------------------------------------------


@pytest.mark.parametrize("call", ["step", "unscale_"])
def test_step_or_unscale_before_any_scale_raises_as_torch_does(scaler_factory, call):
    """Gradients that no scale() scaled (a forgotten scaler.scale(loss)) are refused, not divided by S silently:
    torch asserts that its _scale exists (AssertionError); lossscale's error is that and a RuntimeError, in torch's
    words."""
    scaler = scaler_factory(init_scale=4.0)
    param, optimizer = _param_and_sgd()
    param.sum().backward()
    with pytest.raises(AssertionError, match=r"did not use scaler\.scale\(loss or outputs\)") as info:
        getattr(scaler, call)(optimizer)
    assert isinstance(info.value, RuntimeError) == scaler_factory.is_lossscale
    torch.testing.assert_close(param.detach(), torch.ones(3))
    _one_step(scaler, param, optimizer)  # scaled from here on: steps as usual
    torch.testing.assert_close(param.detach(), torch.full((3,), 0.5))


@pytest.mark.parametrize("kwargs", [{"growth_factor": 1.0}, {"backoff_factor": 1.0}], ids=["growth", "backoff"])
def test_factors_torch_refuses_raise_its_assertion_error(scaler_factory, kwargs):
    """``except AssertionError`` around torch's constructor catches lossscale's refusal too (also a ValueError)."""
    with pytest.raises(AssertionError, match="factor") as info:
        scaler_factory(**kwargs)
    assert isinstance(info.value, ValueError) == scaler_factory.is_lossscale


def test_misuse_torch_asserts_raises_an_assertion_error(scaler_factory):
    """A malformed ``update(new_scale)`` and pickling mid-iteration: torch's AssertionError, for both."""
    import pickle

    scaler = scaler_factory(init_scale=4.0)
    param, optimizer = _param_and_sgd()
    _backward(scaler, param)
    scaler.step(optimizer)
    with pytest.raises(AssertionError, match="pickled"):
        pickle.dumps(scaler)
    with pytest.raises(AssertionError, match="new_scale"):
        scaler.update(torch.tensor(8.0, requires_grad=True))
    scaler.update()
    assert scaler.get_scale() == 4.0 and pickle.loads(pickle.dumps(scaler)).get_scale() == 4.0


def test_a_disabled_scaler_takes_settings_an_enabled_one_refuses(scaler_factory):
    """``GradScaler(enabled=use_fp16, **config)``: torch validates nothing when disabled, so a bf16 or fp32 run with
    a config meant for fp16 (or a bad one) still builds, and every call passes through."""
    scaler = scaler_factory(growth_factor=1.0, growth_interval=0, enabled=False)
    loss = torch.tensor(3.0)
    assert not scaler.is_enabled() and scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    param, optimizer = _param_and_sgd()
    param.sum().backward()
    scaler.step(optimizer)
    scaler.update()
    torch.testing.assert_close(param.detach(), torch.full((3,), 0.5))


def test_found_inf_per_device_is_what_step_reads(scaler_factory):
    """The distributed idiom: after unscale_, all-reduce (MAX) each of _found_inf_per_device(opt)'s flags in place;
    a rank whose own gradients are finite then skips with the others. _growth_tracker and _get_scale_async are the
    live state."""
    scaler = scaler_factory(init_scale=4.0, growth_interval=100)
    param, optimizer = _param_and_sgd()
    _one_step(scaler, param, optimizer)
    tracker = scaler._growth_tracker
    assert tracker.dtype == torch.int32 and tracker.ndim == 0 and int(tracker) == 1
    assert float(scaler._get_scale_async()) == 4.0
    optimizer.zero_grad()
    _backward(scaler, param)
    assert scaler._found_inf_per_device(optimizer) == {}  # nothing checked yet
    scaler.unscale_(optimizer)
    flags = scaler._found_inf_per_device(optimizer)
    assert list(flags) == [torch.device("cpu")] and float(flags[torch.device("cpu")]) == 0.0
    for flag in flags.values():
        flag.fill_(1.0)  # as dist.all_reduce(flag, MAX) would, another rank having overflowed
    before = param.detach().clone()
    scaler.step(optimizer)
    scaler.update()
    torch.testing.assert_close(param.detach(), before)  # skipped
    assert scaler.get_scale() == 2.0 and int(scaler._growth_tracker) == 0


def test_unscale_twice_raises_as_torch_does(scaler_factory):
    scaler = scaler_factory(init_scale=4.0)
    param, optimizer = _param_and_sgd()
    _backward(scaler, param)
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called on this optimizer since the last "
                       r"update\(\)\."):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) is being called after step\(\)\."):
        scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match=r"step\(\) has already been called since the last update\(\)\."):
        scaler.step(optimizer)
    scaler.update()
    _backward(scaler, param)
    scaler.unscale_(optimizer)  # a new iteration after update() may unscale again


def test_step_after_unscale_applies_the_gradient_unscaled_once(scaler_factory):
    scaler = scaler_factory(init_scale=8.0)
    param, optimizer = _param_and_sgd(lr=0.5)
    _backward(scaler, param, grad_value=3.0)
    assert torch.equal(param.grad, torch.full((3,), 24.0))  # scaled
    scaler.unscale_(optimizer)
    assert torch.equal(param.grad, torch.full((3,), 3.0))
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(param.detach(), torch.full((3,), 1.0 - 0.5 * 3.0))
    assert scaler.get_scale() == 8.0


def test_clipping_between_unscale_and_step_sees_unscaled_gradients(scaler_factory):
    scaler = scaler_factory(init_scale=2.0**10)
    param, optimizer = _param_and_sgd(lr=1.0, n=4, value=0.0)
    _backward(scaler, param, grad_value=3.0)  # gradient norm 6
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_([param], max_norm=1.5)
    assert float(norm) == pytest.approx(6.0)
    scaler.step(optimizer)
    scaler.update()
    assert torch.allclose(param.detach(), torch.full((4,), -0.75))


# ---- dynamic trajectory: control vs scaled, Inf at a known step ----------------------------------------------------


def test_scale_trajectory_and_skip_match_an_unscaled_control(scaler_factory):
    # growth_interval 2, growth 2, backoff 0.5, Inf at step 3.
    scaler = scaler_factory(init_scale=4.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
    param, optimizer = _param_and_sgd(lr=0.1, momentum=0.9)
    control, control_opt = _param_and_sgd(lr=0.1, momentum=0.9)
    scales, trackers = [], []
    for step in range(6):
        grad_value = math.inf if step == 3 else 1.0 + step
        _one_step(scaler, param, optimizer, grad_value)
        if step != 3:
            control_opt.zero_grad()
            (control * grad_value).sum().backward()
            control_opt.step()
        scales.append(scaler.get_scale())
        trackers.append(scaler.state_dict()["_growth_tracker"])
        assert torch.allclose(param.detach(), control.detach(), rtol=0, atol=1e-6), step
    assert scales == [4.0, 8.0, 8.0, 4.0, 4.0, 8.0]
    assert trackers == [1, 0, 1, 0, 1, 0]


def test_backoff_below_one(scaler_factory):
    scaler = scaler_factory(init_scale=1.0, backoff_factor=0.5)
    param, optimizer = _param_and_sgd()
    _one_step(scaler, param, optimizer, math.inf)
    if scaler_factory.is_lossscale:
        assert scaler.get_scale() == 1.0  # deliberate difference: TF's floor of 1 (min_loss_scale)
    else:
        assert scaler.get_scale() == 0.5  # torch has no floor


def test_growth_stops_short_of_inf(scaler_factory):
    big = float(torch.finfo(torch.float32).max) / 1.5
    scaler = scaler_factory(init_scale=big, growth_factor=2.0, growth_interval=1)
    param, optimizer = _param_and_sgd()
    _one_step(scaler, param, optimizer, 0.0)
    assert scaler.get_scale() == pytest.approx(big, rel=1e-6) and math.isfinite(scaler.get_scale())
    assert scaler.state_dict()["_growth_tracker"] == 0


# ---- several optimizers, one update ---------------------------------------------------------------------------------


@pytest.mark.parametrize("inf_in", [(), (0,), (1,), (0, 1)])
def test_several_optimizers_one_update(scaler_factory, inf_in):
    scaler = scaler_factory(init_scale=8.0, growth_interval=1)
    pairs = [_param_and_sgd(lr=0.5), _param_and_sgd(lr=0.25)]
    for i, (param, _) in enumerate(pairs):
        _backward(scaler, param, math.inf if i in inf_in else 1.0)
    for _, optimizer in pairs:
        scaler.step(optimizer)
    scaler.update()
    for i, ((param, optimizer), lr) in enumerate(zip(pairs, (0.5, 0.25))):
        expected = 1.0 if i in inf_in else 1.0 - lr
        assert torch.equal(param.detach(), torch.full((3,), expected)), i
    # One update per iteration: one backoff however many optimizers saw an Inf, growth only when none did.
    assert scaler.get_scale() == (4.0 if inf_in else 16.0)


# ---- update(new_scale) and the factor accessors --------------------------------------------------------------------


def test_update_new_scale_float_or_tensor(scaler_factory):
    scaler = scaler_factory(init_scale=8.0)
    param, optimizer = _param_and_sgd()
    _backward(scaler, param)
    scaler.step(optimizer)
    scaler.update(new_scale=256.0)
    assert scaler.get_scale() == 256.0
    new_scale = torch.tensor(32.0)
    scaler.update(new_scale=new_scale)
    new_scale.fill_(1.0)  # later in-place changes do not reach the scaler
    assert scaler.get_scale() == 32.0
    assert torch.equal(scaler.scale(torch.tensor(2.0)), torch.tensor(64.0))
    with pytest.raises((AssertionError, ValueError), match="new_scale"):
        scaler.update(new_scale=torch.tensor([1.0, 2.0]))


def test_growth_and_backoff_accessors_drive_the_next_update(scaler_factory):
    scaler = scaler_factory(init_scale=8.0)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (2.0, 0.5, 2000)
    scaler.set_growth_factor(3.0)
    scaler.set_backoff_factor(0.25)
    scaler.set_growth_interval(1)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (3.0, 0.25, 1)
    param, optimizer = _param_and_sgd()
    _one_step(scaler, param, optimizer)
    assert scaler.get_scale() == 24.0
    _one_step(scaler, param, optimizer, math.inf)
    assert scaler.get_scale() == 6.0
    state = scaler.state_dict()
    assert (state["growth_factor"], state["backoff_factor"], state["growth_interval"]) == (3.0, 0.25, 1)


def test_is_enabled_and_default_constructor_values(scaler_factory):
    scaler = scaler_factory()
    assert scaler.is_enabled() is True
    assert scaler.get_scale() == 2.0**16  # before the first scale(), get_scale() reports init_scale
    assert scaler_factory(enabled=False).is_enabled() is False


# ---- state_dict ----------------------------------------------------------------------------------------------------


def _plain(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, torch.Tensor))


def test_state_dict_keys_and_plain_values(scaler_factory):
    scaler = scaler_factory(init_scale=3.0, growth_factor=4.0, backoff_factor=0.5, growth_interval=2)
    state = scaler.state_dict()
    if scaler_factory.is_lossscale:
        assert TORCH_KEYS <= state.keys()  # torch's five keys, plus lossscale's own
    else:
        assert state.keys() == TORCH_KEYS
    assert state["scale"] == 3.0 and state["growth_factor"] == 4.0 and state["backoff_factor"] == 0.5
    assert state["growth_interval"] == 2 and state["_growth_tracker"] == 0
    assert isinstance(state["scale"], float) and isinstance(state["_growth_tracker"], int)
    assert _plain(state), state


@pytest.mark.parametrize("lazy_init_scale", [True, False], ids=["scaled-before", "never-scaled"])
def test_load_state_dict_overwrites_everything(scaler_factory, lazy_init_scale):
    s0 = scaler_factory(init_scale=3.0, growth_factor=4.0, backoff_factor=0.5, growth_interval=2)
    s1 = scaler_factory(init_scale=6.0, growth_factor=7.0, backoff_factor=0.8, growth_interval=1)
    if lazy_init_scale:
        assert torch.equal(s1.scale(torch.full((1,), 4.0)), torch.full((1,), 24.0))
    s1.load_state_dict(s0.state_dict())
    assert (s1.get_scale(), s1.get_growth_factor(), s1.get_backoff_factor(), s1.get_growth_interval()) == (
        3.0, 4.0, 0.5, 2)
    assert s1.state_dict()["_growth_tracker"] == 0
    assert torch.equal(s1.scale(torch.full((1,), 4.0)), torch.full((1,), 12.0))


def test_resume_from_state_dict_continues_the_same_trajectory(scaler_factory, tmp_path):
    kwargs = {"init_scale": 4.0, "growth_interval": 3}
    scaler, reference = scaler_factory(**kwargs), scaler_factory(**kwargs)
    param, optimizer = _param_and_sgd(lr=0.01)
    ref_param, ref_optimizer = _param_and_sgd(lr=0.01)
    for _ in range(2):
        _one_step(scaler, param, optimizer)
        _one_step(reference, ref_param, ref_optimizer)
    assert scaler.state_dict()["_growth_tracker"] == 2
    torch.save(scaler.state_dict(), tmp_path / "scaler.pt")
    resumed = scaler_factory()
    resumed.load_state_dict(torch.load(tmp_path / "scaler.pt", weights_only=True))
    for step in range(4):
        _one_step(resumed, param, optimizer, math.inf if step == 2 else 1.0)
        _one_step(reference, ref_param, ref_optimizer, math.inf if step == 2 else 1.0)
        assert resumed.get_scale() == reference.get_scale(), step
        assert resumed.state_dict() == reference.state_dict(), step
    assert reference.get_scale() == 4.0  # grew to 8 at step 0, backed off at step 2


def test_state_dicts_cross_between_torch_and_the_scaler_under_test(scaler_factory):
    theirs = torch.amp.GradScaler("cpu", init_scale=3.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=5)
    param, optimizer = _param_and_sgd()
    for _ in range(2):
        _one_step(theirs, param, optimizer)
    ours = scaler_factory()
    ours.load_state_dict(theirs.state_dict())
    assert {k: ours.state_dict()[k] for k in TORCH_KEYS} == theirs.state_dict()
    back = torch.amp.GradScaler("cpu")
    back.load_state_dict(ours.state_dict())  # torch reads its five keys and ignores the rest
    assert back.state_dict() == theirs.state_dict()


@pytest.mark.parametrize("bad", [False, True], ids=["finite", "inf"])
@pytest.mark.parametrize("where", ["after_unscale", "after_step"])
def test_a_load_mid_iteration_keeps_the_iterations_checks(scaler_factory, where, bad):
    """torch's load_state_dict leaves the per-optimizer state alone: gradients unscaled before the load are not
    unscaled again by step() (by the loaded scale), and update() counts the check made before the load, from the
    loaded scale and growth counter."""
    saved = {"scale": 4.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3, "_growth_tracker": 2}
    scaler = scaler_factory(init_scale=8.0)
    param, optimizer = _param_and_sgd(n=2, lr=0.5)
    _backward(scaler, param, math.inf if bad else 1.0)
    if where == "after_unscale":
        scaler.unscale_(optimizer)
        scaler.load_state_dict(saved)
        scaler.step(optimizer)
    else:
        scaler.step(optimizer)
        scaler.load_state_dict(saved)
    scaler.update()
    assert torch.equal(param.detach(), torch.full((2,), 1.0 if bad else 0.5))  # the gradient 1, applied once
    # a skip backs the loaded 4 off to 2; a finite step is the third of 3: the loaded 4 grows to 8
    assert (scaler.get_scale(), scaler.state_dict()["_growth_tracker"]) == ((2.0, 0) if bad else (8.0, 0))


def test_load_state_dict_refuses_an_empty_one(scaler_factory):
    with pytest.raises(RuntimeError, match="The source state dict is empty"):
        scaler_factory().load_state_dict({})


# ---- enabled=False: a pass-through ---------------------------------------------------------------------------------


def test_disabled_scaler_is_a_pass_through(scaler_factory):
    scaler = scaler_factory(enabled=False)
    t = torch.full((2,), 4.0)
    assert scaler.scale(t) is t
    nested = [t, (t,)]
    assert scaler.scale(nested) is nested
    assert scaler.state_dict() == {}
    assert scaler.get_scale() == 1.0 and scaler.is_enabled() is False
    param, optimizer = _param_and_sgd(lr=0.5)
    param.grad = torch.full((3,), math.inf)
    scaler.unscale_(optimizer)  # no-op
    assert torch.equal(param.grad, torch.full((3,), math.inf))
    scaler.step(optimizer)  # steps unconditionally, Inf and all
    scaler.update()
    assert torch.equal(param.detach(), torch.full((3,), -math.inf))
    scaler.load_state_dict(scaler_factory(init_scale=8.0).state_dict())  # no-op
    assert scaler.state_dict() == {}


def test_disabled_scaler_forwards_a_closure(scaler_factory):
    scaler = scaler_factory(enabled=False)
    param, optimizer = _param_and_sgd(lr=0.5)

    def closure():
        optimizer.zero_grad()
        loss = param.sum()
        loss.backward()
        return loss

    assert float(scaler.step(optimizer, closure=closure).detach()) == 3.0
    assert torch.equal(param.detach(), torch.full((3,), 0.5))


# ---- forwarding to optimizer.step ----------------------------------------------------------------------------------


class _Recording(torch.optim.SGD):
    """SGD that records the arguments its ``step`` gets."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.calls = []

    def step(self, closure=None, *args, **kwargs):
        self.calls.append((closure, args, kwargs))
        super().step()
        return "stepped"


def test_step_forwards_positional_and_keyword_arguments_and_returns_the_result(scaler_factory):
    scaler = scaler_factory(init_scale=2.0)
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = _Recording([param], lr=0.5)

    def closure():
        return None

    _backward(scaler, param)
    assert scaler.step(optimizer, closure, "extra", flag=True) == "stepped"
    scaler.update()
    assert optimizer.calls == [(closure, ("extra",), {"flag": True})]
    _backward(scaler, param, math.inf)
    assert scaler.step(optimizer, closure) is None  # skipped: optimizer.step is not called
    scaler.update()
    assert len(optimizer.calls) == 1


def test_step_calls_optimizer_step_through_the_attribute(scaler_factory):
    # accelerate and LR schedulers patch optimizer.step on the instance; the scaler must call the patched one.
    scaler = scaler_factory(init_scale=2.0)
    param, optimizer = _param_and_sgd(lr=0.5)
    calls = []
    original = optimizer.step

    def patched(*args, **kwargs):
        calls.append(True)
        return original(*args, **kwargs)

    optimizer.step = patched
    _one_step(scaler, param, optimizer)
    _one_step(scaler, param, optimizer, math.inf)
    assert calls == [True]


def test_keyword_closure_is_refused_when_enabled(scaler_factory):
    scaler = scaler_factory(init_scale=2.0)
    param, optimizer = _param_and_sgd()
    _backward(scaler, param)
    with pytest.raises(RuntimeError, match="Closure use is not currently supported if GradScaler is enabled."):
        scaler.step(optimizer, closure=lambda: None)


# ---- fused optimizers ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("unscale_first", [False, True], ids=["step", "unscale_then_step"])
def test_fused_optimizer_matches_the_unfused_reference_and_skips_on_inf(scaler_factory, unscale_first):
    scaler = scaler_factory(init_scale=2.0**8, growth_interval=1000)
    param = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 5))
    fused = torch.optim.AdamW([param], lr=0.1, fused=True)
    assert fused._step_supports_amp_scaling
    ref = torch.nn.Parameter(param.detach().clone())
    reference = torch.optim.AdamW([ref], lr=0.1)
    for step in range(4):
        grad_value = math.inf if step == 2 else 1.0 + step
        fused.zero_grad()
        _backward(scaler, param, grad_value)
        if unscale_first:
            scaler.unscale_(fused)
        before = param.detach().clone()
        scaler.step(fused)
        scaler.update()
        assert not hasattr(fused, "grad_scale") and not hasattr(fused, "found_inf")  # no stale scale left behind
        if step == 2:
            assert torch.equal(param.detach(), before)
            assert float(fused.state[param]["step"]) == 2.0  # the skipped step is not counted
        else:
            reference.zero_grad()
            (ref * grad_value).sum().backward()
            reference.step()
            assert torch.allclose(param.detach(), ref.detach(), rtol=0, atol=1e-6), step
    assert scaler.get_scale() == 2.0**7
