"""study.py: a tiny study end to end on the CPU, its report against the runs' own files, resuming,
failures, Ctrl-C, launch command lines and the shipped study files.

The study trains a 2-layer byte-level model for 6 iterations (two encodings x two seeds), then runs
eval/extrapolation.py and eval/zero_shot.py (two tasks of the fixtures) on each run.
"""
import json
import math
import os
import re
import shutil
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from scipy.stats import t as student_t

import train
from eval import extrapolation, zero_shot
import study
from studies import launch as study_launch, report as study_report, spec as study_spec
from studies import summary as study_summary
from test_eval_progress import check_work_clock_lines, progress_lines
from tests.helpers import TINY_MODEL, synthetic_corpus, tiny_config

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "zero_shot"
ENCODINGS, SEEDS = ["rope", "alibi"], [1, 2]
EVALS = f"""
[eval.extrapolation]
factors = [1, 2]
windows = 2
passkey_factors = [1]
depths = [0, 1]
passkey_trials = 1

[eval.zero_shot]
data_dir = "{FIXTURES}"
tasks = ["arc_easy", "winogrande"]
"""


def study_file(root, encodings=ENCODINGS, seeds=SEEDS, evals=EVALS, extra=""):
    path = Path(root) / "study.toml"
    path.write_text(f'base = "base.toml"\nencodings = {json.dumps(encodings)}\nseeds = {json.dumps(seeds)}\n'
                    f'out_dir = "out"\n{extra}\n{evals}')
    return str(path)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A byte-tokenised corpus and the base config; the study's paths are relative to the directory it runs in."""
    root = tmp_path_factory.mktemp("study")
    data = synthetic_corpus(root, 20, 600)
    (root / "base.toml").write_text(tiny_config(data, eval_interval=3, eval_windows=4))
    return root


