"""training/metrics.py: metrics.jsonl's damaged lines, printed durations, rates and times left at any magnitude,
peak memory, the code version and wandb."""
import json
import os
import re
import subprocess
import sys
import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import training.metrics as metrics
from helpers import any_seconds
from studies.launch import read_metrics
from training.metrics import Throughput, duration, trim_metrics


# ------------------------------------------------------------------------- damaged lines of metrics.jsonl, line by line
# Damaged lines of metrics.jsonl, line by line: what a resume (training.metrics.trim_metrics) and the study report
# (study.py read_metrics) keep, drop and count. A line that is not a JSON object is damage wherever it stands,
# except the file's last line when it lacks its newline (a write a kill cut short).


RECORDS = [{"type": "train", "iter": i, "loss": 10.0 - i} for i in (1, 2, 3)]


NOT_RECORDS = [b"123", b"[]", b'"x"', b"null", b"\xff\xfe garbage", b'{"type": "train", "iter": 4, "lo']


def write(path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def record_lines():
    return [json.dumps(r).encode() + b"\n" for r in RECORDS]


@pytest.mark.parametrize("bad", NOT_RECORDS)
@pytest.mark.parametrize("where", ["middle", "last_with_newline", "last_cut"])
def test_lines_that_are_not_records(tmp_path, bad, where):
    lines = record_lines()
    if where == "middle":
        lines.insert(1, bad + b"\n")
        bad_number = 2
    else:
        lines.append(bad + (b"\n" if where == "last_with_newline" else b""))
        bad_number = 4
    damaged = [] if where == "last_cut" else [bad_number]
    path = tmp_path / "metrics.jsonl"
    write(path, lines)

    records, damaged_lines = read_metrics(str(tmp_path))
    assert records == RECORDS
    assert damaged_lines == damaged

    assert trim_metrics(str(path), step=3) == len(damaged)
    assert [json.loads(line) for line in path.read_text().splitlines()] == RECORDS


def test_trim_keeps_records_up_to_the_step_and_drops_summaries_and_later_changes(tmp_path):
    kept = [{"type": "train", "iter": 1}, {"type": "val", "iter": 2}, {"type": "change", "iter": 1, "key": "lr"}]
    dropped = [{"type": "train", "iter": 3}, {"type": "summary", "iter": 2}, {"type": "change", "iter": 2, "key": "lr"}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in kept + dropped))
    assert trim_metrics(str(path), step=2) == 0
    assert [json.loads(line) for line in path.read_text().splitlines()] == kept


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


@pytest.mark.parametrize("run_id", [None, "abc123"])
def test_wandb_continues_the_saved_run_on_resume(monkeypatch, tmp_path, run_id):
    from config import TrainConfig
    from training.metrics import start_wandb
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: calls.append(kw) or "run"))
    cfg = TrainConfig(data_dir="d", out_dir=str(tmp_path), wandb=True, wandb_project="p", wandb_mode="offline")
    assert start_wandb(cfg, "fox", {"model": {}}, run_id) == "run"
    assert calls == [{"project": "p", "name": "fox", "config": {"model": {}}, "mode": "offline", "dir": str(tmp_path),
                      "id": run_id, "resume": "allow" if run_id else None}]
    named = TrainConfig(data_dir="d", out_dir=str(tmp_path), wandb_run_name="mine")
    start_wandb(named, "fox", {}, None)
    assert calls[-1]["name"] == "mine"


