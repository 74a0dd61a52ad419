"""Policies: validation, ``get``, configs, properties, repr, equality, pickle, immutability."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle

import numpy as np
import pytest

import lossscale
from lossscale import (
    DynamicLossScale,
    ExponentialUpdateLossScaleManager,
    FixedLossScale,
    FixedLossScaleManager,
    LossScale,
    RuleParams,
    get,
    serialize,
)

ALL_POLICIES = [
    FixedLossScale(128),
    FixedLossScale(1),
    DynamicLossScale(),
    DynamicLossScale(2048, 500),
    DynamicLossScale(4, 3, 1.5, min_loss_scale=0.5, max_loss_scale=64, backoff_factor=0.25, hysteresis=3),
    FixedLossScaleManager(5000),
    ExponentialUpdateLossScaleManager(1024, 100),
    ExponentialUpdateLossScaleManager(8, 3, 4, 3, 0.5),
]
IDS = [repr(p) for p in ALL_POLICIES]


# ----------------------------------------------------------------------------- validation

NUMBER_TYPE_ERRORS = ["1", None, [1.0], True, object(), 1 + 2j]


class TestFixedLossScaleValidation:
    @pytest.mark.parametrize("value", [0, -1, -0.5])
    def test_non_positive(self, value):
        with pytest.raises(ValueError, match=r"loss_scale_value must be positive.*Pass a positive finite number"):
            FixedLossScale(value)

    @pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
    def test_non_finite(self, value):
        with pytest.raises(ValueError, match=r"loss_scale_value must be finite.*Pass a positive finite number"):
            FixedLossScale(value)

    @pytest.mark.parametrize("value", [0.5, 0.999])
    def test_below_one_as_in_tf(self, value):
        with pytest.raises(ValueError, match=r"loss_scale_value must be at least 1.*FixedLossScale\(1\)"):
            FixedLossScale(value)

    @pytest.mark.parametrize("value", NUMBER_TYPE_ERRORS, ids=repr)
    def test_not_a_number(self, value):
        with pytest.raises(TypeError, match=r"loss_scale_value must be a real number"):
            FixedLossScale(value)

    def test_beyond_float32_is_non_finite(self):
        with pytest.raises(ValueError, match="loss_scale_value"):
            FixedLossScale(1e39)

    def test_accepts_numpy_numbers_and_ints(self):
        assert FixedLossScale(np.float32(4)).loss_scale_value == 4.0
        assert FixedLossScale(np.int64(4)) == FixedLossScale(4.0)


class TestDynamicLossScaleValidation:
    @pytest.mark.parametrize("value", [0, -2.0])
    def test_initial_non_positive(self, value):
        with pytest.raises(ValueError, match=r"initial_loss_scale must be positive.*Pass a positive finite number"):
            DynamicLossScale(value)

    @pytest.mark.parametrize("value", [math.inf, math.nan])
    def test_initial_non_finite(self, value):
        with pytest.raises(ValueError, match=r"initial_loss_scale must be finite"):
            DynamicLossScale(value)

    def test_initial_beyond_float32(self):
        with pytest.raises(ValueError, match="initial_loss_scale"):
            DynamicLossScale(1e39)

    def test_initial_below_the_floor(self):
        with pytest.raises(ValueError, match=r"below min_loss_scale.*raise initial_loss_scale or lower min_loss_scale"):
            DynamicLossScale(0.5)
        assert DynamicLossScale(0.5, min_loss_scale=0.25).initial_loss_scale == 0.5

    @pytest.mark.parametrize("value", [0, -1])
    def test_period_below_one(self, value):
        with pytest.raises(ValueError, match=r"increment_period must be an int in \[1, 2\*\*31 - 1\]"):
            DynamicLossScale(2, value)

    def test_period_above_int32(self):
        with pytest.raises(ValueError, match=r"increment_period must be an int in \[1, 2\*\*31 - 1\]"):
            DynamicLossScale(2, 2**31)

    @pytest.mark.parametrize("value", [2.5, "2", True, math.inf, math.nan])
    def test_period_not_an_int(self, value):
        """A TypeError for Python, and a ValueError as TensorFlow raised: code written for either catches it."""
        with pytest.raises(TypeError, match=r"increment_period must be an int") as caught:
            DynamicLossScale(2, value)
        assert isinstance(caught.value, ValueError)

    @pytest.mark.parametrize("value", [2000.0, np.float32(2e3), np.asarray(2000.0)])
    def test_a_whole_float_period_is_the_int_it_spells(self, value):
        """As TensorFlow's ``int(increment_period)`` (and jmp's, Keras 3's float periods) took it."""
        policy = DynamicLossScale(2, value)
        assert policy.increment_period == 2000 and type(policy.increment_period) is int
        assert policy == DynamicLossScale(2, 2000) and policy.get_config()["increment_period"] == 2000

    @pytest.mark.parametrize("value", ["abc", None, [1.0], True])
    def test_a_scale_that_is_not_a_number_is_a_type_and_a_value_error(self, value):
        """TensorFlow's ``FixedLossScale("abc")`` raised ValueError; Python's idiom is TypeError: both catch it."""
        with pytest.raises(ValueError, match=r"loss_scale_value must be a real number"):
            FixedLossScale(value)
        with pytest.raises(TypeError, match=r"loss_scale_value must be a real number"):
            FixedLossScale(value)

    @pytest.mark.parametrize("value", [1, 1.0, 0.5, 0, -2])
    def test_multiplier_not_above_one(self, value):
        with pytest.raises(ValueError, match=r"multiplier must be greater than 1.*multiplier=2\.0"):
            DynamicLossScale(2, 10, value)

    @pytest.mark.parametrize("value", [math.inf, math.nan])
    def test_multiplier_non_finite(self, value):
        with pytest.raises(ValueError, match=r"multiplier must be finite.*above 1"):
            DynamicLossScale(2, 10, value)

    @pytest.mark.parametrize("value", [0, -1, math.nan])
    def test_min_loss_scale(self, value):
        with pytest.raises(ValueError, match=r"min_loss_scale must be"):
            DynamicLossScale(min_loss_scale=value)

    def test_max_below_min(self):
        with pytest.raises(ValueError, match=r"max_loss_scale must be at least 1"):
            DynamicLossScale(1, max_loss_scale=0.5)

    def test_initial_above_max(self):
        with pytest.raises(ValueError, match=r"above max_loss_scale.*lower initial_loss_scale or raise max_loss_scale"):
            DynamicLossScale(100, max_loss_scale=50)

    @pytest.mark.parametrize("value", [0, 1, 1.5, -0.5])
    def test_backoff_factor_outside_0_1(self, value):
        with pytest.raises(ValueError, match=r"backoff_factor must be in the open interval \(0, 1\).*backoff_factor=0\.5"):
            DynamicLossScale(backoff_factor=value)

    @pytest.mark.parametrize("value", [0, -3])
    def test_hysteresis(self, value):
        with pytest.raises(ValueError, match=r"hysteresis must be an int in \[1"):
            DynamicLossScale(hysteresis=value)

    def test_extensions_are_keyword_only(self):
        with pytest.raises(TypeError):
            DynamicLossScale(2, 10, 2.0, 1.0)  # type: ignore[misc]


