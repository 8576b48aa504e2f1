"""lm_loss.py: the chunked LM-head loss against the plain one and a float64 formula (loss and both gradients),
one chunk's logits at a time, the loss a model computes, and the choice of loss."""
import sys
import types

import pytest
import torch

from helpers import model_grads
from lm_loss import chunked_cross_entropy, plain_loss, resolve_loss
from model import GPT, GPTConfig
from training import memory

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------- the chunked LM-head loss against the plain one and a float64 formula


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


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_a_model_switched_to_the_chunked_loss_computes_the_plain_loss_in_chunks_of_the_default_size(monkeypatch):
    import lm_loss
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, head_dim=8, vocab_size=64, block_size=16))
    tokens, targets = torch.randint(0, 64, (20, 16)), torch.randint(0, 64, (20, 16))  # 320 tokens: two chunks
    _, plain = model(tokens, targets)
    chunk_sizes = []
    real = lm_loss.chunked_cross_entropy
    monkeypatch.setattr(lm_loss, "chunked_cross_entropy",
                        lambda hidden, weight, targets, chunk_tokens: chunk_sizes.append(chunk_tokens)
                        or real(hidden, weight, targets, chunk_tokens))
    model.loss_impl = "chunked"
    _, chunked = model(tokens, targets)
    assert chunk_sizes == [lm_loss.DEFAULT_CHUNK_TOKENS] and lm_loss.DEFAULT_CHUNK_TOKENS < 320
    assert chunked.item() == pytest.approx(plain.item(), rel=1e-6)


@pytest.mark.parametrize("name", ["liger", "cce"])
def test_the_fused_losses_get_the_hidden_states_the_head_and_the_targets(monkeypatch, name):
    """The packages are CUDA-only; stand-ins with their signatures compute the loss from what they are given."""
    import torch.nn.functional as F

    from lm_loss import lm_loss, plain_loss

    def fused(hidden, weight, targets, ignore_index):
        return F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=ignore_index)
    if name == "liger":
        for module in ("liger_kernel", "liger_kernel.transformers"):
            monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
        monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional",
                            types.SimpleNamespace(liger_fused_linear_cross_entropy=fused))
    else:
        monkeypatch.setitem(sys.modules, "cut_cross_entropy", types.SimpleNamespace(linear_cross_entropy=fused))
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, 6, 8, generator=g), torch.randn(40, 8, generator=g)
    targets = torch.randint(0, 40, (2, 6), generator=g)
    targets[0, 0] = -1
    expected = plain_loss(hidden.view(-1, 8), weight, targets.view(-1))
    assert lm_loss(name, hidden, weight, targets).item() == pytest.approx(expected.item(), rel=1e-6)


def test_an_unknown_loss_lists_the_valid_ones():
    from lm_loss import resolve_loss
    with pytest.raises(ValueError, match=r"^unknown loss 'fused'; valid: auto, chunked, plain, liger, cce$"):
        resolve_loss("fused", torch.device("cpu"))