@pytest.fixture(scope="module", autouse=True)
def fast_and_single_threaded():
    """One thread (the tiny model gains nothing from more on a shared machine), and one lm-eval TaskManager that
    indexes only the stock YAMLs of the two tasks used: the default one indexes every task lm-eval ships, which
    takes 10-40 s per zero-shot call on a busy 2-core machine (here: 0.02 s)."""
    import lm_eval.tasks
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    stock = Path(lm_eval.tasks.__file__).parent
    manager = lm_eval.tasks.TaskManager(include_path=[str(stock / "arc"), str(stock / "winogrande")],
                                        include_defaults=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lm_eval.tasks, "TaskManager", lambda *args, **kwargs: manager)
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def finished(workspace, tmp_path_factory):
    """The tiny study run once from start to end: (its directory, the report it returned)."""
    root = tmp_path_factory.mktemp("finished")
    shutil.copy(workspace / "base.toml", root / "base.toml")
    path = study_file(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        report = study.main([path])
    return root, report


def records(run_dir, kind):
    with open(Path(run_dir) / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["type"] == kind]


def mean_and_sample_std(values):
    m = sum(values) / len(values)
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


# ----------------------------------------------------------------------------- the report against the runs' files

def test_report_numbers_are_the_runs_own_metrics_and_evaluation_outputs(finished):
    root, report = finished
    assert json.loads((root / "out" / "report.json").read_text()) == json.loads(json.dumps(report))
    final = {}
    for row in report["runs"]:
        run_dir = root / row["run_dir"]
        vals = records(run_dir, "val")
        assert vals[-1]["iter"] == 6 and row["status"] == "done"
        assert row["final_val_loss"] == vals[-1]["val_loss"]
        assert row["tokens"] == records(run_dir, "train")[-1]["tokens"] == 6 * 4 * 32
        assert row["gpus"] == 0 and row["gpu_hours"] == 0
        final[row["encoding"], row["seed"]] = vals[-1]["val_loss"]

    for encoding in ENCODINGS:
        entry = report["encodings"][encoding]
        values = [final[encoding, s] for s in SEEDS]
        mean, std = mean_and_sample_std(values)
        assert entry["final_val_loss"]["values"] == values
        assert entry["final_val_loss"]["mean"] == pytest.approx(mean, rel=1e-12)
        assert entry["final_val_loss"]["std"] == pytest.approx(std, rel=1e-9)

    # Paired difference to RoPE; with two seeds the t distribution has 1 degree of freedom (a Cauchy
    # distribution, quantile tan(pi (p - 1/2))), and the std of two differences is |d1 - d2| / sqrt(2).
    diff = report["encodings"]["alibi"]["difference_to_reference"]
    d = [final["alibi", s] - final["rope", s] for s in SEEDS]
    assert diff["values"] == pytest.approx(d, abs=1e-15)
    half_width = math.tan(math.pi * 0.475) * abs(d[0] - d[1]) / math.sqrt(2) / math.sqrt(2)
    assert diff["interval"] == pytest.approx([sum(d) / 2 - half_width, sum(d) / 2 + half_width], rel=1e-9)
    exceeds = abs(sum(d) / 2) > half_width
    assert diff["exceeds_seed_spread"] is exceeds
    markdown = (root / "out" / "report.md").read_text()
    sentence = next(line for line in markdown.splitlines() if line.startswith("- alibi − rope"))
    assert diff["finding"] is False  # two seeds never make a finding, however far apart
    assert "not resolved at this budget" in sentence and "excludes 0:" not in sentence
    assert f"{sum(d) / 2:+.4f}" in sentence and "over 2 paired seed(s)" in sentence
    for (encoding, seed), loss in final.items():  # the Runs table: each run's row with its own final loss
        assert f"| {encoding} | {seed} | done | 6 | 768 | {loss:.4f} | " in markdown

    paper = json.loads((REPO / "eval" / "paper_results.json").read_text())
    for encoding in ENCODINGS:
        entry = report["encodings"][encoding]
        extrap = [json.loads((root / "out" / encoding / f"seed{s}" / "eval" / "extrapolation.json").read_text())[0]
                  for s in SEEDS]
        for factor in ("1", "2"):
            cell = entry["extrapolation"]["contexts"][factor]
            runs = [r["contexts"][str(32 * int(factor))] for r in extrap]
            assert cell["nonoverlapping"]["values"] == [r["nonoverlapping"]["mean"] for r in runs]
            assert cell["sliding"]["values"] == [r["sliding"]["mean"] for r in runs]
        assert entry["extrapolation"]["contexts"]["1"]["beyond_train_context"] is None
        assert entry["extrapolation"]["contexts"]["2"]["beyond_train_context"]["values"] == \
            [r["contexts"]["64"]["nonoverlapping"]["mean_beyond_train_context"] for r in extrap]
        by_length = entry["extrapolation"]["passkey"]["accuracy_by_length"][0]["values"]
        assert by_length == [sum(r["passkey"]["accuracy"][0]) / 2 for r in extrap]

        zs = [json.loads((root / "out" / encoding / f"seed{s}" / "eval" / "zero_shot.json").read_text()) for s in SEEDS]
        assert entry["zero_shot"]["average"]["values"] == [z["average"] for z in zs]
        assert entry["zero_shot"]["tasks"]["arc_easy"]["acc"]["values"] == [z["tasks"]["arc_easy"]["acc"] for z in zs]
        assert entry["zero_shot"]["tasks"]["arc_easy"]["acc_norm"]["values"] == \
            [z["tasks"]["arc_easy"]["acc_norm"] for z in zs]
        assert entry["zero_shot"]["tasks"]["winogrande"]["score"]["values"] == \
            [z["tasks"]["winogrande"]["acc"] for z in zs]
        theirs = dict(zip(paper["columns"], paper["medium_353M"][encoding]))  # the tiny model is nearest "medium"
        assert entry["zero_shot"]["paper"] == theirs
        paper_line = f"| {encoding} (paper, medium_353M) | {theirs['arc_easy']:.2f} | {theirs['winogrande']:.2f} |"
        averaged = {t: zs[0]["tasks"][t]["average_metric"] for t in ("arc_easy", "winogrande")}
        assert averaged == {"arc_easy": "acc", "winogrande": "acc"}  # the field's convention, zero_shot's default
        assert paper_line in markdown and "| arc_easy (acc) | winogrande (acc) |" in markdown
    for plot in ("loss_curves.png", "loss_vs_position.png"):
        assert (root / "out" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- resuming

def test_every_table_of_the_report_starts_after_a_blank_line(finished):
    """Markdown renders a table glued to the paragraph before it as text: each table, the zero-shot ones included,
    follows an empty line, as the title does."""
    root, _ = finished
    lines = (root / "out" / "report.md").read_text().split("\n")
    assert lines[1] == "" and sum(line.startswith("|---") for line in lines) >= 5
    for before, line in zip(lines, lines[1:]):
        if line.startswith("|") and not before.startswith("|"):
            assert before == "", f"a table glued to the line before it: {before!r} / {line!r}"


def test_resuming_a_half_finished_study_redoes_nothing_finished(finished, tmp_path, monkeypatch):
    source, first = finished
    shutil.copytree(source, tmp_path / "copy")  # copy2 keeps the files' mtimes
    root = tmp_path / "copy"
    monkeypatch.chdir(root)
    out = Path("out")
    # alibi seed 2: never started; rope seed 2: interrupted at iteration 3 with a checkpoint; rope seed 1: its
    # zero-shot evaluation missing; alibi seed 1: finished with every evaluation.
    shutil.rmtree(out / "alibi" / "seed2")
    shutil.rmtree(out / "rope" / "seed2")
    (out / "rope" / "seed1" / "eval" / "zero_shot.json").unlink()
    loaded = study_spec.load_study("study.toml")
    rope2 = next(r for r in loaded.runs if (r.encoding, r.seed) == ("rope", 2))
    assert train.run(rope2.train_args + ["--stop_iter=3"])["step"] == 3
    untouched = [p for p in (out / "alibi" / "seed1").rglob("*") if p.is_file()] + \
        [out / "rope" / "seed1" / name for name in ("ckpt.pt", "metrics.jsonl", "eval/extrapolation.json")]
    mtimes = {p: p.stat().st_mtime_ns for p in untouched}

    calls = []
    for name, module, function in (("train", train, "run"), ("extrapolation", extrapolation, "main"),
                                   ("zero_shot", zero_shot, "main")):
        def counted(argv, _real=getattr(module, function), _name=name):
            calls.append((_name, next(a for a in argv if "seed" in a and "out" in a), "--resume" in argv))
            return _real(argv)
        monkeypatch.setattr(module, function, counted)
    report = study.main(["study.toml"])

    def where(encoding, seed):
        return str(Path("out") / encoding / f"seed{seed}")
    assert [(n, resume) for n, arg, resume in calls if n == "train"] == [("train", True), ("train", False)]
    trained = [arg for n, arg, _ in calls if n == "train"]
    assert trained == [f"--out_dir={where('rope', 2)}", f"--out_dir={where('alibi', 2)}"]
    assert sorted(arg for n, arg, _ in calls if n == "extrapolation") == [where("alibi", 2), where("rope", 2)]
    zero_shot_runs = sorted(arg for n, arg, _ in calls if n == "zero_shot")
    assert zero_shot_runs == [where("alibi", 2), where("rope", 1), where("rope", 2)]
    assert {p: p.stat().st_mtime_ns for p in untouched} == mtimes
    # The resumed run logged each iteration once, and training is deterministic on the CPU: every number of
    # the report is the uninterrupted study's.
    assert [r["iter"] for r in records(out / "rope" / "seed2", "train")] == list(range(1, 7))
    assert [r["final_val_loss"] for r in report["runs"]] == [r["final_val_loss"] for r in first["runs"]]
    for encoding in ENCODINGS:
        ours, theirs = report["encodings"][encoding], first["encodings"][encoding]
        assert ours["zero_shot"]["average"] == theirs["zero_shot"]["average"]
        assert ours["extrapolation"]["contexts"] == theirs["extrapolation"]["contexts"]


def calls_of(monkeypatch):
    """Record (job, run directory, resumed) of every train.run / evaluation main the study calls."""
    calls = []
    for name, module, function in (("train", train, "run"), ("extrapolation", extrapolation, "main"),
                                   ("zero_shot", zero_shot, "main")):
        def counted(argv, _real=getattr(module, function), _name=name):
            where = next(a for a in argv if "seed" in a and "out" in a).removeprefix("--out_dir=")
            calls.append((_name, where, "--resume" in argv))
            return _real(argv)
        monkeypatch.setattr(module, function, counted)
    return calls


def test_a_retrained_checkpoint_has_its_evaluations_redone(finished, tmp_path, monkeypatch, capsys):
    """Deleting a run's ckpt.pt retrains it; its evaluations read the old checkpoint and must be redone (they were
    kept: the marker recorded arguments and step only). Every other run is left alone."""
    source, first = finished
    shutil.copytree(source, tmp_path / "copy")  # copy2 keeps the files' times: the other markers stay valid
    monkeypatch.chdir(tmp_path / "copy")
    run_dir = Path("out") / "rope" / "seed1"
    (run_dir / "ckpt.pt").unlink()
    calls = calls_of(monkeypatch)
    report = study.main(["study.toml"])
    assert calls == [("train", str(run_dir), False), ("extrapolation", str(run_dir), False),
                     ("zero_shot", str(run_dir), False)]
    stat = (run_dir / "ckpt.pt").stat()
    for name in ("extrapolation", "zero_shot"):  # each marker names the checkpoint it read
        marker = json.loads((run_dir / "eval" / f"{name}.study.json").read_text())
        assert marker["checkpoint"] == {"step": 6, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    assert [r["final_val_loss"] for r in report["runs"]] == [r["final_val_loss"] for r in first["runs"]]
    out, err = capsys.readouterr()
    assert "[study] progress: 1/1 runs (100%)" in out  # only this run had work left
    # the in-process evaluations' progress lines reach the console (stderr was only captured for errors before)
    assert re.search(r"^extrapolation seed1, loss at 2 contexts: [\d,]+/[\d,]+ tokens \(100%\)", err, re.MULTILINE)


def test_a_marker_of_the_older_format_holds_until_its_checkpoint_is_rewritten(finished, tmp_path, monkeypatch):
    """Markers written before the checkpoint was recorded ({argv, step}) stay valid while ckpt.pt is older than
    them, so upgrading redoes nothing; once ckpt.pt is rewritten after them, the evaluation is redone."""
    source, _ = finished
    shutil.copytree(source, tmp_path / "copy")
    monkeypatch.chdir(tmp_path / "copy")
    run_dir = Path("out") / "alibi" / "seed2"
    marker = run_dir / "eval" / "zero_shot.study.json"
    marker.write_text(json.dumps({"argv": json.loads(marker.read_text())["argv"], "step": 6}) + "\n")
    ckpt_time = (run_dir / "ckpt.pt").stat().st_mtime_ns
    os.utime(marker, ns=(ckpt_time + 10**9, ckpt_time + 10**9))  # written a second after the checkpoint
    calls = calls_of(monkeypatch)
    study.main(["study.toml"])
    assert calls == []
    os.utime(run_dir / "ckpt.pt", ns=(ckpt_time + 2 * 10**9, ckpt_time + 2 * 10**9))  # rewritten after the marker
    study.main(["study.toml"])  # both evaluations read a checkpoint that has changed since (the other by its marker)
    assert calls == [("extrapolation", str(run_dir), False), ("zero_shot", str(run_dir), False)]


def test_a_run_whose_records_are_lost_is_a_failure_in_every_table(finished, tmp_path, monkeypatch, capsys):
    """metrics.jsonl deleted: train.py resumes the final checkpoint with nothing to do, so the final loss cannot
    come back. The run used to count as finished, dropped from the loss table only (n = 2 -> 1 while the other
    tables kept 2), exit 0, on every rerun. Now it is a failure that says what to do, and out of every table."""
    source, _ = finished
    shutil.copytree(source, tmp_path / "copy")
    monkeypatch.chdir(tmp_path / "copy")
    run_dir = Path("out") / "rope" / "seed2"
    (run_dir / "metrics.jsonl").unlink()
    calls = calls_of(monkeypatch)
    for attempt in range(2):  # the rerun reports it again, without training
        with pytest.raises(SystemExit) as exit_info:
            study.main(["study.toml"])
        assert exit_info.value.code == 1
        assert calls == ([("train", str(run_dir), True)] if attempt == 0 else [])
        calls.clear()
        report = json.loads(Path("out/report.json").read_text())
        row = next(r for r in report["runs"] if (r["encoding"], r["seed"]) == ("rope", 2))
        assert row["status"] == "failed" and row["final_val_loss"] is None
        metrics = run_dir / "metrics.jsonl"
        assert row["errors"] == [f"records: {run_dir}/ckpt.pt is at the final iteration 6 but {metrics} has no "
                                 "validation loss at that iteration (the file was deleted or cut short), so the run's "
                                 f"final loss is unknown and resuming cannot log it again; restore {metrics}, or "
                                 f"move {run_dir} aside and run the study again to train the run anew"]
        rope = report["encodings"]["rope"]
        assert rope["final_val_loss"]["seeds"] == rope["extrapolation"]["seeds"] == rope["zero_shot"]["seeds"] == [1]
        assert report["encodings"]["alibi"]["difference_to_reference"]["seeds"] == [1]
        assert f"- rope seed 2: records: {run_dir}/ckpt.pt is at the final iteration 6" in \
            Path("out/report.md").read_text()
    assert "[study] FAILED rope seed 2: records:" in capsys.readouterr().out


@pytest.mark.fault
def test_damaged_lines_of_metrics_jsonl_are_one_failure_each_and_the_study_goes_on(finished, tmp_path, monkeypatch,
                                                                                    capsys):
    """Binary garbage in one run's metrics.jsonl, a line cut short inside another's: each run is one failure line
    (the first used to stop the study with a UnicodeDecodeError traceback, the second to be reported as finished
    without its lost record), out of every table, nothing retrained; deleting the named line, as told, ends it."""
    source, _ = finished
    shutil.copytree(source, tmp_path / "copy")
    monkeypatch.chdir(tmp_path / "copy")
    garbage_run, cut_run = Path("out") / "rope" / "seed2", Path("out") / "alibi" / "seed1"
    lines = (garbage_run / "metrics.jsonl").read_bytes().split(b"\n")
    (garbage_run / "metrics.jsonl").write_bytes(b"\n".join(lines[:2] + [b"\x80\xff\x00\x9c garbage"] + lines[2:]))
    lines = (cut_run / "metrics.jsonl").read_bytes().split(b"\n")
    (cut_run / "metrics.jsonl").write_bytes(b"\n".join(lines[:4] + [lines[4][:len(lines[4]) // 2]] + lines[5:]))
    calls = calls_of(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        study.main(["study.toml"])
    assert exit_info.value.code == 1 and calls == []
    report = json.loads(Path("out/report.json").read_text())
    rows = {(r["encoding"], r["seed"]): r for r in report["runs"]}
    for (encoding, seed), line in ((("rope", 2), 3), (("alibi", 1), 5)):
        metrics = Path("out") / encoding / f"seed{seed}" / "metrics.jsonl"
        expected = (f"records: {metrics} line {line} is not a record (binary garbage or a line cut short), so its "
                    f"record is lost; restore {metrics} from a backup, or delete that line to go on without it, then "
                    "run the study again")
        assert rows[encoding, seed]["status"] == "failed" and rows[encoding, seed]["errors"] == [expected]
        assert rows[encoding, seed]["final_val_loss"] is None
        assert f"- {encoding} seed {seed}: {expected}" in Path("out/report.md").read_text()
    assert rows["rope", 1]["status"] == rows["alibi", 2]["status"] == "done"
    assert report["encodings"]["rope"]["final_val_loss"]["seeds"] == [1]
    assert report["encodings"]["alibi"]["final_val_loss"]["seeds"] == [2]
    out = capsys.readouterr().out
    assert "[study] FAILED rope seed 2: records:" in out and "[study] FAILED alibi seed 1: records:" in out
    for run_dir, line in ((garbage_run, 3), (cut_run, 5)):  # the remedy: delete the line named
        lines = (run_dir / "metrics.jsonl").read_bytes().split(b"\n")
        (run_dir / "metrics.jsonl").write_bytes(b"\n".join(lines[:line - 1] + lines[line:]))
    report = study.main(["study.toml"])
    assert calls == [] and all(r["status"] == "done" for r in report["runs"])
    assert report["encodings"]["alibi"]["final_val_loss"]["n"] == 2


def test_study_progress_counts_the_runs_with_work_left(workspace, tmp_path, work_clock, monkeypatch, capsys):
    """One finished run and three to train, each training job one second on the test's clock: the progress line
    after each counts only the three (elapsed = runs done, ETA = runs left), study_time.json holds each job's
    second, and the loss-curve plot draws each encoding once, in its own colour (the mean of its seeds in a band),
    with one legend beside the panels."""
    from matplotlib.figure import Figure
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, evals="")
    monkeypatch.chdir(tmp_path)
    train.run(study_spec.load_study(path).runs[0].train_args)  # rope seed 1 finished before the study starts
    real_run = train.run

    def one_second(argv):
        work_clock[0] += 1
        return real_run(argv)
    monkeypatch.setattr(train, "run", one_second)
    figures, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figures.append(self), save(self, *a, **k))[1])
    report = study.main([path])
    out = capsys.readouterr().out
    assert check_work_clock_lines(progress_lines(out, "[study] progress")) == 3
    assert "[study] train rope seed 1" not in out and out.count(" took 0:01") == 3
    times = {(r["encoding"], r["seed"]): r["wall_clock_s"] for r in report["runs"]}
    assert times == {("rope", 1): {}, ("rope", 2): {"train_s": 1.0}, ("alibi", 1): {"train_s": 1.0},
                     ("alibi", 2): {"train_s": 1.0}}
    for ax in figures[0].axes[:2]:
        lines = {line.get_label(): line.get_color() for line in ax.get_lines()}
        assert set(lines) == {"rope (2)", "alibi (2)"} and lines["rope (2)"] != lines["alibi (2)"]
    assert [t.get_text() for t in figures[0].legends[0].get_texts()] == ["rope (2)", "alibi (2)"]


def test_report_states_the_model_the_tokens_and_the_evaluation_sizes(finished):
    """report.md says what the numbers were measured on, each value from an independent source, and warns that the
    tiny model sits beside the paper's 353M row."""
    root, report = finished
    setup = report["setup"]
    out = root / "out"
    for encoding in ENCODINGS:  # the count zero_shot.py took from the real model
        n_params = json.loads((out / encoding / "seed1" / "eval" / "zero_shot.json").read_text())["n_params"]
        assert setup["parameters"][encoding] == n_params
    assert {k: setup["model"][k] for k in TINY_MODEL} == TINY_MODEL
    assert setup["tokens_per_run"] == 6 * 4 * 32 == records(out / "rope" / "seed1", "train")[-1]["tokens"]
    docs = {task: len((FIXTURES / f"{task}.jsonl").read_text().splitlines()) for task in ("arc_easy", "winogrande")}
    assert setup["zero_shot_documents"] == docs
    assert setup["extrapolation"] == {"val_tokens": 2 * 64 + 1, "windows": {"32": 128 // 32, "64": 128 // 64}}
    assert setup["passkey"]["depths"] == 2 and setup["passkey"]["trials"] == 1 and len(setup["passkey"]["lengths"]) == 1
    markdown = (out / "report.md").read_text()
    params = ", ".join(f"{e} {setup['parameters'][e]:,}" for e in ENCODINGS)
    assert (f"- Model: 2 layers, width 32 (2 heads × 16), context 32 tokens, vocabulary 320; parameters: {params}."
            in markdown)
    assert "- Training: 768 tokens per run (6 iterations × 4 sequences × 32 tokens)" in markdown
    assert f"- Zero-shot: documents per task: arc_easy {docs['arc_easy']}, winogrande {docs['winogrande']}." in markdown
    assert "- Extrapolation: the first 129 validation tokens; non-overlapping windows per context: 32 tokens: 4, " \
           "64 tokens: 2." in markdown
    assert f"- Passkey: prompts of {setup['passkey']['lengths'][0]} tokens × 2 depths × 1 trial = 2 prompts" in markdown
    warning = next(line for line in markdown.splitlines() if line.startswith("**Warning:**"))
    assert "medium_353M row below comes from a 353M-parameter model trained on 50B tokens" in warning
    assert "saw 768 tokens per run" in warning and markdown.index(warning) < markdown.index("| rope (ours) |")


def test_help_and_docs_show_every_study_key_with_the_default_it_takes(workspace, tmp_path, capsys):
    """--help prints the annotated study file; docs/study.md holds the same text; every key of a study file is in
    it; and the defaults it states are those a study file without the key gets."""
    import tomllib
    with pytest.raises(SystemExit) as exit_info:
        study.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert study_spec.STUDY_FILE_EXAMPLE in text
    assert study_spec.STUDY_FILE_EXAMPLE in (REPO / "docs" / "study.md").read_text()
    example = tomllib.loads(study_spec.STUDY_FILE_EXAMPLE)
    assert set(example) == study_spec.STUDY_KEYS and set(example["launch"]) == study_spec.LAUNCH_KEYS
    assert set(example["eval"]) == set(study_spec.EVALUATIONS)
    stated = {line.split(" = ")[0].strip(): line.split("#", 1)[1] for line in study_spec.STUDY_FILE_EXAMPLE.splitlines()
              if " = " in line and "#" in line}
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    for encodings in (["alibi", "fox"], ["alibi", "rope"]):
        (tmp_path / "bare.toml").write_text(f'base = "base.toml"\nencodings = {json.dumps(encodings)}\n')
        bare = study_spec.load_study(str(tmp_path / "bare.toml"))
        assert f"default {bare.seeds}:" in stated["seeds"] and bare.seeds_defaulted
        assert f'default "{bare.mode}"' in stated["mode"] and f"default {bare.gpus_per_run}:" in stated["gpus_per_run"]
        assert bare.out_dir == os.path.join("runs", bare.name) and "default runs/<name>" in stated["out_dir"]
        assert bare.name == "bare" and "the study file's name without .toml" in stated["name"]
        assert bare.reference == ("rope" if "rope" in encodings else encodings[0])
        assert 'default "rope" if listed, else the first encoding' in stated["reference"]
    # the example itself is a valid study (with its base config where the shipped studies keep theirs)
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "example.toml").write_text(
        study_spec.STUDY_FILE_EXAMPLE.replace('"../base/medium.toml"', f'"{REPO / "configs" / "base" / "medium.toml"}"'))
    loaded = study_spec.load_study(str(tmp_path / "studies" / "example.toml"))
    assert loaded.seeds == [1337, 1338, 1339] and loaded.mode == "torchrun" and len(loaded.runs) == 24
    assert loaded.encodings[:2] == ["rope@mha", "rope@gqa"] and loaded.reference == "rope@mha"
    grouped = [run for run in loaded.runs if run.encoding == "fox+kv_shift@gqa"]
    assert [(run.model["pos"], run.model["kv_shift"], run.model["n_kv_head"]) for run in grouped] == [("fox", True, 2)] * 3
    assert all(run.model["n_kv_head"] == run.model["n_head"] for run in loaded.runs if run.encoding.endswith("@mha"))


# ----------------------------------------------------------------------------- failures and Ctrl-C

def test_a_failed_run_is_reported_and_the_others_go_on(workspace, tmp_path, monkeypatch, capsys):
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["rope", "alibi", "fox"], seeds=[1], evals="")
    monkeypatch.chdir(tmp_path)
    real_run = train.run

    def diverging_alibi(argv):
        if "--pos=alibi" in argv:
            raise train.TrainError("loss is nan at iteration 3: training diverged")
        return real_run(argv)
    monkeypatch.setattr(train, "run", diverging_alibi)
    with pytest.raises(SystemExit) as exit_info:
        study.main([path])
    assert exit_info.value.code == 1
    report = json.loads(Path("out/report.json").read_text())
    status = {r["encoding"]: r for r in report["runs"]}
    assert status["alibi"]["status"] == "failed" and status["alibi"]["final_val_loss"] is None
    assert status["alibi"]["errors"] == ["training: loss is nan at iteration 3: training diverged"]
    for encoding in ("rope", "fox"):
        assert status[encoding]["status"] == "done"
        assert status[encoding]["final_val_loss"] == records(f"out/{encoding}/seed1", "val")[-1]["val_loss"]
    assert "- alibi seed 1: training: loss is nan" in Path("out/report.md").read_text()
    assert "1 run(s) failed" in capsys.readouterr().out


def test_a_run_under_the_official_schedule_counts_as_finished(workspace, tmp_path, monkeypatch):
    # The official recipe trains iterations 0..max_iters (one step more than clean): its summary ends at
    # max_iters + 1, and the study must take that as done (the paper studies all use the official recipe).
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals="", extra='[overrides]\nrecipe = "official"\nreference_layout = "1x1"\n')
    monkeypatch.chdir(tmp_path)
    report = study.main([path])
    summary = records("out/rope/seed1", "summary")[-1]
    assert summary["iter"] == 7 and summary["stopped"] == "done"  # max_iters 6
    run = report["runs"][0]
    assert run["status"] == "done" and run["final_val_loss"] == records("out/rope/seed1", "val")[-1]["val_loss"]
    calls = []
    monkeypatch.setattr(train, "run", lambda argv: calls.append(argv))
    study.main([path])  # everything is finished: nothing is trained again
    assert calls == []


@pytest.mark.parametrize("interruption", ["ctrl-c during training", "second ctrl-c"])
def test_ctrl_c_stops_the_study_with_one_sentence(workspace, tmp_path, monkeypatch, capsys, interruption):
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["rope", "alibi"], seeds=[1], evals=EVALS)
    monkeypatch.chdir(tmp_path)
    started = []

    def interrupted_run(argv):
        started.append(argv)
        if interruption == "second ctrl-c":  # train.py lets the second Ctrl-C through as KeyboardInterrupt
            raise KeyboardInterrupt
        return {"stopped": "sigterm", "step": 2}  # the first Ctrl-C: train.py saved a checkpoint and returned
    monkeypatch.setattr(train, "run", interrupted_run)
    monkeypatch.setattr(extrapolation, "main", lambda argv: pytest.fail("no evaluation after Ctrl-C"))
    with pytest.raises(SystemExit) as exit_info:
        study.main([path])
    assert exit_info.value.code == 130
    assert len(started) == 1  # the second run never starts
    err = capsys.readouterr().err.strip()
    assert err.startswith("stopped:") and "run the same command again" in err and len(err.splitlines()) == 1
    # What there is so far is reported: the interrupted run as interrupted, the one never started as not run.
    report = json.loads(Path("out/report.json").read_text())
    assert {r["encoding"]: r["status"] for r in report["runs"]} == {"rope": "interrupted", "alibi": "not run"}


def test_sigterm_to_a_study_of_subprocesses_stops_its_jobs(workspace, tmp_path, monkeypatch, capsys):
    """A scheduler's SIGTERM reaches only the study: it must pass it on to the jobs it started, then stop."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["rope", "alibi"], seeds=[1], evals="",
                      extra='[launch]\nmode = "per_gpu"\ngpus = [0]\n')
    monkeypatch.chdir(tmp_path)
    job = "import pathlib, time; pathlib.Path('started').touch(); time.sleep(60)"
    monkeypatch.setattr(study_launch, "job_command",
                        lambda *args: ([sys.executable, "-c", job], {"CUDA_VISIBLE_DEVICES": "0"}))

    def terminate_when_started():
        while not Path(tmp_path / "started").exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=terminate_when_started, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        study.main([path])
    assert exit_info.value.code == 130 and time.monotonic() - start < 30  # the 60 s job was stopped
    assert capsys.readouterr().err.strip().startswith("stopped:")
    assert "$ CUDA_VISIBLE_DEVICES=0" in Path("out/rope/seed1/study_train.log").read_text()
    assert not Path("out/alibi").exists()  # the second run never started


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_run_stopped_inside_a_study_says_to_rerun_the_study_command(workspace, tmp_path, monkeypatch, capsys,
                                                                       signum):
    """train.py's own line after a Ctrl-C or a SIGTERM names the study's command: 'continue with --resume' sent the
    user to train.py, past the study (which adds --resume itself, with its own settings)."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals="")
    monkeypatch.chdir(tmp_path)
    real_step = train.train_step

    def signal_at_step_2(model, raw_model, batches, step, *args):
        if step == 2:
            signal.raise_signal(signum)  # as a Ctrl-C at the terminal, or a scheduler's SIGTERM, at that moment
        return real_step(model, raw_model, batches, step, *args)
    monkeypatch.setattr(train, "train_step", signal_at_step_2)
    with pytest.raises(SystemExit) as exit_info:
        study.main([path])
    assert exit_info.value.code == 130
    out = capsys.readouterr().out
    said = next(line for line in out.splitlines() if line.startswith("stop requested"))
    kind = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert said.startswith(f"stop requested ({kind}): saved {os.path.join('out', 'rope', 'seed1', 'ckpt.pt')} at "
                           "iteration ")
    # tmp_path is not below the repository: the script by its absolute path
    assert said.endswith(f"; rerun the study command (python {REPO / 'study.py'} {path}) to continue.")
    assert "--resume" not in out
    assert study.STUDY_COMMAND not in os.environ  # train.py run on its own afterwards advises --resume again


def test_jobs_in_subprocesses_are_given_the_study_command(workspace, tmp_path, monkeypatch):
    """train.py in a subprocess (torchrun, per_gpu, cpu_jobs) reads the study's command from its environment."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals="",
                      extra='[launch]\nmode = "cpu_jobs"\njobs = 1\n')
    monkeypatch.chdir(tmp_path)
    job = f"import os; print('advice names:', os.environ[{study.STUDY_COMMAND!r}])"
    monkeypatch.setattr(study_launch, "job_command", lambda *args: ([sys.executable, "-c", job], {"CUDA_VISIBLE_DEVICES": ""}))
    with pytest.raises(SystemExit) as exit_info:  # the stand-in trains nothing: the run is a failure
        study.main([path])
    assert exit_info.value.code == 1
    log = Path("out/rope/seed1/study_train.log").read_text()
    assert f"advice names: python {REPO / 'study.py'} {path}\n" in log


def test_trains_other_advice_to_resume_names_the_study_command_inside_a_study(monkeypatch, capsys):
    """A second Ctrl-C (or one outside the loop), a failed checkpoint write and a divergence: inside a study none
    of them says --resume."""
    import checkpoints
    from training.divergence import divergence_error
    from training.errors import exit_interrupted
    rerun = "rerun the study command (python study.py s.toml) to continue"
    monkeypatch.setenv(study.STUDY_COMMAND, "python study.py s.toml")
    with pytest.raises(SystemExit):
        exit_interrupted()
    assert capsys.readouterr().err == f"interrupted: the last checkpoint written (if any) is intact; {rerun}.\n"
    assert checkpoints.write_failure_sentence("checkpoint x", None, "/tmp", "no earlier checkpoint exists") \
        .endswith(f", then {rerun}.")
    diverged = str(divergence_error("the loss is nan", 5, "", "out/ckpt.pt", 4))
    assert diverged.startswith("training diverged at iteration 5") and "--resume" not in diverged
    assert "the last good checkpoint out/ckpt.pt (iteration 4) is kept; the study reports the run as diverged" \
        in diverged
    monkeypatch.delenv(study.STUDY_COMMAND)  # train.py on its own: as before
    assert "--resume --allow_changes=lr,warmup_iters" in str(divergence_error("the loss is nan", 5, "", "x", 4))


# ----------------------------------------------------------------------------- launching

def test_launch_modes_build_torchrun_and_per_gpu_command_lines(workspace, tmp_path):
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, extra='[launch]\nmode = "torchrun"\ngpus_per_run = 4\ngpus = 8\n')
    s = study_spec.load_study(path)
    assert study_launch.gpu_slots(s) == [["0", "1", "2", "3"], ["4", "5", "6", "7"]]
    run = s.runs[3]
    assert (run.encoding, run.seed) == ("alibi", 2)
    command, env = study_launch.job_command(s, "train", study_launch.train_argv(run), ["4", "5", "6", "7"])
    assert command == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                       str(REPO / "train.py"), str(tmp_path / "base.toml"), "--pos=alibi", "--kv_shift=false",
                       "--seed=2", f"--out_dir={os.path.join('out', 'alibi', 'seed2')}"]
    assert env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    command, env = study_launch.job_command(s, "zero_shot", run.evals["zero_shot"], ["4", "5", "6", "7"])
    assert command == [sys.executable, str(REPO / "eval" / "zero_shot.py"), "--ckpt", run.run_dir,
                       "--out", os.path.join(run.run_dir, "eval"), f"--data-dir={FIXTURES}",
                       "--tasks=arc_easy,winogrande"]

    path = study_file(tmp_path, extra='[launch]\nmode = "per_gpu"\ngpus = [2, 5, 6]\n')
    s = study_spec.load_study(path)
    assert study_launch.gpu_slots(s) == [["2"], ["5"], ["6"]]
    command, env = study_launch.job_command(s, "train", study_launch.train_argv(s.runs[0]), ["5"])
    assert command[:2] == [sys.executable, str(REPO / "train.py")] and env == {"CUDA_VISIBLE_DEVICES": "5"}


def test_torchrun_mode_trains_a_run_in_a_one_process_gloo_group(workspace, tmp_path, monkeypatch):
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["fox"], seeds=[3], evals="",
                      extra='[overrides]\nmax_iters = 3\n\n[launch]\nmode = "torchrun"\ngpus_per_run = 1\n')
    monkeypatch.chdir(tmp_path)
    report = study.main([path])
    run_dir = Path("out/fox/seed3")
    assert json.loads((run_dir / "config.json").read_text())["world_size"] == 1
    assert "torch.distributed.run --standalone --nproc_per_node=1" in (run_dir / "study_train.log").read_text()
    assert report["runs"][0]["final_val_loss"] == records(run_dir, "val")[-1]["val_loss"]


# ----------------------------------------------------------------------------- study files

@pytest.mark.parametrize("text,message", [
    ('encodings = ["rope"]\nseeds = [1]\n', "names no base config"),
    ('base = "base.toml"\nencodings = ["rope"]\nsed = [1]\n', "sed: unknown entry; did you mean 'seeds'?"),
    ('base = "base.toml"\nencodings = ["rope", "rope"]\n', "distinct names"),
    ('base = "base.toml"\nencodings = "rope"\n', "distinct names"),
    ('base = "base.toml"\nencodings = ["rope"]\nseeds = 3\n', "seeds: must be a list of distinct integers"),
    ('base = "base.toml"\nencodings = ["rope"]\n[overrides]\nmax_iter = 3\n', "did you mean 'max_iters'"),
    ('base = "base.toml"\nencodings = ["rope"]\n[launch]\nmode = "sge"\n',
     "in_process, torchrun, per_gpu, cpu_jobs, slurm"),
    ('base = "base.toml"\nencodings = ["rope"]\n[eval.extrapolation]\nwindowz = 2\n',
     "unrecognized arguments: --windowz=2"),
    # prefixes of real options (passkey_trials, windows), which argparse's abbreviations used to take silently
    ('base = "base.toml"\nencodings = ["rope"]\n[eval.extrapolation]\npasskey_trial = 2\n',
     "unrecognized arguments: --passkey-trial=2"),
    ('base = "base.toml"\nencodings = ["rope"]\n[eval.extrapolation]\nwindow = 2\n',
     "unrecognized arguments: --window=2"),
    ('base = "base.toml"\nencodings = ["rope"]\n[eval.zero_shot]\nbatch = 2\n', "unrecognized arguments: --batch=2"),
    ('base = "base.toml"\nencodings = ["rope"]\n[eval.perplexity]\n', "[eval.perplexity]: unknown evaluation"),
    ('base = "base.toml"\nencodings = ["rope", "alibi"]\nreference = "fox"\n',
     "reference: 'fox' is not one of the encodings"),
])
def test_a_bad_study_file_is_one_clear_error_before_any_run(workspace, tmp_path, capsys, text, message):
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        study.main([str(tmp_path / "bad.toml")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.fault
@pytest.mark.parametrize("latin1", ["study", "base"])
def test_a_study_or_base_file_not_in_utf8_is_one_sentence_naming_it(workspace, tmp_path, capsys, latin1):
    """A Latin-1 comment (an editor's default on some systems) used to end in a UnicodeDecodeError traceback."""
    comment = "# r\u00e9sum\u00e9\n".encode("latin-1")
    base = (workspace / "base.toml").read_bytes()
    (tmp_path / "base.toml").write_bytes(base + comment if latin1 == "base" else base)
    study_text = b'base = "base.toml"\nencodings = ["rope"]\n'
    (tmp_path / "s.toml").write_bytes(study_text + comment if latin1 == "study" else study_text)
    with pytest.raises(SystemExit) as exit_info:
        study.main([str(tmp_path / "s.toml")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    named = tmp_path / ("s.toml" if latin1 == "study" else "base.toml")
    assert len(err.splitlines()) == 1 and err.startswith("error:")
    assert f"{named} is not UTF-8 text; save it as UTF-8." in err
    assert not (tmp_path / "runs").exists()


def test_every_mistake_of_a_study_file_is_in_one_error_before_any_run(workspace, tmp_path, monkeypatch, capsys):
    """A misspelled encoding, a bad override value and a bad evaluation option: one error names all three, each with
    the study file and its key (they used to come one at a time, each after the one before was fixed), and nothing
    is trained."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["rope", "fxo"], evals="[eval.extrapolation]\nwindowz = 2\n",
                      extra="[overrides]\nwarmup_iters = -5\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "run", lambda argv: pytest.fail("a study with mistakes must train nothing"))
    with pytest.raises(SystemExit) as exit_info:
        study.main([path])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "error: 3 mistakes in the study file; nothing was trained:"
    said = sorted(line.strip() for line in lines[1:])  # ([ sorts before e)
    assert len(said) == 3 and all(line.startswith(f"{path} ") for line in said)
    assert said[0] == (f"{path} [eval.extrapolation] windowz: unrecognized arguments: --windowz=2; the keys are the "
                       "options of eval/extrapolation.py with _ for -, e.g. windows = 16.")
    assert said[1].startswith(f"{path} [overrides] warmup_iters: warmup_iters (-5) must be between 0 and max_iters")
    assert said[2].startswith(f'{path} encodings "fxo": unknown positional encoding \'fxo\'')
    assert said[2].endswith("did you mean 'fox'?")
    assert not Path("out").exists()


def test_an_override_error_names_the_study_file_not_the_command_line(workspace, tmp_path):
    """A model value of [overrides] that the model refuses is blamed on that key of the study file (it said 'given on
    the command line', with the study's own --pos and --kv_shift)."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["rope", "alibi"], evals="", extra="[overrides]\nn_head = 0\n")
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    assert str(error.value) == (f"{path} [overrides] n_head: model config given in the study file: GPTConfig.n_head "
                                "must be positive (got 0)")
    assert "command line" not in str(error.value)


@pytest.mark.fault
def test_a_bad_evaluation_value_is_named_alone_and_a_misspelled_key_gets_one_of_that_evaluations_own(workspace,
                                                                                                  tmp_path):
    """[eval.reach] factor = 0 said "--factor and --windows must be at least 1 (got 0, 4)" (the good windows as if
    wrong) and suggested passkey_trials, a key reach does not have."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["fox"], evals="[eval.reach]\nfactor = 0\n")
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    assert str(error.value) == f"{path} [eval.reach] factor: --factor must be at least 1 (got 0)."
    path = study_file(tmp_path, encodings=["fox"], evals="[eval.reach]\nfactors = 2\n")
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    assert str(error.value) == (f"{path} [eval.reach] factors: unrecognized arguments: --factors=2; the keys are the "
                                "options of eval/reach.py with _ for -, e.g. factor = 8.")


def test_override_values_that_need_each_other_are_not_blamed(workspace, tmp_path):
    """max_iters below the base's warmup_iters (2) is valid with the smaller warmup_iters set after it, and the
    official recipe with its reference_layout: each alone would fail, so they are checked together."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    extra = '[overrides]\nmax_iters = 2\nwarmup_iters = 1\nrecipe = "official"\nreference_layout = "1x1"\n'
    s = study_spec.load_study(study_file(tmp_path, encodings=["rope"], seeds=[1], evals="", extra=extra))
    assert s.runs[0].train_args[1:5] == ["--max_iters=2", "--warmup_iters=1", "--recipe=official",
                                         "--reference_layout=1x1"]
    extra = '[overrides]\nmax_iters = 2\nwarmup_iters = 1\nrecipe = "official"\nlr = -1\n'
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(study_file(tmp_path, encodings=["rope"], seeds=[1], evals="", extra=extra))
    keys = [line.strip().split(": ")[0] for line in str(error.value).splitlines()[1:]]
    assert keys == [f"{tmp_path / 'study.toml'} [overrides] recipe", f"{tmp_path / 'study.toml'} [overrides] lr"]


def test_shipped_studies_cover_the_papers_tables():
    paper = json.loads((REPO / "eval" / "paper_results.json").read_text())
    studies = {name: study_spec.load_study(str(REPO / "configs" / "studies" / f"{name}.toml"))
               for name in ("smoke", "small_gpu", "table1_medium", "table2_large")}
    assert studies["table1_medium"].encodings == list(paper["medium_353M"])
    assert studies["table2_large"].encodings == list(paper["large_770M"])
    for name, size in (("table1_medium", "medium"), ("table2_large", "large")):
        s = studies[name]
        assert s.base == str(REPO / "configs" / "base" / f"{size}.toml") and s.mode == "torchrun"
        assert all(r.evals["zero_shot"][-1] == f"--paper-size={size}_{'353M' if size == 'medium' else '770M'}"
                   for r in s.runs)
    assert studies["smoke"].mode == studies["small_gpu"].mode == "in_process"
    assert len(studies["smoke"].runs) == 6 and len(studies["small_gpu"].runs) == 18


def test_gqa_window_studies_cross_encodings_with_grouping_and_windows():
    """configs/studies/gqa_window.toml and its CPU smoke form: every encoding under MHA, GQA with 4 query heads per
    key head, full attention and 3 local : 1 global layers, with the extrapolation evaluation."""
    for name, encodings, window in (("gqa_window", ["rope", "alibi", "fox", "grape_a_qk", "grape_ap", "grape_m"], 256),
                                    ("gqa_window_smoke", ["rope", "grape_ap"], 32)):
        s = study_spec.load_study(str(REPO / "configs" / "studies" / f"{name}.toml"))
        expected = {"mha": (1, None, None), "gqa": (4, None, None), "local": (1, window, 4),
                    "gqa_local": (4, window, 4)}
        assert s.encodings == [f"{e}@{v}" for e in encodings for v in expected] and s.reference == "rope@mha"
        for run in s.runs:
            encoding, variant = run.encoding.split("@")
            m = run.model
            assert m["pos"] == encoding and m["n_head"] % 4 == 0 and "extrapolation" in run.evals
            assert (m["n_head"] // m["n_kv_head"], m["window"], m["global_every"]) == expected[variant]


def test_a_variants_values_are_applied_after_the_overrides(workspace, tmp_path):
    """[variants] refine [overrides]: a key set by both takes the variant's value, and a variant that does not set
    it keeps the override's."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    extra = '[overrides]\nn_kv_head = 2\nwindow = 16\n[variants]\nplain = {}\nmqa = {n_kv_head = 1}\n'
    s = study_spec.load_study(study_file(tmp_path, ["rope"], [1], "", extra))
    models = {run.encoding: run.model for run in s.runs}
    assert (models["rope@plain"]["n_kv_head"], models["rope@plain"]["window"]) == (2, 16)
    assert (models["rope@mqa"]["n_kv_head"], models["rope@mqa"]["window"]) == (1, 16)

def test_a_study_with_variants_runs_each_encoding_per_variant(workspace, tmp_path, monkeypatch):
    """grape_ap as multi-head full attention and as multi-query with a window of 8 in its first layer: each run
    trains its own model (its config.json) and the report has one row per encoding@variant."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    extrapolation_only = EVALS.split("[eval.zero_shot]")[0]
    variants = '[variants]\nmha = {}\nmqa_local = {n_kv_head = 1, window = 8, global_every = 2}\n'
    path = study_file(tmp_path, ["grape_ap"], [1], extrapolation_only, variants)
    monkeypatch.chdir(tmp_path)
    report = study.main([path])
    assert [row["encoding"] for row in report["runs"]] == ["grape_ap@mha", "grape_ap@mqa_local"]
    for row, expected in zip(report["runs"], [(2, None, None), (1, 8, 2)]):
        config = json.loads((tmp_path / row["run_dir"] / "config.json").read_text())["model"]
        assert (config["pos"], config["n_kv_head"], config["window"], config["global_every"]) == ("grape_ap", *expected)
        assert row["status"] == "done" and row["final_val_loss"] == records(tmp_path / row["run_dir"], "val")[-1]["val_loss"]


def test_the_setup_lines_state_each_evaluations_sizes_from_its_first_output(monkeypatch):
    """setup_summary reads each evaluation's first output and setup_lines states it: the long-context lengths as
    multiples of the training context, the zero-shot documents per task, the extrapolation windows."""
    from types import SimpleNamespace
    monkeypatch.setattr(study_summary, "count_parameters", lambda model: 1000 + model["n_embd"])
    model = {"n_layer": 2, "n_embd": 32, "n_head": 2, "head_dim": 16, "block_size": 512, "vocab_size": 320}
    run = SimpleNamespace(model=model, tokens=8 * 4 * 512, final_iter=8, encoding="rope")
    plan = SimpleNamespace(runs=[run], encodings=["rope"])
    long_context = {"lengths": [1024, 3072], "train_context": 512, "tasks": ["niah_single_1", "qa1"], "limit": 5,
                    "rope_scaling": "none", "other": 1}
    zero = {"paper_size": "medium_353M", "tasks": {"arc_easy": {"n": 3}, "piqa": {"n": 7}}}
    extrapolation_output = {"val_tokens": 1025, "contexts": {"512": {"nonoverlapping": {"windows": 2}},
                                                             "1024": {"nonoverlapping": {"windows": 1}}}}
    setup = study_summary.setup_summary(plan, {"long_context": long_context, "zero_shot": zero,
                                       "extrapolation": extrapolation_output})
    assert setup["long_context"] == {k: v for k, v in long_context.items() if k != "other"}
    assert setup["zero_shot_documents"] == {"arc_easy": 3, "piqa": 7}
    assert setup["extrapolation"] == {"val_tokens": 1025, "windows": {"512": 2, "1024": 1}}
    assert setup["sequences_per_iteration"] == 4 and setup["parameters"] == {"rope": 1032}
    lines = study_report.setup_lines(setup)
    assert "- Long context: RULER and BABILong through lm-eval at 1,024 (2×), 3,072 (6×) tokens; 2 tasks, the first " \
           "5 documents per task and length; positions: `--rope-scaling none`." in lines
    assert "- Zero-shot: documents per task: arc_easy 3, piqa 7." in lines
    assert "- Extrapolation: the first 1,025 validation tokens; non-overlapping windows per context: 512 tokens: 2, " \
           "1024 tokens: 1." in lines
    no_limit = study_report.setup_lines({**setup, "long_context": {**setup["long_context"], "limit": None}})
    assert any("2 tasks, all documents per task and length" in line for line in no_limit)


# ---------------------------------------- properties: the study report's numbers for any runs' files, GPU runs included
# The test machine trains on the CPU, so the other study tests see only GPUs = 0; here a run's files are written as a
# GPU run leaves them (metrics.jsonl's summary with memory_kind "cuda max allocated", config.json's world size,
# study_time.json) and the row and the Runs table are checked against them: GPUs = the run's processes, GPU-hours =
# the wall-clock hours of its jobs x GPUs. The seed statistics are checked against formulas written here (mean, sample
# standard deviation, the two-sided 95% Student-t interval).


finite = st.floats(min_value=-50, max_value=50, allow_nan=False)


def write_run(run_dir, *, on_gpu, world_size, times, final_iter, val_loss, trained=True):
    run_dir.mkdir(parents=True, exist_ok=True)
    records = [{"type": "train", "iter": final_iter, "tokens": final_iter * 64, "loss": 3.0},
               {"type": "val", "iter": final_iter, "tokens": final_iter * 64, "val_loss": val_loss},
               {"type": "summary", "iter": final_iter, "stopped": "done",
                "memory_kind": "cuda max allocated" if on_gpu else "process max RSS", "peak_memory_gb": 12.5}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "config.json").write_text(json.dumps({"world_size": world_size}))
    (run_dir / "study_time.json").write_text(json.dumps(times))
    if trained:
        (run_dir / "ckpt.pt").write_bytes(b"x")
    return study_spec.Run(encoding="rope", seed=1, run_dir=str(run_dir), train_args=[], final_iter=final_iter, evals={},
                     model={}, tokens=final_iter * 64)


@given(on_gpu=st.booleans(), world_size=st.integers(1, 1024),
       times=st.dictionaries(st.sampled_from(["train", "extrapolation", "zero_shot"]),
                             st.floats(min_value=0, max_value=1e7), min_size=1),
       final_iter=st.integers(1, 10**6), val_loss=st.floats(min_value=0.1, max_value=20))
def test_a_runs_row_and_gpu_hours_for_any_run(tmp_path_factory, on_gpu, world_size, times, final_iter, val_loss):
    run = write_run(tmp_path_factory.mktemp("run"), on_gpu=on_gpu, world_size=world_size, times=times,
                    final_iter=final_iter, val_loss=val_loss)
    row = study_summary.run_row(run, {})
    gpus = world_size if on_gpu else 0
    assert row["gpus"] == gpus
    assert row["gpu_hours"] == pytest.approx(sum(times.values()) / 3600 * gpus, rel=1e-12, abs=1e-12)
    assert row["finished"] and row["status"] == "done" and row["final_val_loss"] == val_loss
    assert row["iter"] == final_iter and row["tokens"] == final_iter * 64 and row["peak_memory_gb"] == 12.5
    report = {"study": "s", "base": "b.toml", "overrides": [], "seeds": [1], "reference": "rope",
              "launch": {"mode": "each"}, "rule": "r", "encodings": {},
              "setup": {"model": {"n_layer": 1, "n_embd": 8, "n_head": 1, "head_dim": 8, "block_size": 8,
                                  "vocab_size": 9}, "parameters": {"rope": 1}, "tokens_per_run": 64,
                        "iterations": 1, "sequences_per_iteration": 8},
              "runs": [row]}
    runs_table = study_report.markdown(report, {}).split("## Runs")[1]
    cells = [c.strip() for c in runs_table.splitlines()[4].split("|")]
    assert cells[7] == f"{sum(times.values()) / 3600:.3f}" and cells[8] == f"{sum(times.values()) / 3600 * gpus:.2f}"


def test_a_run_whose_summary_is_not_at_its_final_iteration_is_not_finished(tmp_path):
    run = write_run(tmp_path / "a", on_gpu=True, world_size=8, times={"train": 7200.0}, final_iter=10, val_loss=3.0)
    assert study_launch.run_finished(run)
    early = study_spec.Run(**{**run.__dict__, "final_iter": 11})
    assert not study_launch.run_trained(early) and study_summary.run_row(early, {})["final_val_loss"] is None
    untrained = write_run(tmp_path / "b", on_gpu=True, world_size=8, times={}, final_iter=10, val_loss=3.0,
                          trained=False)
    assert not study_launch.run_finished(untrained) and study_summary.run_row(untrained, {})["status"] == "not run"


@given(values=st.lists(finite, min_size=0, max_size=12))
def test_describe_is_the_mean_and_the_sample_std(values):
    d = study_summary.describe(values)
    assert d["n"] == len(values) and d["values"] == values
    if not values:
        assert d["mean"] is None and d["std"] is None
        return
    assert d["mean"] == pytest.approx(sum(values) / len(values), abs=1e-9)
    if len(values) == 1:
        assert d["std"] is None
    else:
        m = sum(values) / len(values)
        assert d["std"] == pytest.approx(math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)), abs=1e-9)


@given(pairs=st.dictionaries(st.integers(0, 50), st.tuples(finite, finite), max_size=10),
       only_reference=st.sets(st.integers(51, 60), max_size=3))
@example(pairs={1: (1.0, 0.0), 2: (1.1, 0.0), 3: (1.2, 0.0)}, only_reference=set())  # a finding at exactly 3 seeds
@example(pairs={1: (-1.0, 0.0), 2: (-1.1, 0.0), 3: (-1.2, 0.0)}, only_reference=set())  # ... and a lower one
@example(pairs={1: (1.0, 0.0), 2: (1.001, 0.0)}, only_reference=set())  # 2 seeds whose interval excludes 0
def test_paired_difference_and_its_interval(pairs, only_reference):
    values = {s: a for s, (a, _) in pairs.items()}
    reference = {s: b for s, (_, b) in pairs.items()} | {s: 0.0 for s in only_reference}
    d = study_summary.paired_difference(values, reference)
    seeds = sorted(pairs)
    assert d["seeds"] == seeds and d["n"] == len(seeds)
    differences = [values[s] - reference[s] for s in seeds]
    if len(seeds) < 2:
        assert d["interval"] is None and d["exceeds_seed_spread"] is None and d["finding"] is False
        return
    mean, std = statistics.fmean(differences), statistics.stdev(differences)
    half = student_t.ppf(0.975, len(seeds) - 1) * std / math.sqrt(len(seeds))
    assert d["interval"] == pytest.approx([mean - half, mean + half], abs=1e-9)
    assert d["exceeds_seed_spread"] == (not mean - half <= 0 <= mean + half)
    assert d["finding"] == (d["exceeds_seed_spread"] and len(seeds) >= study_spec.MIN_SEEDS_FOR_A_FINDING)
    text = study_summary.verdict("fox", "rope", d)
    if d["finding"]:
        word = "lower" if mean < 0 else "higher"
        assert study_summary.finding_word(d) == word and f"fox is {word} than rope" in text
    else:
        assert study_summary.finding_word(d) == "not resolved"
    assert f"{mean:+.4f}" in text and f"over {len(seeds)} paired seed(s)" in text
    assert ("excludes 0:" in text) == d["finding"]
    assert ("not resolved at this budget" in text) == (not d["finding"])
    if len(seeds) < study_spec.MIN_SEEDS_FOR_A_FINDING:  # whatever the interval: the sentence names the seeds needed
        assert f"at least {study_spec.MIN_SEEDS_FOR_A_FINDING} seeds" in text and "contains 0" not in text
    else:
        assert ("contains 0" in text) == (not d["finding"])


@given(mean=st.one_of(st.none(), finite), std=st.one_of(st.none(), st.floats(0, 10)), digits=st.integers(0, 6))
def test_fmt_shows_mean_and_std_with_the_digits_asked(mean, std, digits):
    text = study_report.fmt({"mean": mean, "std": std}, digits)
    if mean is None:
        assert text == "–"
    elif std is None:
        assert text == f"{mean:.{digits}f}"
    else:
        assert text == f"{mean:.{digits}f} ± {std:.{digits}f}"
    assert study_report.fmt(None) == "–"


@pytest.mark.parametrize("tasks", [7, 2])
def test_the_papers_average_is_shown_beside_ours_only_for_all_its_tasks(tasks):
    """The paper's average is over its seven tasks: printed when the study ran them all, a dash for fewer."""
    paper = json.loads((REPO / "eval" / "paper_results.json").read_text())
    row = dict(zip(paper["columns"], paper["medium_353M"]["rope"]))
    names = [c for c in paper["columns"] if c != "avg"][:tasks]
    stat = {"mean": 50.0, "std": 1.0}
    zero_shot = {"tasks": {t: {"average_metric": "acc", "score": stat, "acc": stat, "acc_norm": stat} for t in names},
                 "average": stat, "paper": row, "paper_size": "medium_353M"}
    report = {"study": "s", "base": "b.toml", "overrides": [], "seeds": [1], "reference": "rope",
              "launch": {"mode": "each"}, "rule": "r", "runs": [],
              "encodings": {"rope": {"difference_to_reference": None, "final_val_loss": {"n": 1, "mean": 3.0},
                                     "verdict": "v", "zero_shot": zero_shot}},
              "setup": {"model": {"n_layer": 1, "n_embd": 8, "n_head": 1, "head_dim": 8, "block_size": 8,
                                  "vocab_size": 9}, "parameters": {"rope": 1}, "tokens_per_run": 64,
                        "iterations": 1, "sequences_per_iteration": 8}}
    line, = [line for line in study_report.markdown(report, {}).splitlines()
             if line.startswith("| rope (paper, medium_353M) |")]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[1:-1] == [f"{row[t]:.2f}" for t in names]
    assert cells[-1] == (f"{row['avg']:.2f}" if tasks == 7 else "–")


@pytest.mark.parametrize("status", [0, 2])
def test_the_report_links_the_loss_curves_only_when_they_were_drawn(workspace, tmp_path, monkeypatch, status):
    # scripts/plot_runs.py's code refuses (status 2, no file) when no run has readable metrics: the report must
    # then link no missing picture
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    s = study_spec.load_study(study_file(tmp_path, encodings=["rope"], seeds=[1], evals=""))
    asked = []
    monkeypatch.setattr(study_report, "plot_loss_curves", lambda argv: asked.append(argv) or status)
    report = {"runs": [{"finished": True, "run_dir": str(tmp_path / "run"), "encoding": "rope", "seed": 1}],
              "encodings": {}}
    plots = study_report.write_plots(s, report)
    assert len(asked) == 1 and asked[0][0] == str(tmp_path / "run")
    assert ("loss_curves" in plots) == (status == 0)


@pytest.mark.fault
@pytest.mark.parametrize("damage", [b'{"train": 1.5', b"\xff\xfe garbage", b"[1, 2]", b'{"train": "an hour", "eval": 2}'])
def test_a_damaged_study_time_file_loses_only_the_earlier_time(tmp_path, damage):
    """study_time.json cut short or garbled was a JSONDecodeError out of add_wall_clock, which the runner calls in a
    job's `finally`: the traceback hid the job's own result. Now only the damaged earlier times are lost."""
    run = study_spec.Run("rope", 1, str(tmp_path / "run"), [], 10, {}, {}, 0)
    os.makedirs(run.run_dir)
    (tmp_path / "run" / "study_time.json").write_bytes(damage)
    study_launch.add_wall_clock(run, "train", 2.5)
    study_launch.add_wall_clock(run, "eval", 1.0)
    kept = {"eval": 2} if damage.endswith(b'"eval": 2}') else {}
    expected = {"train": 2.5, "eval": kept.get("eval", 0) + 1.0}
    assert json.loads((tmp_path / "run" / "study_time.json").read_text()) == expected
