"""Attention with a separable additive bias added inside the tile (the GPU path of ALiBi, GRAPE-A, FoX).

    logit(i, j) = scale·q_i·k_j - (t_i - s_j)·(a_i + b_j) + (c_i - c_j),   j <= Tk - Tq + i

``q_features`` (B|1, H|1, Tq, 3) holds (t, a, c) per query, ``k_features`` (B|1, H|1, Tk, 3) holds
(s, b, c) per key, in fp32 (``AdditiveBias.tile_features`` builds them). The kernel is Triton
(``attention_kernels/separable_triton.py``), wrapped in the custom operators ``grape::separable_attention`` and
its backward, each with a shape-only fake implementation, so ``torch.compile`` traces through it.
"""
from __future__ import annotations

import torch


@torch.library.custom_op("grape::separable_attention", mutates_args=())
def _separable_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qf: torch.Tensor, kf: torch.Tensor,
                  scale: float, flags: list[int], config: list[int], window: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    from attention_kernels.separable_triton import triton_forward
    q, k, v, qf, kf = (x.contiguous() for x in (q, k, v, qf, kf))  # no copies when they already are
    return triton_forward(q, k, v, qf, kf, scale, flags, config, window)


@_separable_op.register_fake
def _(q, k, v, qf, kf, scale, flags, config, window=0):
    B, H, Tq, _ = q.shape
    return q.new_empty((B, H, Tq, v.shape[3]), dtype=v.dtype), q.new_empty((B, H, Tq), dtype=torch.float32)


@torch.library.custom_op("grape::separable_attention_backward", mutates_args=())
def _separable_backward_op(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           qf: torch.Tensor, kf: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, scale: float,
                           flags: list[int], config: list[int], window: int = 0
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from attention_kernels.separable_triton import triton_backward
    operands = (x.contiguous() for x in (grad_out, q, k, v, qf, kf, out, lse))
    return triton_backward(*operands, scale, flags, config, window)


@_separable_backward_op.register_fake
def _(grad_out, q, k, v, qf, kf, out, lse, scale, flags, config, window=0):
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v, qf, kf))


def _setup_context(ctx, inputs, output):
    q, k, v, qf, kf, scale, flags, config, *window = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, qf, kf, out, lse)
    ctx.scale, ctx.flags, ctx.config, ctx.window = scale, flags, config, (window or [0])[0]
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, qf, kf, out, lse = ctx.saved_tensors
    grads = _separable_backward_op(grad_out, q, k, v, qf, kf, out, lse, ctx.scale, ctx.flags, ctx.config, ctx.window)
    return (*grads, None, None, None, None)


_separable_op.register_autograd(_backward, setup_context=_setup_context)


def separable_attention(q, k, v, q_features, k_features, scale: float, *, has_rate: bool, has_sum: bool,
                        config=None, window: int | None = None) -> torch.Tensor:
    """q (B,H,Tq,D), k (B,H_kv,Tk,D), v (B,H_kv,Tk,Dv) -> (B,H,Tq,Dv) in v's dtype; queries are the last Tq
    of the Tk keys. Gradients flow to q, k, v and both feature tensors. has_rate / has_sum say which
    bias terms are present (an absent one is skipped, its feature gradient is zero). config: see
    ``attention_kernels.separable_triton.default_config``.

    Grouped-query attention: H_kv divides H, query head h reads key/value head h // (H / H_kv) without a copy.
    q_features (B|1, H|1, Tq, 3) belong to the query heads; k_features (B|1, heads, Tk, 3) to the shared key head
    (heads = H_kv or 1; their gradient sums the group) or to each query head (heads = H, e.g. a forget gate per
    query head); docs/separable_kernel.md. window: a query at absolute position t sees keys t - window + 1 ... t
    (None: every key up to t)."""
    from attention_kernels.separable_triton import default_config
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if (k.shape[0] != B or Hkv < 1 or H % Hkv or k.shape[3] != D or v.shape[:3] != (B, Hkv, Tk) or Tq > Tk):
        raise ValueError(f"separable_attention: q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)} must be "
                         "(B, H, Tq, D), (B, H_kv, Tk, D), (B, H_kv, Tk, Dv) with H_kv dividing H and Tq <= Tk")
    if q_features.shape[-2:] != (Tq, 3) or k_features.shape[-2:] != (Tk, 3):
        raise ValueError(f"separable_attention: features {tuple(q_features.shape)}, {tuple(k_features.shape)} must "
                         f"end in ({Tq}, 3) and ({Tk}, 3)")
    if k_features.dim() != 4 or k_features.shape[1] not in (1, Hkv, H):
        raise ValueError(f"separable_attention: k_features{tuple(k_features.shape)} must have 1, {Hkv} (the key "
                         f"heads) or {H} (the query heads) heads")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"separable_attention: window ({window!r}) must be a positive number of keys (a query at t "
                         "sees keys t - window + 1 ... t) or None for full causal attention")
    dtype = v.dtype  # under autocast q, k may come out of fp32 positional code: one dtype for the kernel
    # contiguous copies made here, so that autograd saves them for the backward pass
    q, k, v = (x.to(dtype).contiguous() for x in (q, k, v))
    qf = q_features.float().expand(B, H, Tq, 3).contiguous()
    kf = k_features.float().expand(B, max(Hkv, k_features.shape[1]), Tk, 3).contiguous()
    config = [int(c) for c in (config or default_config(D, dtype))]
    return _separable_op(q, k, v, qf, kf, float(scale), [int(has_rate), int(has_sum)], config,
                         0 if window is None else int(window))[0]
