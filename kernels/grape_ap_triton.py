"""Triton FlashAttention-style kernel for GRAPE-AP attention (forward and backward), O(T) memory.

Same contract as ``kernels.grape_ap.grape_ap_attention``. Per program: one (batch·head, query tile).

Forward. Key tiles are visited from the diagonal towards key 0 (softmax does not care about the
order), carrying per query row the *suffix* sum carry_i = Σ_{ℓ >= end of tile, ℓ <= t_i} ψ(i, ℓ). Inside
a tile, bias(i, j) = carry_i + Σ_{j<ℓ<tile end} ψ(i, ℓ) = carry_i + total_i - cumsum_i(j). This is the
bias itself (<= 0, small where the attention weight is large), not the left prefix sum shifted by
a row constant, so its fp32 rounding error is relative to the bias, not to the whole row's sum.
Then the usual online softmax; ψ = α·logsigmoid(p·rᵀ) is a (tile × tile × d_p) dot.

Backward, with dS = P∘(dO·vᵀ - D) the gradient of the logits:
dψ(i, ℓ) = Σ_{j<ℓ} dS(i, j) = -Σ_{j>=ℓ} dS(i, j) (rows of dS sum to zero), which the same right-to-left
order carries as a second running suffix. Two kernels, both without atomics (deterministic):
``_bwd_query`` (query-major, like the forward) gives dq and dp and stores both running suffixes at every
key-tile boundary, O(T²/BLOCK_N) floats; ``_bwd_key`` (key-major) reads them back to rebuild the same
bias and gradient suffixes and gives dk, dv, dr.

Accumulation is fp32 throughout (inputs bf16/fp16/fp32). The path vectors p, r are passed as fp32;
their dot uses 3xTF32 on the GPU (about fp32 accuracy at a small fraction of the q·k cost).
The interpreter (TRITON_INTERPRET=1) runs these kernels on the CPU in fp32/fp16 for the tests; its
bf16 dot is wrong, so bf16 is checked on a GPU (scripts/gpu_check.sh).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _logsigmoid_and_slope(z):
    """logsigmoid(z) and its derivative sigmoid(-z), both without overflow for any z."""
    e = tl.exp(-tl.abs(z))
    log_sig = tl.minimum(z, 0.0) - tl.log(1.0 + e)
    sig_neg = tl.where(z >= 0, e, 1.0) / (1.0 + e)
    return log_sig, sig_neg


@triton.jit
def _load_tile(ptr, bh, n_rows, rows, row_ok, cols, width):
    """The (rows, cols) tile of a contiguous (B·H, n_rows, width) tensor, zeros outside it."""
    return tl.load(ptr + bh * n_rows * width + rows[:, None] * width + cols[None, :],
                   mask=row_ok[:, None] & (cols[None, :] < width), other=0.0)


@triton.jit
def _store_tile(ptr, value, bh, n_rows, rows, row_ok, cols, width):
    tl.store(ptr + bh * n_rows * width + rows[:, None] * width + cols[None, :], value,
             mask=row_ok[:, None] & (cols[None, :] < width))


@triton.jit
def _path_bias(p, r, slope, carry, visible, Z_PRECISION: tl.constexpr):
    """One tile's bias(i, j) = carry_i + Σ_{j<ℓ<tile end, ℓ<=t_i} ψ(i, ℓ), the tile's ψ row sums (the
    next carry increment) and sigmoid(-z) for the backward pass."""
    log_sig, sig_neg = _logsigmoid_and_slope(tl.dot(p, tl.trans(r), input_precision=Z_PRECISION))
    psi = tl.where(visible, slope * log_sig, 0.0)
    tile_total = tl.sum(psi, axis=1)
    bias = carry[:, None] + tile_total[:, None] - tl.cumsum(psi, axis=1)
    return bias, tile_total, sig_neg


@triton.jit
def _probs_and_ds(q, k, v, do, bias, lse, delta, visible, scale, QK_PRECISION: tl.constexpr):
    """The backward pass's recomputed attention weights P and dS = P∘(dO·vᵀ - D) of one tile."""
    s = tl.dot(q, tl.trans(k), input_precision=QK_PRECISION) * scale + bias
    probs = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
    ds = probs * (tl.dot(do, tl.trans(v), input_precision=QK_PRECISION) - delta[:, None])
    return probs, ds


