"""The user's manual stays true: every ```python block of docs/ runs, on the CPU, as a reader would run it.

Each page's blocks run in page order in one namespace (tests/docs_blocks.py). What a page leaves to the reader (a
model, a loss function, a file to load, the training a `...` line stands for) is defined below, per block, in SETUP
and FILL; the blocks that cannot run in one CPU process are in SKIP with the reason (they are compiled all the
same); after each page, the test checks what the page says the code does. The Keras pages run in
tests/keras/test_docs_examples_keras.py, once per backend. Without a page's framework (the numpy-only
`make test-core`), the page is skipped.
"""

from __future__ import annotations

import math
import re
import socket
import textwrap

import pytest

from tests.docs_blocks import DOCS, KERAS_PAGES, pages_with_python, python_blocks, run_page

TORCH_MLP = "torch.nn.Sequential(torch.nn.Linear(10, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))"
JAX_LINEAR = """
import jax, jax.numpy as jnp, optax
params = {"w": jnp.ones((10, 1)), "b": jnp.zeros(1)}
loss_fn = lambda p, x, y: jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
x, y = jnp.ones((8, 10)), jnp.ones((8, 1))
"""

#: (page, block) -> the reader's own names, defined just before the block runs.
SETUP: dict[tuple[str, int], str] = {
    ("getting-started/torch.md", 0): "import torch; torch.manual_seed(0)  # the printed numbers are this seed's",
    ("getting-started/torch.md", 1): """
        loss_fn = torch.nn.functional.mse_loss
        step_tensor = torch.zeros((), dtype=torch.int64)
        loss = lambda: loss_fn(model(x), y)  # a callable (as in TF): computed again after minimize's step
    """,
    ("getting-started/torch.md", 2): "opt.zero_grad(); loss = loss_fn(model(x), y)",
    ("getting-started/torch.md", 3): """
        gen, disc = torch.nn.Linear(4, 10), torch.nn.Linear(10, 1)
        adam_g = torch.optim.AdamW(gen.parameters(), fused=True)
        adam_d = torch.optim.AdamW(disc.parameters(), fused=True)
        loss = disc(gen(torch.randn(8, 4))).square().mean()
    """,
    ("how-to/accumulation.md", 0): "import torch; torch.manual_seed(0)",
    ("how-to/checkpoints.md", 0): f"""
        import torch
        from lossscale.torch import LossScaleOptimizer
        model = {TORCH_MLP}
        opt = LossScaleOptimizer(torch.optim.AdamW(model.parameters(), fused=True), min_loss_scale=4)
        opt.get_scaled_loss(model(torch.full((1, 10), float("inf"))).sum()).backward()
        opt.step()  # an overflow: skipped, the scale halves to 16384
        path = "checkpoint.pt"  # in a temporary directory
    """,
    ("how-to/diagnostics.md", 0): """
        import torch
        from lossscale.torch import LossScaleOptimizer
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    """,
    ("gradient_stats.md", 0): JAX_LINEAR,
    ("gradient_stats.md", 1): f"import torch; torch.manual_seed(0); model = {TORCH_MLP}",
    ("getting-started/jax.md", 0): "",
    ("jax.md", 0): """
        import jax.numpy as jnp
        params = {"w": jnp.ones((10, 1)), "b": jnp.zeros(1)}
        batch = (jnp.ones((8, 10)), jnp.ones((8, 1)))
        def loss_fn(params, batch):
            x, y = batch
            return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)
    """,
    ("jax.md", 3): """
        from flax import linen as nn
        x, y = batch
        model = nn.Dense(1)
        variables = model.init(jax.random.key(0), x)
    """,
    ("jax.md", 4): "from flax import nnx; model = nnx.Linear(10, 1, rngs=nnx.Rngs(0))",
    # A checkpoint of a state whose step overflowed (scale 16384), by flax (`blob`) and by orbax (`path`).
    ("jax.md", 5): """
        import os, orbax.checkpoint as ocp
        from flax import serialization
        saved_tx = lsj.loss_scale_optimizer(optax.adamw(1e-3))
        inf_grads = jax.tree.map(lambda p: jnp.full_like(p, jnp.inf), params)
        saved = saved_tx.update(inf_grads, saved_tx.init(params), params)[1]
        blob = serialization.to_bytes(saved)
        path = os.path.abspath("orbax-checkpoint")
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(path, saved)
    """,
    # The same, saved by an optimizer with statistics on.
    ("jax.md", 6): """
        old_tx = lsj.loss_scale_optimizer(optax.adamw(1e-3), stats_every=16)
        saved = old_tx.update(inf_grads, old_tx.init(params), params)[1]
        path = os.path.abspath("orbax-checkpoint-stats")
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(path, saved)
    """,
    ("migration/jmp.md", 0): JAX_LINEAR + "import jmp\nopt = optax.adamw(1e-3)\nopt_state = opt.init(params)",
    ("migration/jmp.md", 1): "import lossscale.jax as lsj",
    ("migration/jmp.md", 2): "lr = 1e-3; adam_state = optax.adam(lr).init(params)  # the jmp run's",
    ("demo.md", 0): "",
    # torch.distributed on one rank (the test starts a gloo group of one process): the DDP, FSDP2, checkpoint
    # and debug code runs through the library's collectives, which a world of one still calls.
    ("distributed.md", 0): """
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from lossscale.torch import LossScaleOptimizer
        torch.manual_seed(0)
        model = torch.nn.Linear(10, 1)
        loader = [(torch.randn(8, 10), torch.randn(8, 1))] * 2
        loss_fn = torch.nn.functional.mse_loss
    """,
    ("distributed.md", 1): """
        from torch.distributed.fsdp import fully_shard
        ddp_model, ddp_opt = model, opt  # the DDP section's, for its checkpoint below

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = torch.nn.ModuleList([torch.nn.Linear(10, 10), torch.nn.Linear(10, 1)])

            def forward(self, x):
                for block in self.blocks:
                    x = block(x)
                return x

        model = Net()
    """,
    ("distributed.md", 2): """
        fsdp_model, fsdp_opt = model, opt  # the FSDP2 section's, for its checkpoint below
        inner = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    """,
    ("distributed.md", 3): 'model, opt, path = ddp_model, ddp_opt, "checkpoint.pt"',
    ("distributed.md", 4): 'model, opt, ckpt_dir = fsdp_model, fsdp_opt, "dcp-checkpoint"',
}

