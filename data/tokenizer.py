"""Tokenizers: "gpt2" (tiktoken's GPT-2 BPE, 50257 ids) and "byte" (256 bytes + end-of-text, no files needed).

get_tokenizer("gpt2") works offline when a copy of the GPT-2 ranks is on the machine. It looks, in order, at
  1. the file named by $GRAPE_GPT2_RANKS (a tiktoken ranks file),
  2. whisper/assets/gpt2.tiktoken of the PyPI package openai-whisper (byte-identical to tiktoken's GPT-2 ranks;
     `pip install --no-deps openai-whisper==20250625` installs it without its heavy dependencies),
  3. tiktoken.get_encoding("gpt2") (its cache, else a download).
Each local file is checked against the known sha256 of the GPT-2 ranks, so all three give the same ids.
"""
import functools
import hashlib
import importlib.util
import os

from data.shards import DataError

GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
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

    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
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
    local = _whisper_ranks_path()
    if local:
        return _encoding_from_ranks(local)
    import tiktoken

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as exc:  # tiktoken raises requests' ConnectionError, or others, when it cannot download
        raise DataError(
            f"the GPT-2 vocabulary is not on this machine and could not be downloaded ({type(exc).__name__}); "
            "install a local copy with `pip install --no-deps openai-whisper==20250625`, or set "
            "$GRAPE_GPT2_RANKS to a gpt2.tiktoken file, or use the 'byte' tokenizer") from None


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
