"""One run at a time in a run directory: train.py holds an exclusive lock on RUN_DIR from before it reads the
checkpoint until it exits, so that a second run (a new one, or a --resume of the same run) started on the same
directory is one sentence naming the run that holds it, instead of two runs interleaving their checkpoints and
metrics.jsonl. The lock is the kernel's (flock on the directory itself): it ends with the process that holds it,
however it ends, so a killed run never leaves a directory locked. While it runs, the holder's details (process,
host, command, start) are in RUN_DIR/.train.lock, for the sentence; the file goes when the run ends (one that a
kill -9 leaves behind is only read while another run holds the lock, which has replaced it by then; one that
cannot be replaced is not named, since the holder keeps its own details file locked while it runs).

The lock holds the directory, not its path: a run directory moved while its run trains (or a symlink on its path
re-pointed) leaves the run locking a folder that no longer is at its path, where a second run may start. So every
write of the run first checks that the path still leads to the locked directory (LockedDirectory.check), and the
run stops with one sentence naming where its directory went.

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
from training.errors import TrainError

LOCK_NAME = ".train.lock"  # the holder's details, beside the runs' own files while the lock is held
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF)  # file systems that take no flock


def holder_description(path: str) -> str:
    """Who holds the lock, from the details file at path: 'process 123 on host (python train.py ...), started at
    2026-12-07 12:00:01 UTC'; or 'another process' when it has written none yet, or when the file is not the
    holder's (the holder keeps its own locked: one that no process locks was left by a run that has ended)."""
    try:
        with open(path, encoding="utf-8") as f:
            if not held_by_a_process(f.fileno()):
                return "another process"
            holder = json.load(f)
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(holder["started"])))
        return f"process {int(holder['pid'])} on {holder['host']} ({holder['command']}), started at {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def held_by_a_process(fd: int) -> bool:
    """Whether another open file holds a lock on the file open at fd (the details of a running holder do)."""
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True  # no locks on this file system: the details are taken as they are
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


class LockedDirectory:
    """The run directory as this process locked it: check() before each write of the run, so that nothing is
    written through a path that has come to lead elsewhere. Without a lock (another process of the job, no flock)
    it checks nothing."""

    def __init__(self, path: str, handle: int | None = None):
        self.path, self.handle = path, handle

    def problem(self) -> str | None:
        """None while the path leads to the locked directory; else the sentence saying where it went."""
        if self.handle is None:
            return None
        locked = os.fstat(self.handle)
        try:
            here = os.stat(self.path)
            if (here.st_dev, here.st_ino) == (locked.st_dev, locked.st_ino):
                return None
        except OSError:
            pass
        try:  # (Linux: where the locked directory is now)
            now = os.readlink(f"/proc/self/fd/{self.handle}")
        except OSError:
            now = None
        if now is None or now.endswith(" (deleted)"):
            return (f"{self.path} is no longer the run directory this run locked at its start (it was moved or "
                    "removed while the run trained), so the run stops rather than write into whatever is at that "
                    "path now; find the moved folder and continue it with python train.py --resume FOLDER.")
        return (f"{self.path} is no longer the run directory this run locked at its start: that directory is now "
                f"{now} (moved, or a symlink on the path re-pointed, while the run trained), so the run stops rather "
                f"than write into whatever is at {self.path} now; continue it with python train.py --resume {now}.")

    def open_append(self, name: str):
        """The file `name` of the locked directory, wherever that directory is now, opened to append to (by path
        where nothing is locked)."""
        if self.handle is None:
            return open(os.path.join(self.path, name), "a")
        return os.fdopen(os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644, dir_fd=self.handle), "a")

    def check(self) -> None:
        problem = self.problem()
        if problem:
            raise TrainError(problem)


@contextlib.contextmanager
def run_directory_lock(run_dir: str, command: list[str] | None = None, is_main: bool = True, create: bool = True):
    """Hold RUN_DIR's lock while open, yielding its LockedDirectory; a ConfigError naming the holder if another
    process holds it. create: make RUN_DIR if it does not exist (a new run; two started at once on a new folder must
    meet here too), and remove it again at the end if nothing was written there (a run refused at its start leaves
    no folder)."""
    if not is_main or not (create or os.path.isdir(run_dir)):
        yield LockedDirectory(run_dir)
        return
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield LockedDirectory(run_dir)
        return
    made = not os.path.exists(run_dir)
    try:
        os.makedirs(run_dir, exist_ok=True)
        handle = os.open(run_dir, os.O_RDONLY)
    except OSError:  # (a read-only parent: the run's own first write says so, with its remedy)
        yield LockedDirectory(run_dir)
        return
    locked = LockedDirectory(run_dir, handle)
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
            yield LockedDirectory(run_dir)  # a file system without locks
            return
        own_details = write_details(handle, command)
        try:
            yield locked
        finally:
            if own_details is not None:
                with contextlib.suppress(OSError):
                    os.unlink(LOCK_NAME, dir_fd=handle)  # (in the locked directory, wherever it is now)
                os.close(own_details)
    finally:
        gone = locked.problem()
        os.close(handle)  # (closing releases the lock)
        if made and not gone:
            with contextlib.suppress(OSError):
                os.rmdir(run_dir)  # only if empty


def write_details(handle: int, command: list[str] | None) -> int | None:
    """The holder's details written into the locked directory (open at handle) as LOCK_NAME, and kept locked
    while the run holds the directory, so that a refused run can tell them from a file an ended run left; returns
    the open details file, or None where they could not be written (the sentence then says 'another process';
    the lock works without them)."""
    import fcntl
    temporary = LOCK_NAME + ".tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=handle)
    except OSError:
        return None
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                                 "command": " ".join(["python", "train.py", *(command or sys.argv[1:])])}).encode())
        os.rename(temporary, LOCK_NAME, src_dir_fd=handle, dst_dir_fd=handle)
        return fd
    except OSError:  # (an earlier details file that cannot be replaced: it stays, and is not named)
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=handle)
        os.close(fd)
        return None
