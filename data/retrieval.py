"""Associative recall mixed into text: the retrieval task that training can mix in and eval/retrieval.py scores.

A fact is OPEN key SEP value CLOSE, e.g. "\\x02qzx:481\\x03": a key of KEY_LENGTH random lowercase letters and a
value of VALUE_LENGTH random digits, written with the control bytes 0x02 and 0x03 (which ordinary text does not
hold, so a fact cannot be confused with the text around it). A key written a second time, with the same value, is
a query: its value cannot be predicted from anything but the first time the key was written, so a model that
predicts it has found that fact, however far back (multi-query associative recall, Arora et al. 2023, "Zoology",
in the text's own tokens and with the text in between as filler).

Training (train.retrieval_fraction): each training window is, with that probability, rewritten as RETRIEVAL_PAIRS
facts and their queries scattered between pieces of the window's own text, in a random order in which each key's
fact comes before its query; the window keeps its length (its text is cut short by the facts' tokens). Which
windows and what they hold is a pure function of (seed, sample number), as the windows themselves are, so a resumed
run and any split into processes read the same batches.
"""
from __future__ import annotations

import numpy as np
import torch

OPEN, SEP, CLOSE = "\x02", ":", "\x03"
KEY_LETTERS, KEY_LENGTH = "abcdefghijklmnopqrstuvwxyz", 3
VALUE_DIGITS, VALUE_LENGTH = "0123456789", 3
RETRIEVAL_PAIRS = 8  # facts (and queries) in a training window that holds the task
_STREAM = 0x52455452  # "RETR": keeps the task's random draws apart from any other stream keyed by the seed


class Facts:
    """The tokens of facts, in one tokenizer: each fact is a head (OPEN key SEP), its value, and CLOSE, encoded
    separately so that a value is always the same tokens whatever its neighbours (a BPE would merge across)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.close = tokenizer.encode(CLOSE)

    def key(self, number: int) -> str:
        letters = []
        for _ in range(KEY_LENGTH):
            number, digit = divmod(number, len(KEY_LETTERS))
            letters.append(KEY_LETTERS[digit])
        return "".join(letters)

    def value(self, number: int) -> str:
        return f"{number:0{VALUE_LENGTH}d}"

    def encode(self, key: int, value: int) -> tuple[list[int], list[int]]:
        """(the fact's tokens, the offsets of its value tokens within them)."""
        head = self.tokenizer.encode(OPEN + self.key(key) + SEP)
        body = self.tokenizer.encode(self.value(value))
        return head + body + self.close, list(range(len(head), len(head) + len(body)))

    @staticmethod
    def draw(rng: np.random.Generator, pairs: int) -> tuple[np.ndarray, np.ndarray]:
        """`pairs` distinct keys and a value for each."""
        keys = rng.choice(len(KEY_LETTERS) ** KEY_LENGTH, size=pairs, replace=False)
        values = rng.integers(0, 10 ** VALUE_LENGTH, size=pairs)
        return keys, values


def mix_window(tokens: np.ndarray, facts: Facts, rng: np.random.Generator, pairs: int = RETRIEVAL_PAIRS) -> np.ndarray:
    """The window `tokens` rewritten to hold `pairs` facts and their queries between pieces of its own text, in
    a random order in which each key's fact comes first (the first of the two equal items is the fact); the
    result has the window's length. Raises ValueError when the items alone do not fit."""
    keys, values = facts.draw(rng, pairs)
    items = [facts.encode(int(k), int(v))[0] for k, v in zip(keys, values)]
    order = rng.permutation(np.repeat(np.arange(pairs), 2))
    length = len(tokens)
    budget = length - 2 * sum(len(item) for item in items)
    if budget < 0:
        raise ValueError(f"{pairs} facts and their queries ({length - budget} tokens) do not fit in a window of "
                         f"{length} tokens")
    cuts = np.sort(rng.integers(0, budget + 1, size=len(order)))
    pieces, previous = [], 0
    for cut, item in zip(cuts.tolist(), order.tolist()):
        pieces += [tokens[previous:cut], np.asarray(items[item], dtype=tokens.dtype)]
        previous = cut
    pieces.append(tokens[previous:budget])
    out = np.concatenate(pieces)
    assert len(out) == length
    return out


def check_fits(block_size: int, facts: Facts, pairs: int = RETRIEVAL_PAIRS) -> str | None:
    """None, or why `pairs` facts and queries do not fit in a training window of block_size + 1 tokens."""
    longest = max(len(facts.encode(k, v)[0]) for k in (0, len(KEY_LETTERS) ** KEY_LENGTH - 1)
                  for v in (0, 10 ** VALUE_LENGTH - 1))
    needed = 2 * pairs * longest
    if needed > block_size + 1:
        return (f"train.retrieval_fraction mixes {pairs} facts and their queries ({needed} tokens) into each chosen "
                f"window, more than a window of block_size + 1 = {block_size + 1} tokens; raise block_size or set "
                "retrieval_fraction = 0")
    return None


class RetrievalMix:
    """source.batch(index) with a `fraction` of its windows rewritten by mix_window. The choice and the facts of
    sample n = index·batch_size + row depend on (seed, n) alone, like the windows of TrainBatches."""

    def __init__(self, source, fraction: float, tokenizer, pairs: int = RETRIEVAL_PAIRS):
        if not 0 <= fraction <= 1:
            raise ValueError(f"retrieval fraction must be between 0 and 1, not {fraction}")
        self.source, self.fraction, self.pairs = source, fraction, pairs
        self.batch_size, self.block_size, self.seed = source.batch_size, source.block_size, source.seed
        self.data_dir = getattr(source, "data_dir", None)
        self.facts = Facts(tokenizer)
        problem = check_fits(self.block_size, self.facts, pairs)
        if problem:
            raise ValueError(problem)

    def batch(self, index):
        x, y = self.source.batch(index)
        if self.fraction == 0:
            return x, y
        windows = torch.cat([x, y[:, -1:]], dim=1).numpy()  # (B, T + 1): the windows the pair was cut from
        for row in range(len(windows)):
            rng = np.random.default_rng([_STREAM, self.seed, index * self.batch_size + row])
            if rng.random() < self.fraction:
                windows[row] = mix_window(windows[row], self.facts, rng, self.pairs)
        windows = torch.from_numpy(windows)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
