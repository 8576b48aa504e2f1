"""Compile the Triton kernels for a GPU architecture without a GPU: resources and a static cost table.

    python scripts/kernel_resources.py --out docs/kernel_resources.md    # sm_90, bf16 + fp16, D = 64 and 128
    python scripts/kernel_resources.py --arch 80 --dtype fp32 --head_dim 128
    PYTHONPATH=/tmp/triton-3.0.0 python scripts/kernel_resources.py --brief   # another Triton (see below)

Triton compiles ahead of time for any target with its bundled ptxas; cuobjdump (also in the Triton wheel)
then reads registers and stack (spilled registers) per thread and disassembles the machine code (SASS).
Pointers are compiled as 16-byte aligned, as a real launch specialises them.

The cost table counts the instructions of each kernel's inner loops in the SASS, per score element of a
tile: instructions issued per warp, times the warps, over BLOCK_M x BLOCK_N. A loop is a backward branch;
a kernel's cheapest loop is the one over tiles wholly below the diagonal (no mask work), which dominates
long sequences. Categories: tensor-core (HGMMA/HMMA), special-function (MUFU: exp2, log2, ...), fp32
arithmetic, conversions, shuffles (SHFL), shared and global memory, local memory (LDL/STL: spills),
barriers (BAR) and the rest (integer, predicates, moves). The predicted cycles per element take the
busiest of the Hopper SM's units at its datasheet rate per clock: 4 warp instructions issued, 4 fp32
(128 lanes), 0.5 MUFU (16 lanes), and the tensor cores' 1024 bf16/fp16 (512 tf32) multiply-adds per
warpgroup-cycle per sub-partition, i.e. M·N·K / 4096 cycles for one HGMMA.MxNxK (M·N·K / 2048 for tf32).
It is a lower bound that ignores latency and overlap; measured time needs a GPU (scripts/gpu_check.sh).

Other Triton versions: `pip install --no-deps --target DIR triton==X` and run with PYTHONPATH=DIR; the
script speaks the compiler API of Triton 3.0 to today's (three signature formats).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns while the default is unset

import torch  # noqa: E402
import triton  # noqa: E402

from kernels import grape_ap_triton, separable_triton  # noqa: E402

TRITON_TYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# pointer arguments in the attention inputs' dtype; the others are fp32, except GRAPE-AP's fp16 path operands
INPUT_DTYPE_POINTERS = {"separable": {"Q", "K", "V", "OUT", "DO", "DQ", "DK", "DV_OUT"},
                        "grape_ap": {"Q", "K", "V", "OUT", "DO"}}
FLOAT_SCALARS = {"scale", "qk_scale"}
INT_SCALARS = {"Tq", "Tk", "H", "N_KTILES", "PASS_ROWS", "first_row", "end_row"}
VERSION = tuple(int(part) for part in re.findall(r"\d+", triton.__version__)[:2])


def signature(kernel, family: str, dtype: str, constexprs: dict) -> dict:
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name in FLOAT_SCALARS:
            types[name] = "fp32"
        elif name in INT_SCALARS:
            types[name] = "i32"
        elif name in ("PZ", "RZ"):
            types[name] = "*fp16" if constexprs.get("SPLIT") else "*fp32"
        elif name in INPUT_DTYPE_POINTERS[family]:
            types[name] = "*" + TRITON_TYPES[dtype]
        else:
            types[name] = "*fp32"
    return types


def compile_kernel(kernel, family: str, dtype: str, constexprs: dict, warps: int, stages: int, arch: int):
    """triton.compile for a GPU that is not here, in the compiler API of the installed Triton."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    types = signature(kernel, family, dtype, constexprs)
    names = list(kernel.arg_names)
    aligned = [names.index(n) for n, t in types.items() if t.startswith("*")]
    if VERSION >= (3, 3):
        source = ASTSource(fn=kernel, signature=types, constexprs=constexprs,
                           attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    else:  # 3.0 - 3.2: the signature holds only the run-time arguments
        runtime = {n: t for n, t in types.items() if t != "constexpr"}
        if VERSION >= (3, 2):
            from triton.backends.compiler import AttrsDescriptor
            attrs = AttrsDescriptor.from_hints({i: 16 for i in aligned})
        else:
            from triton.compiler.compiler import AttrsDescriptor
            attrs = AttrsDescriptor(divisible_by_16=tuple(aligned), equal_to_1=())
        source = ASTSource(fn=kernel, signature=runtime, constants=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps, num_stages=stages))


def cuobjdump(cubin: bytes, *flags) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, *flags, f.name], capture_output=True, text=True, check=True).stdout


# --------------------------------------------------------------------------------------------------
# SASS loops and their cost

