"""Triton FlashAttention with a separable additive bias added inside the tile, in fp32 (forward and
backward, O(T) memory). The GPU path of ALiBi, GRAPE-A (q, k, qk gates) and FoX.

Every separable bias of this codebase has the form (docs/derivations.md §2)

    bias(i, j) = -(t_i - s_j)·(a_i + b_j) + (c_i - c_j)

with per-query features (t, a, c) and per-key features (s, b, c): positions t, s; rates a, b (ALiBi: a
= its slope; GRAPE-A: a = ω·λ_q, b = ω·λ_k); running sums c (FoX: Σ log f). Two constexpr switches,
HAS_RATE and HAS_SUM, leave out the term an encoding does not have. The kernel reads the six numbers
per token and builds the bias next to q·kᵀ in fp32 registers, so q, k, v keep their own width (128,
the width the fast kernels are tuned for). The homogeneous lift (attention.lift_qk) reaches the same
bias through extra q/k columns instead: exact and portable, but 136 or 144 columns wide.

Why not drop the row constant here as the lift does: with c_i - c_j the kernel adds two fp32 numbers
of the row's scale (FoX: |c| up to thousands) and keeps the bias itself, small where the attention is.

Backward, with dS = P∘(dO·vᵀ - D) the gradient of the logits:
    da_i = -Σ_j dS(i, j)·(t_i - s_j),   dc_i (query side) = Σ_j dS(i, j),
    db_j = -Σ_i dS(i, j)·(t_i - s_j),   dc_j (key side)   = -Σ_i dS(i, j).
Two kernels without atomics (deterministic): ``_bwd_query`` (query-major: dq, da, dc_query) and
``_bwd_key`` (key-major: dk, dv, db, dc_key). Queries are the last Tq of the Tk keys (training: Tq = Tk).

Grouped-query attention (GROUP query heads per key/value head): query head h reads k, v of head h // GROUP; the
key features belong to that shared head (KF_GROUP = GROUP) or to each query head (KF_GROUP = 1). The key-major
kernel runs per key/value head and adds its group's query heads in turn. A sliding window (WINDOWED, width
``window``): key tiles outside every row's window are not visited; docs/separable_kernel.md.

Tiles wholly below the diagonal skip the causal mask (the MASKED constexpr); only the diagonal tiles pay
for it (and, in the key-major kernel, a ragged last query tile, whose rows past Tq must not count). Accumulation is fp32; inputs bf16, fp16 or fp32. Under
TRITON_INTERPRET=1 the kernels run on the CPU in fp32/fp16 for the tests (the interpreter's bf16 dot is
wrong, so bf16 is checked on a GPU by scripts/gpu_check.sh).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from attention_kernels.triton_common import (INTERPRET, key_tile_range, load_tile, online_softmax, pow2, query_tile, store_tile,
                                   window_tile_range)

FEATURES = 3  # per token: position, rate, running sum


@triton.jit
def _load_features(ptr, bh, n_rows, rows, row_ok):
    """(position, rate, running sum) of each row: a contiguous (B·H, n_rows, 3) fp32 tensor."""
    base = ptr + (bh * n_rows + rows) * 3
    return (tl.load(base, mask=row_ok, other=0.0), tl.load(base + 1, mask=row_ok, other=0.0),
            tl.load(base + 2, mask=row_ok, other=0.0))


@triton.jit
def _store_feature_grads(ptr, d_rate, d_sum, bh, n_rows, rows, row_ok):
    base = ptr + (bh * n_rows + rows) * 3
    tl.store(base, tl.zeros_like(d_rate), mask=row_ok)  # positions take no gradient
    tl.store(base + 1, d_rate, mask=row_ok)
    tl.store(base + 2, d_sum, mask=row_ok)


@triton.jit
def _logits(q, k, scale, q_pos, q_rate, q_sum, k_pos, k_rate, k_sum,
            HAS_RATE: tl.constexpr, HAS_SUM: tl.constexpr, PRECISION: tl.constexpr):
    """scale·q·kᵀ + bias for one tile, and the distances t_i - s_j (the rate terms' gradient weight)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    dist = q_pos[:, None] - k_pos[None, :]
    if HAS_RATE:
        s -= dist * (q_rate[:, None] + k_rate[None, :])
    if HAS_SUM:
        s += q_sum[:, None] - k_sum[None, :]
    return s, dist


@triton.jit
def _key_tile(q, q_pos, q_rate, q_sum, K, V, KF, bkv, bkf, Tk, kb, scale, D: tl.constexpr, DV: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RATE: tl.constexpr,
              HAS_SUM: tl.constexpr, PRECISION: tl.constexpr):
    """Key tile kb for a query-major loop: its columns, k and v (of key/value head bkv), the tile's logits and
    distances (key features of head bkf)."""
    cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < Tk
    k = load_tile(K, bkv, Tk, cols, col_ok, D, BLOCK_D)
    v = load_tile(V, bkv, Tk, cols, col_ok, DV, BLOCK_DV)
    k_pos, k_rate, k_sum = _load_features(KF, bkf, Tk, cols, col_ok)
    s, dist = _logits(q, k, scale, q_pos, q_rate, q_sum, k_pos, k_rate, k_sum, HAS_RATE, HAS_SUM, PRECISION)
    return cols, col_ok, k, v, s, dist


@triton.jit
def _visible(cols, col_ok, t, window, WINDOWED: tl.constexpr):
    """Which keys of a tile each row (at key position t) sees: up to the diagonal, with a window from
    t - window + 1."""
    visible = (cols[None, :] <= t[:, None]) & col_ok[None, :]
    if WINDOWED:
        visible = visible & (cols[None, :] > t[:, None] - window)
    return visible


@triton.jit
def _fwd_tiles(acc, m_i, l_i, q, q_pos, q_rate, q_sum, t, K, V, KF, bkv, bkf, Tk, window, scale, lo, hi,
               D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_N: tl.constexpr, HAS_RATE: tl.constexpr, HAS_SUM: tl.constexpr, MASKED: tl.constexpr,
               WINDOWED: tl.constexpr, PRECISION: tl.constexpr):
    for kb in range(lo, hi):
        cols, col_ok, k, v, s, _ = _key_tile(q, q_pos, q_rate, q_sum, K, V, KF, bkv, bkf, Tk, kb, scale, D, DV,
                                             BLOCK_D, BLOCK_DV, BLOCK_N, HAS_RATE, HAS_SUM, PRECISION)
        if MASKED:
            s = tl.where(_visible(cols, col_ok, t, window, WINDOWED), s, float("-inf"))
        acc, m_i, l_i = online_softmax(acc, m_i, l_i, s, v, PRECISION, False)
    return acc, m_i, l_i


@triton.jit
def _fwd(Q, K, V, QF, KF, OUT, LSE, scale, Tq, Tk, window, D: tl.constexpr, DV: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
         HAS_RATE: tl.constexpr, HAS_SUM: tl.constexpr, PRECISION: tl.constexpr, GROUP: tl.constexpr,
         KF_GROUP: tl.constexpr, WINDOWED: tl.constexpr):
    bh, rows, row_ok, t = query_tile(Tq, Tk, BLOCK_M)
    bkv, bkf = bh // GROUP, bh // KF_GROUP  # the shared key/value head; the key features' head
    q = load_tile(Q, bh, Tq, rows, row_ok, D, BLOCK_D)
    q_pos, q_rate, q_sum = _load_features(QF, bh, Tq, rows, row_ok)
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    n_full, n_tiles = key_tile_range(tl.program_id(0) * BLOCK_M, Tq, Tk, BLOCK_M, BLOCK_N)
    lo, lo_full = 0, 0
    if WINDOWED:  # key tiles left of every row's window are not visited; [lo, lo_full) need the window's mask
        lo, lo_full = window_tile_range(tl.program_id(0) * BLOCK_M, Tq, Tk, window, n_full, BLOCK_M, BLOCK_N)
        acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, q_pos, q_rate, q_sum, t, K, V, KF, bkv, bkf, Tk, window, scale,
                                   lo, lo_full, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N, HAS_RATE, HAS_SUM, True, WINDOWED,
                                   PRECISION)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, q_pos, q_rate, q_sum, t, K, V, KF, bkv, bkf, Tk, window, scale,
                               lo_full, n_full, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N, HAS_RATE, HAS_SUM, False, WINDOWED,
                               PRECISION)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, q_pos, q_rate, q_sum, t, K, V, KF, bkv, bkf, Tk, window, scale,
                               n_full, n_tiles, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N, HAS_RATE, HAS_SUM, True, WINDOWED,
                               PRECISION)
    store_tile(OUT, (acc / l_i[:, None]).to(OUT.dtype.element_ty), bh, Tq, rows, row_ok, DV, BLOCK_DV)
    tl.store(LSE + bh * Tq + rows, m_i + tl.log(l_i), mask=row_ok)


