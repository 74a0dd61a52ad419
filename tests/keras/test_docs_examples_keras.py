"""The Keras pages of the user's manual stay true: their ```python blocks run, on this process's backend.

As tests/test_docs_examples.py does for the other pages (tests/docs_blocks.py runs a page's blocks in order in one
namespace): the reader's own names are defined in SETUP, per block; a block written for one backend
(TensorFlow's `tf.GradientTape` and `tf.distribute`) runs only on that backend, skipped on the others with the
reason; after each page the test checks what the page says the code does. `make test-keras` runs this file once
per backend (KERAS_BACKEND=tensorflow, jax, torch).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tests.docs_blocks import KERAS_PAGES, python_blocks, run_page

BACKEND = keras.backend.backend()

MODEL = "keras.Sequential([keras.Input((10,)), keras.layers.Dense(1)])"
TF_LOOP = """
    import tensorflow as tf
    loss_fn = keras.losses.MeanSquaredError()
    x, y = np.ones((8, 10), "float32"), np.ones((8, 1), "float32")
"""

#: (page, block) -> the reader's own names, defined just before the block runs.
SETUP: dict[tuple[str, int], str] = {
    ("getting-started/keras.md", 1): TF_LOOP,
    # A model saved with lossscale's optimizer at a scale of its own (1024), one step trained.
    ("keras.md", 0): f"""
        import numpy as np, keras, lossscale.keras as lsk
        saved = {MODEL}
        saved.compile(optimizer=lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-3), initial_scale=1024),
                      loss="mse")
        saved.fit(np.ones((8, 10)), np.ones((8, 1)), verbose=0)
        saved.save("model.keras")  # in a temporary directory
    """,
    ("keras.md", 1): f"""
        import tensorflow as tf
        make_model = lambda: {MODEL}
        data = (np.ones((16, 10), "float32"), np.ones((16, 1), "float32"))
        dataset = tf.data.Dataset.from_tensor_slices(data).batch(8)
        loss_fn = keras.losses.MeanSquaredError(reduction="sum")
        global_batch = 8
    """,
    ("migration/keras3.md", 0): "import keras",
    # A run trained with Keras 3's own class (scale 1024, one step), saved both ways.
    ("migration/keras3.md", 1): f"""
        import numpy as np
        keras3_model = {MODEL}
        keras3_model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.AdamW(1e-3),
                                                                           initial_scale=1024), loss="mse")
        keras3_model.fit(np.ones((8, 10)), np.ones((8, 1)), verbose=0)
        keras3_model.save_weights("run.weights.h5")
        keras3_model.save("run.keras")
        model = {MODEL}
    """,
    ("migration/keras3.md", 3): "lossscale_model = model  # the run resumed above, on lossscale's class",
    ("migration/tf-keras.md", 0): f"""
        import numpy as np, keras, tensorflow as tf
        import lossscale.keras as lsk
        loss_fn = keras.losses.MeanSquaredError()
        x, y = np.ones((8, 10), "float32"), np.ones((8, 1), "float32")
        model = {MODEL}
        opt = lsk.LossScaleOptimizer(keras.optimizers.AdamW(1e-3))
    """,
}

#: (page, block) -> the one backend the block is written for.
ONLY: dict[tuple[str, int], str] = {
    ("getting-started/keras.md", 1): "tensorflow",  # tf.GradientTape
    ("keras.md", 1): "tensorflow",  # tf.distribute.MirroredStrategy, tf.function
    ("migration/tf-keras.md", 0): "tensorflow",  # tf.GradientTape
}
SKIP = {key: f"TensorFlow's code ({backend} backend only)" for key, backend in ONLY.items() if backend != BACKEND}


def numbers(opt) -> tuple[float, int, int]:
    """The scale, its counter of finite steps, and the inner optimizer's count of applied steps. (Read through
    numpy: under a tf.distribute strategy `float()` of a Keras variable, `iterations` included, raises.)"""
    values = (keras.ops.convert_to_numpy(v) for v in (opt.loss_scale, opt.dynamic_counter, opt.iterations))
    scale, counter, iterations = values
    return float(scale), int(counter), int(iterations)


def check_loaded(ns):
    # The loaded model's optimizer is lossscale's, with the saved scale, counter and step.
    import lossscale.keras as lsk

    assert isinstance(ns["model"].optimizer, lsk.LossScaleOptimizer)
    assert numbers(ns["model"].optimizer) == (1024.0, 1, 1)


def check_strategy(ns):
    # fit under the strategy: 3 epochs of 2 batches; then one step of TF's custom loop.
    assert numbers(ns["opt"]) == (2.0**15, 6, 6)
    ns["train"](*ns["data"])
    assert numbers(ns["opt"]) == (2.0**15, 7, 7) and int(keras.ops.convert_to_numpy(ns["opt"].skipped_steps)) == 0


def check_resumed(ns):
    # The Keras 3 run resumed in lossscale's class: its weights, its scale and step counter.
    model, keras3_model = ns["model"], ns["keras3_model"]
    assert isinstance(ns["opt"], ns["lsk"].LossScaleOptimizer) and model.optimizer is ns["opt"]
    assert numbers(ns["opt"]) == (1024.0, 1, 1)
    for ours, theirs in zip(model.get_weights(), keras3_model.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    # "AdamW's slots and iterations"
    ours, theirs = ns["opt"].inner_optimizer.variables, keras3_model.optimizer.inner_optimizer.variables
    assert len(ours) == len(theirs) > 2
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def check_back_to_keras_3(ns):
    opt = ns["opt"]
    assert type(opt) is keras.optimizers.LossScaleOptimizer and opt.initial_scale == 1024.0


AFTER = {("keras.md", 0): check_loaded, ("keras.md", 1): check_strategy,
         ("migration/keras3.md", 1): check_resumed, ("migration/keras3.md", 2): check_resumed,
         ("migration/keras3.md", 3): check_back_to_keras_3}


def run(page: str):
    return run_page(page, setup=SETUP, fill={}, skip=SKIP, after=AFTER)


@pytest.fixture(autouse=True)
def _in_tmp_path_with_float32_after(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield
    keras.mixed_precision.set_global_policy("float32")


def test_the_keras_pages_are_these():
    assert all(python_blocks(page) for page in KERAS_PAGES)
    for page, i in (*SETUP, *ONLY, *AFTER):
        assert page in KERAS_PAGES and i < len(python_blocks(page)), (page, i)


def test_getting_started_keras(capsys):
    ns, ran = run("getting-started/keras.md")
    # fit kept the optimizer; 4 finite steps at the default scale.
    assert capsys.readouterr().out.split() == ["True", "32768.0", "0"]
    opt = ns["opt"]
    if BACKEND == "tensorflow":
        assert ran == [0, 1]
        # TF's custom loop: one more applied step.
        assert numbers(opt) == (2.0**15, 5, 5) and int(opt.skipped_steps) == 0
    else:
        assert ran == [0] and numbers(opt) == (2.0**15, 4, 4)


@pytest.mark.filterwarnings("ignore:`shuffle=True` was passed:UserWarning")  # fit(dataset): Keras' note
def test_keras_in_depth():
    _, ran = run("keras.md")
    assert ran == ([0, 1] if BACKEND == "tensorflow" else [0])


def test_migration_from_keras_3():
    ns, ran = run("migration/keras3.md")
    assert ran == [0, 1, 2, 3]
    # The first block's two optimizers: Keras 3's class, and lossscale's subclass of it.
    assert isinstance(ns["opt"], keras.optimizers.LossScaleOptimizer)


def test_migration_from_tf_keras():
    ns, ran = run("migration/tf-keras.md")
    if BACKEND != "tensorflow":
        assert ran == []
        return
    # One applied step of TF's custom loop at the default scale.
    assert ran == [0] and numbers(ns["opt"]) == (2.0**15, 1, 1) and int(ns["opt"].skipped_steps) == 0
