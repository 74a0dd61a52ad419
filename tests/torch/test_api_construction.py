"""`lossscale.torch.LossScaleOptimizer`: both constructor forms (seed 001), errors, attributes, configs."""

from __future__ import annotations

import gc

import pytest
import torch

from lossscale import DynamicLossScale, ExponentialUpdateLossScaleManager, FixedLossScale, FixedLossScaleManager
from lossscale.torch import LossScaleOptimizer, SharedLossScale


def sgd(lr: float = 0.1, **kwargs) -> torch.optim.SGD:
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=lr, **kwargs)


# ----------------------------------------------------------------------------- seed 001's equivalences


def test_dynamic_string_is_the_default():
    opt1 = LossScaleOptimizer(sgd(), loss_scale="dynamic")
    opt2 = LossScaleOptimizer(sgd())
    assert opt1.get_config() == opt2.get_config()
    assert opt2.dynamic is True and opt2.initial_scale == 2.0**15 and opt2.dynamic_growth_steps == 2000


def test_number_is_fixed_stable_form():
    opt1 = LossScaleOptimizer(sgd(), loss_scale=123)
    opt2 = LossScaleOptimizer(sgd(), dynamic=False, initial_scale=123)
    assert opt1.get_config() == opt2.get_config()
    assert opt2.dynamic is False and opt2.initial_scale == 123.0 and float(opt2.loss_scale) == 123.0


def test_dynamic_loss_scale_is_stable_form():
    opt1 = LossScaleOptimizer(sgd(), loss_scale=DynamicLossScale(initial_loss_scale=2048, increment_period=500))
    opt2 = LossScaleOptimizer(sgd(), initial_scale=2048, dynamic_growth_steps=500)
    assert opt1.get_config() == opt2.get_config()
    assert (opt2.dynamic, opt2.initial_scale, opt2.dynamic_growth_steps) == (True, 2048.0, 500)


def test_configs_differ_when_settings_differ():
    base = LossScaleOptimizer(sgd()).get_config()
    assert LossScaleOptimizer(sgd(), initial_scale=1024).get_config() != base
    assert LossScaleOptimizer(sgd(), dynamic_growth_steps=10).get_config() != base
    assert LossScaleOptimizer(sgd(lr=0.2)).get_config() != base


def test_get_config_keys():
    config = LossScaleOptimizer(sgd(), initial_scale=2048, dynamic_growth_steps=500).get_config()
    assert config["dynamic"] is True and config["initial_scale"] == 2048.0 and config["dynamic_growth_steps"] == 500
    fixed = LossScaleOptimizer(sgd(), dynamic=False, initial_scale=8).get_config()
    assert fixed["dynamic"] is False and fixed["initial_scale"] == 8.0 and fixed["dynamic_growth_steps"] is None


@pytest.mark.parametrize(
    "loss_scale,dynamic,initial,growth",
    [
        (FixedLossScaleManager(5000), False, 5000.0, None),
        (ExponentialUpdateLossScaleManager(1024, 100), True, 1024.0, 100),
        (FixedLossScale(4), False, 4.0, None),
        (DynamicLossScale(16, 3, 3.0), True, 16.0, 3),
        (DynamicLossScale(16, 3, max_loss_scale=64, hysteresis=2), True, 16.0, 3),
    ],
    ids=repr,
)
def test_managers_and_any_loss_scale(loss_scale, dynamic, initial, growth):
    opt = LossScaleOptimizer(sgd(), loss_scale=loss_scale)
    assert opt.dynamic is dynamic and opt.initial_scale == initial and opt.dynamic_growth_steps == growth
    assert float(opt.loss_scale) == initial
    assert opt.loss_scale_policy == loss_scale
    assert (opt.dynamic_counter is None) is (not dynamic)


# ----------------------------------------------------------------------------- errors


def test_fixed_without_initial_scale():
    with pytest.raises(ValueError, match=r"dynamic=False needs initial_scale.*initial_scale=1024"):
        LossScaleOptimizer(sgd(), dynamic=False)


