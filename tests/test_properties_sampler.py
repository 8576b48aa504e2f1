"""The samplers under any split of the global batch and any resume step (hypothesis; profiles in conftest.py).

Every token of the train shards is its own global position, so a row of a batch says exactly which window it came
from. The sequences of a step are read through training/step.py's train_step (its batch numbering is what is
under test) with a model stand-in that only records its inputs, on every process and micro-batch of a split, and
compared with the definition: sequence o of step s is sample s·G + o of the run (TrainBatches: window
perm_e(n mod W) of epoch e = n div W; the official sampler: row o mod R of the authors' micro-batch o div R,
drawn as their script draws it, with SplitMix64 seeds written out below).
"""
import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from config import TrainConfig
from data.loader import RandomOffsetBatches, TrainBatches, permute
from data.prefetch import PrefetchedBatches
from training.step import confirmation, train_step
from helpers import write_position_shards

T = 6
SIZES = [40, 13, 7, 29, 61]  # train shards of unequal sizes (one holds a single window)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
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


def windows_by_definition(data_dir, seed, samples):
    """(x, y) of sample numbers `samples` of the windows sampler, from its docstring: W windows of T+1 tokens
    starting every T tokens of each shard; sample n reads window perm_e(n mod W) of epoch e = n div W."""
    starts = [(i, k * T) for i, n in enumerate(SIZES) for k in range((n - 1) // T)]
    offsets = np.r_[0, np.cumsum(SIZES)]
    rows = []
    for n in samples:
        epoch, position = divmod(n, len(starts))
        shard, start = starts[int(permute([position], len(starts), seed, epoch)[0])]
        rows.append(np.arange(offsets[shard] + start, offsets[shard] + start + T + 1))
    rows = torch.tensor(np.array(rows))
    return rows[:, :-1], rows[:, 1:]


@given(global_batch=st.sampled_from([1, 2, 4, 6, 8, 12]), step=st.integers(0, 40), seed=st.integers(0, 2**32),
       data=st.data())
def test_windows_any_split_reads_the_steps_samples(data_dir, global_batch, step, seed, data):
    batch_size, grad_accum, world_size = data.draw(st.sampled_from(splits(global_batch)))
    cfg = TrainConfig(data_dir=data_dir, batch_size=batch_size, global_batch_size=global_batch, seed=seed)
    x, y = step_rows(lambda rank, b: TrainBatches(data_dir, b, T, seed=seed), step, batch_size, grad_accum,
                     world_size, cfg)
    ref_x, ref_y = windows_by_definition(data_dir, seed, range(step * global_batch, (step + 1) * global_batch))
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)


@given(size=st.integers(1, 3000), seed=st.integers(0, 2**63), epoch=st.integers(0, 10**6))
def test_permute_is_a_bijection_of_any_size(size, seed, epoch):
    image = permute(np.arange(size), size, seed, epoch)
    assert sorted(image.tolist()) == list(range(size))


@given(epochs=st.integers(1, 3), batch_size=st.integers(1, 9), seed=st.integers(0, 1000))
def test_every_window_once_per_epoch(data_dir, epochs, batch_size, seed):
    loader = TrainBatches(data_dir, batch_size, T, seed=seed)
    W = loader.windows_per_epoch
    assert W == sum((n - 1) // T for n in SIZES)
    rows = torch.cat([loader.batch(i)[0] for i in range(-(-epochs * W // batch_size))])[:epochs * W]
    for e in range(epochs):
        firsts = sorted(rows[e * W:(e + 1) * W, 0].tolist())
        assert firsts == sorted(int(np.r_[0, np.cumsum(SIZES)][i]) + k * T
                                for i, n in enumerate(SIZES) for k in range((n - 1) // T))
    assert [loader.epoch_of(i) for i in range(3)] == [i * batch_size // W for i in range(3)]


# ----------------------------------------------------------------------------- the authors' sampler

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
            drawn = torch.randint(SIZES[shard] - T, (rows,), generator=generator)
            out += [np.arange(starts[shard] + int(s), starts[shard] + int(s) + T + 1) for s in drawn]
    out = torch.tensor(np.array(out))
    return out[:, :-1], out[:, 1:]


@given(layout=st.sampled_from([(1, 1), (2, 1), (1, 3), (2, 2), (3, 2)]), rows=st.integers(1, 2),
       step=st.integers(0, 10**6), seed=st.integers(0, 2**40), data=st.data())
def test_official_any_split_reads_what_their_launch_reads(data_dir, layout, rows, step, seed, data):
    processes, micro_steps = layout
    global_batch = processes * micro_steps * rows
    batch_size, grad_accum, world_size = data.draw(st.sampled_from(splits(global_batch)))
    cfg = TrainConfig(data_dir=data_dir, batch_size=batch_size, global_batch_size=global_batch, seed=seed,
                      sampler="random_offsets", grad_scale="official", reference_layout=f"{processes}x{micro_steps}")
    x, y = step_rows(lambda rank, b: RandomOffsetBatches(data_dir, b, T, seed, global_batch, layout), step,
                     batch_size, grad_accum, world_size, cfg)
    ref_x, ref_y = official_by_definition(seed, step, processes, micro_steps, rows)
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)


def test_the_seed_rule_matches_splitmix64_on_known_values():
    # SplitMix64 from state 0: its first output is 0xE220A8397B1DCDAF (the published reference sequence).
    assert splitmix_seed(0, 0) == 0xE220A8397B1DCDAF % 2**63
    from data.loader import fold_in_seed
    for values in [(42, 0, 0), (42, 7, 3), (2**63 - 1, 2**40, 5), (0,)]:
        assert fold_in_seed(*values) == splitmix_seed(*values)


# ----------------------------------------------------------------------------- resume at any step

@given(sampler=st.sampled_from(["windows", "random_offsets"]), stop=st.integers(1, 7), seed=st.integers(0, 999),
       split=st.sampled_from([(1, 2, 2), (2, 1, 2), (1, 4, 1), (4, 1, 1)]))
def test_a_resume_at_any_step_reads_what_an_uninterrupted_run_reads(data_dir, sampler, stop, seed, split):
    """Prefetched batches, as train.py reads them: one reader through steps 0..8, and a fresh one (a resumed
    process) from step `stop` on, read the same rows; the check before saving reads the next step's first
    micro-batch of each process."""
    batch_size, grad_accum, world_size = split
    layout = (2, 2)
    cfg = TrainConfig(data_dir=data_dir, batch_size=batch_size, global_batch_size=4, seed=seed, sampler=sampler,
                      grad_scale="official" if sampler == "random_offsets" else "mean",
                      reference_layout="2x2" if sampler == "random_offsets" else "")

    def source(b):
        if sampler == "windows":
            return TrainBatches(data_dir, b, T, seed=seed)
        return RandomOffsetBatches(data_dir, b, T, seed, 4, layout)

    def run(first, last, readers):
        return [step_rows(lambda rank, b: readers[rank], s, batch_size, grad_accum, world_size, cfg)
                for s in range(first, last)]

    def prefetched():
        return [PrefetchedBatches(source(batch_size), stride=world_size) for _ in range(world_size)]

    uninterrupted = run(0, 9, prefetched())
    resumed = run(stop, 9, prefetched())
    for a, b in zip(uninterrupted[stop:], resumed):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for rank in range(world_size):
        model = Recorder()
        confirmation(model, source(batch_size), stop, grad_accum, Process(rank, world_size),
                     lambda: torch.autocast("cpu", enabled=False), NoStops())
        first = uninterrupted[stop][0][rank * batch_size:(rank + 1) * batch_size]
        assert torch.equal(model.seen[0][0], first)
