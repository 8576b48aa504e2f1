"""eval/outputs.py: a results folder checked before the work that fills it, and the sentence for a write that fails
after it. The commands that use it (extrapolation, zero_shot, long_context, plot_runs) test it through their own
files; these tests hold the helper itself."""
import errno
import os
import tempfile

import pytest

from config import UserError
from eval.outputs import check_writable, unwritten


def test_a_writable_folder_passes_and_a_missing_one_is_not_made_yet(tmp_path):
    check_writable(str(tmp_path), "the results")
    missing = tmp_path / "a" / "b"
    check_writable(str(missing), "the results")
    # the probe file is gone and nothing was made: a command refused later leaves no empty folder behind
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("below", [False, True])
def test_a_file_in_the_way_is_named(tmp_path, below):
    (tmp_path / "afile").write_text("mine")
    given = tmp_path / "afile" / "out" if below else tmp_path / "afile"
    with pytest.raises(UserError) as error:
        check_writable(str(given), "the results", folder="the results folder")
    assert str(error.value) == (f"the results folder {given} cannot be made: {tmp_path / 'afile'} is a file, not a "
                                "folder; choose another --out (or move the file)")
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("below", [False, True])
def test_a_folder_that_refuses_files_says_where_and_which_option(tmp_path, monkeypatch, below):
    locked = tmp_path / "locked"
    locked.mkdir()
    real = tempfile.NamedTemporaryFile

    def refusing(*args, dir=None, **kwargs):  # as an immutable folder refuses root too
        if os.path.abspath(dir) == str(locked):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refusing)
    given = locked / "sub" if below else locked
    with pytest.raises(UserError) as error:
        check_writable(str(given), "the plot", "--plot")
    assert str(error.value) == (
        f"cannot make the folder {given} for the plot (Operation not permitted in {locked}); choose a writable "
        f"--plot (or make {locked} writable)" if below else
        f"cannot write the plot to {given} (Operation not permitted); choose a writable --plot (or make that "
        "directory writable)")


def test_the_sentence_for_results_that_could_not_be_written_after_all():
    error = OSError(errno.ENOSPC, "No space left on device")
    assert unwritten("the scores", "runs/x/eval", error) == (
        "cannot write the scores to runs/x/eval (No space left on device), so they are printed above instead; free "
        "space or choose another --out, then run again")
    assert unwritten("the plot", "p", OSError("disk gone"), "--plot").endswith("choose another --plot, then run again")


def test_write_atomic_replaces_whole_and_leaves_no_tmp_when_the_disk_fills(tmp_path, monkeypatch):
    from eval.outputs import write_atomic
    path = tmp_path / "report.md"
    path.write_text("old")
    write_atomic(str(path), "new")
    assert path.read_text() == "new" and sorted(os.listdir(tmp_path)) == ["report.md"]
    from helpers import full_disk
    full_disk(monkeypatch, tmp_path)
    with pytest.raises(OSError, match="No space left on device"):
        write_atomic(str(path), "newer")
    assert path.read_text() == "new" and sorted(os.listdir(tmp_path)) == ["report.md"]


def test_an_evaluation_writes_its_json_its_report_and_each_picture_and_names_them(tmp_path, capsys):
    import json
    from types import SimpleNamespace

    from eval.outputs import evaluate_and_write
    args = SimpleNamespace(out=str(tmp_path / "out"), ckpt=["a", "b"])
    drawn = []

    def pictures(results):
        return [(f"{r['run']}.png", lambda path, r=r: drawn.append(path) or open(path, "w").write(r["run"]))
                for r in results]
    results = evaluate_and_write(args, lambda run: {"run": run, "value": len(drawn)}, lambda rs: f"table of {len(rs)}",
                                 "probe", pictures)
    out = tmp_path / "out"
    assert results == [{"run": "a", "value": 0}, {"run": "b", "value": 0}]  # every run evaluated before any picture
    assert json.loads((out / "probe.json").read_text()) == results and (out / "probe.md").read_text() == "table of 2"
    assert drawn == [str(out / "a.png"), str(out / "b.png")] and (out / "b.png").read_text() == "b"
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["table of 2", f"wrote {out}/probe.json, probe.md, a.png and b.png"]


def test_an_evaluation_without_pictures_names_its_two_files(tmp_path, capsys):
    from types import SimpleNamespace

    from eval.outputs import evaluate_and_write
    args = SimpleNamespace(out=str(tmp_path), ckpt=["a"])
    evaluate_and_write(args, lambda run: {"run": run}, lambda rs: "t", "probe", lambda results: [])
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {tmp_path}/probe.json and probe.md"


@pytest.mark.parametrize("module,name,plots", [
    ("eval.extrapolation", "extrapolation", {"plot_loss_vs_position": "loss_vs_position.png",
                                             "plot_passkey": "passkey_{name}.png"}),
    ("eval.retrieval", "retrieval", {"plot_accuracy": "accuracy_vs_gap.png"}),
    ("eval.reach", "reach", {"plot_reach": "reach.png"})])
def test_each_evaluation_command_writes_its_own_files_and_each_picture_from_its_own_results(
        module, name, plots, tmp_path, monkeypatch, capsys):
    """Every command's main through the shared writer: its own NAME.json and NAME.md, and each picture drawn from
    the results it belongs to (extrapolation's passkey heat maps one per checkpoint, each from that checkpoint's
    result), the evaluation itself replaced by a record of the run it was asked for; every checkpoint checked before
    the first is evaluated."""
    import importlib
    import json
    command = importlib.import_module(module)
    runs = [str(tmp_path / "run_a"), str(tmp_path / "run_b")]
    order = []
    monkeypatch.setattr(command, "checked_inputs", lambda run, args, device: order.append(("check", run)))
    monkeypatch.setattr(command, "evaluate_checkpoint",
                        lambda run, args, device: order.append(("evaluate", run)) or
                        {"name": os.path.basename(run), "passkey": {}})
    monkeypatch.setattr(command, "markdown_report", lambda results: "report of " + ",".join(r["name"] for r in results))
    drawn = {}
    for function, picture in plots.items():
        def draw(results, path, function=function):
            drawn[os.path.basename(path)] = (function, results if isinstance(results, list) else results["name"])
            open(path, "w").close()
        monkeypatch.setattr(command, function, draw)
    out = tmp_path / "out"
    command.main(["--ckpt", *runs, "--out", str(out), "--device", "cpu"])
    assert order == [("check", runs[0]), ("check", runs[1]), ("evaluate", runs[0]), ("evaluate", runs[1])]
    results = [{"name": "run_a", "passkey": {}}, {"name": "run_b", "passkey": {}}]
    assert json.loads((out / f"{name}.json").read_text()) == results
    assert (out / f"{name}.md").read_text() == "report of run_a,run_b"
    expected = {}
    for function, picture in plots.items():
        if "{name}" in picture:
            expected.update({picture.format(name=r["name"]): (function, r["name"]) for r in results})
        else:
            expected[picture] = (function, results)
    assert drawn == expected and sorted(os.listdir(out)) == sorted([f"{name}.json", f"{name}.md", *expected])
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"wrote {out}/{name}.json, {name}.md")
