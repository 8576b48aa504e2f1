"""Plots checked for the data they draw (captured from the figure when it is saved), not for a PNG header."""
import json
import os

import matplotlib
import numpy as np
import pytest
from matplotlib.figure import Figure

from eval import extrapolation as ex
from helpers import refused_out_message, unwritable

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
    from studies import curves as plot_runs  # the code of scripts/plot_runs.py
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


def test_plot_runs_gives_each_group_one_hue_in_shades_and_a_single_point_a_marker(tmp_path, saved_figures):
    """Seeds of one encoding share a hue (lighter shades), encodings differ; a run whose only logged point is its
    last step (log_interval > max_iters) is drawn as a marker, not as an invisible one-point line."""
    import colorsys

    from matplotlib.colors import to_rgb
    from studies import curves as plot_runs
    runs = {"rope1": 4, "rope2": 4, "fox1": 1, "rope3": 4, "fox2": 4}
    for name, n_points in runs.items():
        (tmp_path / name).mkdir()
        lines = [{"type": "train", "iter": i + 1, "tokens": 100 * (i + 1), "loss": 5.0 - i} for i in range(n_points)]
        lines.append({"type": "val", "iter": n_points, "tokens": 100 * n_points, "val_loss": 4.0})
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    groups = [name[:-1] for name in runs]
    assert plot_runs.main([str(tmp_path / name) for name in runs] + ["--out", str(tmp_path / "loss.png"),
                                                                     "--groups", *groups]) == 0
    ax_train, ax_val = saved_figures[0].axes[:2]
    for ax in (ax_train, ax_val):
        lines = {line.get_label(): line for line in ax.get_lines()}
        colours = {name: to_rgb(lines[name].get_color()) for name in runs}
        hue = {name: colorsys.rgb_to_hsv(*colour)[0] for name, colour in colours.items()}
        for group in ("rope", "fox"):
            members = [name for name in runs if name.startswith(group)]
            assert all(hue[m] == pytest.approx(hue[members[0]], abs=1e-9) for m in members)
            assert len({colours[m] for m in members}) == len(members)  # shades: no two seeds alike
        assert abs(hue["rope1"] - hue["fox1"]) > 0.05
    single = {line.get_label(): line for line in ax_train.get_lines()}["fox1"]
    assert list(single.get_xdata()) == [100] and single.get_marker() not in (None, "", "None")
    assert {line.get_label(): line for line in ax_train.get_lines()}["rope1"].get_marker() in (None, "", "None")


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
    colorbar = ax.get_images()[0].colorbar  # the scale is the image's: accuracy 0 to 1
    assert colorbar is not None and (colorbar.vmin, colorbar.vmax) == (0.0, 1.0)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["60", "125", "250"]
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{a:.2f}" for row in accuracy for a in row)


# -------------------------------------------------------------------------------- scripts/plot_runs.py's errors


