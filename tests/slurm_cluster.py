"""A real SLURM cluster of two one-CPU nodes on this machine, for the tests of the SLURM paths: the session fixture
`slurm_cluster` starts munged, slurmctld and two slurmd (n1, n2, both on 127.0.0.1 with ports of their own) in a
temporary folder, waits until both nodes are idle, and stops them by their pid files at the end.

Everything of one cluster lives in its own folder with its own munged (socket, key, pid file) and free ports, so two
test processes can each run one at the same time. Each node declares two placeholder GPUs (gres.conf over empty
files), so --gpus-per-node is honoured. A requeued job may start again 10 s later (cred_expire; SLURM's default
is 120 s), and the schedulers look at pending jobs every second. Starting the daemons needs root and Debian's slurm-wlm and munge
(`apt-get install slurm-wlm munge`); without them the tests that use the fixture skip and say why, except where
GRAPE_REQUIRE_SLURM=1 (CI: .ci/run installs both), where they fail.
"""
import contextlib
import os
import re
import secrets
import shutil
import signal
import random
import socket
import subprocess
import time
from dataclasses import dataclass

import pytest

NODES = ("n1", "n2")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "scancel", "squeue")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_conf(folder: str, name: str) -> str:
    """slurm.conf of a two-node cluster named `name` whose state, spool, logs and pid files are all in folder."""
    nodes = "\n".join(f"NodeName={node} NodeAddr=127.0.0.1 Port={free_port()} CPUs=1 Gres=gpu:2 State=UNKNOWN"
                      for node in NODES)
    # Job ids from a random start: train.sbatch takes its rendezvous port from the job id, and two clusters on this
    # machine (two test workers) would otherwise number their jobs alike and meet at one port.
    first_job = random.randrange(1000, 19000, 100)
    return f"""ClusterName={name}
FirstJobId={first_job}
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.socket,cred_expire=10
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
SchedulerParameters=sched_interval=1,bf_interval=1
KillWait=10
GresTypes=gpu
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Cluster:
    """A running cluster: `env` is this process's environment with SLURM_CONF pointing at it (pass it to every
    SLURM command and to whatever submits jobs)."""
    folder: str
    env: dict

    def command(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def submit(self, *argv: str, cwd: str | None = None, env: dict | None = None) -> str:
        """sbatch ARGV (options, then the script and its arguments) from cwd; the job id."""
        done = subprocess.run(["sbatch", "--parsable", *argv], cwd=cwd, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"sbatch {' '.join(argv)} failed: {done.stderr.strip()}"
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """The fields of `scontrol show job` (JobState, Restarts, ExitCode, StdOut, NodeList, ...); finished jobs
        stay visible for MinJobAge (600 s)."""
        out = self.command("scontrol", "show", "job", "--oneliner", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def state(self, job_id: str) -> str:
        return self.job(job_id)["JobState"]

    def wait(self, job_id: str, timeout: float = 120, until=lambda job: job["JobState"] in ENDED) -> dict:
        """Poll the job until `until(fields)` holds (by default: it has ended); its fields then."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if until(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {job['JobState']} after {timeout} s: {job}")
            time.sleep(0.5)

    def node_addr(self, node: str) -> str:
        out = self.command("scontrol", "show", "node", "--oneliner", node).stdout
        return re.search(r"NodeAddr=(\S+)", out).group(1)

    def node_states(self) -> dict[str, str]:
        out = self.command("scontrol", "show", "node", "--oneliner").stdout
        return dict(re.findall(r"NodeName=(\S+) .*?State=(\S+)", out))

    def log_tails(self, lines: int = 5) -> str:
        tails = []
        for name in sorted(os.listdir(self.folder)):
            if name.endswith(".log"):
                with open(os.path.join(self.folder, name), errors="replace") as f:
                    tails.append(f"{name}: " + " | ".join(f.read().splitlines()[-lines:]))
        return "\n".join(tails)


