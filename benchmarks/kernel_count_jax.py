"""How many conditionals a jitted JAX training step runs on every step on a GPU, counted without one.

XLA's GPU runtime reads the predicate of each conditional (``lax.cond``, ``lax.switch``, ``lax.while_loop``) on
the host before it can launch the branch: each is a wait for the device in every step. This script exports the
step with ``jax.export.export(jax.jit(step), platforms=["cuda"])``, which runs on a CPU-only machine and gives the
StableHLO a GPU would compile, and counts the ``stablehlo.case``/``if``/``while`` reached from ``main`` outside any
branch (those run on every step; the ones inside a branch run only when it is taken). A ``case`` with one branch or
a constant index (what ``lax.platform_dependent`` lowers to when exported for one platform) is inlined by XLA and
costs nothing: its branch is walked as part of the step. Calls to private functions are followed.

Rows (one jitted ``update`` + ``optax.apply_updates``, the gradients given): ``optax.adam``, jmp's documented
pattern (when installed), ``optax.apply_if_finite(adam)``, ``lossscale.jax.loss_scale_optimizer(adam)`` by default,
with ``stats_every=16`` and with ``loss_scale="auto"``; and Keras 3 on JAX, ``fit``'s train step
(``model.train_step``, stateless) with ``lossscale.keras.LossScaleOptimizer`` (default, ``stats_every=16``,
``"auto"``) and with Keras 3's own ``LossScaleOptimizer``, in a subprocess with ``KERAS_BACKEND=jax``.

Run:  python benchmarks/kernel_count_jax.py [--platform cuda] [--no-keras]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONDITIONALS = ("stablehlo.case", "stablehlo.if", "stablehlo.while")


def _constant_index(op: Any) -> int | None:
    """The value of a ``case``'s index when constants make it (XLA folds it and inlines the branch), else None:
    a ``stablehlo.constant``, or a ``clamp``/``convert`` of constants (how jax 0.4.x lowers
    ``lax.platform_dependent`` for one platform)."""
    return _constant_value(op.operands[0])


def _constant_value(value: Any) -> int | None:
    owner = value.owner
    name = getattr(owner, "name", None)
    if name == "stablehlo.constant":
        text = str(owner.attributes["value"])  # e.g. "dense<1> : tensor<i32>"
        try:
            return int(text[text.index("<") + 1:text.index(">")])
        except ValueError:
            return None
    if name == "stablehlo.convert":
        return _constant_value(owner.operands[0])
    if name == "stablehlo.clamp":
        low, x, high = (_constant_value(v) for v in owner.operands)
        return None if None in (low, x, high) else min(max(x, low), high)  # type: ignore[type-var]
    return None


def count_in_module(text: str) -> int:
    """The conditionals that ``main`` of the StableHLO module ``text`` runs on every step (see the module's doc)."""
    import jax

    # A context with every dialect JAX emits, through the public API: the one a trivial function lowers into.
    context = jax.jit(lambda: 0).trace().lower().compiler_ir().context
    from jax.extend.mlir import ir

    module = ir.Module.parse(text, context=context)
    functions = {op.attributes["sym_name"].value: op for op in module.body.operations
                 if "sym_name" in op.attributes}

    def walk(block_ops: Any, seen: tuple[str, ...]) -> int:
        found = 0
        for op in block_ops:
            name = op.operation.name
            if name in ("func.call", "call"):
                callee = op.attributes["callee"].value
                if callee in functions and callee not in seen:
                    found += walk_function(callee, seen)
                continue
            if name == "stablehlo.case":
                regions = list(op.regions)
                index = _constant_index(op)
                if len(regions) == 1 or index is not None:  # inlined by XLA: no conditional, its branch runs
                    chosen = regions[0] if len(regions) == 1 else regions[min(max(index, 0), len(regions) - 1)]
                    found += sum(walk(block.operations, seen) for block in chosen.blocks)
                    continue
            if name in CONDITIONALS:
                found += 1  # what it holds runs only on some steps (or some iterations): not counted
                continue
            for region in op.regions:  # a reduction's body, a sort's comparator: walked, never control flow
                found += sum(walk(block.operations, seen) for block in region.blocks)
        return found

    def walk_function(name: str, seen: tuple[str, ...] = ()) -> int:
        return sum(walk(block.operations, (*seen, name)) for block in functions[name].regions[0].blocks)

    return walk_function("main")


def count_conditionals(fn: Callable[..., Any], *args: Any, platform: str = "cuda") -> int:
    """The conditionals ``jax.jit(fn)(*args)`` runs on every step, exported for ``platform`` (any machine)."""
    import jax
    from jax import export  # a submodule to import by name on jax 0.4.33, an attribute on newer releases

    exported = export.export(jax.jit(fn), platforms=[platform])(*args)
    return count_in_module(exported.mlir_module())


def _params() -> list[dict[str, Any]]:
    import jax.numpy as jnp

    return [{"w": jnp.full((64, 64), 0.01, jnp.float32), "b": jnp.zeros((64,), jnp.float32)} for _ in range(4)]


def jax_rows(platform: str = "cuda") -> list[dict[str, Any]]:
    """One row per optax contender: ``{"step": name, "conditionals": count}`` for one jitted update + apply."""
    import jax
    import jax.numpy as jnp
    import optax

    import lossscale.jax as lsj

    params = _params()
    grads = jax.tree_util.tree_map(lambda p: p + 1.0, params)
    adam = optax.adam(1e-3)

    def optax_step(tx: Any) -> Callable[..., Any]:
        def step(p: Any, s: Any, g: Any) -> Any:
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        return step

    rows = [("optax.adam", optax_step(adam), adam.init(params))]
    try:
        import jmp
    except ImportError:
        jmp = None
    if jmp is not None:
        def jmp_step(p: Any, state: Any, g: Any) -> Any:  # jmp's documented pattern, as bench_jax.py's
            opt_state, (scale, counter) = state
            ls = jmp.DynamicLossScale(scale, counter)
            g = ls.unscale(g)
            finite = jmp.all_finite(g)
            ls = ls.adjust(finite)
            updates, new_opt_state = adam.update(g, opt_state, p)
            new = optax.apply_updates(p, updates)
            p, opt_state = jmp.select_tree(finite, (new, new_opt_state), (p, opt_state))
            return p, (opt_state, (ls.loss_scale, ls.counter))

        rows.append(("jmp (DynamicLossScale, all_finite, select_tree)", jmp_step,
                     (adam.init(params), (jnp.float32(2.0**15), jnp.zeros((), jnp.int32)))))
    if_finite = optax.apply_if_finite(adam, max_consecutive_errors=5)
    rows.append(("optax.apply_if_finite(adam)", optax_step(if_finite), if_finite.init(params)))
    for label, kwargs in (("lossscale, default", {}), ("lossscale, stats_every=16", {"stats_every": 16}),
                          ('lossscale, loss_scale="auto"', {"loss_scale": "auto"})):
        tx = lsj.loss_scale_optimizer(adam, **kwargs)
        rows.append((label, optax_step(tx), tx.init(params)))
    return [{"step": label, "conditionals": count_conditionals(step, params, state, grads, platform=platform)}
            for label, step, state in rows]


def keras_rows(platform: str = "cuda") -> list[dict[str, Any]]:
    """Keras 3 on JAX (this process's backend must be JAX): ``fit``'s train step, exported, per optimizer."""
    import keras
    import numpy as np

    import lossscale.keras as lsk

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"keras_rows needs KERAS_BACKEND=jax, got {keras.backend.backend()!r}")
    x = np.random.default_rng(0).normal(size=(16, 32)).astype("float32")
    y = np.zeros((16, 4), "float32")
    contenders: list[tuple[str, Callable[[], Any]]] = [
        ("Keras 3 LossScaleOptimizer", lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))),
        ("lossscale.keras, default", lambda: lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-3))),
        ("lossscale.keras, stats_every=16", lambda: lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-3),
                                                                          stats_every=16)),
        ('lossscale.keras, loss_scale="auto"', lambda: lsk.LossScaleOptimizer(keras.optimizers.Adam(1e-3), "auto")),
    ]
    rows = []
    for label, make in contenders:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
        model.compile(optimizer=make(), loss="mse")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # builds the optimizer and the metrics
        state = (
            [v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
            [v.value for v in model.optimizer.variables], [v.value for v in model.metrics_variables],
        )
        rows.append({"step": f"Keras fit on JAX: {label}",
                     "conditionals": count_conditionals(model.train_step, state, (x, y), platform=platform)})
    return rows


def keras_rows_in_subprocess(platform: str = "cuda") -> list[dict[str, Any]]:
    """:func:`keras_rows` in a fresh process with ``KERAS_BACKEND=jax`` (Keras picks its backend once)."""
    root = Path(__file__).resolve().parent.parent
    path = os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, __file__, "--keras-json", "--platform", platform], env=env,
                          capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the Keras count failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="cuda", help="the platform to export for (default cuda)")
    parser.add_argument("--no-keras", action="store_true", help="count the optax steps only")
    parser.add_argument("--keras-json", action="store_true", help=argparse.SUPPRESS)  # the subprocess's part
    args = parser.parse_args()
    if args.keras_json:
        print(json.dumps(keras_rows(args.platform)))
        return
    import jax

    rows = jax_rows(args.platform)
    if not args.no_keras:
        rows += keras_rows_in_subprocess(args.platform)
    print(f"jax {jax.__version__}, exported for {args.platform}\n")
    print("| one jitted step | conditionals on every step |\n|---|---|")
    for row in rows:
        print(f"| {row['step']} | {row['conditionals']} |")


if __name__ == "__main__":
    main()
