"""Triton FlashAttention-class kernels for GRAPE-AP attention (forward and backward), O(T) memory.

Same contract as ``attention_kernels.grape_ap.grape_ap_attention``; the derivation is in docs/grape_ap_kernel.md.

Forward: one program per (batch·head, query tile) visits key tiles from the diagonal towards key 0 and
carries, per query row, the suffix carry_i = Σ ψ(i, ℓ) over the keys right of the tile (ℓ <= t_i). Inside
a tile the bias is carry_i plus the in-tile suffix Σ_{j<ℓ<tile end} ψ(i, ℓ), computed on the tensor cores
as ψ·GT with GT[ℓ, j] = [ℓ > j] a triangular matrix of ones (the design of stick-breaking attention's
kernels). Every sum is fp32 and covers only one tile, and ψ <= 0, so the bias carries fp32's error
relative to |bias| (no carry + total - cumsum cancellation). Then the online softmax.

Everything runs in the exp2/log2 domain: z = p·r·log2(e) (log2(e) folded into p on the host), so
ψ·log2(e) = α·(min(z, 0) - log2(1 + 2^-|z|)) without another constant, and the logits are
s = q·k·(scale·log2 e) + bias. Tiles wholly below the diagonal take a loop without mask work.

Precision with bf16/fp16 inputs (fp32 inputs run every dot in fp32, "ieee", and Triton's exact log2):
every fp32 operand goes through the tensor cores as hi + lo parts with fp32 accumulation, in fp16 22
significant bits, about fp32 (tools/split_precision.py measures the formats). z = p·r takes the parts
from the host (``_path_operands``: one K = 32 dot, no per-element work); the in-tile suffix of ψ splits ψ
in registers. ψ is clamped at -2^15 (log2 units) to stay in fp16's range: any key left of such an edge has
bias <= -2^15 and softmax weight exactly 0 with or without the clamp. dS and the path gradients' operands
take bf16 parts (16 bits, fp32's range: α·sigmoid(-z) falls far below fp16's normal range for large z), cut
with integer instructions (``_parts``); p and r come split from the host (``_path_parts``).
log2(1 + 2^-|z|) is the hardware's lg2.approx (one special-function instruction; Triton's log2 is a
20-instruction polynomial); the backward's 2^-log2(1 + 2^-|z|) = 1/(1 + 2^-|z|) is a polynomial on the FMA
pipes (``_exp2_neg_unit``): three special-function operations per score element in each kernel.

Backward, with dS = P∘(dO·vᵀ - D) the gradient of the logits: the path gradient is the left prefix
dψ(i, ℓ) = Σ_{j<ℓ} dS(i, j) = E_i - Σ_{j>=ℓ} dS(i, j), E_i = Σ_j dS(i, j) the row total (not zero in
bf16/fp16: docs/grape_ap_kernel.md), with the suffix again a running carry plus a triangular dot
(GE[j, ℓ] = [j >= ℓ]). Per pass of ``pass_rows`` query rows, without atomics (deterministic):
``_bwd_query`` (query-major: dq and E_i) stores the running suffixes of ψ and dS at every key-tile edge of the
key-major kernel; ``_bwd_key`` (key-major: dk, dv, dr, and each key tile's share of dp) reads them back and, with
E_i known, forms the path gradient dz = α·sigmoid(-z)·dψ once, for both dr and dp; ``_sum_path_partials`` sums
the dp shares over the key tiles. Scratch: 8·B·H·pass_rows·⌈Tk/BLOCK_N⌉ bytes of carries and
4·S·B·H·pass_rows·⌈Tk/BLOCK_N⌉ of dp shares (S = 8 columns for d_p <= 8), linear in T for a fixed
``pass_rows``. The key-major kernel's key tiles are a whole number (RATIO) of the query-major kernel's, which
stores the carries only at their edges; tile sizes in ``default_config``, checked by ``check_config``.

Grouped-query attention (GROUP query heads per key/value head: k, v and r of head h // GROUP, read without a
copy; the key-major kernel adds its group's query heads in turn) and a sliding window (WINDOWED, width
``window``: key tiles outside every row's window are not visited): docs/grape_ap_kernel.md, "Grouped-query
attention and a sliding window".

The interpreter (TRITON_INTERPRET=1) runs these kernels on the CPU for the tests, in fp32, fp16 and bf16 (with
the GPU's bf16 rounding: attention_kernels/triton_common.py).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from attention_kernels.triton_common import (INTERPRET, TRITON_VERSION, key_tile_range, load_tile, online_softmax, pow2,
                                             query_tile, store_tile, window_tile_range)

LOG2E = 1.0 / math.log(2.0)


@triton.jit
def _parts(x, LOW: tl.constexpr):
    """fp32 x as hi + lo in LOW (x - hi - lo: 2^-22 of |x| in fp16, 2^-17 in bf16). bf16's hi is x with its low
    16 bits masked off, read as bf16 by a shift: integer instructions, where a rounding conversion to bf16 that
    is also read back to fp32 compiled to one F2F per element (a quarter-rate conversion, as costly as a MUFU)."""
    if LOW == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        hi = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        lo = (x - (bits & 0xFFFF0000).to(tl.float32, bitcast=True)).to(tl.bfloat16)
    else:
        hi = x.to(LOW)
        lo = (x - hi.to(tl.float32)).to(LOW)
    return hi, lo


@triton.jit
def _split_dot(x, y, acc, SPLIT: tl.constexpr):
    """acc + x·y with fp32 accumulation, x fp32: as hi + lo parts in y's dtype (SPLIT), else one fp32 dot.
    Two parts keep 22 bits (fp16) or 16 bits (bf16) of x, and down to 2^-25 absolute where fp16's lo part
    is subnormal."""
    if SPLIT:
        hi, lo = _parts(x, y.dtype)
        acc = tl.dot(hi, y, acc)
        acc = tl.dot(lo, y, acc)
    else:
        acc = tl.dot(x, y, acc, input_precision="ieee")
    return acc


@triton.jit
def boundary_index(bh, n_key_tiles, key_tile, pass_rows, pass_row):
    """Where the boundary carries of (batch·head bh, key tile, row of the pass) live: 64-bit, since
    B·H·⌈Tk/BLOCK_N⌉·pass_rows passes 2³¹ at e.g. B·H = 512, Tk = 128k in 32-key tiles."""
    return (bh.to(tl.int64) * n_key_tiles + key_tile) * pass_rows + pass_row


@triton.jit
def _triangle(BLOCK_N: tl.constexpr, GREATER_EQUAL: tl.constexpr, DTYPE: tl.constexpr):
    """GT[a, b] = [a > b], or GE[a, b] = [a >= b], in DTYPE."""
    a = tl.arange(0, BLOCK_N)
    if GREATER_EQUAL:
        tri = tl.where(a[:, None] >= a[None, :], 1.0, 0.0)
    else:
        tri = tl.where(a[:, None] > a[None, :], 1.0, 0.0)
    return tri.to(DTYPE)  # through fp32: Triton 3.0-3.2 lower a bool-to-fp16 cast to an invalid integer op


@triton.jit
def _triangles(BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    """GT for the in-tile suffix of ψ (fp16 parts) and GE for that of dS, whose bf16 parts also carry the path
    gradients' products (bf16 for fp16 inputs too: fp32's range, where α·sigmoid(-z) and dS fall far below
    fp16's)."""
    if SPLIT:
        gt = _triangle(BLOCK_N, False, tl.float16)
        ge = _triangle(BLOCK_N, True, tl.bfloat16)
    else:
        gt = _triangle(BLOCK_N, False, tl.float32)
        ge = _triangle(BLOCK_N, True, tl.float32)
    return gt, ge


