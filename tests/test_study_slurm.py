"""study.py with [launch] mode = "slurm" against a real two-node SLURM (the fixture slurm_cluster,
tests/slurm_cluster.py): submission, the second call that submits nothing, resubmission of a cancelled run that
resumes, a failing run reported after its bounded tries, bad input; and, without a cluster, the [launch.slurm]
table, the sbatch command lines and the status table.

The runs are the tiny byte-level model of tests/test_study.py (2 layers, 6 iterations), a few seconds each: the
cluster has two one-CPU nodes on a machine of two cores.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import study
from studies import slurm as study_slurm, spec as study_spec
from studies.launch import read_records as read_metrics_records
from tests.helpers import synthetic_corpus, tiny_config

REPO = Path(__file__).resolve().parents[1]
SLURM = 'mode = "slurm"\n\n[launch.slurm]\ngpus_per_node = 0\ncpus_per_task = 1\npoll_s = 0.5\n'
EVALS = """
[eval.extrapolation]
factors = [1, 2]
windows = 2
passkey_factors = [1]
depths = [0]
passkey_trials = 1
"""


def study_file(root, launch=SLURM, encodings=("rope", "alibi"), extra="", evals=EVALS, name="study.toml"):
    path = Path(root) / name
    path.write_text(f'base = "base.toml"\nencodings = {json.dumps(list(encodings))}\nseeds = [1]\nout_dir = "out"\n'
                    f"{extra}\n[launch]\n{launch}\n{evals}")
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm_study_data")
    return synthetic_corpus(root, 20, 600)


@pytest.fixture
def workspace(corpus, tmp_path, monkeypatch):
    """A folder with the tiny base config, the study's working directory; one thread per process, so that the
    SLURM jobs and the in-process reference compute alike."""
    (tmp_path / "base.toml").write_text(tiny_config(corpus, eval_interval=3, eval_windows=4, ckpt_interval=3))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(threads)


@pytest.fixture
def cluster(slurm_cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    return slurm_cluster


def recorded(out="out"):
    return json.loads((Path(out) / "slurm_jobs.json").read_text())


def queue(cluster):
    return cluster.command("squeue", "--noheader", "--format=%i").stdout.split()


def val_losses(out="out"):
    return {run["run_dir"]: run["final_val_loss"] for run in json.loads((Path(out) / "report.json").read_text())["runs"]}


# ----------------------------------------------------------------------------- on the cluster

def test_a_study_on_slurm_submits_once_and_ends_with_the_in_process_losses(cluster, workspace, capsys):
    path = study_file(workspace)
    assert study.main([path]) is None  # submitted: returns at once
    first = recorded()
    assert set(first) == {"rope/seed1", "alibi/seed1"}
    assert all(len(entry["train"]) == 1 and entry["eval"] == [{"job": entry["eval"][0]["job"],
                                                                "after": entry["train"][0]}] for entry in first.values())
    table = capsys.readouterr().out
    assert "rope/seed1" in table and "submitted" in table and "0/6" in table
    jobs = queue(cluster)
    # While its jobs are queued or running, a second call submits nothing and says what each does.
    assert study.main([path]) is None
    assert recorded() == first and set(queue(cluster)) <= set(jobs)
    state_lines = [line for line in capsys.readouterr().out.splitlines() if "/seed1" in line]
    assert len(state_lines) == 2 and not any("submitted" in line for line in state_lines)
    report = study.main([path, "--wait"])
    assert recorded() == first  # nothing was resubmitted
    assert [run["status"] for run in report["runs"]] == ["done", "done"]
    on_slurm = val_losses()
    for entry in first.values():  # the evaluations ran after training, in their own job, and were marked done
        assert cluster.job(entry["eval"][0]["job"])["JobState"] == "COMPLETED"
    assert all((workspace / "out" / run / "eval" / "extrapolation.study.json").is_file() for run in first)
    # The same study in this process: the same final losses, bit for bit.
    reference = study_file(workspace, launch="", name="in_process.toml")
    Path(reference).write_text(Path(reference).read_text().replace('out_dir = "out"', 'out_dir = "ref"'))
    study.main([reference])
    assert val_losses("ref") == {key.replace("out/", "ref/", 1): value for key, value in on_slurm.items()}
    assert all(isinstance(value, float) for value in on_slurm.values())
    # Done: the table alone, every run done, the report rewritten from the runs' files.
    assert study.main([path, "--status"])["runs"] == report["runs"]


def wait_for(condition, timeout=120, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not hold within {timeout} s"
        time.sleep(0.2)


def train_iterations(run_dir):
    return [r["iter"] for r in read_metrics_records(run_dir) if r["type"] == "train"]


def test_a_run_cancelled_with_scancel_is_resubmitted_by_the_next_call_and_resumes(cluster, workspace, capsys):
    path = study_file(workspace, encodings=["rope"], evals="",
                      extra="[overrides]\nmax_iters = 1200\neval_interval = 600\nckpt_interval = 100\n")
    run_dir = workspace / "out" / "rope" / "seed1"
    study.main([path])
    first = recorded()["rope/seed1"]["train"][0]
    wait_for(lambda: (run_dir / "ckpt.pt").exists() and len(train_iterations(run_dir)) >= 120, what="a checkpoint")
    cluster.command("scancel", first)
    cluster.wait(first)
    assert cluster.state(first) == "CANCELLED" and len(train_iterations(run_dir)) < 1200
    capsys.readouterr()
    study.main([path])  # sees the cancelled job and submits the run again, to continue from its checkpoint
    out = capsys.readouterr().out
    assert "rope/seed1" in out and "submitted (try 2)" in out
    trains = recorded()["rope/seed1"]["train"]
    assert trains[0] == first and len(trains) == 2
    report = study.main([path, "--wait"])
    assert report["runs"][0]["status"] == "done" and recorded()["rope/seed1"]["train"] == trains
    second_log = (run_dir / f"slurm-train-{trains[1]}.out").read_text()
    resumed_at = int(second_log.split("iter ")[1].split("/")[0])  # its first training line
    assert 100 < resumed_at <= len(train_iterations(run_dir)) and resumed_at % 100 == 1
    iterations = train_iterations(run_dir)
    assert iterations == list(range(1, 1201))  # each iteration once: the resume dropped what followed the checkpoint
    summaries = [r for r in read_metrics_records(run_dir) if r["type"] == "summary"]
    assert [(s["iter"], s["stopped"]) for s in summaries] == [(1200, "done")]


def test_a_failing_run_is_reported_with_its_error_after_its_tries_while_the_other_finishes(cluster, workspace,
                                                                                              capsys):
    path = study_file(workspace, encodings=["rope"], evals="", launch=SLURM + "max_tries = 2\n",
                      extra='[variants]\ngood = {}\nbad = {data_dir = "no_such_data"}\n')
    with pytest.raises(SystemExit) as exit_info:
        study.main([path, "--wait"])
    assert exit_info.value.code == 1
    jobs = recorded()
    assert len(jobs["rope@good/seed1"]["train"]) == 1 and len(jobs["rope@bad/seed1"]["train"]) == 2
    report = json.loads((workspace / "out" / "report.json").read_text())
    status = {run["encoding"]: (run["status"], run["errors"]) for run in report["runs"]}
    assert status["rope@good"] == ("done", [])
    assert status["rope@bad"][0] == "failed" and "no_such_data" in status["rope@bad"][1][0]
    last_log = (workspace / "out" / "rope@bad" / "seed1" / f"slurm-train-{jobs['rope@bad/seed1']['train'][1]}.out")
    error_line = [line for line in last_log.read_text().splitlines() if line.startswith("error:")][-1]
    assert status["rope@bad"][1][0] == "training: " + error_line[len("error:"):].strip()
    out = capsys.readouterr().out
    assert "failed (2 tries)" in out and f"rope@bad/seed1: training: {error_line[6:].strip()}" in out
    # Run again: nothing is resubmitted, the failure is reported again.
    with pytest.raises(SystemExit):
        study.main([path])
    assert recorded() == jobs


def test_a_partition_that_slurm_refuses_is_one_sentence_and_nothing_is_recorded(cluster, workspace, capsys):
    path = study_file(workspace, launch=SLURM + 'partition = "no_such_partition"\n')
    with pytest.raises(SystemExit) as exit_info:
        study.main([path])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: sbatch refused the job (sbatch: error: invalid partition specified: "
                            "no_such_partition)") and "\n" not in error
    assert not (workspace / "out" / "slurm_jobs.json").exists() and queue(cluster) == []


# ----------------------------------------------------------------------------- without a cluster

def test_without_sbatch_on_path_the_study_says_so_and_records_nothing(workspace, monkeypatch, capsys):
    path = study_file(workspace)
    monkeypatch.setenv("PATH", str(workspace / "empty"))
    with pytest.raises(SystemExit) as exit_info:
        study.main([path])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error == ("error: sbatch is not on PATH, so no job can be submitted or asked about; run study.py on a "
                     "login node of the cluster (or load its slurm module), or choose another [launch] mode.")
    assert not (workspace / "out" / "slurm_jobs.json").exists()
