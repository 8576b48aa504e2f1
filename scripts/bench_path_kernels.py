"""GPU: GRAPE-AP attention (Triton) beside causal SDPA and the stick-breaking attention kernel, with the static
prediction of docs/kernel_resources.md beside each measured time.

    python scripts/bench_path_kernels.py [--T 4096,8192] [--batch 1,4] [--out docs/benchmarks_path_gpu.md]

Forward + backward of attention alone, bf16, H = 8, D = 128 (the medium config's heads), median of CUDA-event
timings (triton.testing.do_bench). Targets of this kernel: <= 1.5x causal SDPA and <= 1.2x stick-breaking.

Stick-breaking attention (Tan et al., ICLR 2025) has the same structure as GRAPE-AP (a running sum over keys
of a function of query and key inside the logits) and is timed when its Triton kernels import: the package
`stickbreaking_attention` (IBM's repository) or `fla.ops.stickbreaking_attn` (flash-linear-attention at the
commit that added it; its releases do not ship it). Without either the table says so in one line. To bring
it to an offline GPU machine: on a machine with network, `pip wheel --no-deps <a checkout of the
stickbreaking-attention repository>` (pure Python with Triton kernels), copy the .whl along with the code,
and `pip install --no-deps <the .whl>` there.

The prediction: the sum of the three GRAPE-AP kernels' predicted cycles per score element (inner loops,
static SASS count, docs/kernel_resources.md) x B·H·T(T+1)/2 score elements / (SMs x 1.98 GHz, the H100/H200
SXM boost clock). It is a lower bound: it ignores latency, the diagonal tiles and memory traffic.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CLOCK_HZ = 1.98e9


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


def predicted_cycles(head_dim: int, dtype: str = "bf16") -> float | None:
    """Sum over GRAPE-AP's three kernels of the predicted cycles per score element in docs/kernel_resources.md."""
    path = os.path.join(ROOT, "docs", "kernel_resources.md")
    if not os.path.exists(path):
        return None
    cycles = [float(m.group(1)) for m in re.finditer(
        rf"\| grape_ap \| `_\w+` \| {head_dim} \| {dtype} \|.*\| ([\d.]+) \(\w+\) \|", open(path).read())]
    return sum(cycles) if len(cycles) == 3 else None


def main():
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", default="4096,8192")
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head_dim", type=int, default=128)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks_path_gpu.md"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_path_kernels: needs a CUDA GPU")
    import triton
    from triton.testing import do_bench
    from kernels.grape_ap import grape_ap_triton
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
            leaves = [q, k, v, p, r]

            def timed(attention):
                def step():
                    attention().backward(grad)
                return do_bench(step, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
            sdpa = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            grape = timed(lambda: grape_ap_triton(q, k, v, p, r, slopes, 1 / math.sqrt(D)))
            sb = timed(lambda: peer[1](q, k, v)) if peer else None
            bound = cycles * B * H * T * (T + 1) / 2 / (sms * CLOCK_HZ) * 1e3 if cycles else None
            rows.append((B, T, sdpa, grape, sb, bound))
            print(f"B{B} T{T}: sdpa {sdpa:.2f} ms, grape_ap {grape:.2f} ms ({grape / sdpa:.2f}x)"
                  + (f", stick-breaking {sb:.2f} ms (grape_ap {grape / sb:.2f}x)" if sb else "")
                  + (f", predicted >= {bound:.2f} ms" if bound else ""), flush=True)
    lines = ["# GRAPE-AP attention beside causal SDPA and stick-breaking attention (GPU)", "",
             f"`python scripts/bench_path_kernels.py` on {torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
             f"triton {triton.__version__}; bf16, H = {H}, D = {D}, forward + backward, median ms. Targets: GRAPE-AP "
             "<= 1.5x SDPA and <= 1.2x stick-breaking. Predicted: the static lower bound from docs/kernel_resources.md "
             f"({cycles if cycles else 'n/a'} cycles per score element, {sms} SMs at 1.98 GHz).", "",
             ("Stick-breaking kernel: " + peer[0]) if peer else
             "Stick-breaking kernel: not installed (neither `stickbreaking_attention` nor `fla.ops.stickbreaking_attn` "
             "imports; see this script's docstring to bring it).", "",
             "| B | T | SDPA | GRAPE-AP | GRAPE-AP / SDPA | stick-breaking | GRAPE-AP / stick-breaking | predicted GRAPE-AP |",
             "|---|---|---|---|---|---|---|---|"]
    for B, T, sdpa, grape, sb, bound in rows:
        lines.append(f"| {B} | {T} | {sdpa:.2f} | {grape:.2f} | {grape / sdpa:.2f}x | "
                     + (f"{sb:.2f} | {grape / sb:.2f}x" if sb else "- | -") + f" | {f'{bound:.2f}' if bound else '-'} |")
    with open(args.out + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
