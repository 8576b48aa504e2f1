"""training/run_lock.py: one run of train.py at a time in a run directory."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import train
from config import ConfigError
from helpers import synthetic_corpus, tiny_config
from training.run_lock import LOCK_NAME, holder_description, run_directory_lock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hold_in_another_process(run_dir):
    """A process that holds run_dir's lock until killed; returns it once the lock is taken."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {REPO!r})
        from training.run_lock import run_directory_lock
        with run_directory_lock({str(run_dir)!r}, ["configs/cpu/rope.toml", "--out_dir=D"]):
            print("held", flush=True)
            time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_holder_is_refused_naming_the_first_and_a_kill_frees_the_lock(tmp_path):
    run_dir = tmp_path / "run"
    holder = hold_in_another_process(run_dir)
    try:
        with pytest.raises(ConfigError) as refused:
            with run_directory_lock(str(run_dir)):
                pytest.fail("entered a run directory another process holds")
        message = str(refused.value)
        assert message.startswith(f"{run_dir} is in use by another run: process {holder.pid} on ")
        assert "(python train.py configs/cpu/rope.toml --out_dir=D), started at 20" in message
        assert message.endswith("wait for it to end (or stop it), or give this run another --out_dir.")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with run_directory_lock(str(run_dir)):  # the kernel released it with the killed process
        pass


def test_two_holders_in_one_process_meet_too(tmp_path):
    with run_directory_lock(str(tmp_path)):
        with pytest.raises(ConfigError, match="is in use by another run: process"):
            with run_directory_lock(str(tmp_path)):
                pass
    with run_directory_lock(str(tmp_path)):  # released at the end of the first
        pass


def test_the_holder_is_recorded_while_it_runs_and_unreadable_details_are_another_process(tmp_path):
    with run_directory_lock(str(tmp_path), ["a.toml", "--lr=1"]):
        holder = json.loads((tmp_path / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid() and holder["command"] == "python train.py a.toml --lr=1"
        assert abs(holder["started"] - time.time()) < 60
    assert os.listdir(tmp_path) == []  # nothing of the lock is left in the run directory
    (tmp_path / LOCK_NAME).write_text("")
    assert holder_description(str(tmp_path / LOCK_NAME)) == "another process"
    with run_directory_lock(str(tmp_path)):  # details a kill -9 left: replaced, then removed
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert os.listdir(tmp_path) == []


def test_only_the_main_process_locks_and_a_resume_makes_no_folder(tmp_path):
    with run_directory_lock(str(tmp_path)):
        with run_directory_lock(str(tmp_path), is_main=False):  # another process of the same job
            pass
    missing = tmp_path / "missing"
    with run_directory_lock(str(missing), create=False):
        assert not missing.exists()


def test_a_new_folder_left_empty_is_removed_and_one_with_files_kept(tmp_path):
    with run_directory_lock(str(tmp_path / "refused")):
        assert (tmp_path / "refused" / LOCK_NAME).exists()
    assert not (tmp_path / "refused").exists()
    with run_directory_lock(str(tmp_path / "ran")):
        (tmp_path / "ran" / "config.json").write_text("{}")
    assert os.listdir(tmp_path / "ran") == ["config.json"]
    (tmp_path / "mine").mkdir()
    with run_directory_lock(str(tmp_path / "mine")):  # not made here: kept, even empty
        pass
    assert (tmp_path / "mine").is_dir()


def test_train_refuses_a_run_directory_another_run_holds_and_leaves_its_files_alone(tmp_path):
    """The failure seen: a second run (another config, or --resume of the first) in the directory of a run that
    was still training; both wrote it, and the first one's run was lost."""
    data = synthetic_corpus(tmp_path, 4, 400)
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data))
    run_dir = tmp_path / "D"
    train.run([str(config), f"--out_dir={run_dir}", "--stop_iter=3"])
    before = {name: (run_dir / name).read_bytes() for name in ("ckpt.pt", "config.json", "metrics.jsonl")}
    holder = hold_in_another_process(run_dir)
    try:
        for argv in ([str(config), f"--out_dir={run_dir}", "--start_over", "--lr=0.02"],
                     ["--resume", str(run_dir)]):
            with pytest.raises(ConfigError, match=f"^{run_dir} is in use by another run: process {holder.pid} "):
                train.run(argv)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert train.run(["--resume", str(run_dir)])["step"] == 6  # free again after the kill