#: (page, block) -> the code a block's `...` line stands for (the reader's training).
FILL: dict[tuple[str, int], str] = {
    ("gradient_stats.md", 0): """
        state = opt.init(params)
        loss, grads = lsj.value_and_grad(loss_fn)(params, x, y, opt_state=state)
        updates, state = jax.jit(opt.update)(grads, state, params)
    """,
    ("gradient_stats.md", 1): """
        for x, y in [(torch.randn(8, 10), torch.randn(8, 1))] * 2:
            opt.zero_grad()
            opt.get_scaled_loss(torch.nn.functional.mse_loss(model(x), y)).backward()
            opt.step()
    """,
    ("distributed.md", 1): "x, y = loader[0]; loss = loss_fn(model(x), y)",
}

#: (page, block) -> (text, the smaller run's text): a run the page sizes for real use, made small for the suite.
SHRINK: dict[tuple[str, int], tuple[tuple[str, str], ...]] = {
    ("demo.md", 0): (("steps=300)", "steps=6, measure_every=3, k1_reference=False)"),),
}

#: (page, block) -> why the block cannot run here (it is compiled all the same).
SKIP: dict[tuple[str, int], str] = {
    ("jax.md", 2): "a multi-process launch: jax.distributed.initialize with a coordinator on another host "
                   "(tests/jax/test_multiprocess.py runs it as two local processes)",
}

TORCH_PAGES = ("getting-started/torch.md", "how-to/accumulation.md", "how-to/checkpoints.md",
               "how-to/diagnostics.md", "how-to/trainers.md", "distributed.md")
JAX_PAGES = ("getting-started/jax.md", "jax.md", "migration/jmp.md")
BOTH_PAGES = ("gradient_stats.md", "demo.md")


def run(page: str, **kwargs):
    return run_page(page, setup=SETUP, fill=FILL, skip=SKIP, shrink=SHRINK, **kwargs)


