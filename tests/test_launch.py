"""Multi-node launch: two torchrun "nodes" on this machine (c10d rendezvous, gloo on the CPU) train exactly as one
node with the same number of processes, a run resumes on another number of nodes, a dead node ends the job with
a sentence (scripts/slurm/train.sbatch on a real SLURM: tests/test_slurm_train.py)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import train
from tests.helpers import synthetic_corpus, tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch")
    data_dir = synthetic_corpus(root, 40, 800)
    path = root / "tiny.toml"
    path.write_text(tiny_config(data_dir, model={"pos": "rope"}, batch_size=2, max_iters=8, warmup_iters=2))
    return str(path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(launcher_args, train_args):
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *launcher_args, "train.py", *train_args],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def node(rank, port, train_args):
    return launch(["--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1", "--rdzv-backend=c10d",
                   f"--rdzv-endpoint=127.0.0.1:{port}"], train_args)


def finish(procs, timeout=180):
    outputs = [proc.communicate(timeout=timeout) for proc in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, f) if r["type"] == "train"]


def test_two_nodes_train_exactly_as_one_and_resume_on_another_node_count(config_file, tmp_path):
    one_node = launch(["--standalone", "--nproc_per_node=2"], [config_file, f"--out_dir={tmp_path / 'one_node'}"])
    port = free_port()
    args = [config_file, f"--out_dir={tmp_path / 'two_nodes'}", "--stop_iter=4"]
    nodes = [node(0, port, args)]
    time.sleep(0.5)  # the first node hosts the rendezvous store
    nodes.append(node(1, port, args))
    finish([one_node] + nodes)
    reference = losses(tmp_path / "one_node")
    assert len(reference) == 8
    assert losses(tmp_path / "two_nodes") == reference[:4]  # bit for bit: the same ranks do the same work
    # Resumed on one node with one process (2 accumulation steps instead of 2 processes): the same windows.
    resumed = train.run([config_file, f"--out_dir={tmp_path / 'two_nodes'}", "--resume"])
    assert resumed["losses"] == pytest.approx(reference[4:], rel=1e-5)


def test_a_dead_node_ends_the_job_with_a_sentence(config_file, tmp_path):
    port, run_dir = free_port(), tmp_path / "run"
    args = [config_file, "--max_iters=100000", "--ckpt_interval=5", "--dist_timeout_s=10", f"--out_dir={run_dir}"]
    nodes = [node(0, port, args)]
    time.sleep(0.5)
    nodes.append(node(1, port, args))
    try:
        deadline = time.time() + 120
        while not (run_dir / "ckpt.pt").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert (run_dir / "ckpt.pt").exists(), nodes[0].communicate(timeout=5)[1][-3000:]
        # The whole second node: its torchrun and the training process it started (in a session of its own).
        with open(f"/proc/{nodes[1].pid}/task/{nodes[1].pid}/children") as f:
            workers = [int(pid) for pid in f.read().split()]
        for pid in workers + [nodes[1].pid]:
            os.kill(pid, signal.SIGKILL)
        err = nodes[0].communicate(timeout=120)[1]
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert nodes[0].returncode != 0
    # The training process says what happened in one line; torchrun then adds its own failure summary.
    said = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and "a collective operation with the other processes failed" in said[0], err[-3000:]
    assert said[0].endswith("continue with --resume.") and 'train.py", line' not in err  # no traceback of ours
    assert os.path.exists(run_dir / "ckpt.pt")
