"""Every threshold at, just below and just above its limit (hypothesis; the profiles are in conftest.py).

Each limit is written here from its documented rule, not read from the code: the divergence rules
(training/divergence.py's docstring), the config's ranges (TrainConfig's field comments), token ids against the
vocabulary (a batch, a shard, an adopted GPT-2 folder) and the memory check before any work. "Just below" and
"just above" are the neighbouring float (math.nextafter) or integer, so a comparison moved by one is caught.
"""
import dataclasses
import json
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from config import ConfigError, TrainConfig
from data.prefetch import DamagedBatch, check_batch
from data.shards import DataError, write_shard
from training.divergence import DivergenceMonitor

V = 320
UNIFORM = math.log(V)
losses = st.floats(min_value=0.5, max_value=4.0, allow_nan=False)


def up(x):
    return math.nextafter(x, math.inf)


def down(x):
    return math.nextafter(x, -math.inf)


def monitor_with(recent, spike_factor=2.0, min_loss=None):
    state = {"recent": list(recent), "min_loss": min(recent) if min_loss is None else min_loss} if recent else None
    return DivergenceMonitor(V, spike_factor, state)


# ----------------------------------------------------------------------------- divergence rules

@given(recent=st.lists(losses, min_size=1, max_size=60), factor=st.floats(min_value=1.01, max_value=8.0))
def test_spike_rule_at_and_around_its_limit(recent, factor):
    """A spike is a loss above factor x the average of the last 50 losses, that average raised to ln(V) while
    fewer than 10 are known; a loss exactly at the limit is not a spike."""
    window = recent[-50:]
    average = sum(window) / len(window)
    reference = average if len(window) >= 10 else max(average, UNIFORM)
    limit = factor * reference
    monitor = monitor_with(recent, factor, min_loss=UNIFORM)  # the return-to-uniform rule cannot fire
    assert "jumped" in monitor.problem(up(limit), 1.0)
    assert monitor.problem(limit, 1.0) is None
    assert monitor.problem(down(limit), 1.0) is None
    assert monitor_with(recent, 0.0, min_loss=UNIFORM).problem(up(limit), 1.0) is None  # spike_factor 0: off


@pytest.mark.parametrize("known", [8, 9, 10, 11, 49, 50, 51])
def test_spike_reference_switches_from_the_uniform_level_at_ten_losses(known):
    """Low recent losses (1.0): with fewer than 10 the reference is ln(V), from 10 on their average; the
    window holds the last 50, so older losses (here 3.0) stop counting."""
    recent = [3.0] * max(0, known - 50) + [1.0] * min(known, 50)
    reference = 1.0 if known >= 10 else UNIFORM
    monitor = monitor_with(recent, 2.0, min_loss=UNIFORM)
    assert monitor.problem(2 * reference, 1.0) is None
    assert "jumped" in monitor.problem(up(2 * reference), 1.0)
    if known >= 10:
        assert "jumped" in monitor.problem(2 * UNIFORM, 1.0)


@given(min_loss=st.floats(min_value=0.0, max_value=UNIFORM - 1.0), gap=st.floats(min_value=0.0, max_value=2.0))
def test_return_to_the_uniform_level_at_and_around_its_limits(min_loss, gap):
    """After the loss has reached ln(V) - 1 nat or lower, a loss at ln(V) - 0.01 or higher is a collapse."""
    fallen = DivergenceMonitor(V, 0.0, {"recent": [], "min_loss": min_loss})
    level = UNIFORM - 0.01
    assert "back at the uniform" in fallen.problem(level + gap, 1.0)
    assert "back at the uniform" in fallen.problem(level, 1.0)
    assert fallen.problem(down(level), 1.0) is None
    barely = DivergenceMonitor(V, 0.0, {"recent": [], "min_loss": up(UNIFORM - 1.0)})
    assert barely.problem(level + gap, 1.0) is None  # it never fell a whole nat: a fresh model sits at ln(V)


def test_the_fallen_limit_is_exactly_one_nat():
    at_limit = DivergenceMonitor(V, 0.0, {"recent": [], "min_loss": UNIFORM - 1.0})
    assert "back at the uniform" in at_limit.problem(UNIFORM, 1.0)


@given(loss=losses)
def test_basis_overflow_and_zero_gradient_at_their_limits(loss):
    monitor = monitor_with([2.0] * 12)
    assert monitor.problem(loss, 1.0, overflow=1.0) is None
    assert "basis generator" in monitor.problem(loss, 1.0, overflow=up(1.0))
    assert monitor.problem(loss, 1.0, overflow=down(1.0)) is None
    assert "exactly zero" in monitor.problem(loss, 0.0)
    assert monitor.problem(loss, 5e-324) is None
    assert monitor.problem(loss, None) is None


