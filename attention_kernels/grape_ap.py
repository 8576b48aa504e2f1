"""GRAPE-AP path-integral attention without materialising the (Tq, Tk) bias for the whole sequence.

    logit(i, j) = scale·q_i·k_j + Σ_{ℓ=j+1}^{t_i} α_h·logsigmoid(p_i·r_ℓ),   j <= t_i = Tk - Tq + i

(queries are the last Tq of the Tk key positions). The bias is not separable, but softmax ignores a
constant per row, and bias(i, j) = S_i - F(i, j) with F(i, j) = Σ_{ℓ<=j} ψ(i, ℓ) a *left prefix sum*
and S_i = F(i, t_i) constant per row (docs/derivations.md §4, docs/grape_ap_kernel.md). Hence:

* ``chunked`` (portable, any device): loop over blocks of queries; per block build ψ for the block's
  keys, -F by ``cumsum``, and the block's softmax. A hand-written backward recomputes each block in
  the backward pass, so training memory is O(T·block), not O(T²) (autograd through the loop would keep
  every block's intermediates; ``torch.utils.checkpoint`` per block measured 1.9x slower than this
  hand-written backward on the CPU at T = 2048, 1.2-1.9x at T = 512..4096: docs/benchmarks.md, ablation).
* ``triton`` (CUDA): FlashAttention-class kernels, see ``attention_kernels/grape_ap_triton.py``; this module holds
  their autograd wrapper (``grape_ap_triton``), the kernel module imports nothing from here.
* ``decode``: one new query against the cache, one O(Tk) row (``decode_attention``).

Every path takes k, v, r with fewer heads than q (grouped-query attention: r belongs to the shared key head,
p and the slope to the query head) and an optional sliding ``window`` (docs/grape_ap_kernel.md).

``grape_ap_attention(backend="auto")`` picks by ``auto_backend``. The chunked and Triton paths run behind
one PyTorch custom operator pair, ``grape::path_attention`` and its backward, each
with a shape-only "fake" implementation, so ``torch.compile`` traces a model straight through the
attention (no graph break) and calls the kernel as one opaque node.

The path gradient is the left prefix dψ(i, ℓ) = Σ_{j<ℓ} dS(i, j) of the logits' gradient dS: the bias
(i, j) contains ψ(i, ℓ) exactly when j < ℓ <= t_i. (The suffix -Σ_{j>=ℓ} dS(i, j) is equal only while
the row sums Σ_j dS(i, j) are exactly zero, which rounding breaks; its error then grows with T.)
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from attention_kernels import triton_probe
from attention_kernels.triton_probe import (DTYPE_NAMES, PROBE_HEADS, PROBE_KV_HEADS, probe_generator, probe_randn,
                                   compare_with_portable, probe_tokens, triton_builds)

BACKENDS = ("auto", "chunked", "triton", "decode")

def check_inputs(q, k, v, p, r, slopes, window: int | None = None) -> None:
    """One clear sentence per shape mistake instead of a broadcast error deep in a matmul."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or p.dim() != 4 or r.dim() != 4:
        raise ValueError("grape_ap_attention expects 4-D (batch, heads, time, dim) tensors for q, k, v, p and r; "
                         f"got q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)}, p{tuple(p.shape)}, r{tuple(r.shape)}")
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    problems = []
    if Hkv < 1 or H % Hkv:
        problems.append(f"k{tuple(k.shape)} has {Hkv} heads, which must divide q's {H} (grouped-query attention: "
                        "each key/value head serves H / H_kv query heads)")
    elif k.shape != (B, Hkv, Tk, D):
        problems.append(f"k{tuple(k.shape)} must be (B, H_kv, Tk, {D}) with the B of q{tuple(q.shape)}")
    if v.shape[:3] != (B, Hkv, Tk):
        problems.append(f"v{tuple(v.shape)} must be (B, H_kv, Tk, Dv) with the B, H_kv, Tk of k{tuple(k.shape)}")
    if p.shape[:3] != (B, H, Tq):
        problems.append(f"p{tuple(p.shape)} must be (B, H, Tq, dp) with the B, H, Tq of q{tuple(q.shape)}")
    if r.shape[:3] != (B, Hkv, Tk) or r.shape[3] != p.shape[3]:
        problems.append(f"r{tuple(r.shape)} must be (B, H_kv, Tk, dp) like k's batch, heads and time axis with p's dp "
                        "(the key path vectors belong to the shared key head)")
    if Tq > Tk:
        problems.append(f"queries are the last Tq of the Tk keys, so Tq ({Tq}) must be <= Tk ({Tk})")
    if slopes.shape != (H,):
        problems.append(f"slopes{tuple(slopes.shape)} must hold one slope per head ({H}, one per query head)")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        problems.append(f"window ({window!r}) must be a positive number of keys (a query at t sees keys "
                        "t - window + 1 ... t) or None for full causal attention")
    if problems:
        raise ValueError("grape_ap_attention: " + "; ".join(problems) + ".")


