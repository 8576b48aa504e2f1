"""scripts/study.py: a tiny study end to end on the CPU, its report against the runs' own files, resuming,
failures, Ctrl-C, launch command lines and the shipped study files.

The study trains a 2-layer byte-level model for 6 iterations (two encodings x two seeds), then runs
eval/extrapolation.py and eval/zero_shot.py (two tasks of the fixtures) on each run.
"""
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import train
from eval import extrapolation, zero_shot
from scripts import study
from tests.helpers import prepare_byte_corpus, synthetic_text, tiny_config

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
    data = prepare_byte_corpus(root, [synthetic_text(doc, 600) for doc in range(20)])
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
    assert ("exceeds the seed spread" if exceeds else "is within the seed spread") in sentence
    assert f"{sum(d) / 2:+.4f}" in sentence and "2 paired seeds" in sentence

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
    loaded = study.load_study("study.toml")
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
    assert not Path("out/report.json").exists()


def test_sigterm_to_a_study_of_subprocesses_stops_its_jobs(workspace, tmp_path, monkeypatch, capsys):
    """A scheduler's SIGTERM reaches only the study: it must pass it on to the jobs it started, then stop."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=["rope", "alibi"], seeds=[1], evals="",
                      extra='[launch]\nmode = "per_gpu"\ngpus = [0]\n')
    monkeypatch.chdir(tmp_path)
    job = "import pathlib, time; pathlib.Path('started').touch(); time.sleep(60)"
    monkeypatch.setattr(study, "job_command",
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


# ----------------------------------------------------------------------------- launching

def test_launch_modes_build_torchrun_and_per_gpu_command_lines(workspace, tmp_path):
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, extra='[launch]\nmode = "torchrun"\ngpus_per_run = 4\ngpus = 8\n')
    s = study.load_study(path)
    assert study.gpu_slots(s) == [["0", "1", "2", "3"], ["4", "5", "6", "7"]]
    run = s.runs[3]
    assert (run.encoding, run.seed) == ("alibi", 2)
    command, env = study.job_command(s, "train", study.train_argv(run), ["4", "5", "6", "7"])
    assert command == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                       str(REPO / "train.py"), str(tmp_path / "base.toml"), "--pos=alibi", "--kv_shift=false",
                       "--seed=2", f"--out_dir={os.path.join('out', 'alibi', 'seed2')}"]
    assert env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    command, env = study.job_command(s, "zero_shot", run.evals["zero_shot"], ["4", "5", "6", "7"])
    assert command == [sys.executable, str(REPO / "eval" / "zero_shot.py"), "--ckpt", run.run_dir,
                       "--out", os.path.join(run.run_dir, "eval"), f"--data-dir={FIXTURES}",
                       "--tasks=arc_easy,winogrande"]

    path = study_file(tmp_path, extra='[launch]\nmode = "per_gpu"\ngpus = [2, 5, 6]\n')
    s = study.load_study(path)
    assert study.gpu_slots(s) == [["2"], ["5"], ["6"]]
    command, env = study.job_command(s, "train", study.train_argv(s.runs[0]), ["5"])
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
    ('base = "base.toml"\nencodings = ["rope"]\nsed = [1]\n', "unknown entry sed"),
    ('base = "base.toml"\nencodings = ["rope", "rope"]\n', "distinct names"),
    ('base = "base.toml"\nencodings = "rope"\n', "distinct names"),
    ('base = "base.toml"\nencodings = ["rope"]\nseeds = 3\n', "seeds must be a list of distinct integers"),
    ('base = "base.toml"\nencodings = ["rope"]\n[overrides]\nmax_iter = 3\n', "did you mean 'max_iters'"),
    ('base = "base.toml"\nencodings = ["rope"]\n[launch]\nmode = "slurm"\n', "in_process, torchrun, per_gpu"),
    ('base = "base.toml"\nencodings = ["rope"]\n[eval.extrapolation]\nwindowz = 2\n',
     "unrecognized arguments: --windowz=2"),
    # prefixes of real options (passkey_trials, windows), which argparse's abbreviations used to take silently
    ('base = "base.toml"\nencodings = ["rope"]\n[eval.extrapolation]\npasskey_trial = 2\n',
     "unrecognized arguments: --passkey-trial=2"),
    ('base = "base.toml"\nencodings = ["rope"]\n[eval.extrapolation]\nwindow = 2\n',
     "unrecognized arguments: --window=2"),
    ('base = "base.toml"\nencodings = ["rope"]\n[eval.zero_shot]\nbatch = 2\n', "unrecognized arguments: --batch=2"),
    ('base = "base.toml"\nencodings = ["rope"]\n[eval.perplexity]\n', "unknown evaluation [eval.perplexity]"),
    ('base = "base.toml"\nencodings = ["rope", "alibi"]\nreference = "fox"\n', "reference 'fox'"),
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


def test_shipped_studies_cover_the_papers_tables():
    paper = json.loads((REPO / "eval" / "paper_results.json").read_text())
    studies = {name: study.load_study(str(REPO / "configs" / "studies" / f"{name}.toml"))
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
