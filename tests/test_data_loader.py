"""data/loader.py: deterministic train batches, fixed validation windows, shard checks."""
import json
import os

import numpy as np
import pytest
import torch

from data.loader import (RandomOffsetBatches, TrainBatches, fold_in_seed, load_split_tokens, permute, read_manifest,
                         validation_batches)
from data.shards import DataError, write_shard

T = 8


@pytest.fixture
def data_dir(tmp_path):
    """llm.c-style folder without a manifest: every token is its own global position, so a window shows
    where it came from. Train shards of 101, 57 and 8 tokens (the last too short for any window)."""
    write_shard(str(tmp_path / "tiny_val_000000.bin"), np.arange(60000, 60000 + 83))
    start = 0
    for i, n in enumerate([101, 57, 8]):
        write_shard(str(tmp_path / f"tiny_train_{i + 1:06d}.bin"), np.arange(start, start + n))
        start += n
    return str(tmp_path)


def all_train_window_starts():
    """Brute force: every start (multiple of T inside a shard) with T+1 tokens left in that shard."""
    starts, offset = [], 0
    for n in [101, 57, 8]:
        starts += [offset + k for k in range(0, n - T, T)]
        offset += n
    return starts


def test_batch_contents_are_shard_windows(data_dir):
    tb = TrainBatches(data_dir, batch_size=5, block_size=T, seed=3)
    x, y = tb.batch(7)
    assert x.dtype == torch.int64 and x.shape == (5, T) and y.shape == (5, T)
    for row_x, row_y in zip(x, y):
        start = int(row_x[0])
        assert start in all_train_window_starts()
        assert torch.equal(row_x, torch.arange(start, start + T))
        assert torch.equal(row_y, torch.arange(start + 1, start + T + 1))


def test_batch_is_a_pure_function_of_seed_and_index(data_dir):
    a = TrainBatches(data_dir, batch_size=4, block_size=T, seed=11)
    b = TrainBatches(data_dir, batch_size=4, block_size=T, seed=11)
    forward = [a.batch(i) for i in range(30)]
    backward = [b.batch(i) for i in reversed(range(30))][::-1]
    for (xa, ya), (xb, yb) in zip(forward, backward):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    other_seed = TrainBatches(data_dir, batch_size=4, block_size=T, seed=12)
    assert not all(torch.equal(other_seed.batch(i)[0], forward[i][0]) for i in range(30))


def test_each_window_once_per_epoch(data_dir):
    starts = all_train_window_starts()
    tb = TrainBatches(data_dir, batch_size=3, block_size=T, seed=0)
    assert tb.windows_per_epoch == len(starts)
    # Batch-sized pieces of the sample sequence; the window order is a fresh permutation each epoch.
    seen = torch.cat([tb.batch(i)[0][:, 0] for i in range(2 * len(starts))]).tolist()
    for epoch in range(2):
        assert sorted(seen[epoch * len(starts):(epoch + 1) * len(starts)]) == starts
    assert seen[:len(starts)] != seen[len(starts):2 * len(starts)]


def test_ranks_and_accumulation_split_the_same_samples(data_dir):
    # batch_size 2 at index i holds samples 2i, 2i+1; batch_size 1 at indices 2i and 2i+1 holds the same ones.
    one = TrainBatches(data_dir, batch_size=1, block_size=T, seed=5)
    two = TrainBatches(data_dir, batch_size=2, block_size=T, seed=5)
    for i in range(20):
        assert torch.equal(two.batch(i)[0], torch.cat([one.batch(2 * i)[0], one.batch(2 * i + 1)[0]]))


@pytest.mark.parametrize("size", [1, 2, 3, 5, 16, 17, 1000, 4097])
def test_permute_is_a_bijection(size):
    out = permute(np.arange(size), size, seed=42, epoch=3)
    assert np.array_equal(np.sort(out), np.arange(size))
    if size >= 1000:
        assert not np.array_equal(out, np.arange(size))


def test_validation_windows_are_fixed_and_in_order(data_dir):
    batches = list(validation_batches(data_dir, batch_size=3, block_size=T))
    # 83 tokens -> (83-1)//8 = 10 windows -> batches of 3, 3, 3 and 1.
    assert [len(x) for x, _ in batches] == [3, 3, 3, 1]
    rows_x, rows_y = torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
    for w in range(10):
        start = 60000 + w * T
        assert torch.equal(rows_x[w], torch.arange(start, start + T))
        assert torch.equal(rows_y[w], torch.arange(start + 1, start + T + 1))
    # The first max_windows windows, the same ones whatever the batch size; all of them if there are fewer.
    for batch_size in (1, 2, 4, 7, 64):
        first7 = torch.cat([x for x, _ in validation_batches(data_dir, batch_size=batch_size, block_size=T,
                                                              max_windows=7)])
        assert torch.equal(first7, rows_x[:7])
        every = torch.cat([x for x, _ in validation_batches(data_dir, batch_size=batch_size, block_size=T,
                                                             max_windows=500)])
        assert torch.equal(every, rows_x)


def test_load_split_tokens_concatenates_shards(data_dir):
    assert np.array_equal(load_split_tokens(data_dir, "val"), np.arange(60000, 60083))
    assert np.array_equal(load_split_tokens(data_dir, "train"), np.arange(166))


def test_truncated_shard_is_named(data_dir):
    path = f"{data_dir}/tiny_train_000002.bin"
    with open(path, "r+b") as f:
        f.truncate(1024 + 2 * 50)
    with pytest.raises(DataError, match="tiny_train_000002.bin: header says 57 tokens"):
        TrainBatches(data_dir, batch_size=2, block_size=T)


