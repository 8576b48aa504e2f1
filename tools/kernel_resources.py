"""Compile the Triton kernels for a GPU architecture without a GPU: resources and a static cost table.

    python tools/kernel_resources.py --out docs/kernel_resources.md    # sm_90, bf16 + fp16, D = 64 and 128
    python tools/kernel_resources.py --arch 80 --dtype fp32 --head_dim 128
    PYTHONPATH=/tmp/triton-3.0.0 python tools/kernel_resources.py --brief   # another Triton (see below)

Triton compiles ahead of time for any target with its bundled ptxas; cuobjdump (also in the Triton wheel)
then reads registers and stack (spilled registers) per thread and disassembles the machine code (SASS).
Pointers are compiled as 16-byte aligned, as a real launch specialises them.

The cost table counts the instructions of each kernel's inner loops in the SASS, per score element of a
tile: instructions issued per warp, times the warps, over BLOCK_M x BLOCK_N. A loop is a backward branch;
a kernel's cheapest loop is the one over tiles wholly below the diagonal (no mask work), which dominates
long sequences. Besides the instruction categories, two operation counts per score element: MUFU
operations (lanes: exp2, log2, reciprocal, ...) and tensor-core multiply-adds (from each HGMMA's M x N x K,
a warpgroup instruction counted once per warp as a quarter, and each HMMA's 16 x 8 x K).

The predicted cycles per element take the busiest unit of a Hopper SM (H100/H200 SXM) at these rates per
clock per SM:
  issue   4 warp instructions (one per sub-partition), every instruction;
  fma     128 lanes: FFMA, FADD, FMUL, the packed half-precision HFMA2/HADD2/HMUL2 (IMAD at half rate);
  alu     64 lanes: compare, min/max, select, logic, integer add and shift, F2FP (fast fp32 -> 16-bit);
  xu      16 lanes: MUFU (exp2, log2, rcp, ...) and the other conversions (F2F, I2F, F2I, FRND);
  tensor  2,048 bf16/fp16 multiply-adds (dense: 989 TFLOP/s = 132 SMs x 1.83 GHz x 4,096 FLOPs), tf32 at half
          that; mma.sync (HMMA) at HMMA_FRACTION of it (it cannot keep Hopper's tensor cores busy: reported at
          about half of wgmma's rate on H100/H800, not measured here).
The lane rates are the CUDA Programming Guide's arithmetic-instruction throughputs for compute capability 9.0.
It is a lower bound that ignores latency, dependencies and overlap; measured time needs a GPU
(scripts/gpu_check.sh measures the ratios this table predicts).

Three families: GRAPE-AP (attention_kernels/grape_ap_triton.py), the in-tile separable-bias kernel with both bias
terms (attention_kernels/separable_triton.py: ALiBi, GRAPE-A, FoX) and the same kernel with no bias ("plain"): a
FlashAttention built the same way (Triton, same tiles, same two-kernel backward), the baseline the ratio
table divides by.

Other Triton versions: `pip install --no-deps --target DIR triton==X` and run with PYTHONPATH=DIR; the
script speaks the compiler API of Triton 3.0 to today's (three signature formats).
"""
from __future__ import annotations

import argparse
import collections
import json
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

from attention_kernels import grape_ap_triton, separable_triton  # noqa: E402

FAMILIES = ("grape_ap", "separable", "plain")
TRITON_TYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# pointer arguments in the attention inputs' dtype; the others are fp32, except GRAPE-AP's fp16 path operands
SEPARABLE_POINTERS = {"Q", "K", "V", "OUT", "DO", "DQ", "DK", "DV_OUT"}
INPUT_DTYPE_POINTERS = {"separable": SEPARABLE_POINTERS, "plain": SEPARABLE_POINTERS,
                        "grape_ap": {"Q", "K", "V", "OUT", "DO"}}