class TestManagerValidation:
    @pytest.mark.parametrize("value", [0, -1, 0.5, math.inf, math.nan])
    def test_fixed_manager_scale(self, value):
        with pytest.raises(ValueError, match=r"loss_scale must be"):
            FixedLossScaleManager(value)

    def test_fixed_manager_type(self):
        with pytest.raises(TypeError, match=r"loss_scale must be a real number"):
            FixedLossScaleManager("5000")

    @pytest.mark.parametrize("value", [0, -1, 0.5, math.inf])
    def test_init_loss_scale(self, value):
        with pytest.raises(ValueError, match=r"init_loss_scale must be"):
            ExponentialUpdateLossScaleManager(value, 10)

    @pytest.mark.parametrize("name", ["incr_every_n_steps", "decr_every_n_nan_or_inf"])
    def test_periods(self, name):
        kwargs = {"init_loss_scale": 8, "incr_every_n_steps": 10}
        kwargs[name] = 0
        with pytest.raises(ValueError, match=rf"{name} must be an int in \[1"):
            ExponentialUpdateLossScaleManager(**kwargs)
        kwargs[name] = 1.5
        with pytest.raises(TypeError, match=rf"{name} must be an int"):
            ExponentialUpdateLossScaleManager(**kwargs)

    @pytest.mark.parametrize("value", [1, 0.9, 0])
    def test_incr_ratio(self, value):
        with pytest.raises(ValueError, match=r"incr_ratio must be greater than 1.*incr_ratio=2\.0"):
            ExponentialUpdateLossScaleManager(8, 10, incr_ratio=value)

    @pytest.mark.parametrize("value", [0, 1, 1.2, -0.8])
    def test_decr_ratio_outside_0_1(self, value):
        with pytest.raises(ValueError, match=r"decr_ratio must be in the open interval \(0, 1\).*decr_ratio=0\.5"):
            ExponentialUpdateLossScaleManager(8, 10, decr_ratio=value)

    def test_contrib_defaults(self):
        m = ExponentialUpdateLossScaleManager(8, 10)
        assert (m.decr_every_n_nan_or_inf, m.incr_ratio, m.decr_ratio) == (2, 2.0, 0.8)


