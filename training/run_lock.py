"""One run at a time in a run directory: train.py holds an exclusive lock on RUN_DIR from before it reads the
checkpoint until it exits, so that a second run (a new one, or a --resume of the same run) started on the same
directory is one sentence naming the run that holds it, instead of two runs interleaving their checkpoints and
metrics.jsonl. The lock is the kernel's (flock on the directory itself): it ends with the process that holds it,
however it ends, so a killed run never leaves a directory locked. While it runs, the holder's details (process,
host, command, start) are in RUN_DIR/.train.lock, for the sentence; the file goes when the run ends (one that a
kill -9 leaves behind is only read while another run holds the lock, which has replaced it by then).

Only the main process of a job (RANK 0) takes it: the other processes of the same job write through it. Where no
lock can be taken (no fcntl, a file system without locks, a folder this process cannot write, which the run
itself then reports), the run goes on without one.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time

from config import ConfigError

LOCK_NAME = ".train.lock"  # the holder's details, beside the runs' own files while the lock is held
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF)  # file systems that take no flock


def holder_description(path: str) -> str:
    """Who holds the lock, from the details file at path: 'process 123 on host (python train.py ...), started at
    2026-12-07 12:00:01 UTC'; or 'another process' when it has written none yet."""
    try:
        with open(path, encoding="utf-8") as f:
            holder = json.load(f)
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(holder["started"])))
        return f"process {int(holder['pid'])} on {holder['host']} ({holder['command']}), started at {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextlib.contextmanager
def run_directory_lock(run_dir: str, command: list[str] | None = None, is_main: bool = True, create: bool = True):
    """Hold RUN_DIR's lock while open; a ConfigError naming the holder if another process holds it. create: make
    RUN_DIR if it does not exist (a new run; two started at once on a new folder must meet here too), and remove it
    again at the end if nothing was written there (a run refused at its start leaves no folder)."""
    if not is_main or not (create or os.path.isdir(run_dir)):
        yield
        return
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    made = not os.path.exists(run_dir)
    try:
        os.makedirs(run_dir, exist_ok=True)
        handle = os.open(run_dir, os.O_RDONLY)
    except OSError:  # (a read-only parent: the run's own first write says so, with its remedy)
        yield
        return
    details = os.path.join(run_dir, LOCK_NAME)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{run_dir} is in use by another run: {holder_description(details)}; wait for it to "
                              "end (or stop it), or give this run another --out_dir.") from None
        except OSError as error:
            if error.errno not in NO_LOCKS:
                raise
            yield  # a file system without locks
            return
        with contextlib.suppress(OSError):  # the details are for the sentence above; the lock works without them
            with open(details + ".tmp", "w", encoding="utf-8") as f:
                json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                           "command": " ".join(["python", "train.py", *(command or sys.argv[1:])])}, f)
            os.replace(details + ".tmp", details)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.remove(details)
    finally:
        os.close(handle)  # (closing releases the lock)
        if made:
            with contextlib.suppress(OSError):
                os.rmdir(run_dir)  # only if empty
