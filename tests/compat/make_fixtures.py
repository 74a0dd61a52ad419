"""Writes the checkpoint compatibility fixtures of one lossscale version into ``tests/compat/fixtures/<version>/``.

Run by hand, once per release, with that release's lossscale first on the
path; the tests (``tests/torch``, ``tests/jax`` and ``tests/keras``'s
``test_*checkpoint_compat.py``) then load every fixture with today's code and
train on. Each binding runs in its own process (Keras fixes its backend at
import), from the repository root::

    # today's release (this checkout)
    PYTHONPATH=$PWD/src .venv/bin/python tests/compat/make_fixtures.py 0.2.0 torch jax
    KERAS_BACKEND=tensorflow PYTHONPATH=$PWD/src .venv/bin/python tests/compat/make_fixtures.py 0.2.0 keras

    # 0.1.0, from its tag's source in a second worktree
    git worktree add /tmp/ls010 c0ad0d1   # the commit released as 0.1.0
    PYTHONPATH=/tmp/ls010/src .venv/bin/python tests/compat/make_fixtures.py 0.1.0 torch jax
    KERAS_BACKEND=tensorflow PYTHONPATH=/tmp/ls010/src .venv/bin/python tests/compat/make_fixtures.py 0.1.0 keras

The script refuses to run when the imported lossscale is not ``<version>``.
Each run trains the recipes of ``recipes.py`` for ``SAVED_AFTER`` steps (one
overflowing step and a scale that grew and backed off on the way), saves every
format a user saves, and records in ``manifest.json`` the recipe, the framework
versions, and the scale and counters each fixture holds. Sizes stay in the
kilobytes: a 3x2 layer.

Files (``<version>/``):

- torch: ``torch_optimizer.pt``, ``torch_shared.pt``, ``torch_gradscaler.pt``
  (``torch.save`` of the ``state_dict()`` of ``LossScaleOptimizer``,
  ``SharedLossScale`` with its two optimizers, ``GradScaler`` with its SGD,
  each with the model's ``state_dict``); ``torch_optimizer_pickle.pt``,
  ``torch_gradscaler_pickle.pt`` (``torch.save`` of the whole objects) and
  ``torch_optimizer.pkl``, ``torch_gradscaler.pkl`` (``pickle.dumps``).
- JAX: ``jax_state.msgpack`` and ``jax_state.orbax/`` (``{"params", "opt_state"}``
  with the ``loss_scale_optimizer`` state, by ``flax.serialization.to_bytes``
  and orbax's ``StandardCheckpointer``); ``jax_train_state.msgpack`` and
  ``jax_train_state.orbax/`` (``lossscale.jax.train_state.TrainState``); from
  0.2.0 on, ``jax_stats_state.msgpack`` and ``jax_stats_state.orbax/`` with
  ``stats_every=2``.
- Keras (TensorFlow backend): ``keras_model.keras`` (``model.save`` with the
  ``LossScaleOptimizer`` compiled in), ``keras_model.weights.h5``
  (``save_weights``) and ``keras_checkpoint/`` (``tf.train.Checkpoint`` of the
  model and the optimizer).
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil
import sys
from typing import Any

if __package__:  # imported (pytest --doctest-modules collects it)
    from . import recipes
else:  # run as a script: its folder is sys.path[0]
    import recipes

HERE = pathlib.Path(__file__).resolve().parent

BINDINGS = ("torch", "jax", "keras")


def _number(value: Any) -> float:
    import numpy as np

    if hasattr(value, "detach"):
        value = value.detach().cpu()
    return float(np.asarray(value))


def _stats_supported(lsj: Any) -> bool:
    import inspect

    return "stats_every" in inspect.signature(lsj.loss_scale_optimizer).parameters


def write_torch(out: pathlib.Path) -> dict[str, Any]:
    import torch

    import lossscale.torch as lst

    done = range(recipes.SAVED_AFTER)
    at_save: dict[str, Any] = {}

    model = recipes.torch_model()
    opt = recipes.torch_optimizer(lst, model)
    recipes.torch_optimizer_steps(model, opt, done)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, out / "torch_optimizer.pt")
    torch.save({"model": model, "optimizer": opt}, out / "torch_optimizer_pickle.pt")
    (out / "torch_optimizer.pkl").write_bytes(pickle.dumps({"model": model, "optimizer": opt}))
    numbers = {"loss_scale": _number(opt.loss_scale), "skipped_steps": int(_number(opt.skipped_steps))}
    for name in ("torch_optimizer.pt", "torch_optimizer_pickle.pt", "torch_optimizer.pkl"):
        at_save[name] = numbers

    model = recipes.torch_model()
    shared, opt_a, opt_b = recipes.torch_shared(lst, model)
    recipes.torch_shared_steps(model, shared, opt_a, opt_b, done)
    torch.save(
        {
            "model": model.state_dict(),
            "shared": shared.state_dict(),
            "opt_a": opt_a.state_dict(),
            "opt_b": opt_b.state_dict(),
        },
        out / "torch_shared.pt",
    )
    at_save["torch_shared.pt"] = {"loss_scale": _number(shared.loss_scale)}

    model = recipes.torch_model()
    scaler, sgd = recipes.torch_gradscaler(lst, model)
    recipes.torch_gradscaler_steps(model, scaler, sgd, done)
    torch.save(
        {"model": model.state_dict(), "optimizer": sgd.state_dict(), "scaler": scaler.state_dict()},
        out / "torch_gradscaler.pt",
    )
    torch.save({"model": model, "optimizer": sgd, "scaler": scaler}, out / "torch_gradscaler_pickle.pt")
    (out / "torch_gradscaler.pkl").write_bytes(pickle.dumps({"model": model, "optimizer": sgd, "scaler": scaler}))
    numbers = {"loss_scale": _number(scaler.get_scale()), "skipped_steps": int(_number(scaler.skipped_steps))}
    for name in ("torch_gradscaler.pt", "torch_gradscaler_pickle.pt", "torch_gradscaler.pkl"):
        at_save[name] = numbers

    # The pickles of both with every diagnostic on: the guard's limit, the history and the overflow report travel.
    model, model_b = recipes.torch_model(), recipes.torch_model()
    opt = recipes.torch_optimizer(lst, model, **recipes.TORCH_DIAGNOSTICS)
    recipes.torch_optimizer_steps(model, opt, done)
    scaler, sgd = recipes.torch_gradscaler(lst, model_b, **recipes.TORCH_DIAGNOSTICS)
    recipes.torch_gradscaler_steps(model_b, scaler, sgd, done)
    together = {"model": model, "optimizer": opt, "model_b": model_b, "sgd": sgd, "scaler": scaler}
    (out / "torch_diagnostics.pkl").write_bytes(pickle.dumps(together))
    at_save["torch_diagnostics.pkl"] = {
        "loss_scale": _number(opt.loss_scale),
        "skipped_steps": int(_number(opt.skipped_steps)),
        "history_steps": [len(opt.history), len(scaler.history)],
    }
    return {"frameworks": {"torch": torch.__version__}, "at_save": at_save}


def write_jax(out: pathlib.Path) -> dict[str, Any]:
    import flax
    import jax
    import optax
    import orbax.checkpoint as ocp
    from flax import serialization

    import lossscale.jax as lsj

    done = range(recipes.SAVED_AFTER)
    at_save: dict[str, Any] = {}
    checkpointer = ocp.StandardCheckpointer()

    def save(name: str, tree: Any, numbers: dict[str, Any]) -> None:
        (out / f"{name}.msgpack").write_bytes(serialization.to_bytes(tree))
        checkpointer.save(out / f"{name}.orbax", tree)
        checkpointer.wait_until_finished()
        at_save[f"{name}.msgpack"] = at_save[f"{name}.orbax"] = numbers

    def numbers_of(state: Any) -> dict[str, Any]:
        found = lsj.find_state(state)
        return {
            "loss_scale": _number(found.loss_scale),
            "good_steps": int(_number(found.loss_scale_state.good_steps)),
            "skipped_steps": int(_number(found.skipped_steps)),
        }

    variants: dict[str, dict[str, Any]] = {"jax_state": {}}
    if _stats_supported(lsj):
        variants["jax_stats_state"] = {"stats_every": 2}
    for name, options in variants.items():
        tx = recipes.jax_tx(lsj, **options)
        params = recipes.jax_params()
        params, state = recipes.jax_steps(lsj, tx, params, tx.init(params), done)
        save(name, {"params": params, "opt_state": state}, numbers_of(state))

    train_state = recipes.jax_train_state_steps(lsj, recipes.jax_train_state(lsj), done)
    save("jax_train_state", train_state, {**numbers_of(train_state.opt_state), "step": int(train_state.step)})
    checkpointer.close()
    versions = {"jax": jax.__version__, "optax": optax.__version__, "flax": flax.__version__}
    versions["orbax-checkpoint"] = getattr(ocp, "__version__", "")
    return {"frameworks": versions, "at_save": at_save}


def write_keras(out: pathlib.Path) -> dict[str, Any]:
    import keras
    import tensorflow as tf

    import lossscale.keras as lsk

    if keras.backend.backend() != "tensorflow":
        raise SystemExit("Run the Keras fixtures with KERAS_BACKEND=tensorflow (tf.train.Checkpoint is TensorFlow's).")
    model = recipes.keras_model(lsk)
    opt = model.optimizer
    recipes.keras_steps(model, opt, range(recipes.SAVED_AFTER))
    model.save(out / "keras_model.keras")
    model.save_weights(out / "keras_model.weights.h5")
    checkpoint_dir = out / "keras_checkpoint"
    tf.train.Checkpoint(model=model, optimizer=opt).write(str(checkpoint_dir / "ckpt"))
    numbers = {
        "loss_scale": _number(opt.loss_scale),
        "good_steps": int(_number(opt.dynamic_counter)),
        "skipped_steps": int(_number(opt.skipped_steps)),
        "iterations": int(_number(opt.iterations)),
    }
    at_save = {name: numbers for name in ("keras_model.keras", "keras_model.weights.h5", "keras_checkpoint")}
    return {"frameworks": {"keras": keras.__version__, "tensorflow": tf.__version__}, "at_save": at_save}


def main(argv: list[str]) -> None:
    if len(argv) < 2 or any(b not in BINDINGS for b in argv[1:]):
        raise SystemExit(f"usage: make_fixtures.py VERSION {{{'|'.join(BINDINGS)}}}... (see the docstring)")
    version, bindings = argv[0], argv[1:]
    import lossscale

    if lossscale.__version__ != version:
        raise SystemExit(f"lossscale {lossscale.__version__} is imported ({lossscale.__file__}), not {version}.")
    out = HERE / "fixtures" / version
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest.update({"lossscale": version, "recipe": recipes.RECIPE})
    manifest.setdefault("frameworks", {})
    manifest.setdefault("at_save", {})
    writers = {"torch": write_torch, "jax": write_jax, "keras": write_keras}
    for binding in bindings:
        for stale in out.glob(f"{binding}_*"):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        written = writers[binding](out)
        manifest["frameworks"].update(written["frameworks"])
        manifest["at_save"] = {k: v for k, v in manifest["at_save"].items() if not k.startswith(f"{binding}_")}
        manifest["at_save"].update(written["at_save"])
    manifest["at_save"] = dict(sorted(manifest["at_save"].items()))
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"wrote {', '.join(bindings)} fixtures of lossscale {version} to {out}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main(sys.argv[1:])
