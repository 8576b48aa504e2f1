"""Stream documents into uint16 token shards (llm.c / nanoGPT-speedrun format) with a JSON manifest.

    python -m data.prepare --dataset fineweb-edu --version 10B --out data_cache/fineweb-edu-10B
    python -m data.prepare --files 'corpus/**/*.jsonl' --out data_cache/mycorpus --val-tokens 1000000
    python -m data.prepare --default            # the embedded English corpus (what the quickstart uses)

Every document is tokenised with <|endoftext|> in front of it. The token stream, in document order, is cut
into shards: the first --val-tokens tokens are the validation split (val_000000.bin, ...), the rest the train
split (train_NNNNNN.bin, --shard-tokens each, the last one shorter). The output depends only on the arguments,
not on the number of workers. Each shard is written to a temporary name and renamed when complete, and
progress.json records where the next shard starts, so an interrupted run re-run with the same arguments keeps
the completed shards, redoes the partial one and ends with byte-identical files. manifest.json marks the end.
"""
import argparse
import collections
import glob
import json
import multiprocessing
import os
import shlex
import shutil
import signal
import socket
import sys
import time
from urllib.parse import urlparse

if __package__ in (None, ""):  # run as `python data/prepare.py`: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from data.shards import DataError, file_sha256, read_header, write_shard
from data.tokenizer import TOKENIZER_NAMES, encode_documents, get_tokenizer, init_worker

FINEWEB_EDU_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_EDU_CONFIGS = {"10B": "sample-10BT", "100B": "sample-100BT", "350B": "sample-350BT"}
DEFAULT_SHARD_TOKENS = 100_000_000  # 200 MB per shard, as in nanoGPT-speedrun
DEFAULT_HUB_VAL_TOKENS = 100_000_000  # the paper's 0.1B validation tokens
DEFAULT_FILES_VAL_TOKENS = 1_000_000
DOCS_PER_TASK = 64  # documents per worker task: large enough to amortise pickling, small enough to stream
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFFLINE_HINT = ("prepare local files instead with --files 'path/*.jsonl' (.jsonl/.json/.parquet with a 'text' "
                "field, or .txt), or the embedded corpus with --default")


class Source:
    """A document stream: `description` (JSON, identifies the data for resume and the manifest) and a
    datasets.IterableDataset factory whose rows have a 'text' field."""

    def __init__(self, description, open_dataset, check=None):
        self.description = description
        self.open_dataset = open_dataset
        self.check = check or (lambda: None)  # raises DataError at once if the source cannot be read


def _quiet_datasets():
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _env_true(name):
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_source(version):
    """FineWeb-Edu sample `version` (10B, 100B or 350B) streamed from the Hugging Face hub."""
    if version not in FINEWEB_EDU_CONFIGS:
        raise DataError(f"unknown FineWeb-Edu version {version!r}; choose one of {', '.join(FINEWEB_EDU_CONFIGS)}")
    config = FINEWEB_EDU_CONFIGS[version]

    def check():
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

    def open_dataset():
        check()
        datasets = _quiet_datasets()
        try:
            return datasets.load_dataset(FINEWEB_EDU_REPO, name=config, split="train", streaming=True)
        except (ConnectionError, OSError) as exc:
            raise DataError(f"could not open {FINEWEB_EDU_REPO} ({config}) on the hub: {exc}; {OFFLINE_HINT}") from None

    return Source({"kind": "hub", "dataset": FINEWEB_EDU_REPO, "config": config}, open_dataset, check)


def files_source(pattern, txt_sample_by="document"):
    """Local files matching a glob (** allowed), in sorted path order, read through datasets."""
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

    def open_dataset():
        datasets = _quiet_datasets()
        kwargs = {"sample_by": txt_sample_by} if builder == "text" else {}
        try:
            return datasets.load_dataset(builder, data_files=paths, split="train", streaming=True, **kwargs)
        except Exception as exc:  # datasets raises many types for unreadable files
            raise DataError(f"could not read --files {pattern!r} as {builder}: {exc}") from None

    # Files are known by content, not path and size: a file edited in place between an interrupted run and its
    # resume must not mix old and new shards.
    description = {"kind": "files", "pattern": pattern, "format": builder,
                   "files": [[p, os.path.getsize(p), file_sha256(p)] for p in paths]}
    if builder == "text":
        description["txt_sample_by"] = txt_sample_by
    return Source(description, open_dataset)


