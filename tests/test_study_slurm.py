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
    runs = json.loads((Path(out) / "report.json").read_text())["runs"]
    return {run["run_dir"]: run["final_val_loss"] for run in runs}


# ----------------------------------------------------------------------------- on the cluster

def test_a_study_on_slurm_submits_once_and_ends_with_the_in_process_losses(cluster, workspace, capsys):
    path = study_file(workspace)
    assert study.main([path]) is None  # submitted: returns at once
    first = recorded()
    assert set(first) == {"rope/seed1", "alibi/seed1"}
    assert all(len(entry["train"]) == 1 and len(entry["eval"]) == 1 and entry["eval"][0]["after"] == entry["train"][0]
               for entry in first.values())
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
    def logged(job):  # the iterations a job's log shows
        text = (run_dir / f"slurm-train-{job}.out").read_text()
        return [int(line.split()[1].split("/")[0]) for line in text.splitlines() if line.startswith("iter ")
                and "/1200" in line]
    # scancel's SIGTERM made train.py save at the step it had reached: the new job starts after it, not after the
    # last periodic checkpoint (iteration 100)
    resumed_at = logged(trains[1])[0]
    assert resumed_at > 100 and logged(first)[-1] == resumed_at - 1 and logged(trains[1])[-1] == 1200
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


def test_a_run_of_more_processes_than_a_node_holds_spans_nodes(cluster, workspace):
    """gpus_per_run = 2 on a CPU partition (one process a node): the run's one job trains on both nodes, as one
    process group of two."""
    path = study_file(workspace, encodings=["rope"], evals="", extra="[overrides]\nbatch_size = 2\n",
                      launch=SLURM.replace('mode = "slurm"', 'mode = "slurm"\ngpus_per_run = 2'))
    report = study.main([path, "--wait"])
    job = cluster.job(recorded()["rope/seed1"]["train"][0])
    assert job["NumNodes"] == "2" and job["NodeList"] == "n[1-2]" and job["JobState"] == "COMPLETED"
    run_dir = workspace / "out" / "rope" / "seed1"
    assert json.loads((run_dir / "config.json").read_text())["world_size"] == 2
    assert report["runs"][0]["status"] == "done" and train_iterations(run_dir) == list(range(1, 7))


def test_a_job_whose_node_cannot_see_its_run_directory_says_so_in_the_table(cluster, workspace, capsys):
    """The run's folder gone between submission and the job's start (as on a node that does not mount it): SLURM
    cannot open the job's log there, the job fails at once, and the table says what to check."""
    path = study_file(workspace, encodings=["rope"], evals="", launch=SLURM + 'sbatch_options = ["--hold"]\n')
    study.main([path])
    job = recorded()["rope/seed1"]["train"][0]
    (workspace / "out" / "rope").rename(workspace / "elsewhere")
    cluster.command("scontrol", "release", job)
    assert cluster.wait(job)["JobState"] == "FAILED"
    capsys.readouterr()
    assert study.main([path, "--status"]) is None
    out = capsys.readouterr().out
    assert f"rope/seed1: training: job {job} ended FAILED without a log {workspace}/out/rope/seed1/slurm-train-" \
           f"{job}.out: its node could not write into the run's folder; do the compute nodes see the study's " \
           "out_dir at the same path?" in out
    assert recorded()["rope/seed1"]["train"] == [job]  # --status submits nothing


