"""scripts/study.py features beyond tests/test_study.py: the seed-major run order, diverged runs, the finding rule,
--publish, and the cpu_jobs threads per job. Each expectation is computed here independently of study.py (the
t quantile from scipy.stats.t, the markdown from the study's own report.md, the thread count from the core count).
"""
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

import train
from scripts import study
from test_study import records, study_file, workspace  # noqa: F401  (workspace: the module-scoped fixture)

ENCODINGS, SEEDS = ["rope", "alibi"], [1, 2]
# Extrapolation only (no zero-shot): a second plot, loss_vs_position.png, for --publish to copy.
EXTRAPOLATION = """
[eval.extrapolation]
factors = [1, 2]
windows = 2
passkey_factors = [1]
depths = [0]
passkey_trials = 1
"""


@pytest.fixture(scope="module", autouse=True)
def single_threaded():
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ordered(workspace, tmp_path_factory):  # noqa: F811
    """The tiny study (rope, alibi x seeds 1, 2, in_process) run once with train.run recording its arguments and
    then training for real: (its directory, the recorded argument lists, the report)."""
    root = tmp_path_factory.mktemp("ordered")
    shutil.copy(workspace / "base.toml", root / "base.toml")
    path = study_file(root, encodings=ENCODINGS, seeds=SEEDS, evals=EXTRAPOLATION)
    calls, real_run = [], train.run

    def recording(argv):
        calls.append(list(argv))
        return real_run(argv)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setattr(train, "run", recording)
        report = study.main([path])
    return root, calls, report


def flag(argv, name):
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert len(values) == 1, argv
    return values[0]


# ----------------------------------------------------------------------------- 1. run order

def test_runs_go_seed_by_seed_every_encoding_for_each(ordered):
    root, calls, report = ordered
    order = [(flag(a, "pos"), int(flag(a, "seed"))) for a in calls]
    assert order == [("rope", 1), ("alibi", 1), ("rope", 2), ("alibi", 2)]
    assert [flag(a, "out_dir") for a in calls] == [os.path.join("out", e, f"seed{s}") for e, s in order]
    assert not any("--resume" in a for a in calls)  # every run started afresh
    assert [(r["encoding"], r["seed"]) for r in report["runs"]] == order  # the report lists them in that order
    for row in report["runs"]:  # and each really finished
        assert row["status"] == "done"
        assert row["final_val_loss"] == records(root / row["run_dir"], "val")[-1]["val_loss"]


# ----------------------------------------------------------------------------- 2. diverged runs

DIVERGED = "training diverged: loss is nan at iteration 3; resume from the last good checkpoint with a lower lr"