def _shard_plan(index, val_tokens, shard_tokens):
    """(split, capacity) of shard `index`: validation shards first, then train shards."""
    n_val = -(-val_tokens // shard_tokens)
    if index < n_val:
        return "val", min(shard_tokens, val_tokens - index * shard_tokens)
    return "train", shard_tokens


def _text_batches(source, start_state, skip_docs):
    """Yield (dataset state before the batch, docs to skip in it, texts): the state lets a resume seek to it."""
    dataset = source.open_dataset()
    if start_state is not None:
        dataset.load_state_dict(start_state)
    rows = iter(dataset)
    state = start_state  # state_dict() is "after the last example yielded", so it is unset before the first one
    while True:
        texts = []
        try:
            for row in rows:
                if "text" not in row:
                    raise DataError(f"the rows of {json.dumps(source.description)[:200]} have no 'text' field "
                                    f"(fields: {', '.join(row)}); give files whose documents are in 'text'")
                texts.append(row["text"] or "")
                if len(texts) == DOCS_PER_TASK:
                    break
        except DataError:
            raise
        except Exception as exc:  # network or file errors while streaming
            raise DataError(f"reading the documents failed ({exc.__class__.__name__}: {exc}); re-run the same "
                            f"command to resume from the last complete shard") from None
        if not texts:
            return
        if skip_docs >= len(texts):  # seeking by document count (rewriting one shard): skip batches untokenised
            skip_docs -= len(texts)
            state = dataset.state_dict()
            continue
        yield state, skip_docs, texts
        state = dataset.state_dict()
        skip_docs = 0


def _encoded_batches(batches, tokenizer_name, workers):
    """Tokenise batches in worker processes, yielding results in input order with a bounded backlog."""
    if workers <= 1:
        init_worker(tokenizer_name)
        for state, skip, texts in batches:
            yield state, skip, encode_documents(texts[skip:])
        return
    # fork where there is one: workers start in milliseconds with the tokenizer already loaded (spawn re-imports
    # everything, seconds per worker). The dataset is only opened after the fork, so no reader threads exist yet.
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with context.Pool(workers, initializer=init_worker, initargs=(tokenizer_name,)) as pool:
        pending = collections.deque()
        for state, skip, texts in batches:
            pending.append((state, skip, pool.apply_async(encode_documents, (texts[skip:],))))
            if len(pending) >= 4 * workers:
                state, skip, result = pending.popleft()
                yield state, skip, result.get()
        while pending:
            state, skip, result = pending.popleft()
            yield state, skip, result.get()


def _write_json(path, data):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())  # a crash right after the rename must not leave an empty progress file
    os.replace(tmp, path)


def _load_progress(out_dir, config):
    """Completed shards of an earlier run with the same config, checked on disk; a fresh state otherwise."""
    path = os.path.join(out_dir, "progress.json")
    fresh = {"config": config, "shards": [], "resume": {"state": None, "skip_docs": 0, "skip_tokens": 0, "doc": 0}}
    if not os.path.exists(path):
        return fresh
    try:
        with open(path) as f:
            progress = json.load(f)
    except (OSError, ValueError) as error:
        raise DataError(f"{path} is damaged ({error}); delete {out_dir} and prepare again") from None
    if progress.get("config") != config:
        raise DataError(f"{out_dir} holds a preparation with other arguments; use the same arguments to resume it, "
                        f"or another --out (or delete {out_dir}) to start a new one")
    # A damaged shard is dropped with every shard after it: the next one's start point is only recorded in it.
    for i, shard in enumerate(progress["shards"]):
        if not _shard_intact(out_dir, shard):
            if "start" not in shard:  # progress.json of an older version
                raise DataError(f"{os.path.join(out_dir, shard['file'])} is missing or changed since it was written; "
                                f"delete {out_dir} and prepare again")
            progress["shards"], progress["resume"] = progress["shards"][:i], _resume_at(shard["start"])
            break
    return progress


