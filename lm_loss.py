"""The language-model loss from the last hidden states: the LM head and the cross-entropy, with or without the
full logits.

    plain     logits = h Wᵀ for every token (N x vocab, fp32 for the loss), then F.cross_entropy
    chunked   the same sums over chunks of `chunk_tokens` tokens: forward and backward never hold more than one
              chunk's logits. The gradients of h and W are computed chunk by chunk in the forward pass (the
              logits of a chunk are needed for both), kept, and scaled by the incoming gradient in the backward
              pass, so the head's matmuls are not recomputed
    liger     Liger-Kernel's fused linear cross-entropy (Triton, CUDA; pip install liger-kernel)
    cce       Cut Cross-Entropy (Apple; Triton, CUDA; pip install cut-cross-entropy)

`resolve_loss("auto", device)` takes liger, then cce, where installed and on CUDA, else chunked. Every variant
returns the mean over the targets that are not -1, as F.cross_entropy(ignore_index=-1) does.
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from config import LOSSES, TrainConfig
# The packages of the fused CUDA losses, and how to install them.
FUSED_LOSS_PACKAGES = {"liger": ("liger_kernel", "pip install liger-kernel"),
                       "cce": ("cut_cross_entropy", "pip install cut-cross-entropy")}
# Chunk size when none is given (train.loss_chunk_tokens' default): a chunk's fp32 logits are then 256 x 4 bytes
# a vocabulary entry (52 MB at the GPT-2 vocabulary, against 3.3 GB for the paper's 4 x 4096-token micro-batch).
# Measured on the CPU (bench/bench_memory.py, docs/memory.md): 8x less peak than the plain loss at the
# quickstart's micro-batch and faster; 1024-token chunks would hold the quickstart's whole micro-batch at once.
DEFAULT_CHUNK_TOKENS = TrainConfig.loss_chunk_tokens


def fused_loss_available(name: str) -> bool:
    return importlib.util.find_spec(FUSED_LOSS_PACKAGES[name][0]) is not None


def resolve_loss(requested: str, device: torch.device) -> str:
    """The loss implementation a run uses: "auto" is the first of liger, cce that is installed, on CUDA, else
    chunked. A fused loss asked for where it cannot run is a ValueError that says what to do."""
    if requested not in LOSSES:
        raise ValueError(f"unknown loss {requested!r}; valid: {', '.join(LOSSES)}")
    if requested == "auto":
        for name in FUSED_LOSS_PACKAGES:
            if device.type == "cuda" and fused_loss_available(name):
                return name
        return "chunked"
    if requested in FUSED_LOSS_PACKAGES:
        package, install = FUSED_LOSS_PACKAGES[requested]
        if device.type != "cuda":
            raise ValueError(f"loss={requested!r} runs a Triton kernel on CUDA GPUs only (this run is on "
                             f"{device.type}); use loss='chunked' (the same loss without the full logits, any device)")
        if not fused_loss_available(requested):
            raise ValueError(f"loss={requested!r} needs the {package} package, which is not installed; {install}, "
                             "or use loss='chunked'")
    return requested


def describe_loss(name: str, chunk_tokens: int) -> str:
    return {"plain": "plain (full logits)",
            "chunked": f"chunked LM head + cross-entropy ({chunk_tokens} tokens a chunk, no full logits)",
            "liger": "Liger-Kernel fused linear cross-entropy",
            "cce": "Cut Cross-Entropy"}[name]


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype of the head's matmuls: autocast's where it is on (as nn.Linear would run), else the weight's."""
    device_type = weight.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


def plain_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """What the model computes without chunking: fp32 logits of every token, then the mean cross-entropy."""
    dtype = compute_dtype(weight)
    logits = F.linear(hidden.to(dtype), weight.to(dtype)).float()
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)


