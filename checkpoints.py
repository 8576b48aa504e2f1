"""Checkpoint files: atomic writes, a checksum of the payload, and loading that refuses damage in one sentence.

A checkpoint is a dict saved with torch.save. save() adds the key "checksum": the sha256 of every other entry
(tensors by dtype, shape and bytes; everything else by repr), so a flipped byte inside a tensor, which
torch.load reads without complaint, is caught by load() on every use (resume, sample, eval).

A sharded checkpoint (train.parallel = "fsdp") is the same file without "model" and "optimizer": those are in
the directory its "shards" entry names (RUN_DIR/ckpt.shards/<step>-<id>/, written by every process through
torch.distributed.checkpoint), with the sha256 of each file there. The small file is written last, atomically,
so it always names a complete set of shards; load() checks every shard against its checksum and, where "model" is
asked for, assembles the full weights from the shards, so every reader takes a sharded run directory as it is.
Shards that no ckpt.pt names are removed only where a ckpt.pt exists (unreferenced_shard_directories): without one
nothing says they are a cut-short write, and they may be all that is left of a run (train.py --resume recovers them).
"""
import contextlib
import errno
import hashlib
import os
import pickle
import re
import shutil
import warnings
import zipfile

import torch

from config import UserError, how_to_continue

CHECKSUM_KEY = "checksum"
SHARDS_DIR = "ckpt.shards"  # beside ckpt.pt: the sharded checkpoints' directories (the one ckpt.pt names is live)
SHARDED_KEYS = ("model", "optimizer")  # what a sharded checkpoint keeps in its shards


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


class NonFiniteWeights(CheckpointError):
    """A checkpoint whose weights hold a NaN or an infinity; `tensor` describes the first such (non_finite)."""

    def __init__(self, message: str, tensor: str):
        super().__init__(message)
        self.tensor = tensor


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


def save(path: str, state: dict, before_replace=None) -> None:
    """Write state + its checksum to a temp file, fsync, rename: a kill at any moment leaves the previous file
    intact. A failed write (full disk, read-only directory, a file-size limit) removes the temp file and raises
    CheckpointError with the system's own reason. `before_replace`: called just before the rename (a run's check
    that its path still leads to the directory it locked), whose exception stops the save with path untouched."""
    tmp, writer = path + ".tmp", None
    try:
        with open(tmp, "wb") as f:
            writer = _RecordingWriter(f)
            torch.save({**state, CHECKSUM_KEY: payload_checksum(state)}, writer)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
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
        directory = os.path.dirname(os.path.abspath(path))
        raise CheckpointError(write_failure_sentence(f"checkpoint {path}", cause, directory, previous)) from None


def again() -> str:
    """What to do once the cause of a failed write is fixed: run train.py again, or the study the run belongs to."""
    return how_to_continue("run again (with --resume if a checkpoint exists)")


def write_failure_sentence(what: str, error: OSError | None, directory: str, previous: str) -> str:
    """The one sentence of a checkpoint write that failed with the system's `error` (None: not known): `what` could
    not be written and why, `previous` (what is still on disk), and what to do."""
    reason, remedy = _write_failure(error, directory)
    return f"could not write {what}: {reason}; {previous}. {remedy}, then {again()}."


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


class _RecordingStream(_RecordingWriter):
    """A _RecordingWriter that is also the rest of the file (tell, fileno, ...), as torch.distributed.checkpoint's
    writer uses its streams."""

    def __getattr__(self, name):
        return getattr(self.file, name)


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


