"""Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json) for this project's tokenizers.

"gpt2" is written from the tiktoken ranks the data was tokenised with, "byte" from its definition (ids
0..255 are the bytes, 256 is <|endoftext|>). Both become a byte-level BPE of the `tokenizers` library: a
tiktoken rank table is a BPE whose merge order is the rank of each merged token, so each multi-byte token
is recovered as the one merge that forms it (the BPE of its bytes restricted to lower ranks leaves exactly
two parts). The pre-tokenizer is the encoding's own split pattern, so both sides cut text identically.
"""
from __future__ import annotations

import json
import os

from data.tokenizer import EOT_TEXT


def byte_to_char() -> dict[int, str]:
    """The byte-level BPE alphabet (GPT-2's): printable Latin-1 bytes stand for themselves, the other
    bytes for the code points 256, 257, ... in byte order, so every token is printable text."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges, in priority order, that reproduce tiktoken's encoding with these ranks."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            candidates = [(ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)]
            best, i = min(candidates)
            if best >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not one merge of two lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return merges


def build_tokenizer(ranks: dict[bytes, int], pattern: str | None, special: dict[str, int]):
    """A `tokenizers.Tokenizer` with these ranks as its vocabulary; `pattern` splits text before the BPE."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    alphabet = byte_to_char()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    vocab.update(special)
    merges = [(text(a), text(b)) for a, b in merges_from_ranks(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = byte_level if pattern is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in special])
    return tokenizer


def tokenizer_for(name: str):
    """(tokenizers.Tokenizer, end-of-text id) of this project's tokenizer `name` ("gpt2" or "byte")."""
    if name == "byte":
        return build_tokenizer({bytes([b]): b for b in range(256)}, None, {EOT_TEXT: 256}), 256
    if name == "gpt2":
        from data.tokenizer import gpt2_encoding
        encoding = gpt2_encoding()  # a DataError naming the remedy when the ranks are not on this machine
        return build_tokenizer(encoding._mergeable_ranks, encoding._pat_str, encoding._special_tokens), \
            encoding.eot_token
    raise ValueError(f"unknown tokenizer {name!r}: the export knows 'gpt2' and 'byte'")


def write_tokenizer(name: str, out_dir: str, model_max_length: int) -> int:
    """Write tokenizer.json and tokenizer_config.json for tokenizer `name`; returns its end-of-text id."""
    tokenizer, eot = tokenizer_for(name)
    tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT_TEXT, "eos_token": EOT_TEXT,
              "unk_token": EOT_TEXT, "add_bos_token": False, "add_eos_token": False,
              "clean_up_tokenization_spaces": False, "model_max_length": model_max_length}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return eot
