"""Memory: the memory planner (training/memory.py) against the measured peak of real training steps (FSDP with 2
processes: tests/test_fsdp.py), the check before any work, and activation checkpointing against running without
it (the chunked LM-head loss itself: tests/test_lm_loss.py)."""
import dataclasses
import math
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import train
from config import ConfigError, TrainConfig, resolve
from helpers import model_grads
from model import GPTConfig, checkpointed_blocks
from test_config import valid
from tests.helpers import SMALL, synthetic_corpus, tiny_config
from training import memory
from training.distributed import Distributed

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- the model


def test_checkpointed_blocks():
    assert checkpointed_blocks("none", 5) == []
    assert checkpointed_blocks("blocks", 5) == [0, 1, 2, 3, 4]
    assert checkpointed_blocks("every_k", 5, 2) == [1, 3]
    assert checkpointed_blocks("every_k", 7, 3) == [2, 5]
    assert checkpointed_blocks("every_k", 3, 1) == [0, 1, 2]
    with pytest.raises(ValueError, match="must be none, blocks or every_k"):
        checkpointed_blocks("all", 5)


@pytest.mark.parametrize("pos", ["rope", "fox", "grape_ap"])
@pytest.mark.parametrize("mode", ["blocks", "every_k"])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(pos, mode):
    _, loss, grads = model_grads(pos, "chunked")
    _, recomputed, recomputed_grads = model_grads(pos, "chunked", mode)
    assert torch.equal(recomputed, loss)
    for name, grad in grads.items():
        assert torch.equal(recomputed_grads[name], grad), name


# ----------------------------------------------------------------------------- training runs

@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    data_dir = synthetic_corpus(root, 20, 600)
    path = root / "tiny.toml"
    path.write_text(tiny_config(data_dir, model={"pos": "fox"}, max_iters=6, global_batch_size=8, grad_clip=0.3))
    return str(path)


def test_training_with_the_chunked_loss_and_checkpointing_follows_the_plain_run(config_file, tmp_path, capsys):
    plain = train.run([config_file, "--loss=plain", f"--out_dir={tmp_path / 'plain'}"])
    assert "loss plain (full logits)" in capsys.readouterr().out
    chunked = train.run([config_file, f"--out_dir={tmp_path / 'chunked'}", "--loss_chunk_tokens=48"])
    assert "loss chunked LM head + cross-entropy (48 tokens a chunk" in capsys.readouterr().out  # auto, on a CPU
    both = train.run([config_file, f"--out_dir={tmp_path / 'both'}", "--loss_chunk_tokens=48",
                      "--activation_checkpointing=every_k", "--activation_checkpointing_every=1"])
    assert "activation checkpointing on 2 of 2 blocks" in capsys.readouterr().out
    assert chunked["losses"] == pytest.approx(plain["losses"], rel=1e-5)
    assert both["losses"] == chunked["losses"]  # recomputing changes nothing, bit for bit
    with pytest.raises(ConfigError, match="train.loss='liger' runs a Triton kernel on CUDA GPUs only"):
        train.run([config_file, "--loss=liger", f"--out_dir={tmp_path / 'liger'}"])


def test_new_keys_are_checked_in_one_sentence(config_file, tmp_path):
    for override, message in (("--parallel=zero3", "parallel must be ddp or fsdp, not 'zero3'"),
                              ("--activation_checkpointing=all", "activation_checkpointing must be none, blocks or "
                                                                 "every_k, not 'all'"),
                              ("--activation_checkpointing_every=0", "activation_checkpointing_every must be at least 1"),
                              ("--loss=fused", "loss must be one of auto, chunked, plain, liger, cce, not 'fused'"),
                              ("--loss_chunk_tokens=0", "loss_chunk_tokens must be at least 1"),
                              ("--fsdp_bf16=fp16", "fsdp_bf16 must be params or autocast")):
        with pytest.raises(ConfigError, match=message):
            train.run([config_file, override, f"--out_dir={tmp_path / 'run'}"])


# ----------------------------------------------------------------------------- the planner

