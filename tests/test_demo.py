"""``python -m lossscale demo``: a short run's JSON, picture and tables; the command line; the failure it shows."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("rich")

import lossscale
from lossscale import demo
from lossscale.demo import ALL_MODES, AUTO_MODE, MODES, DemoConfig, _backends, _data, run_demo
from lossscale.demo._results import check_modes

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
INSTALLED = tuple(b.name for b in _backends.BACKENDS if not b.missing())
needs_both = pytest.mark.skipif(INSTALLED != ("torch", "jax"), reason="needs torch, jax and optax")


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    """A 12-step run of both frameworks (scale doubling every 3 steps), with its PNG and JSON."""
    if INSTALLED != ("torch", "jax"):
        pytest.skip("needs torch, jax and optax")
    config = DemoConfig(steps=12, growth_steps=3, measure_every=4, seed=1)
    return run_demo(config, output=tmp_path_factory.mktemp("demo") / "demo.png")


def test_results_json_sits_beside_the_png_keyed_by_backend_then_mode(short):
    assert short.json_path is not None and short.png_path is not None
    assert short.json_path.endswith("demo_results.json")
    with open(short.json_path) as handle:
        document = json.load(handle)
    assert list(document) == ["torch", "jax"]
    for framework, modes in document.items():
        assert list(modes) == list(MODES)
        for mode, entry in modes.items():
            run = short.runs[framework][mode]
            assert entry["metric"] == "psnr_db"
            assert entry["value"] == pytest.approx(run.psnr_db) and 5 < entry["value"] < 40
            shares = entry["zero_grad_shares"]
            assert len(shares) == 10 and all(0 <= s <= 1 for s in shares)
            np.testing.assert_allclose(shares, run.zero_grad_by_layer.mean(axis=0))
            assert entry["settings"]["global_batch_factor"] == 1024
            assert (entry["settings"]["steps"], entry["settings"]["seed"]) == (12, 1)
            assert entry["wall_seconds"] > 0
            if mode == "fp16+lossscale":
                assert entry["final_loss_scale"] == run.final_scale and entry["skipped_steps"] == run.skipped_steps
            else:
                assert entry["final_loss_scale"] is None and entry["skipped_steps"] == 0
        k1 = modes["fp16"]["k1_reference"]
        assert k1["settings"]["global_batch_factor"] == 1 and k1["value"] == pytest.approx(
            short.k1_runs[framework]["fp16"].psnr_db
        )


def test_every_mode_starts_from_the_same_weights_on_the_same_batches(short):
    for runs in short.runs.values():
        first = [runs[mode].losses[0] for mode in MODES]
        np.testing.assert_allclose(first, first[0], rtol=1e-2)  # float16 rounding only
        assert all(runs[mode].losses.shape == (12,) for mode in MODES)
        assert runs["fp16+lossscale"].reconstructions.shape == short.truth.shape == (10, 64)


def test_scaled_runs_history_replays_through_the_core_rule(short):
    policy = lossscale.resolve_loss_scale(dynamic_growth_steps=3)
    for runs in short.runs.values():
        scaled = runs["fp16+lossscale"]
        history = scaled.history
        assert history is not None and history.steps.tolist() == list(range(12))
        state = lossscale.initial_state(policy, np)
        for recorded, skipped in zip(history.loss_scales, history.skipped):
            assert float(state.loss_scale) == recorded
            state = lossscale.next_state(policy, state, np.asarray(not skipped), np)
        assert float(state.loss_scale) == scaled.final_scale == 2.0**19  # four doublings in 12 good steps
        np.testing.assert_allclose(history.losses * 1024, scaled.losses, rtol=1e-6)  # recorded: the loss / K


def test_png_is_a_picture(short):
    from matplotlib.image import imread

    with open(short.png_path, "rb") as handle:
        assert handle.read(8) == PNG_SIGNATURE
    pixels = imread(short.png_path)
    assert pixels.shape[0] > 800 and pixels.shape[1] > 1500 and pixels.std() > 0.05


@needs_both
def test_cli_prints_the_tables_and_where_the_files_went(tmp_path, capsys):
    out = tmp_path / "tiny.png"
    assert demo.main(["--steps", "3", "--no-k1", "--no-progress", "-o", str(out)]) == 0
    printed = capsys.readouterr().out.replace("\n", "")
    for word in ("torch: held-out PSNR", "jax: held-out PSNR", "fp16+lossscale", "What is simulated", str(out)):
        assert word in printed
    assert "K=1" not in printed
    assert AUTO_MODE not in printed  # the experimental mode is opt-in
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    assert json.loads((tmp_path / "demo_results.json").read_text())["jax"]["fp32"]["settings"]["steps"] == 3


def test_cli_help_documents_the_options():
    out = subprocess.run(
        [sys.executable, "-m", "lossscale", "demo", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for option in ("--global-batch-factor", "--framework", "{torch,jax,both}", "--sweep", "--steps", "--output", "--auto"):
        assert option in out


def test_python_m_lossscale_help_lists_the_commands_and_version_prints_it():
    from importlib import metadata

    import lossscale

    run = subprocess.run([sys.executable, "-m", "lossscale", "--help"], check=False, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("usage: python -m lossscale [-h] [-V] <command> [options]")
    assert "\ncommands:\n  demo       train a digits autoencoder" in run.stdout
    assert "python -m lossscale demo --help` lists its options" in run.stdout and "-V, --version" in run.stdout
    bare = subprocess.run([sys.executable, "-m", "lossscale"], check=False, capture_output=True, text=True)
    assert bare.returncode == 2 and bare.stderr == run.stdout  # no command: the same help, as an error
    for flag in ("--version", "-V"):
        run = subprocess.run([sys.executable, "-m", "lossscale", flag], check=False, capture_output=True, text=True)
        assert run.returncode == 0 and run.stdout == f"lossscale {metadata.version('lossscale')}\n"
    assert metadata.version("lossscale") == lossscale.__version__


def test_python_m_lossscale_names_its_one_command():
    run = subprocess.run([sys.executable, "-m", "lossscale", "train"], check=False, capture_output=True, text=True)
    assert run.returncode == 2 and "unknown command 'train'; the one command is 'demo'" in run.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "steps must be at least 1"),
        (["--steps", "ten"], "invalid int value"),
        (["-K", "0"], "global_batch_factor must be at least 1"),
        (["--framework", "tensorflow"], "invalid choice"),
        (["--output", "no/such/folder/demo.png"], "does not exist"),
        (["--output", "demo.jpg"], "must be a .png path"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_cli_bad_options_exit_2_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_framework_exits_2_naming_the_install_command(monkeypatch, capsys):
    real_find_spec = _backends.importlib.util.find_spec
    monkeypatch.setattr(_backends.importlib.util, "find_spec", lambda n: None if n == "optax" else real_find_spec(n))
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--steps", "1"])
    assert exit_info.value.code == 2
    assert "The jax demo needs optax: pip install 'lossscale[demo]'" in capsys.readouterr().err
    with pytest.raises(ModuleNotFoundError, match="choose another --framework"):
        run_demo(DemoConfig(steps=1), output=None)


def test_config_and_run_demo_validate_before_training(tmp_path):
    with pytest.raises(ValueError, match="frameworks must be distinct names out of torch, jax"):
        DemoConfig(frameworks=("torch", "torch"))
    with pytest.raises(TypeError, match="tuple of names"):
        DemoConfig(frameworks="torch")
    with pytest.raises(ValueError, match="widths must be positive ints"):
        DemoConfig(widths=(64, 0))
    with pytest.raises(ValueError, match="lr must be a positive number"):
        DemoConfig(lr=math.inf)
    with pytest.raises(TypeError, match="DemoConfig"):
        run_demo({"steps": 1}, output=None)
    with pytest.raises(ValueError, match="does not exist"):
        run_demo(DemoConfig(steps=1), output=tmp_path / "missing" / "demo.png")
    with pytest.raises(ValueError, match="factors must be positive ints"):
        demo.run_sweep(DemoConfig(steps=1), factors=(0,), output=None)


def test_importing_the_demo_imports_no_framework_and_no_matplotlib():
    code = "import sys, lossscale.demo; print(sorted(m for m in ('torch', 'jax', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_backend_takes_the_same_batch_order():
    batches = _data.batch_order(1437, 12, 256, seed=3)  # 5 full micro-batches per permutation, then a fresh one
    assert batches.shape == (12, 256)
    for epoch in (batches[:5], batches[5:10]):
        assert len(np.unique(epoch)) == epoch.size
    assert not np.array_equal(batches[:5], batches[5:10])
    np.testing.assert_array_equal(batches, _data.batch_order(1437, 12, 256, seed=3))
    assert _data.measured_steps(25, 10).tolist() == [0, 10, 20, 24]


# ---------------------------------------------------------------- --auto: the experimental policy, opt-in


@pytest.fixture(scope="module")
def short_auto(tmp_path_factory):
    """A 6-step ``--auto`` run of both frameworks: the three modes and fp16+auto, with its PNG and JSON."""
    if INSTALLED != ("torch", "jax"):
        pytest.skip("needs torch, jax and optax")
    config = DemoConfig(steps=6, growth_steps=3, measure_every=2, seed=1, k1_reference=False, auto=True)
    return run_demo(config, output=tmp_path_factory.mktemp("demo_auto") / "demo.png")


def test_default_config_trains_exactly_the_three_modes():
    assert DemoConfig().modes == MODES == ("fp32", "fp16", "fp16+lossscale")
    assert DemoConfig(auto=True).modes == ALL_MODES == (*MODES, "fp16+auto")
    with pytest.raises(TypeError, match="auto must be True or False"):
        DemoConfig(auto="yes")
    check_modes(AUTO_MODE)
    with pytest.raises(ValueError, match="fp16\\+auto; got 'fp16\\+dynamic'"):
        check_modes("fp16+dynamic")


def test_auto_mode_runs_in_both_frameworks_and_reports_its_scale(short_auto):
    with open(short_auto.json_path) as handle:
        document = json.load(handle)
    measured = _data.measured_steps(6, 2)
    for framework in ("torch", "jax"):
        runs = short_auto.runs[framework]
        assert list(runs) == list(ALL_MODES) and list(document[framework]) == list(ALL_MODES)
        auto, fp16 = runs[AUTO_MODE], runs["fp16"]
        assert auto.zero_grad_by_layer.shape == (len(measured), 10) == fp16.zero_grad_by_layer.shape
        np.testing.assert_array_equal(auto.zero_grad_steps, measured)
        assert ((auto.zero_grad_by_layer >= 0) & (auto.zero_grad_by_layer <= 1)).all()
        # At K = 1024 the gradients sit far below float16's normals: auto jumps above the TF rule's 2^15
        # in one step (its history shows the jump) and recovers what plain fp16 flushed.
        assert auto.skipped_steps == 0 and auto.history is not None
        assert auto.history.steps.tolist() == list(range(6)) and auto.history.loss_scales[0] == 2.0**15
        assert auto.final_scale is not None and auto.final_scale >= 2.0**20
        assert math.log2(auto.final_scale).is_integer()
        assert auto.zero_grad_share < fp16.zero_grad_share - 0.5
        entry = document[framework][AUTO_MODE]
        assert entry["final_loss_scale"] == auto.final_scale and entry["skipped_steps"] == auto.skipped_steps
        assert len(entry["zero_grad_shares"]) == 10
        # The other three runs are the default demo's, unchanged by --auto.
        assert runs["fp16+lossscale"].final_scale == 2.0**17  # doubled after every 3 good steps


def test_auto_png_is_a_picture(short_auto):
    with open(short_auto.png_path, "rb") as handle:
        assert handle.read(8) == PNG_SIGNATURE


@pytest.mark.skipif("torch" not in INSTALLED, reason="needs torch")
def test_cli_auto_adds_the_auto_row(tmp_path, capsys):
    out = tmp_path / "auto.png"
    argv = ["--auto", "--framework", "torch", "--steps", "2", "--no-k1", "--no-progress", "-o", str(out)]
    assert demo.main(argv) == 0
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if AUTO_MODE in line)
    assert "2^" in row and " 0 " in row  # its final scale and its skipped steps
    assert "EXPERIMENTAL" in printed.replace("\n", " ")
    document = json.loads((tmp_path / "demo_results.json").read_text())
    assert list(document["torch"]) == list(ALL_MODES)


# ---------------------------------------------------------------- the failure the demo shows


@needs_both
def test_reduced_run_fp16_fails_and_lossscale_rescues():
    # The default recipe (K = 1024, same model, batch and Adam) cut to 300 steps: plain fp16 is stuck at the
    # mean-image blob (~10.9 dB) with every encoder weight gradient flushed; fp32 and the scaled run have
    # left it. (At 1000 steps the gap is ~6.7 dB: see the slow test below.)
    result = run_demo(DemoConfig(steps=300, k1_reference=False), output=None)
    for runs in result.runs.values():
        fp32, fp16, scaled = (runs[m] for m in MODES)
        assert fp16.psnr_db < fp32.psnr_db - 1.0
        assert abs(scaled.psnr_db - fp32.psnr_db) < 0.75
        assert fp16.zero_grad_shares[:4].min() > 0.95  # the encoder learns nothing
        assert scaled.zero_grad_share < fp32.zero_grad_share + 0.01


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_default_demo_meets_the_issue_bar(framework):
    if framework not in INSTALLED:
        pytest.skip(f"needs {framework}")
    result = run_demo(DemoConfig(frameworks=(framework,)), output=None)
    fp32, fp16, scaled = (result.runs[framework][m] for m in MODES)
    assert fp16.psnr_db <= fp32.psnr_db - 1.5
    # JAX's float16 results depend on the CPU (they differ on one with AVX-512 FP16; the cause is not pinned): seed 0's
    # fp16+lossscale reads 17.23 dB on most machines, 16.89 on such a CPU, against fp32's 17.45 (docs/demo.md).
    assert abs(scaled.psnr_db - fp32.psnr_db) <= (0.02 if framework == "torch" else 0.04) * fp32.psnr_db
    assert fp32.psnr_db > 16.5  # recognisable digits
    assert fp16.zero_grad_share > 0.8 and scaled.zero_grad_share < fp32.zero_grad_share + 0.01
    k1 = result.k1_runs[framework]["fp16"]
    # At K = 1 this model's own gradients fit float16 (seeds 0-2: within 0.2 dB in torch, 1.3 dB in JAX).
    assert abs(k1.psnr_db - fp32.psnr_db) < 1.5


def test_help_shows_every_default():
    from lossscale.demo._cli import _parser

    parser = _parser()
    text = " ".join(parser.format_help().split())  # argparse wraps lines: compare with the spaces collapsed
    defaults = DemoConfig()
    for shown in (f"data split, weights and batch order (default: {defaults.seed})",
                  f"divided by K (default: {defaults.global_batch_factor})", f"(default: {defaults.steps})",
                  f"torch intra-op threads (default: {defaults.threads})", "(default: lossscale_demo.png)"):
        assert shown in text, shown
    options = [a for a in parser._actions if a.help and a.help != argparse.SUPPRESS and a.dest != "help"]
    assert len(options) == 11
    for action in options:
        assert "(default: " in " ".join(parser._get_formatter()._expand_help(action).split()), action.dest