def lm_loss(name: str, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
            chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Mean cross-entropy of targets (any shape; -1 ignored) under logits hidden @ weightᵀ, hidden (..., C)."""
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if name == "plain":
        return plain_loss(hidden, weight, targets)
    if name == "chunked":
        return chunked_cross_entropy(hidden, weight, targets, chunk_tokens)
    dtype = compute_dtype(weight)
    with torch.autocast(hidden.device.type, enabled=False):
        if name == "liger":
            from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
            return liger_fused_linear_cross_entropy(hidden.to(dtype), weight.to(dtype), targets, ignore_index=-1)
        if name == "cce":
            from cut_cross_entropy import linear_cross_entropy
            return linear_cross_entropy(hidden.to(dtype), weight.to(dtype), targets, ignore_index=-1)
    raise ValueError(f"unknown loss {name!r}; valid: {', '.join(LOSSES)}")


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """plain_loss(hidden, weight, targets) for hidden (N, C), weight (V, C), targets (N,), holding at most
    chunk_tokens x V logits at a time, in the forward and the backward pass."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
    dtype = compute_dtype(weight)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, chunk_tokens, dtype)
    with torch.no_grad():
        return _chunked_forward(hidden, weight, targets, chunk_tokens, dtype, want_grads=(False, False))[0]


def _chunked_forward(hidden, weight, targets, chunk_tokens, dtype, want_grads):
    """(mean loss, d loss / d hidden or None, d loss / d weight in fp32 or None)."""
    with torch.autocast(hidden.device.type, enabled=False):
        valid = targets != -1
        count = valid.sum()
        w = weight.to(dtype)
        grad_hidden = torch.empty_like(hidden) if want_grads[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_grads[1] else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_tokens):
            h = hidden[start:start + chunk_tokens].to(dtype)
            t = targets[start:start + chunk_tokens]
            keep = valid[start:start + chunk_tokens]
            safe_t = t.clamp(min=0)[:, None]  # ignored rows read column 0 and are masked out
            # Every step below works in the chunk's one logits buffer (torch.logsumexp would allocate another).
            logits = (h @ w.T).float()
            target_logits = logits.gather(1, safe_t)[:, 0]
            maxima = logits.amax(dim=-1, keepdim=True)
            exps = logits.sub_(maxima).exp_()
            sums = exps.sum(dim=-1)
            total += ((maxima[:, 0] + sums.log() - target_logits) * keep).sum()
            if grad_hidden is None and grad_weight is None:
                del logits, exps  # (else this chunk's logits live on while the next chunk's are computed)
                continue
            # d(mean loss)/d logits = (softmax - one_hot) · keep / count
            probs = exps.div_(sums[:, None])
            probs.scatter_add_(1, safe_t, -torch.ones_like(safe_t, dtype=probs.dtype))
            g = probs.mul_((keep / count)[:, None]).to(dtype)
            if grad_hidden is not None:
                grad_hidden[start:start + chunk_tokens] = g @ w
            if grad_weight is not None:  # (accumulated in fp32 without a weight-sized temporary in fp32)
                if g.dtype == grad_weight.dtype:
                    grad_weight.addmm_(g.T, h)
                else:
                    grad_weight.add_(g.T @ h)
            del logits, exps, probs, g  # one chunk's logits at a time: free them before the next chunk's matmul
        return total / count, grad_hidden, grad_weight


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens, dtype):
        loss, grad_hidden, grad_weight = _chunked_forward(hidden, weight, targets, chunk_tokens, dtype,
                                                          want_grads=ctx.needs_input_grad[:2])
        ctx.weight_dtype, ctx.backpropagated = weight.dtype, False
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        # The gradients are scaled in their own buffers (a copy would be one more weight-sized tensor at the
        # activation peak), so they can be backpropagated once only.
        if ctx.backpropagated:
            raise RuntimeError("the chunked loss was backpropagated twice (retain_graph=True); its gradients were "
                               "computed in the forward pass and are used up: use loss_impl='plain' for that")
        ctx.backpropagated = True
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden.mul_(grad_loss.to(grad_hidden.dtype))
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(grad_loss).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None