@triton.jit
def _bwd_query_tiles(dq, d_rate, d_sum, q, do, lse, delta, q_pos, q_rate, q_sum, t, K, V, KF, bkv, bkf, Tk, window,
                     scale, lo, hi, D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     BLOCK_N: tl.constexpr, HAS_RATE: tl.constexpr, HAS_SUM: tl.constexpr, MASKED: tl.constexpr,
                     WINDOWED: tl.constexpr, PRECISION: tl.constexpr):
    for kb in range(lo, hi):
        cols, col_ok, k, v, s, dist = _key_tile(q, q_pos, q_rate, q_sum, K, V, KF, bkv, bkf, Tk, kb, scale, D, DV,
                                                BLOCK_D, BLOCK_DV, BLOCK_N, HAS_RATE, HAS_SUM, PRECISION)
        probs = tl.exp(s - lse[:, None])
        if MASKED:
            probs = tl.where(_visible(cols, col_ok, t, window, WINDOWED), probs, 0.0)
        ds = probs * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        if HAS_RATE:
            d_rate -= tl.sum(ds * dist, axis=1)
        if HAS_SUM:
            d_sum += tl.sum(ds, axis=1)
    return dq, d_rate, d_sum


@triton.jit
def _bwd_query(Q, K, V, QF, KF, DO, LSE, DELTA, DQ, DQF, scale, Tq, Tk, window, D: tl.constexpr, DV: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               HAS_RATE: tl.constexpr, HAS_SUM: tl.constexpr, PRECISION: tl.constexpr, GROUP: tl.constexpr,
               KF_GROUP: tl.constexpr, WINDOWED: tl.constexpr):
    bh, rows, row_ok, t = query_tile(Tq, Tk, BLOCK_M)
    bkv, bkf = bh // GROUP, bh // KF_GROUP
    q = load_tile(Q, bh, Tq, rows, row_ok, D, BLOCK_D)
    do = load_tile(DO, bh, Tq, rows, row_ok, DV, BLOCK_DV)
    lse = tl.load(LSE + bh * Tq + rows, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * Tq + rows, mask=row_ok, other=0.0)
    q_pos, q_rate, q_sum = _load_features(QF, bh, Tq, rows, row_ok)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    d_rate = tl.zeros([BLOCK_M], tl.float32)
    d_sum = tl.zeros([BLOCK_M], tl.float32)
    n_full, n_tiles = key_tile_range(tl.program_id(0) * BLOCK_M, Tq, Tk, BLOCK_M, BLOCK_N)
    lo, lo_full = 0, 0
    if WINDOWED:
        lo, lo_full = window_tile_range(tl.program_id(0) * BLOCK_M, Tq, Tk, window, n_full, BLOCK_M, BLOCK_N)
        dq, d_rate, d_sum = _bwd_query_tiles(dq, d_rate, d_sum, q, do, lse, delta, q_pos, q_rate, q_sum, t, K, V, KF,
                                             bkv, bkf, Tk, window, scale, lo, lo_full, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N,
                                             HAS_RATE, HAS_SUM, True, WINDOWED, PRECISION)
    dq, d_rate, d_sum = _bwd_query_tiles(dq, d_rate, d_sum, q, do, lse, delta, q_pos, q_rate, q_sum, t, K, V, KF,
                                         bkv, bkf, Tk, window, scale, lo_full, n_full, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N,
                                         HAS_RATE, HAS_SUM, False, WINDOWED, PRECISION)
    dq, d_rate, d_sum = _bwd_query_tiles(dq, d_rate, d_sum, q, do, lse, delta, q_pos, q_rate, q_sum, t, K, V, KF,
                                         bkv, bkf, Tk, window, scale, n_full, n_tiles, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N,
                                         HAS_RATE, HAS_SUM, True, WINDOWED, PRECISION)
    store_tile(DQ, dq * scale, bh, Tq, rows, row_ok, D, BLOCK_D)
    _store_feature_grads(DQF, d_rate, d_sum, bh, Tq, rows, row_ok)