def test_monitor_state_round_trips_and_keeps_the_last_fifty():
    monitor = DivergenceMonitor(V, 2.0)
    for i in range(70):
        monitor.record(3.0 + i / 100)
    state = monitor.state_dict()
    assert state["recent"] == [3.0 + i / 100 for i in range(20, 70)] and state["min_loss"] == 3.0
    again = DivergenceMonitor(V, 2.0, json.loads(json.dumps(state)))
    assert again.state_dict() == state


# ----------------------------------------------------------------------------- the config's ranges

# (key, the smallest allowed value, a step to the refused side): integer keys and their lower limits.
INTEGER_FLOORS = [("batch_size", 1), ("max_iters", 1), ("seed", 0), ("dist_timeout_s", 1), ("log_interval", 1),
                  ("eval_interval", 0), ("ckpt_interval", 0), ("stop_iter", 0), ("eval_windows", 1),
                  ("warmup_iters", 0)]


def valid(**changes):
    cfg = TrainConfig(data_dir="d", batch_size=2, global_batch_size=8, max_iters=100, warmup_iters=10, lr=1e-3,
                      min_lr=1e-4)
    return dataclasses.replace(cfg, **changes)


def refused(**changes):
    with pytest.raises(ConfigError) as error:
        valid(**changes).validate()
    return str(error.value)


@pytest.mark.parametrize("key,floor", INTEGER_FLOORS)
@given(above=st.integers(min_value=0, max_value=10**6))
def test_integer_keys_at_and_around_their_floor(key, floor, above):
    changes = {key: floor + above}
    if key == "max_iters":
        changes["warmup_iters"] = 0
    if key == "warmup_iters":
        changes["max_iters"] = floor + above + 1
    if key == "batch_size":
        changes["global_batch_size"] = floor + above
    valid(**changes).validate()
    assert key in refused(**{key: floor - 1 - above})


@given(max_iters=st.integers(min_value=1, max_value=10**6))
def test_warmup_must_end_before_the_last_step(max_iters):
    valid(max_iters=max_iters, warmup_iters=max_iters - 1).validate()
    assert "warmup_iters" in refused(max_iters=max_iters, warmup_iters=max_iters)


@given(batch=st.integers(min_value=1, max_value=4096))
def test_global_batch_at_least_the_micro_batch(batch):
    valid(batch_size=batch, global_batch_size=batch).validate()
    assert "global_batch_size" in refused(batch_size=batch, global_batch_size=batch - 1)


@given(lr=st.floats(min_value=1e-8, max_value=10.0))
def test_learning_rates_at_their_limits(lr):
    valid(lr=lr, min_lr=lr).validate()
    valid(lr=lr, min_lr=0.0).validate()
    assert "min_lr" in refused(lr=lr, min_lr=up(lr))
    assert "min_lr" in refused(lr=lr, min_lr=-5e-324)
    for bad in (0.0, -lr, math.inf, math.nan):
        assert "lr must be a positive number" in refused(lr=bad, min_lr=0.0)
    valid(lr=5e-324, min_lr=0.0).validate()


@pytest.mark.parametrize("key", ["beta1", "beta2"])
def test_betas_in_the_half_open_unit_interval(key):
    valid(**{key: 0.0}).validate()
    valid(**{key: down(1.0)}).validate()
    assert "beta1 and beta2" in refused(**{key: 1.0})
    assert "beta1 and beta2" in refused(**{key: -5e-324})


@pytest.mark.parametrize("key", ["weight_decay", "grad_clip"])
@given(value=st.floats(min_value=0.0, max_value=1e300))
def test_non_negative_finite_keys(key, value):
    valid(**{key: value}).validate()
    assert key in refused(**{key: -5e-324})
    assert key in refused(**{key: math.inf})


@given(factor=st.floats(min_value=1.0, max_value=1e300, exclude_min=True))
def test_spike_factor_is_off_or_above_one(factor):
    valid(spike_factor=factor).validate()
    valid(spike_factor=0.0).validate()
    for bad in (1.0, down(1.0), 0.5, 5e-324, -1.0, math.inf):
        assert "spike_factor" in refused(spike_factor=bad)


@given(processes=st.integers(1, 16), micro=st.integers(1, 16), rows=st.integers(1, 8), extra=st.integers(1, 7))
def test_reference_layout_divides_the_global_batch(processes, micro, rows, extra):
    fits = valid(batch_size=1, global_batch_size=processes * micro * rows, grad_scale="official",
                 reference_layout=f"{processes}x{micro}")
    fits.validate()
    assert fits.reference_processes_and_micro_steps() == (processes, micro)
    assert fits.loss_scale == micro
    assume(extra % (processes * micro))
    assert "does not divide" in refused(batch_size=1, global_batch_size=processes * micro * rows + extra,
                                        grad_scale="official",
                                        reference_layout=f"{processes}x{micro}")


# ----------------------------------------------------------------------------- token ids against the vocabulary

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


