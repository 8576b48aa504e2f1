"""Tokenise documents into uint16 token shards (llm.c / nanoGPT-speedrun format) with a JSON manifest.

    python -m data.prepare --dataset fineweb-edu --version 10B --out data_cache/fineweb-edu-10B
    python -m data.prepare --files 'corpus/**/*.jsonl' --out data_cache/mycorpus --val-tokens 1000000
    python -m data.prepare --default            # the embedded English corpus (what the quickstart uses)
    python -m data.prepare --verify data_cache/fineweb-edu-10B   # read every shard now and check it

Every document is tokenised with <|endoftext|> in front of it. The input is read in pieces, one per file of
the source (the hub dataset's parquet files, or the local files, in sorted order). Each worker process takes
whole pieces: it reads its piece itself and writes that piece's tokens as shards of at most --shard-tokens to
the scratch folder's parts/, then a record of them. A last step that reads almost nothing names the shards in input order: the
first --val-tokens tokens of the stream are the validation split (val_000000.bin, ...), the rest the train
split (train_NNNNNN.bin, numbered on from the validation shards); the shard that straddles the split, and with
--max-tokens the one in which the stream stops, is cut in two. So the output depends only on the arguments and
the input, never on the number of workers, and a re-run of an interrupted run with the same arguments keeps the
finished pieces, redoes the others and ends with byte-identical files. manifest.json marks the end.

Everything but the named shards and manifest.json is written in a scratch folder OUT/.prepare-XXXXXXXX made fresh
by mkdtemp, whose journal (progress.json, written before anything else) carries SCRATCH_MARK: a re-run finds it
by that mark, and a preparation only ever deletes inside it, or shards whose header carries the mark of shards it
writes. A user's files in OUT are never touched, whatever their names; an input inside OUT is refused.

Preparations of one OUT take turns: each holds an exclusive lock on the file .NAME.lock beside OUT's real path (flock), so a
second one started meanwhile (two runs of a study on a fresh clone) says that it waits, then finds the first one's
result and uses it.
"""
import argparse
import contextlib
import errno
import functools
import glob
import json
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

if __package__ in (None, ""):  # run as `python data/prepare.py`: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from data import tokenizer as tokenization
from data.manifest import (FINEWEB_EDU_CONFIGS, FINEWEB_EDU_REPO, adopt_command, prepare_command,  # noqa: F401
                           read_manifest, split_files)
from data.shards import DataError, file_sha256, is_prepared_shard, open_shard, read_header, write_shard
from data.tokenizer import TOKENIZER_NAMES, encode_documents, get_tokenizer

DEFAULT_SHARD_TOKENS = 100_000_000  # 200 MB per shard, as in nanoGPT-speedrun
DEFAULT_HUB_VAL_TOKENS = 100_000_000  # the paper's 0.1B validation tokens
DEFAULT_FILES_VAL_TOKENS = 1_000_000
DOCS_PER_BATCH = 64  # documents tokenised together: fewer Python-level steps per token
PARTS = "parts"  # SCRATCH/parts/: the pieces' shards and records until the last step names them
SCRATCH_PREFIX = ".prepare-"  # OUT/.prepare-XXXXXXXX (mkdtemp): a preparation's own folder for its scratch files
JOURNAL = "progress.json"  # in the scratch folder, written first: the proof that the folder is a preparation's
SCRATCH_MARK = "python -m data.prepare: scratch folder, removed when the preparation ends"
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT_NAMES = {"json": "JSON", "parquet": "parquet", "text": "UTF-8 text"}  # what LOCAL_BUILDERS read
OFFLINE_HINT = ("prepare local files instead with --files 'path/*.jsonl' (.jsonl/.json/.parquet with a 'text' "
                "field, or .txt), or the embedded corpus with --default")


class BadInput(DataError):
    """An input file that no re-run can read: the message names it and says to fix or remove it. Fixing or removing
    it changes the source's description (its files' sha256), so the unfinished preparation is removed with it."""


class Source:
    """A document stream in pieces. `description` (JSON) identifies the data for resume and the manifest;
    open_dataset() gives a datasets.IterableDataset whose rows have a 'text' field and whose shards (one per input
    file) are the pieces; `files` are local files whose sha256 joins the description. Everything is picklable
    (module-level functions), so worker processes can be spawned as well as forked."""

    def __init__(self, description, open_dataset, check=None, files=(), pieces=None):
        self.description, self.open_dataset, self.files = description, open_dataset, list(files)
        self.pieces = pieces or len(self.files) or None  # None: ask the dataset (the hub's file list)
        self.check = check or _nothing_to_check  # raises DataError at once if the source cannot be read


def _nothing_to_check():
    pass


def _quiet_datasets():
    import datasets

    datasets.disable_progress_bars()
    # critical, not error: an unreadable file is logged as an error, then raised, and the DataError says it once
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    return datasets


def _env_true(name):
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _check_hub():
    # Fail in well under a second when the hub cannot be reached; datasets itself retries for ~23 s.
    if _env_true("HF_HUB_OFFLINE") or _env_true("HF_DATASETS_OFFLINE"):
        raise DataError(f"cannot stream {FINEWEB_EDU_REPO} because offline mode is on (HF_HUB_OFFLINE / "
                        f"HF_DATASETS_OFFLINE); {OFFLINE_HINT}")
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=5).close()
    except OSError as exc:
        raise DataError(f"cannot reach the Hugging Face hub at {endpoint.hostname}:{port} ({exc.__class__.__name__})"
                        f" to stream {FINEWEB_EDU_REPO}; {OFFLINE_HINT}") from None