# ----------------------------------------------------------------------------- get()


class TestGet:
    @pytest.mark.parametrize("value", [128, 128.0, np.float32(128), np.int32(128)], ids=repr)
    def test_number_is_fixed(self, value):
        got = get(value)
        assert type(got) is FixedLossScale and got.loss_scale_value == 128.0

    def test_dynamic_string(self):
        got = get("dynamic")
        assert type(got) is DynamicLossScale and got == DynamicLossScale()
        assert got.get_config() == {"initial_loss_scale": 32768.0, "increment_period": 2000, "multiplier": 2.0}

    @pytest.mark.parametrize("policy", ALL_POLICIES, ids=IDS)
    def test_loss_scale_returned_as_is(self, policy):
        assert get(policy) is policy

    def test_none(self):
        assert get(None) is None

    @pytest.mark.parametrize("policy", ALL_POLICIES, ids=IDS)
    def test_config_dict(self, policy):
        got = get(serialize(policy))
        assert type(got) is type(policy) and got == policy
        assert get({"class_name": type(policy).__name__, "config": policy.get_config()}) == policy

    @pytest.mark.parametrize("value", ["Dynamic", "fixed", "", "dynamic "])
    def test_bad_string(self, value):
        with pytest.raises(ValueError, match=r'only string accepted is "dynamic"'):
            get(value)

    @pytest.mark.parametrize("value", [object(), [128], (1,), True, False, b"dynamic", 1j], ids=repr)
    def test_bad_object(self, value):
        with pytest.raises(ValueError, match=r'Invalid loss scale .*pass a number \(fixed scale\), "dynamic"'):
            get(value)

    @pytest.mark.parametrize(
        "value",
        [
            {"class_name": "Nope", "config": {}},
            {"class_name": "LossScale", "config": {}},
            {"config": {"loss_scale_value": 2}},
            {"class_name": "FixedLossScale", "config": {"loss_scale_value": 2}, "extra": 1},
            {"initial_loss_scale": 2.0, "increment_period": 10, "multiplier": 2.0},
        ],
        ids=repr,
    )
    def test_bad_dict(self, value):
        with pytest.raises(ValueError, match=r"Invalid loss scale config.*lossscale\.serialize\(\)"):
            get(value)

    @pytest.mark.parametrize(
        "value",
        [
            {"class_name": "FixedLossScale", "config": {"bogus": 1}},
            {"class_name": "FixedLossScale"},
            {"class_name": "FixedLossScale", "config": 5},
        ],
        ids=repr,
    )
    def test_malformed_config_is_value_error(self, value):
        with pytest.raises(ValueError):
            get(value)

    @pytest.mark.parametrize("value", [0, -1, math.inf, math.nan, 0.5])
    def test_bad_numbers(self, value):
        with pytest.raises(ValueError, match="^loss_scale must be "):  # the argument the user passed
            get(value)

    def test_invalid_config_values_are_validated(self):
        with pytest.raises(ValueError, match="multiplier must be greater than 1"):
            get({"class_name": "DynamicLossScale", "config": {"multiplier": 1.0}})


def test_serialize_rejects_non_policies():
    with pytest.raises(TypeError, match="serialize\\(\\) takes a LossScale"):
        serialize(128)