def start_training(config, out_dir, *extra, env_extra=None):
    """train.py in a process of its own, stdout and stderr together."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), str(config), f"--out_dir={out_dir}",
                             *extra], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def train_records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if '"train"' in line]


@pytest.mark.fault
@pytest.mark.parametrize("how", ["moved", "symlink re-pointed"])
def test_a_run_whose_directory_is_moved_stops_and_a_new_run_at_the_old_path_trains_alone(tmp_path, how):
    """The failure seen: the lock holds the directory, the writes went by path; a running run's directory moved
    (or runs/current re-pointed) and a new run started at the old path, both wrote there (metrics.jsonl
    interleaved, each replacing the other's ckpt.pt)."""
    data = synthetic_corpus(tmp_path, 4, 400)
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data, max_iters=100000, ckpt_interval=3))
    locked = tmp_path / "A"
    path = tmp_path / "current"
    if how == "moved":
        path, moved_to = locked, tmp_path / "A-moved"
    else:
        locked.mkdir()
        path.symlink_to(locked)
        moved_to = locked
    first = start_training(config, path)
    deadline = time.time() + 120
    while time.time() < deadline and not (locked / "ckpt.pt").exists():
        time.sleep(0.02)
    assert (locked / "ckpt.pt").exists(), "the first run wrote no checkpoint"
    if how == "moved":
        os.rename(locked, moved_to)
    else:
        (tmp_path / "B").mkdir()
        (tmp_path / "current.new").symlink_to(tmp_path / "B")
        os.replace(tmp_path / "current.new", path)  # (atomic: the path leads to B from one moment to the next)
    try:
        output, _ = first.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        first.kill()
        output = first.communicate()[0]
        pytest.fail(f"the first run went on writing after its directory was {how}: {output[-1500:]}")
    assert first.returncode == 1, output[-2000:]
    assert "Traceback" not in output
    assert output.strip().splitlines()[-1] == (
        f"error: {path} is no longer the run directory this run locked at its start: that directory is now "
        f"{os.path.realpath(moved_to)} (moved, or a symlink on the path re-pointed, while the run trained), so the "
        f"run stops rather than write into whatever is at {path} now; continue it with python train.py --resume "
        f"{os.path.realpath(moved_to)}.")
    assert not (os.path.realpath(path) == os.path.realpath(moved_to))
    # the second run at the old path trains alone, into a directory the first never wrote
    assert not os.path.exists(path) or sorted(os.listdir(path)) == []
    second = train.run([str(config), f"--out_dir={path}", "--max_iters=6", "--ckpt_interval=0"])
    assert second["step"] == 6
    assert [r["iter"] for r in train_records(path)] == [1, 2, 3, 4, 5, 6]
    first_iters = [r["iter"] for r in train_records(moved_to)]
    assert first_iters == list(range(1, len(first_iters) + 1)) and len(first_iters) >= 3  # its own, in order
    assert not (moved_to / LOCK_NAME).exists() and not (tmp_path / "B" / ".train.lock.tmp").exists()
    saved = torch.load(moved_to / "ckpt.pt", weights_only=True)["step"]
    resumed = train.run(["--resume", str(moved_to), f"--stop_iter={saved + 2}"])  # where the advice says
    assert resumed["step"] == saved + 2 and len(resumed["losses"]) == 2


