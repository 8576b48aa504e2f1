"""Deterministic batches from memory-mapped token shards.

Training windows: each train shard is cut into windows of block_size+1 tokens that start every block_size
tokens (so every token is a target once per epoch). Sample number n = index*batch_size + b goes to window
perm_e(n mod W) of epoch e = n div W, where W is the number of windows and perm_e a pseudo-random
permutation keyed by (seed, e). So batch(index) is a pure function of (seed, index): no state, no
iteration order, nothing to save for resume but the step; and every window is used once per epoch.

The authors' sampler (RandomOffsetBatches, the "official" recipe) draws each sequence at a random start of a
random shard instead, with replacement, seeded per (process, micro-batch) of their launch layout; it is as
stateless, so resuming it also needs only the step.

Validation windows: the same cut of the validation shards, in order, so the set is fixed for every run.
"""
import glob
import mmap
import os

import numpy as np
import torch

from data.manifest import journals, read_manifest, split_files  # noqa: F401 (part of this module's interface)
from data.prepared import PreparedData, open_data  # noqa: F401 (part of this module's interface)
from data.shards import DataError
from data.verify import verify_shards  # noqa: F401 (part of this module's interface)


def data_description(data_dir):
    """The manifest, or for a manifest-free llm.c-style directory (which holds GPT-2 token shards) a stand-in
    {"tokenizer": "gpt2", "shards": None}; a DataError that says how to prepare the directory otherwise."""
    marked = os.path.exists(os.path.join(data_dir, "manifest.json")) or journals(data_dir)
    if os.path.isdir(data_dir) and not marked and glob.glob(os.path.join(data_dir, "*.bin")):
        split_files(data_dir, "train")  # a DataError if it has no train shards
        return {"tokenizer": "gpt2", "shards": None}
    return read_manifest(data_dir)