# ----------------------------------------------------------------------------- configs


def test_tf_config_keys():
    assert FixedLossScale(128).get_config() == {"loss_scale_value": 128.0}
    assert DynamicLossScale().get_config() == {"initial_loss_scale": 32768.0, "increment_period": 2000, "multiplier": 2.0}
    assert DynamicLossScale(2048, 500).get_config() == {
        "initial_loss_scale": 2048.0,
        "increment_period": 500,
        "multiplier": 2.0,
    }
    assert FixedLossScaleManager(5000).get_config() == {"loss_scale": 5000.0}
    assert ExponentialUpdateLossScaleManager(1024, 100).get_config() == {
        "init_loss_scale": 1024.0,
        "incr_every_n_steps": 100,
        "decr_every_n_nan_or_inf": 2,
        "incr_ratio": 2.0,
        "decr_ratio": 0.8,
    }


def test_extensions_appear_only_when_not_default():
    assert set(DynamicLossScale(min_loss_scale=1.0, max_loss_scale=None, hysteresis=1).get_config()) == {
        "initial_loss_scale",
        "increment_period",
        "multiplier",
    }
    config = DynamicLossScale(4, 3, 1.5, min_loss_scale=0.5, max_loss_scale=64, backoff_factor=0.25, hysteresis=3).get_config()
    assert config == {
        "initial_loss_scale": 4.0,
        "increment_period": 3,
        "multiplier": 1.5,
        "min_loss_scale": 0.5,
        "max_loss_scale": 64.0,
        "backoff_factor": 0.25,
        "hysteresis": 3,
    }


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=IDS)
def test_config_round_trip(policy):
    config = policy.get_config()
    again = type(policy).from_config(config)
    assert type(again) is type(policy) and again == policy and again.get_config() == config
    assert again.rule_params() == policy.rule_params()
    # configs are plain, JSON-able Python values
    import json

    assert json.loads(json.dumps(serialize(policy))) == serialize(policy)
    # get_config returns a fresh dict: mutating it does not touch the policy
    config["bogus"] = 1
    assert "bogus" not in policy.get_config()


def test_tf_from_config_examples():
    assert DynamicLossScale.from_config({"initial_loss_scale": 2048, "increment_period": 500, "multiplier": 2}) == (
        DynamicLossScale(2048, 500)
    )
    assert FixedLossScale.from_config({"loss_scale_value": 3}) == FixedLossScale(3.0)


# ----------------------------------------------------------------------------- properties


def test_fixed_properties():
    p = FixedLossScale(128)
    assert p.dynamic is False and p.initial_scale == 128.0 and p.loss_scale_value == 128.0
    assert isinstance(p, LossScale)
    m = FixedLossScaleManager(5000)
    assert m.dynamic is False and m.loss_scale == 5000.0 and m.initial_scale == 5000.0
    assert m.rule_params() == FixedLossScale(5000).rule_params()


def test_dynamic_properties():
    p = DynamicLossScale(2048, 500, 3)
    assert p.dynamic is True
    assert (p.initial_loss_scale, p.increment_period, p.multiplier, p.initial_scale) == (2048.0, 500, 3.0, 2048.0)
    assert (p.min_loss_scale, p.max_loss_scale, p.backoff_factor, p.hysteresis) == (1.0, None, None, 1)
    assert isinstance(p.increment_period, int) and isinstance(p.multiplier, float)


def test_manager_properties():
    m = ExponentialUpdateLossScaleManager(8, 3, 4, 3, 0.5)
    assert m.dynamic is True
    assert (m.init_loss_scale, m.incr_every_n_steps, m.decr_every_n_nan_or_inf, m.incr_ratio, m.decr_ratio) == (
        8.0, 3, 4, 3.0, 0.5,
    )
    assert m.initial_scale == 8.0


def test_rule_params():
    assert DynamicLossScale(2048, 500).rule_params() == RuleParams(
        dynamic=True, initial_scale=2048.0, growth_interval=500, growth_factor=2.0,
        backoff_multiplier=1.0, backoff_divisor=2.0, hysteresis=1, min_scale=1.0, max_scale=None,
    )
    assert ExponentialUpdateLossScaleManager(8, 3).rule_params() == RuleParams(
        dynamic=True, initial_scale=8.0, growth_interval=3, growth_factor=2.0,
        backoff_multiplier=0.8, backoff_divisor=1.0, hysteresis=2, min_scale=1.0, max_scale=None,
    )
    fixed = FixedLossScale(16).rule_params()
    assert fixed.dynamic is False and fixed.initial_scale == 16.0


