"""Shard checks whose cost at start does not grow with the data: read every shard's content once, remember it.

verify_shards() checks every shard's header and size at each start (one 1 KiB read per shard). A shard's content
(its sha256 against manifest.json, and its largest token id) is read in full only the first time: the result is
recorded in a file of the user's cache directory, keyed by the shard's size, mtime and ctime, so it is read again
only when the file has been written or replaced since. (ctime cannot be set back by `touch` or a copy that keeps
mtimes, so a rewritten file is always read again.) The record lives outside the data directory, so it works when
that is read-only; several processes split the first full read between them. What a record cannot see (a disk
flipping a bit without touching the file's times) is what the per-batch token check (data/prefetch.py) and
`python -m data.prepare --verify DIR` are for.
"""
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from data.prepared import open_data
from data.shards import HEADER_BYTES, DataError, read_header

CACHE_ENV = "GRAPE_CACHE_DIR"
ANNOUNCE_BYTES = 1 << 30  # say that a first check is running when it reads at least this much
# File times advance in clock ticks (milliseconds), so a file written again within a tick of its check would look
# unchanged; like git's "racy" index entries, a file changed this recently is checked but not recorded.
RACY_NS = 2_000_000_000

_checked = {}  # (absolute path, size, mtime_ns, ctime_ns) -> largest token id, for this process
_unrecordable_said = set()


def record_path(data_dir):
    """The file that records which shards of data_dir have been read in full: $GRAPE_CACHE_DIR, else
    $XDG_CACHE_HOME/grape, else ~/.cache/grape, then verified/<hash of the directory's real path>.json."""
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "grape")
    key = hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:20]
    return os.path.join(root, "verified", f"{key}.json")


