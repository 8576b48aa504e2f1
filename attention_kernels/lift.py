"""Lifted bias columns that stay exact when attention runs in bf16 (or fp16).

The homogeneous lift (docs/derivations.md §2) appends columns to q and k whose dot product is the additive bias
up to a per-row constant. The key-side values are large (positions up to T times a slope, FoX's
cumulative log-gates up to thousands, all divided by the softmax scale), and one bf16 number keeps 8
significant bits: at T = 4096 the bias would be off by whole logits.

Fix: write each fp32 value as a sum of bf16 parts, x = x₀ + x₁ + x₂ with x₀ = bf16(x),
x₁ = bf16(x - x₀), x₂ = bf16(x - x₀ - x₁) (24 significant bits, i.e. fp32), and let the attention
kernel's fp32 accumulator add the products back together: a bf16×bf16 product is exact in fp32.
A column whose query side is exact in bf16 (the constant 1 of ALiBi, FoX and GRAPE-A-K) pairs that one
query value with the key parts (3 columns); a column inexact on both sides (GRAPE-A's gate λ_q(t),
the query position t) takes the cross products of significance < 3:
q₀k₀ + q₀k₁ + q₁k₀ + q₀k₂ + q₁k₁ + q₂k₀ (6 columns; the omitted terms are below 2⁻²⁴ of the product).
"""
from __future__ import annotations

import torch

PARTS = 3  # bf16 parts per value: 3 x 8 significant bits = fp32's 24


def split_parts(x: torch.Tensor, dtype: torch.dtype, parts: int = PARTS) -> list[torch.Tensor]:
    """x (fp32 or fp64) as `parts` tensors of `dtype` whose sum, taken in fp32, is x to ~2^-(8·parts)."""
    out, rest = [], x.float()
    for _ in range(parts):
        part = rest.to(dtype)
        out.append(part)
        rest = rest - part.float()
    return out


def split_lifted_columns(q_cols: torch.Tensor, k_cols: torch.Tensor, dtype: torch.dtype,
                         query_parts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewrite lifted columns (q_cols (.., Tq, m), k_cols (.., Tk, m), fp32) as more columns of `dtype`
    with the same bilinear form Σ_c q_c·k_c to fp32 accuracy when summed by an fp32 accumulator.
    query_parts[c] is 1 when query column c is exact in `dtype` (e.g. all ones), else PARTS."""
    if len(query_parts) != q_cols.shape[-1] or q_cols.shape[-1] != k_cols.shape[-1]:
        raise ValueError(f"split_lifted_columns: {q_cols.shape[-1]} query and {k_cols.shape[-1]} key columns "
                         f"need one query_parts entry each (got {len(query_parts)})")
    new_q, new_k = [], []
    for c, q_parts in enumerate(query_parts):
        qs = split_parts(q_cols[..., c], dtype, q_parts)
        ks = split_parts(k_cols[..., c], dtype, PARTS)
        for a in range(q_parts):
            for b in range(PARTS - a):  # significance a + b < PARTS
                new_q.append(qs[a])
                new_k.append(ks[b])
    q_shape = torch.broadcast_shapes(*(t.shape for t in new_q))
    k_shape = torch.broadcast_shapes(*(t.shape for t in new_k))
    return (torch.stack([t.expand(q_shape) for t in new_q], dim=-1),
            torch.stack([t.expand(k_shape) for t in new_k], dim=-1))