def loss_table(markdown):
    """The rows of the report's final-validation-loss table: encoding -> {column: cell}."""
    lines = markdown.split("## Final validation loss\n\n", 1)[1].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_a_diverged_run_is_reported_as_diverged_and_not_trained_again(workspace, tmp_path, monkeypatch, capsys):  # noqa: F811
    from eval import extrapolation
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=ENCODINGS, seeds=SEEDS, evals=EXTRAPOLATION)
    monkeypatch.chdir(tmp_path)
    real_run, real_extrapolation = train.run, extrapolation.main
    trained, evaluated = [], []

    def alibi_seed1_diverges(argv):
        trained.append((flag(argv, "pos"), int(flag(argv, "seed"))))
        if trained[-1] == ("alibi", 1):
            raise train.TrainError(DIVERGED)
        return real_run(argv)

    def counted_extrapolation(argv):
        evaluated.append(argv[argv.index("--ckpt") + 1])
        return real_extrapolation(argv)
    monkeypatch.setattr(train, "run", alibi_seed1_diverges)
    monkeypatch.setattr(extrapolation, "main", counted_extrapolation)
    run_dir = Path("out") / "alibi" / "seed1"

    for attempt in range(2):
        report = study.main([path])  # returns: a diverged run is not a failure, so no exit status 1 (nor any)
        out = capsys.readouterr().out
        if attempt == 0:
            assert trained == [("rope", 1), ("alibi", 1), ("rope", 2), ("alibi", 2)]
            assert str(run_dir) not in evaluated and len(evaluated) == 3  # nothing evaluates the diverged run
            assert "[study] DIVERGED alibi seed 1: " + DIVERGED in out
        else:  # the rerun trains and evaluates nothing: the marker says it diverged
            assert trained == [] and evaluated == []
            assert f"[study] DIVERGED alibi seed 1 (earlier): {DIVERGED}" in out
        assert "[study] FAILED" not in out
        assert (f"[study] wrote {os.path.join('out', 'report.md')} and report.json; 1 run(s) diverged, see the "
                "report's last section") in out.splitlines()
        trained.clear(), evaluated.clear()
        assert json.loads((run_dir / "study_diverged.json").read_text()) == {"error": DIVERGED}
        assert json.loads(Path("out/report.json").read_text()) == json.loads(json.dumps(report))
        rows = {(r["encoding"], r["seed"]): r for r in report["runs"]}
        row = rows["alibi", 1]
        assert row["status"] == "diverged" and row["errors"] == [f"training: {DIVERGED}"]
        assert row["final_val_loss"] is None and not row["finished"]
        assert all(rows[key]["status"] == "done" for key in rows if key != ("alibi", 1))

        alibi, rope = report["encodings"]["alibi"], report["encodings"]["rope"]
        assert alibi["diverged_seeds"] == [1] and rope["diverged_seeds"] == []
        # Left out of the means and the paired difference: only seed 2 remains for alibi.
        assert alibi["final_val_loss"]["seeds"] == [2] and alibi["final_val_loss"]["n"] == 1
        assert alibi["final_val_loss"]["values"] == [records("out/alibi/seed2", "val")[-1]["val_loss"]]
        assert alibi["difference_to_reference"]["seeds"] == [2]
        assert alibi["extrapolation"]["seeds"] == [2]
        assert alibi["verdict"].endswith(" Diverged (no final loss, left out above): seed(s) 1.")

        markdown = Path("out/report.md").read_text()
        table = loss_table(markdown)
        assert table["alibi"]["diverged"] == "1" and table["rope"]["diverged"] == "0"
        assert table["alibi"]["seeds"] == "1" and table["rope"]["seeds"] == "2"
        assert "| alibi | 1 | diverged | 0 | 0 | – |" in markdown  # the Runs table
        assert f"- alibi seed 1: training: {DIVERGED}" in markdown.split("## Failed or diverged runs", 1)[1]


# ----------------------------------------------------------------------------- 3. the finding rule

def t_interval(values):
    """mean ± t(0.975, n - 1) · sd / √n, sd the sample standard deviation, written out here."""
    from scipy.stats import t
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean, sd, (mean - half, mean + half)


