"""Compile the Triton kernels for a GPU architecture without a GPU and report what each one needs.

    python scripts/kernel_resources.py                        # default tiles, sm_90, bf16, D = 64 and 128
    python scripts/kernel_resources.py --arch 80 --dtype fp32 --head_dim 128
    python scripts/kernel_resources.py --separable 128,64,8,3,32,64,4,3 --grape_ap 64,32,4,2

Triton compiles ahead of time for any target (its bundled ptxas); cuobjdump then reads registers and
stack (spilled registers) per thread from the binary. A kernel whose shared memory exceeds the GPU's
(227 KiB per block on sm_90, 163 KiB on sm_80) fails to launch; one with stack spills to local memory.
This is how tile sizes are chosen on machines without a GPU; the timings still need one
(scripts/gpu_check.sh). Writes a markdown table with --out.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels import grape_ap_triton, separable_triton  # noqa: E402

TRITON_TYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# pointer arguments in the attention inputs' dtype (all other pointers are fp32)
INPUT_DTYPE_POINTERS = {"separable": {"Q", "K", "V", "OUT", "DO", "DQ", "DK", "DV_OUT"},
                        "grape_ap": {"Q", "K", "V", "OUT", "DO"}}
FLOAT_SCALARS = {"scale"}
INT_SCALARS = {"Tq", "Tk", "H", "D", "DV", "DP", "N_KTILES", "PASS_ROWS", "first_row", "end_row"}


def signature(kernel, family: str, dtype: str, constexprs: dict) -> dict:
    """Triton's signature of a @triton.jit kernel: the constexprs given, fp32 / i32 scalars, and pointers
    (every other argument)."""
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name in FLOAT_SCALARS:
            types[name] = "fp32"
        elif name in INT_SCALARS:
            types[name] = "i32"
        else:
            types[name] = "*" + (TRITON_TYPES[dtype] if name in INPUT_DTYPE_POINTERS[family] else "fp32")
    return types


def resources(kernel, family, dtype, constexprs, warps, stages, arch) -> str:
    source = ASTSource(fn=kernel, signature=signature(kernel, family, dtype, constexprs), constexprs=constexprs)
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                  options=dict(num_warps=warps, num_stages=stages))
    except Exception as error:  # out of shared memory, unsupported dot shapes
        return f"fails: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        dump = subprocess.run([tool, "--dump-resource-usage", cubin.name], capture_output=True, text=True).stdout
    fields = dict(part.split(":", 1) for line in dump.splitlines() if "REG:" in line
                  for part in line.split() if ":" in part and part.split(":", 1)[1].isdigit())
    return (f"{compiled.metadata.shared / 1024:.0f} KiB shared, {fields.get('REG', '?')} registers, "
            f"{fields.get('STACK', '?')} B stack" + ("" if fields.get("STACK") == "0" else " (spills)"))


def rows_for(family: str, config, head_dim: int, dtype: str, arch: int) -> list[tuple]:
    precision = "ieee" if dtype == "fp32" else "tf32"
    if family == "separable":
        fm, fn, fw, fs, short, long, bw, bs = config
        common = dict(BLOCK_D=head_dim, BLOCK_DV=head_dim, HAS_RATE=True, HAS_SUM=True, PRECISION=precision)
        kernels = [("_fwd", separable_triton._fwd, dict(BLOCK_M=fm, BLOCK_N=fn), fw, fs),
                   ("_bwd_query", separable_triton._bwd_query, dict(BLOCK_M=long, BLOCK_N=short), bw, bs),
                   ("_bwd_key", separable_triton._bwd_key, dict(BLOCK_M=short, BLOCK_N=long), bw, bs)]
    else:
        bm, bn, warps, stages = config[:4]
        common = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=head_dim, BLOCK_DV=head_dim, BLOCK_DP=16,
                      Z_PRECISION="tf32x3", QK_PRECISION=precision)
        kernels = [("_fwd", grape_ap_triton._fwd, {}, warps, stages),
                   ("_bwd_query", grape_ap_triton._bwd_query, {}, warps, stages),
                   ("_bwd_key", grape_ap_triton._bwd_key, dict(ACCUMULATE=True), warps, stages)]
    return [(family, name, tuple(config), head_dim, dtype,
             resources(kernel, family, dtype, {**common, **extra}, warps, stages, arch))
            for name, kernel, extra, warps, stages in kernels]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200, 80: A100)")
    ap.add_argument("--dtype", default="bf16", choices=sorted(TRITON_TYPES))
    ap.add_argument("--head_dim", default="64,128", help="comma-separated head dims")
    ap.add_argument("--separable", action="append", default=None, metavar="8 INTS",
                    help="a tile config of the separable kernel (default: its default_config); repeatable")
    ap.add_argument("--grape_ap", action="append", default=None, metavar="4 INTS",
                    help="a tile config of the GRAPE-AP kernel (default: its default_config); repeatable")
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    rows = []
    for head_dim in (int(d) for d in args.head_dim.split(",")):
        separable = [tuple(map(int, c.split(","))) for c in args.separable] if args.separable else \
            [separable_triton.default_config(head_dim, TORCH_DTYPES[args.dtype])]
        grape_ap = [tuple(map(int, c.split(","))) for c in args.grape_ap] if args.grape_ap else \
            [grape_ap_triton.default_config(head_dim)[:4]]
        for family, configs in (("separable", separable), ("grape_ap", grape_ap)):
            for config in configs:
                for row in rows_for(family, config, head_dim, args.dtype, args.arch):
                    rows.append(row)
                    print(" | ".join(map(str, row)), flush=True)
    lines = [f"# Triton kernel resources (sm_{args.arch}, {args.dtype}, compiled without a GPU)", "",
             f"`python scripts/kernel_resources.py {' '.join(argv if argv is not None else sys.argv[1:])}`, "
             f"triton {triton.__version__}. Registers and stack per thread from cuobjdump; stack > 0 means spills.", "",
             "| kernel | function | tiles | head dim | dtype | needs |", "|---|---|---|---|---|---|"]
    lines += [f"| {f} | `{n}` | {c} | {d} | {t} | {r} |" for f, n, c, d, t, r in rows]
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(args.out + ".tmp", args.out)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
