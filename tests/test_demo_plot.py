"""lossscale.demo.plot_history and write_tensorboard: what left the core History (issue 13, item 4)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lossscale import History
from lossscale.demo import plot_history, write_tensorboard

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _sample() -> History:
    h = History()
    h.extend(np.arange(4), [8.0, 8.0, 4.0, 4.0], [False, True, False, False], losses=[2.5, 2.25, 2.0, 1.75])
    h.append(4, 8.0, True)  # no loss for this one
    h.extend([5, 6], [4.0, 4.0], [False, False])
    return h


def test_plot_history_writes_a_png_with_log_scale_and_skip_markers(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "scale.png"
    ax = plot_history(_sample(), path=path)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert ax.get_yscale() == "log"
    markers = ax.collections[0].get_offsets()
    assert np.asarray(markers).tolist() == [[1.0, 8.0], [4.0, 8.0]]  # the two skipped steps, at their scale
    assert "skipped step (2)" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_plot_history_draws_into_given_axes():
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    assert plot_history(_sample(), ax=ax) is ax
    xs, ys = ax.lines[0].get_data()
    assert list(xs) == list(range(7)) and list(ys) == [8.0, 8.0, 4.0, 4.0, 8.0, 4.0, 4.0]


class FakeWriter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.calls.append((tag, value, step))


def test_write_tensorboard_calls_add_scalar():
    writer = FakeWriter()
    write_tensorboard(_sample(), writer, prefix="amp/")
    by_tag: dict[str, list[tuple[float, int]]] = {}
    for tag, value, step in writer.calls:
        by_tag.setdefault(tag, []).append((value, step))
    assert set(by_tag) == {"amp/loss_scale", "amp/skipped", "amp/loss"}
    assert by_tag["amp/loss_scale"] == [(8.0, 0), (8.0, 1), (4.0, 2), (4.0, 3), (8.0, 4), (4.0, 5), (4.0, 6)]
    assert [v for v, _ in by_tag["amp/skipped"]] == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert by_tag["amp/loss"] == [(2.5, 0), (2.25, 1), (2.0, 2), (1.75, 3)]  # steps without a loss are left out
    assert all(isinstance(step, int) and isinstance(value, float) for _, value, step in writer.calls)


def test_write_tensorboard_and_plot_reject_what_they_cannot_use():
    with pytest.raises(TypeError, match="add_scalar"):
        write_tensorboard(_sample(), object())
    with pytest.raises(TypeError, match="lossscale.History"):
        write_tensorboard({"steps": [0]}, FakeWriter())
    with pytest.raises(TypeError, match="lossscale.History"):
        plot_history([1.0, 2.0])


def test_history_no_longer_draws_or_logs():
    # The core record stays numpy-only; the methods moved to lossscale.demo.
    assert not hasattr(History, "plot") and not hasattr(History, "write_tensorboard")


def _run(mode: str, shares: float, history: History | None) -> Any:
    from lossscale.demo import RunResult

    return RunResult(
        framework="torch", mode=mode, global_batch_factor=1024, psnr_db=15.0, losses=np.ones(4),
        zero_grad_steps=np.array([0, 2, 3]), zero_grad_by_layer=np.full((3, 10), shares),
        layer_sizes=np.full(10, 4096), reconstructions=np.zeros((10, 64)),
        skipped_steps=0 if history is None else int(history.skipped.sum()),
        final_scale=None if history is None else float(history.loss_scales[-1]), history=history,
    )


def test_plot_demo_draws_the_auto_mode_when_present(tmp_path):
    pytest.importorskip("matplotlib")
    from lossscale.demo import ALL_MODES, MODES, DemoConfig, DemoResult, plot_demo
    from lossscale.demo.plot import LABELS

    def result(modes: tuple[str, ...]) -> DemoResult:
        scales = {"fp16+lossscale": [8.0, 16.0, 16.0, 32.0], "fp16+auto": [8.0, 2.0**20, 2.0**20, 2.0**20]}
        runs = {}
        for i, mode in enumerate(modes):
            history = None
            if mode in scales:
                history = History()
                history.extend(np.arange(4), scales[mode], [False] * 4)
            runs[mode] = _run(mode, 0.1 * (i + 1), history)
        return DemoResult(DemoConfig(steps=4, frameworks=("torch",)), {"torch": runs}, truth=np.zeros((10, 64)))

    bars_of = {}
    for modes in (MODES, ALL_MODES):
        path = tmp_path / f"demo{len(modes)}.png"
        fig = plot_demo(result(modes), path)
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        bars_ax = next(ax for ax in fig.axes if ax.get_title(loc="left") == "Gradients lost to float16 underflow")
        labels = [t.get_text() for t in bars_ax.get_legend().get_texts()]
        bars_of[len(modes)] = len(bars_ax.patches)
        scale_ax = next(ax for ax in fig.axes if ax.get_title(loc="left") == "lossscale's loss scale")
        time_ax = next(ax for ax in fig.axes if ax.get_title(loc="left").startswith("Underflow along the run"))
        # every float16 mode: one thin line per layer and one thick overall line, in its colour, over the measured steps
        float16_modes = [m for m in modes if m != "fp32"]
        assert len(time_ax.lines) == 11 * len(float16_modes)
        overall = [line for line in time_ax.lines if line.get_linewidth() > 2]
        assert [line.get_label() for line in overall] == [LABELS[m] for m in float16_modes]
        for line, mode in zip(overall, float16_modes):
            assert list(line.get_xdata()) == [0, 2, 3]
            np.testing.assert_allclose(line.get_ydata(), 100 * 0.1 * (list(modes).index(mode) + 1))
        scale_labels = [t.get_text() for t in scale_ax.get_legend().get_texts()]
        if modes == ALL_MODES:
            assert labels[-1] == "float16 + lossscale auto (experimental) (40% overall)"
            assert "auto (experimental), 0 skipped" in scale_labels
            assert list(scale_ax.lines[-1].get_ydata()) == [8.0, 2.0**20, 2.0**20, 2.0**20]
        else:
            assert not any("auto" in text for text in labels + scale_labels)
    assert bars_of == {3: 30, 4: 40}  # one bar per layer and mode
