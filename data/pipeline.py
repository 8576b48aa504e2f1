"""The tokenizing pipeline of data.prepare: the input's pieces tokenised into the scratch folder's parts/.

Each worker process takes whole pieces (one per input file): it reads its piece itself, tokenises each document as
<|endoftext|> + its tokens, writes the piece's tokens as shards of at most --shard-tokens to parts/, then the piece's
record (its shards' sizes, sha256 and end-of-text counts): a recorded piece is complete. The main process only hands
out piece numbers, in order, and stops once the stream holds all it needs.
"""
import contextlib
import json
import multiprocessing
import os
import sys

import numpy as np

from data import tokenizer as tokenization
from data.scratch import read_json, write_json
from data.shards import DataError, read_header, write_shard
from data.sources import FORMAT_NAMES, BadInput
from data.tokenizer import encode_documents

DOCS_PER_BATCH = 64  # documents tokenised together: fewer Python-level steps per token




_worker = {"source": None, "dataset": None, "counter": None}


def _init_worker(source, tokenizer_name, counter):
    tokenization.init_worker(tokenizer_name)
    _worker.update(source=source, dataset=None, counter=counter)


@contextlib.contextmanager
def worker_in_this_process(source, tokenizer_name, counter=None):
    """Make this process a worker (for tokenize_piece) while open: one piece, or a repair, needs no pool."""
    _init_worker(source, tokenizer_name, counter)
    try:
        yield
    finally:
        _worker.update(source=None, dataset=None, counter=None)


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


def piece_path(parts, index, part=None):
    name = f"piece_{index:06d}.json" if part is None else f"piece_{index:06d}_{part:06d}.bin"
    return os.path.join(parts, name)


def tokenize_piece(task):
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
        path = piece_path(parts, index, len(shards))
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
    write_json(piece_path(parts, index), record)
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


def finished_pieces(parts):
    """The records of the pieces an earlier run completed, each checked on disk (header and size: the shards were
    fsynced before their record, so a kill cannot leave a recorded shard partial); everything else in the folder
    `parts` (the scratch folder's own: a piece cut off by a kill) is deleted."""
    os.makedirs(parts, exist_ok=True)
    done = {}
    for name in sorted(os.listdir(parts)):
        if name.endswith(".json"):
            record = read_json(os.path.join(parts, name))
            try:
                intact = all(read_header(os.path.join(parts, s["file"])) == s["tokens"] for s in record["shards"])
            except (OSError, DataError):
                intact = False
            if intact:
                done[record["piece"]] = record
    keep = {os.path.basename(s["file"]) for r in done.values() for s in r["shards"]}
    keep |= {os.path.basename(piece_path(parts, i)) for i in done}
    for name in os.listdir(parts):
        if name not in keep:
            os.remove(os.path.join(parts, name))
    return done


def enough_pieces(done, max_tokens):
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


def tokenize_pieces(source, parts, tokenizer, n_pieces, workers, config, done, bar, stop_after_pieces):
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
        return len(done) == n_pieces or enough_pieces(done, budget) is not None

    if not tasks or enough_pieces(done, budget) is not None:
        return
    if workers <= 1 or len(tasks) == 1:  # in this process: no fork for one piece (e.g. the embedded corpus)
        with worker_in_this_process(source, tokenizer, bar.update if bar is not None else None):
            for task in tasks:
                if take(tokenize_piece(task)):
                    return
        return
    # fork where there is one: workers start in milliseconds with the tokenizer loaded (spawn re-imports
    # everything, seconds per worker); nothing in this process has opened a dataset (or its threads) yet.
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    counter = context.Value("q", 0)
    shown = 0
    with context.Pool(min(workers, len(tasks)), initializer=_init_worker,
                      initargs=(source, tokenizer, counter)) as pool:
        results = pool.imap(tokenize_piece, tasks)  # in piece order, so the stream's prefix is known
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


def count_pieces(source):
    """The number of pieces, found in a child process: opening a hub dataset starts threads, which must not exist
    in this process when it forks the workers."""
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with context.Pool(1) as pool:
        return pool.apply(_num_shards, (source,))


def _num_shards(source):
    return source.open_dataset().num_shards


def available_cores():
    """Cores this process may use (a SLURM or taskset CPU mask counts, not the machine's size)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