def cannot_start() -> str | None:
    """Why SLURM cannot be started here, or None."""
    missing = [tool for tool in DAEMONS + CLIENTS if shutil.which(tool) is None]
    if missing:
        return f"no {', '.join(missing)} on PATH (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "starting munged, slurmctld and slurmd needs root"
    return None


def start(folder: str) -> Cluster:
    """Start munged, slurmctld and the slurmd of each node with their files in folder; the cluster once every node
    is idle. Raises RuntimeError (with the daemons' last log lines) if a daemon does not start or a node does not
    come up within a minute."""
    for sub in ("state", "spool", "gpus"):
        os.makedirs(os.path.join(folder, sub))
    for index in range(2):
        open(os.path.join(folder, "gpus", f"gpu{index}"), "w").close()
    key = os.path.join(folder, "munge.key")
    with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o400), "wb") as f:
        f.write(secrets.token_bytes(1024))
    conf = os.path.join(folder, "slurm.conf")
    with open(conf, "w") as f:
        f.write(slurm_conf(folder, "grape" + secrets.token_hex(3)))
    with open(os.path.join(folder, "gres.conf"), "w") as f:
        f.write(f"Name=gpu File={folder}/gpus/gpu[0-1]\n")
    cluster = Cluster(folder, {**os.environ, "SLURM_CONF": conf})
    daemons = [["munged", f"--socket={folder}/munge.socket", f"--key-file={key}", f"--pid-file={folder}/munged.pid",
                f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed", "--force"],
               ["slurmctld", "-f", conf, "-c", "-i"]]
    daemons += [["slurmd", "-f", conf, "-N", node] for node in NODES]
    for argv in daemons:
        done = subprocess.run(argv, env=cluster.env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} did not start ({done.returncode}): {done.stderr.strip()}\n"
                               f"{cluster.log_tails()}")
    deadline = time.monotonic() + 60
    while set(states := node_states_or_none(cluster).values()) != {"IDLE"}:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the nodes did not become idle within a minute: {states}\n{cluster.log_tails()}")
        time.sleep(0.5)
    return cluster


def node_states_or_none(cluster: Cluster) -> dict:
    """The nodes' states, or {} while slurmctld does not answer yet."""
    try:
        return cluster.node_states() or {}
    except (AssertionError, subprocess.TimeoutExpired):
        return {}


def stop(cluster: Cluster) -> None:
    """Cancel every job of the cluster, then stop its daemons by their pid files."""
    cluster.command("scancel", "--user=root", check=False, timeout=30)
    for _ in range(60):  # their processes end before the slurmd that started them
        jobs = cluster.command("squeue", "--noheader", check=False, timeout=30)
        if jobs.returncode != 0 or not jobs.stdout.strip():
            break
        time.sleep(0.5)
    # the nodes first (they report to slurmctld as they go), then slurmctld and munged
    end_processes([os.path.join(cluster.folder, f"slurmd-{node}.pid") for node in NODES])
    end_processes([os.path.join(cluster.folder, name) for name in ("slurmctld.pid", "munged.pid")])


def end_processes(pid_files: list[str], patience_s: float = 15) -> None:
    """SIGTERM to the process of each pid file at once, SIGKILL to those still there after patience_s."""
    pids = []
    for path in pid_files:
        try:
            with open(path) as f:
                pids.append(int(f.read().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + patience_s
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if alive(pid)]
            time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A running two-node cluster (Cluster) for the whole test session; skips (or fails under
    GRAPE_REQUIRE_SLURM=1) with the reason where SLURM cannot be started."""
    why = cannot_start()
    cluster = None
    if why is None:
        folder = str(tmp_path_factory.mktemp("slurm"))
        try:
            cluster = start(folder)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            why = f"SLURM did not start: {error}"
            stop(Cluster(folder, {**os.environ, "SLURM_CONF": os.path.join(folder, "slurm.conf")}))
    if why is not None:
        if os.environ.get("GRAPE_REQUIRE_SLURM") == "1":
            pytest.fail(f"GRAPE_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    yield cluster
    stop(cluster)
