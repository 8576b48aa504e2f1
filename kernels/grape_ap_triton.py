"""Triton FlashAttention-style kernel for GRAPE-AP attention (forward and backward), O(T) memory.

Same contract as ``kernels.grape_ap.grape_ap_attention``. Per program: one (batch·head, query tile).

Forward. Key tiles are visited from the diagonal towards key 0 (softmax does not care about the
order), carrying per query row the *suffix* sum carry_i = Σ_{ℓ >= end of tile, ℓ <= t_i} ψ(i, ℓ). Inside
a tile, bias(i, j) = carry_i + Σ_{j<ℓ<tile end} ψ(i, ℓ) = carry_i + total_i - cumsum_i(j). This is the
bias itself (<= 0, small where the attention weight is large), not the left prefix sum shifted by
a row constant, so its fp32 rounding error is relative to the bias, not to the whole row's sum.
Then the usual online softmax; ψ = α·logsigmoid(p·rᵀ) is a (tile × tile × d_p) dot.

Backward, with dS = P∘(dO·vᵀ - D) the gradient of the logits. The path gradient is the *left prefix*
dψ(i, ℓ) = Σ_{j<ℓ} dS(i, j) (bias(i, j) contains ψ(i, ℓ) exactly when j < ℓ <= t_i). The right-to-left
order gives running suffixes Σ_{j>=ℓ} dS(i, j), so it is written E_i - suffix with E_i = Σ_j dS(i, j).
E_i is zero in exact arithmetic but not in bf16/fp16: the forward rounds P to the input dtype for the
P·v product and O to the output dtype, so D_i = dO_i·O_i differs from Σ_j P_ij dP_ij by about one
rounding unit. Dropping E_i (the suffix alone) puts that error on every ℓ to the left of where the
row's attention lies, and dp, dr then sum it over all t_i of them: an error that grows with T
(measured before this form: fp16 dp relative error 1.4e-2 at T = 256, 3.5e-2 at T = 512, against
5e-4 for dq/dk/dv). With E_i the error of dψ(i, ℓ) is bounded by |E_i|·Σ_{j<ℓ} P_ij.

Two kernels, both without atomics (deterministic), run once per *pass* of ``pass_rows`` query rows:
``_bwd_query`` (query-major, like the forward) gives dq, dp and E, and stores both running suffixes at
every key-tile boundary of the pass's rows; ``_bwd_key`` (key-major) reads them back to rebuild the
same bias and gradient suffixes and adds the pass's share of dk, dv, dr. The boundary values take
8·B·H·pass_rows·⌈Tk/BLOCK_N⌉ bytes: linear in T for a fixed ``pass_rows`` (one pass covers T <= pass_rows).

Accumulation is fp32 throughout (inputs bf16/fp16/fp32). The path vectors p, r are passed as fp32;
their dot uses 3xTF32 on the GPU (about fp32 accuracy at a small fraction of the q·k cost).
The interpreter (TRITON_INTERPRET=1) runs these kernels on the CPU in fp32/fp16 for the tests; its
bf16 dot is wrong, so bf16 is checked on a GPU (scripts/gpu_check.sh).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_common import INTERPRET, load_tile, pow2, query_tile, store_tile



@triton.jit
def _logsigmoid_and_slope(z):
    """logsigmoid(z) and its derivative sigmoid(-z), both without overflow for any z."""
    e = tl.exp(-tl.abs(z))
    log_sig = tl.minimum(z, 0.0) - tl.log(1.0 + e)
    sig_neg = tl.where(z >= 0, e, 1.0) / (1.0 + e)
    return log_sig, sig_neg


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
def _path_grad_parts(ds, carry_ds, visible, cols, slope, sig_neg):
    """The two parts of dz(i, ℓ) = dψ(i, ℓ)·α·sigmoid(-z) = weight·(E_i - suffix): the running suffix
    Σ_{j>=ℓ} dS(i, j), the weight α·sigmoid(-z) (zero for ℓ = 0, which no bias contains, and for ℓ > t_i),
    and the tile's dS row sums (the next carry_ds increment)."""
    ds_total = tl.sum(ds, axis=1)
    suffix = carry_ds[:, None] + ds_total[:, None] - tl.cumsum(ds, axis=1) + ds
    weight = tl.where(visible & (cols[None, :] >= 1), slope * sig_neg, 0.0)
    return suffix, weight, ds_total


