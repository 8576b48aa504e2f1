"""data/loader.py: deterministic train batches, fixed validation windows, shard checks."""
import contextlib
import json
import os

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from config import TrainConfig
from data import verify
from data.loader import (RandomOffsetBatches, TrainBatches, fold_in_seed, load_split_tokens, permute, read_manifest,
    validation_batches)
from data.shards import DataError, write_shard
from helpers import write_position_shards
from training.step import train_step

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


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_a_negative_batch_index_is_one_sentence_for_both_samplers(tmp_path, monkeypatch):
    from data.loader import RandomOffsetBatches, TrainBatches
    monkeypatch.setattr(verify, "_checked", {})
    folder = tmp_path / "data"
    folder.mkdir()
    write_position_shards(folder, [40, 30], val_first=100, val_tokens=16)
    for sampler in (RandomOffsetBatches(str(folder), 2, 8, seed=1, global_batch_size=4, layout=(1, 2)),
                    TrainBatches(str(folder), 2, 8, seed=1)):
        with pytest.raises(DataError) as info:
            sampler.batch(-1)
        assert str(info.value) == "batch index must be >= 0 (got -1)", type(sampler).__name__


# ------------------------------------- properties: the samplers under any split of the global batch and any resume step
# Every token of the train shards is its own global position, so a row of a batch says exactly which window it came
# from. The sequences of a step are read through training/step.py's train_step (its batch numbering is what is under
# test) with a model stand-in that only records its inputs, on every process and micro-batch of a split, and compared
# with the definition: sequence o of step s is sample s·G + o of the run (TrainBatches: window perm_e(n mod W) of
# epoch e = n div W; the official sampler: row o mod R of the authors' micro-batch o div R, drawn as their script
# draws it, with SplitMix64 seeds written out below).


SAMPLER_T = 6


SIZES = [40, 13, 7, 29, 61]  # train shards of unequal sizes (one holds a single window)


@pytest.fixture(scope="module")
def sampler_dir(tmp_path_factory):
    return write_position_shards(tmp_path_factory.mktemp("sampler"), SIZES, val_first=60000, val_tokens=50)


