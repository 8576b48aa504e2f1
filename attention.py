"""Attention backends. One entry point, ``attend``, for training, prefill and single-token decode.

* ``sdpa``: fused causal ``scaled_dot_product_attention`` (no additive bias);
* ``lifted``: separable additive biases as extra q/k columns (the homogeneous lift), then the same
  fused SDPA: O(T) memory, exact in bf16 (attention_kernels/lift.py), any device. The CPU default;
* ``tile``: separable additive biases added inside the tile in fp32 by a Triton FlashAttention kernel
  (attention_kernels/separable.py): q, k, v keep their 128-wide heads, which the lift widens to 136-144 and so
  sends to slower fused kernels. The CUDA default;
* ``path_integral``: GRAPE-AP, whose bias is not separable: ``attention_kernels.grape_ap_attention`` (a Triton
  FlashAttention-style kernel on CUDA, a chunked PyTorch version with O(T·block) memory elsewhere);
* ``dense``: the readable reference that materialises the (B, H, Tq, Tk) logits exactly as the
  formulas read. Tests compare every fast path against it.

Every backend takes keys and values with fewer heads than the queries (grouped-query attention: query head h
reads key/value head h // (H / H_kv)) and an optional sliding ``window``: a query at absolute position t sees keys
t - window + 1 ... t. One decoding query of a separable bias ("lifted", "tile") takes the dense row: O(Tk) in fp32,
with no lifted copy of the cache.

``attn_backend`` in the model config picks how a separable bias is applied ("lifted", "tile", or
"auto": tile on CUDA with bf16/fp16 attention inputs when Triton builds the kernel, else lifted) or asks for
"dense"; encodings without a bias always run fused SDPA and GRAPE-AP always its own kernel.
"""
from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn.functional as F

from attention_kernels import grape_ap_attention
from attention_kernels.lift import PARTS, split_lifted_columns
from attention_kernels.separable import separable_attention
from attention_kernels.triton_probe import DTYPE_NAMES, triton_builds
from positional import AdditiveBias

BACKENDS = ("auto", "lifted", "tile", "dense")


# Whether the tile kernel can run at all (read once: a cached function would be traced by torch.compile)
TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None
HALF_DTYPES = (torch.bfloat16, torch.float16)