@triton.jit
def _bwd_key_tiles(dk, dv_acc, d_rate, d_sum, k, v, k_pos, k_rate, k_sum, cols, col_ok, Q, DO, QF, LSE, DELTA,
                   bh, Tq, offset, window, scale, lo, hi, D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, HAS_RATE: tl.constexpr,
                   HAS_SUM: tl.constexpr, MASKED: tl.constexpr, WINDOWED: tl.constexpr, PRECISION: tl.constexpr):
    for mb in range(lo, hi):
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < Tq
        q = load_tile(Q, bh, Tq, rows, row_ok, D, BLOCK_D)
        do = load_tile(DO, bh, Tq, rows, row_ok, DV, BLOCK_DV)
        lse = tl.load(LSE + bh * Tq + rows, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * Tq + rows, mask=row_ok, other=0.0)
        q_pos, q_rate, q_sum = _load_features(QF, bh, Tq, rows, row_ok)
        s, dist = _logits(q, k, scale, q_pos, q_rate, q_sum, k_pos, k_rate, k_sum, HAS_RATE, HAS_SUM, PRECISION)
        probs = tl.exp(s - lse[:, None])
        if MASKED:
            visible = _visible(cols, col_ok, rows + offset, window, WINDOWED) & row_ok[:, None]
            probs = tl.where(visible, probs, 0.0)
        ds = probs * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dv_acc += tl.dot(tl.trans(probs.to(do.dtype)), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        if HAS_RATE:
            d_rate -= tl.sum(ds * dist, axis=0)
        if HAS_SUM:
            d_sum -= tl.sum(ds, axis=0)
    return dk, dv_acc, d_rate, d_sum


@triton.jit
def _bwd_key(Q, K, V, QF, KF, DO, LSE, DELTA, DK, DV_OUT, DKF, scale, Tq, Tk, window, D: tl.constexpr,
             DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_DV: tl.constexpr, HAS_RATE: tl.constexpr, HAS_SUM: tl.constexpr, PRECISION: tl.constexpr,
             GROUP: tl.constexpr, KF_GROUP: tl.constexpr, WINDOWED: tl.constexpr):
    kb = tl.program_id(0)
    bkv = tl.program_id(1)  # one key/value head: its GROUP query heads add their shares in turn (deterministic)
    offset = Tk - Tq
    cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < Tk
    k = load_tile(K, bkv, Tk, cols, col_ok, D, BLOCK_D)
    v = load_tile(V, bkv, Tk, cols, col_ok, DV, BLOCK_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    # query tiles: [first, full) straddle the diagonal, [full, complete) see the whole key tile, and
    # [complete, last) is the ragged end of the queries (rows past Tq must be masked out) and, with a window,
    # the rows whose window starts inside this key tile; rows whose window ends before it are not visited
    first = tl.maximum(kb * BLOCK_N - offset, 0) // BLOCK_M
    last = tl.cdiv(Tq, BLOCK_M)
    if WINDOWED:
        last = tl.maximum(tl.minimum(last, tl.cdiv(tl.maximum(kb * BLOCK_N + BLOCK_N - 1 + window - offset, 0),
                                                   BLOCK_M)), first)
    full = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(kb * BLOCK_N + BLOCK_N - 1 - offset, 0), BLOCK_M), first), last)
    complete = tl.maximum(Tq // BLOCK_M, full)
    if WINDOWED:
        complete = tl.maximum(tl.minimum(complete, tl.maximum(kb * BLOCK_N + window - offset, 0) // BLOCK_M), full)
    # key features of the shared head (KF_GROUP = GROUP: their gradients sum the group) or of each query head
    if KF_GROUP == GROUP:
        k_pos, k_rate, k_sum = _load_features(KF, bkv, Tk, cols, col_ok)
        d_rate = tl.zeros([BLOCK_N], tl.float32)
        d_sum = tl.zeros([BLOCK_N], tl.float32)
    for member in range(GROUP):
        bh = bkv * GROUP + member
        if KF_GROUP != GROUP:
            k_pos, k_rate, k_sum = _load_features(KF, bh, Tk, cols, col_ok)
            d_rate = tl.zeros([BLOCK_N], tl.float32)
            d_sum = tl.zeros([BLOCK_N], tl.float32)
        dk, dv_acc, d_rate, d_sum = _bwd_key_tiles(dk, dv_acc, d_rate, d_sum, k, v, k_pos, k_rate, k_sum, cols, col_ok,
                                                   Q, DO, QF, LSE, DELTA, bh, Tq, offset, window, scale, first, full, D,
                                                   DV, BLOCK_D, BLOCK_DV, BLOCK_M, HAS_RATE, HAS_SUM, True, WINDOWED,
                                                   PRECISION)
        dk, dv_acc, d_rate, d_sum = _bwd_key_tiles(dk, dv_acc, d_rate, d_sum, k, v, k_pos, k_rate, k_sum, cols, col_ok,
                                                   Q, DO, QF, LSE, DELTA, bh, Tq, offset, window, scale, full, complete,
                                                   D, DV, BLOCK_D, BLOCK_DV, BLOCK_M, HAS_RATE, HAS_SUM, False, WINDOWED,
                                                   PRECISION)
        dk, dv_acc, d_rate, d_sum = _bwd_key_tiles(dk, dv_acc, d_rate, d_sum, k, v, k_pos, k_rate, k_sum, cols, col_ok,
                                                   Q, DO, QF, LSE, DELTA, bh, Tq, offset, window, scale, complete, last,
                                                   D, DV, BLOCK_D, BLOCK_DV, BLOCK_M, HAS_RATE, HAS_SUM, True, WINDOWED,
                                                   PRECISION)
        if KF_GROUP != GROUP:
            _store_feature_grads(DKF, d_rate, d_sum, bh, Tk, cols, col_ok)
    store_tile(DK, dk * scale, bkv, Tk, cols, col_ok, D, BLOCK_D)
    store_tile(DV_OUT, dv_acc, bkv, Tk, cols, col_ok, DV, BLOCK_DV)
    if KF_GROUP == GROUP:
        _store_feature_grads(DKF, d_rate, d_sum, bkv, Tk, cols, col_ok)


# --------------------------------------------------------------------------------------------------
# Launchers. config = (fwd BLOCK_M, fwd BLOCK_N, fwd warps, fwd stages, bwd short tile, bwd long tile,
# bwd warps, bwd stages): the backward kernels iterate over the short side and keep the long one
# resident (the query-major kernel holds BLOCK_M = long query rows, the key-major one BLOCK_N = long keys).


def _precision(dtype: torch.dtype) -> str:
    """fp32 inputs get true fp32 dots (Triton's fp32 default is TF32); bf16/fp16 ignore the setting.
    The interpreter only knows "ieee"."""
    return "ieee" if (INTERPRET or dtype == torch.float32) else "tf32"


def _common(q, k, v, kf, flags, window: int) -> dict:
    """Compile-time arguments: sizes, bias terms, GROUP = query heads per key/value head, KF_GROUP = query heads per
    key-feature head (GROUP where the key features belong to the shared head, 1 where to each query head)."""
    has_rate, has_sum = flags
    return dict(D=q.shape[3], DV=v.shape[3], BLOCK_D=pow2(q.shape[3]), BLOCK_DV=pow2(v.shape[3]), HAS_RATE=bool(has_rate),
                HAS_SUM=bool(has_sum), PRECISION=_precision(q.dtype), GROUP=q.shape[1] // k.shape[1],
                KF_GROUP=q.shape[1] // kf.shape[1], WINDOWED=window > 0)


def triton_forward(q, k, v, qf, kf, scale: float, flags, config, window: int = 0):
    """(out in v's dtype, lse fp32 (B, H, Tq)). q, k, v in one dtype; qf (B, H, Tq, 3) and kf (B, H or H_kv, Tk, 3)
    fp32; all contiguous (the custom op makes sure: a compiler may hand it other strides). k, v (B, H_kv, Tk, ·);
    window 0 = full causal."""
    B, H, Tq, D = q.shape
    Tk, DV = k.shape[2], v.shape[3]
    block_m, block_n, warps, stages = config[:4]
    out = torch.empty(B, H, Tq, DV, device=q.device, dtype=v.dtype)
    lse = torch.empty(B, H, Tq, device=q.device, dtype=torch.float32)
    _fwd[(triton.cdiv(Tq, block_m), B * H)](q, k, v, qf, kf, out, lse, scale, Tq, Tk, window, BLOCK_M=block_m,
                                            BLOCK_N=block_n, num_warps=warps, num_stages=stages,
                                            **_common(q, k, v, kf, flags, window))
    return out, lse


def triton_backward(grad_out, q, k, v, qf, kf, out, lse, scale: float, flags, config, window: int = 0):
    """(dq, dk, dv, dqf, dkf), each in its input's dtype (the kernels accumulate in fp32 and round once
    when they store); dk, dv (and dkf of shared key features) sum their group's query heads."""
    B, H, Tq, D = q.shape
    Tk, DV = k.shape[2], v.shape[3]
    short, long, warps, stages = config[4:8]
    delta = (grad_out.float() * out.float()).sum(-1)  # D_i = dO_i·O_i
    dq, dk, dv, dqf, dkf = (torch.empty_like(x) for x in (q, k, v, qf, kf))
    common = dict(num_warps=warps, num_stages=stages, **_common(q, k, v, kf, flags, window))
    _bwd_query[(triton.cdiv(Tq, long), B * H)](q, k, v, qf, kf, grad_out, lse, delta, dq, dqf, scale, Tq, Tk, window,
                                               BLOCK_M=long, BLOCK_N=short, **common)
    _bwd_key[(triton.cdiv(Tk, long), B * k.shape[1])](q, k, v, qf, kf, grad_out, lse, delta, dk, dv, dkf, scale, Tq,
                                                      Tk, window, BLOCK_M=short, BLOCK_N=long, **common)
    return dq, dk, dv, dqf, dkf


def default_config(head_dim: int, dtype: torch.dtype = torch.bfloat16) -> tuple[int, ...]:
    """Tile sizes (scripts/gpu_check.sh sweeps alternatives on the GPU). bf16/fp16 on sm_90, by the static cost
    of tools/kernel_resources.py (docs/kernel_resources.md, compiled ahead of time with Triton's ptxas):
    the backward kernels with 4 warps predict 2.3-2.5x fewer cycles per score element than with 8, where they
    were bound by shared memory (the mma.sync operands each warp reloads with ldmatrix); no spills except
    24 B per thread in the key-major kernel at D = 128. fp32 inputs (attn_backend="tile" forced; "auto" lifts
    fp32) get smaller tiles that fit an A100's shared memory; their dots run without tensor cores and spill
    whatever the tiles. The interpreter uses tiny tiles so the tests are fast."""
    if INTERPRET:
        return (16, 16, 1, 1, 16, 32, 1, 1)
    if dtype == torch.float32:
        return (64, 32, 4, 2, 16, 32, 4, 2)
    return (128, 64, 8, 3, 32, 64, 4, 3)
