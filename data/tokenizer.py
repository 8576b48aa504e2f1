"""Tokenizers: "gpt2" (tiktoken's GPT-2 BPE, 50257 ids) and "byte" (256 bytes + end-of-text, no files needed).

get_tokenizer("gpt2") works offline when a copy of the GPT-2 ranks is on the machine. It looks, in order, at
  1. the file named by $GRAPE_GPT2_RANKS (a tiktoken ranks file),
  2. data_cache/gpt2.tiktoken in this repository, which `python3 -m data.tokenizer --fetch-gpt2-ranks` puts there
     once: it downloads the source package openai-whisper==20250625 from PyPI (its whisper/assets/gpt2.tiktoken
     is byte-identical to tiktoken's GPT-2 ranks) and keeps that one file, installing nothing,
  3. whisper/assets/gpt2.tiktoken of an installed openai-whisper package,
  4. tiktoken.get_encoding("gpt2") (its cache, else a download).
Each local file is checked against the known sha256 of the GPT-2 ranks, so all of them give the same ids.
"""
import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile

from data.shards import DataError

GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
REPO_RANKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data_cache", "gpt2.tiktoken")
RANKS_PACKAGE = "openai-whisper==20250625"
FETCH_COMMAND = "python3 -m data.tokenizer --fetch-gpt2-ranks"
EOT_TEXT = "<|endoftext|>"
TOKENIZER_NAMES = ("gpt2", "byte")


class Tokenizer:
    """encode(str) -> list[int] treats the text as plain text (no special tokens); decode(list[int]) -> str."""

    def __init__(self, name, n_vocab, eot_token, encode, decode):
        self.name, self.n_vocab, self.eot_token = name, n_vocab, eot_token
        self._encode, self._decode = encode, decode

    def encode(self, text):
        return self._encode(text)

    def decode(self, ids):
        return self._decode([int(i) for i in ids])

    def __repr__(self):
        return f"Tokenizer(name={self.name!r}, n_vocab={self.n_vocab}, eot_token={self.eot_token})"


def _byte_decode(ids):
    # eot (256) is shown as "<|endoftext|>", as tiktoken shows it for gpt2; other ids >= 256 cannot occur.
    out, run = [], bytearray()
    for i in ids:
        if i < 256:
            run.append(i)
        else:
            out.append(run.decode("utf-8", errors="replace") + EOT_TEXT)
            run = bytearray()
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)


def byte_tokenizer():
    return Tokenizer("byte", 257, 256, lambda text: list(text.encode("utf-8")), _byte_decode)


def _whisper_ranks_path():
    # find_spec locates the package without importing it (whisper's own imports need torch, numba, ...).
    spec = importlib.util.find_spec("whisper")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = os.path.join(folder, "assets", "gpt2.tiktoken")
        if os.path.isfile(candidate):
            return candidate
    return None


def _encoding_from_ranks(path):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    digest = _sha256(path)
    if digest != GPT2_RANKS_SHA256:
        raise DataError(f"{path}: sha256 {digest[:12]}... is not that of the GPT-2 ranks ({GPT2_RANKS_SHA256[:12]}...); "
                        f"point $GRAPE_GPT2_RANKS at an unmodified gpt2.tiktoken / r50k_base.tiktoken file")
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=load_tiktoken_bpe(path),
                             special_tokens={EOT_TEXT: 50256}, explicit_n_vocab=50257)


def gpt2_encoding():
    """The tiktoken Encoding of GPT-2, from a local ranks file if there is one, else from tiktoken."""
    local = os.environ.get("GRAPE_GPT2_RANKS")
    if local:
        if not os.path.isfile(local):
            raise DataError(f"$GRAPE_GPT2_RANKS={local} is not a file; unset it or point it at gpt2.tiktoken")
        return _encoding_from_ranks(local)
    local = REPO_RANKS if os.path.isfile(REPO_RANKS) else _whisper_ranks_path()
    if local:
        return _encoding_from_ranks(local)
    import tiktoken

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as exc:  # tiktoken raises requests' ConnectionError, or others, when it cannot download
        raise DataError(
            f"the GPT-2 vocabulary is not on this machine and could not be downloaded ({type(exc).__name__}); "
            f"put a local copy in place with `{FETCH_COMMAND}` (from PyPI), or set $GRAPE_GPT2_RANKS to a "
            "gpt2.tiktoken file, or use the 'byte' tokenizer") from None