@triton.jit
def _log2(x, FAST: tl.constexpr):
    """log2 for x in [1, 2]: one MUFU.LG2 (absolute error about 2^-22) where FAST, else Triton's exact
    log2 (about 20 instructions). The interpreter cannot run PTX."""
    if FAST:
        y = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)
    else:
        y = tl.log2(x)
    return y


@triton.jit
def _exp2_neg_unit(x, POLYNOMIAL: tl.constexpr):
    """2^-x for x in [0, 1]: with POLYNOMIAL a degree-4 polynomial on the FMA pipes (relative error 2.7e-6, far
    below bf16/fp16 gradients' rounding), where exp2 would take a fourth special-function (MUFU) operation per
    score element; else exp2 (fp32 inputs)."""
    if POLYNOMIAL:
        y = x * 0.006767073180526495 - 0.05307407304644585
        y = y * x + 0.2393411099910736
        y = y * x - 0.6930302381515503
        y = y * x + 0.9999974370002747
    else:
        y = tl.exp2(-x)
    return y


@triton.jit
def _biased_logits(q, k, pz, rz, carry, slope, qk_scale, gt, visible, path_visible, MASKED: tl.constexpr,
                   SPLIT: tl.constexpr, FAST_LOG2: tl.constexpr, QK_PRECISION: tl.constexpr, WITH_WEIGHT: tl.constexpr):
    """One tile's logits s = q·k·scale·log2(e) + bias (log2 units; -inf at keys not visible when MASKED),
    its ψ·log2(e) and, WITH_WEIGHT, the path gradient's weight α·sigmoid(-z), both zero where not path_visible
    (past the diagonal; with a window also at and before each row's window start, whose ψ is in no visible
    key's bias: without a window path_visible is visible)."""
    z = tl.dot(pz, tl.trans(rz), input_precision="ieee")  # z·log2(e), see _path_operands
    e = tl.exp2(-tl.abs(z))
    soft = _log2(1.0 + e, FAST_LOG2)  # log2(1 + 2^-|z|): logsigmoid = min(z, 0) - soft, overflow-free
    psi = tl.maximum(slope * (tl.minimum(z, 0.0) - soft), -32768.0)
    weight = psi  # unused unless WITH_WEIGHT
    if WITH_WEIGHT:  # α·sigmoid(-z) = α·(2^-|z| if z >= 0 else 1) / (1 + 2^-|z|), 2^-soft = 1/(1 + 2^-|z|);
        # before the dots below, so that z, e and soft are dead during them
        weight = tl.where(z >= 0, slope * e, slope) * _exp2_neg_unit(soft, SPLIT)
        if MASKED:
            weight = tl.where(path_visible, weight, 0.0)
    if MASKED:
        psi = tl.where(path_visible, psi, 0.0)
    s = tl.dot(q, tl.trans(k), input_precision=QK_PRECISION) * qk_scale + carry[:, None]
    s = _split_dot(psi, gt, s, SPLIT)
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    return s, psi, weight


@triton.jit
def _visible(cols, t, window, WINDOWED: tl.constexpr):
    """Which keys of a tile each row (at key position t) sees: up to the diagonal, with a window from
    t - window + 1."""
    visible = cols[None, :] <= t[:, None]
    if WINDOWED:
        visible = visible & (cols[None, :] > t[:, None] - window)
    return visible


@triton.jit
def _fwd_tiles(acc, m_i, l_i, carry, q, pz, t, K, V, RZ, bkv, Tk, window, slope, qk_scale, gt, lo, hi,
               D: tl.constexpr, DV: tl.constexpr, KZ: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, WINDOWED: tl.constexpr, SPLIT: tl.constexpr,
               FAST_LOG2: tl.constexpr, QK_PRECISION: tl.constexpr):
    for it in range(lo, hi):
        kb = lo + hi - 1 - it  # right to left: the suffix sums are then running sums
        cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < Tk
        k = load_tile(K, bkv, Tk, cols, col_ok, D, BLOCK_D)
        v = load_tile(V, bkv, Tk, cols, col_ok, DV, BLOCK_DV)
        rz = load_tile(RZ, bkv, Tk, cols, col_ok, KZ, KZ)
        visible = _visible(cols, t, window, WINDOWED)
        # (ψ at a row's window start, which this mask keeps, enters only hidden keys' biases and carries no row
        # reads: only the key-major kernel's path weights need the stricter mask)
        s, psi, _ = _biased_logits(q, k, pz, rz, carry, slope, qk_scale, gt, visible, visible,
                                   MASKED, SPLIT, FAST_LOG2, QK_PRECISION, False)
        acc, m_i, l_i = online_softmax(acc, m_i, l_i, s, v, QK_PRECISION, True)
        carry += tl.sum(psi, axis=1)
    return acc, m_i, l_i, carry