def test_an_evaluation_job_without_its_run_directory_says_so(workspace, capsys):
    path = study_file(workspace)
    with pytest.raises(SystemExit) as exit_info:
        study.main([path, "--evaluate", "alibi/seed1"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: run directory {workspace}/out/alibi/seed1 does not exist on ")
    assert "the compute nodes must see the study's out_dir at the same path" in error


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


def test_the_launch_slurm_table_names_the_closest_key_of_a_misspelling(workspace):
    path = study_file(workspace, launch=SLURM + 'partiton = "gpu"\nmax_tries = 0\n')
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    lines = error.value.errors
    assert any("[launch.slurm] partiton: unknown key; did you mean 'partition'?" in line for line in lines)
    assert any("[launch.slurm] max_tries: must be a whole number, at least 1, not 0." in line for line in lines)
    uneven = study_file(workspace, launch=SLURM.replace("gpus_per_node = 0", "gpus_per_node = 8") + "",
                        extra="")
    Path(uneven).write_text(Path(uneven).read_text().replace('mode = "slurm"', 'mode = "slurm"\ngpus_per_run = 12'))
    with pytest.raises(study_spec.StudyError, match="12 GPUs span nodes of 8 GPUs .* multiple of gpus_per_node"):
        study_spec.load_study(uneven)


def test_a_run_of_more_gpus_than_a_node_spans_nodes_with_the_sites_settings(workspace, tmp_path):
    path = study_file(workspace, launch='mode = "slurm"\ngpus_per_run = 16\n\n[launch.slurm]\npartition = "h100"\n'
                                        'account = "grape"\nqos = "high"\ntime = "12:00:00"\ngpus_per_node = 8\n'
                                        'cpus_per_task = 64\nsbatch_options = ["--exclusive"]\n')
    loaded = study_spec.load_study(path)
    run = loaded.runs[1]
    argv = study_slurm.train_job(loaded, run)
    assert argv == [f"--job-name=study:alibi/seed1:train", "--nodes=2", "--ntasks-per-node=1",
                    f"--output={workspace / 'out' / 'alibi' / 'seed1' / 'slurm-train-%j.out'}", "--gpus-per-node=8",
                    "--partition=h100", "--account=grape", "--qos=high", "--time=12:00:00", "--cpus-per-task=64",
                    "--exclusive", str(REPO / "scripts" / "slurm" / "train.sbatch"), *run.train_args]
    env = study_slurm.job_environment(loaded, run)
    assert env == {"REPO": str(REPO), "RUN_DIR": run.run_dir, "PROCS_PER_NODE": "8", "PYTHON": sys.executable}
    os.makedirs(run.run_dir)
    shutil.copy(__file__, os.path.join(run.run_dir, "ckpt.pt"))  # a checkpoint: the run continues from it
    assert study_slurm.train_job(loaded, run)[-1] == "--resume"
    evaluations = study_slurm.eval_job(loaded, run, after="41")
    assert "--nodes=1" in evaluations and "--gpus-per-node=1" in evaluations
    assert evaluations[-3:] == ["--dependency=afterok:41", "--kill-on-invalid-dep=no",
                                f"--wrap=exec {sys.executable} {REPO / 'study.py'} {path} --evaluate alibi/seed1"]
    # A setup line runs first, and its environment's Python runs the jobs.
    Path(path).write_text(Path(path).read_text().replace('sbatch_options = ["--exclusive"]\n',
                                                        'setup = "source /opt/venv/bin/activate"\n'))
    loaded = study_spec.load_study(path)
    assert study_slurm.job_environment(loaded, run)["JOB_SETUP"] == "source /opt/venv/bin/activate"
    assert "PYTHON" not in study_slurm.job_environment(loaded, run)
    assert study_slurm.eval_job(loaded, run, None)[-1] == (f"--wrap=source /opt/venv/bin/activate && exec python3 "
                                                           f"{REPO / 'study.py'} {path} --evaluate alibi/seed1")


def test_a_run_takes_its_gpus_over_a_nodes_gpus_rounded_up_in_nodes(workspace):
    eight = study_spec.SlurmSettings(gpus_per_node=8)
    assert [eight.nodes(gpus) for gpus in (1, 4, 8, 9, 12, 16, 17)] == [1, 1, 1, 2, 2, 2, 3]
    assert study_spec.SlurmSettings(gpus_per_node=0).nodes(3) == 3  # a CPU partition: one process a node
    path = study_file(workspace, launch='mode = "slurm"\ngpus_per_run = 4\n\n[launch.slurm]\ngpus_per_node = 8\n')
    loaded = study_spec.load_study(path)
    argv = study_slurm.train_job(loaded, loaded.runs[0])
    assert argv[1:3] == ["--nodes=1", "--ntasks-per-node=1"] and "--gpus-per-node=4" in argv
    assert study_slurm.job_environment(loaded, loaded.runs[0])["PROCS_PER_NODE"] == "4"


def write_metrics(run_dir, records):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(record) + "\n" for record in records)


def test_the_table_shows_each_runs_iteration_loss_and_eta_from_its_own_files(workspace):
    loaded = study_spec.load_study(study_file(workspace))
    rope, alibi = loaded.runs
    # thousands of lines: the last training record is read from the end of the file
    write_metrics(rope.run_dir, [{"type": "train", "iter": i, "loss": 9.0 - i / 1000, "eta_s": 3 * (6000 - i)}
                                 for i in range(1, 5001)] + [{"type": "val", "iter": 5000, "val_loss": 1.5}])
    write_metrics(alibi.run_dir, [{"type": "train", "iter": 2, "loss": 5.25, "eta_s": 40}])
    rows = [study_slurm.Row(rope, job="17", state="running"),
            study_slurm.Row(alibi, job="18", state="failed (3 tries)", ended=True, status="failed",
                            error="training: data directory x not found")]
    assert study_slurm.table(rows).splitlines() == [
        "run          job  state             iter    loss    ETA",
        "rope/seed1   17   running           5000/6  4.0000  -",
        "alibi/seed1  18   failed (3 tries)  2/6     5.2500  -",
        "  alibi/seed1: training: data directory x not found"]
    rows[1] = study_slurm.Row(alibi, job="18", state="running")
    assert study_slurm.table(rows).splitlines()[2].split() == ["alibi/seed1", "18", "running", "2/6", "5.2500", "40s"]


def test_a_failed_training_is_resubmitted_with_a_new_evaluation_job_and_the_waiting_one_cancelled(workspace,
                                                                                                 monkeypatch):
    """Without a cluster: SLURM's answers and sbatch stubbed. The evaluation job chained to a failed training job
    would wait for ever; it is cancelled, and the training is submitted again with an evaluation job of its own.
    A job SLURM has forgotten is judged from its run's files; evaluations that fail after the training are tried on
    their own, max_tries times."""
    loaded = study_spec.load_study(study_file(workspace))
    rope, alibi = loaded.runs
    slurm_records = {"rope/seed1": {"train": ["7"], "eval": [{"job": "8", "after": "7"}]},
                     "alibi/seed1": {"train": ["9"], "eval": [{"job": "10", "after": "9"}]}}
    os.makedirs(rope.run_dir)
    study_slurm.write_records(loaded, slurm_records)
    Path(rope.run_dir, "slurm-train-7.out").write_text("iter 1/6 | loss 5.0\nerror: out of memory on node n1\n")
    answers = {"7": ("FAILED", "NonZeroExitCode"), "8": ("PENDING", "DependencyNeverSatisfied")}  # 9, 10 forgotten
    submitted, cancelled = [], []
    monkeypatch.setattr(study_slurm, "job_states", lambda jobs: {j: answers[j] for j in jobs if j in answers})
    monkeypatch.setattr(study_slurm, "cancel", cancelled.append)
    monkeypatch.setattr(study_slurm, "sbatch", lambda argv, env: submitted.append(argv) or str(100 + len(submitted)))
    rows = study_slurm.SlurmStudy(loaded).advance(submit=True)
    assert cancelled == ["8"]
    assert [(row.job, row.state, row.error) for row in rows] == [
        ("101", "submitted (try 2)", "training: out of memory on node n1"),
        # alibi's job 9 is forgotten and its run has no files: a failed try, submitted again
        ("103", "submitted (try 2)", f"training: job 9 ended FAILED without a log {workspace}/out/alibi/seed1/"
                                     "slurm-train-9.out: its node could not write into the run's folder; do the "
                                     "compute nodes see the study's out_dir at the same path? (docs/study.md, "
                                     "\"On a cluster\")")]
    assert submitted[0][-len(rope.train_args):] == rope.train_args and "--dependency=afterok:101" in submitted[1]
    assert study_slurm.read_records(loaded) == {
        "rope/seed1": {"train": ["7", "101"], "eval": [{"job": "8", "after": "7"}, {"job": "102", "after": "101"}]},
        "alibi/seed1": {"train": ["9", "103"], "eval": [{"job": "10", "after": "9"}, {"job": "104", "after": "103"}]}}
    # --status asks and submits nothing
    assert [row.state for row in study_slurm.SlurmStudy(loaded).advance(submit=False)] == ["failed, to resubmit"] * 2
    assert len(submitted) == 4
    # rope's second try trains it, but its evaluations fail: they are tried again on their own (after: none), and
    # once max_tries (3) evaluation jobs of this training have failed the run has failed. Job 8, chained to the
    # training that failed, never ran: it is no try.
    shutil.copy(__file__, os.path.join(rope.run_dir, "ckpt.pt"))
    write_metrics(rope.run_dir, [{"type": "val", "iter": rope.final_iter, "val_loss": 2.5},
                                 {"type": "summary", "iter": rope.final_iter, "stopped": "done"}])
    answers.update({"101": ("COMPLETED", "None"), "102": ("FAILED", "NonZeroExitCode"), "103": ("RUNNING", "None")})
    states = []
    for job in ("105", "106"):
        rows = study_slurm.SlurmStudy(loaded).advance(submit=True)
        states.append((rows[0].job, rows[0].state, rows[1].state))
        answers[job] = ("FAILED", "NonZeroExitCode")
    assert states == [("105", "evaluations submitted", "running"), ("106", "evaluations submitted", "running")]
    Path(rope.run_dir, "slurm-eval-106.out").write_text("error: eval/extrapolation.json: disk quota exceeded\n")
    rows = study_slurm.SlurmStudy(loaded).advance(submit=True)
    assert (rows[0].job, rows[0].state, rows[0].ended, rows[0].error) == (
        "106", "evaluations failed (3 tries)", True, "evaluations: eval/extrapolation.json: disk quota exceeded")
    assert len(submitted) == 6 and study_slurm.read_records(loaded)["rope/seed1"]["eval"][2:] == [
        {"job": "105", "after": None}, {"job": "106", "after": None}]


def test_a_run_that_failed_its_last_try_cancels_the_evaluation_job_waiting_on_it(workspace, monkeypatch):
    """Without a cluster: the training's last try failed, so the run has failed; its evaluation job, chained with
    afterok, would stay PENDING (DependencyNeverSatisfied) in the queue for ever: study.py cancels it, and --status
    (which submits nothing) cancels nothing."""
    loaded = study_spec.load_study(study_file(workspace, launch=SLURM + "max_tries = 2\n"))
    rope, alibi = loaded.runs
    os.makedirs(rope.run_dir)
    study_slurm.write_records(loaded, {"rope/seed1": {"train": ["7", "9"], "eval": [{"job": "8", "after": "7"},
                                                                                     {"job": "10", "after": "9"}]},
                                       "alibi/seed1": {"train": ["11"], "eval": [{"job": "12", "after": "11"}]}})
    Path(rope.run_dir, "slurm-train-9.out").write_text("error: data directory x does not exist\n")
    answers = {"7": ("FAILED", "NonZeroExitCode"), "8": ("CANCELLED", "None"), "9": ("FAILED", "NonZeroExitCode"),
               "10": ("PENDING", "DependencyNeverSatisfied"), "11": ("RUNNING", "None"), "12": ("PENDING", "Dependency")}
    cancelled, submitted = [], []
    monkeypatch.setattr(study_slurm, "job_states", lambda jobs: {j: answers[j] for j in jobs if j in answers})
    monkeypatch.setattr(study_slurm, "cancel", cancelled.append)
    monkeypatch.setattr(study_slurm, "sbatch", lambda argv, env: submitted.append(argv) or "99")
    rows = study_slurm.SlurmStudy(loaded).advance(submit=False)
    assert rows[0].state == "failed (2 tries)" and cancelled == []
    rows = study_slurm.SlurmStudy(loaded).advance(submit=True)
    assert (rows[0].state, rows[0].ended, rows[1].state) == ("failed (2 tries)", True, "running")
    assert cancelled == ["10"] and submitted == []  # not alibi's 12, which waits on a training that runs


def test_the_annotated_study_file_shows_every_slurm_key_with_the_default_it_takes(workspace):
    import tomllib
    example = tomllib.loads(study_spec.STUDY_FILE_EXAMPLE)["launch"]["slurm"]
    assert set(example) == study_spec.SLURM_KEYS
    stated = {line.split(" = ")[0]: line.split("# default ", 1)[1] for line in
              study_spec.STUDY_FILE_EXAMPLE.split("[launch.slurm]")[1].split("[eval.")[0].splitlines()
              if " = " in line and "# default " in line}
    assert set(stated) == study_spec.SLURM_KEYS
    bare = study_spec.load_study(study_file(workspace, launch='mode = "slurm"\n')).slurm
    for key in study_spec.SLURM_KEYS:
        default = getattr(bare, key)
        expected = ("none" if default in (None, []) else f"{default:g}" if isinstance(default, float)
                    else str(default))
        assert stated[key].startswith(expected), (key, stated[key])
