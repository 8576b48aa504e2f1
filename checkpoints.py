"""Checkpoint files: atomic writes, a checksum of the payload, and loading that refuses damage in one sentence.

A checkpoint is a dict saved with torch.save. save() adds the key "checksum": the sha256 of every other entry
(tensors by dtype, shape and bytes; everything else by repr), so a flipped byte inside a tensor, which
torch.load reads without complaint, is caught by load() on every use (resume, sample, eval).
"""
import errno
import hashlib
import os
import pickle
import shutil
import zipfile

import torch

CHECKSUM_KEY = "checksum"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


def payload_checksum(state) -> str:
    digest = hashlib.sha256()

    def feed(value):
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"tensor {tensor.dtype} {tuple(tensor.shape)}|".encode())
            if tensor.numel():
                digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
        elif isinstance(value, dict):
            digest.update(f"dict {len(value)}|".encode())
            for key in sorted(value, key=repr):  # optimizer state has int keys, the rest str keys
                digest.update(f"{key!r}:".encode())
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(f"{type(value).__name__} {len(value)}|".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"{value!r}|".encode())

    feed({k: v for k, v in state.items() if k != CHECKSUM_KEY})
    return digest.hexdigest()


def save(path: str, state: dict) -> None:
    """Write state + its checksum to a temp file, fsync, rename: a kill at any moment leaves the previous file
    intact. A failed write (full disk, read-only directory, a file-size limit) removes the temp file and raises
    CheckpointError with the system's own reason."""
    tmp, writer = path + ".tmp", None
    try:
        with open(tmp, "wb") as f:
            writer = _RecordingWriter(f)
            torch.save({**state, CHECKSUM_KEY: payload_checksum(state)}, writer)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as error:
        # torch.save reports a failed write as RuntimeError("[enforce fail ...] unexpected pos"): the system's
        # error is the one the file object raised under it
        cause = error if isinstance(error, OSError) else writer.error if writer else None
        try:
            os.remove(tmp)
        except OSError:
            pass
        previous = "the previous checkpoint there is intact" if os.path.exists(path) else "no earlier checkpoint exists"
        reason, remedy = _write_failure(cause, os.path.dirname(os.path.abspath(path)))
        raise CheckpointError(f"could not write checkpoint {path}: {reason}; {previous}. {remedy}, then run again "
                              "(with --resume if a checkpoint exists).") from None


class _RecordingWriter:
    """The file torch.save writes to, keeping the OSError of a failed write, which torch.save does not pass on."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.file.flush()


def _write_failure(error: OSError | None, directory: str) -> tuple[str, str]:
    """(what went wrong, what to do) for a failed checkpoint write."""
    if error is None:
        return "the write failed" + _free_space_note(directory), ("Free space or make the directory writable (or "
                                                                  "choose another --out_dir)")
    if error.errno == errno.ENOSPC:
        return "no space left on the device" + _free_space_note(directory), "Free space (or choose another --out_dir)"
    if error.errno == errno.EFBIG:
        return (f"{error.strerror}: the file would exceed {_file_size_limit()}",
                "Raise the limit (ulimit -f unlimited in the shell that starts training) or ask your administrator")
    if error.errno == errno.EDQUOT:
        return f"{error.strerror} (your disk quota)", "Free space within your quota (or choose another --out_dir)"
    return error.strerror or str(error), "Make the directory writable (or choose another --out_dir)"


def _file_size_limit() -> str:
    try:
        import resource
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return "the file-size limit of this process"
    if limit == resource.RLIM_INFINITY:
        return "the largest file this file system takes"
    return f"this process's file-size limit of {limit / 2**20:,.1f} MiB (ulimit -f)"


def _free_space_note(directory: str) -> str:
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return ""
    return f" ({free / 2**20:,.0f} MiB free in {directory})"


def load(path: str, required=("model", "model_config"), map_location="cpu",
         restore="restore it from a backup, or train again") -> dict:
    """torch.load(weights_only=True), then the checksum; every kind of damage is one CheckpointError sentence
    that ends with `restore`."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated (the file is empty); {restore}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        if "global" in str(error).lower():
            # The file asks to run code or build objects beyond tensors and plain containers; nothing was run.
            raise CheckpointError(f"{path} is refused: it holds Python objects beyond tensors and plain data, which "
                                  "a checkpoint written by train.py never does, and loading it could run code; "
                                  f"do not use this file ({restore})") from None
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated (its object data cannot be read); "
                              f"{restore}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as error:
        if isinstance(error, PermissionError) or isinstance(error, OSError) and error.errno == errno.EIO:
            raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror}") from None
        kind = "its archive is damaged" if zipfile.is_zipfile(path) else "it is not a complete torch.save archive"
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({kind}); {restore}") from None
    except Exception:  # flipped bytes in the pickled object data can fail in many ways (IndexError, AssertionError, ...)
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated (its object data cannot be read); "
                              f"{restore}") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint dict; it was not written by "
                              "this project's train.py")
    missing = [k for k in required if k not in ckpt]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete (missing {', '.join(missing)}); it was not written by "
                              f"this project's train.py or is damaged: {restore}")
    saved = ckpt.pop(CHECKSUM_KEY, None)
    if saved is not None and saved != payload_checksum(ckpt):
        raise CheckpointError(f"checkpoint {path} is damaged: its contents do not match the checksum written with "
                              f"them (flipped bytes on disk or in transfer); {restore}")
    return ckpt