def test_growth_steps_with_fixed():
    with pytest.raises(ValueError, match=r"dynamic_growth_steps only applies to a dynamic loss scale.*dynamic=True"):
        LossScaleOptimizer(sgd(), dynamic=False, initial_scale=8, dynamic_growth_steps=10)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loss_scale": "dynamic", "dynamic": True},
        {"loss_scale": 123, "initial_scale": 123},
        {"loss_scale": DynamicLossScale(), "dynamic_growth_steps": 5},
        {"loss_scale": 128, "dynamic": False, "initial_scale": 128},
    ],
    ids=repr,
)
def test_both_forms_at_once(kwargs):
    with pytest.raises(ValueError, match=r"Pass either loss_scale=.* not both"):
        LossScaleOptimizer(sgd(), **kwargs)


def test_shared_scale_with_stable_form():
    with pytest.raises(ValueError, match="SharedLossScale carries its own policy"):
        LossScaleOptimizer(sgd(), loss_scale=SharedLossScale(), initial_scale=4)


@pytest.mark.parametrize(
    "not_an_optimizer",
    [torch.nn.Linear(2, 2), [torch.nn.Parameter(torch.ones(1))], None, "sgd", torch.optim.SGD],
    ids=lambda v: type(v).__name__,
)
def test_non_optimizer_is_type_error(not_an_optimizer):
    with pytest.raises(TypeError, match=r"optimizer must be a torch.optim.Optimizer instance.*LossScaleOptimizer\("):
        LossScaleOptimizer(not_an_optimizer)


def test_wrapping_a_loss_scale_optimizer():
    opt = LossScaleOptimizer(sgd())
    with pytest.raises(TypeError, match="already a LossScaleOptimizer; wrapping it again would scale twice"):
        LossScaleOptimizer(opt)


def test_wrapping_an_already_wrapped_optimizer():
    inner = sgd()
    first = LossScaleOptimizer(inner)
    with pytest.raises(ValueError, match="already wrapped by another LossScaleOptimizer.*SharedLossScale"):
        LossScaleOptimizer(inner, loss_scale=8)
    assert first.inner_optimizer is inner
    # Once the first wrapper is gone, the optimizer may be wrapped again.
    del first
    gc.collect()
    assert LossScaleOptimizer(inner).inner_optimizer is inner