def _open_hub(config):
    _check_hub()
    datasets = _quiet_datasets()
    try:
        return datasets.load_dataset(FINEWEB_EDU_REPO, name=config, split="train", streaming=True)
    except (ConnectionError, OSError) as exc:
        raise DataError(f"could not open {FINEWEB_EDU_REPO} ({config}) on the hub: {exc}; {OFFLINE_HINT}") from None


def hub_source(version):
    """FineWeb-Edu sample `version` (10B, 100B or 350B) streamed from the Hugging Face hub; one piece per parquet
    file of the sample."""
    if version not in FINEWEB_EDU_CONFIGS:
        raise DataError(f"unknown FineWeb-Edu version {version!r}; choose one of {', '.join(FINEWEB_EDU_CONFIGS)}")
    config = FINEWEB_EDU_CONFIGS[version]
    return Source({"kind": "hub", "dataset": FINEWEB_EDU_REPO, "config": config},
                  functools.partial(_open_hub, config), _check_hub)


def _open_files(builder, paths, pattern, kwargs):
    datasets = _quiet_datasets()
    try:
        return datasets.load_dataset(builder, data_files=paths, split="train", streaming=True, **kwargs)
    except Exception as exc:  # datasets raises many types for unreadable files
        raise BadInput(f"could not read --files {pattern!r} as {FORMAT_NAMES[builder]} ({exc}); fix or remove the "
                       f"file that is not {FORMAT_NAMES[builder]}, then run the same command again") from None


def files_source(pattern, txt_sample_by="document"):
    """Local files matching a glob (** allowed), in sorted path order, read through datasets; one piece per file."""
    paths = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not paths:
        raise DataError(f"no files match --files {pattern!r}; check the path, and quote the pattern so the shell "
                        f"does not expand it")
    kinds = {os.path.splitext(p)[1].lower() for p in paths}
    unknown = kinds - set(LOCAL_BUILDERS)
    if unknown:
        raise DataError(f"--files {pattern!r} matched files of type {', '.join(sorted(unknown))}; supported are "
                        f"{', '.join(LOCAL_BUILDERS)}: narrow the pattern")
    builders = {LOCAL_BUILDERS[k] for k in kinds}
    if len(builders) > 1:
        raise DataError(f"--files {pattern!r} mixes {', '.join(sorted(kinds))} files; prepare each kind in its "
                        f"own run (or convert them to one kind)")
    builder = builders.pop()
    kwargs = {"sample_by": txt_sample_by} if builder == "text" else {}
    description = {"kind": "files", "pattern": pattern, "format": builder}
    if builder == "text":
        description["txt_sample_by"] = txt_sample_by
    return Source(description, functools.partial(_open_files, builder, paths, pattern, kwargs), files=paths)


def describe(source, threads=1):
    """The source's description; local files are known by content, not path and size (a file edited in place
    between an interrupted run and its resume must not mix old and new shards). hashlib releases the GIL, so
    threads hash several files at once."""
    if not source.files:
        return source.description
    with ThreadPoolExecutor(max(1, min(threads, len(source.files)))) as pool:
        digests = list(pool.map(file_sha256, source.files))
    files = [[p, os.path.getsize(p), d] for p, d in zip(source.files, digests)]
    return {**source.description, "files": files}


# ---- worker side: one piece of the input into the scratch folder's parts/ ----------------------------------------

_worker = {"source": None, "dataset": None, "counter": None}


def _init_worker(source, tokenizer_name, counter):
    tokenization.init_worker(tokenizer_name)
    _worker.update(source=source, dataset=None, counter=counter)


def _too_large(file, description, exc):
    """The BadInput for a file with one document (or line) too large to read at once: Arrow holds at most 2 GiB in
    one string column chunk, and a 3 GB file read as one document ends in ArrowCapacityError or MemoryError."""
    size = f" ({os.path.getsize(file):,} bytes)" if os.path.isfile(file) else ""
    by = description.get("txt_sample_by")
    other = {"document": " or read it by paragraph (--txt-sample-by paragraph, each blank-line-separated paragraph "
                         "one document)", "paragraph": " or read it by line (--txt-sample-by line)"}.get(by, "")
    return BadInput(f"{file}{size} holds a {'document' if by in (None, 'document') else by} too large to read at once "
                    f"({exc.__class__.__name__}); split it into files of a few hundred MB at line ends, e.g. `split -C "
                    f"256M --additional-suffix=.txt {file} {file}.part_`, and prepare those (--files "
                    f"'{file}.part_*.txt'){other}")


def _document_batches(rows, description, file=None, empty=None):
    """The rows' texts in batches of DOCS_PER_BATCH. file: the local file the rows come from (a piece of a --files
    source), named when it cannot be read. empty: a list whose first item counts the rows without text (null, a
    missing 'text' among rows that have it, or ""), which become empty documents."""
    texts, where = [], file or json.dumps(description)[:200]
    try:
        for number, row in enumerate(rows, 1):
            if "text" not in row:
                raise BadInput(f"the rows of {where} have no 'text' field (fields: {', '.join(row)}); give files "
                               f"whose documents are in 'text'")
            text = row["text"]
            if text is not None and not isinstance(text, str):
                raise BadInput(f"the 'text' of row {number} of {where} is {json.dumps(text, default=str)[:40]}, not a "
                               "string; fix or remove that row, then run the same command again")
            # null is an empty document, as "" is: datasets gives null, too, for a row without 'text' among rows with it
            texts.append(text or "")
            if not text and empty is not None:
                empty[0] += 1
            if len(texts) == DOCS_PER_BATCH:
                yield texts
                texts = []
    except DataError:
        raise
    except Exception as exc:  # local files that do not parse, or network or file errors while streaming
        if file is not None and (isinstance(exc, MemoryError) or exc.__class__.__name__ == "ArrowCapacityError"):
            raise _too_large(file, description, exc) from None
        if file is not None and not isinstance(exc, OSError):  # bad input: a re-run reads the same bytes again
            raise BadInput(f"{file} cannot be read as {FORMAT_NAMES.get(description.get('format'), 'input')} "
                           f"({exc.__class__.__name__}: {exc}); fix or remove that file, then run the same command "
                           "again") from None
        raise DataError(f"reading the documents failed ({exc.__class__.__name__}: {exc}); re-run the same "
                        f"command to continue from the finished pieces") from None
    if texts:
        yield texts


