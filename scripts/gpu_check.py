"""GPU correctness checks that the CPU test suite cannot run (bf16 Triton dot, FlashAttention).

    python scripts/gpu_check.py [--out docs/gpu_check.md]

1. The GRAPE-AP Triton kernel in bf16 (and fp32) against an fp64 dense reference on the same rounded
   inputs: output and the five gradients, T not multiples of the tiles, Tq < Tk, head dims 64 and 128; and
   the one-token decode path (decode_attention) at Tk = 8192 against the fp64 row, within the Triton full
   forward's own error on that row.
   bf16 out/dq/dk/dv are judged against bf16 causal SDPA's own error on the same q, k, v (the floor of
   bf16 attention); dp and dr relative to their size within 4x of the kernel's own worst of dq/dk/dv.
2. The in-tile separable-bias Triton kernel (attn_backend="tile", what "auto" runs on CUDA for ALiBi,
   GRAPE-A and FoX) in bf16 against fp64 at T = 4096 with FoX-sized running sums (|c| in the
   thousands) and GRAPE-A-sized rates, Tq < Tk and decode: out/dq/dk/dv against bf16 SDPA's own error,
   the feature gradients relative to their size within 4x of the kernel's worst of dq/dk/dv.
3. The bf16 lifted columns through FlashAttention (forced with sdpa_kernel) against fp32 at T = 4096.
4. Whole models in bf16 autocast: attn_backend="auto" (and "lifted" for the separable encodings)
   against "dense" (logits), and KV-cache decoding against the full forward.
5. Both Triton kernel families in bf16 with grouped-query keys (4 query heads per key head, multi-query) and a
   sliding window, Tq < Tk, against fp64 with the keys repeated per group and the window's mask: out/dq/dk/dv
   against bf16 SDPA's own error on the repeated keys (its dk, dv summed over each group), the path and feature
   gradients relative to their size within 4x of the kernel's worst of dq/dk/dv.
Prints one line per check and writes a markdown table; exits 1 if any check fails.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# --smoke: tiny shapes on the CPU (Triton interpreted, fp16 instead of bf16) to check this script itself
SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attention import causal_mask, lift_qk  # noqa: E402
from attention_kernels.grape_ap import grape_ap_triton  # noqa: E402
from model import GPT, CausalSelfAttention, GPTConfig  # noqa: E402

RESULTS = []


def record(name, error, limit, detail=""):
    ok = error <= limit
    RESULTS.append((name, error, limit, ok, detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {error:.3e} (limit {limit:.3e}) {detail}", flush=True)


def dense_grape_ap(q, k, v, p, r, slopes, scale):
    """fp64 reference from the definition: the bias as a suffix sum of ψ over j < ℓ <= t_i."""
    Tq, Tk = q.shape[2], k.shape[2]
    t = torch.arange(Tq, device=q.device) + (Tk - Tq)
    j = torch.arange(Tk, device=q.device)
    psi = slopes[:, None, None] * F.logsigmoid(p @ r.transpose(-1, -2))
    psi = psi.masked_fill(j[None, :] > t[:, None], 0.0)
    suffix = psi.flip(-1).cumsum(-1).flip(-1)  # Σ_{ℓ>=j} ψ
    bias = suffix - psi  # Σ_{ℓ>j} ψ
    logits = scale * (q @ k.transpose(-1, -2)) + bias
    logits = logits.masked_fill(j[None, :] > t[:, None], float("-inf"))
    return torch.softmax(logits, -1) @ v


def grads_of(fn, inputs, grad_out):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
    return [out.detach()] + [g.detach() for g in grads]


def sdpa_error_floor(low, mask, scale, grad_out) -> list[float]:
    """Low-precision fused attention's own error on these q, k, v (no bias): max |SDPA - fp64 softmax| of
    out, dq, dk, dv. A kernel is judged against this floor, not against an absolute number."""
    got = grads_of(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask, scale=scale), low, grad_out)
    ref = grads_of(lambda a, b, c: torch.softmax((scale * a @ b.transpose(-1, -2)).masked_fill(~mask, float("-inf")), -1) @ c,
                   [x.double() for x in low], grad_out.double())
    return [(g.double() - r).abs().max().item() for g, r in zip(got, ref)]


def check_triton_kernel(device, deadline):
    g = torch.Generator().manual_seed(0)
    # (B, H, Tq, Tk, D, also in fp32): T not multiples of the tiles, a KV cache (Tq < Tk), decode, and
    # T = 4096 (two backward passes of 2048 rows); fp32 at two shapes only (each dtype compiles anew)
    shapes = [(2, 4, 1000, 1000, 64, True), (1, 8, 777, 2100, 128, True), (1, 4, 1, 3000, 128, False),
              (2, 2, 4096, 4096, 64, False)]
    low_dtype = torch.bfloat16
    if SMOKE:
        shapes, low_dtype = [(1, 2, 21, 37, 16, True)], torch.float16
    for B, H, Tq, Tk, D, with_fp32 in shapes:
        if time.monotonic() > deadline:
            record(f"triton grape_ap B{B} H{H} Tq{Tq} Tk{Tk} D{D}", float("nan"), 0.0, "not run: time budget spent")
            continue
        q, k, v = (torch.randn(B, H, T, D, generator=g) for T in (Tq, Tk, Tk))
        q, k = F.normalize(q, dim=-1) * math.sqrt(D), F.normalize(k, dim=-1) * math.sqrt(D)  # QK-normed like the model
        p = 3 * torch.randn(B, H, Tq, 8, generator=g) / 8
        r = torch.randn(B, H, Tk, 8, generator=g)
        r = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True))
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], device=device)
        scale = 1 / math.sqrt(D)
        grad_out = torch.randn(B, H, Tq, D, generator=g).to(device)
        mask = causal_mask(torch.arange(Tk - Tq, Tk, device=device), torch.arange(Tk, device=device))
        for dtype in ((torch.float32,) if with_fp32 else ()) + (low_dtype,):
            low = [x.to(device=device, dtype=dtype) for x in (q, k, v)]
            path = [x.to(device) for x in (p, r)]
            ref = grads_of(lambda *a: dense_grape_ap(*a, slopes.double(), scale),
                           [x.double() for x in low + path], grad_out.double())
            got = grads_of(lambda *a: grape_ap_triton(*a, slopes, scale), low + path, grad_out)
            errors = [(got[i].double() - ref[i]).abs().max().item() for i in range(6)]
            sizes = [ref[i].abs().max().item() for i in range(6)]
            if dtype != torch.float32:  # bf16 attention's own error on the same inputs sets the scale
                floors = sdpa_error_floor(low, mask, scale, grad_out)
                # the path gradients as accurate, relative to their size, as the kernel's own dq, dk, dv
                attention_rel = max(errors[i] / max(sizes[i], 1e-30) for i in (1, 2, 3))
            for i, name in enumerate(["out", "dq", "dk", "dv", "dp", "dr"]):
                if dtype == torch.float32:
                    limit = 2e-3 * max(1.0, sizes[i])
                elif i < 4:
                    limit = 3 * floors[i] + 1e-3 * sizes[i]
                else:
                    limit = 4 * attention_rel * sizes[i]
                record(f"triton grape_ap {str(dtype)[6:]} B{B} H{H} Tq{Tq} Tk{Tk} D{D} {name}", errors[i], limit,
                       f"(max |ref| {sizes[i]:.2e})")


def check_decode(device, deadline):
    """One new token against a long cache (decode_attention, what "auto" runs for Tq = 1) against the last row
    of the Triton full forward, bf16 inputs: the decode row computes in fp32, the kernel in bf16 tiles."""
    from attention_kernels.grape_ap import decode_attention
    g = torch.Generator().manual_seed(1)
    B, H, T, D = (1, 2, 40, 16) if SMOKE else (2, 8, 8192, 128)
    low = torch.float16 if SMOKE else torch.bfloat16
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    q, k = F.normalize(q, dim=-1) * math.sqrt(D), F.normalize(k, dim=-1) * math.sqrt(D)
    q, k, v = (x.to(device, low) for x in (q, k, v))
    p = (3 * torch.randn(B, H, T, 8, generator=g) / 8).to(device)
    r = torch.randn(B, H, T, 8, generator=g)
    r = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True))).to(device)
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], device=device)
    with torch.no_grad():
        full = grape_ap_triton(q, k, v, p, r, slopes, 1 / math.sqrt(D))[:, :, -1:]
        row = decode_attention(q[:, :, -1:], k, v, p[:, :, -1:], r, slopes, 1 / math.sqrt(D))
        ref = dense_grape_ap(*(x.double() for x in (q[:, :, -1:], k, v, p[:, :, -1:], r)), slopes.double(), 1 / math.sqrt(D))
    floor = (full.double() - ref).abs().max().item()  # the tiled kernel's own bf16 error on this row
    record(f"decode_attention {str(low)[6:]} B{B} H{H} Tk{T} D{D} vs fp64", (row.double() - ref).abs().max().item(),
           max(floor, 2e-3), f"(Triton full forward's last row: {floor:.2e})")


def check_tile_kernel(device, deadline):
    from attention_kernels.separable import separable_attention
    g = torch.Generator().manual_seed(0)
    # (B, H, Tq, Tk, D, has_rate, has_sum): FoX, GRAPE-A (both gates), both terms with a KV cache, decode
    # (B, H, Tq, Tk, D, has_rate, has_sum, dtype): bf16 (what "auto" runs), and fp32 once (attn_backend="tile"
    # forced: its own tiles, dots without tensor cores)
    bf16, fp32 = torch.bfloat16, torch.float32
    shapes = [(1, 4, 4096, 4096, 128, 0, 1, bf16), (1, 4, 4096, 4096, 128, 1, 0, bf16),
              (2, 2, 777, 2100, 128, 1, 1, bf16), (1, 4, 1, 3000, 64, 1, 1, bf16), (1, 2, 1000, 1000, 128, 1, 1, fp32)]
    if SMOKE:
        shapes = [(1, 2, 21, 37, 16, 1, 1, torch.float16)]
    for B, H, Tq, Tk, D, has_rate, has_sum, low_dtype in shapes:
        name = f"triton tile rate{has_rate} sum{has_sum} B{B} H{H} Tq{Tq} Tk{Tk} D{D}"
        if time.monotonic() > deadline:
            record(name, float("nan"), 0.0, "not run: time budget spent")
            continue
        q, k, v = (torch.randn(B, H, T, D, generator=g) for T in (Tq, Tk, Tk))
        q, k = F.normalize(q, dim=-1) * math.sqrt(D), F.normalize(k, dim=-1) * math.sqrt(D)
        pos = torch.arange(Tk, dtype=torch.float32)
        sums = F.logsigmoid(torch.randn(B, H, Tk, generator=g) + 2.0).cumsum(-1)  # FoX: c_T ~ -0.15 T
        rates = 0.05 * torch.rand(B, H, Tk, generator=g)
        kf = torch.stack((pos.expand(B, H, Tk), rates, sums), -1)
        qf = torch.stack((pos[Tk - Tq:].expand(B, H, Tq), 0.05 * torch.rand(B, H, Tq, generator=g), sums[..., Tk - Tq:]), -1)
        scale = 1 / math.sqrt(D)
        grad_out = torch.randn(B, H, Tq, D, generator=g).to(device)
        mask = causal_mask(torch.arange(Tk - Tq, Tk, device=device), torch.arange(Tk, device=device))
        low = [x.to(device=device, dtype=low_dtype) for x in (q, k, v)]
        features = [x.to(device) for x in (qf, kf)]

        def reference(q, k, v, qf, kf):
            logits = scale * q @ k.transpose(-1, -2)
            if has_rate:
                logits = logits - (qf[..., 0, None] - kf[..., None, :, 0]) * (qf[..., 1, None] + kf[..., None, :, 1])
            if has_sum:
                logits = logits + qf[..., 2, None] - kf[..., None, :, 2]
            return torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ v
        ref = grads_of(reference, [x.double() for x in low + features], grad_out.double())
        got = grads_of(lambda *a: separable_attention(*a, scale, has_rate=bool(has_rate), has_sum=bool(has_sum)),
                       low + features, grad_out)
        got[4], got[5], ref[4], ref[5] = got[4][..., 1:], got[5][..., 1:], ref[4][..., 1:], ref[5][..., 1:]
        errors = [(got[i].double() - ref[i]).abs().max().item() for i in range(6)]
        sizes = [ref[i].abs().max().item() for i in range(6)]
        floors = sdpa_error_floor(low, mask, scale, grad_out)
        attention_rel = max(errors[i] / max(sizes[i], 1e-30) for i in (1, 2, 3))
        for i, part in enumerate(["out", "dq", "dk", "dv", "d query features", "d key features"]):
            if low_dtype == torch.float32:
                limit = 2e-4 * max(1.0, sizes[i], sizes[5] if i == 4 else 0.0)
            elif i < 4:
                limit = 3 * floors[i] + 1e-3 * sizes[i]
            else:  # the query-side running-sum gradient is a row sum of dS: zero up to rounding
                limit = 4 * attention_rel * max(sizes[4 if i == 4 else 5], sizes[5]) + 1e-6
            record(f"{name} {str(low_dtype)[6:]} {part}", errors[i], limit, f"(max |ref| {sizes[i]:.2e})")


def check_grouped_window(device, deadline):
    from attention_kernels.separable import separable_attention
    g = torch.Generator().manual_seed(2)
    # (B, H, H_kv, Tq, Tk, D, window)
    shapes = [(1, 8, 2, 4096, 4096, 128, 1000), (2, 4, 1, 777, 2100, 64, 700)]
    low_dtype = torch.bfloat16
    if SMOKE:
        shapes, low_dtype = [(1, 4, 2, 21, 37, 16, 9)], torch.float16
    for B, H, Hkv, Tq, Tk, D, window in shapes:
        name = f"B{B} H{H} kv{Hkv} Tq{Tq} Tk{Tk} D{D} window{window}"
        if time.monotonic() > deadline:
            record(f"grouped + window {name}", float("nan"), 0.0, "not run: time budget spent")
            continue
        q = torch.randn(B, H, Tq, D, generator=g)
        k, v = (torch.randn(B, Hkv, Tk, D, generator=g) for _ in range(2))
        q, k = F.normalize(q, dim=-1) * math.sqrt(D), F.normalize(k, dim=-1) * math.sqrt(D)
        low = [x.to(device=device, dtype=low_dtype) for x in (q, k, v)]
        t = torch.arange(Tk - Tq, Tk, device=device)[:, None]
        j = torch.arange(Tk, device=device)[None, :]
        mask = (j <= t) & (j > t - window)
        scale = 1 / math.sqrt(D)
        grad_out = torch.randn(B, H, Tq, D, generator=g).to(device)

        def repeat(x):
            return x.repeat_interleave(H // x.shape[1], dim=1)

        def attend(q, k, v, bias):
            logits = (scale * q @ repeat(k).transpose(-1, -2) + bias).masked_fill(~mask, float("-inf"))
            return torch.softmax(logits, -1) @ repeat(v)
        # bf16 SDPA on the repeated keys, its dk, dv summed over each group: the floor of grouped bf16 attention
        sdpa = grads_of(lambda a, b, c: F.scaled_dot_product_attention(a, repeat(b), repeat(c), attn_mask=mask,
                                                                       scale=scale), low, grad_out)
        exact = grads_of(lambda a, b, c: attend(a, b, c, 0.0), [x.double() for x in low], grad_out.double())
        floors = [(s_.double() - e).abs().max().item() for s_, e in zip(sdpa, exact)]
        p = (3 * torch.randn(B, H, Tq, 8, generator=g) / 8).to(device)
        r = torch.randn(B, Hkv, Tk, 8, generator=g)
        r = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True))).to(device)
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], device=device)
        pos = torch.arange(Tk, dtype=torch.float32)
        sums = F.logsigmoid(torch.randn(B, H, Tk, generator=g) + 2.0).cumsum(-1)  # FoX: a gate per query head
        kf = torch.stack((pos.expand(B, H, Tk), 0.05 * torch.rand(B, H, Tk, generator=g), sums), -1).to(device)
        qf = torch.stack((pos[Tk - Tq:].expand(B, H, Tq), 0.05 * torch.rand(B, H, Tq, generator=g),
                          sums[..., Tk - Tq:]), -1).to(device)

        def grape_ap_reference(q, k, v, p, r):
            psi = slopes.double()[:, None, None] * F.logsigmoid(p @ repeat(r).transpose(-1, -2))
            psi = psi.masked_fill(j > t, 0.0)
            bias = psi.flip(-1).cumsum(-1).flip(-1) - psi  # Σ_{ℓ>j} ψ
            return attend(q, k, v, bias)

        def separable_reference(q, k, v, qf, kf):
            bias = -(qf[..., 0, None] - kf[..., None, :, 0]) * (qf[..., 1, None] + kf[..., None, :, 1])
            return attend(q, k, v, bias + qf[..., 2, None] - kf[..., None, :, 2])
        for family, fn, reference, extra, names in (
                ("grape_ap", lambda *a: grape_ap_triton(*a, slopes, scale, window=window), grape_ap_reference,
                 [p, r], ["dp", "dr"]),
                ("tile", lambda *a: separable_attention(*a, scale, has_rate=True, has_sum=True, window=window),
                 separable_reference, [qf, kf], ["d query features", "d key features"])):
            ref = grads_of(reference, [x.double() for x in low + extra], grad_out.double())
            got = grads_of(fn, low + extra, grad_out)
            if family == "tile":  # positions take no gradient
                got[4], got[5], ref[4], ref[5] = got[4][..., 1:], got[5][..., 1:], ref[4][..., 1:], ref[5][..., 1:]
            errors = [(got[i].double() - ref[i]).abs().max().item() for i in range(6)]
            sizes = [ref[i].abs().max().item() for i in range(6)]
            attention_rel = max(errors[i] / max(sizes[i], 1e-30) for i in (1, 2, 3))
            for i, part in enumerate(["out", "dq", "dk", "dv"] + names):
                # (the tile kernel's query-side running-sum gradient is a row sum of dS: zero up to rounding)
                size = max(sizes[i], sizes[5]) if family == "tile" else sizes[i]
                limit = 3 * floors[i] + 1e-3 * sizes[i] if i < 4 else 4 * attention_rel * size + 1e-6
                record(f"triton {family} {str(low_dtype)[6:]} {name} {part}", errors[i], limit,
                       f"(max |ref| {sizes[i]:.2e})")


def check_lift_flash(device, deadline):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    T, H, D, C = (256, 2, 16, 32) if SMOKE else (4096, 4, 128, 256)
    for pos in ["alibi", "grape_a_q", "grape_a_k", "grape_a_qk", "fox"]:
        torch.manual_seed(0)
        attn = CausalSelfAttention(GPTConfig(n_layer=1, n_head=H, n_embd=C, head_dim=D, vocab_size=8, block_size=T, pos=pos)).to(device)
        with torch.no_grad():
            for prm in attn.bias.parameters():
                prm.add_(0.3 * torch.randn_like(prm))
            q = (F.normalize(torch.randn(1, H, T, D, device=device), dim=-1) * math.sqrt(D)).bfloat16()
            k = (F.normalize(torch.randn(1, H, T, D, device=device), dim=-1) * math.sqrt(D)).bfloat16()
            v = torch.randn(1, H, T, D, device=device).bfloat16()
            positions = torch.arange(T, device=device)
            qf, kf = attn.bias.features(torch.randn(1, T, C, device=device), q.float(), k.float(), positions, {})
            scale = 1 / math.sqrt(D)
            mask = causal_mask(positions, positions)
            ref = torch.softmax((scale * q.double() @ k.double().transpose(-1, -2) + attn.bias.dense(qf, kf).double())
                                .masked_fill(~mask, float("-inf")), -1) @ v.double()
            q_l, k_l = lift_qk(q, k, qf, kf, attn.bias, scale)
            v_l = F.pad(v, (0, q_l.shape[-1] - D))
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                out = F.scaled_dot_product_attention(q_l, k_l, v_l, is_causal=True, scale=scale)[..., :D]
                floor_out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            floor_ref = torch.softmax((scale * q.double() @ k.double().transpose(-1, -2)).masked_fill(~mask, float("-inf")), -1) @ v.double()
            floor = (floor_out.double() - floor_ref).abs().max().item()
            err = (out.double() - ref).abs().max().item()
        record(f"flash bf16 lifted {pos} T{T} width {q_l.shape[-1]}", err, 3 * floor + 1e-3, f"(bf16 floor {floor:.2e})")


def check_models(device, deadline):
    cases = [(pos, "auto") for pos in ["grape_ap", "rope+grape_ap", "alibi", "grape_a_q", "grape_a_k", "grape_a_qk", "fox"]]
    cases += [(pos, "lifted") for pos in ["alibi", "grape_a_qk", "fox"]]
    for pos, backend in cases:
        if time.monotonic() > deadline + 20:  # the models are quick: a little past the kernel checks' budget
            record(f"model bf16 {pos} {backend}", float("nan"), 0.0, "not run: time budget spent")
            continue
        T, prefill = (40, 33) if SMOKE else (600, 550)
        torch.manual_seed(0)
        cfg = GPTConfig(n_layer=2, n_head=4, n_embd=128, head_dim=64, vocab_size=97, block_size=T, pos=pos, kv_shift=True,
                        attn_backend=backend)
        fast = GPT(cfg).to(device)
        dense = GPT(dataclasses.replace(cfg, attn_backend="dense")).to(device)
        dense.load_state_dict(fast.state_dict())
        idx = torch.randint(0, 97, (2, T), device=device)
        low = torch.float16 if SMOKE else torch.bfloat16  # the interpreter's bf16 dot is wrong
        with torch.no_grad(), torch.autocast(device.type, dtype=low):
            a, b = fast(idx)[0], dense(idx)[0]
            cache = fast.new_cache(2, T)
            steps = [fast(idx[:, :prefill], cache=cache)[0]] + [fast(idx[:, t:t + 1], cache=cache)[0] for t in range(prefill, T)]
        spread = b.float().std().item()
        name = f"model {str(low)[6:]} {pos} {backend} ({fast.attention_backend})"
        record(f"{name}: logits vs dense", (a.float() - b.float()).abs().max().item(), 0.05 * spread + 0.02)
        record(f"{name}: KV-cache decode vs full forward", (torch.cat(steps, 1).float() - a.float()).abs().max().item(),
               0.05 * spread + 0.02)


def check_numeric_probe(device, deadline):
    """The start-up probe of attention_kernels/triton_probe.py on this GPU: each family in bf16 and fp16 at head dims 64 and
    128 against the portable path, its largest relative error beside the tolerance that would send "auto" to the
    portable path (so a margin that is too thin shows here, not as a warning in a user's run)."""
    from attention_kernels.triton_probe import PROBE_TOLERANCE, PROBES, KernelMismatch
    dtypes = (torch.float16,) if SMOKE else (torch.bfloat16, torch.float16)
    for family, probe in PROBES.items():
        for dtype in dtypes:
            for head_dim in ((16,) if SMOKE else (64, 128)):
                if time.monotonic() > deadline:
                    return
                try:
                    error = probe(dtype, device, head_dim, head_dim)
                except KernelMismatch as mismatch:
                    error, detail = float("inf"), str(mismatch)
                else:
                    detail = "relative to the reference's largest value; the probe's own tolerance is the limit"
                record(f"probe {family} {str(dtype)[6:]} d{head_dim}", error, PROBE_TOLERANCE[dtype], detail)


def main():
    ap = argparse.ArgumentParser(allow_abbrev=False, description="GPU correctness checks (bf16 Triton kernel, FlashAttention lift, models).")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "gpu_check.md"))
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run that only checks this script")
    ap.add_argument("--seconds", type=float, default=50.0,
                    help="time budget: the kernel check skips its remaining shapes past it (default 50)")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not SMOKE:
        sys.exit("gpu_check: needs a CUDA GPU (the CPU checks are the test suite: python -m pytest tests).")
    device = torch.device("cpu" if SMOKE else "cuda")
    start = time.monotonic()
    deadline = start + args.seconds
    for check in (check_numeric_probe, check_triton_kernel, check_decode, check_tile_kernel, check_lift_flash,
                  check_models, check_grouped_window):
        begun = time.monotonic()
        try:
            check(device, deadline)
        except Exception as error:  # keep going: one broken check must not hide the others' results
            RESULTS.append((f"{check.__name__} raised", float("nan"), 0.0, False, repr(error)[:300]))
            print(f"FAIL {check.__name__} raised {error!r}", flush=True)
        print(f"   {check.__name__}: {time.monotonic() - begun:.1f} s", flush=True)
    lines = ["# GPU correctness checks", "", f"`python scripts/gpu_check.py` on {'CPU (smoke run)' if SMOKE else torch.cuda.get_device_name(device)}, "
             f"torch {torch.__version__}. Errors are max absolute differences against fp64 references.", "",
             "| check | error | limit | ok | note |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {e:.3e} | {lim:.3e} | {'yes' if ok else '**NO**'} | {d} |" for n, e, lim, ok, d in RESULTS]
    failed = sum(not ok for *_, ok, _ in RESULTS)
    lines += ["", f"{len(RESULTS) - failed} of {len(RESULTS)} checks pass.", ""]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {args.out}: {len(RESULTS) - failed}/{len(RESULTS)} pass")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