FLOAT_SCALARS = {"scale", "qk_scale"}
INT_SCALARS = {"Tq", "Tk", "H", "window", "N_KTILES", "PASS_ROWS", "first_row", "end_row"}
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
        elif family == "grape_ap" and name in ("PZ", "RZ"):
            types[name] = "*fp16" if constexprs.get("SPLIT") else "*fp32"
        elif family == "grape_ap" and name in ("PP", "RR"):
            types[name] = "*bf16" if constexprs.get("SPLIT") else "*fp32"
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
              "FSETP", "FCHK")), ("convert", ("F2F", "F2FP", "I2F", "F2I", "I2FP", "F2IP", "HADD2", "HMUL2", "FRND")),
              ("SHFL", ("SHFL",)), ("shared", ("LDS", "STS", "LDSM", "STSM")), ("global", ("LDG", "STG", "LDGSTS",
              "UTMALDG", "UBLKCP", "RED", "ATOM")), ("LDL/STL", ("LDL", "STL")), ("barrier", ("BAR",))]
# Hopper SM, per clock (see the module docstring): lanes per pipe, and which opcodes go where
SM_LANES = {"fma": 128, "alu": 64, "xu": 16, "shfl": 32}
PIPES = {"fma": {"FFMA": 1, "FADD": 1, "FMUL": 1, "HFMA2": 1, "HADD2": 1, "HMUL2": 1, "IMAD": 2},
         "alu": dict.fromkeys(("FMNMX", "FSEL", "FSETP", "FCHK", "ISETP", "IADD3", "VIADD", "IMNMX", "VIMNMX", "LOP3",
                               "SHF", "SEL", "PRMT", "LEA", "F2FP", "PLOP3", "P2R", "R2P", "IABS", "I2FP", "F2IP"), 1),
         "xu": dict.fromkeys(("MUFU", "F2F", "I2F", "F2I", "FRND", "POPC", "FLO", "BREV"), 1),
         "shfl": {"SHFL": 1}}
TENSOR_MACS_PER_CLOCK = 2048  # dense bf16/fp16 per SM: 989 TFLOP/s / (132 SMs x 1.83 GHz) / 2
HMMA_FRACTION = 0.5  # mma.sync's share of that rate on Hopper (a lead, see the docstring)
ISSUE_PER_CLOCK = 4  # warp instructions per SM (one scheduler per sub-partition)
SHARED_BYTES_PER_CLOCK = 128  # the SM's shared memory / L1 data path (local-memory spills take it too)


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


def tensor_macs(op: str) -> tuple[float, float]:
    """(multiply-adds, tensor-core cycles at one SM's rate) of one warp's tensor-core instruction.
    HGMMA.MxNxK is a warpgroup's product, issued by each of its 4 warps: a quarter each. HMMA.16816 is one
    warp's m16n8k16."""
    gmma = re.search(r"GMMA\.(\d+)x(\d+)x(\d+)", op)
    mma = re.match(r"HMMA\.16(8)(\d+)", op)
    if gmma:
        m, n, k = map(int, gmma.groups())
        macs, rate = m * n * k / 4, TENSOR_MACS_PER_CLOCK
    elif mma:
        macs, rate = 16 * int(mma.group(1)) * int(mma.group(2)), TENSOR_MACS_PER_CLOCK * HMMA_FRACTION
    else:
        return 0.0, 0.0
    if ".TF32" in op:
        rate /= 2
    return macs, macs / rate


def shared_bytes(op: str, operands: str = "") -> float:
    """Bytes one warp instruction moves through the SM's shared memory / L1 data path (128 bytes per clock):
    shared and local (spill) loads and stores by their width, ldmatrix/stmatrix by their 8x8 matrices,
    asynchronous copies into shared memory, and a wgmma's operands read from shared memory (B always, A
    where it is a descriptor rather than registers; a quarter per warp of the warpgroup)."""
    base = op.split(".")[0]
    gmma = re.search(r"GMMA\.(\d+)x(\d+)x(\d+)", op)
    if gmma:
        m, n, k = map(int, gmma.groups())
        element = 4 if ".TF32" in op else 1 if re.search(r"\.E[45]M", op) else 2
        a_from_shared = operands.split(",")[1].strip().startswith("gdesc") if operands.count(",") >= 2 else True
        return (n * k + (m * k if a_from_shared else 0)) * element / 4
    if base in ("LDS", "STS", "LDL", "STL", "LDGSTS"):
        width = next((int(w) for w in re.findall(r"\.(128|64|32|16|8)\b", op)), 32)
        return 32 * max(width, 32) // 8
    if base in ("LDSM", "STSM"):
        matrices = re.search(r"\.M(?:T)?88(?:\.(\d))?", op)
        return 128 * int(matrices.group(1) or 1) if matrices else 128
    return 0