def _windows(shards, block_size):
    """Per shard, the number of block_size+1 windows starting every block_size tokens; and their prefix sums."""
    counts = np.array([max(0, (len(s) - 1) // block_size) for s in shards], dtype=np.int64)
    return counts, np.concatenate([[0], np.cumsum(counts)])


def _read_ahead(shard, start, count):
    """Ask the kernel to read tokens [start, start + count) of a memory-mapped shard in the background. Done for
    every window of a batch before copying any, the windows come from disk in parallel instead of one page fault
    after another: 1.7 instead of 20 ms per 20 x 4096 batch on a cold page cache here (bench/bench_scale.py)."""
    mapped = getattr(shard, "base", None)
    if not isinstance(mapped, mmap.mmap) or not hasattr(mapped, "madvise"):
        return  # an empty shard (a plain array), or a platform without madvise
    begin = shard.offset % mmap.ALLOCATIONGRANULARITY + shard.itemsize * start  # np.memmap maps from here
    aligned = begin - begin % mmap.PAGESIZE
    mapped.madvise(mmap.MADV_WILLNEED, aligned, begin + shard.itemsize * count - aligned)


def _gather(shards, offsets, windows, block_size):
    """(x, y) of the numbered windows (offsets: the windows' prefix sums per shard, from _windows)."""
    shard_of = np.searchsorted(offsets, windows, side="right") - 1
    return _gather_starts(shards, shard_of, (windows - offsets[shard_of]) * block_size, block_size)


def _gather_starts(shards, shard_of, starts, block_size):
    """(x, y): row r holds tokens starts[r] ... + block_size of shard shard_of[r], and y the same shifted by one.
    Filled straight from the memory maps with numpy: no intermediate (B, T+1) array and no torch strided copy
    (which is slow on a busy CPU)."""
    x = np.empty((len(starts), block_size), dtype=np.int64)
    y = np.empty((len(starts), block_size), dtype=np.int64)
    rows = list(zip(np.asarray(shard_of).tolist(), np.asarray(starts).tolist()))
    for s, start in rows:
        _read_ahead(shards[s], start, block_size + 1)
    for row, (s, start) in enumerate(rows):
        x[row] = shards[s][start:start + block_size]
        y[row] = shards[s][start + 1:start + block_size + 1]
    return torch.from_numpy(x), torch.from_numpy(y)


def _round_function(half, key):
    # splitmix64-style mixing of a uint64 array; it wraps modulo 2**64 on purpose (callers silence the warning).
    x = (half ^ key) * np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def permute(positions, size, seed, epoch):
    """A pseudo-random permutation of range(size) keyed by (seed, epoch), applied to `positions`.

    A 4-round Feistel network is a bijection on [0, 4**h) >= size; values that land outside range(size) are
    mapped again until they land inside ("cycle walking"), which keeps it a bijection on range(size)."""
    half_bits = max(1, (int(size - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half_bits) - 1)
    keys = np.random.SeedSequence([seed, epoch]).generate_state(4, dtype=np.uint64)

    def feistel(x):
        left, right = x >> np.uint64(half_bits), x & mask
        for key in keys:
            left, right = right, left ^ (_round_function(right, key) & mask)
        return (left << np.uint64(half_bits)) | right

    with np.errstate(over="ignore"):
        out = feistel(np.asarray(positions, dtype=np.uint64))
        outside = np.flatnonzero(out >= np.uint64(size))
        while outside.size:
            out[outside] = feistel(out[outside])
            outside = outside[out[outside] >= np.uint64(size)]
    return out.astype(np.int64)


class TrainBatches:
    """Random training batches; batch(index) depends only on (data, batch_size, block_size, seed, index).

    train.py uses index = (step * grad_accum + micro_step) * world_size + rank, so that runs with different
    rank / accumulation layouts see the same windows, and resuming needs only the step."""

    def __init__(self, data, batch_size, block_size, seed=0):
        """data: a PreparedData (data/prepared.py), or a prepared folder's path."""
        if batch_size < 1 or block_size < 1:
            raise DataError(f"batch_size and block_size must be positive (got {batch_size}, {block_size})")
        self.data = data = open_data(data)
        self.data_dir, self.batch_size, self.block_size, self.seed = data.path, batch_size, block_size, seed
        verify_shards(data, ("train",))
        self.paths, self.shards = data.split_paths("train"), data.shards("train")
        self.tokens = sum(len(s) for s in self.shards)
        self.window_counts, self.offsets = _windows(self.shards, block_size)
        self.windows_per_epoch = int(self.offsets[-1])
        if self.windows_per_epoch == 0:
            raise DataError(f"the train shards of {data.path} ({self.tokens:,} tokens) hold no window of block_size+1 "
                            f"= {block_size + 1} tokens; use a smaller block_size or more data")

    def batch(self, index):
        """(x, y): int64 (batch_size, block_size) inputs and next-token targets of batch number `index`."""
        if index < 0:
            raise DataError(f"batch index must be >= 0 (got {index})")
        samples = index * self.batch_size + np.arange(self.batch_size, dtype=np.int64)
        epochs, positions = np.divmod(samples, self.windows_per_epoch)
        windows = np.empty(self.batch_size, dtype=np.int64)
        for epoch in np.unique(epochs).tolist():
            chosen = epochs == epoch
            windows[chosen] = permute(positions[chosen], self.windows_per_epoch, self.seed, epoch)
        return _gather(self.shards, self.offsets, windows, self.block_size)

    def epoch_of(self, index):
        """The epoch (full passes over the train windows) that batch `index` starts in."""
        return index * self.batch_size // self.windows_per_epoch


def validation_batches(data, batch_size, block_size, max_windows=None):
    """Yield (x, y) batches of the fixed validation windows, in order: all of them, or the first max_windows.
    data: a PreparedData, or a prepared folder's path.

    The last batch may be smaller, so the windows scored are the same whatever the batch size."""
    data = open_data(data)
    verify_shards(data, ("val",))
    shards = data.shards("val")
    _, offsets = _windows(shards, block_size)
    total = int(offsets[-1])
    if total == 0:
        raise DataError(f"the validation shards of {data.path} hold no window of block_size+1 = {block_size + 1} "
                        f"tokens; use a smaller block_size or prepare with a larger --val-tokens")
    if max_windows is not None:
        total = min(total, max_windows)
    for start in range(0, total, batch_size):
        windows = np.arange(start, min(start + batch_size, total), dtype=np.int64)
        yield _gather(shards, offsets, windows, block_size)


def load_split_tokens(data, split="val"):
    """All tokens of a split as one 1-D uint16 array (memory-mapped when the split is a single shard). data: a
    PreparedData, or a prepared folder's path."""
    data = open_data(data)
    verify_shards(data, (split,))
    shards = data.shards(split)
    return shards[0] if len(shards) == 1 else np.concatenate(shards)


# ----------------------------------------------------------------------------- the authors' sampler

def fold_in_seed(base, *values):
    """The authors' per-batch seed: SplitMix64 applied to the running sum of base and each value in turn, modulo
    2**64, kept below 2**63 (what torch.Generator.manual_seed takes)."""
    mask = (1 << 64) - 1
    x = base & mask
    for value in values:
        x = (x + (value & mask) + 0x9E3779B97F4A7C15) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        x ^= x >> 31
    return x & ((1 << 63) - 1)


class RandomOffsetBatches:
    """The authors' training sampler (train.sampler = "random_offsets"): every sequence is block_size + 1 tokens
    from a uniformly chosen train shard at a uniformly random start, drawn with replacement.

    They run P processes x M micro-batches of R = global_batch_size / (P·M) sequences per step (the
    reference_layout), and process p draws micro-batch m of step s with a torch.Generator seeded
    fold_in_seed(seed, p, s·M + m): first the shard (randint over the shards), then the R starts (randint
    below the shard's tokens - block_size). Their offset of 512 uint16 into the file skips exactly the 1024-byte
    shard header, so no token is skipped. Sequence o (0 <= o < global_batch_size) of a step is row o mod R of
    their micro-batch (m, p) with o div R = m·P + p, and batch(index) reads sequences index·batch_size ... of
    the run, as TrainBatches does: any split into processes and micro-batches reads exactly the sequences theirs
    read, and a resume needs only the step."""

    def __init__(self, data, batch_size, block_size, seed, global_batch_size, layout):
        self.data = data = open_data(data)
        self.data_dir, self.batch_size, self.block_size, self.seed = data.path, batch_size, block_size, seed
        self.global_batch_size = global_batch_size
        self.processes, self.micro_steps = layout
        self.rows = global_batch_size // (self.processes * self.micro_steps)
        verify_shards(data, ("train",))
        self.paths, self.shards = data.split_paths("train"), data.shards("train")
        short = [(p, len(s)) for p, s in zip(self.paths, self.shards) if len(s) <= block_size]
        if short:
            raise DataError(f"train shard {short[0][0]} holds {short[0][1]} tokens, not more than "
                            f"block_size {block_size}: the random-offset sampler draws a start in every shard, so "
                            "use a smaller block_size, remove the shard, or --sampler=windows")

    def batch(self, index):
        """(x, y): int64 (batch_size, block_size) inputs and next-token targets of batch number `index`."""
        if index < 0:
            raise DataError(f"batch index must be >= 0 (got {index})")
        samples = index * self.batch_size + np.arange(self.batch_size, dtype=np.int64)
        step, within = np.divmod(samples, self.global_batch_size)
        micro_batch, row = np.divmod(within, self.rows)  # micro_batch = m·P + p
        shard_of = np.empty(self.batch_size, dtype=np.int64)
        starts = np.empty(self.batch_size, dtype=np.int64)
        for s, mp in sorted(set(zip(step.tolist(), micro_batch.tolist()))):
            m, p = divmod(mp, self.processes)
            generator = torch.Generator().manual_seed(fold_in_seed(self.seed, p, s * self.micro_steps + m))
            shard = int(torch.randint(len(self.shards), (1,), generator=generator))
            drawn = torch.randint(len(self.shards[shard]) - self.block_size, (self.rows,), generator=generator)
            chosen = (step == s) & (micro_batch == mp)
            shard_of[chosen] = shard
            starts[chosen] = drawn.numpy()[row[chosen]]
        return _gather_starts(self.shards, shard_of, starts, self.block_size)