@pytest.mark.parametrize("sign,word", [(+1, "higher"), (-1, "lower")])
def test_a_difference_is_a_finding_only_over_three_seeds_whose_interval_excludes_0(sign, word):
    reference = {1: 3.0, 2: 3.2, 3: 2.9, 4: 3.1}  # seed 4: the encoding lacks it, so it is not paired
    deltas = {1: 0.100, 2: 0.101, 3: 0.103}
    mine = {s: reference[s] + sign * d for s, d in deltas.items()}
    expected = [mine[s] - reference[s] for s in (1, 2, 3)]

    diff = study.paired_difference(mine, reference)
    mean, sd, (lo, hi) = t_interval(expected)
    assert diff["seeds"] == [1, 2, 3] and diff["n"] == 3 and diff["values"] == pytest.approx(expected, abs=1e-15)
    assert diff["mean"] == pytest.approx(mean, rel=1e-12) and diff["std"] == pytest.approx(sd, rel=1e-9)
    assert diff["interval"] == pytest.approx([lo, hi], rel=1e-9)
    assert (lo > 0 or hi < 0) and diff["exceeds_seed_spread"] is True and diff["finding"] is True
    assert study.finding_word(diff) == word
    sentence = study.verdict("alibi", "rope", diff)
    assert "excludes 0:" in sentence and "not resolved" not in sentence
    assert f"[{lo:+.4f}, {hi:+.4f}]" in sentence and f"= {mean:+.4f} ± {sd:.4f}" in sentence
    assert sentence.endswith(f"alibi is {word} than rope at this budget.") and "over 3 paired seed(s)" in sentence
    assert study.interval_cell(diff).endswith("*")

    # The same first two seeds: the interval still excludes 0 (t(0.975, 1) = 12.7 against a tiny spread), but two
    # seeds never make a finding.
    two = study.paired_difference({s: mine[s] for s in (1, 2)}, reference)
    mean2, sd2, (lo2, hi2) = t_interval(expected[:2])
    assert two["n"] == 2 and two["interval"] == pytest.approx([lo2, hi2], rel=1e-9)
    assert (lo2 > 0 or hi2 < 0) and two["exceeds_seed_spread"] is True and two["finding"] is False
    assert study.finding_word(two) == "not resolved"
    sentence = study.verdict("alibi", "rope", two)
    assert "not resolved at this budget" in sentence and "excludes 0:" not in sentence
    assert "over 2 paired seed(s)" in sentence and f"= {mean2:+.4f} ± {sd2:.4f}" in sentence
    assert not study.interval_cell(two).endswith("*")


def test_three_seeds_whose_interval_contains_0_are_not_resolved():
    values = [0.05, -0.02, 0.04]
    got = study.mean_interval(values)
    mean, sd, (lo, hi) = t_interval(values)
    assert lo < 0 < hi and got["interval"] == pytest.approx([lo, hi], rel=1e-9)
    assert got["exceeds_seed_spread"] is False and got["finding"] is False
    diff = got | {"seeds": [1, 2, 3]}
    assert study.finding_word(diff) == "not resolved"
    sentence = study.verdict("fox", "rope", diff)
    assert f"[{lo:+.4f}, {hi:+.4f}] contains 0: not resolved at this budget." in sentence
    # one seed: no interval at all, and no finding
    one = study.mean_interval([0.3])
    assert one["interval"] is None and one["std"] is None and one["finding"] is False


# ----------------------------------------------------------------------------- 4. --publish

BEFORE = "# CPU results\n\nWhat was found, in words: kept as it is.\n\n"
AFTER = "\n\n## Discussion\n\nAlso kept, byte for byte.   \n"
PLOTS = ("loss_curves.png", "loss_vs_position.png")


def expected_body(report_md: str, stem: str) -> str:
    """The study's own report.md one heading level down, its plots named <stem>_<plot>.png."""
    lines = []
    for line in report_md.rstrip("\n").split("\n"):
        for plot in PLOTS:
            line = line.replace(f"]({plot})", f"]({stem}_{plot})")
        lines.append("#" + line if line.startswith("#") else line)
    return "\n".join(lines)


@pytest.fixture
def finished_copy(ordered, tmp_path, monkeypatch):
    """A copy of the finished study (file times kept, so its evaluations stay finished), as the working directory;
    train.run and the evaluation must not be called."""
    from eval import extrapolation
    root, _, _ = ordered
    shutil.copytree(root, tmp_path / "copy")
    monkeypatch.chdir(tmp_path / "copy")
    monkeypatch.setattr(train, "run", lambda argv: pytest.fail(f"train.run called: {argv}"))
    monkeypatch.setattr(extrapolation, "main", lambda argv: pytest.fail(f"extrapolation called: {argv}"))
    return tmp_path / "copy"