def loop_cost(body: list[str], warps: int, elements: int) -> dict:
    """Per score element: warp instructions by category, MUFU operations, tensor-core multiply-adds, the
    cycles each unit of the SM needs for them, and the largest of those (the predicted cycles)."""
    per_element = warps / elements
    counts = collections.Counter()
    lanes = collections.Counter()
    macs = tensor_cycles = shared = 0.0
    for text in body:
        op = _opcode(text)
        base = op.split(".")[0]
        category = next((name for name, ops in CATEGORIES if base in ops), "other")
        counts[category] += 1
        counts["total"] += 1
        for pipe, ops in PIPES.items():
            lanes[pipe] += 32 * ops.get(base, 0)
        shared += shared_bytes(op, re.sub(r"^@!?U?P[T\d]+\s+", "", text).split(None, 1)[-1])
        instruction_macs, instruction_cycles = tensor_macs(op)
        macs += instruction_macs
        tensor_cycles += instruction_cycles
    row = {name: counts[name] * per_element for name, _ in CATEGORIES + [("other", ()), ("total", ())]}
    # each opcode as a thread executes it per score element (a warp instruction serves 32 lanes)
    row["opcodes"] = {op: 32 * n * per_element for op, n in collections.Counter(map(_opcode, body)).most_common()}
    row["MUFU ops"] = 32 * counts["MUFU"] * per_element
    row["tensor MACs"] = macs * per_element
    cycles = {"issue": counts["total"] * per_element / ISSUE_PER_CLOCK, "tensor": tensor_cycles * per_element,
              "shared": shared * per_element / SHARED_BYTES_PER_CLOCK}
    cycles.update({pipe: lanes[pipe] * per_element / SM_LANES[pipe] for pipe in SM_LANES})
    row["unit cycles"] = cycles
    row["cycles"] = max(cycles.values())
    row["bound"] = max(cycles, key=cycles.get)
    return row


# --------------------------------------------------------------------------------------------------


def kernels_of(family: str, config, head_dim: int, dtype: str, windowed: bool = False) -> list[tuple]:
    """(name, kernel, constexprs, warps, stages, elements per loop iteration) of one family's kernels, multi-head
    (one query head per key/value head), with a sliding window where windowed."""
    if family in ("separable", "plain"):  # plain: the same kernel without a bias, FlashAttention built alike
        fm, fn, fw, fs, short, long, bw, bs = config
        biased = family == "separable"
        common = dict(D=head_dim, DV=head_dim, BLOCK_D=head_dim, BLOCK_DV=head_dim, HAS_RATE=biased, HAS_SUM=biased,
                      PRECISION="tf32" if dtype != "fp32" else "ieee", GROUP=1, KF_GROUP=1, WINDOWED=windowed)
        return [("_fwd", separable_triton._fwd, dict(common, BLOCK_M=fm, BLOCK_N=fn), fw, fs, fm * fn),
                ("_bwd_query", separable_triton._bwd_query, dict(common, BLOCK_M=long, BLOCK_N=short), bw, bs,
                 long * short),
                ("_bwd_key", separable_triton._bwd_key, dict(common, BLOCK_M=short, BLOCK_N=long), bw, bs, long * short)]
    return grape_ap_triton.kernel_builds(head_dim, head_dim, 8, TORCH_DTYPES[dtype], config, windowed=windowed)


def measure_one(family, config, head_dim, dtype, arch, index, windowed=False) -> dict:
    _, kernel, constexprs, warps, stages, elements = kernels_of(family, config, head_dim, dtype, windowed)[index]
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


