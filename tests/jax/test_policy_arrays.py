"""Issue 16, item 5: policies accept JAX 0-d arrays wherever they accept Python numbers, as jmp users write them."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import pytest

import lossscale
from lossscale import DynamicLossScale, ExponentialUpdateLossScaleManager, FixedLossScale, FixedLossScaleManager, get


@pytest.mark.parametrize(
    "value", [jnp.float32(2**15), jnp.asarray(2.0**15), jnp.bfloat16(2**15), jnp.float16(2**15), jnp.int32(2**15)],
    ids=lambda v: str(v.dtype),
)
def test_jax_0d_arrays_are_numbers(value):
    policy = DynamicLossScale(value)
    assert policy == DynamicLossScale(2**15) and hash(policy) == hash(DynamicLossScale(2**15))
    assert type(policy.initial_loss_scale) is float
    assert FixedLossScale(value) == get(value) == FixedLossScale(2**15)
    assert FixedLossScaleManager(value).loss_scale == 2.0**15
    assert lossscale.resolve_loss_scale(initial_scale=value, dynamic_growth_steps=jnp.int32(100)) == DynamicLossScale(
        2**15, 100
    )
    assert pickle.loads(pickle.dumps(policy)) == policy


def test_every_argument_as_a_jax_array():
    p = DynamicLossScale(
        jnp.float32(8), jnp.int32(3), jnp.float32(1.5),
        min_loss_scale=jnp.float32(0.5), max_loss_scale=jnp.float32(64), backoff_factor=jnp.float32(0.25),
        hysteresis=jnp.int32(3),
    )
    assert p == DynamicLossScale(8, 3, 1.5, min_loss_scale=0.5, max_loss_scale=64, backoff_factor=0.25, hysteresis=3)
    m = ExponentialUpdateLossScaleManager(jnp.float32(8), jnp.int32(3), jnp.int32(4), jnp.float32(3), jnp.float32(0.5))
    assert m == ExponentialUpdateLossScaleManager(8, 3, 4, 3, 0.5)


@pytest.mark.parametrize(
    "build,error,message",
    [
        (lambda: DynamicLossScale(jnp.float32(0)), ValueError, "initial_loss_scale must be positive"),
        (lambda: DynamicLossScale(jnp.float32(jnp.inf)), ValueError, "initial_loss_scale must be finite"),
        (lambda: DynamicLossScale(jnp.asarray(True)), TypeError, "got the bool"),
        (lambda: DynamicLossScale(jnp.ones(2)), TypeError, r"got an array of shape \(2,\)"),
        (lambda: DynamicLossScale(8, jnp.float32(3.5)), TypeError, r"increment_period must be an int.*dtype float32"),
        (lambda: DynamicLossScale(8, jnp.int32(0)), ValueError, r"increment_period must be an int in \[1"),
        (lambda: DynamicLossScale(8, multiplier=jnp.float32(1)), ValueError, "multiplier must be greater than 1"),
        (lambda: FixedLossScale(jnp.float32(0.5)), ValueError, "loss_scale_value must be at least 1"),
    ],
)
def test_jax_arrays_are_validated_like_numbers(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_a_traced_value_is_a_clear_error():
    with pytest.raises(TypeError, match="must be a concrete number.*build the policy outside jit"):
        jax.jit(lambda x: DynamicLossScale(x).initial_scale)(jnp.float32(8))


def test_a_whole_float_jax_count_is_the_int_it_spells():
    assert DynamicLossScale(8, jnp.float32(3)) == DynamicLossScale(8, 3)