def test_publish_writes_the_report_between_the_markers_and_keeps_the_rest(finished_copy):
    target = Path("results.md")
    target.write_bytes((BEFORE + study.REPORT_BEGIN + "\nan older report\n## with a heading\n" + study.REPORT_END
                        + AFTER).encode())
    study.main(["study.toml", "--publish", str(target)])
    text = target.read_bytes().decode()
    body = expected_body(Path("out/report.md").read_text(), "results")
    assert text == f"{BEFORE}{study.REPORT_BEGIN}\n{body}\n{study.REPORT_END}{AFTER}"
    assert "an older report" not in text
    assert "\n## Study `study`\n" in text and "\n### Final validation loss\n" in text  # one level down
    assert "\n# Study" not in text.split(study.REPORT_BEGIN)[1]
    for plot in PLOTS:  # each plot copied beside the file, the same bytes as the study's own
        assert f"](results_{plot})" in text
        assert Path(f"results_{plot}").read_bytes() == Path("out", plot).read_bytes()
        assert Path(f"results_{plot}").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in Path(".").glob("results*")) == ["results.md"] + [f"results_{p}" for p in PLOTS]

    first = target.read_bytes()
    study.main(["study.toml", "--publish", str(target)])  # publishing again changes nothing
    assert target.read_bytes() == first
    for plot in PLOTS:
        assert Path(f"results_{plot}").read_bytes() == Path("out", plot).read_bytes()


def test_publish_to_a_missing_file_makes_it_with_the_markers(finished_copy):
    assert not Path("new.md").exists()
    study.main(["study.toml", "--publish", "new.md"])
    body = expected_body(Path("out/report.md").read_text(), "new")
    assert Path("new.md").read_text() == f"{study.REPORT_BEGIN}\n{body}\n{study.REPORT_END}\n"
    for plot in PLOTS:
        assert Path(f"new_{plot}").read_bytes() == Path("out", plot).read_bytes()


