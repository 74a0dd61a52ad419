"""What the Keras binding refuses that the torch and JAX bindings take: ``AutoLossScale`` and ``stats_every``."""

from __future__ import annotations

import keras
import pytest

import lossscale
from lossscale.keras import LossScaleOptimizer

_NAMES_TORCH_AND_JAX = r"(?s)lossscale\.torch.*lossscale\.jax"


@pytest.mark.parametrize(
    "loss_scale",
    ["auto", lossscale.AutoLossScale(), lossscale.AutoLossScale(2.0**10, max_loss_scale=2.0**20)],
    ids=["string", "default", "configured"],
)
def test_auto_loss_scale_is_refused_naming_the_bindings_and_the_alternative(loss_scale):
    inner = keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match=_NAMES_TORCH_AND_JAX) as info:
        LossScaleOptimizer(inner, loss_scale)
    message = str(info.value)
    assert "AutoLossScale" in message and "default dynamic rule" in message and 'loss_scale="dynamic"' in message
    LossScaleOptimizer(inner)  # the refused wrapper did not claim the inner optimizer


def test_auto_loss_scale_in_a_config_is_refused():
    config = LossScaleOptimizer(keras.optimizers.SGD(0.1), lossscale.DynamicLossScale(2.0**10, 7)).get_config()
    config = {k: v for k, v in config.items() if k not in ("dynamic", "initial_scale", "dynamic_growth_steps")}
    config["loss_scale"] = lossscale.serialize(lossscale.AutoLossScale())
    with pytest.raises(ValueError, match=_NAMES_TORCH_AND_JAX):
        LossScaleOptimizer.from_config(config)


@pytest.mark.parametrize("stats_every", [1, 16])
def test_stats_every_is_refused_naming_the_bindings(stats_every):
    with pytest.raises(ValueError, match=rf"stats_every={stats_every} is not supported by the Keras binding") as info:
        LossScaleOptimizer(keras.optimizers.SGD(0.1), stats_every=stats_every)
    assert "lossscale.torch" in str(info.value) and "lossscale.jax" in str(info.value)


def test_stats_every_none_is_accepted_as_off():
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.1, name="inner"), stats_every=None)
    plain = LossScaleOptimizer(keras.optimizers.SGD(0.1, name="inner"), name=opt.name)
    assert opt.get_config() == plain.get_config()