# (overrides, what dominates the peak): the activations, checkpointing, the loss, the states
PLANNED = [
    ([], "rope: activations"),
    (["--pos=fox", "--activation_checkpointing=blocks"], "fox, every block recomputed"),
    (["--pos=grape_ap", "--activation_checkpointing=every_k"], "grape_ap, every other block recomputed"),
    (["--vocab_size=8192", "--loss=plain"], "plain loss: the full logits"),
    (["--vocab_size=8192", "--pos=alibi"], "chunked loss at the same vocabulary"),
    (["--parallel=fsdp", "--pos=fox", "--kv_shift"], "fsdp on a group of one, fox+kv_shift"),
]


def small_config(overrides):
    quickstart = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                              "quickstart.toml")
    return resolve(quickstart, SMALL + overrides, GPTConfig)


@pytest.mark.parametrize("overrides,case", PLANNED, ids=[case for _, case in PLANNED])
def test_planned_peak_is_within_15_percent_of_a_measured_training_step(overrides, case):
    model_cfg, cfg = small_config(overrides)
    ddp = Distributed("cpu", 60, cfg.parallel)
    try:
        measured = memory.measure_peak(model_cfg, cfg, ddp)
    finally:
        ddp.release()
    planned = memory.plan(model_cfg, cfg, 1)
    assert planned.total == pytest.approx(measured, rel=0.15), (case, planned)


@pytest.mark.parametrize("compile_model", [True, False])
def test_measured_training_steps_compile_the_model_as_train_py_does(compile_model, monkeypatch):
    """compile = true: the measured step runs the compiled model on one process, as train.py's does (it ran the
    model uncompiled, so a measurement of a compiled run measured another program)."""
    compiled = []

    def recorded_compile(model, *args, **kwargs):
        compiled.append(model)
        return model
    monkeypatch.setattr(torch, "compile", recorded_compile)
    model_cfg, cfg = small_config([f"--compile={str(compile_model).lower()}"])
    ddp = Distributed("cpu", 60, cfg.parallel)
    try:
        step, model, _ = memory.training_steps(model_cfg, cfg, ddp)
        step(0)
    finally:
        ddp.release()
    assert [type(m).__name__ for m in compiled] == (["GPT"] if compile_model else [])
    assert not compiled or compiled[0] is model