def measure(family, config, head_dim, dtype, arch, windowed=False) -> list[dict]:
    """Each kernel compiled in a child process of its own: some Triton versions abort the whole process on
    a kernel they cannot build (a failed C++ assertion), which must not end the table."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    from multiprocessing import get_context
    rows = []
    for index, (name, _, sizes, warps, _, _) in enumerate(kernels_of(family, config, head_dim, dtype, windowed)):
        row = dict(family=family, kernel=name, config=tuple(config), head_dim=head_dim, dtype=dtype, warps=warps,
                   windowed=windowed, tile=(sizes["BLOCK_M"], sizes["BLOCK_N"]), ratio=sizes.get("RATIO", 1))
        with ProcessPoolExecutor(1, mp_context=get_context("fork")) as pool:
            try:
                row.update(pool.submit(measure_one, family, config, head_dim, dtype, arch, index, windowed).result())
            except BrokenProcessPool:
                row["error"] = "the compiler aborted the process (a failed assertion in Triton's C++ passes)"
        rows.append(row)
    return rows


def resource_text(row) -> str:
    if "error" in row:
        return f"fails: {row['error']}"
    return (f"{row['shared_kib']:.0f} KiB shared, {row['registers']} registers, {row['stack']} B stack"
            + ("" if row["stack"] == 0 else " (spills)"))


PREDICT_T, SMS, CLOCK_HZ = 8192, 132, 1.83e9  # the clock at which the datasheet's 989 TFLOP/s holds
COST_COLUMNS = ["total", "MUFU ops", "tensor MACs", "fp32", "convert", "shared", "global", "LDL/STL", "other"]
UNITS = ["issue", "fma", "alu", "xu", "shared", "tensor"]
PASSES = (("forward", ["_fwd"]), ("backward", ["_bwd_query", "_bwd_key"]),
          ("forward + backward", ["_fwd", "_bwd_query", "_bwd_key"]))


def pass_sums(by_key, family, head_dim, dtype, names) -> dict | None:
    """A pass's per-element totals over its kernels (instructions, MUFU ops, MACs, predicted cycles)."""
    try:
        costs = [by_key[(family, n, head_dim, dtype)]["interior"] for n in names]
    except KeyError:
        return None
    return {key: sum(c[key] for c in costs) for key in ("total", "MUFU ops", "tensor MACs", "cycles")}


def predictions(rows) -> dict:
    """{(head_dim, dtype): {pass: {family: sums}}} for every pass that all three families have."""
    by_key = {(r["family"], r["kernel"], r["head_dim"], r["dtype"]): r for r in rows if "interior" in r}
    out = {}
    for head_dim, dtype in sorted({(r["head_dim"], r["dtype"]) for r in rows}):
        for label, names in PASSES:
            sums = {family: pass_sums(by_key, family, head_dim, dtype, names) for family in FAMILIES}
            if all(sums.values()):
                out.setdefault((head_dim, dtype), {})[label] = sums
    return out