@triton.jit
def _fwd(Q, K, V, PZ, RZ, SLOPES, OUT, LSE, qk_scale, Tq, Tk, H, window,
         D: tl.constexpr, DV: tl.constexpr, KZ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, SPLIT: tl.constexpr, FAST_LOG2: tl.constexpr,
         QK_PRECISION: tl.constexpr, GROUP: tl.constexpr, WINDOWED: tl.constexpr):
    bh, rows, row_ok, t = query_tile(Tq, Tk, BLOCK_M)
    bkv = bh // GROUP  # the shared key/value head (q: (B, H), k: (B, H / GROUP) heads)
    slope = tl.load(SLOPES + bh % H)
    q = load_tile(Q, bh, Tq, rows, row_ok, D, BLOCK_D)
    pz = load_tile(PZ, bh, Tq, rows, row_ok, KZ, KZ)
    gt, _ = _triangles(BLOCK_N, SPLIT)

    m_i = tl.full([BLOCK_M], -1e30, tl.float32)  # finite: a row may see no key in its first tiles
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    carry = tl.zeros([BLOCK_M], tl.float32)
    n_full, n_tiles = key_tile_range(tl.program_id(0) * BLOCK_M, Tq, Tk, BLOCK_M, BLOCK_N)
    lo, lo_full = 0, 0
    if WINDOWED:  # key tiles left of every row's window are not visited at all
        lo, lo_full = window_tile_range(tl.program_id(0) * BLOCK_M, Tq, Tk, window, n_full, BLOCK_M, BLOCK_N)
    acc, m_i, l_i, carry = _fwd_tiles(acc, m_i, l_i, carry, q, pz, t, K, V, RZ, bkv, Tk, window, slope, qk_scale, gt,
                                      n_full, n_tiles, D, DV, KZ, BLOCK_D, BLOCK_DV, BLOCK_N, True, WINDOWED, SPLIT,
                                      FAST_LOG2, QK_PRECISION)
    acc, m_i, l_i, carry = _fwd_tiles(acc, m_i, l_i, carry, q, pz, t, K, V, RZ, bkv, Tk, window, slope, qk_scale, gt,
                                      lo_full, n_full, D, DV, KZ, BLOCK_D, BLOCK_DV, BLOCK_N, False, WINDOWED, SPLIT,
                                      FAST_LOG2, QK_PRECISION)
    if WINDOWED:
        acc, m_i, l_i, carry = _fwd_tiles(acc, m_i, l_i, carry, q, pz, t, K, V, RZ, bkv, Tk, window, slope, qk_scale,
                                          gt, lo, lo_full, D, DV, KZ, BLOCK_D, BLOCK_DV, BLOCK_N, True, WINDOWED,
                                          SPLIT, FAST_LOG2, QK_PRECISION)
    store_tile(OUT, (acc / l_i[:, None]).to(OUT.dtype.element_ty), bh, Tq, rows, row_ok, DV, BLOCK_DV)
    tl.store(LSE + bh * Tq + rows, m_i + tl.log2(l_i), mask=row_ok)  # log2 units, read by the backward


@triton.jit
def _probs_and_ds(s, lse, do, v, delta, QK_PRECISION: tl.constexpr):
    """P = 2^(s - lse) (exactly 0 where s = -inf, past the diagonal) and dS = P∘(dO·vᵀ - D)."""
    probs = tl.exp2(s - lse[:, None])
    return probs, probs * (tl.dot(do, tl.trans(v), input_precision=QK_PRECISION) - delta[:, None])


@triton.jit
def _bwd_query_tiles(dq, carry, carry_ds, q, do, pz, lse, delta, t, row_ok, pass_rows, K, V, RZ, CARRY_PSI,
                     CARRY_DS, bh, bkv, Tk, window, N_KTILES, PASS_ROWS, slope, qk_scale, gt, lo, hi, D: tl.constexpr,
                     DV: tl.constexpr, KZ: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     BLOCK_N: tl.constexpr, RATIO: tl.constexpr, MASKED: tl.constexpr, WINDOWED: tl.constexpr,
                     SPLIT: tl.constexpr, FAST_LOG2: tl.constexpr, QK_PRECISION: tl.constexpr):
    for it in range(lo, hi):
        kb = lo + hi - 1 - it
        cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < Tk
        k = load_tile(K, bkv, Tk, cols, col_ok, D, BLOCK_D)
        v = load_tile(V, bkv, Tk, cols, col_ok, DV, BLOCK_DV)
        rz = load_tile(RZ, bkv, Tk, cols, col_ok, KZ, KZ)
        # the key-major kernel restarts from these values at the right edge of each of its key tiles (RATIO
        # of these)
        boundary = boundary_index(bh, N_KTILES, kb // RATIO, PASS_ROWS, pass_rows)
        edge = row_ok & ((pass_rows * 0 + kb % RATIO) == RATIO - 1)  # row-shaped: the interpreter's masks
        tl.store(CARRY_PSI + boundary, carry, mask=edge)
        tl.store(CARRY_DS + boundary, carry_ds, mask=edge)
        visible = _visible(cols, t, window, WINDOWED)
        s, psi, _ = _biased_logits(q, k, pz, rz, carry, slope, qk_scale, gt, visible, visible,
                                   MASKED, SPLIT, FAST_LOG2, QK_PRECISION, False)
        _, ds = _probs_and_ds(s, lse, do, v, delta, QK_PRECISION)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=QK_PRECISION)
        carry += tl.sum(psi, axis=1)
        carry_ds += tl.sum(ds, axis=1)
    return dq, carry, carry_ds


