"""What the tests of data/prepare.py and its parts share: a corpus of documents, their expected byte-token stream
and shard layout, and a preparation with the byte tokenizer."""
import json
import os

import numpy as np

from data.loader import load_split_tokens
from data import prepare as prep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


DOCS = [f"Document {i}: the quick brown fox jumps over the lazy dog {i * 7} times. " * (1 + i % 4)
        for i in range(40)] + ["Ünïcödé — ∑ 日本語 😀", ""]


def expected_stream(docs):
    """Independent reference: eot (256) then the UTF-8 bytes of every document."""
    out = []
    for doc in docs:
        out.append(256)
        out.extend(doc.encode("utf-8"))
    return np.array(out, dtype=np.uint16)


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc, "id": len(doc)}) + "\n")


def all_tokens(out_dir):
    return np.concatenate([load_split_tokens(out_dir, "val"), load_split_tokens(out_dir, "train")])


def expected_layout(file_docs, val_tokens, shard_tokens, max_tokens=None):
    """Independent reference for the shard sizes: the stream (every file's documents, each file cut to max_tokens)
    is cut at every file start, every shard_tokens within a file, at val_tokens and at max_tokens; the pieces that
    end by val_tokens are validation. Returns [(split, tokens), ...]."""
    cuts, offset = set(), 0
    for docs in file_docs:
        n = min(len(expected_stream(docs)), max_tokens or 10**18)
        cuts |= {offset + k for k in range(0, n, shard_tokens)}
        offset += n
    end = min(offset, max_tokens or offset)
    bounds = sorted(c for c in cuts | {val_tokens, end} if 0 < c < end) + [end]
    return [("val" if b <= val_tokens else "train", b - a) for a, b in zip([0] + bounds, bounds)]


def directory_bytes(path):
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path))}


def run_prepare(source, out_dir, **kw):
    kw = {"tokenizer": "byte", "val_tokens": 500, "shard_tokens": 700, "workers": 1, "progress_bar": False, **kw}
    return prep.prepare(source, str(out_dir), **kw)


FILE_DOCS = [DOCS[0:9], [], DOCS[9:13], DOCS[13:30], DOCS[30:42]]  # five files, one of them empty


def write_files(folder, file_docs=FILE_DOCS):
    folder.mkdir(exist_ok=True)
    for i, docs in enumerate(file_docs):
        write_jsonl(folder / f"part{i}.jsonl", docs)
    return prep.files_source(str(folder / "part*.jsonl"))


# Validation ends inside the first file's third shard, and the stream stops inside the fourth file.
LAYOUT = {"val_tokens": 900, "shard_tokens": 333, "max_tokens": 3000}


def tree_bytes(folder):
    """Every file under folder (hidden ones too), by relative path, with its bytes."""
    return {os.path.relpath(os.path.join(root, name), folder): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(folder) for name in names}