def file_state(path):
    """What must be unchanged for a recorded check of path to still hold."""
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def hash_and_max(path):
    """(sha256 of the whole file, largest token id, -1 if none) in one pass over the file."""
    digest, largest = hashlib.sha256(), -1
    with open(path, "rb") as f:
        digest.update(f.read(HEADER_BYTES))
        for block in iter(lambda: f.read(1 << 22), b""):  # an even block size keeps uint16 tokens whole
            digest.update(block)
            if len(block) >= 2:
                largest = max(largest, int(np.frombuffer(block, dtype="<u2", count=len(block) // 2).max()))
    return digest.hexdigest(), largest


def check_content(path):
    """[state, sha256, largest id] of a shard read in full now, or an error sentence (an unreadable file must not
    stop one process of many: all of them raise the same error after exchanging results)."""
    try:
        state = file_state(path)
        return [state, *hash_and_max(path)]
    except OSError as error:
        return f"shard {path} cannot be read ({error.strerror or error})"


def _load_record(path):
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}  # none yet, or damaged: the shards are simply read again
    shards = record.get("shards") if isinstance(record, dict) else None
    # a record of another shape (valid JSON, not ours) is damaged too: each entry must be a shard's own record
    return {name: entry for name, entry in shards.items() if isinstance(entry, dict)} if isinstance(shards, dict) else {}


def _save_record(path, data_dir, shards, say):
    tmp = f"{path}.{os.getpid()}.tmp"  # processes of one job may write the same record at once
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump({"data_dir": os.path.realpath(data_dir), "shards": shards}, f)
        os.replace(tmp, path)
    except OSError as error:
        if path not in _unrecordable_said:
            _unrecordable_said.add(path)
            say(f"note: cannot record the shard checks in {path} ({error.strerror or error}); set {CACHE_ENV} to a "
                "writable directory, or every start reads all shards again")


def _all_gather(results, world_size):
    import torch.distributed as dist

    gathered = [None] * world_size
    dist.all_gather_object(gathered, results)
    return {path: result for part in gathered for path, result in part.items()}


def _judge(data_dir, results, expected, record, largest):
    """Take freshly read shards into `largest`, the process memo and `record`; return the problems found, in order."""
    problems = []
    for path, result in results.items():
        if isinstance(result, str):
            problems.append(result)
            continue
        state, digest, top = result
        if expected.get(path) and digest != expected[path]:
            problems.append(f"shard {path} is damaged: its sha256 differs from the one in manifest.json (changed on "
                            "disk since it was prepared)")
            continue
        largest[path] = _checked[(os.path.abspath(path), *state)] = top
        if time.time_ns() - max(state[1:]) >= RACY_NS:
            record[os.path.relpath(path, data_dir)] = {"state": state, "sha256": digest, "max_token": top}
    return problems


def verify_shards(data, splits=("train", "val"), vocab_size=None, rank=0, world_size=1):
    """Check the shards of `splits` of data (a data.prepared.PreparedData, or a folder's path) before use: headers
    and sizes every time; content (the sha256 recorded in manifest.json, or for directories without one only the
    token ids) once per version of each file, the reading split over the world_size processes of a
    torch.distributed job (all of them must call this). Given vocab_size, every token id must be below it. A
    DataError names the shard and the command that repairs it. A PreparedData is checked once per split."""
    data = open_data(data)
    splits = tuple(split for split in splits if not data.verified(split, vocab_size))
    if not splits:
        return
    _verify(data, splits, vocab_size, rank, world_size)
    data.mark_verified(splits, vocab_size)


def _verify(data, splits, vocab_size, rank, world_size):
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if rank == 0 else (lambda text: None)
    data_dir, expected, hint = data.path, data.expected_sha256(), data.repair_hint()
    paths = [p for split in splits for p in data.split_paths(split)]
    for path in paths:
        if not os.path.exists(path):
            raise DataError(f"shard {path} listed in manifest.json is missing; {hint}")
        read_header(path, redo=hint)

    record_file = record_path(data_dir)
    record = _load_record(record_file)
    largest, unread = {}, []
    for path in paths:
        state, entry = file_state(path), record.get(os.path.relpath(path, data_dir)) or {}
        key = (os.path.abspath(path), *state)
        if key in _checked:
            largest[path] = _checked[key]
        elif (entry.get("state") == state and isinstance(entry.get("max_token"), int)
              and entry.get("sha256") == (expected.get(path) or entry.get("sha256"))):
            largest[path] = _checked[key] = entry["max_token"]
        else:
            unread.append(path)
    if unread:
        size = sum(os.path.getsize(p) for p in unread)
        if size >= ANNOUNCE_BYTES:
            say(f"checking {len(unread)} shard(s) of {data_dir} ({size / 1e9:.1f} GB) in full once, shared by "
                f"{world_size} process(es); later starts only read their headers (record: {record_file})")
        results = {path: check_content(path) for path in unread[rank::world_size]}
        if world_size > 1:
            results = _all_gather(results, world_size)
        # In shard order, so that every process raises the same error; the good ones are recorded first.
        problems = _judge(data_dir, {path: results[path] for path in unread}, expected, record, largest)
        _save_record(record_file, data_dir, record, say)
        if problems:
            raise DataError(f"{problems[0]}; {hint}")
    if vocab_size is not None:
        tokenizer_ids = data.vocab_size
        for path in paths:
            if tokenizer_ids is not None and largest[path] >= tokenizer_ids:  # no tokenizer of this data makes it
                raise DataError(f"shard {path} holds token id {largest[path]}, which its tokenizer ({tokenizer_ids} "
                                f"ids) never produces: the shard is damaged; {hint}")
            if largest[path] >= vocab_size:
                raise DataError(f"shard {path} holds token id {largest[path]}, but the model's vocab_size is "
                                f"{vocab_size}: the data was made with a larger tokenizer; set "
                                f"--vocab_size={largest[path] + 1} or more, or train on data prepared with the "
                                "model's tokenizer")


def verify_all(data_dir, workers=1):
    """Read every shard of data_dir in full now, whatever is recorded, with `workers` threads (hashing and numpy
    release the GIL); record the intact ones. Token ids must be below the manifest's vocab_size (manifest-free
    directories: GPT-2's 50257). Returns (number of shards, bytes read, the problems found as sentences)."""
    data = open_data(data_dir)
    expected = data.expected_sha256()
    paths = [p for split in ("val", "train") for p in data.split_paths(split)]
    problems, readable = [], []
    for path in paths:
        try:
            read_header(path, redo="see the command below")
            readable.append(path)
        except OSError:
            problems.append(f"shard {path} listed in manifest.json is missing")
        except DataError as error:
            problems.append(str(error))
    with ThreadPoolExecutor(max(1, workers)) as pool:
        contents = list(pool.map(check_content, readable))
    record_file = record_path(data_dir)
    record, largest = _load_record(record_file), {}
    problems += _judge(data_dir, dict(zip(readable, contents)), expected, record, largest)
    _save_record(record_file, data_dir, record, lambda text: print(text, file=sys.stderr))
    vocab_size = data.vocab_size
    problems += [f"shard {path} holds token id {top}, but its tokenizer has only {vocab_size} ids"
                 for path, top in largest.items() if vocab_size and top >= vocab_size]
    return len(paths), sum(os.path.getsize(p) for p in readable), problems