@pytest.mark.fault
def test_a_stale_details_file_that_cannot_be_replaced_is_not_named_as_the_holder(tmp_path, monkeypatch):
    """An immutable .train.lock left by a run on a host that died: the lock itself is free, so a run goes on; a
    run refused while that one holds the directory must not name the dead process as the holder."""
    stale = {"pid": 4242, "host": "a-host-that-died", "started": 1.0e9, "command": "python train.py old.toml"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(stale))
    for name in ("replace", "rename"):  # (chattr +i, without needing root and a file system that takes it)
        real = getattr(os, name)

        def refuse(src, dst, *args, real=real, **kwargs):
            if os.path.basename(str(dst)) == LOCK_NAME:
                raise PermissionError(1, "Operation not permitted", str(dst))
            return real(src, dst, *args, **kwargs)
        monkeypatch.setattr(os, name, refuse)
    with run_directory_lock(str(tmp_path), ["new.toml"]):  # the lock is free: this run goes on
        with pytest.raises(ConfigError) as refused:
            with run_directory_lock(str(tmp_path)):
                pytest.fail("entered a run directory another holder holds")
    message = str(refused.value)
    assert message.startswith(f"{tmp_path} is in use by another run: another process; ")
    assert "4242" not in message and "a-host-that-died" not in message
    assert json.loads((tmp_path / LOCK_NAME).read_text()) == stale  # not ours: left as it was
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]


@pytest.mark.fault
def test_a_rank_left_in_the_environment_without_torchrun_is_one_process_that_takes_the_lock(tmp_path):
    """RANK=1 exported in a shell, no WORLD_SIZE: was a traceback, and the run skipped the lock."""
    data = synthetic_corpus(tmp_path, 4, 400)
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data, max_iters=3))
    run_dir = tmp_path / "D"
    stray = {"RANK": "1", "LOCAL_RANK": "1"}
    holder = hold_in_another_process(run_dir)
    try:
        refused = start_training(config, run_dir, env_extra=stray)
        output = refused.communicate(timeout=300)[0]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert refused.returncode == 2, output[-2000:]
    assert output.strip().splitlines() == [f"error: {run_dir} is in use by another run: process {holder.pid} on "
                                           + output.split(" on ", 1)[1].strip()]
    alone = start_training(config, run_dir, env_extra=stray)
    output = alone.communicate(timeout=300)[0]
    assert alone.returncode == 0, output[-2000:]
    assert [r["iter"] for r in train_records(run_dir)] == [1, 2, 3]  # the main process's records, all of them
    assert "done at iteration 3" in output


@pytest.mark.fault
def test_under_torchrun_a_moved_run_stops_on_every_process_with_the_main_processs_sentence(tmp_path):
    """Two processes: the main one noticed the move alone and the other one then failed on a broken collective,
    listed as a second failure with a gloo message; all of them stop together now, the sentence said once."""
    data = synthetic_corpus(tmp_path, 4, 400)
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data, max_iters=100000, ckpt_interval=3, batch_size=2))
    run_dir, moved_to = tmp_path / "A", tmp_path / "A-moved"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            os.path.join(REPO, "train.py"), str(config), f"--out_dir={run_dir}"], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 180
    while time.time() < deadline and not (run_dir / "ckpt.pt").exists():
        time.sleep(0.02)
    os.rename(run_dir, moved_to)
    try:
        output = job.communicate(timeout=180)[0]
    except subprocess.TimeoutExpired:
        job.kill()
        pytest.fail(f"the job went on after its directory was moved: {job.communicate()[0][-1500:]}")
    sentence = (f"error: {run_dir} is no longer the run directory this run locked at its start: that directory is now "
                f"{moved_to} (moved, or a symlink on the path re-pointed, while the run trained)")
    lines = [line.strip() for line in output.splitlines() if line.strip() and set(line.strip()) != {"="}]
    assert job.returncode != 0 and lines[-1].startswith(sentence) and output.count(sentence) == 1, output[-3000:]
    assert "<NO_OTHER_FAILURES>" in output and "collective operation" not in output, output[-3000:]
    assert not run_dir.exists() and (moved_to / "ckpt.pt").exists()
