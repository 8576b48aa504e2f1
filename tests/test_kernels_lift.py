"""bf16-exact lifted columns (attention_kernels/lift.py, attention.lift_qk) against fp32.

At T = 4096 one bf16 column per lifted value is off by up to whole logits (FoX's cumulative log-gates,
positions times slopes, all divided by the softmax scale); split into bf16 parts and summed by an fp32
accumulator they must give the fp32 bias. Each test also shows the single-column lift failing, so the
tolerance really separates the two."""
import math

import pytest
import torch
import torch.nn.functional as F

from attention import causal_mask, lift_qk
from attention_kernels.lift import split_lifted_columns, split_parts
from model import CausalSelfAttention, GPTConfig

SEPARABLE = ["alibi", "grape_a_q", "grape_a_k", "grape_a_qk", "fox"]
H, D, C = 2, 16, 32


def test_split_parts_reconstruct_fp32_values():
    g = torch.Generator().manual_seed(0)
    # fp16 covers less range: its parts would overflow above 65504 or go subnormal below ~1e-4
    for dtype, low, high in ((torch.bfloat16, -3, 6), (torch.float16, -1, 4)):
        x = torch.randn(10000, generator=g) * torch.logspace(low, high, 10000)
        parts = split_parts(x, dtype)
        assert all(p.dtype == dtype for p in parts)
        total = sum(p.double() for p in parts)
        floor = 2.0 ** -24 if dtype == torch.float16 else 0.0  # fp16's smallest subnormal: irrelevant for logits
        assert torch.all((total - x.double()).abs() <= 2.0 ** -24 * x.double().abs() + floor)
        one = split_parts(x, dtype, 1)[0].double()
        assert (one - x.double()).abs().max() > 2.0 ** -14 * x.abs().max()  # one part is not enough


def test_split_columns_keep_the_bilinear_form():
    g = torch.Generator().manual_seed(0)
    q_cols = torch.cat((torch.ones(5, 1), 100 * torch.rand(5, 1, generator=g)), dim=-1)
    k_cols = 1000 * torch.randn(7, 2, generator=g)
    q_split, k_split = split_lifted_columns(q_cols, k_cols, torch.bfloat16, [1, 3])
    assert q_split.shape == (5, 3 + 6) and k_split.shape == (7, 3 + 6)
    exact = q_cols.double() @ k_cols.double().T
    torch.testing.assert_close(q_split.double() @ k_split.double().T, exact, atol=1e-4, rtol=1e-6)
    with pytest.raises(ValueError, match="query_parts"):
        split_lifted_columns(q_cols, k_cols, torch.bfloat16, [1])


def encoding_inputs(pos, T, seed=0):
    """One attention layer's bias module (positional parameters moved off their init) and its
    features for T tokens at positions 0..T-1, with bf16-representable q, k, v."""
    torch.manual_seed(seed)
    attn = CausalSelfAttention(GPTConfig(n_layer=1, n_head=H, n_embd=C, head_dim=D, vocab_size=8, block_size=T, pos=pos))
    with torch.no_grad():
        for p in attn.bias.parameters():
            p.add_(0.3 * torch.randn(p.shape))
        q = (F.normalize(torch.randn(1, H, T, D), dim=-1) * math.sqrt(D)).bfloat16().float()
        k = (F.normalize(torch.randn(1, H, T, D), dim=-1) * math.sqrt(D)).bfloat16().float()
        v = torch.randn(1, H, T, D).bfloat16().float()
        positions = torch.arange(T)
        qf, kf = attn.bias.features(torch.randn(1, T, C), q, k, positions, {})
    return attn.bias, q, k, v, qf, kf, positions


def naive_lift(q, k, qf, kf, bias, scale, dtype):
    """The unsplit lift: one low-precision column per lifted value."""
    q_cols, k_cols = bias.lift(qf, kf)
    B, H = q.shape[:2]
    return (torch.cat((q.to(dtype), q_cols.expand(B, H, *q_cols.shape[2:]).to(dtype)), -1),
            torch.cat((k.to(dtype), (k_cols / scale).expand(B, H, *k_cols.shape[2:]).to(dtype)), -1))


def logit_error(q_lifted, k_lifted, dense_logits, rows, scale):
    """Largest error of the lifted logits (bf16 inputs, products summed in fp32 as an attention
    kernel's accumulator does) against the fp32 logits, after removing each row's constant."""
    lifted = scale * (q_lifted[:, :, rows].float() @ k_lifted.float().transpose(-1, -2))
    valid = torch.isfinite(dense_logits)
    diff = torch.where(valid, lifted - dense_logits, 0.0)
    diff = diff - diff.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True)
    return torch.where(valid, diff, 0.0).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("pos", SEPARABLE)
def test_lifted_low_precision_logits_equal_fp32_bias_at_T4096(pos, dtype):
    T = 4096
    bias, q, k, v, qf, kf, positions = encoding_inputs(pos, T)
    scale = 1 / math.sqrt(D)
    rows = torch.arange(0, T, 61)
    with torch.no_grad():
        dense = scale * (q[:, :, rows] @ k.transpose(-1, -2)) + bias.dense({n: f[:, :, rows] for n, f in qf.items()}, kf)
        dense = dense.masked_fill(~causal_mask(positions[rows], positions), float("-inf"))
        split_error = logit_error(*lift_qk(q.to(dtype), k.to(dtype), qf, kf, bias, scale), dense, rows, scale)
        naive_error = logit_error(*naive_lift(q, k, qf, kf, bias, scale, dtype), dense, rows, scale)
    assert split_error < 3e-3, f"{pos}: split lift off by {split_error:.2e} in the logits"
    assert naive_error > 10 * split_error and naive_error > 1e-2  # the test can tell the difference


@pytest.mark.parametrize("pos", SEPARABLE)
def test_bf16_fused_attention_on_split_lift_matches_fp32(pos):
    # End to end through bf16 SDPA on the CPU: the split lift is as accurate as bf16 attention without
    # any bias (the floor set by bf16 probabilities and values), the single column far worse.
    T = 2048
    bias, q, k, v, qf, kf, positions = encoding_inputs(pos, T, seed=1)
    scale = 1 / math.sqrt(D)
    mask = causal_mask(positions, positions)
    with torch.no_grad():
        logits = scale * (q @ k.transpose(-1, -2))
        reference = torch.softmax((logits + bias.dense(qf, kf)).masked_fill(~mask, float("-inf")), -1) @ v
        no_bias = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ v
        floor = (F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True,
                                                scale=scale).float() - no_bias).abs().max().item()
        q_split, k_split = lift_qk(q.bfloat16(), k.bfloat16(), qf, kf, bias, scale)
        split = F.scaled_dot_product_attention(q_split, k_split, v.bfloat16(), is_causal=True, scale=scale)
        q_one, k_one = naive_lift(q, k, qf, kf, bias, scale, torch.bfloat16)
        one = F.scaled_dot_product_attention(q_one, k_one, v.bfloat16(), is_causal=True, scale=scale)
    split_error = (split.float() - reference).abs().max().item()
    one_error = (one.float() - reference).abs().max().item()
    assert split_error < 2 * floor + 1e-3, f"{pos}: {split_error:.2e} vs bf16 floor {floor:.2e}"
    assert one_error > 5 * split_error