@pytest.mark.parametrize(
    "policy,name",
    [
        (FixedLossScale(2), "loss_scale_value"),
        (DynamicLossScale(), "initial_loss_scale"),
        (DynamicLossScale(), "increment_period"),
        (DynamicLossScale(), "multiplier"),
        (DynamicLossScale(), "dynamic"),
        (ExponentialUpdateLossScaleManager(8, 3), "decr_ratio"),
        (FixedLossScaleManager(8), "loss_scale"),
    ],
)
def test_properties_are_read_only(policy, name):
    before = policy.get_config()
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to field '{name}'"):
        setattr(policy, name, 5)
    assert policy.get_config() == before


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=IDS)
def test_no_new_attributes(policy):
    with pytest.raises(AttributeError):
        policy.anything = 1  # type: ignore[attr-defined]


def test_attributes_cannot_be_deleted():
    p = FixedLossScale(4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.loss_scale_value
    assert p.loss_scale_value == 4.0


def test_abstract_base():
    with pytest.raises(TypeError):
        LossScale()  # type: ignore[abstract]


# ----------------------------------------------------------------------------- repr, equality, hash, pickle


def test_repr():
    assert repr(FixedLossScale(128)) == "FixedLossScale(loss_scale_value=128.0)"
    assert repr(DynamicLossScale()) == "DynamicLossScale(initial_loss_scale=32768.0, increment_period=2000, multiplier=2.0)"
    assert repr(FixedLossScaleManager(5)) == "FixedLossScaleManager(loss_scale=5.0)"


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=IDS)
def test_repr_evaluates_back(policy):
    assert eval(repr(policy), vars(lossscale)) == policy


def test_equality_and_hash():
    assert FixedLossScale(128) == FixedLossScale(128.0) == get(128)
    assert hash(FixedLossScale(128)) == hash(FixedLossScale(128.0))
    assert DynamicLossScale() == DynamicLossScale(2**15, 2000, 2) == get("dynamic")
    assert hash(DynamicLossScale()) == hash(get("dynamic"))
    assert DynamicLossScale(2048, 500) != DynamicLossScale(2048, 501)
    assert DynamicLossScale(2048, 500) != DynamicLossScale(2048, 500, hysteresis=2)
    assert FixedLossScale(5) != FixedLossScaleManager(5)  # different classes, different configs
    assert FixedLossScale(5) != 5 and DynamicLossScale() != "dynamic"
    assert len(set(ALL_POLICIES) | set(copy.deepcopy(ALL_POLICIES))) == len(ALL_POLICIES)


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=IDS)
def test_pickle_and_copy(policy):
    for again in (pickle.loads(pickle.dumps(policy)), copy.copy(policy), copy.deepcopy(policy)):
        assert type(again) is type(policy) and again == policy and hash(again) == hash(policy)
        assert again.rule_params() == policy.rule_params()


def test_resolve_is_exported():
    assert lossscale.resolve_loss_scale(123) == FixedLossScale(123)


# ----------------------------------------------------------------------------- dataclasses


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=IDS)
def test_policies_are_frozen_dataclasses_whose_fields_are_the_config_keys(policy):
    assert dataclasses.is_dataclass(policy) and type(policy).__dataclass_params__.frozen
    names = [f.name for f in dataclasses.fields(policy)]
    assert set(policy.get_config()) <= set(names)
    assert policy == type(policy)(**{n: getattr(policy, n) for n in names})


def test_fields_are_normalised_to_float_and_int():
    p = DynamicLossScale(np.int64(8), np.int32(3), 3, min_loss_scale=np.float32(0.5), max_loss_scale=64)
    values = [p.initial_loss_scale, p.increment_period, p.multiplier, p.min_loss_scale, p.max_loss_scale]
    assert [type(v) for v in values] == [float, int, float, float, float]
    m = ExponentialUpdateLossScaleManager(8, 3, 4, 3, 0.5)
    assert [type(getattr(m, f.name)) for f in dataclasses.fields(m)] == [float, int, int, float, float]