@pytest.mark.parametrize("text", [
    BEFORE + AFTER,                                                                  # no markers
    BEFORE + study.REPORT_BEGIN + "\n" + AFTER,                                      # no end marker
    BEFORE + study.REPORT_END + "\n" + study.REPORT_BEGIN + "\n" + AFTER,            # in the wrong order
    BEFORE + (study.REPORT_BEGIN + "\n" + study.REPORT_END + "\n") * 2 + AFTER,      # twice
])
def test_a_publish_target_without_its_markers_is_refused_before_any_run(workspace, tmp_path, monkeypatch, capsys,  # noqa: F811
                                                                        text):
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=ENCODINGS, seeds=SEEDS, evals="")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "run", lambda argv: pytest.fail("train.run called before the target was checked"))
    target = tmp_path / "doc.md"
    target.write_text(text)
    with pytest.raises(study.StudyError, match="must hold the lines"):
        study.check_publish_target(str(target))
    with pytest.raises(SystemExit) as exit_info:  # main turns the StudyError into one sentence and status 2
        study.main([path, "--publish", str(target)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {target} must hold the lines {study.REPORT_BEGIN} and {study.REPORT_END}")
    assert len(err.splitlines()) == 1
    assert target.read_text() == text and not (tmp_path / "out").exists()
    with pytest.raises(study.StudyError, match="does not exist or cannot be written"):  # a folder that is not there
        study.check_publish_target(str(tmp_path / "no_such_folder" / "doc.md"))


def test_every_plot_the_published_report_links_is_beside_it(finished_copy):
    """A study with a long-context evaluation: its plot too must be linked under the name publish copies it to."""
    plan = study.load_study("study.toml")
    report = json.loads(Path("out/report.json").read_text())
    output = {"lengths": [32, 64], "train_context": 32, "rope_scaling": "none", "limit": 1,
              "tasks": ["niah_single_1"], "ruler_average": {"32": 50.0, "64": 25.0},
              "ruler_average_tasks": {"32": 1, "64": 1}, "babilong_average": {}, "babilong_average_tasks": {},
              "scores": {"niah_single_1": {"32": {"score": 50.0}, "64": {"score": 25.0}}}}
    report["encodings"]["rope"]["long_context"] = study.long_context_summary([output]) | {"seeds": [1]}
    shutil.copy("out/loss_curves.png", "out/long_context.png")  # any PNG: publish copies it, whatever it shows
    report["plots"]["long_context"] = "long_context.png"
    study.publish(plan, report, "doc.md")
    text = Path("doc.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == 3 and "doc_long_context.png" in links
    assert all(Path(link).is_file() for link in links), links


# ----------------------------------------------------------------------------- 5. cpu_jobs: threads per job

@pytest.mark.parametrize("cores,jobs,threads", [(16, 2, 8), (16, 3, 5), (8, 1, 8), (2, 2, 1), (2, 4, 1),
                                                (7, None, 1), (None, 1, 1)])
def test_cpu_jobs_give_each_job_its_share_of_the_cores(workspace, tmp_path, monkeypatch, cores, jobs,  # noqa: F811
                                                       threads):
    """OMP_NUM_THREADS = max(1, cores // jobs) in the environment each subprocess job starts with (jobs left out:
    one job per core), no GPU visible, the rest of the study's environment passed on."""
    import subprocess
    import sys
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    launch = '[launch]\nmode = "cpu_jobs"\n' + (f"jobs = {jobs}\n" if jobs is not None else "")
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals=EXTRAPOLATION, extra=launch)
    monkeypatch.chdir(tmp_path)
    s = study.load_study(path)
    n_jobs = jobs if jobs is not None else (cores or 1)
    assert threads == max(1, (cores or 1) // n_jobs)  # the documented rule, for the values listed above
    assert s.jobs == n_jobs and study.gpu_slots(s) == [[] for _ in range(n_jobs)]

    started = []

    class FakePopen:  # records what the study would start, and "succeeds" at once
        def __init__(self, command, env=None, **kwargs):
            started.append((command, env))

        def wait(self):
            return 0
    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setenv("OMP_NUM_THREADS", "99")  # the study's value replaces one already set
    monkeypatch.setenv("STUDY_TEST_MARK", "kept")
    runner, run = study.Runner(s), s.runs[0]
    assert runner.subprocess_job("train", study.train_argv(run), run.run_dir, []) is None
    assert runner.subprocess_job("extrapolation", run.evals["extrapolation"], run.run_dir, []) is None
    (train_command, train_env), (eval_command, eval_env) = started
    assert train_command == [sys.executable, str(study.REPO / "train.py"), *run.train_args]
    assert eval_command == [sys.executable, str(study.REPO / "eval" / "extrapolation.py"), *run.evals["extrapolation"]]
    for env in (train_env, eval_env):
        assert env["OMP_NUM_THREADS"] == str(threads)
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["STUDY_TEST_MARK"] == "kept"
        assert {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")} == \
            {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")}
    command, extra = study.job_command(s, "train", run.train_args, [])
    assert extra == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads)}
    assert Path(run.run_dir, "study_train.log").read_text() == f"$ CUDA_VISIBLE_DEVICES= {' '.join(train_command)}\n"


def test_inside_a_study_train_is_told_to_advise_running_the_study_again(workspace, tmp_path, monkeypatch):
    """train.py's "continue with --resume" would resume one run by hand, outside the study's bookkeeping: while a
    study runs, its command is in the environment train.py and its jobs read, and it is gone afterwards."""
    from training.errors import STUDY_COMMAND_VARIABLE, continue_advice
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals="")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(STUDY_COMMAND_VARIABLE, "an outer study")
    seen = []

    def fake_run(argv):
        seen.append(continue_advice())
        raise train.TrainError("no data here")
    monkeypatch.setattr(train, "run", fake_run)
    with pytest.raises(SystemExit):
        study.main([path, "--publish", str(tmp_path / "doc.md")])
    assert seen == [f"continue by running the study again (python scripts/study.py {path} --publish "
                    f"{tmp_path / 'doc.md'})"]
    assert os.environ[STUDY_COMMAND_VARIABLE] == "an outer study"  # restored
    monkeypatch.delenv(STUDY_COMMAND_VARIABLE)
    assert continue_advice() == "continue with --resume"
