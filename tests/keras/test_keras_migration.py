"""Migrating from Keras 3's own ``keras.optimizers.LossScaleOptimizer`` (docs/migration/keras3.md): a run trained with
Keras 3's class, saved (``save_weights`` and ``.keras``), switched to lossscale's class, loaded and trained on, ends
where the same run trained uninterrupted with Keras 3's class ends; and each row of the page's "What carries over"
and "What differs" tables. Run once per backend (KERAS_BACKEND)."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
from kutil import BACKEND, numbers

import lossscale.keras as lsk

INITIAL_SCALE, GROWTH_STEPS, LEARNING_RATE = 1024.0, 3, 0.01


def data(batches: int, bad: int) -> tuple[np.ndarray, np.ndarray]:
    """``batches`` batches of 4; batch ``bad`` holds an Inf (a step whose gradients overflow: skipped)."""
    rng = np.random.default_rng(batches + 10 * bad)
    x = rng.standard_normal((4 * batches, 3)).astype(np.float32)
    y = rng.standard_normal((4 * batches, 2)).astype(np.float32)
    x[4 * bad] = np.inf
    return x, y


#: Before the switch: bad, then 4 good (the scale halves to 512, grows back to 1024, the counter at 1); after: good,
#: good, bad, good. The second step after the switch grows the scale only if the counter carried over.
BEFORE, AFTER = data(5, 0), data(4, 2)


def keras_optimizer() -> keras.optimizers.LossScaleOptimizer:
    return keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(LEARNING_RATE), initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS
    )


def lossscale_optimizer() -> lsk.LossScaleOptimizer:
    return lsk.LossScaleOptimizer(
        keras.optimizers.Adam(LEARNING_RATE), initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS
    )


def make_model(optimizer) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def train(model, batches) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the overflowing batch's NaN loss
        model.fit(*batches, batch_size=4, epochs=1, shuffle=False, verbose=0)


def arrays(variables) -> list[np.ndarray]:
    return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]


def scale_and_counter(opt) -> tuple[float, int]:
    return float(keras.ops.convert_to_numpy(opt.dynamic_scale)), int(keras.ops.convert_to_numpy(opt.step_counter))


@pytest.fixture(scope="module")
def uninterrupted():
    """Keras 3's class through both halves; its state at the switch, and at the end."""
    model = make_model(keras_optimizer())
    train(model, BEFORE)
    at_switch = scale_and_counter(model.optimizer), int(model.optimizer.iterations)
    train(model, AFTER)
    return model, at_switch


@pytest.fixture(scope="module")
def saved(tmp_path_factory, uninterrupted):
    """The first half with Keras 3's class, saved both ways."""
    folder = tmp_path_factory.mktemp("keras3")
    model = make_model(keras_optimizer())
    train(model, BEFORE)
    assert (scale_and_counter(model.optimizer), int(model.optimizer.iterations)) == uninterrupted[1]
    model.save_weights(folder / "run.weights.h5")
    model.save(folder / "run.keras")
    if BACKEND == "tensorflow":
        import tensorflow as tf

        tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(folder / "ckpt"))
    return folder