def resolve_backend(requested: str, bias: AdditiveBias | None, device: torch.device | None = None,
                    dtype: torch.dtype | None = None, head_dim: int = 64) -> str:
    """The backend one layer runs for attention inputs of ``dtype`` and ``head_dim`` on ``device`` (None: only
    validate the name). "auto" takes the in-tile kernel only where it is built for: CUDA and bf16/fp16 inputs
    (fp32 would run its dots without tensor cores, in tiles sized for half precision), and only where the
    installed Triton builds it for this head dim and it fits the GPU (else one warning line and the lift)."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown attn_backend {requested!r}; valid: {', '.join(BACKENDS)}")
    if requested == "dense":
        return "dense"
    if bias is None:
        return "sdpa"
    if not bias.separable:
        return "path_integral"
    on_triton_device = device is not None and TRITON_AVAILABLE and (
        device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
    if requested == "auto":
        return "tile" if on_triton_device and dtype in HALF_DTYPES and triton_builds(
            "separable", DTYPE_NAMES[dtype], head_dim) else "lifted"
    if requested == "tile" and device is not None and not on_triton_device:
        raise ValueError("attn_backend='tile' runs a Triton kernel: it needs a CUDA device and the triton package "
                         f"(this model is on {device.type}{'' if TRITON_AVAILABLE else ', triton is not installed'}); "
                         "use attn_backend='auto' or 'lifted' here")
    return requested


def describe_backend(backend: str) -> str:
    return {
        "sdpa": "fused causal SDPA",
        "lifted": "fused causal SDPA on lifted q/k columns (homogeneous lift)",
        "tile": "Triton FlashAttention with the separable bias added in the tile (fp32)",
        "path_integral": "GRAPE-AP path-integral attention (Triton kernels on CUDA, chunked elsewhere, one O(T) "
                         "row per decoded token; O(T) memory)",
        "dense": "dense reference (materialised logits and bias)",
    }[backend]


def lift_qk(q, k, qf, kf, bias: AdditiveBias, scale: float):
    """Append the lifted columns: scale·(q̃·k̃) = scale·(q·k) + b(t, j) + c(t). The key side is divided
    by the softmax scale so that SDPA's own scaling leaves the bias intact. In bf16/fp16 each column
    becomes several whose products the attention's fp32 accumulator sums back to the fp32 bias (one
    bf16 column would be off by whole logits at T = 4096). On CUDA the width is padded to a multiple of
    8, which the fused (Flash / memory-efficient) SDPA kernels require. The caller zero-pads v to the
    lifted width: the fused kernels want one head dim for q, k and v (on the CPU a narrower v falls back
    to the O(T²) math path, measured 4x slower at T = 2048).

    Grouped keys (k with fewer heads than q) stay shared when every lifted key column is the key head's; where
    one carries a query head's factor (ALiBi's slope, GRAPE-A's ω_h, FoX's per-head gates), the lifted keys are
    one per query head: k is repeated per group here (the caller repeats v to match)."""
    q_cols, k_cols = bias.lift(qf, kf)
    k_cols = k_cols / scale
    if q.dtype in (torch.bfloat16, torch.float16):
        q_cols, k_cols = split_lifted_columns(
            q_cols, k_cols, q.dtype, [1 if exact else PARTS for exact in bias.exact_query_columns()])
    B, H = q.shape[:2]
    if k_cols.shape[1] not in (1, k.shape[1]):
        k = k.repeat_interleave(H // k.shape[1], dim=1)
    q_cols = q_cols.expand(B, H, *q_cols.shape[2:]).to(q.dtype)
    k_cols = k_cols.expand(B, k.shape[1], *k_cols.shape[2:]).to(k.dtype)
    pad = (-(q.shape[-1] + q_cols.shape[-1]) % 8) if q.is_cuda else 0
    if pad:
        q_cols, k_cols = F.pad(q_cols, (0, pad)), F.pad(k_cols, (0, pad))
    return torch.cat((q, q_cols), dim=-1), torch.cat((k, k_cols), dim=-1)


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """(Tq, Tk), True = may attend: keys at or before the query, and with a window at most window - 1 before it."""
    distance = q_pos[:, None] - k_pos[None, :]
    visible = distance >= 0
    return visible if window is None else visible & (distance < window)


def attend(q, k, v, *, backend: str, scale: float, q_pos, k_pos, bias=None, qf=None, kf=None,
           window: int | None = None):
    """q (B,H,Tq,·), k (B,H_kv,Tk,·), v (B,H_kv,Tk,Dv) -> (B,H,Tq,Dv), H_kv dividing H. q_pos/k_pos are absolute
    positions: query q_pos[i] may attend to keys with q_pos[i] - window < k_pos <= q_pos[i] (window None: no lower
    bound). The queries are the last Tq of the Tk keys, in order (the kernels' contract; the cache keeps it)."""
    n_queries, grouped = q.shape[2], k.shape[1] != q.shape[1]
    if backend == "path_integral":
        return grape_ap_attention(q, k, v, qf["p"], kf["r"], bias.slopes, scale, window=window).to(v.dtype)
    if backend == "tile" and n_queries > 1:
        q_features, k_features = bias.tile_features(qf, kf)
        return separable_attention(q, k, v, q_features, k_features, scale, has_rate=bias.has_rate,
                                   has_sum=bias.has_sum, window=window)
    if backend == "sdpa" or (backend == "lifted" and n_queries > 1):
        head_dim = v.shape[-1]
        if backend == "lifted":
            q, k = lift_qk(q, k, qf, kf, bias, scale)
            # v zero-padded to the lifted width (see lift_qk) and repeated if the lifted keys are per query head
            v = F.pad(v, (0, q.shape[-1] - head_dim)).repeat_interleave(k.shape[1] // v.shape[1], dim=1)
            grouped = k.shape[1] != q.shape[1]
        if window is None and n_queries == k.shape[2]:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=grouped)
        elif window is None and n_queries == 1:  # one new token sees the whole cache
            y = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=grouped)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(q_pos, k_pos, window), scale=scale,
                                               enable_gqa=grouped)
        return y[..., :head_dim]  # without the zero-padded lifted value columns
    # the dense reference, and the O(Tk) row of one decoding query
    H = q.shape[1]
    k, v = (x.repeat_interleave(H // x.shape[1], dim=1) for x in (k, v))
    work = torch.promote_types(v.dtype, torch.float32)  # fp32 at least; fp64 stays fp64 (a numerics check)
    logits = scale * (q.to(work) @ k.to(work).transpose(-1, -2))
    if bias is not None:
        logits = logits + bias.dense(qf, kf).to(work)
    logits = logits.masked_fill(~causal_mask(q_pos, k_pos, window), float("-inf"))
    return (torch.softmax(logits, dim=-1) @ v.to(work)).to(v.dtype)