def _resume_at(start):
    """A resume point from a shard's start (document index, tokens of it already used) by skipping documents
    from the beginning: slower than a dataset state, but a state's JSON differs between equivalent positions
    and would make manifests of equal preparations differ."""
    return {"state": None, "skip_docs": start["doc"], "skip_tokens": start["skip_tokens"], "doc": start["doc"]}


def _shard_intact(out_dir, shard):
    path = os.path.join(out_dir, shard["file"])
    try:
        return read_header(path) == shard["tokens"] and file_sha256(path) == shard["sha256"]
    except (OSError, DataError):
        return False


def prepare_command(out_dir):
    """The `python -m data.prepare ...` command that made (or resumes, or repairs) out_dir, from its manifest."""
    out_dir = os.fspath(out_dir)
    for name in ("manifest.json", "progress.json"):
        try:
            with open(os.path.join(out_dir, name)) as f:
                config = json.load(f)["config"]
            break
        except (OSError, ValueError, KeyError):
            config = None
    if config is None:
        return f"python -m data.prepare ... --out {shlex.quote(out_dir)}"
    source = config["source"]
    if source["kind"] == "default":
        return f"python -m data.prepare --default --out {shlex.quote(out_dir)} --tokenizer {config['tokenizer']}"
    if source["kind"] == "hub":
        version = next(v for v, c in FINEWEB_EDU_CONFIGS.items() if c == source["config"])
        words = ["--dataset", "fineweb-edu", "--version", version]
    else:
        words = ["--files", source["pattern"]]
        if source.get("txt_sample_by", "document") != "document":
            words += ["--txt-sample-by", source["txt_sample_by"]]
    words += ["--out", out_dir, "--tokenizer", config["tokenizer"], "--val-tokens", str(config["val_tokens"]),
              "--shard-tokens", str(config["shard_tokens"])]
    if config["max_tokens"] is not None:
        words += ["--max-tokens", str(config["max_tokens"])]
    return "python -m data.prepare " + " ".join(shlex.quote(w) for w in words)


def _write_shards(source, out_dir, tokenizer, workers, progress, budget, val_tokens, shard_tokens, bar=None,
                  on_shard=None):
    """Tokenise from progress["resume"] on, appending shards to progress["shards"] until the source ends or
    `budget` tokens are written; on_shard(progress) runs after each shard. Returns the documents read."""
    shards = progress["shards"]
    resume = progress["resume"]
    index = len(shards)
    split, capacity = _shard_plan(index, val_tokens, shard_tokens)
    buffer = np.empty(capacity, dtype=np.uint16)
    fill = 0
    doc = resume["doc"]  # index of the next document in the stream
    skip_tokens = resume["skip_tokens"]  # tokens of that document already in earlier shards

    def finish_shard(state, skip_docs, next_doc, next_skip, last=False):
        nonlocal index, split, capacity, buffer, fill
        name = f"{split}_{index:06d}.bin"
        sha = write_shard(os.path.join(out_dir, name), buffer[:fill])
        # Where this shard started in the stream, so that a damaged copy can be rewritten on its own later.
        start = {"doc": progress["resume"]["doc"], "skip_tokens": progress["resume"]["skip_tokens"]}
        shards.append({"file": name, "split": split, "tokens": fill, "sha256": sha, "start": start})
        progress["resume"] = {"state": state, "skip_docs": skip_docs, "skip_tokens": next_skip, "doc": next_doc,
                              "finished": last}
        index += 1
        split, capacity = _shard_plan(index, val_tokens, shard_tokens)
        if capacity != len(buffer):
            buffer = np.empty(capacity, dtype=np.uint16)
        fill = 0
        if on_shard is not None:
            on_shard(progress)

    # A run killed after its last shard but before manifest.json has nothing left to read (its resume
    # state is unset, which would otherwise mean "from the start" and append the corpus again).
    more = budget > 0 and not resume.get("finished")
    batches = _text_batches(source, resume["state"], resume["skip_docs"]) if more else iter(())
    for state, skip_docs, (flat, lengths) in _encoded_batches(batches, tokenizer, workers):
        ends = np.cumsum(lengths)
        for i, length in enumerate(lengths):
            pos = int(ends[i] - length) + skip_tokens
            end = int(ends[i])
            skip_tokens = 0
            while pos < end and budget > 0:
                take = int(min(capacity - fill, end - pos, budget))
                buffer[fill:fill + take] = flat[pos:pos + take]
                fill, pos, budget = fill + take, pos + take, budget - take
                if bar is not None:
                    bar.update(take)
                if fill == capacity:
                    # The next shard starts at token `pos` of this document, or at the next document.
                    doc_end = pos == end
                    finish_shard(state, skip_docs + i + doc_end, doc + doc_end,
                                 0 if doc_end else pos - int(ends[i] - length))
            doc += 1
            if budget <= 0:
                break
        if bar is not None:
            bar.set_postfix_str(f"{doc:,} docs", refresh=False)
        if budget <= 0:
            break
    if fill:
        finish_shard(None, 0, doc, 0, last=True)
    return doc