def shard_folder(root, largest, vocab_in_manifest):
    from data import verify
    root.mkdir(parents=True, exist_ok=True)
    write_shard(str(root / "val_000000.bin"), np.arange(40) % 50)
    write_shard(str(root / "train_000001.bin"), np.r_[np.arange(60) % 50, largest])
    shards = [{"file": "val_000000.bin", "split": "val", "tokens": 40},
              {"file": "train_000001.bin", "split": "train", "tokens": 61}]
    for shard in shards:
        shard["sha256"] = verify.hash_and_max(str(root / shard["file"]))[0]
    (root / "manifest.json").write_text(json.dumps({"tokenizer": "t", "vocab_size": vocab_in_manifest,
                                                    "shards": shards}))
    return str(root)


@given(largest=st.integers(50, 65535))
def test_shard_ids_against_the_model_and_the_tokenizer(tmp_path_factory, largest):
    """A shard's largest id must be below the model's vocab_size (else: a larger vocab_size is the advice) and below
    its tokenizer's id count (else: the shard is damaged), each limit hit exactly."""
    from data import verify
    verify._checked.clear()
    data_dir = shard_folder(tmp_path_factory.mktemp("d"), largest, vocab_in_manifest=65536)
    verify.verify_shards(data_dir, vocab_size=largest + 1)
    with pytest.raises(DataError, match=f"set --vocab_size={largest + 1} or more"):
        verify.verify_shards(data_dir, vocab_size=largest)
    damaged = shard_folder(tmp_path_factory.mktemp("d"), largest, vocab_in_manifest=largest + 1)
    verify.verify_shards(damaged, vocab_size=65536)
    at_limit = shard_folder(tmp_path_factory.mktemp("d"), largest, vocab_in_manifest=largest)
    with pytest.raises(DataError, match="never produces: the shard is damaged"):
        verify.verify_shards(at_limit, vocab_size=65536)


@pytest.mark.parametrize("largest,accepted", [(50255, True), (50256, True), (50257, False), (65535, False)])
def test_adopt_accepts_gpt2_ids_only(tmp_path, largest, accepted):
    from data.prepare import adopt
    write_shard(str(tmp_path / "fineweb_val_000000.bin"), np.arange(30))
    write_shard(str(tmp_path / "fineweb_train_000001.bin"), np.r_[np.arange(30), largest])
    if accepted:
        manifest = adopt(str(tmp_path))
        assert manifest["vocab_size"] == 50257 and [s["tokens"] for s in manifest["shards"]] == [30, 31]
    else:
        with pytest.raises(DataError, match=f"holds token id {largest}, beyond GPT-2's 50257 ids"):
            adopt(str(tmp_path))
        assert not os.path.exists(tmp_path / "manifest.json")


# ----------------------------------------------------------------------------- memory before any work

@given(batch=st.integers(1, 64), slack=st.sampled_from([-1e-9, 0.0, 1e-9]))
def test_memory_check_at_the_free_memory_limit(monkeypatch, batch, slack):
    """Two limits, each exact: a lower bound (16 bytes a parameter, each block's fp32 input and one loss chunk's
    fp32 logits) refuses at once; past it, the memory planner's peak of a step (training/memory.py, checked
    against measured steps in test_memory.py) must fit. Exactly enough is enough."""
    import train
    from model import GPT, GPTConfig
    from training import memory
    from training.distributed import Distributed
    model_cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, head_dim=16, vocab_size=97, block_size=16)
    params = sum(p.numel() for p in GPT(model_cfg).parameters())
    cfg = valid(batch_size=batch, global_batch_size=batch)
    tokens = batch * 16
    lower_gb = (16 * params + 4 * (tokens * 32 + min(tokens, cfg.loss_chunk_tokens) * 97)) / 2**30
    need_gb = memory.plan(model_cfg, cfg, 1, grad_accum=1).total / 2**30
    assert need_gb > lower_gb
    ddp = Distributed.__new__(Distributed)
    ddp.device, ddp.world_size, ddp.sharded = torch.device("cpu"), 1, False
    for limit_gb, refusal in ((lower_gb, "for its activations and logits"), (need_gb, "a training step needs about")):
        monkeypatch.setattr(train, "free_memory_gb", lambda device: limit_gb + slack * limit_gb)
        if slack < 0:
            with pytest.raises(ConfigError, match=refusal):
                train.check_model_fits(model_cfg, cfg, ddp, use_bf16=False, grad_accum=1)
        elif limit_gb == lower_gb:  # past the lower bound, the planner's larger peak refuses
            with pytest.raises(ConfigError, match="a training step needs about"):
                train.check_model_fits(model_cfg, cfg, ddp, use_bf16=False, grad_accum=1)
        else:
            train.check_model_fits(model_cfg, cfg, ddp, use_bf16=False, grad_accum=1)