@triton.jit
def _fwd(Q, K, V, P, R, SLOPES, OUT, LSE, scale, Tq, Tk, H, D, DV, DP,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
         BLOCK_DP: tl.constexpr, Z_PRECISION: tl.constexpr, QK_PRECISION: tl.constexpr):
    bh, rows, row_ok, t = query_tile(Tq, Tk, BLOCK_M)
    slope = tl.load(SLOPES + bh % H)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    dp = tl.arange(0, BLOCK_DP)
    q = load_tile(Q, bh, Tq, rows, row_ok, d, D)
    p = load_tile(P, bh, Tq, rows, row_ok, dp, DP)

    m_i = tl.full([BLOCK_M], -1e30, tl.float32)  # finite: a row may see no key in its first tiles
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    carry = tl.zeros([BLOCK_M], tl.float32)
    last_key = tl.minimum(Tk - Tq + tl.program_id(0) * BLOCK_M + BLOCK_M - 1, Tk - 1)
    n_tiles = last_key // BLOCK_N + 1
    for it in range(0, n_tiles):
        kb = n_tiles - 1 - it  # right to left: the suffix sums are then running sums
        cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < Tk
        k = load_tile(K, bh, Tk, cols, col_ok, d, D)
        v = load_tile(V, bh, Tk, cols, col_ok, dv, DV)
        r = load_tile(R, bh, Tk, cols, col_ok, dp, DP)
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
    store_tile(OUT, out.to(OUT.dtype.element_ty), bh, Tq, rows, row_ok, dv, DV)
    tl.store(LSE + bh * Tq + rows, m_i + tl.log(l_i), mask=row_ok)


@triton.jit
def _bwd_query(Q, K, V, P, R, SLOPES, DO, LSE, DELTA, DQ, DPATH, DS_TOTAL, CARRY_PSI, CARRY_DS,
               scale, Tq, Tk, H, D, DV, DP, N_KTILES, PASS_ROWS, first_row,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_DP: tl.constexpr, Z_PRECISION: tl.constexpr, QK_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    slope = tl.load(SLOPES + bh % H)
    offset = Tk - Tq
    pass_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row index within this pass
    rows = first_row + pass_rows
    row_ok = rows < Tq
    t = rows + offset
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    dp = tl.arange(0, BLOCK_DP)
    q = load_tile(Q, bh, Tq, rows, row_ok, d, D)
    p = load_tile(P, bh, Tq, rows, row_ok, dp, DP)
    do = load_tile(DO, bh, Tq, rows, row_ok, dv, DV)
    lse = tl.load(LSE + bh * Tq + rows, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * Tq + rows, mask=row_ok, other=0.0)

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dpath_suffix = tl.zeros([BLOCK_M, BLOCK_DP], tl.float32)  # Σ_ℓ weight·suffix·r_ℓ
    dpath_weight = tl.zeros([BLOCK_M, BLOCK_DP], tl.float32)  # Σ_ℓ weight·r_ℓ, times E_i at the end
    carry = tl.zeros([BLOCK_M], tl.float32)
    carry_ds = tl.zeros([BLOCK_M], tl.float32)
    last_key = tl.minimum(offset + first_row + pid_m * BLOCK_M + BLOCK_M - 1, Tk - 1)
    n_tiles = last_key // BLOCK_N + 1
    for it in range(0, n_tiles):
        kb = n_tiles - 1 - it
        cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < Tk
        k = load_tile(K, bh, Tk, cols, col_ok, d, D)
        v = load_tile(V, bh, Tk, cols, col_ok, dv, DV)
        r = load_tile(R, bh, Tk, cols, col_ok, dp, DP)
        # the key-major kernel restarts from these boundary values
        boundary = (bh * N_KTILES + kb) * PASS_ROWS + pass_rows
        tl.store(CARRY_PSI + boundary, carry, mask=row_ok)
        tl.store(CARRY_DS + boundary, carry_ds, mask=row_ok)

        visible = (cols[None, :] <= t[:, None]) & col_ok[None, :]
        bias, tile_total, sig_neg = _path_bias(p, r, slope, carry, visible, Z_PRECISION)
        _, ds = _probs_and_ds(q, k, v, do, bias, lse, delta, visible, scale, QK_PRECISION)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=QK_PRECISION)
        suffix, weight, ds_total = _path_grad_parts(ds, carry_ds, visible, cols, slope, sig_neg)
        dpath_suffix += tl.dot(weight * suffix, r, input_precision=Z_PRECISION)
        dpath_weight += tl.dot(weight, r, input_precision=Z_PRECISION)
        carry += tile_total
        carry_ds += ds_total
    row_total = carry_ds  # E_i = Σ_j dS(i, j)
    tl.store(DS_TOTAL + bh * Tq + rows, row_total, mask=row_ok)
    store_tile(DQ, dq * scale, bh, Tq, rows, row_ok, d, D)
    store_tile(DPATH, row_total[:, None] * dpath_weight - dpath_suffix, bh, Tq, rows, row_ok, dp, DP)


