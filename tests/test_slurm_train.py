"""scripts/slurm/train.sbatch on a real two-node SLURM (the fixture slurm_cluster, tests/slurm_cluster.py: nodes n1
and n2 of one CPU each on 127.0.0.1, whose names do not resolve as host names): two nodes of one gloo process train
as torchrun with two processes on one machine, a job requeued (by its time limit's signal, by `scontrol requeue`)
continues its run and ends it once (requeued before its first checkpoint, it trains the run from the start), and a
node that cannot see the run directory says so in one line."""
import json
import os
import subprocess
import sys
import time

import pytest

import train
from tests.helpers import synthetic_corpus, tiny_config
from tests.slurm_cluster import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "slurm", "train.sbatch")
JOB_ENV = {"PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "MAX_REQUEUES": "2"}
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return synthetic_corpus(tmp_path_factory.mktemp("slurm_data"), 40, 800)


def records(run_dir, kind):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["type"] == kind]


def submit(cluster, tmp_path, options, train_args, **env):
    """sbatch train.sbatch from the repository root, its log in tmp_path/job.log; the job id."""
    return cluster.submit(f"--output={tmp_path / 'job.log'}", *options, SCRIPT, *train_args, cwd=REPO,
                          env={**JOB_ENV, "RDZV_PORT": str(free_port()), **env})


def test_the_cluster_runs_one_job_across_both_nodes_and_honours_gpus_per_node(slurm_cluster, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun bash -c 'echo $SLURMD_NODENAME $SLURM_GPUS_PER_NODE'\n")
    job = slurm_cluster.submit("--nodes=2", "--gpus-per-node=2", f"--output={tmp_path}/job.out", str(script),
                               cwd=str(tmp_path))
    assert slurm_cluster.wait(job)["JobState"] == "COMPLETED"
    assert sorted((tmp_path / "job.out").read_text().splitlines()) == ["n1 2", "n2 2"]
    assert slurm_cluster.node_addr("n2") == "127.0.0.1" and os.path.isfile(slurm_cluster.env["SLURM_CONF"])
    # a third GPU per node does not exist: SLURM refuses the job rather than queueing it for ever
    refused = slurm_cluster.command("sbatch", "--gpus-per-node=3", str(script), check=False)
    assert refused.returncode != 0 and "Requested node configuration is not available" in refused.stderr


def test_two_nodes_of_one_process_train_as_torchrun_with_two_processes_bit_for_bit(slurm_cluster, data_dir,
                                                                                   tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir, model={"pos": "rope"}, batch_size=2, max_iters=8, lr=3e-3))
    job = submit(slurm_cluster, tmp_path, ["--nodes=2"], [str(config), f"--out_dir={tmp_path / 'slurm'}"])
    one_machine = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                  "train.py", str(config), f"--out_dir={tmp_path / 'torchrun'}"], cwd=REPO,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                                 timeout=300)
    assert one_machine.returncode == 0, one_machine.stderr[-3000:]
    ended = slurm_cluster.wait(job, timeout=300)
    log = (tmp_path / "job.log").read_text()
    assert ended["JobState"] == "COMPLETED" and ended["NodeList"] == "n[1-2]", log[-3000:]
    # the rendezvous is at the first node's address: its name, n1, is no host name here
    assert "2 node(s) x 1 process(es), rendezvous at 127.0.0.1:" in log
    reference = [r["loss"] for r in records(tmp_path / "torchrun", "train")]
    assert len(reference) == 8 and len(set(reference)) == 8
    assert [r["loss"] for r in records(tmp_path / "slurm", "train")] == reference
    assert json.loads((tmp_path / "slurm" / "config.json").read_text())["world_size"] == 2


