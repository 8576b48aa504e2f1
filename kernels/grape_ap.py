"""GRAPE-AP path-integral attention without materialising the (Tq, Tk) bias for the whole sequence.

    logit(i, j) = scale·q_i·k_j + Σ_{ℓ=j+1}^{t_i} α_h·logsigmoid(p_i·r_ℓ),   j <= t_i = Tk - Tq + i

(queries are the last Tq of the Tk key positions). The bias is not separable, but softmax ignores a
constant per row, and bias(i, j) = S_i - F(i, j) with F(i, j) = Σ_{ℓ<=j} ψ(i, ℓ) a *left prefix sum*
and S_i = F(i, t_i) constant per row (DESIGN.md §3). Hence:

* ``chunked`` (portable, any device): loop over blocks of queries; per block build ψ for the block's
  keys, -F by ``cumsum``, and the block's softmax. A custom autograd Function recomputes each block in
  the backward pass, so training memory is O(T·block), not O(T²) (autograd through the loop would keep
  every block's intermediates; ``torch.utils.checkpoint`` per block measured 1.9x slower than this
  hand-written backward on the CPU at T = 2048, 1.2-1.9x at T = 512..4096: docs/benchmarks.md, ablation).
* ``triton`` (CUDA): a FlashAttention-style kernel, see ``kernels/grape_ap_triton.py``.

``grape_ap_attention`` picks Triton for CUDA tensors when Triton imports, the chunked path otherwise.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "chunked", "triton")


def _triton_available() -> bool:
    try:
        from kernels import grape_ap_triton  # noqa: F401  (imports triton)
    except ImportError:
        return False
    return True


def check_inputs(q, k, v, p, r, slopes) -> None:
    """One clear sentence per shape mistake instead of a broadcast error deep in a matmul."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or p.dim() != 4 or r.dim() != 4:
        raise ValueError("grape_ap_attention expects 4-D (batch, heads, time, dim) tensors for q, k, v, p and r; "
                         f"got q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)}, p{tuple(p.shape)}, r{tuple(r.shape)}")
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    problems = []
    if k.shape != (B, H, Tk, D):
        problems.append(f"k{tuple(k.shape)} must be (B, H, Tk, {D}) like q{tuple(q.shape)}")
    if v.shape[:3] != (B, H, Tk):
        problems.append(f"v{tuple(v.shape)} must be (B, H, Tk, Dv) with the B, H, Tk of k{tuple(k.shape)}")
    if p.shape[:3] != (B, H, Tq):
        problems.append(f"p{tuple(p.shape)} must be (B, H, Tq, dp) with the B, H, Tq of q{tuple(q.shape)}")
    if r.shape[:3] != (B, H, Tk) or r.shape[3] != p.shape[3]:
        problems.append(f"r{tuple(r.shape)} must be (B, H, Tk, dp) matching k's time axis and p's dp")
    if Tq > Tk:
        problems.append(f"queries are the last Tq of the Tk keys, so Tq ({Tq}) must be <= Tk ({Tk})")
    if slopes.shape != (H,):
        problems.append(f"slopes{tuple(slopes.shape)} must hold one slope per head ({H})")
    if problems:
        raise ValueError("grape_ap_attention: " + "; ".join(problems) + ".")