CATEGORIES = [("tensor", ("HGMMA", "HMMA")), ("MUFU", ("MUFU",)), ("fp32", ("FFMA", "FADD", "FMUL", "FMNMX", "FSEL",
              "FSETP", "FCHK")), ("convert", ("F2F", "F2FP", "I2F", "F2I", "I2FP", "F2IP", "HADD2", "HMUL2")),
              ("SHFL", ("SHFL",)), ("shared", ("LDS", "STS", "LDSM", "STSM")), ("global", ("LDG", "STG", "LDGSTS",
              "UTMALDG", "UBLKCP", "RED", "ATOM")), ("LDL/STL", ("LDL", "STL")), ("barrier", ("BAR",))]
FP32_PIPE = {"FFMA", "FADD", "FMUL"}  # 128 lanes per SM; the rest of the fp32 column shares the integer rate


def _opcode(text: str) -> str:
    words = re.sub(r"^@!?U?P[T\d]+\s+", "", text).split()
    return words[0] if words else ""


def sass_loops(sass: str) -> list[list[str]]:
    """The instruction texts of each loop of a disassembled function (a backward branch closes one)."""
    code = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", sass)]
    loops = []
    for address, text in code:
        target = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            loops.append([t for a, t in code if start <= a <= address])
    return loops


def loop_cost(body: list[str], warps: int, elements: int) -> dict:
    """Warp instructions per score element by category, and the predicted cycles per element."""
    per_element = warps / elements
    counts = collections.Counter()
    tensor_cycles = 0.0
    fp32_pipe = 0
    for text in body:
        op = _opcode(text)
        base = op.split(".")[0]
        category = next((name for name, ops in CATEGORIES if base in ops), "other")
        counts[category] += 1
        counts["total"] += 1
        fp32_pipe += base in FP32_PIPE
        shape = re.search(r"GMMA\.(\d+)x(\d+)x(\d+)", op)
        if shape:  # one warpgroup instruction: M·N·K multiply-adds at 4 x 1024 (bf16/fp16) per cycle
            m, n, k = map(int, shape.groups())
            tensor_cycles += m * n * k / (2048 if ".TF32" in op else 4096) / 4  # counted once per warp of 4
    row = {name: counts[name] * per_element for name, _ in CATEGORIES + [("other", ()), ("total", ())]}
    cycles = {"issue": counts["total"] * per_element / 4, "fp32": fp32_pipe * per_element / 4,
              "MUFU": counts["MUFU"] * per_element / 0.5, "tensor": tensor_cycles * per_element}
    row["cycles"] = max(cycles.values())
    row["bound"] = max(cycles, key=cycles.get)
    return row


# --------------------------------------------------------------------------------------------------