def test_user_errors(tmp_path, data_dir):
    with pytest.raises(DataError, match="does not exist"):
        TrainBatches(str(tmp_path / "nope"), batch_size=2, block_size=T)
    with pytest.raises(DataError, match="data directory .*nope does not exist; prepare one"):
        read_manifest(str(tmp_path / "nope"))
    with pytest.raises(DataError, match="hold no window"):
        TrainBatches(data_dir, batch_size=2, block_size=200)
    with pytest.raises(DataError, match="has no manifest.json"):
        read_manifest(data_dir)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="has no train shards"):
        TrainBatches(str(empty), batch_size=2, block_size=T)
    (empty / "progress.json").write_text("{}")
    with pytest.raises(DataError, match="did not finish"):
        TrainBatches(str(empty), batch_size=2, block_size=T)


def test_manifest_decides_the_splits(tmp_path):
    # With a manifest, its shard list is used, whatever the file names say.
    write_shard(str(tmp_path / "a.bin"), np.arange(50))
    write_shard(str(tmp_path / "b.bin"), np.arange(100, 150))
    manifest = {"tokenizer": "byte", "shards": [{"file": "a.bin", "split": "val", "tokens": 50},
                                                {"file": "b.bin", "split": "train", "tokens": 50}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert read_manifest(str(tmp_path))["tokenizer"] == "byte"
    assert int(TrainBatches(str(tmp_path), batch_size=1, block_size=T).batch(0)[0][0, 0]) >= 100
    assert np.array_equal(load_split_tokens(str(tmp_path), "val"), np.arange(50))


def test_random_offset_sequences_do_not_depend_on_the_split_and_come_from_one_shard(data_dir):
    """The authors' sampler: a step's 12 sequences (their layout 2 processes x 3 micro-batches of 2) are the same
    read 1, 3 or 4 at a time; each is consecutive tokens of one shard; a resumed reader gives the same."""
    os.remove(os.path.join(data_dir, "tiny_train_000003.bin"))  # 8 tokens: too short for a start
    def step_sequences(batch_size, steps=2):
        sampler = RandomOffsetBatches(data_dir, batch_size=batch_size, block_size=T, seed=42, global_batch_size=12,
                                      layout=(2, 3))
        xs, ys = zip(*(sampler.batch(i) for i in range(steps * 12 // batch_size)))
        return torch.cat(xs), torch.cat(ys)
    x, y = step_sequences(1)
    for batch_size in (3, 4):
        other_x, other_y = step_sequences(batch_size)
        assert torch.equal(other_x, x) and torch.equal(other_y, y)
    assert torch.equal(x[:, 1:], y[:, :-1])
    shard_of = x[:, 0] >= 101  # token values are global positions: shard 1 holds 0..100, shard 2 101..157
    ends = torch.where(shard_of, torch.tensor(158), torch.tensor(101))
    assert (y[:, -1] < ends).all() and (y - x == 1).all()  # inside one shard, never across
    assert len(set(x[:, 0].tolist())) > 12  # 24 draws with replacement, not all equal
    # sequence o of step 0 is row o mod 2 of their micro-batch m of process p, o div 2 = m·2 + p (2 processes),
    # drawn with the seed fold_in_seed(42, p, m): a shard, then the 2 starts
    for m in range(3):
        for p in range(2):
            generator = torch.Generator().manual_seed(fold_in_seed(42, p, m))
            shard = int(torch.randint(2, (1,), generator=generator))
            starts = torch.randint((101, 57)[shard] - T, (2,), generator=generator) + (0, 101)[shard]
            o = 2 * (m * 2 + p)
            assert x[o:o + 2, 0].tolist() == starts.tolist(), (m, p)


def test_random_offsets_need_every_shard_longer_than_the_context(data_dir):
    with pytest.raises(DataError, match="tiny_train_000003.bin holds 8 tokens, not more than block_size 8.*--sampler=windows"):
        RandomOffsetBatches(data_dir, batch_size=2, block_size=T, seed=42, global_batch_size=12, layout=(2, 3))


def test_fold_in_seed_is_splitmix64_of_the_running_sum():
    """SplitMix64's published outputs for state 0 (0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F),
    below 2**63: fold_in_seed(0, v) mixes state v, and the state advances by the golden gamma."""
    gamma = 0x9E3779B97F4A7C15
    outputs = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert [fold_in_seed(0, k * gamma % 2**64) for k in range(3)] == [o & (2**63 - 1) for o in outputs]


def test_validation_windows_cover_every_shard_of_a_split_of_several(tmp_path):
    """Each validation shard gives its own (len - 1) // T windows, every T tokens (none crosses a shard): read
    straight from the shard files in the manifest's order, they are what validation_batches yields."""
    from data.shards import open_shard
    from helpers import synthetic_corpus
    data_dir = synthetic_corpus(tmp_path, 6, 400, val_tokens=2500, shard_tokens=1000)
    shards = [s for s in read_manifest(data_dir)["shards"] if s["split"] == "val"]
    assert [s["tokens"] for s in shards] == [1000, 1000, 500]
    block = 64
    expected = []
    for shard in shards:
        tokens = np.asarray(open_shard(os.path.join(data_dir, shard["file"])), dtype=np.int64)
        expected += [tokens[i * block:i * block + block + 1] for i in range((len(tokens) - 1) // block)]
    batches = list(validation_batches(data_dir, batch_size=4, block_size=block))
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    assert len(expected) == 15 + 15 + 7 and x.shape == (len(expected), block)
    assert torch.equal(x, torch.from_numpy(np.stack([w[:-1] for w in expected])))
    assert torch.equal(y, torch.from_numpy(np.stack([w[1:] for w in expected])))