def _piece_path(parts, index, part=None):
    name = f"piece_{index:06d}.json" if part is None else f"piece_{index:06d}_{part:06d}.bin"
    return os.path.join(parts, name)


def _tokenize_piece(task):
    """Tokenise piece `index` of the source (its first `budget` tokens) into shards of at most shard_tokens in the
    folder `parts`, then write the piece's record (the marker that it is complete) and return it."""
    index, n_pieces, parts, shard_tokens, budget = task
    source = _worker["source"]
    if _worker["dataset"] is None:  # opened once per worker: the hub resolves its file list here
        _worker["dataset"] = source.open_dataset()
    rows = _worker["dataset"].shard(num_shards=n_pieces, index=index, contiguous=True)
    eot = tokenization._worker_tokenizer.eot_token
    buffer = np.empty(int(min(shard_tokens, budget or shard_tokens)), dtype=np.uint16)
    shards, fill, total = [], 0, 0

    def flush():
        path = _piece_path(parts, index, len(shards))
        sha = write_shard(path, buffer[:fill], prepared=True)
        shards.append({"file": os.path.basename(path), "tokens": fill, "sha256": sha,
                       "documents": int(np.count_nonzero(buffer[:fill] == eot))})

    # a --files source has one piece per file, in sorted order (files_source)
    file = source.files[index] if source.description.get("kind") == "files" else None
    empty = [0]
    for texts in _document_batches(rows, source.description, file, empty):
        flat, _ = encode_documents(texts)
        pos = 0
        while pos < len(flat) and (budget is None or total < budget):
            take = min(len(buffer) - fill, len(flat) - pos, len(flat) if budget is None else budget - total)
            buffer[fill:fill + take] = flat[pos:pos + take]
            fill, pos, total = fill + take, pos + take, total + take
            if fill == len(buffer):
                flush()
                fill = 0
        _report(pos)
        if budget is not None and total >= budget:
            break  # the stream never needs more of this piece: every token past here is past --max-tokens
    if fill:
        flush()
    record = {"piece": index, "tokens": total, "shards": shards, "empty_documents": empty[0]}
    _write_json(_piece_path(parts, index), record)
    return record


def _report(tokens):
    counter = _worker["counter"]
    if counter is None:
        return
    if callable(counter):
        counter(tokens)
        return
    with counter.get_lock():
        counter.value += tokens


# ---- main side ---------------------------------------------------------------------------------------------------

def _write_json(path, data):
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


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        out_dir = os.path.dirname(path)
        raise DataError(f"{path} is damaged ({error}); delete {out_dir} and prepare again") from None


def _finished_pieces(parts):
    """The records of the pieces an earlier run completed, each checked on disk (header and size: the shards were
    fsynced before their record, so a kill cannot leave a recorded shard partial); everything else in the folder
    `parts` (the scratch folder's own: a piece cut off by a kill) is deleted."""
    os.makedirs(parts, exist_ok=True)
    done = {}
    for name in sorted(os.listdir(parts)):
        if name.endswith(".json"):
            record = _read_json(os.path.join(parts, name))
            try:
                intact = all(read_header(os.path.join(parts, s["file"])) == s["tokens"] for s in record["shards"])
            except (OSError, DataError):
                intact = False
            if intact:
                done[record["piece"]] = record
    keep = {os.path.basename(s["file"]) for r in done.values() for s in r["shards"]}
    keep |= {os.path.basename(_piece_path(parts, i)) for i in done}
    for name in os.listdir(parts):
        if name not in keep:
            os.remove(os.path.join(parts, name))
    return done


def _enough(done, max_tokens):
    """How many pieces, from the first, hold max_tokens between them: None without max_tokens, or while a piece
    that may be needed is not finished (then all pieces are needed, or more must be read)."""
    total = 0
    for i in range(len(done) + 1):
        if i not in done:
            return None
        total += done[i]["tokens"]
        if max_tokens is not None and total >= max_tokens:
            return i + 1
    return None


def _tokenize_pieces(source, parts, tokenizer, n_pieces, workers, config, done, bar, stop_after_pieces):
    """Tokenise the pieces not yet done, in order, with `workers` processes, until the stream has all it needs."""
    todo = [i for i in range(n_pieces) if i not in done]
    budget = config["max_tokens"]
    tasks = [(i, n_pieces, parts, config["shard_tokens"], budget) for i in todo]
    finished = 0

    def take(record):
        nonlocal finished
        done[record["piece"]] = record
        finished += 1
        if stop_after_pieces is not None and finished >= stop_after_pieces:
            raise KeyboardInterrupt(f"stopped after {stop_after_pieces} pieces (test hook)")
        return len(done) == n_pieces or _enough(done, budget) is not None

    if not tasks or _enough(done, budget) is not None:
        return
    if workers <= 1 or len(tasks) == 1:  # in this process: no fork for one piece (e.g. the embedded corpus)
        _init_worker(source, tokenizer, bar.update if bar is not None else None)
        try:
            for task in tasks:
                if take(_tokenize_piece(task)):
                    return
        finally:
            _worker.update(source=None, dataset=None, counter=None)
        return
    # fork where there is one: workers start in milliseconds with the tokenizer loaded (spawn re-imports
    # everything, seconds per worker); nothing in this process has opened a dataset (or its threads) yet.
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    counter = context.Value("q", 0)
    shown = 0
    with context.Pool(min(workers, len(tasks)), initializer=_init_worker,
                      initargs=(source, tokenizer, counter)) as pool:
        results = pool.imap(_tokenize_piece, tasks)  # in piece order, so the stream's prefix is known
        while True:
            try:
                record = results.next(timeout=1.0)
            except multiprocessing.TimeoutError:
                if bar is not None:
                    bar.update(counter.value - shown)
                    shown = counter.value
                continue
            except StopIteration:
                return
            if take(record):
                return  # leaving the `with` stops the workers still on pieces the stream does not need