def _window_code(window: int | None) -> int:
    """The custom ops' int for a window: 0 = full causal attention."""
    return 0 if window is None else int(window)


def grape_ap_attention(q, k, v, p, r, slopes, scale: float, *, backend: str = "auto", block_size: int | None = None,
                       window: int | None = None):
    """GRAPE-AP attention. q (B,H,Tq,D), k (B,H_kv,Tk,D), v (B,H_kv,Tk,Dv); p (B,H,Tq,dp) the query path
    vectors already divided by d_p; r (B,H_kv,Tk,dp) the rotated, RMS-normalised key path vectors;
    slopes (H,) the positive α_h (constants, no gradient); returns (B,H,Tq,Dv) in v's dtype.
    Gradients flow to q, k, v, p and r.

    Grouped-query attention: H_kv divides H, and query head h reads key/value head h // (H / H_kv), whose
    r it shares (the path sum runs over keys; docs/grape_ap_kernel.md, "Grouped-query attention"); p and the
    slope stay per query head. window: a query at absolute position t sees keys t - window + 1 ... t (None:
    all keys up to t); the path sum of a visible key lies inside the window, so nothing outside it is read.

    "auto": see ``auto_backend``."""
    check_inputs(q, k, v, p, r, slopes, window)
    if backend not in BACKENDS:
        raise ValueError(f"unknown grape_ap backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = auto_backend(q.device, q.dtype, q.shape[2], q.shape[3], v.shape[3])
    if backend == "decode":
        return decode_attention(q, k, v, p, r, slopes, scale, window=window)
    if backend == "triton":
        return grape_ap_triton(q, k, v, p, r, slopes, scale, window=window)
    return grape_ap_chunked(q, k, v, p, r, slopes, scale, block_size=block_size, window=window)


def auto_backend(device: torch.device, dtype: torch.dtype, n_queries: int, head_dim: int,
                 value_dim: int | None = None) -> str:
    """One decoding query: "decode" (O(Tk), any device). CUDA: the Triton kernels where this Triton builds
    them for this dtype and head dim and they fit the GPU (else one warning line and the chunked path).
    Elsewhere "chunked"."""
    if n_queries == 1:
        return "decode"
    if device.type == "cuda" and dtype in DTYPE_NAMES and triton_builds("grape_ap", DTYPE_NAMES[dtype], head_dim,
                                                                        value_dim):
        return "triton"
    return "chunked"


def grape_ap_triton(q, k, v, p, r, slopes, scale: float, *, config=None, window: int | None = None):
    """The Triton path (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1), through the same
    autograd-aware custom op as the chunked path. Returns v's dtype; dp, dr come back in p's and r's
    dtypes. config: see ``attention_kernels.grape_ap_triton.default_config``; window and k, v, r with fewer heads
    than q: see ``grape_ap_attention``."""
    from attention_kernels.grape_ap_triton import check_config, default_config
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"grape_ap (triton): q, k, v must share one dtype (got {q.dtype}, {k.dtype}, {v.dtype})")
    # made contiguous (and p, r fp32) out here, so that autograd saves these copies for the backward
    # instead of the op copying the model's strided q, k, v views once in each pass
    q, k, v = (x.contiguous() for x in (q, k, v))
    p, r = (x.float().contiguous() for x in (p, r))
    config = check_config(config or default_config(q.shape[3], q.dtype))
    return path_attention(q, k, v, p, r, slopes, scale, "triton", list(config), window)


# --------------------------------------------------------------------------------------------------
# The custom operator: one forward and one backward op for both implementations. ``config`` is the
# chunked path's [block] or the Triton path's [BLOCK_M, BLOCK_N, num_warps, num_stages, pass_rows].
# The forward's second output is the row log-sum-exp (fp32) for the Triton backward, empty for the
# chunked one.