@triton.jit
def _accumulate_tile(ptr, value, bh, n_rows, rows, row_ok, cols, width, ACCUMULATE: tl.constexpr):
    if ACCUMULATE:  # a later pass adds its share to what the earlier passes stored
        value += load_tile(ptr, bh, n_rows, rows, row_ok, cols, width)
    store_tile(ptr, value, bh, n_rows, rows, row_ok, cols, width)


@triton.jit
def _bwd_key(Q, K, V, P, R, SLOPES, DO, LSE, DELTA, DK, DV_OUT, DR, DS_TOTAL, CARRY_PSI, CARRY_DS,
             scale, Tq, Tk, H, D, DV, DP, N_KTILES, PASS_ROWS, first_row, end_row,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
             BLOCK_DP: tl.constexpr, Z_PRECISION: tl.constexpr, QK_PRECISION: tl.constexpr,
             ACCUMULATE: tl.constexpr):
    kb = tl.program_id(0)
    bh = tl.program_id(1)
    slope = tl.load(SLOPES + bh % H)
    offset = Tk - Tq
    cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < Tk
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    dp = tl.arange(0, BLOCK_DP)
    k = load_tile(K, bh, Tk, cols, col_ok, d, D)
    v = load_tile(V, bh, Tk, cols, col_ok, dv, DV)
    r = load_tile(R, bh, Tk, cols, col_ok, dp, DP)

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    dr = tl.zeros([BLOCK_N, BLOCK_DP], tl.float32)
    # the first query of this pass that sees this key tile (first_row is a multiple of BLOCK_M)
    start_row = tl.maximum(kb * BLOCK_N - offset, first_row)
    for mb in range(start_row // BLOCK_M, tl.cdiv(end_row, BLOCK_M)):
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < end_row
        t = rows + offset
        q = load_tile(Q, bh, Tq, rows, row_ok, d, D)
        p = load_tile(P, bh, Tq, rows, row_ok, dp, DP)
        do = load_tile(DO, bh, Tq, rows, row_ok, dv, DV)
        lse = tl.load(LSE + bh * Tq + rows, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * Tq + rows, mask=row_ok, other=0.0)
        row_total = tl.load(DS_TOTAL + bh * Tq + rows, mask=row_ok, other=0.0)
        boundary = (bh * N_KTILES + kb) * PASS_ROWS + rows - first_row
        carry = tl.load(CARRY_PSI + boundary, mask=row_ok, other=0.0)
        carry_ds = tl.load(CARRY_DS + boundary, mask=row_ok, other=0.0)

        visible = (cols[None, :] <= t[:, None]) & col_ok[None, :] & row_ok[:, None]
        bias, _, sig_neg = _path_bias(p, r, slope, carry, visible, Z_PRECISION)
        probs, ds = _probs_and_ds(q, k, v, do, bias, lse, delta, visible, scale, QK_PRECISION)
        dv_acc += tl.dot(tl.trans(probs.to(do.dtype)), do, input_precision=QK_PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=QK_PRECISION)
        suffix, weight, _ = _path_grad_parts(ds, carry_ds, visible, cols, slope, sig_neg)
        dz = weight * (row_total[:, None] - suffix)  # weight·dψ, dψ(i, ℓ) = Σ_{j<ℓ} dS(i, j)
        dr += tl.dot(tl.trans(dz), p, input_precision=Z_PRECISION)
    _accumulate_tile(DK, dk * scale, bh, Tk, cols, col_ok, d, D, ACCUMULATE)
    _accumulate_tile(DV_OUT, dv_acc, bh, Tk, cols, col_ok, dv, DV, ACCUMULATE)
    _accumulate_tile(DR, dr, bh, Tk, cols, col_ok, dp, DP, ACCUMULATE)


def _precisions(dtype: torch.dtype) -> tuple[str, str]:
    """Dot precisions (path, q·k): the d_p-wide path dot in 3xTF32 on the GPU (about fp32 accuracy at a
    small fraction of the q·k cost); fp32 q, k, v get true fp32 dots (Triton's fp32 default is TF32),
    bf16/fp16 ignore the setting. The interpreter only knows "ieee"."""
    path = "ieee" if INTERPRET else "tf32x3"
    qk = "ieee" if (INTERPRET or dtype == torch.float32) else "tf32"
    return path, qk


def _launch_sizes(q, v, p, config, dtype) -> dict:
    block_m, block_n, num_warps, num_stages = config[:4]
    path, qk = _precisions(dtype)
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=pow2(q.shape[3]), BLOCK_DV=pow2(v.shape[3]),
                BLOCK_DP=pow2(p.shape[3]), Z_PRECISION=path, QK_PRECISION=qk, num_warps=num_warps,
                num_stages=num_stages)