def _plan(done, n_used, val_tokens, max_tokens):
    """The final shards, in stream order: each is a whole piece shard or a cut [start, start + tokens) of one."""
    plan, pos, limit = [], 0, float("inf") if max_tokens is None else max_tokens
    for i in range(n_used):
        for j, part in enumerate(done[i]["shards"]):
            lo, hi = pos, pos + part["tokens"]
            for split, a, b in (("val", lo, min(hi, val_tokens, limit)), ("train", max(lo, val_tokens), min(hi, limit))):
                if a < b:
                    whole = (a, b) == (lo, hi)
                    plan.append({"file": f"{split}_{len(plan):06d}.bin", "split": split, "tokens": int(b - a),
                                 "from": part["file"], "piece": i, "part": j, "start": int(a - lo),
                                 "sha256": part["sha256"] if whole else None,
                                 "documents": part["documents"] if whole else None})
            pos = hi
    return plan


def _name_shards(out_dir, parts, plan, eot):
    """Carry out the plan: move whole piece shards from `parts` into out_dir, write the cut ones (in `parts`, then
    moved, so out_dir only ever gains whole files). Every step can be repeated, so a run killed half-way through
    re-runs the plan from finalize.json."""
    by_source = {}
    for entry in plan:
        by_source.setdefault(entry["from"], []).append(entry)
    for source, entries in by_source.items():
        src = os.path.join(parts, source)
        if os.path.exists(src):
            if len(entries) == 1 and entries[0]["sha256"] is not None:
                os.replace(src, os.path.join(out_dir, entries[0]["file"]))
                continue
            tokens = open_shard(src)
            for entry in entries:
                piece = tokens[entry["start"]:entry["start"] + entry["tokens"]]
                cut = os.path.join(parts, entry["file"])
                entry["sha256"] = write_shard(cut, piece, prepared=True)
                os.replace(cut, os.path.join(out_dir, entry["file"]))
                entry["documents"] = int(np.count_nonzero(piece == eot))
            del tokens
            os.remove(src)
            continue
        for entry in entries:  # done before a kill: the named files are complete (written whole, then renamed)
            dst = os.path.join(out_dir, entry["file"])
            if not os.path.exists(dst):
                raise DataError(f"{src} and {dst} are both missing, so {out_dir} cannot be completed; delete it and "
                                "prepare again")
            if entry["sha256"] is None or entry["documents"] is None:
                entry["sha256"] = file_sha256(dst)
                entry["documents"] = int(np.count_nonzero(open_shard(dst) == eot))


def _scratch_folders(out_dir):
    """[(folder, journal)] for out_dir's scratch folders: a name starting with SCRATCH_PREFIX, and a journal that
    carries SCRATCH_MARK. Nothing else in out_dir is taken for a preparation's own."""
    found = []
    for name in sorted(os.listdir(out_dir)):
        folder = os.path.join(out_dir, name)
        journal_path = os.path.join(folder, JOURNAL)
        if name.startswith(SCRATCH_PREFIX) and not os.path.islink(folder) and os.path.isfile(journal_path):
            journal = _read_json(journal_path)
            if isinstance(journal, dict) and journal.get("written_by") == SCRATCH_MARK:
                found.append((folder, journal))
    return found


def _new_scratch(out_dir, journal):
    """A fresh scratch folder in out_dir (a name mkdtemp made up) with its journal; returns the folder."""
    folder = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=out_dir)
    _write_json(os.path.join(folder, JOURNAL), {"written_by": SCRATCH_MARK, **journal})
    return folder


def _remove_our_shards(out_dir):
    """Remove the shards in out_dir that carry the mark of a preparation's (an earlier one's, whose manifest.json
    was deleted): no other file of out_dir is a preparation's to remove."""
    for name in os.listdir(out_dir):
        if name.endswith(".bin") and is_prepared_shard(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))


def _remove_unfinished(out_dir, scratch, created):
    """After a preparation that cannot succeed: remove its scratch folder, so nothing looks resumable, and out_dir
    if this run created it and nothing else is in it."""
    shutil.rmtree(scratch, ignore_errors=True)
    if created and not os.listdir(out_dir):
        os.rmdir(out_dir)