def _lse_shape(q: torch.Tensor, impl: str) -> tuple[int, ...]:
    return tuple(q.shape[:3]) if impl == "triton" else (0,)


@torch.library.custom_op("grape::path_attention", mutates_args=())
def _path_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: torch.Tensor, r: torch.Tensor,
                       slopes: torch.Tensor, scale: float, impl: str, config: list[int], window: int = 0
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    if impl == "triton":
        from attention_kernels.grape_ap_triton import triton_forward
        q, k, v, p, r, slopes = _triton_operands(q, k, v, p, r, slopes)
        return triton_forward(q, k, v, p, r, slopes, scale, config, window)
    return chunked_forward(q, k, v, p, r, slopes, scale, config[0], window)


@_path_attention_op.register_fake
def _(q, k, v, p, r, slopes, scale, impl, config, window=0):
    B, H, Tq, _ = q.shape
    return q.new_empty((B, H, Tq, v.shape[3]), dtype=v.dtype), q.new_empty(_lse_shape(q, impl), dtype=torch.float32)


@torch.library.custom_op("grape::path_attention_backward", mutates_args=())
def _path_attention_backward_op(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                p: torch.Tensor, r: torch.Tensor, slopes: torch.Tensor, out: torch.Tensor,
                                lse: torch.Tensor, scale: float, impl: str, config: list[int], window: int = 0
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if impl == "triton":
        from attention_kernels.grape_ap_triton import triton_backward
        operands = _triton_operands(q, k, v, p, r, slopes)
        grads = triton_backward(grad_out.contiguous(), *operands, out, lse, scale, config, window)
    else:
        grads = chunked_backward(grad_out, q, k, v, p, r, slopes, out, scale, config[0], window)
    return tuple(g.to(x.dtype) for g, x in zip(grads, (q, k, v, p, r)))


@_path_attention_backward_op.register_fake
def _(grad_out, q, k, v, p, r, slopes, out, lse, scale, impl, config, window=0):
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v, p, r))


def _setup_context(ctx, inputs, output):
    q, k, v, p, r, slopes, scale, impl, config, *window = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, p, r, slopes, out, lse)
    ctx.scale, ctx.impl, ctx.config, ctx.window = scale, impl, config, (window or [0])[0]
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, p, r, slopes, out, lse = ctx.saved_tensors
    grads = _path_attention_backward_op(grad_out, q, k, v, p, r, slopes, out, lse, ctx.scale, ctx.impl, ctx.config,
                                        ctx.window)
    return (*grads, None, None, None, None, None)


_path_attention_op.register_autograd(_backward, setup_context=_setup_context)


def _triton_operands(q, k, v, p, r, slopes):
    """What the Triton kernels read: contiguous q, k, v in one dtype; fp32 path vectors and slopes."""
    return (*(x.contiguous() for x in (q, k, v)), *(x.float().contiguous() for x in (p, r)),
            slopes.to(device=q.device, dtype=torch.float32).contiguous())


def path_attention(q, k, v, p, r, slopes, scale: float, impl: str, config: list[int],
                   window: int | None = None) -> torch.Tensor:
    """The attention output of the custom op (its second output, the row log-sum-exp, is kept for the
    backward pass)."""
    return _path_attention_op(q, k, v, p, r, slopes.detach(), float(scale), impl, [int(c) for c in config],
                              _window_code(window))[0]


# --------------------------------------------------------------------------------------------------
# Portable chunked implementation


