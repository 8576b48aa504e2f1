"""data/retrieval.py: facts and their queries mixed into training windows, as a pure function of (seed, sample)."""
import numpy as np
import pytest
import torch

from data import retrieval
from data.tokenizer import byte_tokenizer

FACTS = retrieval.Facts(byte_tokenizer())


def items_of(window):
    """The facts written in a window: (start, bytes) of every OPEN ... CLOSE item, in order."""
    out, w = [], bytes(np.asarray(window, dtype=np.uint8))
    at = w.find(b"\x02")
    while at >= 0:
        end = w.index(b"\x03", at)
        out.append((at, w[at:end + 1]))
        at = w.find(b"\x02", end)
    return out


def test_a_fact_is_open_key_sep_value_close_with_its_value_tokens_marked():
    tokens, value_at = FACTS.encode(0, 7)
    assert bytes(tokens) == b"\x02aaa:007\x03" and value_at == [5, 6, 7]
    tokens, _ = FACTS.encode(26 ** 3 - 1, 999)
    assert bytes(tokens) == b"\x02zzz:999\x03"
    assert bytes(FACTS.encode(1 + 26 * 2, 5)[0])[1:4] == b"bca"  # the key's letters, least significant first


@pytest.mark.parametrize("pairs", [1, 8])
def test_a_mixed_window_keeps_its_length_and_text_and_holds_each_fact_then_its_query(pairs):
    text = (np.arange(513) % 90 + 32).astype(np.int64)  # printable bytes: no 0x02/0x03 of its own
    rng = np.random.default_rng(3)
    out = retrieval.mix_window(text, FACTS, rng, pairs)
    assert len(out) == 513 and out.dtype == text.dtype
    found = items_of(out)
    assert len(found) == 2 * pairs
    keys = [item[1:4] for _, item in found]
    assert len(set(keys)) == pairs and all(keys.count(k) == 2 for k in keys)  # distinct keys, each twice
    for key in set(keys):  # the query repeats the fact, value and all, later
        first, second = [item for _, item in found if item[1:4] == key]
        assert first == second
    kept = np.concatenate([out[prev_end:start] for (start, _), prev_end in
                           zip(found + [(513, b"")], [0] + [s + len(i) for s, i in found])])
    assert np.array_equal(kept, text[:len(kept)])  # the text in order, cut short by the facts' length
    assert len(kept) == 513 - sum(len(i) for _, i in found)


def test_facts_that_do_not_fit_the_window_are_one_sentence():
    with pytest.raises(ValueError, match="do not fit in a window of 40 tokens"):
        retrieval.mix_window(np.zeros(40, dtype=np.int64), FACTS, np.random.default_rng(0), 4)
    assert retrieval.check_fits(512, FACTS, 8) is None
    assert retrieval.check_fits(100, FACTS, 8) == (
        "train.retrieval_fraction mixes 8 facts and their queries (144 tokens) into each chosen window, more than a "
        "window of block_size + 1 = 101 tokens; raise block_size or set retrieval_fraction = 0")


class Windows:
    """A source of batches whose row r of batch i is the text window i * batch_size + r (a pure function)."""

    def __init__(self, batch_size, block_size=200, seed=5):
        self.batch_size, self.block_size, self.seed = batch_size, block_size, seed

    def batch(self, index):
        rows = [(np.arange(self.block_size + 1) + 7 * (index * self.batch_size + r)) % 90 + 32
                for r in range(self.batch_size)]
        w = torch.tensor(np.stack(rows))
        return w[:, :-1], w[:, 1:]


def test_which_windows_are_mixed_and_how_depends_on_the_sample_not_on_the_batch_split():
    """Sample n = index * batch_size + row: 1 process x batches of 4 and 2 x 2 read the same windows, as
    TrainBatches does, so a resume or another process count trains on the same facts."""
    big = retrieval.RetrievalMix(Windows(4), 0.5, byte_tokenizer(), pairs=2)
    small = retrieval.RetrievalMix(Windows(2), 0.5, byte_tokenizer(), pairs=2)
    for index in range(5):
        x, y = big.batch(index)
        x2 = torch.cat([small.batch(2 * index)[0], small.batch(2 * index + 1)[0]])
        assert torch.equal(x, x2) and torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    mixed = [bool(items_of(torch.cat([x, y[:, -1:]], 1)[r].numpy())) for i in range(25) for x, y in [big.batch(i)]
             for r in range(4)]
    assert 30 <= sum(mixed) <= 70  # about half of 100 windows
    plain = retrieval.RetrievalMix(Windows(4), 0.0, byte_tokenizer())
    assert torch.equal(plain.batch(3)[0], Windows(4).batch(3)[0])
    other_seed = retrieval.RetrievalMix(Windows(4, seed=6), 0.5, byte_tokenizer(), pairs=2)
    assert any(not torch.equal(other_seed.batch(i)[0], big.batch(i)[0]) for i in range(5))
    with pytest.raises(ValueError, match="between 0 and 1"):
        retrieval.RetrievalMix(Windows(4), 1.5, byte_tokenizer())