def logged_run(folder, text=None):
    """A run folder whose metrics.jsonl holds `text`, or two train records and one val record."""
    folder.mkdir()
    records = [{"type": "train", "iter": 1, "tokens": 100, "loss": 4.0},
               {"type": "train", "iter": 2, "tokens": 200, "loss": 3.0},
               {"type": "val", "iter": 2, "tokens": 200, "val_loss": 3.5}]
    (folder / "metrics.jsonl").write_text(text if text is not None else "".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


@pytest.mark.fault
def test_plot_runs_refuses_an_out_that_is_a_folder_before_drawing(tmp_path, saved_figures, capsys):
    """os.replace onto a folder was an IsADirectoryError traceback after drawing, and left OUT.tmp.png beside it."""
    from studies import curves as plot_runs
    run = logged_run(tmp_path / "run")
    assert plot_runs.main([run, "--out", run]) == 2
    assert capsys.readouterr().err == (f"error: --out {run} is a folder; name the PNG file to write, e.g. "
                                       f"{os.path.join(run, 'loss_curves.png')}\n")
    assert saved_figures == [] and sorted(os.listdir(tmp_path)) == ["run"]
    assert os.listdir(run) == ["metrics.jsonl"]


@pytest.mark.fault
@pytest.mark.parametrize("below", [False, True])
def test_plot_runs_says_in_one_sentence_that_its_out_folder_cannot_be_written(below, tmp_path, monkeypatch,
                                                                              saved_figures, capsys):
    from studies import curves as plot_runs
    run = logged_run(tmp_path / "run")
    locked = tmp_path / "locked"
    locked.mkdir()
    unwritable(monkeypatch, locked)
    out = locked / "sub" / "loss.png" if below else locked / "loss.png"
    assert plot_runs.main([run, "--out", str(out)]) == 2
    expected = refused_out_message(locked / "sub" if below else locked, locked, below, "the plot")
    assert capsys.readouterr().err == f"error: {expected}\n"
    assert saved_figures == [] and list(locked.iterdir()) == []


@pytest.mark.fault
def test_plot_runs_names_the_runs_without_readable_metrics_and_fails_when_none_has_any(tmp_path, saved_figures,
                                                                                         capsys):
    """An empty or damaged metrics.jsonl drew an empty plot with exit status 0 (only matplotlib's legend warning)."""
    from studies import curves as plot_runs
    empty = logged_run(tmp_path / "empty", "")
    garbage = logged_run(tmp_path / "garbage", "\ufffd\ufffd garbage\n{\"bad json\n[1, 2]\n")
    good = logged_run(tmp_path / "good")
    out = tmp_path / "loss.png"
    assert plot_runs.main([empty, garbage, "--out", str(out)]) == 2
    files = f"{os.path.join(empty, 'metrics.jsonl')}, {os.path.join(garbage, 'metrics.jsonl')}"
    assert capsys.readouterr().err == (f"error: no readable training or validation records in {files} (empty or "
                                       "damaged), so there is nothing to plot; pass run directories whose training "
                                       "has logged a step\n")
    assert saved_figures == [] and not out.exists()
    assert plot_runs.main([garbage, good, "--out", str(out)]) == 0  # the others are still drawn, the one named
    assert capsys.readouterr().err == (f"warning: no readable training or validation records in "
                                       f"{os.path.join(garbage, 'metrics.jsonl')} (empty or damaged); the plot leaves "
                                       "it out\n")
    ax_train, ax_val = saved_figures[0].axes[:2]
    assert list(drawn_lines(ax_train)) == list(drawn_lines(ax_val)) == ["good"] and out.exists()
    # a run stopped before its first validation has training records only: drawn, not called unreadable
    early = logged_run(tmp_path / "early", json.dumps({"type": "train", "iter": 1, "tokens": 100, "loss": 4.0}) + "\n")
    assert plot_runs.main([early, "--out", str(out)]) == 0 and capsys.readouterr().err == ""
    assert list(drawn_lines(saved_figures[-1].axes[0])) == ["early"]


@pytest.mark.fault
def test_plot_runs_skips_records_without_their_numbers_as_damaged_lines(tmp_path, saved_figures, capsys):
    """A train record without its tokens (or a val record whose tokens are text) was a KeyError traceback (or a
    sort of str against int): each is a damaged line, left out like one cut short."""
    from studies import curves as plot_runs
    records = [{"type": "train", "iter": 1, "tokens": 100, "loss": 4.0}, {"type": "train", "iter": 2, "loss": 3.0},
               {"type": "train", "iter": 3, "tokens": 300, "loss": True}, {"type": "val", "iter": 2, "tokens": "200",
                                                                            "val_loss": 3.5},
               {"type": "val", "iter": 4, "tokens": 400, "val_loss": 2.5}]
    run = logged_run(tmp_path / "run", "".join(json.dumps(r) + "\n" for r in records))
    assert plot_runs.read_curves(run) == {"train": [(100, 4.0)], "val": [(400, 2.5)]}
    assert plot_runs.main([run, "--out", str(tmp_path / "loss.png")]) == 0 and capsys.readouterr().err == ""


@pytest.mark.fault
def test_plot_runs_leaves_no_partial_file_when_the_disk_fills(tmp_path, monkeypatch, capsys):
    """Checked writable before drawing, the folder may still fill: one sentence, no OUT.tmp.png left behind."""
    import errno

    from studies import curves as plot_runs
    run = logged_run(tmp_path / "run")

    def full_disk(self, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\x89PNG")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(Figure, "savefig", full_disk)
    out = tmp_path / "plots" / "loss.png"
    assert plot_runs.main([run, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: cannot write the plot to {out} (No space left on device); free space "
                                       "or choose another --out\n")
    assert list((tmp_path / "plots").iterdir()) == []


def test_plot_runs_bands_draw_each_group_once_with_its_mean_and_range(tmp_path, saved_figures):
    """A study's loss-curve figure had 24 legend entries over its curves: with --bands each encoding is one line,
    the mean of its seeds, in a band from their lowest to their highest loss, and the one legend is beside the
    panels."""
    from studies import curves as plot_runs
    values = {"rope1": [5.0, 4.0, 3.0], "rope2": [6.0, 4.5, 3.5], "fox1": [4.0, 3.0, 2.0], "fox2": [4.0, 2.0, 1.0]}
    for name, losses in values.items():
        (tmp_path / name).mkdir()
        lines = [{"type": "val", "iter": i, "tokens": 100 * i, "val_loss": v} for i, v in enumerate(losses)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert plot_runs.main([str(tmp_path / name) for name in values] + [
        "--out", str(tmp_path / "loss.png"), "--groups", "rope", "rope", "fox", "fox", "--bands"]) == 0
    figure = saved_figures[0]
    ax_val = figure.axes[1]
    lines = drawn_lines(ax_val)
    assert lines["rope (2)"] == (pytest.approx([0, 100, 200]), pytest.approx([5.5, 4.25, 3.25]))  # (tokens, units)
    assert lines["fox (2)"][1] == pytest.approx([4.0, 2.5, 1.5])
    [rope_band, fox_band] = ax_val.collections
    rope_edges = rope_band.get_paths()[0].vertices[:, 1]
    assert min(rope_edges) == pytest.approx(3.0) and max(rope_edges) == pytest.approx(6.0)
    assert [ax.get_legend() for ax in figure.axes[:2]] == [None, None] and len(figure.legends) == 1
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["rope (2)", "fox (2)"]


def test_a_studys_loss_by_position_is_each_encodings_seed_mean_in_the_band_of_its_seeds(tmp_path, saved_figures):
    from studies.report import mean_over_seeds
    seeds = [result("fox", 4, {16: [3.0, 2.0, 1.0]}), result("fox", 4, {16: [5.0, 2.0, 0.0]})]
    mean = mean_over_seeds(seeds) | {"name": "fox", "encoding": "2 seeds"}
    assert mean["contexts"]["16"]["nonoverlapping"]["binned_loss"] == [4.0, 2.0, 0.5]
    ex.plot_loss_vs_position([mean], str(tmp_path / "loss.png"))
    (figure,) = saved_figures
    ax = figure.axes[0]
    assert drawn_lines(ax)["fox (2 seeds)"] == ([0, 1, 2], [4.0, 2.0, 0.5])
    [band] = ax.collections
    edges = band.get_paths()[0].vertices[:, 1]
    assert min(edges) == 0.0 and max(edges) == 5.0
    assert ax.get_legend() is None and len(figure.legends) == 1  # beside the axes, over no curve