@pytest.mark.parametrize("value", ["yes", 1, None.__class__], ids=repr)
def test_dynamic_must_be_bool(value):
    with pytest.raises(TypeError, match="dynamic must be True or False"):
        LossScaleOptimizer(sgd(), dynamic=value)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"loss_scale": 0}, ValueError, "^loss_scale must be positive, got 0.0. .*loss_scale=2\\*\\*15"),
        ({"loss_scale": "static"}, ValueError, 'only string accepted is "dynamic"'),
        ({"loss_scale": object()}, ValueError, "Invalid loss scale"),
        ({"initial_scale": -1.0}, ValueError, "initial_scale must be positive"),
        ({"dynamic_growth_steps": 0}, ValueError, "dynamic_growth_steps must be an int in"),
        ({"dynamic": False, "initial_scale": 0.5}, ValueError, "at least 1"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_bad_values_name_the_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        LossScaleOptimizer(sgd(), **kwargs)


# ----------------------------------------------------------------------------- attributes


def test_attributes_dynamic():
    inner = sgd()
    opt = LossScaleOptimizer(inner, initial_scale=4, dynamic_growth_steps=2)
    assert opt.inner_optimizer is inner
    assert opt.dynamic is True and opt.dynamic_growth_steps == 2 and opt.initial_scale == 4.0
    counter = opt.dynamic_counter
    assert isinstance(counter, torch.Tensor) and int(counter) == 0
    scale = opt.loss_scale
    assert isinstance(scale, torch.Tensor) and scale.dtype == torch.float32 and scale.dim() == 0
    assert float(scale) == 4.0
    w = inner.param_groups[0]["params"][0]
    values = []
    for _ in range(3):
        opt.zero_grad()
        opt.get_scaled_loss(w.sum()).backward()
        opt.step()
        values.append((float(opt.loss_scale), int(opt.dynamic_counter)))
    assert values == [(4.0, 1), (8.0, 0), (8.0, 1)]
    assert opt.initial_scale == 4.0  # the initial scale does not move


def test_attributes_fixed():
    opt = LossScaleOptimizer(sgd(), dynamic=False, initial_scale=64)
    assert opt.dynamic is False
    assert opt.dynamic_counter is None and opt.dynamic_growth_steps is None
    assert opt.initial_scale == 64.0 == float(opt.loss_scale)
    assert opt.loss_scale.dtype == torch.float32 and opt.loss_scale.shape == ()


def test_loss_scale_is_a_copy():
    opt = LossScaleOptimizer(sgd(), initial_scale=4)
    opt.loss_scale.fill_(1000)
    assert float(opt.loss_scale) == 4.0
    if opt.dynamic_counter is not None:
        opt.dynamic_counter.fill_(7)
        assert int(opt.dynamic_counter) == 0


def test_repr_names_both():
    text = repr(LossScaleOptimizer(sgd(), loss_scale=8))
    assert text.startswith("LossScaleOptimizer(") and "SGD" in text and "FixedLossScale(loss_scale_value=8.0)" in text


def test_is_a_torch_optimizer():
    assert isinstance(LossScaleOptimizer(sgd()), torch.optim.Optimizer)


# ----------------------------------------------------------------------------- from_config


@pytest.mark.parametrize(
    "make_inner",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.3, momentum=0.9, nesterov=True),
        lambda ps: torch.optim.Adam(ps, lr=1e-3, betas=(0.8, 0.9)),
        lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, fused=True),
        lambda ps: torch.optim.LBFGS(ps, lr=0.5, max_iter=4),
        lambda ps: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.5),
        pytest.param(
            lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
        ),
    ],
    ids=["sgd", "adam", "adam-fused", "lbfgs", "rmsprop", "adamw-fused"],
)
@pytest.mark.parametrize(
    "scale_kwargs",
    [{}, {"loss_scale": 123}, {"initial_scale": 2048, "dynamic_growth_steps": 500},
     {"loss_scale": ExponentialUpdateLossScaleManager(8, 3, 4)}],
    ids=repr,
)
def test_from_config_round_trip(make_inner, scale_kwargs):
    params = [torch.nn.Parameter(torch.ones(2))]
    opt = LossScaleOptimizer(make_inner(params), **scale_kwargs)
    config = opt.get_config()
    new_params = [torch.nn.Parameter(torch.zeros(2))]
    again = LossScaleOptimizer.from_config(config, new_params)
    assert type(again) is LossScaleOptimizer
    assert type(again.inner_optimizer) is type(opt.inner_optimizer)
    assert again.get_config() == config
    assert again.loss_scale_policy == opt.loss_scale_policy
    assert again.param_groups[0]["params"][0] is new_params[0]


def test_from_config_of_stable_keys_only():
    config = LossScaleOptimizer(sgd(lr=0.5), initial_scale=2048, dynamic_growth_steps=500).get_config()
    config.pop("loss_scale")
    again = LossScaleOptimizer.from_config(config, [torch.nn.Parameter(torch.ones(1))])
    assert (again.dynamic, again.initial_scale, again.dynamic_growth_steps) == (True, 2048.0, 500)
    assert again.param_groups[0]["lr"] == 0.5


def test_from_config_custom_optimizer():
    class MySGD(torch.optim.SGD):
        pass

    opt = LossScaleOptimizer(MySGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))
    config = opt.get_config()
    config["inner_optimizer"]["module"] = "torch.optim"  # as if saved from another process
    with pytest.raises(ValueError, match=r"Unknown optimizer class 'MySGD'.*custom_objects"):
        LossScaleOptimizer.from_config(config, [torch.nn.Parameter(torch.ones(1))])
    again = LossScaleOptimizer.from_config(config, [torch.nn.Parameter(torch.ones(1))], custom_objects={"MySGD": MySGD})
    assert type(again.inner_optimizer) is MySGD