def _repair_shards(source, out_dir, manifest, workers, progress_bar):
    """Rewrite exactly the shards of a finished preparation that are missing or no longer match their sha256."""
    config = manifest["config"]
    damaged = [i for i, shard in enumerate(manifest["shards"]) if not _shard_intact(out_dir, shard)]
    if not damaged:
        return
    if any("start" not in manifest["shards"][i] for i in damaged):
        raise DataError(f"{len(damaged)} shard(s) of {out_dir} are missing or damaged, and its manifest.json (written "
                        f"by an older version) does not record where each shard starts; delete {out_dir} and "
                        "prepare it again")
    for i in damaged:
        shard = manifest["shards"][i]
        progress = {"shards": manifest["shards"][:i], "resume": _resume_at(shard["start"])}
        _write_shards(source, out_dir, config["tokenizer"], workers, progress, shard["tokens"],
                      config["val_tokens"], config["shard_tokens"])
        if progress["shards"][i]["sha256"] != shard["sha256"]:
            raise DataError(f"rewriting {shard['file']} gave other tokens than when {out_dir} was prepared: the "
                            f"source has changed since; delete {out_dir} and prepare it again")
    if progress_bar:
        print(f"rewrote {len(damaged)} damaged or missing shard(s) of {out_dir}: "
              + ", ".join(manifest["shards"][i]["file"] for i in damaged), file=sys.stderr)


def _remove_unfinished(out_dir, created):
    """After a preparation that cannot succeed: remove what it wrote, so nothing looks prepared or resumable."""
    for name in os.listdir(out_dir):
        if name == "progress.json" or name.endswith((".bin", ".tmp")):
            os.remove(os.path.join(out_dir, name))
    if created and not os.listdir(out_dir):
        os.rmdir(out_dir)


def prepare(source, out_dir, tokenizer="gpt2", val_tokens=DEFAULT_FILES_VAL_TOKENS,
            shard_tokens=DEFAULT_SHARD_TOKENS, max_tokens=None, workers=None, progress_bar=True,
            stop_after_shards=None):
    """Prepare `source` into shards under out_dir and return the manifest (see the module docstring).

    stop_after_shards (for tests) raises KeyboardInterrupt after that many shards, as Ctrl-C would."""
    if shard_tokens < 1 or val_tokens < 0 or (max_tokens is not None and max_tokens < 1):
        raise DataError("--shard-tokens and --max-tokens must be positive and --val-tokens non-negative")
    # One core stays with the main process (reading, writing); on 2 cores one in-process worker is fastest.
    workers = max(1, (os.cpu_count() or 1) - 1) if workers is None else workers
    source.check()
    tok = get_tokenizer(tokenizer)
    if tok.n_vocab > 2**16:
        raise DataError(f"tokenizer {tokenizer} has {tok.n_vocab} ids; uint16 shards hold at most 65536")
    config = {"source": source.description, "tokenizer": tokenizer, "val_tokens": val_tokens,
              "shard_tokens": shard_tokens, "max_tokens": max_tokens}
    created = not os.path.isdir(out_dir)
    try:
        return _prepare(source, out_dir, tok, config, workers, progress_bar, stop_after_shards, created)
    except OSError as error:  # a full disk or a read-only directory: what was completed stays usable for a re-run
        for name in os.listdir(out_dir) if os.path.isdir(out_dir) else ():
            if name.endswith(".tmp"):
                os.remove(os.path.join(out_dir, name))
        where = f" ({error.filename})" if error.filename else ""
        raise DataError(f"cannot write to {out_dir}{where}: {error.strerror or error}; completed shards are kept: "
                        "free space or fix the permissions, then run the same command again to continue") from None