def fetch_gpt2_ranks(target=REPO_RANKS):
    """Put the GPT-2 ranks at `target` from the openai-whisper source package on PyPI (pip download: the package
    index pip is configured with, no install, so pip has no dependencies to complain about). Returns the path."""
    if os.path.isfile(target) and _sha256(target) == GPT2_RANKS_SHA256:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                                 ":all:", RANKS_PACKAGE, "-d", tmp], capture_output=True, text=True)
        archives = [name for name in os.listdir(tmp) if name.endswith((".tar.gz", ".zip"))]
        if result.returncode or not archives:
            raise DataError(f"could not download {RANKS_PACKAGE} from the package index "
                            f"({(result.stderr.strip().splitlines() or ['no archive'])[-1]}); on a machine without "
                            "one, copy gpt2.tiktoken from a machine that has it and set $GRAPE_GPT2_RANKS")
        with tarfile.open(os.path.join(tmp, archives[0])) as archive:
            member = next((m for m in archive.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken")), None)
            if member is None:
                raise DataError(f"{archives[0]} holds no whisper/assets/gpt2.tiktoken; set $GRAPE_GPT2_RANKS instead")
            data = archive.extractfile(member).read()
    if hashlib.sha256(data).hexdigest() != GPT2_RANKS_SHA256:
        raise DataError(f"the gpt2.tiktoken in {RANKS_PACKAGE} does not have the GPT-2 ranks' sha256; "
                        "set $GRAPE_GPT2_RANKS to a known copy")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target + ".tmp", "wb") as f:
        f.write(data)
    os.replace(target + ".tmp", target)
    return target


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(description="Tokenizer files. --fetch-gpt2-ranks puts the GPT-2 BPE ranks in "
                                                 "data_cache/ once (from PyPI), so the gpt2 tokenizer works offline.",
                                     allow_abbrev=False)
    parser.add_argument("--fetch-gpt2-ranks", action="store_true", help="download the ranks file (about 1 MB)")
    args = parser.parse_args(argv)
    if not args.fetch_gpt2_ranks:
        parser.print_help()
        return
    try:
        path = fetch_gpt2_ranks()
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    print(f"GPT-2 ranks in place: {path} (sha256 {GPT2_RANKS_SHA256[:12]}...)")


if __name__ == "__main__":
    main()


@functools.lru_cache(maxsize=None)
def get_tokenizer(name="gpt2"):
    if name == "byte":
        return byte_tokenizer()
    if name == "gpt2":
        enc = gpt2_encoding()
        return Tokenizer("gpt2", enc.n_vocab, enc.eot_token, enc.encode_ordinary, enc.decode)
    raise DataError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZER_NAMES)}")


# Worker-process side of data/prepare.py: each worker builds its tokenizer once, then encodes batches of documents.
_worker_tokenizer = None


def init_worker(name):
    global _worker_tokenizer
    import multiprocessing
    import signal

    if multiprocessing.parent_process() is not None:
        # Ctrl-C reaches every process of the terminal; only the parent handles it (and stops the workers).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # A forked worker inherits the command line's SIGTERM handler; the default lets Pool.terminate() end it.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _worker_tokenizer = get_tokenizer(name)


def encode_documents(texts):
    """Encode a batch of documents as one uint16 array, <|endoftext|> before each; also return each one's length."""
    import itertools

    import numpy as np

    tok = _worker_tokenizer
    pieces = [[tok.eot_token] + tok.encode(text) for text in texts]
    lengths = np.array([len(p) for p in pieces], dtype=np.int64)
    flat = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.uint16, count=int(lengths.sum()))
    return flat, lengths