def torch_or_skip():
    return pytest.importorskip("torch")


def jax_or_skip():
    pytest.importorskip("optax")
    return pytest.importorskip("jax")


def test_every_python_block_of_the_manual_is_run_here_or_by_the_keras_tests():
    assert pages_with_python() == sorted({*TORCH_PAGES, *JAX_PAGES, *BOTH_PAGES, *KERAS_PAGES})
    for page, i in (*SETUP, *FILL, *SKIP, *SHRINK):
        assert page in {*TORCH_PAGES, *JAX_PAGES, *BOTH_PAGES} and i < len(python_blocks(page)), (page, i)
    # every block fits the site's code column
    for page in pages_with_python():
        for i, code in enumerate(python_blocks(page)):
            assert max(len(line) for line in code.splitlines()) <= 100, (page, i)


# --- PyTorch ---------------------------------------------------------------------------------------------------


def test_getting_started_torch(capsys):
    torch = torch_or_skip()
    ns, ran = run("getting-started/torch.md")
    assert ran == [0, 1, 2, 3]
    # Seeded, the three steps are finite: the default scale, nothing skipped.
    assert capsys.readouterr().out.split() == ["32768.0", "False", "0"]
    opt, model = ns["opt"], ns["model"]
    # "dynamic by default: 2**15, doubled after 2000 finite steps in a row, halved on an overflow"
    assert opt.loss_scale_policy.get_config() == {"initial_loss_scale": 2.0**15, "increment_period": 2000,
                                                  "multiplier": 2.0}
    # 3 loop steps, minimize, apply_gradients (which counted global_step), the clipped step: all applied.
    assert [int(opt.state[p]["step"]) for p in model.parameters()] == [6] * 4
    assert int(ns["step_tensor"]) == 1 and bool(torch.isfinite(ns["total_norm"])) and float(ns["total_norm"]) > 0
    # One scale, two optimizers: each stepped once, nothing skipped, the scale updated once.
    for inner in (ns["adam_g"], ns["adam_d"]):
        assert {int(s["step"]) for s in inner.state.values()} == {1}
    assert float(ns["scale"].loss_scale) == 2.0**15 and int(ns["opt_d"].skipped_steps) == 0
    # A second iteration, an Inf in the discriminator's gradients only: "each checks its own gradients and skips
    # on its own", the update "backs off if either overflowed", and opt_d's counters are its own, in its state_dict.
    gen, disc, scale, opt_g, opt_d = (ns[k] for k in ("gen", "disc", "scale", "opt_g", "opt_d"))
    opt_g.zero_grad(), opt_d.zero_grad()
    scale.get_scaled_loss(disc(gen(torch.randn(8, 4))).square().mean()).backward()
    disc.bias.grad.fill_(math.inf)
    opt_g.step(), opt_d.step()
    scale.update()
    assert (bool(opt_g.last_step_skipped), bool(opt_d.last_step_skipped)) == (False, True)
    assert float(scale.loss_scale) == 2.0**14 and (int(opt_g.skipped_steps), int(opt_d.skipped_steps)) == (0, 1)
    assert int(opt_d.state_dict()["lossscale"]["optimizer"]["skipped_steps"]) == 1


def test_how_to_accumulation():
    torch_or_skip()
    ns, _ = run("how-to/accumulation.md")
    opt = ns["opt"]
    # 8 micro-batches, K = 4: two optimizer steps, both applied, at the default scale.
    assert [int(opt.state[p]["step"]) for p in ns["model"].parameters()] == [2, 2]
    assert float(opt.loss_scale) == 2.0**15 and int(opt.skipped_steps) == 0


def test_how_to_checkpoints(tmp_path, monkeypatch):
    torch = torch_or_skip()
    monkeypatch.chdir(tmp_path)
    ns, _ = run("how-to/checkpoints.md")
    assert "lossscale" in ns["ckpt"]["opt"]
    # A new optimizer loads the scale, the skip counter and the policy (its floor) from the file.
    from lossscale.torch import LossScaleOptimizer

    model = ns["model"]
    fresh = LossScaleOptimizer(torch.optim.AdamW(model.parameters(), fused=True))
    fresh.load_state_dict(torch.load("checkpoint.pt", weights_only=True)["opt"])
    assert float(fresh.loss_scale) == 2.0**14 and int(fresh.skipped_steps) == 1
    assert fresh.loss_scale_policy.min_loss_scale == 4