def kernels_of(family: str, config, head_dim: int, dtype: str) -> list[tuple]:
    """(name, kernel, constexprs, warps, stages, elements per loop iteration) of one family's kernels."""
    half = dtype != "fp32"
    if family == "separable":
        fm, fn, fw, fs, short, long, bw, bs = config
        common = dict(D=head_dim, DV=head_dim, BLOCK_D=head_dim, BLOCK_DV=head_dim, HAS_RATE=True, HAS_SUM=True,
                      PRECISION="tf32" if half else "ieee")
        return [("_fwd", separable_triton._fwd, dict(common, BLOCK_M=fm, BLOCK_N=fn), fw, fs, fm * fn),
                ("_bwd_query", separable_triton._bwd_query, dict(common, BLOCK_M=long, BLOCK_N=short), bw, bs,
                 long * short),
                ("_bwd_key", separable_triton._bwd_key, dict(common, BLOCK_M=short, BLOCK_N=long), bw, bs, long * short)]
    (fm, fn, fw, fs), (qm, qn, qw, qs), (km, kn, kw, ks) = config[0:4], config[4:8], config[8:12]
    common = dict(D=head_dim, DV=head_dim, BLOCK_D=head_dim, BLOCK_DV=head_dim, KZ=32 if half else 16, SPLIT=half,
                  FAST_LOG2=half, QK_PRECISION="tf32" if half else "ieee")
    backward = dict(common, DP=8, BLOCK_DP=16)
    return [("_fwd", grape_ap_triton._fwd, dict(common, BLOCK_M=fm, BLOCK_N=fn), fw, fs, fm * fn),
            ("_bwd_query", grape_ap_triton._bwd_query, dict(backward, BLOCK_M=qm, BLOCK_N=qn, RATIO=kn // qn), qw, qs,
             qm * qn),
            ("_bwd_key", grape_ap_triton._bwd_key, dict(backward, BLOCK_M=km, BLOCK_N=kn, ACCUMULATE=True), kw, ks,
             km * kn)]


def measure_one(family, config, head_dim, dtype, arch, index) -> dict:
    _, kernel, constexprs, warps, stages, elements = kernels_of(family, config, head_dim, dtype)[index]
    row = {}
    try:
        compiled = compile_kernel(kernel, family, dtype, constexprs, warps, stages, arch)
    except Exception as error:  # out of shared memory, a language feature this Triton lacks, ...
        return dict(error=f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[-1][:150]}")
    usage = cuobjdump(compiled.asm["cubin"], "--dump-resource-usage")
    fields = dict(re.findall(r"(REG|STACK):(\d+)", usage))
    row.update(shared_kib=compiled.metadata.shared / 1024, registers=int(fields.get("REG", -1)),
               stack=int(fields.get("STACK", -1)))
    loops = sass_loops(cuobjdump(compiled.asm["cubin"], "-sass"))
    if loops:
        costs = [loop_cost(body, warps, elements) for body in loops]
        row["interior"] = min(costs, key=lambda c: c["total"])
        row["diagonal"] = max(costs, key=lambda c: c["total"])
        row["loops"] = len(loops)
    return row


def measure(family, config, head_dim, dtype, arch) -> list[dict]:
    """Each kernel compiled in a child process of its own: some Triton versions abort the whole process on
    a kernel they cannot build (a failed C++ assertion), which must not end the table."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    from multiprocessing import get_context
    rows = []
    for index, (name, _, _, warps, _, _) in enumerate(kernels_of(family, config, head_dim, dtype)):
        row = dict(family=family, kernel=name, config=tuple(config), head_dim=head_dim, dtype=dtype, warps=warps)
        with ProcessPoolExecutor(1, mp_context=get_context("fork")) as pool:
            try:
                row.update(pool.submit(measure_one, family, config, head_dim, dtype, arch, index).result())
            except BrokenProcessPool:
                row["error"] = "the compiler aborted the process (a failed assertion in Triton's C++ passes)"
        rows.append(row)
    return rows


def resource_text(row) -> str:
    if "error" in row:
        return f"fails: {row['error']}"
    return (f"{row['shared_kib']:.0f} KiB shared, {row['registers']} registers, {row['stack']} B stack"
            + ("" if row["stack"] == 0 else " (spills)"))


PREDICT_T, SMS, CLOCK_HZ = 8192, 132, 1.98e9
TENSOR_FLOPS_PER_CYCLE = 4096  # dense bf16 per SM: 989 TFLOP/s / (132 SMs x 1.83 GHz)
COST_COLUMNS = ["total", "tensor", "MUFU", "fp32", "convert", "SHFL", "shared", "global", "LDL/STL", "barrier", "other"]


def tables(rows, args, command) -> list[str]:
    lines = [f"# Triton kernel resources and static cost (sm_{args.arch}, compiled without a GPU)", "",
             f"`{command}`, triton {triton.__version__}. Registers and stack per thread from cuobjdump (stack > 0 "
             "means spills); per score element: warp instructions in the inner loop x warps / (BLOCK_M x BLOCK_N) "
             "(scripts/kernel_resources.py says how they are counted and what the cycles assume).", "",
             "## Resources", "", "| kernel | function | tiles | head dim | dtype | needs |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['family']} | `{r['kernel']}` | {r['config']} | {r['head_dim']} | {r['dtype']} | {resource_text(r)} |"
              for r in rows]
    lines += ["", "## Inner loop over tiles below the diagonal, per score element", "",
              "| kernel | function | head dim | dtype | " + " | ".join(COST_COLUMNS) + " | cycles (bound) |",
              "|---|---|---|---|" + "---|" * (len(COST_COLUMNS) + 1)]
    for r in rows:
        if "interior" in r:
            c = r["interior"]
            lines.append(f"| {r['family']} | `{r['kernel']}` | {r['head_dim']} | {r['dtype']} | "
                         + " | ".join(f"{c[name]:.2f}" for name in COST_COLUMNS) + f" | {c['cycles']:.3f} ({c['bound']}) |")
    lines += ["", "## GRAPE-AP over the separable kernel (same head dim and dtype)", "",
              "| head dim | dtype | pass | instructions GRAPE-AP / separable | predicted cycles GRAPE-AP / separable |",
              "|---|---|---|---|---|"]
    by_key = {(r["family"], r["kernel"], r["head_dim"], r["dtype"]): r for r in rows if "interior" in r}
    for head_dim in sorted({r["head_dim"] for r in rows}):
        for dtype in sorted({r["dtype"] for r in rows}):
            for label, names in (("forward", ["_fwd"]), ("backward", ["_bwd_query", "_bwd_key"]),
                                 ("forward + backward", ["_fwd", "_bwd_query", "_bwd_key"])):
                try:
                    gap = [by_key[("grape_ap", n, head_dim, dtype)]["interior"] for n in names]
                    sep = [by_key[("separable", n, head_dim, dtype)]["interior"] for n in names]
                except KeyError:
                    continue
                ratio = sum(c["total"] for c in gap) / sum(c["total"] for c in sep)
                cycles = sum(c["cycles"] for c in gap) / sum(c["cycles"] for c in sep)
                lines.append(f"| {head_dim} | {dtype} | {label} | {ratio:.2f}x | {cycles:.2f}x |")
    lines += ["", "## What it predicts for time", "",
              f"Lower bounds for one attention layer, forward + backward, causal, B = 1, H = 8, T = {PREDICT_T}: "
              f"cycles per element x B·H·T(T+1)/2 elements / ({SMS} SMs x {CLOCK_HZ / 1e9:.2f} GHz, an H100/H200 SXM at "
              "boost clock). The tensor-core floor is any exact attention's: five T x T x D products (forward "
              "q·kᵀ and P·v; backward q·kᵀ again, dO·vᵀ, and the three gradient products counted as three) at the "
              "datasheet bf16 rate. Issue-bound kernels (the cycles column says which unit binds) run above "
              "their floor by latency and stalls; the ratio between the two Triton kernels is the prediction to "
              "hold against the GPU (scripts/gpu_check.sh measures it).", "",
              "| head dim | dtype | GRAPE-AP (ms) | separable kernel (ms) | tensor-core floor (ms) |", "|---|---|---|---|---|"]
    elements = 8 * PREDICT_T * (PREDICT_T + 1) / 2
    for head_dim in sorted({r["head_dim"] for r in rows}):
        for dtype in sorted({r["dtype"] for r in rows}):
            times = []
            for family in ("grape_ap", "separable"):
                found = [by_key.get((family, n, head_dim, dtype)) for n in ("_fwd", "_bwd_query", "_bwd_key")]
                times.append(sum(r["interior"]["cycles"] for r in found) * elements / (SMS * CLOCK_HZ) * 1e3
                             if all(found) else float("nan"))
            floor = 5 * 2 * head_dim * elements / (TENSOR_FLOPS_PER_CYCLE * SMS * CLOCK_HZ) * 1e3
            lines.append(f"| {head_dim} | {dtype} | {times[0]:.2f} | {times[1]:.2f} | {floor:.2f} |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200, 80: A100)")
    ap.add_argument("--dtype", default="bf16,fp16", help="comma-separated: bf16, fp16, fp32")
    ap.add_argument("--head_dim", default="64,128", help="comma-separated head dims")
    ap.add_argument("--separable", action="append", default=None, metavar="8 INTS",
                    help="a tile config of the separable kernel (default: its default_config); repeatable")
    ap.add_argument("--grape_ap", action="append", default=None, metavar="9 INTS",
                    help="a tile config of the GRAPE-AP kernels (default: their default_config); repeatable")
    ap.add_argument("--brief", action="store_true", help="one line per kernel: builds or not, registers, stack")
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = ap.parse_args(argv)
    rows = []
    for dtype in args.dtype.split(","):
        for head_dim in (int(d) for d in args.head_dim.split(",")):
            separable = [tuple(map(int, c.split(","))) for c in args.separable] if args.separable else \
                [separable_triton.default_config(head_dim, TORCH_DTYPES[dtype])]
            grape_ap = [tuple(map(int, c.split(","))) for c in args.grape_ap] if args.grape_ap else \
                [grape_ap_triton.default_config(head_dim, TORCH_DTYPES[dtype])]
            for family, configs in (("separable", separable), ("grape_ap", grape_ap)):
                for config in configs:
                    for row in measure(family, config, head_dim, dtype, args.arch):
                        rows.append(row)
                        cost = f" | {row['interior']['total']:.2f} instructions/element" if "interior" in row else ""
                        print(f"triton {triton.__version__} | {family} {row['kernel']} D{head_dim} {dtype} | "
                              f"{resource_text(row)}{'' if args.brief else cost}", flush=True)
    failed = sum("error" in r for r in rows)
    spilled = sum(r.get("stack", 0) > 0 for r in rows)
    print(f"triton {triton.__version__}: {len(rows) - failed} of {len(rows)} kernels build, {spilled} spill")
    if args.out:
        command = "python scripts/kernel_resources.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(args.out + ".tmp", "w") as f:
            f.write("\n".join(tables(rows, args, command.strip())) + "\n")
        os.replace(args.out + ".tmp", args.out)
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
