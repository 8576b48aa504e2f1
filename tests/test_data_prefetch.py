"""data/prefetch.py: prefetched batches as train.py reads them, resumed at any step, and the batch check at the
vocabulary limit. (Its checks of damaged shards and batches are in test_data_verify.py.)"""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from config import TrainConfig
from data.loader import RandomOffsetBatches, TrainBatches
from data.prefetch import DamagedBatch, PrefetchedBatches, check_batch
from test_data_loader import NoStops, Process, Recorder, SAMPLER_T, step_rows
from test_data_loader import sampler_dir  # noqa: F401 (a fixture: pytest finds it among the module's names)
from training.step import confirmation


# ------------------------------------- properties: the samplers under any split of the global batch and any resume step
# Every token of the train shards is its own global position, so a row of a batch says exactly which window it came
# from. The sequences of a step are read through training/step.py's train_step (its batch numbering is what is under
# test) with a model stand-in that only records its inputs, on every process and micro-batch of a split, and compared
# with the definition: sequence o of step s is sample s·G + o of the run (TrainBatches: window perm_e(n mod W) of
# epoch e = n div W; the official sampler: row o mod R of the authors' micro-batch o div R, drawn as their script
# draws it, with SplitMix64 seeds written out below).


@given(sampler=st.sampled_from(["windows", "random_offsets"]), stop=st.integers(1, 7), seed=st.integers(0, 999),
       split=st.sampled_from([(1, 2, 2), (2, 1, 2), (1, 4, 1), (4, 1, 1)]))
def test_a_resume_at_any_step_reads_what_an_uninterrupted_run_reads(sampler_dir, sampler, stop, seed, split):
    """Prefetched batches, as train.py reads them: one reader through steps 0..8, and a fresh one (a resumed
    process) from step `stop` on, read the same rows; the check before saving reads the next step's first
    micro-batch of each process."""
    batch_size, grad_accum, world_size = split
    layout = (2, 2)
    cfg = TrainConfig(data_dir=sampler_dir, batch_size=batch_size, global_batch_size=4, seed=seed, sampler=sampler,
                      grad_scale="official" if sampler == "random_offsets" else "mean",
                      reference_layout="2x2" if sampler == "random_offsets" else "")

    def source(b):
        if sampler == "windows":
            return TrainBatches(sampler_dir, b, SAMPLER_T, seed=seed)
        return RandomOffsetBatches(sampler_dir, b, SAMPLER_T, seed, 4, layout)

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


# -------------------------------------------------- properties: every threshold at, just below and just above its limit
# Each limit is written here from its documented rule, not read from the code: the divergence rules
# (training/divergence.py's docstring), the config's ranges (TrainConfig's field comments), token ids against the
# vocabulary (a batch, a shard, an adopted GPT-2 folder) and the memory check before any work. "Just below" and "just
# above" are the neighbouring float (math.nextafter) or integer, so a comparison moved by one is caught.


@given(vocab=st.integers(2, 70000), shape=st.tuples(st.integers(1, 4), st.integers(1, 9)), data=st.data())
def test_batch_check_at_the_vocabulary_limit_in_either_tensor(vocab, shape, data):
    """The largest allowed id is vocab_size - 1; vocab_size itself, in any one place of the inputs or of the
    targets alone, refuses the batch."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = torch.from_numpy(rng.integers(0, vocab, shape))
    y = torch.from_numpy(rng.integers(0, vocab, shape))
    x[0, 0] = vocab - 1
    check_batch(x, y, vocab, 0)
    which = data.draw(st.sampled_from(["x", "y"]))
    row, col = data.draw(st.integers(0, shape[0] - 1)), data.draw(st.integers(0, shape[1] - 1))
    damaged = (x.clone(), y.clone())
    damaged["xy".index(which)][row, col] = vocab
    with pytest.raises(DamagedBatch, match=f"holds token id {vocab}, but vocab_size is {vocab}"):
        check_batch(*damaged, vocab, 7)