def test_how_to_diagnostics():
    torch = torch_or_skip()
    ns, _ = run("how-to/diagnostics.md")
    opt, model = ns["opt"], ns["model"]
    # A step whose 0.weight holds a NaN and 1.bias an Inf: the report the page shows, in its format.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    model[0].weight.grad[0, 0] = math.nan
    model[1].bias.grad[0] = math.inf
    opt.step()
    shown = re.search(r"```text\n(.*?)```", (DOCS / "how-to/diagnostics.md").read_text("utf-8"), re.DOTALL)[1]
    # (steps count from 0; the page's example is a later step at a smaller scale)
    expected = textwrap.dedent(shown).strip().replace("step 2 ", "step 0 ").replace("loss scale 8;", "loss scale 32768;")
    assert str(opt.last_overflow_report).strip() == expected
    assert opt.history.skipped.tolist() == [True] and opt.history.loss_scales.tolist() == [2.0**15]


def test_how_to_trainers(capsys):
    torch_or_skip()
    run("how-to/trainers.md")
    assert capsys.readouterr().out.split() == ["32768.0", "False", "1"]
    # "Other seeds give 16384.0 False 2 or 65536.0 False 0": the same loop over other seeds.
    code = python_blocks("how-to/trainers.md")[0].replace("torch.manual_seed(0)", "torch.manual_seed(seed)")
    seen = set()
    for seed in range(1, 16):
        exec(compile(code, "docs/how-to/trainers.md[0]", "exec"), {"seed": seed})  # noqa: S102
        seen.add(capsys.readouterr().out.strip())
    assert seen <= {"32768.0 False 1", "16384.0 False 2", "65536.0 False 0"}
    assert {"16384.0 False 2", "65536.0 False 0"} <= seen


