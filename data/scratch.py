"""What a preparation owns in its output folder OUT, and how it proves it: its scratch folder, its lock, its files.

Everything but the named shards and manifest.json is written in a scratch folder OUT/.prepare-XXXXXXXX that mkdtemp
makes fresh (a name no user picks), whose journal progress.json, written before anything else, carries
SCRATCH_MARK; a re-run finds its unfinished preparation by that mark. A preparation deletes only inside such a
folder, and shards whose header carries the mark of the shards it writes (data.shards.PREPARED_MARK): a user's
files in OUT are never touched, whatever their names. Preparations of one OUT take turns on a lock beside OUT's
real path.
"""
import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile

from data.shards import DataError, is_prepared_shard

PARTS = "parts"  # SCRATCH/parts/: the pieces' shards and records until the last step names them
SCRATCH_PREFIX = ".prepare-"  # OUT/.prepare-XXXXXXXX (mkdtemp): a preparation's own folder for its scratch files


JOURNAL = "progress.json"  # in the scratch folder, written first: the proof that the folder is a preparation's


SCRATCH_MARK = "python -m data.prepare: scratch folder, removed when the preparation ends"


def write_json(path, data):
    """Write data to path atomically, through a temp file of a name no other file has (mkstemp), removed if the
    write fails."""
    handle, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.",
                                   suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())  # a crash right after the rename must not leave an empty record
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        out_dir = os.path.dirname(path)
        raise DataError(f"{path} is damaged ({error}); delete {out_dir} and prepare again") from None


def scratch_folders(out_dir):
    """[(folder, journal)] for out_dir's scratch folders: a name starting with SCRATCH_PREFIX, and a journal that
    carries SCRATCH_MARK. Nothing else in out_dir is taken for a preparation's own."""
    found = []
    for name in sorted(os.listdir(out_dir)):
        folder = os.path.join(out_dir, name)
        journal_path = os.path.join(folder, JOURNAL)
        if name.startswith(SCRATCH_PREFIX) and not os.path.islink(folder) and os.path.isfile(journal_path):
            journal = read_json(journal_path)
            if isinstance(journal, dict) and journal.get("written_by") == SCRATCH_MARK:
                found.append((folder, journal))
    return found


def new_scratch(out_dir, journal):
    """A fresh scratch folder in out_dir (a name mkdtemp made up) with its journal; returns the folder."""
    folder = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=out_dir)
    write_json(os.path.join(folder, JOURNAL), {"written_by": SCRATCH_MARK, **journal})
    return folder


def remove_our_shards(out_dir):
    """Remove the shards in out_dir that carry the mark of a preparation's (an earlier one's, whose manifest.json
    was deleted): no other file of out_dir is a preparation's to remove."""
    for name in os.listdir(out_dir):
        if name.endswith(".bin") and is_prepared_shard(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))


def remove_unfinished(out_dir, scratch, created):
    """After a preparation that cannot succeed: remove its scratch folder, so nothing looks resumable, and out_dir
    if this run created it and nothing else is in it."""
    shutil.rmtree(scratch, ignore_errors=True)
    if created and not os.listdir(out_dir):
        os.rmdir(out_dir)


_held_locks = {}  # lock file -> how many preparation_lock blocks of this process hold it (they nest)


def lock_path(out_dir):
    """The lock file of out_dir: beside it, not in it, so that removing or rebuilding the directory (an old cache
    of the embedded corpus) never removes a lock another process waits on; named from the real path, so that a
    preparation through a symlink and one through the real path take turns."""
    out_dir = os.path.realpath(out_dir)
    return os.path.join(os.path.dirname(out_dir), f".{os.path.basename(out_dir)}.lock")


@contextlib.contextmanager
def preparation_lock(out_dir):
    """Hold the exclusive lock of out_dir while open: a second process preparing the same directory waits here
    (and says so in one line), then continues with what the first one left, normally a finished preparation. No
    lock where none can be made (no fcntl, or a parent directory that is read-only, where this process cannot
    write either): then this process takes no turn."""
    path = lock_path(out_dir)
    if _held_locks.get(path):  # already held by this process (ensure_default_corpus calls prepare)
        _held_locks[path] += 1
        try:
            yield
        finally:
            _held_locks[path] -= 1
        return
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a")
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        yield
        return
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process to finish preparing {out_dir} (it holds {path})", file=sys.stderr,
                  flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        _held_locks[path] = 1
        try:
            yield
        finally:
            del _held_locks[path]
    finally:
        handle.close()  # (closing releases the lock)


def write_error(out_dir, error):
    """The DataError for an OSError while preparing out_dir, after removing the temporary files it left in its
    scratch folders. A file of out_dir that vanished (or the directory itself) was removed by someone else, not by
    a full disk."""
    with contextlib.suppress(OSError, DataError):
        for scratch, _ in scratch_folders(out_dir):
            for folder in (scratch, os.path.join(scratch, PARTS)):
                for name in os.listdir(folder) if os.path.isdir(folder) else ():
                    if name.endswith(".tmp"):
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(os.path.join(folder, name))
    blocker = _file_in_the_way(out_dir)
    if blocker is not None:  # not a full disk or a permission: no re-run can make a folder where a file is
        return DataError(f"cannot prepare into {out_dir}: {blocker} is a file, not a folder; give --out another path "
                         "or move that file aside")
    inside = error.filename is not None and os.path.abspath(str(error.filename)).startswith(
        os.path.abspath(out_dir) + os.sep)
    if isinstance(error, FileNotFoundError) and inside:
        return DataError(f"{error.filename} vanished while this process was writing it: another process removed or "
                         f"replaced {out_dir} meanwhile (a program that deletes it, or a preparation by an older "
                         f"version, which does not wait for others); let nothing else write to or delete {out_dir}, "
                         "then run the same command again to continue")
    where = f" ({error.filename})" if error.filename else ""
    return DataError(f"cannot write to {out_dir}{where}: {error.strerror or error}; completed pieces are kept: "
                     "free space or fix the permissions, then run the same command again to continue")


def _file_in_the_way(out_dir):
    """The file at out_dir or at the nearest existing path above it, which keeps out_dir from being a folder; or
    None."""
    path = os.path.abspath(out_dir)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return None if os.path.isdir(path) else path