def test_replace_validates_again():
    p = DynamicLossScale(2048, 500)
    assert dataclasses.replace(p, hysteresis=2) == DynamicLossScale(2048, 500, hysteresis=2)
    with pytest.raises(ValueError, match="multiplier must be greater than 1"):
        dataclasses.replace(p, multiplier=1.0)


# ----------------------------------------------------------------------------- B3: the registry


def _impostor():
    """A user class that shares a built-in's name (B3)."""

    @dataclasses.dataclass(frozen=True, repr=False)
    class FixedLossScale(LossScale):
        loss_scale_value: float

        @property
        def dynamic(self):
            return False

        def rule_params(self):
            return RuleParams(dynamic=False, initial_scale=1.0)

        def get_config(self):
            return {"loss_scale_value": self.loss_scale_value}

    return FixedLossScale


def test_b3_a_user_class_named_like_a_builtin_does_not_hijack_get_or_unpickling():
    impostor = _impostor()
    assert impostor is not lossscale.FixedLossScale
    config = {"class_name": "FixedLossScale", "config": {"loss_scale_value": 8}}
    assert type(get(config)) is lossscale.FixedLossScale
    assert type(pickle.loads(pickle.dumps(lossscale.FixedLossScale(8)))) is lossscale.FixedLossScale
    # A pickle written by lossscale 0.1 (by class name) also loads the built-in.
    from lossscale._policy import _from_config

    assert type(_from_config("FixedLossScale", {"loss_scale_value": 8})) is lossscale.FixedLossScale
    # Only an explicit custom_objects entry selects the user's class.
    assert type(get(config, custom_objects={"FixedLossScale": impostor})) is impostor


def test_get_finds_user_classes_only_through_custom_objects():
    @dataclasses.dataclass(frozen=True, repr=False)
    class HalvingScale(DynamicLossScale):
        pass

    config = serialize(HalvingScale(64, 10))
    assert config == {"class_name": "HalvingScale", "config": {"initial_loss_scale": 64.0, "increment_period": 10, "multiplier": 2.0}}
    with pytest.raises(ValueError, match=r"HalvingScale.*only through custom_objects=\{'MyLossScale': MyLossScale\}"):
        get(config)
    got = get(config, custom_objects={"HalvingScale": HalvingScale})
    assert type(got) is HalvingScale and got == HalvingScale(64, 10)
    with pytest.raises(TypeError, match=r"custom_objects\['HalvingScale'\] must be a LossScale subclass"):
        get(config, custom_objects={"HalvingScale": dict})
    with pytest.raises(TypeError, match="custom_objects must be a dict"):
        get(config, custom_objects=[HalvingScale])


# ----------------------------------------------------------------------------- B4: float32 underflow


@pytest.mark.parametrize(
    "build",
    [
        lambda: DynamicLossScale(1e-46, min_loss_scale=1e-46),  # rounds to 0 in float32
        lambda: DynamicLossScale(1.0, min_loss_scale=1e-40),  # a float32 subnormal
        lambda: DynamicLossScale(1.0, min_loss_scale=1e-39, max_loss_scale=1e-39),
    ],
)
def test_b4_a_scale_that_underflows_float32_is_rejected(build):
    with pytest.raises(ValueError, match=r"below float32's smallest normal number \(about 1\.2e-38\).*round to 0"):
        build()


def test_b4_the_smallest_normal_float32_is_accepted_and_stays_positive():
    tiny = float(np.finfo(np.float32).tiny)
    p = DynamicLossScale(tiny, min_loss_scale=tiny)
    state = lossscale.initial_state(p, np)
    for _ in range(3):
        state = lossscale.next_state(p, state, np.asarray(False), np)
    assert float(state.loss_scale) == tiny > 0


# ----------------------------------------------------------------------------- 0-d arrays (issue 16, item 5)


ZERO_D = [np.float32(2**15), np.asarray(2.0**15), np.asarray(32768, dtype=np.int64), np.float64(2**15)]