def file_in_the_way(path: str) -> str | None:
    """The path itself or the nearest of its parents that exists, when that is a file (os.makedirs then says only
    "File exists" or "Not a directory")."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path if os.path.isfile(path) else None


def not_a_folder(path: str, what: str, option: str) -> str | None:
    """The sentence for a folder (`what`, e.g. "the run directory") that cannot be made at `path` because a file is
    in the way, else None."""
    blocker = file_in_the_way(path)
    return None if blocker is None else (f"{what} {path} cannot be made: {blocker} is a file, not a folder; choose "
                                         f"another {option} (or move the file)")


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


READ_ATTEMPTS = 5  # reads of a checkpoint that a running job replaces meanwhile, before saying so


def _identity(path: str):
    """What changes when a checkpoint file is replaced (a save renames a new file over it): inode and time."""
    with contextlib.suppress(OSError):
        info = os.stat(path)
        return info.st_ino, info.st_mtime_ns, info.st_size
    return None


def load(path: str, required=("model", "model_config"), map_location="cpu",
         restore="restore it from a backup, or train again", assemble: bool = True) -> dict:
    """torch.load(weights_only=True), then the checksum; every kind of damage is one CheckpointError sentence
    that ends with `restore`. A sharded checkpoint's shards are checked against their checksums and, when
    `assemble` and "model" is required, its full weights are read from them into "model" (`assemble` False: the
    shards are neither checked nor read, for a caller that does both itself, train.py's processes).

    A run that saves while this reads replaces the file and then removes the shards the old one named: a read
    that fails while the file changed under it is no damage, and is done again with the new checkpoint (the
    newest complete one), up to READ_ATTEMPTS times; then one sentence says that the checkpoint keeps changing."""
    for _ in range(READ_ATTEMPTS):
        before = _identity(path)
        try:
            return _load_once(path, required, map_location, restore, assemble)
        except CheckpointError:
            if _identity(path) == before:
                raise
    raise CheckpointError(f"checkpoint {path} was replaced {READ_ATTEMPTS} times while it was read: a run is saving it "
                          "now, every few seconds; run this again, or once that run has ended")


def _load_once(path: str, required, map_location, restore, assemble) -> dict:
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
    missing = [k for k in required if k not in ckpt and not (k in SHARDED_KEYS and "shards" in ckpt)]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete (missing {', '.join(missing)}); it was not written by "
                              f"this project's train.py or is damaged: {restore}")
    saved = ckpt.pop(CHECKSUM_KEY, None)
    if saved is not None and saved != payload_checksum(ckpt):
        raise CheckpointError(f"checkpoint {path} is damaged: its contents do not match the checksum written with "
                              f"them (flipped bytes on disk or in transfer); {restore}")
    if "shards" in ckpt and assemble:
        verify_shards(path, ckpt, restore=restore)
        if "model" in required:
            try:
                ckpt["model"] = load_sharded_model(path, ckpt)
            except Exception as error:  # (torch.distributed.checkpoint fails in many ways on files that change)
                raise CheckpointError(f"checkpoint {path} is damaged: its shards in {shard_directory(path, ckpt)} "
                                      f"cannot be read ({type(error).__name__}: {str(error)[:160]}); {restore}") \
                    from None
    problem = non_finite(ckpt["model"]) if isinstance(ckpt.get("model"), dict) else None
    if problem:  # (the optimizer state only a resume uses, which checks it itself)
        raise NonFiniteWeights(non_finite_sentence(path, problem, restore), problem)
    return ckpt


def non_finite(state, name: str = "") -> str | None:
    """The first tensor of `state` (a state_dict, or an optimizer's nested one) that holds a NaN or an infinity, as
    "NAME (3 NaN of 4,096 values)", or None. Such a checkpoint passes its checksum (the bytes are as written) but
    every result from it is NaN: its weights are as damaged as flipped bytes would make them."""
    if isinstance(state, dict):
        for key, value in state.items():
            found = non_finite(value, f"{name}.{key}" if name else str(key))
            if found:
                return found
    elif isinstance(state, (list, tuple)):
        for index, value in enumerate(state):
            found = non_finite(value, f"{name}.{index}")
            if found:
                return found
    elif isinstance(state, torch.Tensor) and (state.is_floating_point() or state.is_complex()):
        tensor = state.to_local() if hasattr(state, "to_local") else state  # a DTensor: this process's shard
        if not bool(torch.isfinite(tensor).all()):
            nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
            counts = " and ".join(f"{n:,} {kind}" for n, kind in ((nan, "NaN"), (inf, "infinite")) if n)
            return f"{name} ({counts} of {tensor.numel():,} value{'s' * (tensor.numel() != 1)})"
    return None


def non_finite_sentence(path: str, problem: str, restore: str) -> str:
    """The sentence for a checkpoint whose tensor `problem` (non_finite's description) is not finite."""
    return (f"checkpoint {path} is damaged: its tensor {problem} is not finite (every result from it would be NaN); "
            f"{restore}")


# ----------------------------------------------------------------------------- sharded checkpoints

def shard_directory(path: str, ckpt: dict) -> str:
    """The directory of a sharded checkpoint's shards (its "shards" entry is relative to the file's directory)."""
    return os.path.join(os.path.dirname(os.path.abspath(path)), ckpt["shards"]["dir"])


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def damaged_shards(path: str, ckpt: dict, names=None) -> list[str]:
    """The shard files (of `names`, default all) that are missing or do not match their checksums, each as
    "name (what is wrong)"."""
    directory, expected = shard_directory(path, ckpt), ckpt["shards"]["files"]
    problems = []
    for name in sorted(expected) if names is None else names:
        file = os.path.join(directory, name)
        try:
            if file_sha256(file) != expected[name]:
                problems.append(f"{name} (its contents do not match its checksum)")
        except FileNotFoundError:  # (also one removed while this reads: load() then reads the newer checkpoint)
            problems.append(f"{name} (missing)")
        except OSError as error:
            problems.append(f"{name} (cannot be read: {error.strerror or error})")
    return problems


def shard_damage_error(path: str, ckpt: dict, problems: list[str], restore: str) -> CheckpointError:
    shown = ", ".join(problems[:3]) + (f" and {len(problems) - 3} more" if len(problems) > 3 else "")
    return CheckpointError(f"checkpoint {path} is damaged: {len(problems)} of the {len(ckpt['shards']['files'])} "
                           f"shard files in {shard_directory(path, ckpt)} are not as written ({shown}); {restore}")


def verify_shards(path: str, ckpt: dict, restore: str = "restore it from a backup, or train again") -> None:
    problems = damaged_shards(path, ckpt)
    if problems:
        raise shard_damage_error(path, ckpt, problems, restore)


def load_sharded_model(path: str, ckpt: dict) -> dict:
    """The full (unsharded) model state_dict of a sharded checkpoint, read on this process alone."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    reader = dcp.FileSystemReader(shard_directory(path, ckpt))
    prefix = "model."
    model = {key[len(prefix):]: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in reader.read_metadata().state_dict_metadata.items()
             if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": model}, storage_reader=reader, no_dist=True)
    return model


def unreferenced_shard_directories(run_dir: str) -> list[str]:
    """The directories under RUN_DIR/ckpt.shards that RUN_DIR/ckpt.pt does not name: sharded checkpoints that a
    kill cut short, or that a newer checkpoint replaced. None at all without a ckpt.pt (or with one that cannot be
    read): then nothing says which shards are this run's, and an earlier run's saved weights are never removed."""
    root, path = os.path.join(run_dir, SHARDS_DIR), os.path.join(run_dir, "ckpt.pt")
    if not os.path.isdir(root) or not os.path.isfile(path):
        return []
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # its own load says what is wrong with it
        return []
    live = saved.get("shards", {}).get("dir") if isinstance(saved, dict) else None
    return [os.path.join(root, name) for name in sorted(os.listdir(root))
            if os.path.join(SHARDS_DIR, name) != live]


def shard_directories(run_dir: str) -> list[str]:
    """Everything under RUN_DIR/ckpt.shards, as paths (sorted)."""
    root = os.path.join(run_dir, SHARDS_DIR)
    return [os.path.join(root, name) for name in sorted(os.listdir(root))] if os.path.isdir(root) else []


def shard_writer(directory: str):
    """torch.distributed.checkpoint's writer of `directory`, whose failed writes raise the system's OSError (torch.save
    inside it reports a full disk as RuntimeError("unexpected pos"), and the OSError is needed to say which it was)."""
    import torch.distributed.checkpoint as dcp
    writer = dcp.FileSystemWriter(directory)
    open_stream = writer.fs.create_stream

    @contextlib.contextmanager
    def create_stream(path, mode):
        with open_stream(path, mode) as stream:
            recorder = _RecordingStream(stream)
            try:
                yield recorder
            except RuntimeError:
                if recorder.error is None:
                    raise
                raise recorder.error from None
    writer.fs.create_stream = create_stream
    return writer


# ----------------------------------------------------------------------------- shards without their ckpt.pt

SHARD_DIRECTORY_NAME = re.compile(r"(\d{8,})-[0-9a-f]{8}")  # <step>-<id>, as Checkpointer.save_sharded names them


class _RefusedGlobal(pickle.UnpicklingError):
    """A pickle asked for a class or function beyond those allowed (the message names it)."""


class _ShardMetadataUnpickler(pickle.Unpickler):
    """torch.distributed.checkpoint's .metadata is a plain pickle; without the checksum that ckpt.pt held for it, only
    the classes such a file is made of may be built (anything else could run code)."""

    def find_class(self, module, name):
        import torch.distributed.checkpoint.metadata as dcp_metadata
        defined_there = getattr(dcp_metadata, name, None)
        allowed = (module == dcp_metadata.__name__ and isinstance(defined_there, type)
                   and defined_there.__module__ == module
                   or (module, name) in {("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
                                         ("torch", "Size"), ("torch.serialization", "_get_layout"),
                                         ("collections", "OrderedDict")}
                   or module in ("pathlib", "pathlib._local") and name in ("PosixPath", "WindowsPath")
                   or module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        if not allowed:
            raise _RefusedGlobal(f"{module}.{name}")
        return super().find_class(module, name)


def shard_set_problem(directory: str) -> str | None:
    """What keeps `directory` from holding a whole sharded checkpoint, or None. torch.distributed.checkpoint writes its
    .metadata last, once every process has written its files, and it lists the bytes of every tensor in them: so it
    must be readable, every file it points into long enough, and the weights and optimizer state both there. (Without
    ckpt.pt the contents of those files cannot be checked: the checksums were in it.)"""
    try:
        with open(os.path.join(directory, ".metadata"), "rb") as f:
            metadata = _ShardMetadataUnpickler(f).load()
    except FileNotFoundError:
        return "it has no .metadata, which is written last: the write was cut short"
    except _RefusedGlobal as error:
        return (f"its .metadata is refused: it names {error}, which no checkpoint's metadata holds, and loading it "
                "could run code")
    except Exception:  # cut short or damaged bytes fail in many ways (EOFError, ValueError, ...)
        return "its .metadata cannot be read"
    ends = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        if not os.path.isfile(os.path.join(directory, name)):
            return f"{name} is missing"
        if os.path.getsize(os.path.join(directory, name)) < end:
            return f"{name} is shorter than its .metadata says"
    keys = getattr(metadata, "state_dict_metadata", None) or {}
    if not any(key.startswith("model.") for key in keys) or not any(key.startswith("optimizer.") for key in keys):
        return "its .metadata lists no model weights or no optimizer state"
    return None


def latest_complete_shards(run_dir: str) -> tuple[str, int] | None:
    """(directory, step) of the latest sharded checkpoint in RUN_DIR/ckpt.shards whose set of files is complete
    (shard_set_problem), or None."""
    named = [(int(name.group(1)), directory) for directory in shard_directories(run_dir)
             if (name := SHARD_DIRECTORY_NAME.fullmatch(os.path.basename(directory)))]
    for step, directory in sorted(named, reverse=True):
        if shard_set_problem(directory) is None:
            return directory, step
    return None


# ----------------------------------------------------------------------------- loading a model to use it
# (sample.py, the evaluations, the Hugging Face export): the model module imports nothing from here, so these
# import it inside the functions and the two stay free of a cycle.

def load_gpt(path: str, map_location="cpu"):
    """(GPT, checkpoint dict) from RUN_DIR/ckpt.pt (or the file given): needs the keys "model" and "model_config"."""
    from model import GPT, GPTConfig

    file = os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no checkpoint at {file}: pass a run directory holding ckpt.pt or a .pt file")
    ckpt = load(file, map_location=map_location)  # checksum verified; CheckpointError (a ValueError)
    model = GPT(GPTConfig.from_dict(ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    return model, ckpt


def load_model(ckpt, device="cpu", argument="--ckpt"):
    """Returns (model in eval mode on `device`, tokenizer, checkpoint dict) for a run dir or a ckpt file.
    `argument`: how the command line names `ckpt`, for the messages."""
    from config import existing_runs
    from data.shards import DataError
    from data.tokenizer import get_tokenizer

    problem = device_problem(device)
    if problem:
        raise UserError(problem)
    if not os.path.exists(ckpt):
        raise UserError(f"no checkpoint at {ckpt}: it does not exist, and {argument} takes a run directory that "
                        f"holds ckpt.pt (written by train.py) or a checkpoint file; {existing_runs(ckpt)}")
    path = os.path.join(ckpt, "ckpt.pt") if os.path.isdir(ckpt) else ckpt
    if not os.path.isfile(path):
        found = latest_complete_shards(ckpt) if os.path.isdir(ckpt) else None
        if found:  # a sharded run whose ckpt.pt is gone: its weights are there, and train.py can commit them
            directory, step = found
            raise UserError(f"no checkpoint at {path}, but {directory} holds the complete sharded checkpoint of "
                            f"iteration {step}: `python train.py --resume {ckpt} --stop_iter={step}` writes ckpt.pt "
                            "from it without training further; then run this again")
        raise UserError(f"no checkpoint at {path}: {argument} takes a run directory that holds ckpt.pt "
                        f"(written by train.py) or the path of a .pt file")
    not_a_checkpoint(path, argument)
    try:
        model, ckpt_dict = load_gpt(path, map_location="cpu")
    except (OSError, ValueError) as error:  # damaged or refused file (one sentence already), unknown config key
        raise UserError(str(error)) from None
    except RuntimeError as error:  # load_state_dict: weights that do not fit the saved config
        detail = " ".join(str(error).split())
        detail = detail if len(detail) <= 160 else detail[:160] + "…"
        raise UserError(f"{path}: the weights do not match its model_config ({detail})") from None
    if "tokenizer" not in ckpt_dict:
        raise UserError(f"{path} has no 'tokenizer' entry; re-save it with the tokenizer name "
                        f"(e.g. 'gpt2' or 'byte') as the checkpoint contract requires")
    try:
        tokenizer = get_tokenizer(ckpt_dict["tokenizer"])
    except DataError as error:  # unknown name, or the GPT-2 ranks are not available offline
        raise UserError(str(error)) from None
    model.to(device).eval()
    return model, tokenizer, ckpt_dict


def device_problem(device) -> str | None:
    """The sentence for a device this machine cannot put a model on, or None. Checked here, the one place sample.py
    and the evaluations share, because model.to(device) answers a misspelled name or a missing GPU with a raw
    RuntimeError."""
    valid = "cpu, cuda, cuda:N (N counts the GPUs from 0) or mps"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        return f"device {device!r} is not a device name; use {valid}"
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return f"device {device} was asked for, but no CUDA GPU is visible on this machine; use cpu"
        if parsed.index is not None and parsed.index >= count:
            names = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
            return f"device {device} does not exist: this machine has {count} CUDA GPU{'s' * (count > 1)}, {names}"
    elif parsed.type == "mps":
        if not torch.backends.mps.is_available():
            return f"device {device} was asked for, but MPS (Apple's GPU) is not available on this machine; use cpu"
    elif parsed.type != "cpu":  # meta, xpu, ...: names torch knows that this project does not run on
        return f"device {device!r} is not one this project runs on; use {valid}"
    return None


# What a torch.save file starts with: a zip archive (torch >= 1.6), or a pickle (the legacy format).
TORCH_SAVE_MAGIC = (b"PK", b"\x80")
RUN_FILES = {"config.json": "train.py's record of the run's settings",
             "metrics.jsonl": "train.py's log of the run's losses"}


def not_a_checkpoint(path, argument="--ckpt"):
    """One sentence when `path` is some other file (a run's config.json, a text file): torch.load would call it
    corrupt or truncated. A damaged checkpoint keeps its first bytes and is left to the loader's own message; a
    run's ckpt.pt that is not torch.save's at all is called corrupt here (its run directory is no way out)."""
    with open(path, "rb") as f:
        head = f.read(64)
    if not head or head.startswith(TORCH_SAVE_MAGIC):
        return
    name = os.path.basename(path)
    json_like = head.lstrip()[:1] in (b"{", b"[")
    what = RUN_FILES.get(name) or ("a JSON file" if json_like else "a file that torch.save did not write")
    run_dir = os.path.dirname(os.path.abspath(path))
    if name == "ckpt.pt":
        # the run directory's own checkpoint is the broken file: pointing at that directory would loop
        kind = "it holds JSON text" if json_like else "it does not begin as a torch.save file does"
        raise UserError(f"checkpoint {path} is corrupt or was not written by torch.save ({kind}); restore it from a "
                        f"backup, or pass another run directory or checkpoint file as {argument}")
    given = os.path.dirname(path) or "."
    instead = ((f"pass {argument} {given}" if argument.startswith("-") else f"give {given} as {argument}")
               + " (its run directory, which holds ckpt.pt)"
               if os.path.isfile(os.path.join(run_dir, "ckpt.pt"))
               else f"{argument} takes a run directory that holds ckpt.pt (written by train.py), or the path of that "
                    "file")
    raise UserError(f"{path} is {what}, not a checkpoint: {instead}")