@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")  # the DDP block's "cuda" autocast
def test_distributed_on_one_rank(tmp_path, monkeypatch):
    torch_or_skip()
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not built in")
    monkeypatch.chdir(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        ns, ran = run("distributed.md")
    finally:
        dist.destroy_process_group()
    assert ran == [0, 1, 2, 3, 4, 5]
    # DDP: two applied steps. FSDP2: DTensor parameters, one applied step after the clip.
    ddp_opt, fsdp_opt = ns["ddp_opt"], ns["fsdp_opt"]
    assert {int(s["step"]) for s in ddp_opt.state.values()} == {2}
    assert all(type(p).__name__ == "DTensor" for p in ns["fsdp_model"].parameters())
    assert {int(s["step"]) for s in fsdp_opt.state.values()} == {1}
    assert int(fsdp_opt.skipped_steps) == 0 and float(fsdp_opt.loss_scale) == 2.0**15
    # The checkpoints were written, and loading them kept the scale state.
    assert (tmp_path / "checkpoint.pt").is_file() and (tmp_path / "dcp-checkpoint").is_dir()
    assert ns["state"]["loss_scale"] == fsdp_opt.shared_loss_scale.state_dict()


# --- JAX ------------------------------------------------------------------------------------------------------


def test_getting_started_jax(capsys):
    jax_or_skip()
    run("getting-started/jax.md")
    # The printed line is the one the block's comment shows.
    shown = re.search(r"print\(.*\)\s+# (.*)", python_blocks("getting-started/jax.md")[0])[1]
    assert capsys.readouterr().out.split() == shown.split() == ["32768.0", "0"]


def check_flax_linen(ns):
    state, loss = ns["train_step"](ns["state"], ns["x"], ns["y"])
    assert int(state.step) == 1 and math.isfinite(float(loss))
    assert not bool(ns["lsj"].find_state(state.opt_state).last_step_skipped)


def check_nnx(ns):
    loss = ns["train_step"](ns["model"], ns["optimizer"], ns["x"], ns["y"])
    state = ns["optimizer"].opt_state
    assert all(isinstance(v, ns["jax"].Array) for v in (state.last_step_skipped, state.loss_scale))  # "JAX arrays"
    assert math.isfinite(float(loss)) and not bool(state.last_step_skipped) and float(state.loss_scale) == 2.0**15


def check_jax_quickstart(ns):
    jax, jnp, opt, params = ns["jax"], ns["jnp"], ns["opt"], ns["params"]
    _, state, loss = ns["train_step"](params, ns["state"], ns["batch"])
    assert math.isfinite(float(loss)) and float(state.loss_scale) == 2.0**15 and int(state.skipped_steps) == 0
    # "dynamic: 2**15, doubled after 2000 finite steps in a row, halved on an overflow"
    update = jax.jit(opt.update)
    inf = jax.tree.map(lambda p: jnp.full_like(p, jnp.inf), params)
    assert float(update(inf, state, params)[1].loss_scale) == 2.0**14
    almost = state._replace(loss_scale_state=state.loss_scale_state._replace(good_steps=jnp.int32(1999)))
    assert float(update(jax.tree.map(jnp.ones_like, params), almost, params)[1].loss_scale) == 2.0**16


def check_restored(ns):
    # The restore brought back the overflowed state (the scale halved, one skip), and check_state passed it.
    assert float(ns["opt_state"].loss_scale) == 2.0**14 and int(ns["opt_state"].skipped_steps) == 1


def check_restored_across_settings(ns):
    # The statistics-on checkpoint went into the optimizer without them: its layout, the saved scale state.
    check_restored(ns)
    jax = ns["jax"]
    assert ns["opt_state"].stats is None
    assert jax.tree.structure(ns["opt_state"]) == jax.tree.structure(ns["tx"].init(ns["params"]))


AFTER = {("jax.md", 0): check_jax_quickstart, ("jax.md", 3): check_flax_linen, ("jax.md", 4): check_nnx,
         ("jax.md", 5): check_restored, ("jax.md", 6): check_restored_across_settings}


def test_jax_in_depth(tmp_path, monkeypatch):
    jax_or_skip()
    pytest.importorskip("flax")
    pytest.importorskip("orbax.checkpoint")
    monkeypatch.chdir(tmp_path)
    ns, ran = run("jax.md", after=AFTER)
    assert ran == [0, 1, 3, 4, 5, 6]
    # apply_gradients stepped the parameters eagerly (b starts at 0).
    assert float(ns["params"]["b"][0]) != 0.0


def test_migration_from_jmp(capsys):
    jax_or_skip()
    pytest.importorskip("jmp")
    ns, _ = run("migration/jmp.md")
    # jmp's step and lossscale's step both applied an update at 2**15; the moved state holds jmp's scale
    # and counter, and check_state accepted it.
    moved, jmp_scale = ns["state"].loss_scale_state, ns["loss_scale"]
    assert float(moved.loss_scale) == float(jmp_scale.loss_scale) == 2.0**15
    assert int(moved.good_steps) == int(jmp_scale.counter) == 1
    assert int(ns["opt_state"].loss_scale_state.good_steps) == 1


# --- pages with both ------------------------------------------------------------------------------------------


def test_gradient_stats(capsys):
    jax_or_skip()
    torch_or_skip()
    run("gradient_stats.md")
    out = capsys.readouterr().out
    # Two reports, the JAX one with the pytree paths, the torch one with the model's parameter names.
    assert "['w']" in out and "['b']" in out
    assert all(name in out for name in ("0.weight", "0.bias", "2.weight", "2.bias"))
    assert "param_groups" not in out


@pytest.mark.slow  # about 20 s however few the steps: JAX compiles the demo's three trainers, matplotlib plots
def test_demo_from_python(tmp_path, monkeypatch):
    jax_or_skip()
    pytest.importorskip("matplotlib")
    pytest.importorskip("sklearn")
    monkeypatch.chdir(tmp_path)
    ns, _ = run("demo.md")
    assert (tmp_path / "demo.png").is_file() and (tmp_path / "scale.png").is_file()
    runs = ns["result"].runs["jax"]
    assert math.isfinite(runs["fp16"].psnr_db) and len(runs["fp16+lossscale"].zero_grad_shares) > 0