def triton_forward(q, k, v, p, r, slopes, scale: float, config) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in v's dtype, lse fp32 (B, H, Tq)). q, k, v contiguous in one dtype; p, r fp32 contiguous."""
    B, H, Tq, D = q.shape
    Tk, DV, DP = k.shape[2], v.shape[3], p.shape[3]
    out = torch.empty(B, H, Tq, DV, device=q.device, dtype=v.dtype)
    lse = torch.empty(B, H, Tq, device=q.device, dtype=torch.float32)
    _fwd[(triton.cdiv(Tq, config[0]), B * H)](q, k, v, p, r, slopes, out, lse, scale, Tq, Tk, H, D, DV, DP,
                                              **_launch_sizes(q, v, p, config, q.dtype))
    return out, lse


def backward_pass_rows(Tq: int, block_m: int, pass_rows: int) -> int:
    """Query rows per backward pass: a multiple of the query tile, at most Tq rounded up to one."""
    whole = triton.cdiv(Tq, block_m) * block_m
    return min(whole, max(block_m, pass_rows // block_m * block_m))


def triton_backward(grad_out, q, k, v, p, r, slopes, out, lse, scale: float, config):
    """(dq, dk, dv, dp, dr) in fp32. config = (BLOCK_M, BLOCK_N, num_warps, num_stages, pass_rows)."""
    block_m, block_n = config[0], config[1]
    B, H, Tq, D = q.shape
    Tk, DV, DP = k.shape[2], v.shape[3], p.shape[3]
    delta = (grad_out.float() * out.float()).sum(-1)  # D_i = dO_i·O_i
    n_ktiles = triton.cdiv(Tk, block_n)
    rows_per_pass = backward_pass_rows(Tq, block_m, config[4])
    n_passes = triton.cdiv(Tq, rows_per_pass)
    carry_psi = torch.empty(B * H, n_ktiles, rows_per_pass, device=q.device, dtype=torch.float32)
    carry_ds = torch.empty_like(carry_psi)
    ds_total = torch.empty(B, H, Tq, device=q.device, dtype=torch.float32)
    dq = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    dp = torch.empty(p.shape, device=q.device, dtype=torch.float32)
    # several passes add into dk, dv, dr, so they start at zero; one pass stores them directly
    make = torch.zeros if n_passes > 1 else torch.empty
    dk, dv, dr = (make(x.shape, device=q.device, dtype=torch.float32) for x in (k, v, r))
    sizes = _launch_sizes(q, v, p, config, q.dtype)
    for first_row in range(0, Tq, rows_per_pass):
        end_row = min(Tq, first_row + rows_per_pass)
        _bwd_query[(triton.cdiv(end_row - first_row, block_m), B * H)](
            q, k, v, p, r, slopes, grad_out, lse, delta, dq, dp, ds_total, carry_psi, carry_ds,
            scale, Tq, Tk, H, D, DV, DP, n_ktiles, rows_per_pass, first_row, **sizes)
        key_tiles = triton.cdiv(min(Tk, Tk - Tq + end_row), block_n)  # the keys this pass's rows see
        _bwd_key[(key_tiles, B * H)](
            q, k, v, p, r, slopes, grad_out, lse, delta, dk, dv, dr, ds_total, carry_psi, carry_ds,
            scale, Tq, Tk, H, D, DV, DP, n_ktiles, rows_per_pass, first_row, end_row,
            ACCUMULATE=n_passes > 1, **sizes)
    return dq, dk, dv, dp, dr


# Query rows per backward pass: the boundary carries take 8·B·H·PASS_ROWS·⌈Tk/BLOCK_N⌉ bytes (at B·H = 8,
# Tk = 32768, BLOCK_N = 32: 128 MiB, one bf16 (B, H, T, 128) tensor is 64 MiB). Enough rows per pass
# that the query-major kernel's grid (PASS_ROWS / BLOCK_M · B·H programs) fills an H100/H200.
PASS_ROWS = 2048


def default_config(head_dim: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, pass_rows). The interpreter uses tiny tiles so the
    tests are fast."""
    if INTERPRET:
        return (16, 16, 1, 1, PASS_ROWS)
    return (64, 64, 4, 2, PASS_ROWS) if head_dim <= 64 else (64, 32, 4, 2, PASS_ROWS)


def grape_ap_triton(q, k, v, p, r, slopes, scale: float, *, config=None):
    """The Triton path (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1), through the same
    autograd-aware custom op as ``grape_ap_attention``. Returns v's dtype; dp, dr come back in p's and
    r's dtypes. config: (BLOCK_M, BLOCK_N, num_warps, num_stages[, pass_rows])."""
    from kernels.grape_ap import path_attention
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"grape_ap (triton): q, k, v must share one dtype (got {q.dtype}, {k.dtype}, {v.dtype})")
    config = tuple(config or default_config(q.shape[3]))
    if len(config) == 4:
        config += (PASS_ROWS,)
    # made contiguous (and p, r fp32) out here, so that autograd saves these copies for the backward
    # instead of the op copying the model's strided q, k, v views once in each pass
    q, k, v = (x.contiguous() for x in (q, k, v))
    p, r = (x.float().contiguous() for x in (p, r))
    return path_attention(q, k, v, p, r, slopes, scale, "triton", list(config))
