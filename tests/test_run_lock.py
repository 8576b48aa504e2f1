"""training/run_lock.py: one run of train.py at a time in a run directory."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

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