def _repair_shards(source, out_dir, manifest, tok, workers, progress_bar):
    """Rewrite exactly the shards of a finished preparation that are missing or no longer match their sha256:
    each from its piece, tokenised again."""
    config = manifest["config"]

    def intact(shard):
        path = os.path.join(out_dir, shard["file"])
        try:
            return read_header(path) == shard["tokens"] and file_sha256(path) == shard["sha256"]
        except (OSError, DataError):
            return False

    with ThreadPoolExecutor(max(1, workers)) as pool:  # hashing releases the GIL
        damaged = [s for s, ok in zip(manifest["shards"], pool.map(intact, manifest["shards"])) if not ok]
    if not damaged:
        return
    if any("piece" not in shard for shard in damaged):
        raise DataError(f"{len(damaged)} shard(s) of {out_dir} are missing or damaged, and its manifest.json (written "
                        f"by an older version) does not record where each shard comes from; delete {out_dir} and "
                        "prepare it again")
    pieces = sorted({shard["piece"] for shard in damaged})
    n_pieces = manifest["pieces"]
    scratch = _new_scratch(out_dir, {"repair": True})
    _init_worker(source, config["tokenizer"], None)
    try:
        records = {i: _tokenize_piece((i, n_pieces, scratch, config["shard_tokens"], config["max_tokens"]))
                   for i in pieces}
    finally:
        _worker.update(source=None, dataset=None, counter=None)
    for shard in damaged:
        part = open_shard(os.path.join(scratch, records[shard["piece"]]["shards"][shard["part"]]["file"]))
        rewritten = os.path.join(scratch, shard["file"])
        sha = write_shard(rewritten, part[shard["start"]:shard["start"] + shard["tokens"]], prepared=True)
        del part
        if sha != shard["sha256"]:
            shutil.rmtree(scratch)
            raise DataError(f"rewriting {shard['file']} gave other tokens than when {out_dir} was prepared: the "
                            f"source has changed since; delete {out_dir} and prepare it again")
        os.replace(rewritten, os.path.join(out_dir, shard["file"]))
    shutil.rmtree(scratch)
    if progress_bar:
        print(f"rewrote {len(damaged)} damaged or missing shard(s) of {out_dir}: "
              + ", ".join(shard["file"] for shard in damaged), file=sys.stderr)


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