def test_a_requeued_job_resumes_only_a_run_whose_directory_holds_a_checkpoint(data_dir, tmp_path, monkeypatch):
    """scripts/slurm/has_checkpoint.py, which a requeued job asks: the run directory of train.py's own arguments
    (the config's default, --out_dir, a run directory to --resume), and whether it holds ckpt.pt or shards."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("has_checkpoint", os.path.join(REPO, "scripts", "slurm",
                                                                                 "has_checkpoint.py"))
    has_checkpoint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(has_checkpoint)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "tiny.toml"
    config.write_text(tiny_config(data_dir))
    assert has_checkpoint.saved_run_directory([str(config)]) is None  # not started: started again, no --resume
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    (tmp_path / "runs" / "tiny" / "config.json").write_text("{}")
    assert has_checkpoint.saved_run_directory([str(config)]) is None  # requeued before its first checkpoint
    (tmp_path / "runs" / "tiny" / "ckpt.pt").write_bytes(b"")
    assert has_checkpoint.saved_run_directory([str(config)]) == os.path.join("runs", "tiny")
    assert has_checkpoint.saved_run_directory([str(config), "--out_dir=elsewhere"]) is None
    (tmp_path / "elsewhere" / "ckpt.shards" / "40-abc").mkdir(parents=True)
    assert has_checkpoint.saved_run_directory([str(config), "--out_dir=elsewhere", "--start_over"]) == "elsewhere"
    with pytest.raises(has_checkpoint.ConfigError, match="n_layers"):
        has_checkpoint.saved_run_directory([str(config), "--n_layers=3"])


def wait_for_checkpoint(run_dir, after: int, timeout=180) -> int:
    """Poll run_dir/ckpt.pt until it holds a step beyond `after`; that step. (A file being renamed into place, or
    gone for a moment, reads as no checkpoint yet.)"""
    import torch
    path = os.path.join(run_dir, "ckpt.pt")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            step = torch.load(path, map_location="cpu", weights_only=False)["step"]
        except (OSError, EOFError, RuntimeError, KeyError):
            step = -1
        if step > after:
            return step
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint beyond step {after} in {run_dir} after {timeout} s")


def test_a_job_requeued_after_its_first_checkpoint_resumes_and_ends_its_run_once(slurm_cluster, data_dir, tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir, model={"pos": "rope"}, batch_size=2, max_iters=300, ckpt_interval=30,
                                  lr=3e-3, wandb=True, wandb_mode="offline"))
    run_dir = tmp_path / "run"
    job = submit(slurm_cluster, tmp_path, [], [str(config), f"--out_dir={run_dir}"])
    first = wait_for_checkpoint(run_dir, after=0)
    slurm_cluster.command("scontrol", "requeue", job)  # an administrator, or preemption in requeue mode
    ended = slurm_cluster.wait(job, timeout=300)
    log = (tmp_path / "job.log").read_text()
    assert (ended["JobState"], ended["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    assert f"restart 1: train.py {config} --out_dir={run_dir} --resume" in log
    stopped_at = int(log.split("stop requested (SIGTERM): saved")[1].split("at iteration ")[1].split(";")[0])
    assert f"resuming {run_dir}/ckpt.pt at iteration {stopped_at} " in log and 0 < first <= stopped_at < 300
    summaries = records(run_dir, "summary")
    assert [(s["iter"], s["stopped"]) for s in summaries] == [(300, "done")], summaries
    # each step once, with an uninterrupted run's losses: the lines after the checkpoint were trimmed on resume
    assert [r["iter"] for r in records(run_dir, "train")] == list(range(1, 301))
    reference = train.run([str(config), f"--out_dir={tmp_path / 'uninterrupted'}", "--wandb=false"])["losses"]
    assert [r["loss"] for r in records(run_dir, "train")] == reference
    # one wandb run, started twice: the requeued job continued the id its checkpoint holds
    starts = [name for name in os.listdir(run_dir / "wandb") if name.startswith("offline-run-")]
    assert len(starts) == 2 and len({name.rsplit("-", 1)[1] for name in starts}) == 1, starts


def test_a_job_requeued_before_its_first_checkpoint_trains_its_run_from_the_start(slurm_cluster, data_dir,
                                                                                    tmp_path):
    """As study.py submits it: the run directory made first, the job's log in it. The first try is requeued while
    it starts (a setup line that waits on the first try only), before the run has a checkpoint: the requeued job
    must not ask train.py to --resume a checkpoint that does not exist."""
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir, model={"pos": "rope"}, batch_size=2, max_iters=5))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = run_dir / "slurm-train.out"
    job = slurm_cluster.submit(f"--output={log}", SCRIPT, str(config), f"--out_dir={run_dir}", cwd=REPO,
                               env={**JOB_ENV, "RDZV_PORT": str(free_port()), "RUN_DIR": str(run_dir),
                                    "JOB_SETUP": '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || { echo first try; '
                                                 'sleep 60; }'})
    slurm_cluster.wait(job, until=lambda fields: log.exists() and "first try" in log.read_text())
    slurm_cluster.command("scontrol", "requeue", job)
    ended = slurm_cluster.wait(job, timeout=180)
    text = log.read_text()
    assert (ended["JobState"], ended["Restarts"]) == ("COMPLETED", "1"), text[-3000:]
    assert f"job {job}, restart 1: train.py {config} --out_dir={run_dir}\n" in text and "resuming" not in text
    assert [r["iter"] for r in records(run_dir, "train")] == [1, 2, 3, 4, 5]
    assert [(s["iter"], s["stopped"]) for s in records(run_dir, "summary")] == [(5, "done")]


def test_a_job_near_its_time_limit_saves_and_requeues_itself(slurm_cluster, data_dir, tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir, model={"pos": "rope"}, batch_size=2, max_iters=100_000,
                                  ckpt_interval=200, log_interval=100))
    run_dir = tmp_path / "run"
    job = submit(slurm_cluster, tmp_path, ["--signal=B:USR1@60"], [str(config), f"--out_dir={run_dir}"])
    first = wait_for_checkpoint(run_dir, after=0)
    # Once training is under way, a one-minute limit, which the signal precedes by a minute: SLURM sends it at its
    # next check of the limits (within 30 s). (Given at submission, it could come before training had started.)
    slurm_cluster.command("scontrol", "update", f"JobId={job}", "TimeLimit=1")
    slurm_cluster.wait(job, timeout=120, until=lambda fields: fields["Restarts"] == "1")
    slurm_cluster.command("scancel", job)  # (its next minute would end the same way)
    saved = wait_for_checkpoint(run_dir, after=first, timeout=5)  # the checkpoint of the stop
    log = (tmp_path / "job.log").read_text()
    assert "its time limit is near; asking training to save and stop" in log
    assert f"saved {run_dir}/ckpt.pt at iteration {saved};" in log and "requeued (restart 1 of at most 2)" in log
    assert [(s["iter"], s["stopped"]) for s in records(run_dir, "summary")] == [(saved, "sigterm")]


def test_a_job_requeued_as_often_as_max_requeues_ends_with_a_sentence(slurm_cluster, data_dir, tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir, max_iters=100_000))
    job = submit(slurm_cluster, tmp_path, [], [str(config), f"--out_dir={tmp_path / 'run'}"], MAX_REQUEUES="0")
    log = tmp_path / "job.log"
    slurm_cluster.wait(job, until=lambda fields: log.exists() and "rendezvous at" in log.read_text())
    slurm_cluster.command("scancel", "--batch", "--signal=USR1", job)  # what --signal=B:USR1@300 sends
    ended = slurm_cluster.wait(job)
    log = (tmp_path / "job.log").read_text()
    assert (ended["JobState"], ended["Restarts"]) == ("FAILED", "0"), log[-3000:]
    assert (f"error: job {job} reached its time limit after 0 requeue(s), the most that MAX_REQUEUES=0 allows, so it "
            "is not requeued") in log


def test_a_node_that_cannot_see_the_run_directory_says_so_in_one_line(slurm_cluster, data_dir, tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir))
    missing = tmp_path / "elsewhere" / "run"  # a run directory made on a login node, not mounted on the nodes
    job = submit(slurm_cluster, tmp_path, [], [str(config), f"--out_dir={missing}"], RUN_DIR=str(missing))
    ended = slurm_cluster.wait(job)
    log = (tmp_path / "job.log").read_text().splitlines()
    assert (ended["JobState"], ended["ExitCode"]) == ("FAILED", "2:0") and len(log) == 1, log
    assert log[0].startswith(f"error: {missing} is not visible on node ") and f"of job {job}, so" in log[0]
    assert not missing.exists()  # and nothing was made in its place
    gone = submit(slurm_cluster, tmp_path, [], [str(tmp_path / "gone.toml")])
    assert slurm_cluster.wait(gone)["ExitCode"] == "2:0"
    assert f"error: {tmp_path / 'gone.toml'} is not visible on node " in (tmp_path / "job.log").read_text()


def test_the_processes_per_node_are_the_jobs_gpus_per_node(slurm_cluster, data_dir, tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir))
    job = submit(slurm_cluster, tmp_path, ["--gpus-per-node=2"], [str(config), "--n_layers=3"])
    ended = slurm_cluster.wait(job, timeout=180)
    log = (tmp_path / "job.log").read_text()
    assert ended["JobState"] == "FAILED" and "1 node(s) x 2 process(es), rendezvous at" in log, log[-3000:]
    assert "error: unknown config key 'n_layers'" in log  # train.py's own sentence, in the job's log
