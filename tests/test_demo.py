"""``python -m lossscale demo``: a short run's numbers, its picture and its command line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("rich")

import lossscale  # noqa: E402
from lossscale import _cli, _demo  # noqa: E402
from lossscale._demo import MODES, DemoConfig, run_demo  # noqa: E402

# Per framework, a run long enough that the unscaled fp16 run has lost gradients and lags fp32, with skips.
# With the demo's batch order the unscaled fp16 run is reliably behind fp32 only from about step 600.
# torch: 700 steps (fp16 3.3x fp32's final loss, the scaled run 1.1x, 12 skips; ~14 s).
# jax: the demo's own settings (1000 steps, growth every 20; ~10 s jitted).
CONFIGS = {"torch": DemoConfig(steps=700), "jax": DemoConfig(framework="jax")}
NEEDS = {"torch": ("torch",), "jax": ("jax", "optax")}
FLUSHED_AT_THE_END = {"torch": 0.5, "jax": 0.8}  # share of zero gradient values over the last 10 fp16 steps
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", params=list(CONFIGS))
def demo(request, tmp_path_factory):
    """``(config, result)`` of one demo run per framework, with its PNG."""
    for module in NEEDS[request.param]:
        pytest.importorskip(module)
    config = CONFIGS[request.param]
    return config, run_demo(config, output=tmp_path_factory.mktemp(f"demo_{request.param}") / "demo.png")


def test_runs_are_the_three_modes_from_the_same_start(demo):
    config, result = demo
    assert list(result.runs) == list(MODES)
    for run in result.runs.values():
        assert run.losses.shape == (config.steps,) and np.isfinite(run.losses).all()
        assert np.isfinite(run.final_loss) and 0 <= run.accuracy <= 1
    # Same weights, same first batch: the first losses differ only by float16 rounding.
    first = [run.losses[0] for run in result.runs.values()]
    np.testing.assert_allclose(first, first[0], rtol=1e-2)


def test_unscaled_fp16_loses_gradients_and_scaling_keeps_them(demo):
    config, result = demo
    fp32, fp16, scaled = (result.runs[m] for m in MODES)
    # fp32's zeros are structural (blank pixels); fp16 adds many flushed values; scaling adds none.
    assert fp32.zero_grad_percent < 2
    assert fp16.zero_grad_percent > 5 * scaled.zero_grad_percent
    assert fp16.zero_grad_percent > fp32.zero_grad_percent + 5
    assert abs(scaled.zero_grad_percent - fp32.zero_grad_percent) < 0.5
    # By the end the unscaled run has flushed most of its gradient values (fp32: a structural ~1%).
    assert fp16.zero_grad_fractions[-10:].mean() > FLUSHED_AT_THE_END[config.framework]
    # ...and it shows in training: fp16 lags, the scaled run tracks fp32.
    assert fp16.final_loss > 1.3 * fp32.final_loss
    # (Skipped steps make it a slightly different trajectory, not a copy: close, not equal.)
    assert scaled.final_loss == pytest.approx(fp32.final_loss, rel=0.5)
    assert abs(np.log(scaled.final_loss / fp32.final_loss)) < 0.5 * abs(np.log(fp16.final_loss / fp32.final_loss))
    assert scaled.accuracy > 0.85 and fp32.accuracy > 0.85


def test_skips_and_scale_agree_with_the_recorded_history(demo):
    config, result = demo
    scaled = result.runs["fp16+lossscale"]
    history = scaled.history
    assert history is not None and len(history) == config.steps
    assert history.steps.tolist() == list(range(config.steps))
    assert scaled.skipped_steps == history.num_skipped > 0
    # Replaying the recorded skip flags through the core rule gives the recorded scales and the final one.
    policy = lossscale.resolve_loss_scale(dynamic_growth_steps=config.growth_steps)
    state = lossscale.initial_state(policy, np)
    for recorded_scale, skipped in zip(history.loss_scales, history.skipped):
        assert float(state.loss_scale) == recorded_scale
        state = lossscale.next_state(policy, state, np.asarray(not skipped), np)
    assert float(state.loss_scale) == scaled.final_scale
    assert int(state.skipped_steps) == scaled.skipped_steps
    assert np.isfinite(history.losses).all()
    # The optimizer records the loss given to get_scaled_loss, i.e. the weighted one.
    np.testing.assert_allclose(history.losses / config.loss_weight, scaled.losses, rtol=1e-6)
    for mode in ("fp32", "fp16"):
        run = result.runs[mode]
        assert run.history is None and run.final_scale is None and run.skipped_steps == 0


def test_table_rows_show_the_numbers(demo):
    _, result = demo
    rows = {row[0]: row for row in result.table_rows()}
    assert len(_demo.TABLE_HEADER) == len(rows["fp32"]) == 6
    scaled = result.runs["fp16+lossscale"]
    assert rows["fp16+lossscale"][1] == f"{scaled.final_loss:.2e}"
    assert rows["fp16+lossscale"][4] == str(scaled.skipped_steps)
    assert rows["fp16+lossscale"][5] == f"2^{np.log2(scaled.final_scale):g}"
    assert rows["fp32"][4:] == rows["fp16"][4:] == ["-", "-"]
    assert rows["fp16"][3] == f"{result.runs['fp16'].zero_grad_percent:.1f}%"


def test_png_is_a_valid_image(demo):
    from matplotlib.image import imread

    _, result = demo
    with open(result.png_path, "rb") as handle:
        assert handle.read(8) == PNG_SIGNATURE
    pixels = imread(result.png_path)
    assert pixels.ndim == 3 and pixels.shape[0] > 500 and pixels.shape[1] > 800
    assert pixels.std() > 0.05  # not a blank canvas


def test_every_backend_takes_the_same_batch_order():
    config = DemoConfig(steps=25, seed=3)
    n = 1437  # 11 full batches of 128 per permutation, then a fresh one
    batches = _demo.batch_order(n, config)
    assert batches.shape == (25, 128)
    for epoch in (batches[:11], batches[11:22]):
        assert len(np.unique(epoch)) == epoch.size  # no index twice within one permutation
    assert not np.array_equal(batches[:11], batches[11:22])
    np.testing.assert_array_equal(batches, _demo.batch_order(n, config))  # seeded
    assert _demo.measured_steps(DemoConfig(steps=25)).tolist() == [0, 10, 20, 24]


def test_run_demo_validates_before_training(tmp_path):
    with pytest.raises(ValueError, match="steps must be at least 1"):
        run_demo(DemoConfig(steps=0), output=None)
    with pytest.raises(ValueError, match="framework must be one of jax, torch"):
        run_demo(DemoConfig(framework="tensorflow"), output=None)
    with pytest.raises(ValueError, match="does not exist"):
        run_demo(DemoConfig(steps=1), output=tmp_path / "missing" / "demo.png")
    with pytest.raises(ValueError, match=".png"):
        run_demo(DemoConfig(steps=1), output=tmp_path / "demo.jpg")
    with pytest.raises(TypeError, match="DemoConfig"):
        run_demo({"steps": 1}, output=None)


def test_cli_runs_and_prints_table_and_path(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "tiny.png"
    assert _cli.main(["demo", "--steps", "5", "--no-progress", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    for word in ("fp32", "fp16", "final loss", "zero grads", "skipped", str(out)):
        assert word in printed.replace("\n", "")
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_cli_help_documents_the_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["demo", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--steps", "--seed", "--output", "--framework", "{jax,torch}", "--loss-weight"):
        assert option in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "steps must be at least 1"),
        (["--steps", "ten"], "invalid int value"),
        (["--framework", "tensorflow"], "invalid choice"),
        (["--loss-weight", "0"], "loss_weight must be in (0, 1]"),
        (["--output", "no/such/folder/demo.png"], "does not exist"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_cli_bad_options_exit_2_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["demo", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_module_does_not_import_torch_until_it_trains():
    code = "import sys, lossscale._demo; print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_missing_framework_exits_2_naming_the_install_command(monkeypatch, capsys):
    from lossscale import _demo

    real_find_spec = _demo.importlib.util.find_spec
    monkeypatch.setattr(_demo.importlib.util, "find_spec", lambda name: None if name == "optax" else real_find_spec(name))
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["demo", "--framework", "jax", "--steps", "1"])
    assert exit_info.value.code == 2
    assert "needs optax: pip install 'lossscale[demo,jax]'" in capsys.readouterr().err