def available_cores():
    """Cores this process may use (a SLURM or taskset CPU mask counts, not the machine's size)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def prepare(source, out_dir, tokenizer="gpt2", val_tokens=DEFAULT_FILES_VAL_TOKENS,
            shard_tokens=DEFAULT_SHARD_TOKENS, max_tokens=None, workers=None, progress_bar=True,
            stop_after_pieces=None):
    """Prepare `source` into shards under out_dir and return the manifest (see the module docstring).

    workers: processes that tokenise pieces (default: the available cores; 1 tokenises in this process).
    stop_after_pieces (for tests) raises KeyboardInterrupt after that many pieces, as Ctrl-C would."""
    if shard_tokens < 1 or val_tokens < 0 or (max_tokens is not None and max_tokens < 1):
        raise DataError("--shard-tokens and --max-tokens must be positive and --val-tokens non-negative")
    _refuse_input_inside(source, out_dir)
    workers = available_cores() if workers is None else workers
    source.check()
    tok = get_tokenizer(tokenizer)
    if tok.n_vocab > 2**16:
        raise DataError(f"tokenizer {tokenizer} has {tok.n_vocab} ids; uint16 shards hold at most 65536")
    try:
        config = {"source": describe(source, workers), "tokenizer": tokenizer, "val_tokens": val_tokens,
                  "shard_tokens": shard_tokens, "max_tokens": max_tokens}
        with preparation_lock(out_dir):
            created = not os.path.isdir(out_dir)
            return _prepare(source, out_dir, tok, config, workers, progress_bar, stop_after_pieces, created)
    except OSError as error:  # a full disk or a read-only directory: what was completed stays usable for a re-run
        raise _write_error(out_dir, error) from None


def _refuse_input_inside(source, out_dir):
    """A DataError if an input file lies inside out_dir: the preparation would write beside its own input (and an
    earlier version deleted it there)."""
    root = os.path.realpath(out_dir) + os.sep
    inside = [path for path in source.files if os.path.realpath(path).startswith(root)]
    if inside:
        raise DataError(f"the input {inside[0]} lies inside --out {out_dir}; give --out a folder that holds none of "
                        "the input files")


def _write_error(out_dir, error):
    """The DataError for an OSError while preparing out_dir, after removing the temporary files it left in its
    scratch folders. A file of out_dir that vanished (or the directory itself) was removed by someone else, not by
    a full disk."""
    with contextlib.suppress(OSError, DataError):
        for scratch, _ in _scratch_folders(out_dir):
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


def _prepare(source, out_dir, tok, config, workers, progress_bar, stop_after_pieces, created):
    os.makedirs(out_dir, exist_ok=True)
    manifest_path = os.path.join(out_dir, "manifest.json")
    scratches = _scratch_folders(out_dir)
    for folder, journal in scratches:  # a repair cut short is redone whole
        if journal.get("repair"):
            shutil.rmtree(folder)
    scratches = [(folder, journal) for folder, journal in scratches if not journal.get("repair")]
    if os.path.exists(manifest_path):
        manifest = read_manifest(out_dir)  # a DataError if it is damaged
        if manifest.get("config") == config:
            for folder, _ in scratches:  # a run killed after writing the manifest
                shutil.rmtree(folder)
            _repair_shards(source, out_dir, manifest, tok, workers, progress_bar)
            if progress_bar:
                print(f"{out_dir} is already prepared ({manifest['tokens']['total']:,} tokens)", file=sys.stderr)
            return manifest
        raise DataError(f"{out_dir} already holds data prepared with other arguments; use another --out or delete it")
    scratch = _resume_or_start(source, out_dir, config, scratches)
    started = time.time()
    parts, finalize_path = os.path.join(scratch, PARTS), os.path.join(scratch, "finalize.json")
    if not os.path.exists(finalize_path):
        plan = _tokenize_and_plan(source, out_dir, scratch, config, workers, progress_bar, stop_after_pieces, created)
        _write_json(finalize_path, plan)
    plan = _read_json(finalize_path)
    _name_shards(out_dir, parts, plan, tok.eot_token)
    counts = {split: sum(e["tokens"] for e in plan if e["split"] == split) for split in ("val", "train")}
    counts["total"] = counts["val"] + counts["train"]
    empty = 0  # each piece's record knows its documents without text (read before the scratch folder goes)
    for piece in sorted({e["piece"] for e in plan}):
        with contextlib.suppress(OSError, DataError):  # (a record of an older version has no count)
            empty += _read_json(_piece_path(parts, piece)).get("empty_documents", 0)
    manifest = {
        "format": "llm.c uint16 token shards: 256 x int32 header (magic 20240520, version 1, token count), "
                  "then uint16 tokens",
        "source": config["source"], "tokenizer": config["tokenizer"], "vocab_size": tok.n_vocab,
        "eot_token": tok.eot_token, "documents": sum(e["documents"] for e in plan), "tokens": counts,
        "shards": [{"file": e["file"], "split": e["split"], "tokens": e["tokens"], "sha256": e["sha256"],
                    "piece": e["piece"], "part": e["part"], "start": e["start"]} for e in plan],
        "pieces": _read_json(os.path.join(scratch, JOURNAL))["pieces"], "config": config, "empty_documents": empty,
    }
    _write_json(os.path.join(scratch, "manifest.json"), manifest)
    os.replace(os.path.join(scratch, "manifest.json"), manifest_path)
    shutil.rmtree(scratch)
    if progress_bar:
        print(f"wrote {len(plan)} shards to {out_dir}: {counts['val']:,} val + {counts['train']:,} train tokens "
              f"from {manifest['documents']:,} documents ({time.time() - started:.1f} s this run)", file=sys.stderr)
    if empty:  # said even with --quiet: rows without text are usually a mistake in the input (a wrong field name)
        print(f"note: {empty:,} of the {manifest['documents']:,} documents had no text (a null 'text', no 'text' "
              "field among rows that have one, or an empty string); each is an <|endoftext|> token alone in the "
              "shards", file=sys.stderr)
    return manifest


def _resume_or_start(source, out_dir, config, scratches):
    """The scratch folder of an unfinished preparation of out_dir with this config, or a new one (after refusing
    .bin files in out_dir that no preparation made, and removing those an earlier one did)."""
    for folder, journal in scratches:
        if journal.get("config") == config:
            return folder
    if scratches:
        raise DataError(f"{out_dir} holds an unfinished preparation with other arguments (in {scratches[0][0]}); use "
                        f"the same arguments to resume it, or another --out (or delete {scratches[0][0]}) to start a "
                        "new one")
    # Only our own marked shards may be replaced (a finished preparation whose damaged manifest.json the user
    # deleted, as its error message advises, to prepare the folder afresh); a name alone proves nothing.
    foreign = sorted(name for name in os.listdir(out_dir)
                     if name.endswith(".bin") and not is_prepared_shard(os.path.join(out_dir, name)))
    if foreign:
        raise DataError(f"{out_dir} already holds {len(foreign)} .bin file(s) that no preparation made "
                        f"({foreign[0]}, ...), which preparing there would delete; give --out a new folder, or "
                        f"record shards made elsewhere with `{adopt_command(out_dir)}`")
    _remove_our_shards(out_dir)
    return _new_scratch(out_dir, {"config": config, "pieces": source.pieces or _count_pieces(source)})


def _tokenize_and_plan(source, out_dir, scratch, config, workers, progress_bar, stop_after_pieces, created):
    """Tokenise the pieces not yet done into the scratch folder and return the plan of the final shards; a
    preparation that cannot succeed removes its scratch folder before it says why."""
    n_pieces = _read_json(os.path.join(scratch, JOURNAL))["pieces"]
    done = _finished_pieces(os.path.join(scratch, PARTS))
    bar = None
    if progress_bar:
        from tqdm import tqdm

        bar = tqdm(total=config["max_tokens"], initial=sum(r["tokens"] for r in done.values()), unit="tok",
                   unit_scale=True, dynamic_ncols=True, mininterval=1.0,
                   desc=f"tokenizing {n_pieces} piece(s) ({workers} worker{'s' * (workers > 1)})")
    try:
        _tokenize_pieces(source, os.path.join(scratch, PARTS), config["tokenizer"], n_pieces, workers, config, done,
                         bar, stop_after_pieces)
    except BadInput:
        _remove_unfinished(out_dir, scratch, created)  # the fixed input is another source: nothing could resume
        raise
    finally:
        if bar is not None:
            bar.close()
    n_used = _enough(done, config["max_tokens"]) or n_pieces
    plan = _plan(done, n_used, config["val_tokens"], config["max_tokens"])
    counts = {split: sum(e["tokens"] for e in plan if e["split"] == split) for split in ("val", "train")}
    if counts["train"] == 0:
        _remove_unfinished(out_dir, scratch, created)  # the same command would fail the same way: leave nothing
        documents = sum(s["documents"] for i in range(n_used) for s in done[i]["shards"])
        if sum(done[i]["tokens"] for i in range(n_used)) <= documents:  # each document gave only its eot token
            raise DataError(f"the source holds no text ({documents:,} document(s), all empty); check --files "
                            f"(and the 'text' field), then prepare again")
        raise DataError(f"the source has only {counts['val']:,} tokens and all went to validation "
                        f"(--val-tokens {config['val_tokens']:,}); prepare it again with a smaller --val-tokens")
    return plan


def _count_pieces(source):
    """The number of pieces, found in a child process: opening a hub dataset starts threads, which must not exist
    in this process when it forks the workers."""
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with context.Pool(1) as pool:
        return pool.apply(_num_shards, (source,))


def _num_shards(source):
    return source.open_dataset().num_shards


# ---- the embedded default corpus --------------------------------------------------------------------------------

DEFAULT_CORPUS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_corpus.jsonl.xz")
# The validation split: the first documents of the corpus's fixed shuffle. With GPT-2 tokens 65,536 tokens are 171
# documents; with bytes 393,216 bytes (384 KiB, 14% of the corpus) are 272 documents, 26 of them at least 4,097
# bytes long, so that loss at 8 x 512 can be read inside documents (eval/extrapolation.py --documents).
DEFAULT_CORPUS_VAL_TOKENS = {"gpt2": 65_536, "byte": 393_216}
DEFAULT_CORPUS_SHARD_TOKENS = 1_000_000


def default_corpus_source(work_dir):
    """The embedded corpus (data/default_corpus.jsonl.xz), unpacked into work_dir for datasets to read."""
    import hashlib

    with open(DEFAULT_CORPUS_FILE, "rb") as f:
        packed = f.read()
    digest = hashlib.sha256(packed).hexdigest()
    unpacked = os.path.join(work_dir, f"default_corpus-{digest[:12]}.jsonl")
    return Source({"kind": "default", "file": "data/default_corpus.jsonl.xz", "sha256": digest},
                  functools.partial(_open_default, unpacked), pieces=1)


def _open_default(unpacked):
    import lzma

    if not os.path.exists(unpacked):
        tmp = f"{unpacked}.{os.getpid()}.part"
        with open(DEFAULT_CORPUS_FILE, "rb") as f, open(tmp, "wb") as out:
            out.write(lzma.decompress(f.read()))
        os.replace(tmp, unpacked)
    datasets = _quiet_datasets()
    return datasets.load_dataset("json", data_files=[unpacked], split="train", streaming=True)


def _drop_outdated_cache(out_dir, expected):
    """Remove out_dir's manifest.json and the shards it lists when they are a cache of another version of the
    embedded corpus (e.g. after a git pull), or a damaged manifest (then prepare() replaces the marked shards it
    finds); any other file of out_dir is left as it is."""
    manifest_path = os.path.join(out_dir, "manifest.json")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
        # another tool's manifest (a list, say) is no cache of ours: prepare() then says what it is
        config = manifest.get("config") if isinstance(manifest, dict) else None
        config = config if isinstance(config, dict) else {}
    except ValueError:  # a damaged manifest of this cache: rebuild it
        manifest, config = {}, {"source": {"kind": "default"}}
    if config == expected or config.get("source", {}).get("kind") != "default":
        return
    listed = [os.path.join(out_dir, os.path.basename(str(shard.get("file", ""))))
              for shard in manifest.get("shards", []) if isinstance(shard, dict)]
    for path in listed:
        if path.endswith(".bin") and os.path.isfile(path):
            os.remove(path)
    os.remove(manifest_path)


def ensure_default_corpus(out_dir=None, tokenizer="gpt2", progress_bar=True):
    """Prepare the embedded English corpus once (offline) and return its directory (a cache: a directory
    prepared from another version of the corpus is rebuilt)."""
    if out_dir is None:
        suffix = "" if tokenizer == "gpt2" else f"-{tokenizer}"
        out_dir = os.path.join(REPO_ROOT, "data_cache", f"default{suffix}")
    source = default_corpus_source(out_dir)
    manifest_path = os.path.join(out_dir, "manifest.json")
    expected = {"source": source.description, "tokenizer": tokenizer, "val_tokens": DEFAULT_CORPUS_VAL_TOKENS[tokenizer],
                "shard_tokens": DEFAULT_CORPUS_SHARD_TOKENS, "max_tokens": None}
    try:
        with preparation_lock(out_dir):  # the check and the rebuild too: another process may be preparing it now
            if os.path.exists(manifest_path):
                _drop_outdated_cache(out_dir, expected)
            os.makedirs(out_dir, exist_ok=True)
            prepare(source, out_dir, tokenizer=tokenizer, val_tokens=expected["val_tokens"],
                    shard_tokens=expected["shard_tokens"], progress_bar=progress_bar)
    except OSError as error:
        raise _write_error(out_dir, error) from None
    return out_dir


# ---- command line -----------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--dataset", choices=["fineweb-edu"], help="a hub dataset, streamed")
    which.add_argument("--files", help="glob of local .jsonl/.json/.parquet (with a 'text' field) or .txt files")
    which.add_argument("--default", action="store_true", help="the embedded English corpus (offline)")
    which.add_argument("--verify", metavar="DIR", help="read every shard of a prepared directory now and check its "
                                                       "sha256 and token ids (training does this once per shard)")
    which.add_argument("--adopt", metavar="DIR", help="record the sha256 of every shard of an llm.c-style directory "
                                                      "made elsewhere (GPT-2 tokens, *train_*.bin / *val_*.bin) in a "
                                                      "manifest.json, so that training can tell damage from data")
    parser.add_argument("--version", default="10B", choices=sorted(FINEWEB_EDU_CONFIGS),
                        help="FineWeb-Edu sample size (default 10B; the paper used 100B)")
    parser.add_argument("--out", help="output directory (default data_cache/<name>)")
    parser.add_argument("--tokenizer", default="gpt2", choices=TOKENIZER_NAMES)
    parser.add_argument("--val-tokens", type=int, default=None,
                        help=f"validation tokens, taken from the start of the stream (default {DEFAULT_HUB_VAL_TOKENS:,}"
                             f" for the hub, {DEFAULT_FILES_VAL_TOKENS:,} for --files)")
    parser.add_argument("--shard-tokens", type=int, default=None,
                        help=f"most tokens per shard (default {DEFAULT_SHARD_TOKENS:,}; each input file starts a new "
                             "one)")
    parser.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens in all")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes, each tokenising whole input files (default: the available cores; 1 "
                             "tokenises in this process)")
    parser.add_argument("--txt-sample-by", default="document", choices=["document", "paragraph", "line"],
                        help="what one document of a .txt file is (default: the whole file)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args, extra = parser.parse_known_args(argv)
    if extra and args.files and all(os.path.exists(path) for path in extra):
        example = os.path.join(os.path.dirname(args.files), "*" + os.path.splitext(args.files)[1])
        parser.error(f"--files takes one pattern, but the shell expanded it into {len(extra) + 1} paths; quote it so "
                     f"that this script expands it, e.g. --files '{example}'")
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _refuse_fixed_layout_flags(args):
    """--default prepares the embedded corpus with its own fixed split and shard size (what the quickstart's cache
    holds): a DataError naming the flags given with it, which it would otherwise ignore."""
    given = [flag for flag in ("--val-tokens", "--max-tokens", "--shard-tokens")
             if getattr(args, flag[2:].replace("-", "_")) is not None]
    if given:
        raise DataError(f"--default prepares the embedded corpus with its fixed split and shard size, so it does not "
                        f"take {', '.join(given)}; prepare the corpus file {DEFAULT_CORPUS_FILE} with --files (after "
                        "unpacking it with xz -dk) to choose those")


def verify_command(data_dir, workers=None):
    """--verify DIR: every shard read in full (its sha256 against manifest.json, its token ids), in parallel."""
    from data.manifest import repair_hint
    from data.verify import verify_all

    started = time.time()
    count, size, problems = verify_all(data_dir, workers or available_cores())
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} of {count} shard(s) of {data_dir} are damaged or missing; {repair_hint(data_dir)}",
              file=sys.stderr)
        return 2
    print(f"{data_dir}: all {count} shard(s) intact: sha256 as recorded, token ids within the tokenizer's "
          f"({size / 1e9:.2f} GB read in {time.time() - started:.1f} s)")
    return 0


def adopt(data_dir):
    """Write manifest.json for a manifest-free llm.c-style directory of GPT-2 token shards, from what they hold now
    (adopt a copy you trust): from then on a changed byte is caught. Returns the manifest."""
    from data.manifest import GPT2_VOCAB_SIZE
    from data.verify import check_content
    path = os.path.join(data_dir, "manifest.json")
    if os.path.exists(path):
        raise DataError(f"{data_dir} already has a manifest.json; `python -m data.prepare --verify {data_dir}` checks "
                        "its shards against it")
    shards = []
    for split in ("val", "train"):
        for shard in split_files(data_dir, split):  # by name: llm.c's fineweb_val_000000.bin, ...
            count = read_header(shard, redo="replace it with an intact copy, then adopt the directory")
            result = check_content(shard)
            if isinstance(result, str):
                raise DataError(result)
            _, digest, largest = result
            if largest >= GPT2_VOCAB_SIZE:
                raise DataError(f"shard {shard} holds token id {largest}, beyond GPT-2's {GPT2_VOCAB_SIZE} ids: it is "
                                "damaged or not GPT-2 tokens; replace it with an intact copy, then adopt again")
            shards.append({"file": os.path.basename(shard), "split": split, "tokens": count, "sha256": digest})
    counts = {split: sum(s["tokens"] for s in shards if s["split"] == split) for split in ("val", "train")}
    manifest = {"format": "llm.c uint16 token shards: 256 x int32 header (magic 20240520, version 1, token count), "
                          "then uint16 tokens",
                "source": {"kind": "adopted"}, "tokenizer": "gpt2", "vocab_size": GPT2_VOCAB_SIZE, "eot_token": 50256,
                "tokens": {**counts, "total": counts["val"] + counts["train"]}, "shards": shards}
    try:
        _write_json(path, manifest)
    except OSError as error:
        raise DataError(f"cannot write {path} ({error.strerror or error}); for a read-only directory, make a "
                        f"writable one of links to its shards (mkdir NEW && ln -s {os.path.abspath(data_dir)}/*.bin "
                        "NEW/) and adopt that") from None
    return manifest


def _stop_now(signum, frame):
    # Ctrl-C or kill: stop the workers and leave at once. Unwinding through Pool.terminate() can hang while its
    # task thread is blocked on a full pipe, and nothing needs cleaning up: shards and records are only ever
    # replaced whole, and the next run deletes what an unfinished piece left.
    for child in multiprocessing.active_children():
        child.kill()
    print("interrupted: finished pieces are kept; run the same command again to continue", file=sys.stderr)
    os._exit(128 + signum)


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGINT, _stop_now)
    signal.signal(signal.SIGTERM, _stop_now)
    try:
        if args.verify:
            return verify_command(args.verify, args.workers)
        if args.adopt:
            manifest = adopt(args.adopt)
            print(f"{args.adopt}: recorded {len(manifest['shards'])} shard(s), {manifest['tokens']['total']:,} GPT-2 "
                  "tokens, in manifest.json; training now checks them against it")
            return 0
        if args.default:
            _refuse_fixed_layout_flags(args)
            out = ensure_default_corpus(args.out, tokenizer=args.tokenizer, progress_bar=not args.quiet)
            print(out)
            return 0
        if args.dataset:
            source = hub_source(args.version)
            out = args.out or os.path.join("data_cache", f"fineweb-edu-{args.version}")
            val_tokens = DEFAULT_HUB_VAL_TOKENS if args.val_tokens is None else args.val_tokens
        else:
            source = files_source(args.files, args.txt_sample_by)
            if not args.out:
                raise DataError("--files needs --out DIR, the directory for the shards")
            out = args.out
            val_tokens = DEFAULT_FILES_VAL_TOKENS if args.val_tokens is None else args.val_tokens
        shard_tokens = DEFAULT_SHARD_TOKENS if args.shard_tokens is None else args.shard_tokens
        prepare(source, out, tokenizer=args.tokenizer, val_tokens=val_tokens, shard_tokens=shard_tokens,
                max_tokens=args.max_tokens, workers=args.workers, progress_bar=not args.quiet)
        print(out)
        return 0
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
