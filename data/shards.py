"""Token shard files in the llm.c / nanoGPT-speedrun format.

A shard is a 256 x int32 header followed by the tokens as uint16:
header[0] = 20240520 (magic), header[1] = 1 (version), header[2] = number of tokens.
Tools from llm.c and modded-nanogpt read these files unchanged, and we read theirs. The shards data.prepare writes
also carry PREPARED_MARK in header[3] (which those tools leave 0 and never read): the proof that a shard in a
folder without manifest is one of ours, which preparing the folder afresh may replace, and not a user's own file
that happens to be named like ours.
"""
import hashlib
import os

import numpy as np

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
PREPARED_MARK = int(np.frombuffer(b"GRPE", dtype="<i4")[0])  # header[3] of the shards data.prepare writes


class DataError(ValueError):
    """A user-facing data problem: the message says what is wrong and what to do."""


def write_shard(path, tokens, prepared=False):
    """Write tokens (values < 65536) to path atomically (temp file, then rename); return its sha256. prepared: mark
    it as data.prepare's own (header[3] = PREPARED_MARK)."""
    tokens = np.asarray(tokens)
    if tokens.size and int(tokens.max()) >= 2**16:
        raise DataError(f"token id {int(tokens.max())} does not fit in uint16; use a tokenizer with at most 65536 ids")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, tokens.size
    if prepared:
        header[3] = PREPARED_MARK
    payload = header.tobytes() + tokens.astype("<u2", copy=False).tobytes()
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return hashlib.sha256(payload).hexdigest()


def read_header(path, redo="prepare the data again (python -m data.prepare with the arguments that made it)"):
    """Check a shard's header against its file size; return its token count or raise DataError ending in `redo`."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise DataError(f"{path}: file has {size} bytes, less than the {HEADER_BYTES}-byte shard header; "
                        f"it is truncated or not a token shard: {redo}")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC:
        raise DataError(f"{path}: magic number {int(header[0])} is not {MAGIC}, so this is not a uint16 token shard; "
                        f"remove it from the data directory or {redo}")
    if header[1] != VERSION:
        raise DataError(f"{path}: shard version {int(header[1])} is not supported (only version {VERSION}, uint16 "
                        f"tokens); {redo}")
    count = int(header[2])
    expected = HEADER_BYTES + 2 * count
    if size != expected:
        raise DataError(f"{path}: header says {count} tokens ({expected} bytes) but the file has {size} bytes; "
                        f"it is truncated or damaged: {redo}")
    return count


def open_shard(path):
    """Memory-map a shard's tokens (uint16, read-only) after checking its header."""
    count = read_header(path)
    if count == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(count,))


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def is_prepared_shard(path):
    """Whether path is a shard that data.prepare wrote (its header carries PREPARED_MARK)."""
    try:
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(16), dtype="<i4")
    except OSError:
        return False
    return len(header) == 4 and int(header[0]) == MAGIC and int(header[3]) == PREPARED_MARK