@torch.compiler.disable  # a graph break: dynamo would unroll the block loop / trace into Triton launches
def grape_ap_attention(q, k, v, p, r, slopes, scale: float, *, backend: str = "auto", block_size: int | None = None):
    """GRAPE-AP attention. q (B,H,Tq,D), k (B,H,Tk,D), v (B,H,Tk,Dv); p (B,H,Tq,dp) the query path
    vectors already divided by d_p; r (B,H,Tk,dp) the rotated, RMS-normalised key path vectors;
    slopes (H,) the positive α_h (constants, no gradient); returns (B,H,Tq,Dv) in v's dtype.
    Gradients flow to q, k, v, p and r."""
    check_inputs(q, k, v, p, r, slopes)
    if backend not in BACKENDS:
        raise ValueError(f"unknown grape_ap backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "triton" if q.is_cuda and _triton_available() else "chunked"
    if backend == "triton":
        from kernels.grape_ap_triton import grape_ap_triton
        return grape_ap_triton(q, k, v, p, r, slopes, scale)
    return grape_ap_chunked(q, k, v, p, r, slopes, scale, block_size=block_size)


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


def _block_logits(q_blk, k_pre, p_blk, r_pre, neg_slopes, scale, diag_mask):
    """Logits (BH, n, kend) of one query block against its key prefix, up to a constant per row:
    scale·q·k - α·Σ_{ℓ<=j} logsigmoid(p·r_ℓ), with keys after each query masked. Also returns the
    path-logit matrix z = p·r (needed for the backward pass)."""
    z = torch.bmm(p_blk, r_pre.transpose(1, 2))
    logits = F.logsigmoid(z)
    logits.cumsum_(-1)  # F(i, j) / α, in place: the block's largest buffer is reused throughout
    logits.mul_(neg_slopes)
    logits.baddbmm_(q_blk, k_pre.transpose(1, 2), alpha=scale)
    n = q_blk.shape[1]
    logits[:, :, -n:].masked_fill_(diag_mask[:n, :n], float("-inf"))
    return logits, z


def _no_autocast(method):
    """Run a Function's forward/backward with autocast off: it chooses its own precision (fp32), and
    autocast would otherwise turn the in-place baddbmm_ on fp32 buffers into a dtype clash."""
    def wrapper(ctx, *args):
        with torch.autocast(device_type=_device_type(args), enabled=False):
            return method(ctx, *args)
    return wrapper


def _device_type(args) -> str:
    return next(a.device.type for a in args if isinstance(a, torch.Tensor))


class _ChunkedGrapeAP(torch.autograd.Function):
    @staticmethod
    @_no_autocast
    def forward(ctx, q, k, v, p, r, slopes, scale, block):
        B, H, Tq, _ = q.shape
        Tk = k.shape[2]
        dtype = _compute_dtype(q)
        q3, k3, v3, p3, r3 = (x.reshape(B * H, x.shape[2], x.shape[3]).to(dtype) for x in (q, k, v, p, r))
        neg_slopes = -slopes.to(device=q.device, dtype=dtype).repeat(B).view(B * H, 1, 1)
        diag_mask = torch.ones(block, block, dtype=torch.bool, device=q.device).triu_(1)
        out = torch.empty(B * H, Tq, v.shape[3], dtype=dtype, device=q.device)
        offset = Tk - Tq
        for start in range(0, Tq, block):
            end = min(start + block, Tq)
            key_end = offset + end  # keys 0 .. key_end-1 are visible to some query of the block
            logits, _ = _block_logits(q3[:, start:end], k3[:, :key_end], p3[:, start:end], r3[:, :key_end],
                                      neg_slopes, scale, diag_mask)
            torch.bmm(torch.softmax(logits, dim=-1), v3[:, :key_end], out=out[:, start:end])
        ctx.save_for_backward(q3, k3, v3, p3, r3, neg_slopes, out)
        ctx.scale, ctx.block = scale, block
        ctx.dtypes = tuple(x.dtype for x in (q, k, v, p, r))
        ctx.shapes = tuple(x.shape for x in (q, k, v, p, r))
        return out.view(B, H, Tq, -1).to(v.dtype)

    @staticmethod
    @_no_autocast
    def backward(ctx, grad_out):
        q3, k3, v3, p3, r3, neg_slopes, out = ctx.saved_tensors
        scale, block = ctx.scale, ctx.block
        BH, Tq, _ = q3.shape
        Tk = k3.shape[1]
        offset = Tk - Tq
        do3 = grad_out.reshape(BH, Tq, -1).to(out.dtype)
        row_dot = (do3 * out).sum(-1, keepdim=True)  # D_i = dO_i·O_i = Σ_j P_ij dP_ij
        dq, dp = torch.empty_like(q3), torch.empty_like(p3)
        dk, dv, dr = torch.zeros_like(k3), torch.zeros_like(v3), torch.zeros_like(r3)
        diag_mask = torch.ones(block, block, dtype=torch.bool, device=q3.device).triu_(1)
        for start in range(0, Tq, block):
            end = min(start + block, Tq)
            key_end = offset + end
            q_blk, p_blk, do_blk = q3[:, start:end], p3[:, start:end], do3[:, start:end]
            k_pre, v_pre, r_pre = k3[:, :key_end], v3[:, :key_end], r3[:, :key_end]
            logits, z = _block_logits(q_blk, k_pre, p_blk, r_pre, neg_slopes, scale, diag_mask)
            probs = torch.softmax(logits, dim=-1)
            del logits
            dv[:, :key_end].baddbmm_(probs.transpose(1, 2), do_blk)
            # dS = P ∘ (dO·vᵀ - D): the gradient of the logits, computed in place
            d_logits = torch.bmm(do_blk, v_pre.transpose(1, 2)).sub_(row_dot[:, start:end]).mul_(probs)
            del probs
            torch.bmm(d_logits, k_pre, out=dq[:, start:end]).mul_(scale)
            dk[:, :key_end].baddbmm_(d_logits.transpose(1, 2), q_blk, alpha=scale)
            # logit(i, j) carries -α Σ_{ℓ<=j} ψ̃(i, ℓ), so dψ̃(i, ℓ) = -α Σ_{j>=ℓ} dS(i, j): a suffix sum,
            # written as total - inclusive prefix + own term (zero past the diagonal, where dS is 0).
            prefix = torch.cumsum(d_logits, dim=-1)
            d_path = d_logits.sub_(prefix).add_(prefix[:, :, -1:])
            del prefix
            d_path[:, :, 0] = 0  # ψ(i, 0) never enters a bias (the sum starts at ℓ = j + 1 >= 1)
            d_path.mul_(z.neg_().sigmoid_())  # d logsigmoid(z)/dz = sigmoid(-z); -α is applied below
            torch.bmm(d_path, r_pre, out=dp[:, start:end]).mul_(neg_slopes)
            dr[:, :key_end].baddbmm_(d_path.transpose(1, 2), p_blk * neg_slopes)
        grads = []
        for g, dtype, shape in zip((dq, dk, dv, dp, dr), ctx.dtypes, ctx.shapes):
            grads.append(g.view(shape).to(dtype))
        return (*grads, None, None, None)


def grape_ap_chunked(q, k, v, p, r, slopes, scale: float, *, block_size: int | None = None):
    """The portable path: exact (fp32, or fp64 for fp64 inputs) with O(Tk·block) working memory in the
    forward and backward passes."""
    B, H = q.shape[:2]
    block = block_size or default_block_size(B * H, k.shape[2])
    return _ChunkedGrapeAP.apply(q, k, v, p, r, slopes.detach(), float(scale), int(block))