@triton.jit
def _path_grad(ds, carry_ds, visible, cols, slope, sig_neg):
    """dz(i, ℓ) = dψ(i, ℓ)·dψ/dz = -Σ_{j>=ℓ} dS(i, j) · α·sigmoid(-z) (zero for ℓ = 0 and ℓ > t_i), and
    the tile's dS row sums (the next carry_ds increment)."""
    ds_total = tl.sum(ds, axis=1)
    ds_suffix = carry_ds[:, None] + ds_total[:, None] - tl.cumsum(ds, axis=1) + ds  # Σ_{j>=ℓ} dS(i, j)
    dz = tl.where(visible & (cols[None, :] >= 1), -slope * ds_suffix * sig_neg, 0.0)
    return dz, ds_total


@triton.jit
def _fwd(Q, K, V, P, R, SLOPES, OUT, LSE, scale, Tq, Tk, H, D, DV, DP,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
         BLOCK_DP: tl.constexpr, Z_PRECISION: tl.constexpr, QK_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    slope = tl.load(SLOPES + bh % H)
    offset = Tk - Tq
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < Tq
    t = rows + offset  # key index of each query
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    dp = tl.arange(0, BLOCK_DP)
    q = _load_tile(Q, bh, Tq, rows, row_ok, d, D)
    p = _load_tile(P, bh, Tq, rows, row_ok, dp, DP)

    m_i = tl.full([BLOCK_M], -1e30, tl.float32)  # finite: a row may see no key in its first tiles
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    carry = tl.zeros([BLOCK_M], tl.float32)
    last_key = tl.minimum(offset + pid_m * BLOCK_M + BLOCK_M - 1, Tk - 1)
    n_tiles = last_key // BLOCK_N + 1
    for it in range(0, n_tiles):
        kb = n_tiles - 1 - it  # right to left: the suffix sums are then running sums
        cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < Tk
        k = _load_tile(K, bh, Tk, cols, col_ok, d, D)
        v = _load_tile(V, bh, Tk, cols, col_ok, dv, DV)
        r = _load_tile(R, bh, Tk, cols, col_ok, dp, DP)
        visible = (cols[None, :] <= t[:, None]) & col_ok[None, :]
        bias, tile_total, _ = _path_bias(p, r, slope, carry, visible, Z_PRECISION)
        s = tl.dot(q, tl.trans(k), input_precision=QK_PRECISION) * scale + bias
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        probs = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(probs, axis=1)
        acc = acc * alpha[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=QK_PRECISION)
        m_i = m_new
        carry += tile_total
    out = acc / l_i[:, None]
    _store_tile(OUT, out.to(OUT.dtype.element_ty), bh, Tq, rows, row_ok, dv, DV)
    tl.store(LSE + bh * Tq + rows, m_i + tl.log(l_i), mask=row_ok)


@triton.jit
def _bwd_query(Q, K, V, P, R, SLOPES, DO, LSE, DELTA, DQ, DPATH, CARRY_PSI, CARRY_DS,
               scale, Tq, Tk, H, D, DV, DP, N_KTILES,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_DP: tl.constexpr, Z_PRECISION: tl.constexpr, QK_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    slope = tl.load(SLOPES + bh % H)
    offset = Tk - Tq
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < Tq
    t = rows + offset
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    dp = tl.arange(0, BLOCK_DP)
    q = _load_tile(Q, bh, Tq, rows, row_ok, d, D)
    p = _load_tile(P, bh, Tq, rows, row_ok, dp, DP)
    do = _load_tile(DO, bh, Tq, rows, row_ok, dv, DV)
    lse = tl.load(LSE + bh * Tq + rows, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * Tq + rows, mask=row_ok, other=0.0)

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dpath = tl.zeros([BLOCK_M, BLOCK_DP], tl.float32)
    carry = tl.zeros([BLOCK_M], tl.float32)
    carry_ds = tl.zeros([BLOCK_M], tl.float32)
    last_key = tl.minimum(offset + pid_m * BLOCK_M + BLOCK_M - 1, Tk - 1)
    n_tiles = last_key // BLOCK_N + 1
    for it in range(0, n_tiles):
        kb = n_tiles - 1 - it
        cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < Tk
        k = _load_tile(K, bh, Tk, cols, col_ok, d, D)
        v = _load_tile(V, bh, Tk, cols, col_ok, dv, DV)
        r = _load_tile(R, bh, Tk, cols, col_ok, dp, DP)
        # the key-major kernel restarts from these boundary values
        boundary = (bh * N_KTILES + kb) * Tq + rows
        tl.store(CARRY_PSI + boundary, carry, mask=row_ok)
        tl.store(CARRY_DS + boundary, carry_ds, mask=row_ok)

        visible = (cols[None, :] <= t[:, None]) & col_ok[None, :]
        bias, tile_total, sig_neg = _path_bias(p, r, slope, carry, visible, Z_PRECISION)
        _, ds = _probs_and_ds(q, k, v, do, bias, lse, delta, visible, scale, QK_PRECISION)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=QK_PRECISION)
        dz, ds_total = _path_grad(ds, carry_ds, visible, cols, slope, sig_neg)
        dpath += tl.dot(dz, r, input_precision=Z_PRECISION)
        carry += tile_total
        carry_ds += ds_total
    _store_tile(DQ, dq * scale, bh, Tq, rows, row_ok, d, D)
    _store_tile(DPATH, dpath, bh, Tq, rows, row_ok, dp, DP)


@triton.jit
def _bwd_key(Q, K, V, P, R, SLOPES, DO, LSE, DELTA, DK, DV_OUT, DR, CARRY_PSI, CARRY_DS,
             scale, Tq, Tk, H, D, DV, DP, N_KTILES,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
             BLOCK_DP: tl.constexpr, Z_PRECISION: tl.constexpr, QK_PRECISION: tl.constexpr):
    kb = tl.program_id(0)
    bh = tl.program_id(1)
    slope = tl.load(SLOPES + bh % H)
    offset = Tk - Tq
    cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < Tk
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    dp = tl.arange(0, BLOCK_DP)
    k = _load_tile(K, bh, Tk, cols, col_ok, d, D)
    v = _load_tile(V, bh, Tk, cols, col_ok, dv, DV)
    r = _load_tile(R, bh, Tk, cols, col_ok, dp, DP)

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    dr = tl.zeros([BLOCK_N, BLOCK_DP], tl.float32)
    first_row = tl.maximum(kb * BLOCK_N - offset, 0)  # the first query that sees this key tile
    for mb in range(first_row // BLOCK_M, tl.cdiv(Tq, BLOCK_M)):
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < Tq
        t = rows + offset
        q = _load_tile(Q, bh, Tq, rows, row_ok, d, D)
        p = _load_tile(P, bh, Tq, rows, row_ok, dp, DP)
        do = _load_tile(DO, bh, Tq, rows, row_ok, dv, DV)
        lse = tl.load(LSE + bh * Tq + rows, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * Tq + rows, mask=row_ok, other=0.0)
        boundary = (bh * N_KTILES + kb) * Tq + rows
        carry = tl.load(CARRY_PSI + boundary, mask=row_ok, other=0.0)
        carry_ds = tl.load(CARRY_DS + boundary, mask=row_ok, other=0.0)

        visible = (cols[None, :] <= t[:, None]) & col_ok[None, :] & row_ok[:, None]
        bias, _, sig_neg = _path_bias(p, r, slope, carry, visible, Z_PRECISION)
        probs, ds = _probs_and_ds(q, k, v, do, bias, lse, delta, visible, scale, QK_PRECISION)
        dv_acc += tl.dot(tl.trans(probs.to(do.dtype)), do, input_precision=QK_PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=QK_PRECISION)
        dz, _ = _path_grad(ds, carry_ds, visible, cols, slope, sig_neg)
        dr += tl.dot(tl.trans(dz), p, input_precision=Z_PRECISION)
    _store_tile(DK, dk * scale, bh, Tk, cols, col_ok, d, D)
    _store_tile(DV_OUT, dv_acc, bh, Tk, cols, col_ok, dv, DV)
    _store_tile(DR, dr, bh, Tk, cols, col_ok, dp, DP)


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))  # tl.dot needs every dimension >= 16


