"""GPU: GRAPE-AP attention (Triton) beside causal SDPA, plain attention built the same way and the stick-breaking
attention kernel, with the static predictions of docs/kernel_resources.md beside the measured ratios.

    python bench/bench_path_kernels.py [--T 4096,8192] [--batch 1,4] [--out docs/benchmarks_path_gpu.md]

Forward + backward of attention alone, bf16, H = 8, D = 128 (the medium config's heads), median of CUDA-event
timings (triton.testing.do_bench). Targets of this kernel: <= 1.5x causal SDPA and <= 1.2x stick-breaking.

Stick-breaking attention (Tan et al., ICLR 2025) has the same structure as GRAPE-AP (a running sum over keys
of a function of query and key inside the logits) and is timed when its Triton kernels import: the package
`stickbreaking_attention` (IBM's repository) or `fla.ops.stickbreaking_attn` (flash-linear-attention at the
commit that added it; its releases do not ship it). Without either the table says so in one line. To bring
it to an offline GPU machine: on a machine with network, `pip wheel --no-deps <a checkout of the
stickbreaking-attention repository>` (pure Python with Triton kernels), copy the .whl along with the code,
and `pip install --no-deps <the .whl>` there.

Plain attention built the same way is the in-tile separable kernel without a bias (attention_kernels/separable_triton.py:
Triton, its own default tiles, the same two-kernel backward), the "plain" row of docs/kernel_resources.md. The
predictions, from docs/kernel_resources.json (`python tools/kernel_resources.py --out docs/kernel_resources.md`
writes both; no GPU needed): GRAPE-AP / plain attention = the ratio of their predicted cycles per score element,
forward + backward, the static estimate of GRAPE-AP / causal SDPA where SDPA runs a FlashAttention as fast as
the plain Triton kernel (the table's measured plain / SDPA column says how far that holds); and a lower bound for
GRAPE-AP's time, its cycles per element x B·H·T(T+1)/2 score elements / (SMs x 1.83 GHz). Both ignore latency,
the diagonal tiles and memory traffic beyond the SM.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CLOCK_HZ = 1.83e9  # the clock at which the datasheet's 989 TFLOP/s (bf16, dense) holds on an H100/H200 SXM


def stick_breaking():
    """(name, fn(q, k, v) for (B, H, T, D) inputs) of an importable stick-breaking kernel, or None."""
    try:
        from stickbreaking_attention.sb_attn import sb_attn
        return "stickbreaking_attention", lambda q, k, v: sb_attn(q, k, v, inv_temp=1 / math.sqrt(q.shape[-1]))[0]
    except ImportError:
        pass
    try:
        from fla.ops.stickbreaking_attn import sb_attn  # (B, T, H, D) layout
        return "fla.ops.stickbreaking_attn", lambda q, k, v: sb_attn(
            *(x.transpose(1, 2) for x in (q, k, v)), inv_temp=1 / math.sqrt(q.shape[-1]))[0].transpose(1, 2)
    except ImportError:
        return None


def predicted_cycles(head_dim: int, dtype: str = "bf16") -> dict | None:
    """{family: predicted cycles per score element, forward + backward} from docs/kernel_resources.json, or None
    where that file lacks this head dim and dtype."""
    path = os.path.join(ROOT, "docs", "kernel_resources.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["cycles_per_element"].get(f"{head_dim},{dtype}")


def report(path, rows, device_name, H, D, cycles, sms, peer) -> None:
    """Write the table so far (after every shape: a run cut short keeps what it measured)."""
    import triton
    predicted = cycles["grape_ap"] / cycles["plain"] if cycles else None
    lines = ["# GRAPE-AP attention beside causal SDPA, plain attention and stick-breaking attention (GPU)", "",
             f"`python bench/bench_path_kernels.py` on {device_name}, torch {torch.__version__}, "
             f"triton {triton.__version__}; bf16, H = {H}, D = {D}, forward + backward, median ms. Targets: GRAPE-AP "
             "<= 1.5x SDPA and <= 1.2x stick-breaking. Plain = the separable Triton kernel without a bias (FlashAttention "
             "built the same way). Predicted (static, docs/kernel_resources.md, tools/kernel_resources.py): GRAPE-AP / "
             f"plain = {f'{predicted:.2f}x' if predicted else 'n/a (no docs/kernel_resources.json for this head dim)'}, "
             "the estimate of GRAPE-AP / SDPA where SDPA is as fast as the plain Triton kernel; the lower bound "
             f"{cycles['grape_ap'] if cycles else 'n/a'} cycles per score element on {sms} SMs at {CLOCK_HZ / 1e9:.2f} GHz.",
             "", ("Stick-breaking kernel: " + peer[0]) if peer else
             "Stick-breaking kernel: not installed (neither `stickbreaking_attention` nor `fla.ops.stickbreaking_attn` "
             "imports; see this script's docstring to bring it).", "",
             "| B | T | SDPA | plain (Triton) | GRAPE-AP | GRAPE-AP / SDPA measured | GRAPE-AP / plain predicted | "
             "GRAPE-AP / plain measured | plain / SDPA | stick-breaking | GRAPE-AP / stick-breaking | GRAPE-AP lower bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for B, T, sdpa, plain, grape, sb, bound in rows:
        lines.append(f"| {B} | {T} | {sdpa:.2f} | {plain:.2f} | {grape:.2f} | **{grape / sdpa:.2f}x** | "
                     f"**{f'{predicted:.2f}x' if predicted else '-'}** | {grape / plain:.2f}x | {plain / sdpa:.2f}x | "
                     + (f"{sb:.2f} | {grape / sb:.2f}x" if sb else "- | -") + f" | {f'{bound:.2f}' if bound else '-'} |")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", default="4096,8192", help="comma-separated sequence lengths (default 4096,8192)")
    ap.add_argument("--batch", default="1,4", help="comma-separated batch sizes (default 1,4)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head_dim", type=int, default=128)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks_path_gpu.md"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_path_kernels: needs a CUDA GPU")
    from triton.testing import do_bench
    from attention_kernels.grape_ap import grape_ap_triton
    from attention_kernels.separable import separable_attention
    from positional import alibi_slopes
    device, H, D = torch.device("cuda"), args.heads, args.head_dim
    peer = stick_breaking()
    cycles = predicted_cycles(D)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = []
    for B in (int(b) for b in args.batch.split(",")):
        for T in (int(t) for t in args.T.split(",")):
            g = torch.Generator(device="cpu").manual_seed(0)
            q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
            q, k = F.normalize(q, dim=-1) * math.sqrt(D), F.normalize(k, dim=-1) * math.sqrt(D)  # QK-normed
            q, k, v = (x.to(device, torch.bfloat16).requires_grad_(True) for x in (q, k, v))
            p = (3 * torch.randn(B, H, T, 8, generator=g) / 8).to(device).requires_grad_(True)
            r = torch.randn(B, H, T, 8, generator=g)
            r = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True))).to(device).requires_grad_(True)
            slopes, grad = alibi_slopes(H).to(device), torch.randn(B, H, T, D, generator=g).to(device, torch.bfloat16)
            no_bias = torch.zeros(1, 1, T, 3, device=device)  # plain attention: the bias terms switched off
            leaves = [q, k, v, p, r]

            def timed(attention):
                def step():
                    attention().backward(grad)
                return do_bench(step, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
            sdpa = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            plain = timed(lambda: separable_attention(q, k, v, no_bias, no_bias, 1 / math.sqrt(D), has_rate=False,
                                                      has_sum=False))
            grape = timed(lambda: grape_ap_triton(q, k, v, p, r, slopes, 1 / math.sqrt(D)))
            sb = timed(lambda: peer[1](q, k, v)) if peer else None
            bound = cycles["grape_ap"] * B * H * T * (T + 1) / 2 / (sms * CLOCK_HZ) * 1e3 if cycles else None
            rows.append((B, T, sdpa, plain, grape, sb, bound))
            predicted = f"{cycles['grape_ap'] / cycles['plain']:.2f}x" if cycles else "n/a"
            print(f"B{B} T{T}: sdpa {sdpa:.2f} ms, plain Triton {plain:.2f} ms, grape_ap {grape:.2f} ms: "
                  f"GRAPE-AP / SDPA measured {grape / sdpa:.2f}x, predicted {predicted} (GRAPE-AP / plain Triton "
                  f"measured {grape / plain:.2f}x, plain / SDPA {plain / sdpa:.2f}x)"
                  + (f", stick-breaking {sb:.2f} ms (grape_ap {grape / sb:.2f}x)" if sb else "")
                  + (f", lower bound {bound:.2f} ms" if bound else ""), flush=True)
            report(args.out, rows, torch.cuda.get_device_name(device), H, D, cycles, sms, peer)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
