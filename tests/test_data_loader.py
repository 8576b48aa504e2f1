"""data/loader.py: deterministic train batches, fixed validation windows, shard checks."""
import json

import numpy as np
import pytest
import torch

from data.loader import TrainBatches, load_split_tokens, permute, read_manifest, validation_batches
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