def default_block_size(batch_heads: int, key_len: int) -> int:
    """Query rows per block: large enough to amortise Python overhead, small enough that a block's
    (B·H, rows, Tk) fp32 intermediates (~4 MiB) stay near the CPU caches. Measured on the CPU at
    B·H = 8, Tk = 2048: 64-128 rows are ~20% faster than 256 and several times faster than dense."""
    rows = (4 << 20) // max(1, 4 * batch_heads * key_len)
    return int(min(256, max(16, 1 << max(0, rows.bit_length() - 1))))


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    # fp32 for the path sums (fp64 stays fp64 so the exactness tests can run in double precision).
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _block_logits(q_blk, k_pre, p_blk, r_pre, neg_slopes, scale, mask):
    """Logits (BH_kv, G·n, K) of one block of n query rows of each of the G query heads of a group (rows ordered
    head-major) against the keys they see, up to a constant per row: scale·q·k - α·Σ_{ℓ<=j} logsigmoid(p·r_ℓ),
    with the keys a row may not see at -inf. Also returns the path-logit matrix z = p·r (for the backward)."""
    z = torch.bmm(p_blk, r_pre.transpose(1, 2))
    logits = F.logsigmoid(z)
    logits.cumsum_(-1)  # F(i, j) / α, in place: the block's largest buffer is reused throughout
    X, G = neg_slopes.shape[:2]
    grouped = logits.view(X, G, logits.shape[1] // G, logits.shape[-1])
    grouped.mul_(neg_slopes)
    logits.baddbmm_(q_blk, k_pre.transpose(1, 2), alpha=scale)
    _mask_block(grouped, mask, float("-inf"))
    return logits, z


def _mask_block(grouped, mask, value):
    """Fill the (n, K) block mask of hidden keys, shared by the G heads: a (diagonal, window) pair whose diagonal
    part covers the last n keys (no window: the other is None) or, with a window, one mask over all K keys."""
    diagonal, windowed = mask
    if windowed is not None:
        grouped.masked_fill_(windowed, value)
    else:
        n = grouped.shape[2]
        grouped[..., -n:].masked_fill_(diagonal[:n, :n], value)


def _block_keys(start: int, end: int, offset: int, window: int, diag_mask, device):
    """The keys [key_start, key_end) that query rows start .. end-1 see (row i is key position offset + i), and
    the block's mask (see _mask_block). Without a window (0) every key up to the diagonal; with one, from the
    first row's window start, and the mask also hides keys before each row's own window start."""
    key_end = offset + end
    if not window:
        return 0, key_end, (diag_mask, None)
    key_start = max(0, offset + start - window + 1)
    t = torch.arange(offset + start, key_end, device=device)[:, None]
    keys = torch.arange(key_start, key_end, device=device)[None, :]
    return key_start, key_end, (None, (keys > t) | (keys <= t - window))


def _no_autocast(fn):
    """Run with autocast off: the chunked path chooses its own precision (fp32), and autocast would
    otherwise turn the in-place baddbmm_ on fp32 buffers into a dtype clash."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        device_type = next(a.device.type for a in args if isinstance(a, torch.Tensor))
        with torch.autocast(device_type=device_type, enabled=False):
            return fn(*args, **kwargs)
    return wrapper


@_no_autocast
def chunked_forward(q, k, v, p, r, slopes, scale: float, block: int, window: int = 0):
    """(out in v's dtype, an empty tensor): the backward recomputes each block's softmax whole, so it
    needs no row log-sum-exp (one costs a second exp pass: the kernel measured 2.9x causal SDPA with it,
    2.2x without, CPU fp32 fwd+bwd at T = 2048). The G query heads of a group run as one block of G·n rows
    against their shared keys, which are never copied per head."""
    B, H, Tq, _ = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = H // Hkv
    dtype = _compute_dtype(q)
    qg, pg = (_grouped(x, Hkv, dtype) for x in (q, p))
    k3, v3, r3 = (_rows(x, dtype) for x in (k, v, r))
    neg_slopes = _neg_slopes(slopes, B, Hkv, q.device, dtype)
    diag_mask = torch.ones(block, block, dtype=torch.bool, device=q.device).triu_(1)
    out = torch.empty(B * Hkv, G, Tq, v.shape[3], dtype=dtype, device=q.device)
    offset = Tk - Tq
    for start in range(0, Tq, block):
        end = min(start + block, Tq)
        key_start, key_end, mask = _block_keys(start, end, offset, window, diag_mask, q.device)
        logits, _ = _block_logits(_block_rows(qg, start, end), k3[:, key_start:key_end], _block_rows(pg, start, end),
                                  r3[:, key_start:key_end], neg_slopes, scale, mask)
        rows = torch.bmm(torch.softmax(logits, dim=-1), v3[:, key_start:key_end])
        out[:, :, start:end] = rows.view(B * Hkv, G, end - start, v.shape[3])
    return out.view(B, H, Tq, v.shape[3]).to(v.dtype), q.new_empty(0, dtype=torch.float32)


@_no_autocast
def chunked_backward(grad_out, q, k, v, p, r, slopes, out, scale: float, block: int, window: int = 0):
    """(dq, dk, dv, dp, dr) in the compute dtype, recomputing each query block's logits. dk, dv, dr sum the
    group's query heads in one product per block (deterministic)."""
    B, H, Tq, _ = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G, X = H // Hkv, B * Hkv
    dtype = _compute_dtype(q)
    qg, pg, dog, outg = (_grouped(x, Hkv, dtype) for x in (q, p, grad_out, out))
    k3, v3, r3 = (_rows(x, dtype) for x in (k, v, r))
    neg_slopes = _neg_slopes(slopes, B, Hkv, q.device, dtype)
    offset = Tk - Tq
    row_dot = (dog * outg).sum(-1, keepdim=True)  # D_i = dO_i·O_i = Σ_j P_ij dP_ij
    # contiguous like the op's fake outputs: *_like would copy the strides of a (B = 1) view of a
    # transposed (B, T, H, D) tensor, and inductor checks the real strides against the fake ones
    dq, dp = (torch.empty(x.shape, dtype=dtype, device=q.device) for x in (qg, pg))
    dk, dv, dr = (torch.zeros(x.shape, dtype=dtype, device=q.device) for x in (k3, v3, r3))
    diag_mask = torch.ones(block, block, dtype=torch.bool, device=q.device).triu_(1)
    for start in range(0, Tq, block):
        end = min(start + block, Tq)
        key_start, key_end, mask = _block_keys(start, end, offset, window, diag_mask, q.device)
        n = end - start
        q_blk, p_blk, do_blk = (_block_rows(x, start, end) for x in (qg, pg, dog))
        keys = slice(key_start, key_end)
        k_pre, v_pre, r_pre = k3[:, keys], v3[:, keys], r3[:, keys]
        logits, z = _block_logits(q_blk, k_pre, p_blk, r_pre, neg_slopes, scale, mask)
        probs = torch.softmax(logits, dim=-1)
        del logits
        dv[:, keys].baddbmm_(probs.transpose(1, 2), do_blk)
        # dS = P ∘ (dO·vᵀ - D): the gradient of the logits, computed in place
        d_logits = torch.bmm(do_blk, v_pre.transpose(1, 2))
        d_logits.view(X, G, n, d_logits.shape[-1]).sub_(row_dot[:, :, start:end])
        d_logits.mul_(probs)
        del probs
        dq[:, :, start:end] = torch.bmm(d_logits, k_pre).mul_(scale).view(X, G, n, k_pre.shape[-1])
        dk[:, keys].baddbmm_(d_logits.transpose(1, 2), q_blk, alpha=scale)
        # dψ(i, ℓ) = Σ_{j<ℓ} dS(i, j), the exclusive prefix (zero at ℓ = 0, which no bias contains, and, with a
        # window, exactly zero up to each row's window start, where every dS(i, j) is zero); past the diagonal
        # no ψ(i, ℓ) is used
        d_path = torch.cumsum(d_logits, dim=-1).sub_(d_logits)
        del d_logits
        _mask_block(d_path.view(X, G, n, d_path.shape[-1]), mask, 0.0)
        d_path.mul_(z.neg_().sigmoid_())  # d logsigmoid(z)/dz = sigmoid(-z); α is applied below
        dp[:, :, start:end] = torch.bmm(d_path, r_pre).view(X, G, n, r_pre.shape[-1]).mul_(neg_slopes).neg_()
        weighted_p = (p_blk.view(X, G, n, p_blk.shape[-1]) * neg_slopes).view(p_blk.shape)
        dr[:, keys].baddbmm_(d_path.transpose(1, 2), weighted_p, alpha=-1)
    return tuple(g.view(x.shape) for g, x in zip((dq, dk, dv, dp, dr), (q, k, v, p, r)))


def _rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, H, T, d) -> (B·H, T, d) in the compute dtype."""
    return x.reshape(x.shape[0] * x.shape[1], x.shape[2], x.shape[3]).to(dtype)


def _grouped(x: torch.Tensor, n_kv_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """A query-side (B, H, T, d) -> (B·H_kv, G, T, d) in the compute dtype: query head h = kv head h // G, member
    h % G of its group."""
    B, H, T, d = x.shape
    return x.reshape(B * n_kv_heads, H // n_kv_heads, T, d).to(dtype)


def _block_rows(x: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows start .. end-1 of each head of a group, (B·H_kv, G·n, d): one matrix per kv head (a copy when G > 1)."""
    return x[:, :, start:end].reshape(x.shape[0], x.shape[1] * (end - start), x.shape[3])


def _neg_slopes(slopes, B, n_kv_heads, device, dtype):
    """-α per (batch·kv head, member of the group): (B·H_kv, G, 1, 1)."""
    return -slopes.to(device=device, dtype=dtype).repeat(B).view(B * n_kv_heads, len(slopes) // n_kv_heads, 1, 1)


def grape_ap_chunked(q, k, v, p, r, slopes, scale: float, *, block_size: int | None = None,
                     window: int | None = None):
    """The portable path: exact (fp32, or fp64 for fp64 inputs) with O(Tk·block) working memory in the
    forward and backward passes (O(window·block) with a window). k, v, r may have fewer heads than q
    (grouped-query attention, see ``grape_ap_attention``)."""
    B, H = q.shape[:2]
    keys = k.shape[2] if window is None else min(k.shape[2], window + 64)
    block = block_size or default_block_size(B * H, keys)
    return path_attention(q, k, v, p, r, slopes, scale, "chunked", [block], window)


@_no_autocast
def decode_attention(q, k, v, p, r, slopes, scale: float, window: int | None = None):
    """One query, the newest of the Tk positions (KV-cache decoding), in O(Tk) on any device: ψ for every
    cached key, the bias b(j) = Σ_{ℓ>j} ψ(ℓ) as a reversed cumulative sum shifted by one key (the suffix
    itself, no row-constant subtraction: fp32 accurate relative to |b|), one softmax row. On CUDA this
    spreads the row over the whole GPU, where the tiled kernels would run one query tile per head with
    all but one of its rows idle. fp32 (fp64 for fp64 inputs); returns v's dtype.

    k, v, r may have H_kv heads (grouped-query attention): the G query heads of a group are G rows against
    their shared keys. With a window only the last `window` keys take part: every path sum of a visible key
    lies among them."""
    dtype = _compute_dtype(q)
    B, H, _, D = q.shape
    Hkv = k.shape[1]
    if window is not None:
        k, v, r = (x[:, :, -window:] for x in (k, v, r))
    qg, pg = (x.reshape(B, Hkv, H // Hkv, x.shape[3]).to(dtype) for x in (q, p))  # the group's heads as rows
    z = pg @ r.to(dtype).transpose(-1, -2)  # (B, H_kv, G, Tk)
    psi = slopes.to(device=q.device, dtype=dtype).view(1, Hkv, -1, 1) * F.logsigmoid(z)
    suffix = psi.flip(-1).cumsum(-1).flip(-1)  # Σ_{ℓ>=j} ψ(ℓ)
    bias = F.pad(suffix[..., 1:], (0, 1))  # Σ_{ℓ>j} ψ(ℓ); the newest key has none
    logits = scale * (qg @ k.to(dtype).transpose(-1, -2)) + bias
    out = torch.softmax(logits, dim=-1) @ v.to(dtype)
    return out.view(B, H, 1, v.shape[3]).to(v.dtype)


def _probe_triton_kernels(dtype: torch.dtype, device: torch.device, head_dim: int, value_dim: int) -> float:
    """attention_kernels/triton_probe.py's check of this family: the Triton path against the chunked one, forward and
    backward, with grouped keys (its largest relative error; KernelMismatch beyond the dtype's tolerance)."""
    g, T, H, Hkv = probe_generator(device), probe_tokens(device), PROBE_HEADS, PROBE_KV_HEADS
    inputs = [probe_randn(g, 1, H, T, head_dim), probe_randn(g, 1, Hkv, T, head_dim), probe_randn(g, 1, Hkv, T, value_dim),
              probe_randn(g, 1, H, T, 8, scale=0.5), probe_randn(g, 1, Hkv, T, 8, scale=0.5)]
    slopes = torch.tensor([0.05, 0.3], device=device)
    scale = head_dim ** -0.5

    def kernel(q, k, v, p, r):
        return grape_ap_attention(q, k, v, p.float(), r.float(), slopes, scale, backend="triton")

    def portable(q, k, v, p, r):
        return grape_ap_attention(q, k, v, p, r, slopes, scale, backend="chunked")
    return compare_with_portable(kernel, portable, inputs, probe_randn(g, 1, H, T, value_dim), dtype)


triton_probe.PROBES["grape_ap"] = _probe_triton_kernels
