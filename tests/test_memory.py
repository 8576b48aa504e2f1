"""Memory: the chunked LM-head loss against the plain one and a float64 formula, activation checkpointing against
running without it, and the memory planner (training/memory.py) against the measured peak of real training
steps (FSDP with 2 processes: tests/test_fsdp.py)."""
import dataclasses
import math
import os

import pytest
import torch

import train
from config import ConfigError, TrainConfig, resolve
from lm_loss import chunked_cross_entropy, lm_loss, plain_loss, resolve_loss
from model import GPT, GPTConfig, checkpointed_blocks
from tests.helpers import SMALL, synthetic_corpus, tiny_config
from training import memory
from training.distributed import Distributed

pytestmark = pytest.mark.usefixtures("one_thread")


def relative_error(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def reference_loss(hidden, weight, targets):
    """The mean cross-entropy written out in float64: log Σ exp(logits) - logit of the target, over the targets
    that are not -1."""
    logits = hidden.double() @ weight.double().T
    keep = targets != -1
    log_z = logits.max(-1).values + (logits - logits.max(-1, keepdim=True).values).exp().sum(-1).log()
    picked = logits.gather(1, targets.clamp(min=0)[:, None])[:, 0]
    return ((log_z - picked) * keep).sum() / keep.sum()


def loss_and_grads(fn, hidden, weight, targets, dtype=torch.float32, autocast=False, scale=3.0):
    h = hidden.to(dtype).detach().requires_grad_()
    w = weight.to(dtype).detach().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = fn(h, w, targets)
    (scale * loss).backward()  # a gradient from above that is not 1, as grad_accum and loss_scale make it
    return loss.detach(), h.grad, w.grad


@pytest.fixture(scope="module")
def head_inputs():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(300, 48, generator=g, dtype=torch.float64)
    weight = 0.3 * torch.randn(1000, 48, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 1000, (300,), generator=g)
    targets[:7] = -1  # ignored positions
    targets[150] = -1
    return hidden, weight, targets


def test_an_fp32_hidden_state_meets_a_bf16_head_in_the_heads_dtype(head_inputs):
    """Without autocast the head's matmul runs in the weight's dtype whatever the hidden state's (a norm that
    computes in fp32 feeding a bf16 head): both losses equal the float64 formula on bf16-rounded inputs."""
    hidden, weight, targets = head_inputs
    h, w = hidden.float(), weight.bfloat16()
    expected = reference_loss(h.bfloat16(), w, targets)
    for loss in (plain_loss(h, w, targets), chunked_cross_entropy(h, w, targets, 64)):
        assert loss.dtype == torch.float32
        assert abs(loss.double() - expected).item() < 1e-3 * expected.item()


@pytest.mark.parametrize("chunk", [1, 7, 64, 300, 4096])
def test_chunked_loss_and_gradients_equal_the_plain_loss_in_fp32(head_inputs, chunk):
    hidden, weight, targets = head_inputs
    truth = loss_and_grads(reference_loss, hidden, weight, targets, torch.float64)
    plain = loss_and_grads(plain_loss, hidden, weight, targets)
    chunked = loss_and_grads(lambda h, w, t: chunked_cross_entropy(h, w, t, chunk), hidden, weight, targets)
    for name, a, b, c in zip(("loss", "d hidden", "d weight"), chunked, plain, truth):
        assert relative_error(a, b) <= 1e-6, name
        assert relative_error(a, c) <= 1e-6, name  # and both are the float64 formula to fp32 rounding
    assert relative_error(plain[0], truth[0]) <= 1e-6
    # ignored positions get no gradient
    assert chunked[1][:7].abs().max() == 0 and chunked[1][150].abs().max() == 0 and chunked[1][7].abs().max() > 0


def test_chunked_loss_under_bf16_is_as_close_to_the_truth_as_the_plain_loss(head_inputs):
    hidden, weight, targets = head_inputs
    truth = loss_and_grads(reference_loss, hidden, weight, targets, torch.float64)
    plain = loss_and_grads(plain_loss, hidden, weight, targets, autocast=True)
    chunked = loss_and_grads(lambda h, w, t: chunked_cross_entropy(h, w, t, 64), hidden, weight, targets,
                             autocast=True)
    for name, a, b, c in zip(("loss", "d hidden", "d weight"), chunked, plain, truth):
        bf16_error = relative_error(b, c)
        assert bf16_error > 1e-5, name  # bf16 rounding is visible, so the comparison means something
        assert relative_error(a, c) <= 1.25 * bf16_error, name
    assert chunked[1].dtype == torch.float32  # the gradient of an fp32 input stays fp32


def test_chunked_loss_without_gradients_and_a_second_backward(head_inputs):
    hidden, weight, targets = head_inputs
    h, w = hidden.float(), weight.float().requires_grad_()
    with torch.no_grad():
        assert chunked_cross_entropy(h, w, targets, 16).item() == pytest.approx(reference_loss(h, w, targets).item(),
                                                                                 rel=1e-6)
    loss = chunked_cross_entropy(h, w, targets, 16)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backpropagated twice"):
        loss.backward()


def test_chunked_loss_holds_one_chunk_of_logits_at_a_time():
    """The most the chunked loss allocates (the allocator's record, forward and backward) is the weight's fp32
    gradient, its input's gradient and one chunk's fp32 logits, plus small per-token vectors: a chunk's logits
    are freed before the next chunk's are made (10 chunks here; two alive at once would add a chunk's). The
    no-grad pass comes after the backward one, whose gradients stay allocated: the measurement counts from what
    was allocated before it, not from the profiler's first session."""
    tokens, width, vocab, chunk = 160, 16, 4000, 16
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, width, generator=g).requires_grad_()
    weight = torch.randn(vocab, width, generator=g).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    one_chunk = 4 * chunk * vocab
    gradients = 4 * vocab * width + 4 * tokens * width

    def train():
        chunked_cross_entropy(hidden, weight, targets, chunk).backward()
    peak = memory.profiled_peak(train)
    assert gradients + one_chunk <= peak < gradients + 1.25 * one_chunk
    with torch.no_grad():
        assert memory.profiled_peak(lambda: chunked_cross_entropy(hidden, weight, targets, chunk)) < 1.25 * one_chunk