@triton.jit
def _bwd_query(Q, K, V, PZ, RZ, SLOPES, DO, LSE, DELTA, DQ, DS_TOTAL, CARRY_PSI, CARRY_DS,
               qk_scale, Tq, Tk, H, window, N_KTILES, PASS_ROWS, first_row,
               D: tl.constexpr, DV: tl.constexpr, KZ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, RATIO: tl.constexpr, SPLIT: tl.constexpr,
               FAST_LOG2: tl.constexpr, QK_PRECISION: tl.constexpr, GROUP: tl.constexpr, WINDOWED: tl.constexpr):
    bh = tl.program_id(1)
    bkv = bh // GROUP
    slope = tl.load(SLOPES + bh % H)
    pass_rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # row index within this pass
    rows = first_row + pass_rows
    row_ok = rows < Tq
    t = rows + (Tk - Tq)
    q = load_tile(Q, bh, Tq, rows, row_ok, D, BLOCK_D)
    pz = load_tile(PZ, bh, Tq, rows, row_ok, KZ, KZ)
    do = load_tile(DO, bh, Tq, rows, row_ok, DV, BLOCK_DV)
    lse = tl.load(LSE + bh * Tq + rows, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * Tq + rows, mask=row_ok, other=0.0)
    gt, _ = _triangles(BLOCK_N, SPLIT)

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    carry = tl.zeros([BLOCK_M], tl.float32)
    carry_ds = tl.zeros([BLOCK_M], tl.float32)
    n_full, n_tiles = key_tile_range(first_row + tl.program_id(0) * BLOCK_M, Tq, Tk, BLOCK_M, BLOCK_N)
    # whole key-kernel tiles, so that every boundary the key kernel reads is stored (the extra tiles are
    # past every row's diagonal: masked, they add nothing)
    n_tiles = tl.cdiv(n_tiles, RATIO) * RATIO
    lo, lo_full = 0, 0
    if WINDOWED:  # (the carry at a key-major tile's right edge needs only the tiles right of it: no rounding here)
        lo, lo_full = window_tile_range(first_row + tl.program_id(0) * BLOCK_M, Tq, Tk, window, n_full, BLOCK_M,
                                        BLOCK_N)
    dq, carry, carry_ds = _bwd_query_tiles(
        dq, carry, carry_ds, q, do, pz, lse, delta, t, row_ok, pass_rows, K, V, RZ, CARRY_PSI, CARRY_DS, bh, bkv, Tk,
        window, N_KTILES, PASS_ROWS, slope, qk_scale, gt, n_full, n_tiles, D, DV, KZ, BLOCK_D, BLOCK_DV, BLOCK_N,
        RATIO, True, WINDOWED, SPLIT, FAST_LOG2, QK_PRECISION)
    dq, carry, carry_ds = _bwd_query_tiles(
        dq, carry, carry_ds, q, do, pz, lse, delta, t, row_ok, pass_rows, K, V, RZ, CARRY_PSI, CARRY_DS, bh, bkv, Tk,
        window, N_KTILES, PASS_ROWS, slope, qk_scale, gt, lo_full, n_full, D, DV, KZ, BLOCK_D, BLOCK_DV, BLOCK_N,
        RATIO, False, WINDOWED, SPLIT, FAST_LOG2, QK_PRECISION)
    if WINDOWED:
        dq, carry, carry_ds = _bwd_query_tiles(
            dq, carry, carry_ds, q, do, pz, lse, delta, t, row_ok, pass_rows, K, V, RZ, CARRY_PSI, CARRY_DS, bh, bkv,
            Tk, window, N_KTILES, PASS_ROWS, slope, qk_scale, gt, lo, lo_full, D, DV, KZ, BLOCK_D, BLOCK_DV, BLOCK_N,
            RATIO, True, WINDOWED, SPLIT, FAST_LOG2, QK_PRECISION)
    tl.store(DS_TOTAL + bh * Tq + rows, carry_ds, mask=row_ok)  # E_i = Σ_j dS(i, j)
    store_tile(DQ, dq * (qk_scale * 0.6931471805599453), bh, Tq, rows, row_ok, D, BLOCK_D)  # × scale


