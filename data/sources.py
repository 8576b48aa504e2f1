"""The document sources of data.prepare: FineWeb-Edu streamed from the hub, local files, the embedded corpus.

A source is a document stream in pieces, one per input file (the hub sample's parquet files, or the local files in
sorted order), read through datasets' streaming loaders; its description identifies the data for a resume and
the manifest (local files by their sha256).
"""
import functools
import glob
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from data.manifest import FINEWEB_EDU_CONFIGS, FINEWEB_EDU_REPO
from data.shards import DataError, file_sha256

LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}


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