def test_loss_choice_on_this_machine_and_fused_losses_refused_in_one_sentence(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_loss("auto", cpu) == "chunked"
    assert resolve_loss("plain", cpu) == "plain"
    with pytest.raises(ValueError, match="loss='liger' runs a Triton kernel on CUDA GPUs only .*use loss='chunked'"):
        resolve_loss("liger", cpu)
    import lm_loss as module
    monkeypatch.setattr(module, "fused_loss_available", lambda name: name == "cce")
    assert resolve_loss("auto", cuda) == "cce"  # liger first, then cce: only cce "installed"
    with pytest.raises(ValueError, match="needs the liger_kernel package, which is not installed; pip install "
                                         "liger-kernel"):
        resolve_loss("liger", cuda)
    monkeypatch.setattr(module, "fused_loss_available", lambda name: True)
    assert resolve_loss("auto", cuda) == "liger"
    monkeypatch.setattr(module, "fused_loss_available", lambda name: False)
    assert resolve_loss("auto", cuda) == "chunked"


# ----------------------------------------------------------------------------- the model

def model_grads(pos, loss_impl="plain", checkpointing="none", dtype=torch.float32):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, head_dim=16, vocab_size=300, block_size=24, pos=pos,
                          kv_shift=pos == "fox")).to(dtype)
    model.loss_impl, model.loss_chunk_tokens = loss_impl, 10
    model.set_activation_checkpointing(checkpointing, 2)
    idx = torch.randint(0, 300, (3, 24), generator=torch.Generator().manual_seed(1))
    targets = idx.roll(-1, 1)
    targets[0, :5] = -1
    logits, loss = model(idx, targets)
    loss.backward()
    return logits, loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("pos", ["rope", "fox", "grape_ap"])
def test_model_with_the_chunked_loss_gives_the_plain_losses_and_gradients(pos):
    _, truth, truth_grads = model_grads(pos, dtype=torch.float64)
    logits, plain, plain_grads = model_grads(pos)
    no_logits, chunked, chunked_grads = model_grads(pos, "chunked")
    assert logits.shape == (3, 24, 300) and no_logits is None  # the chunked loss never makes the logits
    assert relative_error(chunked, plain) <= 1e-6
    # Every gradient equal to fp32 rounding through three blocks: within what separates the plain fp32 model from
    # float64 (1e-6 to 1e-5 here, largest for the few-element gate biases), and no further from float64 than it.
    plain_errors = {name: relative_error(plain_grads[name], truth) for name, truth in truth_grads.items()}
    chunked_errors = {name: relative_error(chunked_grads[name], truth) for name, truth in truth_grads.items()}
    assert 1e-7 < max(plain_errors.values()) < 2e-5
    for name in truth_grads:
        assert relative_error(chunked_grads[name], plain_grads[name]) <= 2e-5, name
    assert max(chunked_errors.values()) <= 2 * max(plain_errors.values())


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