def tile_counts(T: int, window: int | None, block_m: int, block_n: int, ratio: int = 1, path: bool = False
                ) -> tuple[int, int]:
    """(unmasked, masked) tiles of BLOCK_M queries x BLOCK_N keys that attention over T tokens visits: a tile is
    visited when any query in it sees any key in it (keys t - window + 1 ... t, or 0 ... t without a window) and
    unmasked when every query sees every key, as the kernels' loop bounds choose them (the query-major loops by
    key_tile_range and window_tile_range, the key-major ones by their query-tile range). ratio: the GRAPE-AP
    query-major kernel ends at the right edge of a key-major tile (ratio of its own). path: the GRAPE-AP
    key-major kernel's unmasked tiles also need every ψ of the tile in each row's path sum (keys from
    t - window + 2)."""
    unmasked = masked = 0
    for first_t in range(0, T, block_m):
        last_t = min(first_t + block_m - 1, T - 1)
        n_full, end = (first_t + 1) // block_n, last_t // block_n + 1
        lo = lo_full = 0
        if window:
            lo = max(first_t - window + 1, 0) // block_n
            lo_full = min(max(-(-max(last_t - window + 1 + path, 0) // block_n), lo), n_full)
        end = -(-end // ratio) * ratio
        unmasked += n_full - lo_full
        masked += end - n_full + lo_full - lo
    return unmasked, masked


def window_costs(rows, window: int, T: int = PREDICT_T) -> dict:
    """{(head_dim, dtype): {family: (forward tiles window / full, predicted cycles forward + backward window /
    full)}}: each kernel's tiles at its interior loop's cycles per element (unmasked) or its masked loop's, the
    full-attention builds for full attention and the windowed builds for the window."""
    built = {(r["family"], r["kernel"], r["head_dim"], r["dtype"], r["windowed"]): r for r in rows if "interior" in r}
    out = {}
    for (family, kernel, head_dim, dtype, windowed), row in built.items():
        if windowed or (family, kernel, head_dim, dtype, True) not in built:
            continue
        totals = out.setdefault((head_dim, dtype), {}).setdefault(family, dict(tiles=[0, 0], cycles=[0.0, 0.0]))
        block_m, block_n = row["tile"]
        path = family == "grape_ap" and kernel == "_bwd_key"
        for slot, (w, build) in enumerate(((None, row), (window, built[family, kernel, head_dim, dtype, True]))):
            unmasked, masked = tile_counts(T, w, block_m, block_n, row["ratio"], path)
            if kernel == "_fwd":
                totals["tiles"][slot] = unmasked + masked
            totals["cycles"][slot] += block_m * block_n * (unmasked * build["interior"]["cycles"]
                                                           + masked * build["diagonal"]["cycles"])
    return {key: {family: (t["tiles"][1] / t["tiles"][0], t["cycles"][1] / t["cycles"][0])
                  for family, t in families.items() if len(rows) and t["tiles"][0]}
            for key, families in out.items()}


def window_section(rows, window: int, T: int = PREDICT_T) -> list[str]:
    visible = (T * window - window * (window - 1) / 2) / (T * (T + 1) / 2)
    lines = ["", f"## A sliding window of {window:,} keys at T = {T:,}, over full causal attention", "",
             f"Each kernel built with the window (`WINDOWED`) and without; tiles wholly outside every row's window "
             f"are skipped by the loop bounds, the tiles across the window's edge take the mask. Predicted cycles: "
             f"each kernel's unmasked tiles at its interior loop's cycles per element, masked tiles at its masked "
             f"loop's (the costliest loop), summed over forward and backward kernels (B = 1, one head, T = {T:,}; "
             f"GRAPE-AP's query-major backward ends at a key-major tile's edge). The keys a query sees: "
             f"{visible:.3f} of full attention's score elements.", "",
             "| head dim | dtype | family | forward score tiles, window / full | predicted cycles fwd + bwd, window "
             "/ full | windowed builds (registers, stack per kernel) |", "|---|---|---|---|---|---|"]
    costs = window_costs(rows, window, T)
    resources = {}
    for r in rows:
        if r.get("windowed"):
            resources.setdefault((r["head_dim"], r["dtype"], r["family"]), []).append(
                f"`{r['kernel']}` " + (f"{r['registers']}, {r['stack']} B" if "error" not in r else "fails"))
    for (head_dim, dtype), families in costs.items():
        for family, (tiles, cycles) in families.items():
            lines.append(f"| {head_dim} | {dtype} | {family} | {tiles:.3f} | **{cycles:.3f}** | "
                         f"{'; '.join(resources.get((head_dim, dtype, family), []))} |")
    return lines


def tables(rows, args, command) -> list[str]:
    windowed_rows = rows
    rows = [r for r in rows if not r.get("windowed")]
    lines = [f"# Triton kernel resources and static cost (sm_{args.arch}, compiled without a GPU)", "",
             f"`{command}`, triton {triton.__version__}. Everything here is a prediction from the machine code; "
             "`bash scripts/gpu_check.sh` measures the ratios on a GPU. Registers and stack per thread from "
             "cuobjdump (stack > 0 means spills). Per score element of the inner loop over tiles below the "
             "diagonal: warp instructions x warps / (BLOCK_M x BLOCK_N), MUFU operations (exp2, log2, ...: lanes, "
             "not warp instructions) and tensor-core multiply-adds. Families: `grape_ap` (GRAPE-AP), `separable` "
             "(the in-tile ALiBi/GRAPE-A/FoX bias), `plain` (the same separable kernel with no bias: FlashAttention "
             "built the same way, Triton, same tiles, same two backward kernels).", "",
             "Predicted cycles per element: the busiest unit of an H100/H200 SM per clock: issue 4 warp "
             f"instructions; fma 128 lanes; alu 64; xu (MUFU and conversions) 16; tensor cores {TENSOR_MACS_PER_CLOCK:,} "
             f"bf16 multiply-adds for wgmma (989 TFLOP/s = 132 SMs x 1.83 GHz x 4,096 FLOPs), mma.sync (HMMA) at "
             f"{HMMA_FRACTION:g} of that, tf32 at half (tools/kernel_resources.py says which instruction goes where). "
             "A lower bound: latency, dependencies and overlap are left out.", "",
             "## Resources", "", "| kernel | function | tiles | head dim | dtype | needs |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['family']} | `{r['kernel']}` | {r['config']} | {r['head_dim']} | {r['dtype']} | {resource_text(r)} |"
              for r in rows]
    lines += ["", "## Inner loop over tiles below the diagonal, per score element", "",
              "Warp instructions (total and by kind), MUFU operations, tensor-core multiply-adds, then the cycles "
              "each unit needs and the predicted cycles (the largest, and which unit it is).", "",
              "| kernel | function | head dim | dtype | " + " | ".join(COST_COLUMNS) + " | "
              + " | ".join(f"{u} cycles" for u in UNITS) + " | predicted cycles (bound) |",
              "|---|---|---|---|" + "---|" * (len(COST_COLUMNS) + len(UNITS) + 1)]
    for r in rows:
        if "interior" in r:
            c = r["interior"]
            lines.append(f"| {r['family']} | `{r['kernel']}` | {r['head_dim']} | {r['dtype']} | "
                         + " | ".join(f"{c[name]:.0f}" if name == "tensor MACs" else f"{c[name]:.2f}"
                                      for name in COST_COLUMNS) + " | "
                         + " | ".join(f"{c['unit cycles'][u]:.3f}" for u in UNITS)
                         + f" | {c['cycles']:.3f} ({c['bound']}) |")
    predicted = predictions(rows)
    lines += ["", "## GRAPE-AP and the separable kernel over plain attention, per score element", "",
              "Sums over a pass's kernels (the backward: both kernels). GRAPE-AP / plain attention in predicted "
              "cycles is the static prediction of GRAPE-AP's time over FlashAttention's.", "",
              "| head dim | dtype | pass | instructions GRAPE-AP / plain | MUFU ops GRAPE-AP, plain | tensor MACs "
              "GRAPE-AP, plain | **predicted cycles GRAPE-AP / plain** | predicted cycles separable / plain |",
              "|---|---|---|---|---|---|---|---|"]
    for (head_dim, dtype), passes in predicted.items():
        for label, sums in passes.items():
            g, p, s = sums["grape_ap"], sums["plain"], sums["separable"]
            lines.append(f"| {head_dim} | {dtype} | {label} | {g['total'] / p['total']:.2f}x | "
                         f"{g['MUFU ops']:.2f}, {p['MUFU ops']:.2f} | {g['tensor MACs']:.0f}, {p['tensor MACs']:.0f} | "
                         f"**{g['cycles'] / p['cycles']:.2f}x** | {s['cycles'] / p['cycles']:.2f}x |")
    lines += ["", "## What it predicts for time", "",
              f"Lower bounds for one attention layer, forward + backward, causal, B = 1, H = 8, T = {PREDICT_T}: "
              f"predicted cycles per element x B·H·T(T+1)/2 elements / ({SMS} SMs x {CLOCK_HZ / 1e9:.2f} GHz). The "
              "tensor-core floor is any exact attention's: seven T x T x D products (forward q·kᵀ and P·v; backward "
              "q·kᵀ again, dO·vᵀ, dV, dQ and dK) at the dense wgmma rate. The Triton kernels run above their bounds "
              "by latency and stalls; the ratio GRAPE-AP / plain is what `bash scripts/gpu_check.sh` holds against "
              "the measured GRAPE-AP / causal SDPA (bench/bench_path_kernels.py).", "",
              "| head dim | dtype | GRAPE-AP (ms) | separable (ms) | plain (ms) | tensor-core floor (ms) | "
              "predicted GRAPE-AP / plain |", "|---|---|---|---|---|---|---|"]
    elements = 8 * PREDICT_T * (PREDICT_T + 1) / 2
    for (head_dim, dtype), passes in predicted.items():
        sums = passes["forward + backward"]
        ms = {f: sums[f]["cycles"] * elements / (SMS * CLOCK_HZ) * 1e3 for f in FAMILIES}
        floor = 7 * head_dim * elements / (TENSOR_MACS_PER_CLOCK * SMS * CLOCK_HZ) * 1e3
        lines.append(f"| {head_dim} | {dtype} | {ms['grape_ap']:.2f} | {ms['separable']:.2f} | {ms['plain']:.2f} | "
                     f"{floor:.2f} | {ms['grape_ap'] / ms['plain']:.2f}x |")
    if args.window:
        lines += window_section(windowed_rows, args.window)
    return lines


def prediction_record(rows) -> dict:
    """What bench/bench_path_kernels.py reads: per head dim and dtype, each family's predicted cycles per score
    element forward + backward."""
    rows = [r for r in rows if not r.get("windowed")]
    return {f"{head_dim},{dtype}": {family: sums[family]["cycles"] for family in FAMILIES}
            for (head_dim, dtype), passes in predictions(rows).items()
            for label, sums in passes.items() if label == "forward + backward"}


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200, 80: A100)")
    ap.add_argument("--dtype", default="bf16,fp16", help="comma-separated: bf16, fp16, fp32")
    ap.add_argument("--head_dim", default="64,128", help="comma-separated head dims")
    ap.add_argument("--separable", action="append", default=None, metavar="8 INTS",
                    help="a tile config of the separable kernel (default: its default_config); repeatable")
    ap.add_argument("--grape_ap", action="append", default=None, metavar="13 INTS",
                    help="a tile config of the GRAPE-AP kernels (default: their default_config); repeatable")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help="comma-separated: grape_ap, separable, plain (the separable kernel with no bias)")
    ap.add_argument("--brief", action="store_true", help="one line per kernel: builds or not, registers, stack")
    ap.add_argument("--window", type=int, default=1024,
                    help=f"also build every kernel with a sliding window and predict its cost at T = {PREDICT_T} over "
                         "full attention (0: skip)")
    ap.add_argument("--opcodes", action="store_true",
                    help="also print each kernel's interior loop by opcode: instructions per score element per thread")
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = ap.parse_args(argv)
    rows = []
    for dtype in args.dtype.split(","):
        for head_dim in (int(d) for d in args.head_dim.split(",")):
            separable = [tuple(map(int, c.split(","))) for c in args.separable] if args.separable else \
                [separable_triton.default_config(head_dim, TORCH_DTYPES[dtype])]
            grape_ap = [tuple(map(int, c.split(","))) for c in args.grape_ap] if args.grape_ap else \
                [grape_ap_triton.default_config(head_dim, TORCH_DTYPES[dtype])]
            for family, configs in (("plain", separable), ("separable", separable), ("grape_ap", grape_ap)):
                if family not in args.families.split(","):
                    continue
                for config in configs:
                    for windowed in (False, True) if args.window else (False,):
                        for row in measure(family, config, head_dim, dtype, args.arch, windowed):
                            rows.append(row)
                            cost = f" | {row['interior']['total']:.2f} instructions/element" if "interior" in row else ""
                            print(f"triton {triton.__version__} | {family} {row['kernel']}{' windowed' * windowed} "
                                  f"D{head_dim} {dtype} | {resource_text(row)}{'' if args.brief else cost}", flush=True)
                            if args.opcodes and "interior" in row:
                                print("    " + ", ".join(f"{op} {n:.2f}" for op, n in row["interior"]["opcodes"].items()
                                                         if n >= 0.05))
    failed = sum("error" in r for r in rows)
    spilled = sum(r.get("stack", 0) > 0 for r in rows)
    print(f"triton {triton.__version__}: {len(rows) - failed} of {len(rows)} kernels build, {spilled} spill")
    if args.out:
        command = "python tools/kernel_resources.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(args.out + ".tmp", "w") as f:
            f.write("\n".join(tables(rows, args, command.strip())) + "\n")
        os.replace(args.out + ".tmp", args.out)
        record = os.path.splitext(args.out)[0] + ".json"
        with open(record, "w") as f:
            json.dump(dict(triton=triton.__version__, arch=args.arch, cycles_per_element=prediction_record(rows)), f,
                      indent=1)
        print(f"wrote {args.out} and {record}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