def assert_same_run(model, reference) -> None:
    opt, ref = model.optimizer, reference.optimizer
    assert isinstance(opt, lsk.LossScaleOptimizer)
    assert scale_and_counter(opt) == scale_and_counter(ref)
    assert int(opt.iterations) == int(ref.iterations)
    for mine, theirs in [(model.weights, reference.weights), (opt.inner_optimizer.variables, ref.inner_optimizer.variables)]:
        for a, b in zip(arrays(mine), arrays(theirs), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_the_uninterrupted_run_grows_and_skips_as_the_recipe_says(uninterrupted):
    model, ((scale, counter), iterations) = uninterrupted
    assert (scale, counter, iterations) == (1024.0, 1, 4)  # skip: 512; 3 finite: 1024; 1 finite: counter 1
    assert scale_and_counter(model.optimizer) == (1024.0, 1)  # 2 finite: 2048, skip: 1024, 1 finite: counter 1
    assert int(model.optimizer.iterations) == 7


def test_weights_file_of_keras_3s_class_resumes_in_lossscales(saved, uninterrupted):
    model = make_model(lossscale_optimizer())
    model.optimizer.build(model.trainable_variables)  # as for any optimizer state that load_weights restores
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Skipping variable loading for optimizer"
        model.load_weights(saved / "run.weights.h5")
    opt = model.optimizer
    assert (scale_and_counter(opt), int(opt.iterations)) == uninterrupted[1]
    assert (float(opt.loss_scale), int(opt.dynamic_counter)) == uninterrupted[1][0]
    assert numbers(opt)[2:] == (0, 0, 0)  # the skip counters Keras 3 keeps none of start at 0
    train(model, AFTER)
    assert_same_run(model, uninterrupted[0])
    assert int(opt.skipped_steps) == 1  # the skip after the switch


def test_keras_file_of_keras_3s_class_resumes_in_lossscales(saved, uninterrupted):
    path = saved / "run.keras"
    model = keras.models.load_model(path)  # comes back with Keras 3's class (its config names it)
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer
    opt = lsk.LossScaleOptimizer.from_config(model.optimizer.get_config())  # the same settings
    assert (opt.initial_scale, opt.dynamic_growth_steps) == (INITIAL_SCALE, GROWTH_STEPS)
    model.compile(optimizer=opt, loss="mse")
    opt.build(model.trainable_variables)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.load_weights(path)  # the state: weights, the inner optimizer's slots, the scale and its counter
    assert (scale_and_counter(opt), int(opt.iterations)) == uninterrupted[1]
    train(model, AFTER)
    assert_same_run(model, uninterrupted[0])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.train.Checkpoint is TensorFlow's")
@pytest.mark.parametrize("when", ["after build", "before build"])
def test_tf_checkpoint_of_keras_3s_class_resumes_in_lossscales(saved, uninterrupted, when):
    import tensorflow as tf

    model = make_model(lossscale_optimizer())
    opt = model.optimizer
    if when == "after build":
        opt.build(model.trainable_variables)
    status = tf.train.Checkpoint(model=model, optimizer=opt).read(str(saved / "ckpt"))
    if when == "before build":  # restored when built
        opt.build(model.trainable_variables)
    status.assert_nontrivial_match()
    with pytest.raises(AssertionError, match="bad_steps"):  # our skip counters have no saved value
        status.assert_consumed()
    assert (scale_and_counter(opt), int(opt.iterations)) == uninterrupted[1]  # its step_counter is int64, ours int32
    assert float(opt.inner_optimizer.learning_rate) == pytest.approx(LEARNING_RATE)  # not the wrapper's 0
    assert numbers(opt)[2:] == (0, 0, 0)
    train(model, AFTER)
    assert_same_run(model, uninterrupted[0])


def test_a_keras_3_file_into_an_optimizer_with_statistics_on(saved, uninterrupted):
    model = make_model(lsk.LossScaleOptimizer(keras.optimizers.Adam(LEARNING_RATE), initial_scale=INITIAL_SCALE,
                                              dynamic_growth_steps=GROWTH_STEPS, stats_every=1))
    opt = model.optimizer
    opt.build(model.trainable_variables)
    train(model, AFTER)  # statistics and counters that the load must reset
    model.load_weights(saved / "run.weights.h5")
    assert (scale_and_counter(opt), int(opt.iterations)) == uninterrupted[1]
    assert numbers(opt)[2:] == (0, 0, 0) and int(opt.gradient_stats["step"]) == -1  # the statistics start empty
    train(model, AFTER)
    assert_same_run(model, uninterrupted[0])


def test_a_keras_3_scale_below_the_floor_is_clamped_into_it(tmp_path):
    """Keras 3's scale has no floor (it halves to 0.5, 0.25, ... and to 0); ours is clamped to min_loss_scale."""
    theirs = make_model(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0))
    theirs.optimizer.build(theirs.trainable_variables)
    theirs.optimizer.dynamic_scale.assign(0.25)
    theirs.save_weights(tmp_path / "low.weights.h5")
    for floor in (None, 0.125):
        model = make_model(lsk.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0, min_loss_scale=floor))
        model.optimizer.build(model.trainable_variables)
        model.load_weights(tmp_path / "low.weights.h5")
        assert float(model.optimizer.loss_scale) == (1.0 if floor is None else 0.25)
    # an overflowed one (Keras 3 doubles without a check) is refused, naming the fix; nothing is assigned
    theirs.optimizer.dynamic_scale.assign(np.inf)
    theirs.save_weights(tmp_path / "inf.weights.h5")
    with pytest.raises(ValueError, match=r"saved is inf: that scale overflowed .*\(opt\.dynamic_scale\.assign"):
        model.load_weights(tmp_path / "inf.weights.h5")
    assert float(model.optimizer.loss_scale) == 0.25


def test_lossscales_own_files_are_not_taken_for_keras_3s(tmp_path):
    """The layouts differ in length and in kinds: a lossscale file still loads as its own."""
    model = make_model(lossscale_optimizer())
    train(model, BEFORE)
    model.save_weights(tmp_path / "own.weights.h5")
    again = make_model(lossscale_optimizer())
    again.optimizer.build(again.trainable_variables)
    again.load_weights(tmp_path / "own.weights.h5")
    assert numbers(again.optimizer) == numbers(model.optimizer) and numbers(model.optimizer)[3] == 1