def _prepare(source, out_dir, tok, config, workers, progress_bar, stop_after_shards, created):
    tokenizer, val_tokens, max_tokens = config["tokenizer"], config["val_tokens"], config["max_tokens"]
    os.makedirs(out_dir, exist_ok=True)
    manifest_path = os.path.join(out_dir, "manifest.json")
    if os.path.exists(manifest_path):
        from data.loader import read_manifest

        manifest = read_manifest(out_dir)  # a DataError if it is damaged
        if manifest.get("config") == config:
            _repair_shards(source, out_dir, manifest, workers, progress_bar)
            if progress_bar:
                print(f"{out_dir} is already prepared ({manifest['tokens']['total']:,} tokens)", file=sys.stderr)
            return manifest
        raise DataError(f"{out_dir} already holds data prepared with other arguments; use another --out or delete it")

    progress = _load_progress(out_dir, config)
    kept = {s["file"] for s in progress["shards"]}
    for name in os.listdir(out_dir):  # partial shards of an interrupted run, and shards it wrote past progress.json
        if name.endswith(".tmp") or (name.endswith(".bin") and name not in kept):
            os.remove(os.path.join(out_dir, name))

    written = sum(s["tokens"] for s in progress["shards"])
    budget = float("inf") if max_tokens is None else max_tokens - written
    started = time.time()
    bar = None
    if progress_bar:
        from tqdm import tqdm

        bar = tqdm(total=max_tokens, initial=written, unit="tok", unit_scale=True, dynamic_ncols=True,
                   mininterval=1.0, desc=f"tokenizing ({workers} worker{'s' * (workers > 1)})")

    def record_progress(progress):
        _write_json(os.path.join(out_dir, "progress.json"), progress)
        if stop_after_shards is not None and len(progress["shards"]) - len(kept) >= stop_after_shards:
            raise KeyboardInterrupt(f"stopped after {stop_after_shards} shards (test hook)")

    try:
        doc = _write_shards(source, out_dir, tokenizer, workers, progress, budget, val_tokens,
                            config["shard_tokens"], bar, record_progress)
    finally:
        if bar is not None:
            bar.close()

    shards = progress["shards"]
    counts = {"val": sum(s["tokens"] for s in shards if s["split"] == "val"),
              "train": sum(s["tokens"] for s in shards if s["split"] == "train")}
    counts["total"] = counts["val"] + counts["train"]
    if counts["train"] == 0:
        _remove_unfinished(out_dir, created)  # the same command would fail the same way: leave nothing behind
        if counts["total"] <= doc:  # every document contributed only its <|endoftext|> token
            raise DataError(f"the source holds no text ({doc:,} document(s), all empty); check --files "
                            f"(and the 'text' field), then prepare again")
        raise DataError(f"the source has only {counts['total']:,} tokens and all went to validation "
                        f"(--val-tokens {val_tokens:,}); prepare it again with a smaller --val-tokens")
    manifest = {
        "format": "llm.c uint16 token shards: 256 x int32 header (magic 20240520, version 1, token count), "
                  "then uint16 tokens",
        "source": source.description, "tokenizer": tokenizer, "vocab_size": tok.n_vocab, "eot_token": tok.eot_token,
        "documents": doc, "tokens": counts, "shards": shards, "config": config,
    }
    _write_json(manifest_path, manifest)
    os.remove(os.path.join(out_dir, "progress.json"))
    if progress_bar:
        seconds = time.time() - started
        print(f"wrote {len(shards)} shards to {out_dir}: {counts['val']:,} val + {counts['train']:,} train tokens "
              f"from {doc:,} documents ({seconds:.1f} s this run)", file=sys.stderr)
    return manifest


# ---- the embedded default corpus --------------------------------------------------------------------------------

DEFAULT_CORPUS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_corpus.jsonl.xz")
DEFAULT_CORPUS_VAL_TOKENS = 65_536
DEFAULT_CORPUS_SHARD_TOKENS = 1_000_000