class _TritonGrapeAP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, p, r, slopes, scale, config):
        block_m, block_n, num_warps, num_stages = config
        B, H, Tq, D = q.shape
        Tk, DV, DP = k.shape[2], v.shape[3], p.shape[3]
        q, k, v = (x.contiguous() for x in (q, k, v))
        p_dtype, r_dtype = p.dtype, r.dtype
        p, r = (x.float().contiguous() for x in (p, r))
        slopes = slopes.to(device=q.device, dtype=torch.float32).contiguous()
        out = torch.empty(B, H, Tq, DV, device=q.device, dtype=v.dtype)
        lse = torch.empty(B, H, Tq, device=q.device, dtype=torch.float32)
        precision = "ieee" if INTERPRET else "tf32x3"
        # fp32 q, k, v get true fp32 dots (Triton's fp32 default is TF32); bf16/fp16 ignore the setting
        qk_precision = "ieee" if (INTERPRET or q.dtype == torch.float32) else "tf32"
        _fwd[(triton.cdiv(Tq, block_m), B * H)](
            q, k, v, p, r, slopes, out, lse, scale, Tq, Tk, H, D, DV, DP,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_pow2(D), BLOCK_DV=_pow2(DV), BLOCK_DP=_pow2(DP),
            Z_PRECISION=precision, QK_PRECISION=qk_precision, num_warps=num_warps, num_stages=num_stages)
        ctx.save_for_backward(q, k, v, p, r, slopes, out, lse)
        ctx.path_dtypes = (p_dtype, r_dtype)
        ctx.scale, ctx.config, ctx.precision, ctx.qk_precision = scale, config, precision, qk_precision
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, p, r, slopes, out, lse = ctx.saved_tensors
        block_m, block_n, num_warps, num_stages = ctx.config
        B, H, Tq, D = q.shape
        Tk, DV, DP = k.shape[2], v.shape[3], p.shape[3]
        grad_out = grad_out.contiguous()
        delta = (grad_out.float() * out.float()).sum(-1)  # D_i = dO_i·O_i
        n_ktiles = triton.cdiv(Tk, block_n)
        carry_psi = torch.empty(B * H, n_ktiles, Tq, device=q.device, dtype=torch.float32)
        carry_ds = torch.empty_like(carry_psi)
        dq = torch.empty(q.shape, device=q.device, dtype=torch.float32)
        dp = torch.empty(p.shape, device=q.device, dtype=torch.float32)
        dk = torch.empty(k.shape, device=q.device, dtype=torch.float32)
        dv = torch.empty(v.shape, device=q.device, dtype=torch.float32)
        dr = torch.empty(r.shape, device=q.device, dtype=torch.float32)
        sizes = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_pow2(D), BLOCK_DV=_pow2(DV), BLOCK_DP=_pow2(DP),
                     Z_PRECISION=ctx.precision, QK_PRECISION=ctx.qk_precision, num_warps=num_warps, num_stages=num_stages)
        _bwd_query[(triton.cdiv(Tq, block_m), B * H)](
            q, k, v, p, r, slopes, grad_out, lse, delta, dq, dp, carry_psi, carry_ds,
            ctx.scale, Tq, Tk, H, D, DV, DP, n_ktiles, **sizes)
        _bwd_key[(n_ktiles, B * H)](
            q, k, v, p, r, slopes, grad_out, lse, delta, dk, dv, dr, carry_psi, carry_ds,
            ctx.scale, Tq, Tk, H, D, DV, DP, n_ktiles, **sizes)
        p_dtype, r_dtype = ctx.path_dtypes
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dp.to(p_dtype), dr.to(r_dtype),
                None, None, None)


def default_config(head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). The interpreter uses tiny tiles so the tests are fast."""
    if INTERPRET:
        return (16, 16, 1, 1)
    return (64, 64, 4, 2) if head_dim <= 64 else (64, 32, 4, 2)


def grape_ap_triton(q, k, v, p, r, slopes, scale: float, *, config: tuple[int, int, int, int] | None = None):
    """The Triton path (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1). Returns v's dtype;
    dp, dr come back in p's and r's dtypes."""
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"grape_ap (triton): q, k, v must share one dtype (got {q.dtype}, {k.dtype}, {v.dtype})")
    config = config or default_config(q.shape[3])
    return _TritonGrapeAP.apply(q, k, v, p, r, slopes.detach(), float(scale), tuple(config))