# ----------------------------------------------------------------------------- the reverse direction


def test_a_lossscale_weights_file_into_keras_3s_class_keeps_weights_and_slots_not_the_scale(tmp_path):
    model = make_model(lossscale_optimizer())
    train(model, BEFORE)
    model.save_weights(tmp_path / "ours.weights.h5")
    theirs = make_model(keras_optimizer())
    theirs.optimizer.build(theirs.trainable_variables)
    with pytest.warns(UserWarning, match="Skipping variable loading for optimizer"):
        theirs.load_weights(tmp_path / "ours.weights.h5")
    opt = theirs.optimizer
    assert scale_and_counter(opt) == (INITIAL_SCALE, 0)  # not carried: Keras 3 starts from its initial_scale
    assert int(opt.iterations) == int(model.optimizer.iterations) == 4  # the inner optimizer's state loads
    for a, b in zip(arrays(theirs.weights + opt.inner_optimizer.variables),
                    arrays(model.weights + model.optimizer.inner_optimizer.variables), strict=True):
        np.testing.assert_array_equal(a, b)
    # the documented way to keep the scale: start Keras 3's class from it
    kept = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(LEARNING_RATE),
                                               initial_scale=float(model.optimizer.loss_scale))
    kept.build(theirs.trainable_variables)
    assert scale_and_counter(kept) == (1024.0, 0)


@pytest.fixture
def without_lossscale():
    """Keras as where lossscale is not installed: its class is not registered (keras.saving.get_custom_objects())."""
    registered = keras.saving.get_custom_objects()
    ours = registered.pop("lossscale>LossScaleOptimizer")
    yield
    registered["lossscale>LossScaleOptimizer"] = ours


def test_a_lossscale_keras_file_into_keras_3s_class(tmp_path, request):
    model = make_model(lossscale_optimizer())
    train(model, BEFORE)
    model.save(tmp_path / "ours.keras")
    assert type(keras.models.load_model(tmp_path / "ours.keras").optimizer) is lsk.LossScaleOptimizer
    request.getfixturevalue("without_lossscale")
    with pytest.raises(TypeError, match="Could not locate class 'LossScaleOptimizer'"):
        keras.models.load_model(tmp_path / "ours.keras")
    with pytest.warns(UserWarning, match="Skipping variable loading for optimizer"):
        theirs = keras.models.load_model(
            tmp_path / "ours.keras", custom_objects={"lossscale>LossScaleOptimizer": keras.optimizers.LossScaleOptimizer}
        )
    opt = theirs.optimizer
    assert type(opt) is keras.optimizers.LossScaleOptimizer  # our config of a dynamic scale is Keras 3's own
    assert (opt.initial_scale, opt.dynamic_growth_steps) == (INITIAL_SCALE, GROWTH_STEPS)
    assert scale_and_counter(opt) == (INITIAL_SCALE, 0) and int(opt.iterations) == 4
    np.testing.assert_array_equal(arrays(theirs.weights)[0], arrays(model.weights)[0])


# ----------------------------------------------------------------------------- what differs


def test_the_second_positional_argument_is_tfs_loss_scale_not_keras_3s_initial_scale():
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), 1024)
    ours = lsk.LossScaleOptimizer(keras.optimizers.SGD(), 1024)
    assert theirs.initial_scale == 1024 and not ours.dynamic and float(ours.loss_scale) == 1024.0
    assert lsk.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=1024).dynamic
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), 1024, 500, "lso")
    assert (theirs.dynamic_growth_steps, theirs.name) == (500, "lso")
    with pytest.raises(TypeError, match="positional"):  # keyword-only here
        lsk.LossScaleOptimizer(keras.optimizers.SGD(), 1024, 500, "lso")


def test_dynamic_false_is_a_fixed_scale_where_keras_3_raises():
    with pytest.raises(ValueError, match="no longer supports `dynamic=False`"):
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False)
    ours = lsk.LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False, initial_scale=8)
    assert not ours.dynamic and ours.get_config()["loss_scale"] == 8.0


def test_a_config_with_our_settings_is_refused_by_keras_3s_class():
    config = lsk.LossScaleOptimizer(keras.optimizers.SGD(), max_consecutive_skips=5).get_config()
    with pytest.raises(ValueError, match="does not support arguments: `max_consecutive_skips`"):
        keras.optimizers.LossScaleOptimizer.from_config(config)