@triton.jit
def _bwd_key_tiles(dk, dv_acc, dr, k, v, rz, rr, cols, Q, PP, PZ, DO, LSE, DELTA, DS_TOTAL, CARRY_PSI,
                   CARRY_DS, DP_PART, bh, kb, Tq, offset, window, N_KTILES, PASS_ROWS, first_row, end_row, slope,
                   qk_scale, gt, ge, lo, hi, D: tl.constexpr, DV: tl.constexpr, KZ: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DP: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, SHARE: tl.constexpr, MASKED: tl.constexpr, WINDOWED: tl.constexpr,
                   SPLIT: tl.constexpr, FAST_LOG2: tl.constexpr, QK_PRECISION: tl.constexpr):
    for mb in range(lo, hi):
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < end_row
        q = load_tile(Q, bh, Tq, rows, row_ok, D, BLOCK_D)
        pz = load_tile(PZ, bh, Tq, rows, row_ok, KZ, KZ)
        do = load_tile(DO, bh, Tq, rows, row_ok, DV, BLOCK_DV)
        lse = tl.load(LSE + bh * Tq + rows, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * Tq + rows, mask=row_ok, other=0.0)
        row_total = tl.load(DS_TOTAL + bh * Tq + rows, mask=row_ok, other=0.0)
        boundary = boundary_index(bh, N_KTILES, kb, PASS_ROWS, rows - first_row)
        if MASKED:  # a row left of this key tile has no carry stored for it (its query-major tile never got
            # here): read none, whatever the scratch holds, so that its zero weights meet finite numbers
            written = row_ok & (rows + offset >= kb * BLOCK_N)
            if WINDOWED:  # nor for a row whose window ends before this key tile
                written = written & (rows + offset - window < kb * BLOCK_N + BLOCK_N - 1)
        else:
            written = row_ok
        carry = tl.load(CARRY_PSI + boundary, mask=written, other=0.0)
        carry_ds = tl.load(CARRY_DS + boundary, mask=written, other=0.0)
        visible = _visible(cols, rows + offset, window, WINDOWED) & row_ok[:, None]
        path_visible = visible
        if WINDOWED:  # ψ from t - window + 2: the path sum of the window's first key starts after it
            path_visible = visible & (cols[None, :] > rows[:, None] + offset - window + 1)
        s, _, weight = _biased_logits(q, k, pz, rz, carry, slope, qk_scale, gt, visible, path_visible,
                                      MASKED, SPLIT, FAST_LOG2, QK_PRECISION, True)
        probs, ds = _probs_and_ds(s, lse, do, v, delta, QK_PRECISION)
        dv_acc += tl.dot(tl.trans(probs.to(do.dtype)), do, input_precision=QK_PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=QK_PRECISION)
        suffix = _split_dot(ds, ge, tl.zeros_like(ds), SPLIT)  # Σ_{j>=ℓ} dS(i, j) within the tile
        # the path gradient weight·dψ, dψ(i, ℓ) = Σ_{j<ℓ} dS(i, j) = E_i - (carry_ds_i + suffix)
        dz = weight * ((row_total - carry_ds)[:, None] - suffix)
        # this key tile's share of dp_i = Σ_ℓ dz(i, ℓ)·r_ℓ (rows first, as dz is: no transpose), summed over the
        # key tiles by _sum_path_partials
        part = _split_dot(dz, rr, tl.zeros([BLOCK_M, BLOCK_DP], tl.float32), SPLIT)
        if SPLIT:  # ·r_hi and ·r_lo columns added here: the shares take half the scratch
            part = tl.sum(tl.reshape(part, (BLOCK_M, 2, BLOCK_DP // 2)), axis=1)
        store_tile(DP_PART, part, bh * N_KTILES + kb, PASS_ROWS, rows - first_row, row_ok, SHARE, SHARE)
        dr = _split_dot(tl.trans(dz), load_tile(PP, bh, Tq, rows, row_ok, BLOCK_DP, BLOCK_DP), dr, SPLIT)
    return dk, dv_acc, dr


@triton.jit
def _accumulate_tile(ptr, value, bh, n_rows, rows, row_ok, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
                     ACCUMULATE: tl.constexpr):
    if ACCUMULATE:  # a later pass adds its share to what the earlier passes stored
        value += load_tile(ptr, bh, n_rows, rows, row_ok, WIDTH, BLOCK)
    store_tile(ptr, value, bh, n_rows, rows, row_ok, WIDTH, BLOCK)


@triton.jit
def _bwd_key(Q, K, V, PP, RR, PZ, RZ, SLOPES, DO, LSE, DELTA, DK, DV_OUT, DR, DS_TOTAL, CARRY_PSI,
             CARRY_DS, DP_PART, qk_scale, Tq, Tk, H, window, N_KTILES, PASS_ROWS, first_row, end_row,
             D: tl.constexpr, DV: tl.constexpr, KZ: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DP: tl.constexpr,
             SHARE: tl.constexpr, SPLIT: tl.constexpr, FAST_LOG2: tl.constexpr, QK_PRECISION: tl.constexpr,
             ACCUMULATE: tl.constexpr, GROUP: tl.constexpr, WINDOWED: tl.constexpr):
    kb = tl.program_id(0)
    bkv = tl.program_id(1)  # one key/value head: its GROUP query heads add their shares in turn (deterministic)
    offset = Tk - Tq
    cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < Tk
    k = load_tile(K, bkv, Tk, cols, col_ok, D, BLOCK_D)
    v = load_tile(V, bkv, Tk, cols, col_ok, DV, BLOCK_DV)
    rz = load_tile(RZ, bkv, Tk, cols, col_ok, KZ, KZ)
    # r_0 as zero: ψ(i, 0) is in no bias, so key 0 adds nothing to dp (its dψ is zero only up to rounding)
    rr = load_tile(RR, bkv, Tk, cols, col_ok & (cols >= 1), BLOCK_DP, BLOCK_DP)
    gt, ge = _triangles(BLOCK_N, SPLIT)

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    dr = tl.zeros([BLOCK_N, BLOCK_DP], tl.float32)
    # query tiles of this pass: [first, full) straddle the diagonal, [full, complete) see the whole key
    # tile, [complete, last) hold the pass's ragged end (rows past end_row must not count) and, with a window,
    # the rows whose window starts inside this key tile; rows whose window ends before it are not visited
    first = tl.maximum(kb * BLOCK_N - offset, first_row) // BLOCK_M
    last = tl.cdiv(end_row, BLOCK_M)
    if WINDOWED:
        last = tl.maximum(tl.minimum(last, tl.cdiv(tl.maximum(kb * BLOCK_N + BLOCK_N - 1 + window - offset, 0),
                                                   BLOCK_M)), first)
    full = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(kb * BLOCK_N + BLOCK_N - 1 - offset, 0), BLOCK_M), first), last)
    complete = tl.maximum(end_row // BLOCK_M, full)
    if WINDOWED:  # unmasked only where every ψ of the tile is inside each row's path sum
        complete = tl.maximum(tl.minimum(complete, tl.maximum(kb * BLOCK_N + window - 1 - offset, 0) // BLOCK_M), full)
    for member in range(GROUP):
        bh = bkv * GROUP + member
        slope = tl.load(SLOPES + bh % H)
        dk, dv_acc, dr = _bwd_key_tiles(dk, dv_acc, dr, k, v, rz, rr, cols, Q, PP, PZ, DO, LSE, DELTA,
                                        DS_TOTAL, CARRY_PSI, CARRY_DS, DP_PART, bh, kb, Tq, offset, window, N_KTILES,
                                        PASS_ROWS, first_row, end_row, slope, qk_scale, gt, ge, first, full, D, DV, KZ,
                                        BLOCK_D, BLOCK_DV, BLOCK_DP, BLOCK_M, BLOCK_N, SHARE, True, WINDOWED, SPLIT,
                                        FAST_LOG2, QK_PRECISION)
        dk, dv_acc, dr = _bwd_key_tiles(dk, dv_acc, dr, k, v, rz, rr, cols, Q, PP, PZ, DO, LSE, DELTA,
                                        DS_TOTAL, CARRY_PSI, CARRY_DS, DP_PART, bh, kb, Tq, offset, window, N_KTILES,
                                        PASS_ROWS, first_row, end_row, slope, qk_scale, gt, ge, full, complete, D, DV,
                                        KZ, BLOCK_D, BLOCK_DV, BLOCK_DP, BLOCK_M, BLOCK_N, SHARE, False, WINDOWED,
                                        SPLIT, FAST_LOG2, QK_PRECISION)
        dk, dv_acc, dr = _bwd_key_tiles(dk, dv_acc, dr, k, v, rz, rr, cols, Q, PP, PZ, DO, LSE, DELTA,
                                        DS_TOTAL, CARRY_PSI, CARRY_DS, DP_PART, bh, kb, Tq, offset, window, N_KTILES,
                                        PASS_ROWS, first_row, end_row, slope, qk_scale, gt, ge, complete, last, D, DV,
                                        KZ, BLOCK_D, BLOCK_DV, BLOCK_DP, BLOCK_M, BLOCK_N, SHARE, True, WINDOWED,
                                        SPLIT, FAST_LOG2, QK_PRECISION)
    # key 0's ψ is in no bias, so its r gets no gradient at all
    dr = tl.where(cols[:, None] >= 1, dr, 0.0)
    _accumulate_tile(DK, dk * (qk_scale * 0.6931471805599453), bkv, Tk, cols, col_ok, D, BLOCK_D, ACCUMULATE)
    _accumulate_tile(DV_OUT, dv_acc, bkv, Tk, cols, col_ok, DV, BLOCK_DV, ACCUMULATE)
    _accumulate_tile(DR, dr, bkv, Tk, cols, col_ok, BLOCK_DP, BLOCK_DP, ACCUMULATE)


@triton.jit
def _sum_path_partials(DP_PART, DPATH, Tq, Tk, window, N_KTILES, PASS_ROWS, first_row, SHARE: tl.constexpr,
                       BLOCK_M: tl.constexpr, KEY_TILE: tl.constexpr, WINDOWED: tl.constexpr):
    """dp of this pass's rows: the sum of the key-major kernel's per-key-tile shares over the key tiles each row
    sees (the only ones written)."""
    bh = tl.program_id(1)
    pass_rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = first_row + pass_rows
    row_ok = rows < Tq
    seen = (rows + (Tk - Tq)) // KEY_TILE  # the last key tile row i sees
    acc = tl.zeros([BLOCK_M, SHARE], tl.float32)
    if WINDOWED:  # and the first
        first_seen = tl.maximum(rows + (Tk - Tq) - window + 1, 0) // KEY_TILE
        for kb in range(tl.min(tl.where(row_ok, first_seen, N_KTILES)), tl.max(tl.where(row_ok, seen, 0)) + 1):
            ok = row_ok & (seen >= kb) & (first_seen <= kb)
            acc += load_tile(DP_PART, bh * N_KTILES + kb, PASS_ROWS, pass_rows, ok, SHARE, SHARE)
    else:
        for kb in range(0, tl.max(tl.where(row_ok, seen, 0)) + 1):
            acc += load_tile(DP_PART, bh * N_KTILES + kb, PASS_ROWS, pass_rows, row_ok & (seen >= kb), SHARE, SHARE)
    store_tile(DPATH, acc, bh, Tq, rows, row_ok, SHARE, SHARE)


# --------------------------------------------------------------------------------------------------
# Launchers. config = the (BLOCK_M, BLOCK_N, warps, stages) of the forward, the query-major and the
# key-major backward kernel, then the backward's pass rows: 13 integers (see default_config).


def check_config(config) -> tuple[int, ...]:
    """The 13 integers of a tile configuration (see default_config), or a ValueError saying what is wrong.
    Every configuration that passes is valid: tiles are powers of two of at least 16 (tl.dot's smallest), and
    the key-major kernel's key tiles are a whole number of the query-major kernel's, at whose edges the
    query-major kernel stores the boundary carries; the query tiles of the two kernels may differ either way."""
    config = tuple(int(c) for c in config)
    if len(config) != 13:
        raise ValueError(f"grape_ap triton config: expected 13 integers ((BLOCK_M, BLOCK_N, warps, stages) of the "
                         f"forward, the query-major and the key-major backward kernel, then pass rows), got {len(config)}")
    for name, (block_m, block_n, warps, stages) in zip(("forward", "query-major", "key-major"),
                                                        (config[0:4], config[4:8], config[8:12])):
        if any(b < 16 or b & (b - 1) for b in (block_m, block_n)):
            raise ValueError(f"grape_ap triton config: the {name} kernel's tile {block_m}x{block_n} must be powers of "
                             "two of at least 16 (tl.dot's smallest tile)")
        if warps not in (1, 2, 4, 8, 16) or stages < 1:
            raise ValueError(f"grape_ap triton config: the {name} kernel's {warps} warps and {stages} stages must be "
                             "1, 2, 4, 8 or 16 warps and at least one stage")
    if config[9] % config[5]:
        raise ValueError(f"grape_ap triton config: the key-major kernel's key tile ({config[9]}) must be a multiple of "
                         f"the query-major kernel's ({config[5]}), at whose edges the boundary carries are stored; "
                         f"use a key-major BLOCK_N of at least {config[5]}")
    if config[12] < 1:
        raise ValueError(f"grape_ap triton config: pass rows must be positive, got {config[12]}")
    return config


def _path_operands(p: torch.Tensor, r: torch.Tensor, split: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The operands of z·log2(e) = (p·log2 e)·r for the kernels, zero-padded to a power-of-two width.
    split: fp16 parts [p_hi, p_hi, p_lo] and [r_hi, r_lo, r_hi] (x_lo = x - x_hi), so that one fp16 dot
    with fp32 accumulation sums p_hi·r_hi + p_hi·(r - r_hi) + (p - p_hi)·r_hi = p·r - (p - p_hi)(r - r_hi):
    2^-22 relative. Otherwise fp32 (p·log2 e, r) for "ieee" dots."""
    p = p.float() * LOG2E
    r = r.float()
    if split:
        p_hi, r_hi = p.half(), r.half()
        p_lo, r_lo = (p - p_hi.float()).half(), (r - r_hi.float()).half()
        p, r = torch.cat((p_hi, p_hi, p_lo), -1), torch.cat((r_hi, r_lo, r_hi), -1)
    width = pow2(p.shape[-1])
    return tuple(torch.nn.functional.pad(x, (0, width - x.shape[-1])).contiguous() for x in (p, r))


def _constexprs(head_dim: int, value_dim: int, path_dim: int, dtype: torch.dtype, block_m: int, block_n: int,
                interpreter: bool = INTERPRET, group: int = 1, windowed: bool = False) -> dict:
    """The compile-time arguments every kernel takes, for inputs of these sizes and dtype: group = query heads
    per key/value head, windowed = a sliding window (its width is a run-time argument)."""
    split = dtype != torch.float32  # bf16/fp16: tensor-core dots on fp16 hi + lo parts
    return dict(D=head_dim, DV=value_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=pow2(head_dim), GROUP=group,
                WINDOWED=windowed,
                BLOCK_DV=pow2(value_dim), KZ=pow2(path_dim * (3 if split else 1)), SPLIT=split,
                # fp32 inputs: exact log2 and true fp32 dots (Triton's fp32 default is TF32); half types ignore
                # the dot setting. The interpreter knows only "ieee" and cannot run inline PTX.
                FAST_LOG2=split and not interpreter, QK_PRECISION="ieee" if (interpreter or not split) else "tf32")


def kernel_builds(head_dim: int, value_dim: int, path_dim: int, dtype: torch.dtype, config, *, group: int = 1,
                  windowed: bool = False) -> list[tuple]:
    """(name, kernel, compile-time arguments, warps, stages, score elements per step of the inner loop) of the
    forward and both backward kernels, as a GPU launch with these sizes compiles them: what
    tools/kernel_resources.py builds ahead of time."""
    config = check_config(config)
    builds = []
    for name, kernel, (block_m, block_n, warps, stages) in (("_fwd", _fwd, config[0:4]),
                                                             ("_bwd_query", _bwd_query, config[4:8]),
                                                             ("_bwd_key", _bwd_key, config[8:12])):
        sizes = _constexprs(head_dim, value_dim, path_dim, dtype, block_m, block_n, interpreter=False, group=group,
                            windowed=windowed)
        if name == "_bwd_query":
            sizes["RATIO"] = config[9] // block_n
        if name == "_bwd_key":
            width = _path_width(path_dim, dtype != torch.float32)
            sizes.update(BLOCK_DP=width, SHARE=width // 2 if dtype != torch.float32 else width, ACCUMULATE=True)
        builds.append((name, kernel, sizes, warps, stages, block_m * block_n))
    return builds


def triton_forward(q, k, v, p, r, slopes, scale: float, config, window: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in v's dtype, lse fp32 (B, H, Tq) in log2 units). q, k, v contiguous in one dtype; p, r fp32
    contiguous; k, v, r with H / G heads (G query heads per key/value head); window 0 = full causal."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    block_m, block_n, warps, stages = config[:4]
    out = torch.empty(B, H, Tq, v.shape[3], device=q.device, dtype=v.dtype)
    lse = torch.empty(B, H, Tq, device=q.device, dtype=torch.float32)
    if out.numel():
        sizes = _constexprs(q.shape[3], v.shape[3], p.shape[3], q.dtype, block_m, block_n,
                            group=H // k.shape[1], windowed=window > 0)
        pz, rz = _path_operands(p, r, sizes["SPLIT"])
        _fwd[(triton.cdiv(Tq, block_m), B * H)](q, k, v, pz, rz, slopes, out, lse, scale * LOG2E, Tq, Tk, H, window,
                                                num_warps=warps, num_stages=stages, **sizes)
    return out, lse


def backward_pass_rows(Tq: int, block_m: int, pass_rows: int) -> int:
    """Query rows per backward pass: a multiple of block_m (the larger query tile of the two kernels), at
    most Tq rounded up to one."""
    whole = max(1, triton.cdiv(Tq, block_m)) * block_m
    return min(whole, max(block_m, pass_rows // block_m * block_m))


def _path_width(path_dim: int, split: bool) -> int:
    """Columns of the path gradients' operands: [hi | lo] halves of a power of two each (split), else one."""
    return 2 * max(8, triton.next_power_of_2(path_dim)) if split else pow2(path_dim)


def _path_parts(x: torch.Tensor, split: bool) -> torch.Tensor:
    """p or r for the path gradients' products: bf16 [hi | lo] halves (split: 16 bits, fp32's range; the kernels'
    products come back as [·hi | ·lo] halves for the host to add), else fp32; zero-padded to _path_width."""
    x = x.float()
    width = _path_width(x.shape[-1], split)
    if split:
        hi = x.bfloat16()
        x = torch.cat([torch.nn.functional.pad(part, (0, width // 2 - x.shape[-1]))
                       for part in (hi, (x - hi.float()).bfloat16())], -1)
    return torch.nn.functional.pad(x, (0, width - x.shape[-1])).contiguous()


def _halves(x: torch.Tensor, path_dim: int, split: bool) -> torch.Tensor:
    """A path gradient from the kernels' [·hi | ·lo] halves (split), else from its first path_dim columns."""
    if not split:
        return x[..., :path_dim]
    half = x.shape[-1] // 2
    return x[..., :path_dim] + x[..., half:half + path_dim]


def triton_backward(grad_out, q, k, v, p, r, slopes, out, lse, scale: float, config, window: int = 0):
    """(dq, dk, dv, dp, dr) in fp32; dk, dv, dr of the shared key/value heads sum their group's query heads."""
    config = check_config(config)
    query_tiles, key_tiles, pass_rows = config[4:8], config[8:12], config[12]
    B, H, Tq, _ = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    shape = dict(group=H // Hkv, windowed=window > 0)
    dq = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    split = q.dtype != torch.float32
    path_width = _path_width(p.shape[3], split)  # the path gradients' products: [·hi | ·lo] columns
    share = path_width // 2 if split else path_width  # dp's shares: the halves added in the kernel
    dp = torch.empty(B, H, Tq, share, device=q.device, dtype=torch.float32)
    # keys that no query sees (Tq = 0) get zero gradients; several passes add into dk, dv, dr
    rows_per_pass = backward_pass_rows(Tq, max(query_tiles[0], key_tiles[0]), pass_rows)
    n_passes = triton.cdiv(Tq, rows_per_pass)
    make = torch.empty if n_passes == 1 else torch.zeros
    dk, dv = (make(x.shape, device=q.device, dtype=torch.float32) for x in (k, v))
    dr = make(B, Hkv, Tk, path_width, device=q.device, dtype=torch.float32)
    if n_passes == 0 or B * H == 0:
        return dq, dk, dv, dp[..., :p.shape[3]], _halves(dr, p.shape[3], split)
    delta = (grad_out.float() * out.float()).sum(-1)  # D_i = dO_i·O_i
    n_ktiles = triton.cdiv(Tk, key_tiles[1])
    carry_psi = torch.empty(B * H, n_ktiles, rows_per_pass, device=q.device, dtype=torch.float32)
    carry_ds = torch.empty_like(carry_psi)
    dp_part = torch.empty(B * H, n_ktiles, rows_per_pass, share, device=q.device, dtype=torch.float32)
    ds_total = torch.empty(B, H, Tq, device=q.device, dtype=torch.float32)
    pz, rz = _path_operands(p, r, split)
    query_sizes = _constexprs(q.shape[3], v.shape[3], p.shape[3], q.dtype, *query_tiles[:2], **shape)
    query_sizes.update(RATIO=key_tiles[1] // query_tiles[1], num_warps=query_tiles[2], num_stages=query_tiles[3])
    key_sizes = _constexprs(q.shape[3], v.shape[3], p.shape[3], q.dtype, *key_tiles[:2], **shape)
    key_sizes.update(BLOCK_DP=path_width, SHARE=share, num_warps=key_tiles[2], num_stages=key_tiles[3])
    for first_row in range(0, Tq, rows_per_pass):
        end_row = min(Tq, first_row + rows_per_pass)
        _bwd_query[(triton.cdiv(end_row - first_row, query_tiles[0]), B * H)](
            q, k, v, pz, rz, slopes, grad_out, lse, delta, dq, ds_total, carry_psi, carry_ds,
            scale * LOG2E, Tq, Tk, H, window, n_ktiles, rows_per_pass, first_row, **query_sizes)
        seen = triton.cdiv(min(Tk, Tk - Tq + end_row), key_tiles[1])  # the key tiles this pass's rows see
        _bwd_key[(seen, B * Hkv)](
            q, k, v, _path_parts(p, split), _path_parts(r, split), pz, rz, slopes, grad_out, lse, delta, dk, dv, dr,
            ds_total, carry_psi, carry_ds, dp_part, scale * LOG2E, Tq, Tk, H, window, n_ktiles, rows_per_pass,
            first_row, end_row, ACCUMULATE=n_passes > 1, **key_sizes)
        _sum_path_partials[(triton.cdiv(end_row - first_row, 64), B * H)](
            dp_part, dp, Tq, Tk, window, n_ktiles, rows_per_pass, first_row, SHARE=share, BLOCK_M=64,
            KEY_TILE=key_tiles[1], WINDOWED=window > 0)
    return dq, dk, dv, dp[..., :p.shape[3]], _halves(dr, p.shape[3], split)


# Query rows per backward pass: the boundary carries take 8·B·H·PASS_ROWS·⌈Tk/BLOCK_N⌉ bytes and the dp shares
# four times that for d_p = 8 (at B·H = 8, Tk = 32768, BLOCK_N = 64: 64 + 256 MiB; one bf16 (B, H, T, 128) tensor is
# 64 MiB). Enough rows per pass that the query-major kernel's grid (PASS_ROWS / BLOCK_M · B·H programs) fills an
# H100/H200.
PASS_ROWS = 2048


def default_config(head_dim: int, dtype: torch.dtype = torch.bfloat16, *, interpreter: bool = INTERPRET,
                   triton_version: tuple[int, int] = TRITON_VERSION) -> tuple[int, ...]:
    """Forward, query-major and key-major (BLOCK_M, BLOCK_N, warps, stages), then pass rows. bf16/fp16: the
    tiles with the fewest predicted cycles per score element on sm_90 among those tried with
    tools/kernel_resources.py (docs/kernel_resources.md): the forward and query-major kernels without
    spills (except the windowed forward at D = 128: 24-32 B outside its loops); the key-major kernel's 64-key
    tiles (a warpgroup's wgmma rows for dk, dv, dr) spill at every tile tried, and the others predict 1.1-6x
    the cycles (docs/grape_ap_kernel.md, "What bounds the key-major kernel's registers"); at head dim 64 Triton
    3.5 to 3.7 compile its loop with fewer spills and predicted cycles in two pipeline stages, 3.8 and later in
    one (docs/grape_ap_kernel.md, "Triton versions and the key-major kernel's stages"). fp32 inputs run every dot
    without tensor cores, in tiles that fit an A100's shared memory. The interpreter uses tiny tiles so that the
    tests are fast (interpreter=False: the GPU's choice there too)."""
    if interpreter:
        return (16, 16, 1, 1, 16, 16, 1, 1, 16, 32, 1, 1, PASS_ROWS)
    if dtype == torch.float32:
        return (64, 32, 4, 2, 32, 32, 4, 1, 32, 32, 4, 1, PASS_ROWS)
    if head_dim <= 64:
        key_stages = 2 if (3, 5) <= triton_version < (3, 8) else 1
        return (64, 64, 4, 2, 128, 64, 8, 1, 64, 64, 4, key_stages, PASS_ROWS)
    return (64, 64, 4, 2, 128, 32, 8, 1, 128, 64, 8, 1, PASS_ROWS)