@pytest.mark.parametrize("value", ZERO_D, ids=lambda v: f"{type(v).__name__}-{v.dtype}")
def test_0d_arrays_are_accepted_wherever_numbers_are(value):
    assert DynamicLossScale(value) == DynamicLossScale(2**15)
    assert FixedLossScale(value) == FixedLossScale(2**15) == get(value)
    assert FixedLossScaleManager(value).loss_scale == 2.0**15
    assert ExponentialUpdateLossScaleManager(value, np.asarray(3)).init_loss_scale == 2.0**15
    assert lossscale.resolve_loss_scale(initial_scale=value) == DynamicLossScale(2**15)


def test_0d_arrays_every_argument():
    p = DynamicLossScale(
        np.asarray(8.0), np.asarray(3, dtype=np.int32), np.asarray(1.5),
        min_loss_scale=np.asarray(0.5, dtype=np.float32), max_loss_scale=np.asarray(64.0),
        backoff_factor=np.asarray(0.25), hysteresis=np.uint8(3),
    )
    assert p == DynamicLossScale(8, 3, 1.5, min_loss_scale=0.5, max_loss_scale=64, backoff_factor=0.25, hysteresis=3)
    assert hash(p) == hash(DynamicLossScale(8, 3, 1.5, min_loss_scale=0.5, max_loss_scale=64, backoff_factor=0.25, hysteresis=3))
    assert pickle.loads(pickle.dumps(p)) == p


@pytest.mark.parametrize(
    "value,error,message",
    [
        (np.asarray(0.0), ValueError, "initial_loss_scale must be positive"),
        (np.asarray(np.inf), ValueError, "initial_loss_scale must be finite"),
        (np.asarray(1e39), ValueError, "not finite in float32"),
        (np.asarray(1e-46), ValueError, "below float32's smallest normal"),
        (np.asarray(True), TypeError, "initial_loss_scale must be a real number, got the bool"),
        (np.bool_(True), TypeError, "initial_loss_scale must be a real number, got the bool"),
        (np.asarray([2.0**15]), TypeError, r"a real number or a 0-d array, got an array of shape \(1,\)"),
        (np.ones((2, 2)), TypeError, r"got an array of shape \(2, 2\)"),
        (np.asarray(1 + 2j), TypeError, "must be a real number, got a 0-d array of dtype complex128"),
        (np.asarray("8"), TypeError, "must be a real number"),
    ],
    ids=repr,
)
def test_0d_arrays_are_validated_like_numbers(value, error, message):
    with pytest.raises(error, match=message):
        DynamicLossScale(value)


@pytest.mark.parametrize(
    "value,message",
    [
        (np.asarray(2.5), r"increment_period must be an int, got .* \(dtype float64\)"),
        (np.asarray(2.25), r"increment_period must be an int"),
        (np.asarray(True), r"increment_period must be an int, got the bool"),
        (np.asarray([2]), r"shape \(1,\)"),
    ],
    ids=repr,
)
def test_0d_array_counts_must_be_whole_numbers(value, message):
    with pytest.raises(TypeError, match=message):
        DynamicLossScale(8, value)
    with pytest.raises(ValueError, match=r"increment_period must be an int in \[1"):
        DynamicLossScale(8, np.asarray(0))


@pytest.mark.parametrize("value", [np.asarray(True), np.asarray([8.0]), np.ones(3)], ids=repr)
def test_get_rejects_bool_and_non_0d_arrays(value):
    with pytest.raises(ValueError, match="Invalid loss scale"):
        get(value)


def test_every_count_takes_a_whole_float_and_refuses_a_fraction_alike():
    """One vocabulary: ``stats_every`` and ``max_consecutive_skips`` are counts too, as ``increment_period``."""
    from lossscale._auto import check_stats_every
    from lossscale._errors import check_skip_limit

    dynamic = DynamicLossScale()
    assert check_stats_every(16.0, dynamic) == 16 and check_skip_limit(np.float64(3.0)) == 3
    assert type(check_stats_every(16.0, dynamic)) is int and type(check_skip_limit(3.0)) is int
    for check, name in ((lambda v: check_stats_every(v, dynamic), "stats_every"), (check_skip_limit,
                                                                                  "max_consecutive_skips")):
        for value in (2.5, "4", math.inf):
            with pytest.raises(TypeError, match=rf"^{name} must be an int") as caught:
                check(value)
            assert isinstance(caught.value, ValueError)
