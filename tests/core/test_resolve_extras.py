"""``lossscale.resolve_loss_scale``'s three refinements of the dynamic scale: min/max_loss_scale and hysteresis."""

from __future__ import annotations

import pytest

import lossscale
from lossscale import DynamicLossScale, FixedLossScale


def test_the_refinements_shape_the_stable_forms_dynamic_scale():
    got = lossscale.resolve_loss_scale(initial_scale=64, dynamic_growth_steps=10, min_loss_scale=0.5,
                                       max_loss_scale=2.0**20, hysteresis=3)
    assert got == DynamicLossScale(64, 10, min_loss_scale=0.5, max_loss_scale=2.0**20, hysteresis=3)
    assert lossscale.resolve_loss_scale("dynamic", hysteresis=2) == DynamicLossScale(2**15, 2000, hysteresis=2)
    assert lossscale.resolve_loss_scale(dynamic=True, min_loss_scale=None) == DynamicLossScale(2**15, 2000)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"loss_scale": 123, "hysteresis": 2}, r"hysteresis= refine the dynamic scale.*DynamicLossScale\(2\*\*15"),
        ({"loss_scale": FixedLossScale(8), "min_loss_scale": 1.0}, "carries its own settings"),
        ({"dynamic": False, "initial_scale": 8, "max_loss_scale": 16.0}, "only apply to a dynamic loss scale"),
        ({"loss_scale": "dynamic", "initial_scale": 8, "hysteresis": 2}, "not both"),
        ({"min_loss_scale": -1.0}, "min_loss_scale"),
        ({"min_loss_scale": 4.0, "max_loss_scale": 2.0}, "max_loss_scale"),
        ({"hysteresis": 0}, "hysteresis"),
    ],
)
def test_a_bad_combination_or_value_is_a_value_error_naming_the_keyword(kwargs, match):
    with pytest.raises(ValueError, match=match):
        lossscale.resolve_loss_scale(**kwargs)


@pytest.mark.parametrize("kwargs", [{"hysteresis": 1.5}, {"min_loss_scale": "low"}, {"max_loss_scale": [2.0]}])
def test_a_value_of_the_wrong_type_is_a_type_error(kwargs):
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        lossscale.resolve_loss_scale(**kwargs)