def default_corpus_source(work_dir):
    """The embedded corpus (data/default_corpus.jsonl.xz), unpacked into work_dir for datasets to read."""
    import hashlib
    import lzma

    with open(DEFAULT_CORPUS_FILE, "rb") as f:
        packed = f.read()
    digest = hashlib.sha256(packed).hexdigest()
    unpacked = os.path.join(work_dir, f"default_corpus-{digest[:12]}.jsonl")

    def open_dataset():
        if not os.path.exists(unpacked):
            tmp = unpacked + ".part"  # not .tmp: prepare() removes those
            with open(tmp, "wb") as f:
                f.write(lzma.decompress(packed))
            os.replace(tmp, unpacked)
        datasets = _quiet_datasets()
        return datasets.load_dataset("json", data_files=[unpacked], split="train", streaming=True)

    return Source({"kind": "default", "file": "data/default_corpus.jsonl.xz", "sha256": digest}, open_dataset)


def ensure_default_corpus(out_dir=None, tokenizer="gpt2", progress_bar=True):
    """Prepare the embedded English corpus once (offline) and return its directory (a cache: a directory
    prepared from another version of the corpus is rebuilt)."""
    if out_dir is None:
        suffix = "" if tokenizer == "gpt2" else f"-{tokenizer}"
        out_dir = os.path.join(REPO_ROOT, "data_cache", f"default{suffix}")
    source = default_corpus_source(out_dir)
    manifest_path = os.path.join(out_dir, "manifest.json")
    expected = {"source": source.description, "tokenizer": tokenizer, "val_tokens": DEFAULT_CORPUS_VAL_TOKENS,
                "shard_tokens": DEFAULT_CORPUS_SHARD_TOKENS, "max_tokens": None}
    if os.path.exists(manifest_path):
        try:
            with open(manifest_path) as f:
                config = json.load(f).get("config", {})
        except ValueError:  # a damaged manifest of this cache: rebuild it
            config = {"source": {"kind": "default"}}
        if config != expected and config.get("source", {}).get("kind") == "default":
            # A cache of another version of the embedded corpus (e.g. after a git pull): rebuild it.
            shutil.rmtree(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    prepare(source, out_dir, tokenizer=tokenizer, val_tokens=expected["val_tokens"],
            shard_tokens=expected["shard_tokens"], progress_bar=progress_bar)
    return out_dir


# ---- command line -----------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--dataset", choices=["fineweb-edu"], help="a hub dataset, streamed")
    which.add_argument("--files", help="glob of local .jsonl/.json/.parquet (with a 'text' field) or .txt files")
    which.add_argument("--default", action="store_true", help="the embedded English corpus (offline)")
    parser.add_argument("--version", default="10B", choices=sorted(FINEWEB_EDU_CONFIGS),
                        help="FineWeb-Edu sample size (default 10B; the paper used 100B)")
    parser.add_argument("--out", help="output directory (default data_cache/<name>)")
    parser.add_argument("--tokenizer", default="gpt2", choices=TOKENIZER_NAMES)
    parser.add_argument("--val-tokens", type=int, default=None,
                        help=f"validation tokens, taken from the start of the stream (default {DEFAULT_HUB_VAL_TOKENS:,}"
                             f" for the hub, {DEFAULT_FILES_VAL_TOKENS:,} for --files)")
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard")
    parser.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens in all")
    parser.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: cores - 1; 1 tokenizes in the main process)")
    parser.add_argument("--txt-sample-by", default="document", choices=["document", "paragraph", "line"],
                        help="what one document of a .txt file is (default: the whole file)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def _stop_now(signum, frame):
    # Ctrl-C or kill: stop the workers and leave at once. Unwinding through Pool.terminate() can hang while its
    # task thread is blocked on a full pipe, and nothing needs cleaning up: shards and progress.json are only
    # ever replaced whole, and the next run deletes a half-written .tmp file.
    for child in multiprocessing.active_children():
        child.kill()
    print("interrupted: completed shards are kept; run the same command again to resume", file=sys.stderr)
    os._exit(128 + signum)


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGINT, _stop_now)
    signal.signal(signal.SIGTERM, _stop_now)
    try:
        if args.default:
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
        prepare(source, out, tokenizer=args.tokenizer, val_tokens=val_tokens, shard_tokens=args.shard_tokens,
                max_tokens=args.max_tokens, workers=args.workers, progress_bar=not args.quiet)
        print(out)
        return 0
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