def test_peak_memory_names_what_it_measured_on_each_device(monkeypatch):
    """metrics.jsonl's peak memory: CUDA's max allocated bytes on a GPU, the process's max RSS (KiB on Linux)
    elsewhere, each with the name of what was measured."""
    import resource
    from training import metrics
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**30)
    assert metrics.peak_memory(torch.device("cuda")) == {"peak_memory_gb": 3.0, "memory_kind": "cuda max allocated"}
    monkeypatch.setattr(resource, "getrusage", lambda who: type("Usage", (), {"ru_maxrss": 2**20 // 2})())
    assert metrics.peak_memory(torch.device("cpu")) == {"peak_memory_gb": 0.5, "memory_kind": "process max RSS"}


def test_the_code_version_is_the_commit_and_dirty_only_for_changed_tracked_files(tmp_path, monkeypatch):
    from training.metrics import code_version

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "tracked.py").write_text("a = 1\n")
    git("add", "tracked.py")
    git("commit", "-q", "-m", "first")
    commit = git("rev-parse", "HEAD")
    # code_version asks git about the repository it lives in; these point git at the one made here instead
    monkeypatch.setenv("GIT_DIR", str(tmp_path / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(tmp_path))
    (tmp_path / "untracked.txt").write_text("an output file\n")
    assert code_version() == commit
    (tmp_path / "tracked.py").write_text("a = 2\n")
    assert code_version() == commit + "-dirty"
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "not-a-repository"))
    assert code_version() == "unknown"


def test_wandb_gets_each_numeric_value_under_its_record_type_at_the_records_iteration(tmp_path, capsys):
    from training.metrics import Metrics
    logged = []
    run = types.SimpleNamespace(log=lambda values, step: logged.append((values, step)))
    metrics = Metrics(str(tmp_path / "metrics.jsonl"), run)
    record = {"type": "train", "iter": 7, "loss": 2.5, "tokens": 1024, "lr": None, "note": "text"}
    metrics.write(record, "step 7")
    assert logged == [({"train/loss": 2.5, "train/tokens": 1024}, 7)]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == record
    assert capsys.readouterr().out == "step 7\n"


def test_a_wandb_that_stops_working_is_dropped_with_a_warning_and_the_records_go_on(tmp_path, capsys):
    """A requeue under SLURM sends SIGTERM to every process of the job, wandb's service among them: its next log
    raised ConnectionResetError, so the run ended without the checkpoint of the stop (tests/test_slurm_train.py)."""
    from training.metrics import Metrics
    calls = []

    def lost(values, step):
        calls.append(step)
        raise ConnectionResetError("Connection lost")
    run = types.SimpleNamespace(log=lost, finish=lambda: calls.append("finish"), id="abc123")
    metrics = Metrics(str(tmp_path / "metrics.jsonl"), run)
    for step in (1, 2):
        metrics.write({"type": "train", "iter": step, "loss": 2.5}, f"step {step}")
    metrics.close()
    assert calls == [1]  # tried once, then neither logged to nor finished
    assert [json.loads(line)["iter"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: wandb")]
    assert warnings == [f"warning: wandb stopped working (ConnectionResetError: Connection lost); the run goes on "
                        f"without it, and {tmp_path / 'metrics.jsonl'} keeps every record."]
    assert metrics.wandb_id("abc123") == "abc123"  # (what the next checkpoint keeps, from the run's start)


# ---------------------------------- properties: durations, rates and progress at any magnitude, from a second to months
# Each printed duration is parsed back and compared with the seconds it stands for (rounded to the second, and to the
# minute in training's hours form); the rates and times left are compared with their formulas on a clock the test
# moves (train: the average time per step so far times the steps left; evaluation: the average time per unit of work
# times the units left).


def training_seconds(text):
    """What a training duration string says, in seconds: "3h05m", "4m10s" or "12s"."""
    hours = re.fullmatch(r"(\d+)h(\d\d)m", text)
    if hours:
        assert int(hours[2]) < 60
        return 3600 * int(hours[1]) + 60 * int(hours[2])
    minutes = re.fullmatch(r"([1-9]|[1-5]\d)m(\d\d)s", text)
    if minutes:
        assert int(minutes[2]) < 60
        return 60 * int(minutes[1]) + int(minutes[2])
    plain = re.fullmatch(r"(\d+)s", text)
    assert plain and int(plain[1]) < 60, text
    return int(plain[1])


@given(s=any_seconds)
def test_training_durations_read_back_at_any_magnitude(s):
    whole = int(round(s))
    text = duration(s)
    if whole >= 3600:
        assert training_seconds(text) == whole - whole % 60, text  # hours and minutes
    else:
        assert training_seconds(text) == whole, text


@pytest.mark.parametrize("s,text", [(0, "0s"), (59, "59s"), (60, "1m00s"), (61, "1m01s"), (3599, "59m59s"),
                                    (3600, "1h00m"), (3659, "1h00m"), (3660, "1h01m"), (11100, "3h05m"),
                                    (90061, "25h01m")])
def test_training_durations_at_the_unit_limits(s, text):
    assert duration(s) == text


@given(first=st.integers(0, 10**6), steps=st.lists(st.floats(min_value=1e-3, max_value=1e5), min_size=1, max_size=8),
       tokens=st.integers(1, 10**7), world=st.integers(1, 64), peak=st.sampled_from([None, 989e12]),
       extra=st.integers(0, 10**6))
def test_throughput_and_time_left_at_any_magnitude(monkeypatch, first, steps, tokens, world, peak, extra):
    """Step i (after `first`) ends at the sum of the first i step times; the rate is over the steps since the last
    reading, the time left the average time per step since the start times the steps left."""
    now = [1000.0]
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: now[0])
    flops_per_token = 6e9
    meter = Throughput(first, tokens, flops_per_token, peak, world)
    end = first + len(steps) + extra
    for i, seconds_of_step in enumerate(steps, start=1):
        before = now[0]
        now[0] += seconds_of_step
        seconds_of_step, elapsed = now[0] - before, now[0] - 1000.0  # as the clock holds them
        rate = meter.read(first + i, end)
        assert rate["elapsed_s"] == pytest.approx(elapsed, rel=1e-9)
        assert rate["eta_s"] == pytest.approx(elapsed / i * (end - first - i), rel=1e-9)
        assert rate["tokens_per_s"] == pytest.approx(tokens / seconds_of_step, rel=1e-9)
        assert rate["ms_per_iter"] == pytest.approx(1000 * seconds_of_step, rel=1e-9)
        if peak is None:
            assert rate["mfu"] is None
        else:
            assert rate["mfu"] == pytest.approx(flops_per_token * tokens / seconds_of_step / (peak * world), rel=1e-9)
        meter.restart(first + i)


def test_provenance_keeps_the_first_start_and_adds_one_record_per_resume(tmp_path):
    from training.metrics import provenance
    first = provenance(str(tmp_path), "configs/a.toml", ["--lr=1"], ["configs/a.toml", "--lr=1"], None, "v1")
    assert first["config_file"] == os.path.abspath("configs/a.toml") and first["overrides"] == ["--lr=1"]
    assert first["command"] == "train.py configs/a.toml --lr=1" and first["resumes"] == []
    (tmp_path / "config.json").write_text(json.dumps(first))
    second = provenance(str(tmp_path), str(tmp_path), [], [str(tmp_path), "--resume"], 40, "v2")
    assert {k: second[k] for k in ("config_file", "overrides", "command", "started")} == \
        {k: first[k] for k in ("config_file", "overrides", "command", "started")}
    assert [(r["iter"], r["command"], r["code_version"]) for r in second["resumes"]] == [
        (40, f"train.py {tmp_path} --resume", "v2")]
    (tmp_path / "config.json").write_text(json.dumps(second))
    third = provenance(str(tmp_path), str(tmp_path), [], ["--resume"], 90, "v3")
    assert [(r["iter"], r["code_version"]) for r in third["resumes"]] == [(40, "v2"), (90, "v3")]
    (tmp_path / "config.json").write_text("not json")  # unreadable: this resume is the earliest start on record
    lost = provenance(str(tmp_path), "b.toml", [], ["b.toml", "--resume"], 7, "v4")
    assert lost["command"] == "train.py b.toml --resume" and [r["iter"] for r in lost["resumes"]] == [7]