def test_planned_states_are_the_parameter_count_times_their_bytes():
    model_cfg, cfg = small_config(["--vocab_size=1000"])
    L, C, H, d, V = 3, 64, 2, 32, 1000
    per_block = 2 * C + C * 3 * H * d + H * d * C + 2 * d + 3 * C * (8 * C // 3)  # norms, qkv, proj, q/k norm, MLP
    P = V * C + C + L * per_block
    assert memory.parameter_counts(model_cfg) == (P, per_block, V * C + C)
    ddp = memory.plan(model_cfg, cfg, 4, "ddp")
    assert (ddp.weights, ddp.gradients, ddp.optimizer, ddp.gathered) == (4 * P, 4 * P, 8 * P, 0)
    fsdp = memory.plan(model_cfg, cfg, 4, "fsdp", grad_accum=2)
    # sharded over 4, and between micro-batches the unsharded fp32 accumulation; the root and two blocks gathered
    assert (fsdp.weights, fsdp.optimizer) == (round(P), round(2 * P))
    assert fsdp.gradients == round(P + 4 * P)
    assert fsdp.gathered == 4 * (V * C + C + 2 * per_block)
    assert memory.plan(model_cfg, dataclasses.replace(cfg, fsdp_reduce_each_micro_batch=True), 4, "fsdp",
                       grad_accum=2).gradients == round(P)
    assert memory.plan(model_cfg, dataclasses.replace(cfg, fsdp_reshard_after_forward=False), 4, "fsdp",
                       grad_accum=1).gathered == 4 * (V * C + C + L * per_block)
    bf16 = memory.plan(model_cfg, cfg, 4, "fsdp", use_bf16=True, grad_accum=1)
    assert bf16.gathered == 2 * (V * C + C + 2 * per_block) and bf16.weight_copies == 0
    autocast = memory.plan(model_cfg, cfg, 4, "ddp", use_bf16=True)
    matrices = C * 3 * H * d + H * d * C + 3 * C * (8 * C // 3)
    assert autocast.weight_copies == 2 * L * matrices
    # activations: a checkpointed block keeps only its fp32 input
    assert ddp.per_checkpointed_block == 4 * cfg.batch_size * model_cfg.block_size * C
    everything = memory.plan(model_cfg, dataclasses.replace(cfg, activation_checkpointing="blocks"), 1)
    assert everything.activations == L * ddp.per_checkpointed_block < ddp.activations == L * ddp.per_block


@pytest.mark.parametrize("backend", ["dense", "auto"])
def test_the_generous_bound_is_above_the_plan_where_the_attention_matrices_dominate(backend):
    """The start-up check skips the planner where this bound fits, so it must hold more than the plan; with long
    sequences and a narrow model the dense backend's (B, H, T, T) tensors are most of the step."""
    model_cfg, cfg = small_config([f"--attn_backend={backend}", "--block_size=1024", "--n_embd=32", "--n_head=4",
                                   "--head_dim=8", "--n_layer=2"])
    bound, planned = memory.generous_bound(model_cfg, cfg, 1), memory.plan(model_cfg, cfg, 1).total
    attention_matrices = 4 * cfg.batch_size * model_cfg.n_head * model_cfg.block_size ** 2
    assert planned < bound
    if backend == "dense":
        assert planned > 2 * attention_matrices * model_cfg.n_layer  # what dominates is what the bound must cover
    else:
        assert bound < 2 * attention_matrices  # and the fused backends are not charged for them


def test_the_generous_bound_holds_the_plain_losss_full_logits():
    """With a large vocabulary the plain loss's (B·T, V) fp32 logits are most of the step."""
    model_cfg, cfg = small_config(["--loss=plain", "--vocab_size=32768", "--block_size=512", "--n_embd=32",
                                   "--n_head=2", "--head_dim=16", "--n_layer=1"])
    assert memory.plan(model_cfg, cfg, 1).total < memory.generous_bound(model_cfg, cfg, 1)


def test_largest_micro_batch_is_the_largest_that_fits():
    model_cfg, cfg = small_config([])
    capacity = memory.plan(model_cfg, cfg, 1, micro_batch=37).total + 1
    found = memory.largest_micro_batch(model_cfg, cfg, 1, capacity, "ddp", False)
    assert found == 37
    assert memory.largest_micro_batch(model_cfg, cfg, 1, 1000, "ddp", False) == 0


def test_planner_command_prints_both_modes(capsys):
    memory.main([os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                              "quickstart.toml"), "--gpus", "2", "--gpu-memory", "0.1", "--dtype", "fp32", *SMALL])
    out = capsys.readouterr().out
    assert "0M parameters, micro-batch 4 x 128 tokens, 2 GPUs of 0.1 GiB, fp32" in out
    rows = {line[:40].strip(): line[40:].split() for line in out.splitlines()[1:]}
    assert set(rows) >= {"weights (fp32 master)", "AdamW moments", "activations, one block", "logits / loss peak",
                         "total at the peak", "largest micro-batch that fits"}
    ddp_weights, fsdp_weights = map(float, rows["weights (fp32 master)"])
    assert fsdp_weights == pytest.approx(ddp_weights / 2, abs=0.006)


def test_startup_check_refuses_a_step_that_does_not_fit_and_names_the_micro_batch_that_does(config_file, tmp_path,
                                                                                            monkeypatch):
    model_cfg, cfg = resolve(config_file, ["--batch_size=8"], GPTConfig)
    need = memory.plan(model_cfg, cfg, 1, grad_accum=1).total
    monkeypatch.setattr(train, "free_memory_gb", lambda device: 0.9 * need / memory.GiB)
    with pytest.raises(ConfigError, match=r"a training step needs about [0-9.]+ GB per process at its peak .*try "
                                          r"--batch_size=[1-7] \(the largest micro-batch that fits\)"):
        train.run([config_file, "--batch_size=8", f"--out_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


@pytest.mark.fault
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-3"])
def test_a_gpu_memory_that_is_not_a_positive_number_is_one_sentence(value, capsys):
    """--gpu-memory nan, inf or not positive (argparse's float() takes them all): one usage error, no plan."""
    quickstart = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "quickstart.toml")
    with pytest.raises(SystemExit) as info:
        memory.main([quickstart, f"--gpu-memory={value}"])  # (= : "-inf" alone reads as an option)
    captured = capsys.readouterr()
    assert info.value.code == 2 and captured.out == "" and "Traceback" not in captured.err
    assert captured.err.splitlines()[-1] == (f"python -m training.memory: error: --gpu-memory must be a positive "
                                             f"number of GiB, such as 80 (got {float(value):g})")


@pytest.mark.fault
@pytest.mark.parametrize("text", ["", "# nothing here yet\n", "[model]\n[train]\n", 'include = "empty.toml"\n'])
def test_a_config_file_that_sets_nothing_is_refused_not_planned_as_the_defaults(tmp_path, text, capsys):
    """An empty config file (or one whose sections, or includes, hold no key) is given to the planner: one sentence
    says so, instead of a plan of the built-in defaults."""
    (tmp_path / "empty.toml").write_text("")
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as info:
        memory.main([str(path), "--activation_checkpointing=blocks"])
    captured = capsys.readouterr()
    assert info.value.code == 2 and captured.out == ""
    assert captured.err == (f"error: config file {path} sets no key of [model] or [train] (with its includes), so "
                            "there is no run to plan, only the defaults; name a config file of train.py, such as "
                            "configs/quickstart.toml\n")
    path.write_text('include = "empty.toml"\n[train]\nbatch_size = 2\n')  # one key is a configuration
    memory.main([str(path), "--gpus", "1", *[a for a in SMALL if not a.startswith("--batch_size")]])
    assert "micro-batch 2 x" in capsys.readouterr().out


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_the_chunked_loss_probe_extrapolates_linearly_past_two_chunks(monkeypatch):
    """Past two chunks the planner extrapolates the loss's memory from one and two chunks (a probe of every
    length would loop over all chunks): for a loss whose probed bytes grow linearly, the extrapolation is exact."""
    from training import memory
    monkeypatch.setattr(memory, "_probe_loss", lambda cfg, tokens, *rest: 1000 + 7 * tokens)
    chunk = 64
    for tokens in (2 * chunk + 1, 5 * chunk, 5 * chunk + 13):
        assert memory.probe_loss(None, tokens, "chunked", chunk, False) == 1000 + 7 * tokens
    assert memory.probe_loss(None, 100, "plain", chunk, False) == 1000 + 700


# -------------------------------------------------- properties: every threshold at, just below and just above its limit
# Each limit is written here from its documented rule, not read from the code: the divergence rules
# (training/divergence.py's docstring), the config's ranges (TrainConfig's field comments), token ids against the
# vocabulary (a batch, a shard, an adopted GPT-2 folder) and the memory check before any work. "Just below" and "just
# above" are the neighbouring float (math.nextafter) or integer, so a comparison moved by one is caught.


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


@pytest.mark.fault
@pytest.mark.parametrize("gpus,counts", [(7, "6 or 8"), (1000000, "480")])
def test_a_gpu_count_that_does_not_share_the_batch_is_refused_as_train_py_refuses_it(gpus, counts, capsys):
    """--gpus=7 (480 sequences do not split over 7 processes) planned a micro-batch with exit 0."""
    medium = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "medium",
                          "rope.toml")
    with pytest.raises(SystemExit) as info:
        memory.main([medium, f"--gpus={gpus}"])
    captured = capsys.readouterr()
    assert info.value.code == 2 and captured.out == ""
    assert captured.err == (f"error: global_batch_size 480 cannot be split equally over {gpus} processes, so train.py "
                            f"would refuse this run; plan it on {counts} GPUs (a number that divides 480) or change "
                            "--global_batch_size.\n")


def test_the_plan_is_of_the_micro_batch_train_py_runs(capsys):
    """batch_size 16 does not divide the 60 sequences of each of 8 processes: train.py runs micro-batches of 15
    (4 a step), and the planner said 16 (3 a step: a computation that only agrees where the share divides)."""
    medium = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "medium",
                          "rope.toml")
    memory.main([medium, "--gpus=8", "--batch_size=16"])
    assert ", micro-batch 15 x 4096 tokens, 8 GPUs of 80 GiB" in capsys.readouterr().out
    from training.step import split_batch
    assert split_batch(480, 16, 8) == (15, 4) and split_batch(480, 16, 1) == (16, 30)
    assert split_batch(12, 8, 2) == (6, 1) and split_batch(7, 3, 1) == (1, 7)
    with pytest.raises(ValueError, match="cannot be split equally over 7 processes"):
        split_batch(480, 8, 7)
