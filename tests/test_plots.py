"""Plots checked for the data they draw (captured from the figure when it is saved), not for a PNG header."""
import json
import os
import sys

import matplotlib
import numpy as np
import pytest
from matplotlib.figure import Figure

from eval import extrapolation as ex

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
matplotlib.use("Agg")


@pytest.fixture
def saved_figures(monkeypatch):
    """Every figure saved while the test runs, in order (the PNG is still written)."""
    figures, save = [], Figure.savefig

    def recording_savefig(self, *args, **kwargs):
        figures.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    return figures


def drawn_lines(ax):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()
            if not line.get_label().startswith("_")}


def test_plot_runs_draws_each_runs_smoothed_train_and_raw_validation_curve(tmp_path, saved_figures):
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        import plot_runs
    finally:
        sys.path.pop(0)
    runs = {"rope": ([4.0, 3.0, 3.5, 2.0], [5.0, 2.5]), "fox": ([3.8, 3.6, 2.0, 2.4], [4.9, 2.2])}
    for name, (train_losses, val_losses) in runs.items():
        (tmp_path / name).mkdir()
        lines = [{"type": "train", "iter": i + 1, "tokens": 1000 * (i + 1), "loss": loss}
                 for i, loss in enumerate(train_losses)]
        lines += [{"type": "val", "iter": 4 * i, "tokens": 4000 * i, "val_loss": v} for i, v in enumerate(val_losses)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines[::-1]))
    out = tmp_path / "loss.png"
    assert plot_runs.main([str(tmp_path / "rope"), str(tmp_path / "fox"), "--out", str(out), "--smooth", "0.5"]) == 0
    (figure,) = saved_figures
    ax_train, ax_val = figure.axes[:2]
    for name, (train_losses, val_losses) in runs.items():
        # EMA with weight 0.5 and bias correction: a_i = 0.5 a_{i-1} + 0.5 x_i, shown as a_i / (1 - 0.5^(i+1))
        average, expected = 0.0, []
        for i, loss in enumerate(train_losses):
            average = 0.5 * average + 0.5 * loss
            expected.append(average / (1 - 0.5 ** (i + 1)))
        x, y = drawn_lines(ax_train)[name]
        assert x == pytest.approx([1, 2, 3, 4]) and y == pytest.approx(expected)  # tokens in thousands, sorted
        x, y = drawn_lines(ax_val)[name]
        assert x == pytest.approx([0, 4]) and y == pytest.approx(val_losses)
    assert "thousands" in ax_train.get_xlabel() and out.stat().st_size > 0


def result(name, train_context, curves):
    return {"name": name, "encoding": name, "train_context": train_context,
            "contexts": {str(c): {"nonoverlapping": {"binned_positions": list(range(len(v))), "binned_loss": v}}
                         for c, v in curves.items()}}


def test_extrapolation_plots_draw_the_longest_context_and_the_passkey_grid(tmp_path, saved_figures):
    results = [result("rope", 64, {64: [3.0, 2.0], 256: [3.1, 2.1, 2.5, 4.0]}),
               result("alibi", 32, {128: [3.2, 2.2, 2.3], 32: [3.0, 2.0]})]
    ex.plot_loss_vs_position(results, str(tmp_path / "loss.png"))
    (figure,) = saved_figures
    ax = figure.axes[0]
    lines = drawn_lines(ax)
    assert lines["rope (rope)"] == ([0, 1, 2, 3], [3.1, 2.1, 2.5, 4.0])
    assert lines["alibi (alibi)"] == ([0, 1, 2], [3.2, 2.2, 2.3])
    vertical = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_label().startswith("_"))
    assert vertical == [32, 64]  # one dashed line per training context
    accuracy = [[1.0, 0.5], [0.25, 0.0], [0.75, 1.0]]  # 3 lengths x 2 depths
    passkey = {**results[0], "passkey": {"lengths": [64, 128, 256], "actual_lengths": [60, 125, 250],
                                         "depths": [0.0, 1.0], "accuracy": accuracy}}
    ex.plot_passkey(passkey, str(tmp_path / "passkey.png"))
    ax = saved_figures[1].axes[0]
    np.testing.assert_array_equal(ax.get_images()[0].get_array(), np.array(accuracy).T)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["60", "125", "250"]
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{a:.2f}" for row in accuracy for a in row)