class Recorder(torch.nn.Module):
    """Stands in for the model: a loss that depends on one weight, and a list of the inputs it was given."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.seen = []

    def forward(self, x, targets):
        self.seen.append((x.clone(), targets.clone()))
        return None, self.weight * x.float().mean() * 0

    def basis_overflow(self):
        return torch.zeros(())


class Process:
    """One process of a data-parallel job, without the communication (each process is run in turn)."""
    enabled = False
    sharded = False
    device = torch.device("cpu")

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def all_reduce_sum(self, tensor):
        return tensor

    def gradient_sync(self, model, sync):
        return contextlib.nullcontext()

    def reshard(self, model):
        pass


class NoStops:
    requested = False

    def vote(self, device):
        return torch.zeros(())

    def any_process(self, ddp):
        return False


def step_rows(make_batches, step, batch_size, grad_accum, world_size, cfg):
    """Every (x, y) row that step `step` trains on, in the order of the global batch: micro-batch-major, then
    process, then row (sequence o = (micro·world + rank)·batch_size + row)."""
    reads = {}
    for rank in range(world_size):
        model = Recorder()
        train_step(model, model, make_batches(rank, batch_size), step, grad_accum, cfg, Process(rank, world_size),
                   lambda: torch.autocast("cpu", enabled=False), NoStops())
        for micro, xy in enumerate(model.seen):
            reads[micro, rank] = xy
    order = [reads[micro, rank] for micro in range(grad_accum) for rank in range(world_size)]
    return torch.cat([x for x, _ in order]), torch.cat([y for _, y in order])


def splits(global_batch):
    """Every (batch_size, grad_accum, world_size) whose product is the global batch."""
    return [(b, a, global_batch // (b * a)) for b in range(1, global_batch + 1) if global_batch % b == 0
            for a in range(1, global_batch // b + 1) if (global_batch // b) % a == 0]


def windows_by_definition(sampler_dir, seed, samples):
    """(x, y) of sample numbers `samples` of the windows sampler, from its docstring: W windows of T+1 tokens
    starting every T tokens of each shard; sample n reads window perm_e(n mod W) of epoch e = n div W."""
    starts = [(i, k * SAMPLER_T) for i, n in enumerate(SIZES) for k in range((n - 1) // SAMPLER_T)]
    offsets = np.r_[0, np.cumsum(SIZES)]
    rows = []
    for n in samples:
        epoch, position = divmod(n, len(starts))
        shard, start = starts[int(permute([position], len(starts), seed, epoch)[0])]
        rows.append(np.arange(offsets[shard] + start, offsets[shard] + start + SAMPLER_T + 1))
    rows = torch.tensor(np.array(rows))
    return rows[:, :-1], rows[:, 1:]


@given(global_batch=st.sampled_from([1, 2, 4, 6, 8, 12]), step=st.integers(0, 40), seed=st.integers(0, 2**32),
       data=st.data())
def test_windows_any_split_reads_the_steps_samples(sampler_dir, global_batch, step, seed, data):
    batch_size, grad_accum, world_size = data.draw(st.sampled_from(splits(global_batch)))
    cfg = TrainConfig(data_dir=sampler_dir, batch_size=batch_size, global_batch_size=global_batch, seed=seed)
    x, y = step_rows(lambda rank, b: TrainBatches(sampler_dir, b, SAMPLER_T, seed=seed), step, batch_size, grad_accum,
                     world_size, cfg)
    ref_x, ref_y = windows_by_definition(sampler_dir, seed, range(step * global_batch, (step + 1) * global_batch))
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)


@given(size=st.integers(1, 3000), seed=st.integers(0, 2**63), epoch=st.integers(0, 10**6))
def test_permute_is_a_bijection_of_any_size(size, seed, epoch):
    image = permute(np.arange(size), size, seed, epoch)
    assert sorted(image.tolist()) == list(range(size))


@given(epochs=st.integers(1, 3), batch_size=st.integers(1, 9), seed=st.integers(0, 1000))
def test_every_window_once_per_epoch(sampler_dir, epochs, batch_size, seed):
    loader = TrainBatches(sampler_dir, batch_size, SAMPLER_T, seed=seed)
    W = loader.windows_per_epoch
    assert W == sum((n - 1) // SAMPLER_T for n in SIZES)
    rows = torch.cat([loader.batch(i)[0] for i in range(-(-epochs * W // batch_size))])[:epochs * W]
    for e in range(epochs):
        firsts = sorted(rows[e * W:(e + 1) * W, 0].tolist())
        assert firsts == sorted(int(np.r_[0, np.cumsum(SIZES)][i]) + k * SAMPLER_T
                                for i, n in enumerate(SIZES) for k in range((n - 1) // SAMPLER_T))
    assert [loader.epoch_of(i) for i in range(3)] == [i * batch_size // W for i in range(3)]


MASK = 2**64 - 1


def splitmix_seed(base, *values):
    """Their seed rule, written out: x = base; for each value: x += value + golden gamma, then SplitMix64's
    finaliser; the result below 2**63."""
    x = base
    for value in values:
        x = (x + value + 0x9E3779B97F4A7C15) & MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
        x = x ^ (x >> 31)
    return x % 2**63


def official_by_definition(seed, step, processes, micro_steps, rows):
    """The rows of step `step` as the authors' processes draw them, in the order of the global batch
    (their micro-batch m of process p is block m·P + p)."""
    starts = np.r_[0, np.cumsum(SIZES)]
    out = []
    for m in range(micro_steps):
        for p in range(processes):
            generator = torch.Generator().manual_seed(splitmix_seed(seed, p, step * micro_steps + m))
            shard = int(torch.randint(len(SIZES), (1,), generator=generator))
            drawn = torch.randint(SIZES[shard] - SAMPLER_T, (rows,), generator=generator)
            out += [np.arange(starts[shard] + int(s), starts[shard] + int(s) + SAMPLER_T + 1) for s in drawn]
    out = torch.tensor(np.array(out))
    return out[:, :-1], out[:, 1:]


@given(layout=st.sampled_from([(1, 1), (2, 1), (1, 3), (2, 2), (3, 2)]), rows=st.integers(1, 2),
       step=st.integers(0, 10**6), seed=st.integers(0, 2**40), data=st.data())
def test_official_any_split_reads_what_their_launch_reads(sampler_dir, layout, rows, step, seed, data):
    processes, micro_steps = layout
    global_batch = processes * micro_steps * rows
    batch_size, grad_accum, world_size = data.draw(st.sampled_from(splits(global_batch)))
    cfg = TrainConfig(data_dir=sampler_dir, batch_size=batch_size, global_batch_size=global_batch, seed=seed,
                      sampler="random_offsets", grad_scale="official", reference_layout=f"{processes}x{micro_steps}")
    x, y = step_rows(lambda rank, b: RandomOffsetBatches(sampler_dir, b, SAMPLER_T, seed, global_batch, layout), step,
                     batch_size, grad_accum, world_size, cfg)
    ref_x, ref_y = official_by_definition(seed, step, processes, micro_steps, rows)
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)


def test_the_seed_rule_matches_splitmix64_on_known_values():
    # SplitMix64 from state 0: its first output is 0xE220A8397B1DCDAF (the published reference sequence).
    assert splitmix_seed(0, 0) == 0xE220A8397B1DCDAF % 2**63
    from data.loader import fold_in_seed
    for values in [(42, 0, 0), (42, 7, 3), (2**63 - 1, 2**40, 5), (0,)]:
        assert fold_in_seed(*values) == splitmix_seed(*values)


def test_a_shard_of_block_size_plus_one_tokens_holds_one_window_and_one_fewer_none(data_dir):
    """The window checks at their edge, away from the usual T: the 101-token train shard holds one window at
    block_size 100 and none at 101 (then no train shard does); the 83-token validation shard one at 82, none at
    83; the random-offset sampler takes the 8-token shard at block_size 7 (8 = 7 + 1)."""
    one = TrainBatches(data_dir, batch_size=3, block_size=100, seed=5)
    assert one.windows_per_epoch == 1
    x, y = one.batch(2)
    assert torch.equal(x, torch.arange(100).expand(3, 100)) and torch.equal(y, torch.arange(1, 101).expand(3, 100))
    with pytest.raises(DataError, match=r"\(166 tokens\) hold no window of block_size\+1 = 102 tokens"):
        TrainBatches(data_dir, batch_size=3, block_size=101, seed=5)
    (x, y), = validation_batches(data_dir, batch_size=4, block_size=82)
    assert x.shape == (1, 82) and int(x[0, 0]) == 60000 and int(y[0, -1]) == 60082
    with pytest.raises(DataError, match="validation shards .* hold no window of block_size\\+1 = 84 tokens"):
        list(validation_batches(data_dir, batch_size=4, block_size=83))
    sampler = RandomOffsetBatches(data_dir, batch_size=2, block_size=T - 1, seed=42, global_batch_size=12,
                                  layout=(2, 3))
    x, y = sampler.batch(0)
    assert x.shape == (2, T - 1) and (y - x == 1).all()
