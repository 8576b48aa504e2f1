"""Benchmark attention for every positional encoding: forward+backward time and peak memory.

    python bench/bench_attention.py                      # CPU: T = 512..4096, writes docs/benchmarks.md + .png
    python bench/bench_attention.py --out docs/benchmarks_gpu.md   # on a GPU: bf16, T up to 8192

Two tables, every number measured in the same run as its baseline:
1. one attention layer (model.CausalSelfAttention: qkv projection, QK norm, positional features,
   rotation / lift, attention, output projection) per encoding with attn_backend="auto", as a ratio
   to the RoPE layer (fused causal SDPA); additive encodings also against their own attn_backend="dense"
   layer (the official code's dense-bias path);
   On a GPU the separable additive encodings run twice: "auto" (the in-tile Triton kernel, attention_kernels/
   separable.py) and "lifted" (extra q/k columns through fused SDPA), measured in the same rounds;
2. attention kernels alone against plain causal SDPA on the same q, k, v: the GRAPE-AP kernel
   (attention_kernels.grape_ap_attention on raw q, k, v, p, r; also against the dense bias), and FoX attention
   (when fox is among --encodings) through the in-tile kernel, the lift and, on a GPU,
   FlexAttention's score_mod with the per-token log-gate sums as captured tensors (compiled);
3. with --profile ENC on a GPU: the CUDA kernels of one ENC layer step and of one RoPE layer step, by
   time (torch.profiler), to see where an encoding's extra time goes.
Times are medians over --repeats rounds; each round runs the baseline and every case back to back and
the ratio is taken within the round, which cancels most of the noise of a shared machine. Peak memory
is the high-water mark above the memory held before the step (CPU: the process's resident set, reset
through /proc/self/clear_refs, least of 3 steps; GPU: torch.cuda.max_memory_allocated).
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ctypes  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attention import attend  # noqa: E402
from attention_kernels import grape_ap_attention  # noqa: E402
from attention import lift_qk  # noqa: E402
from model import CausalSelfAttention, GPTConfig  # noqa: E402
from positional import BIASES, ENCODINGS, PathIntegral  # noqa: E402

LAYER_CASES = list(ENCODINGS) + ["rope+kv_shift", "rope+grape_ap"]
SEPARABLE = ["alibi", "grape_a_q", "grape_a_k", "grape_a_qk", "fox"]


# --------------------------------------------------------------------------------------------------
# measurement


LIBC = ctypes.CDLL("libc.so.6")  # Linux/glibc: the CPU peak-memory measurement relies on /proc and mallopt


def malloc_mode(measure_memory: bool) -> None:
    """CPU tensors come from glibc malloc. For the resident-set peak to count tensors, every large block
    must be mmap'd and returned at free (threshold 64 KiB); for timing, freed blocks must stay in the
    heap for reuse (as glibc's adaptive default does), or each new block page-faults fresh memory, which
    made the chunked GRAPE-AP path (many 4 MiB buffers) 50% slower. mallopt switches between the two."""
    libc = LIBC
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    if measure_memory:
        libc.mallopt(M_MMAP_THRESHOLD, 64 << 10)
        libc.mallopt(M_TRIM_THRESHOLD, 128 << 10)
        libc.malloc_trim(0)
    else:
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest adaptive value
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)


class PeakMemory:
    """Peak bytes allocated above the starting level while the block runs."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            # Free heap chunks stay resident and get reused without raising the resident set: give
            # their pages back first, so that every byte the step touches is counted.
            LIBC.malloc_trim(0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current resident set
            self.start = self._status("VmRSS")
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.start
        else:
            self.peak = self._status("VmHWM") - self.start

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"/proc/self/status has no {key}")


def bench_device(choice: str, threads: int, script: str) -> tuple[torch.device, torch.dtype]:
    """--device auto|cpu|cuda -> (device, dtype): bf16 autocast on CUDA, fp32 on the CPU, where it also
    sets the thread count (0 = torch's default) and flushes denormals (decaying attention makes them,
    and they are several times slower)."""
    device = torch.device("cuda" if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()) else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{script}: --device=cuda but CUDA is not available; use --device=cpu.")
    if device.type == "cpu":
        if threads > 0:
            torch.set_num_threads(threads)
        torch.set_flush_denormal(True)
    return device, torch.bfloat16 if device.type == "cuda" else torch.float32


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def measure(cases: dict, baseline: str, repeats: int, device) -> dict:
    """cases: name -> zero-argument step function. Returns name -> (median seconds, median ratio to
    baseline within a round, peak bytes)."""
    for fn in cases.values():  # warm-up (first calls allocate, compile Triton kernels, fill caches)
        fn()
    seconds = {name: [] for name in cases}
    ratios = {name: [] for name in cases}
    for _ in range(repeats):
        base = timed(cases[baseline], device)
        seconds[baseline].append(base)
        for name, fn in cases.items():
            if name != baseline:
                s = timed(fn, device)
                seconds[name].append(s)
                ratios[name].append(s / base)
    peaks = {}
    if device.type == "cpu":
        malloc_mode(measure_memory=True)
    for name, fn in cases.items():
        fn()  # once more first, so one-time buffers (thread pools, workspaces) are not counted
        samples = []
        for _ in range(3):  # the CPU's resident-set peak only over-counts (allocator slack): keep the least
            with PeakMemory(device) as mem:
                fn()
            samples.append(mem.peak)
        peaks[name] = min(samples)
    if device.type == "cpu":
        malloc_mode(measure_memory=False)
    return {name: (statistics.median(seconds[name]), statistics.median(ratios[name]) if ratios[name] else 1.0,
                   peaks[name]) for name in cases}


def layer_step(pos: str, backend: str, T: int, args, device, dtype):
    kv_shift = pos.endswith("+kv_shift")
    pos = pos.removesuffix("+kv_shift")
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=args.heads, n_embd=args.n_embd, head_dim=args.head_dim, vocab_size=8,
                    block_size=T, pos=pos, kv_shift=kv_shift, attn_backend=backend, p_head_dim=args.p_head_dim)
    layer = CausalSelfAttention(cfg).to(device)
    x = torch.randn(args.batch, T, args.n_embd, device=device, requires_grad=True)
    grad = torch.randn(args.batch, T, args.n_embd, device=device)
    positions = torch.arange(T, device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        with autocast:
            out = layer(x, positions)
        out.backward(grad.to(out.dtype))
    return step


def kernel_steps(T: int, args, device, dtype, with_dense: bool):
    """Raw q, k, v, p, r like the model's: GRAPE-AP kernel vs causal SDPA vs the dense bias."""
    g = torch.Generator(device="cpu").manual_seed(0)
    B, H, D, dp = args.batch, args.heads, args.head_dim, args.p_head_dim

    def leaf(*shape, scale=1.0, dt=dtype):
        return (scale * torch.randn(*shape, generator=g)).to(device=device, dtype=dt).requires_grad_(True)
    q, k, v = leaf(B, H, T, D), leaf(B, H, T, D), leaf(B, H, T, D)
    p, r = leaf(B, H, T, dp, scale=1 / dp, dt=torch.float32), leaf(B, H, T, dp, dt=torch.float32)
    bias = PathIntegral(H, 8, dp).to(device)
    slopes, scale = bias.slopes, 1 / math.sqrt(D)
    grad = torch.randn(B, H, T, D, generator=g).to(device=device, dtype=dtype)
    positions = torch.arange(T, device=device)
    pos_feature = positions.float()[None, None]

    leaves = [q, k, v, p, r]  # every tensor whose gradient a step fills, reset before each step

    def run(fn):
        def step():
            for t in leaves:
                t.grad = None
            fn().backward(grad)
        return step
    steps = {"sdpa": run(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale))}
    if "grape_ap" in args.encodings:
        steps["grape_ap"] = run(lambda: grape_ap_attention(q, k, v, p, r, slopes, scale))
    if "fox" in args.encodings:
        steps.update(fox_kernel_steps(q, k, v, scale, run, device, args.flex, leaves))
    if "grape_ap" not in args.encodings:
        return steps
    if args.ablation:
        steps["grape_ap checkpointed blocks"] = run(lambda: checkpointed_grape_ap(q, k, v, p, r, slopes, scale))
    if with_dense:
        steps["grape_ap dense"] = run(lambda: attend(q, k, v, backend="dense", scale=scale, q_pos=positions,
                                                     k_pos=positions, bias=bias, qf={"p": p, "pos": pos_feature},
                                                     kf={"r": r, "pos": pos_feature}))
    return steps


def fox_kernel_steps(q, k, v, scale, run, device, flex: bool, leaves: list) -> dict:
    """FoX attention alone, c = running sums of log forget gates (about -0.05 per token on average, so
    |c| reaches hundreds to thousands), with gradients to q, k, v and c: the in-tile kernel, the bf16
    lift through SDPA, and (CUDA) FlexAttention with c captured by its score_mod."""
    from attention_kernels.separable import separable_attention
    from positional import ForgetGate
    B, H, T, D = q.shape
    g = torch.Generator(device="cpu").manual_seed(1)
    log_gates = F.logsigmoid(torch.randn(B, H, T, generator=g) + 3.0)
    c = torch.cumsum(log_gates, dim=-1).to(device).requires_grad_(True)
    leaves.append(c)
    gate = ForgetGate(H, 8, 0.0).to(device)
    steps = {}

    def tile():
        features = torch.stack((torch.zeros_like(c), torch.zeros_like(c), c), dim=-1)
        return separable_attention(q, k, v, features, features, scale, has_rate=False, has_sum=True)

    def lifted():
        q_l, k_l = lift_qk(q, k, {"c": c}, {"c": c}, gate, scale)
        v_l = F.pad(v, (0, q_l.shape[-1] - v.shape[-1]))
        return F.scaled_dot_product_attention(q_l, k_l, v_l, is_causal=True, scale=scale)[..., :D]
    if device.type == "cuda":
        steps["fox tile"] = run(tile)
    steps["fox lifted"] = run(lifted)
    if device.type == "cuda" and flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            compiled_flex = torch.compile(flex_attention)
            block_mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, T, T, device=device)

            def flex():
                def score_mod(score, b, h, i, j):
                    return score + c[b, h, i] - c[b, h, j]
                return compiled_flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
            run(flex)()  # compiles forward and backward here, so a failure costs one row, not the run
            steps["fox flex"] = run(flex)
        except Exception as error:  # an older torch: no FlexAttention, or no gradients into captured tensors
            print(f"FlexAttention FoX not measured: {type(error).__name__}: {str(error)[:200]}", flush=True)
    return steps


def checkpointed_grape_ap(q, k, v, p, r, slopes, scale, block=64):
    """Ablation: the same query-block algorithm with plain autograd inside torch.utils.checkpoint per
    block (recomputed in backward) instead of attention_kernels.grape_ap's hand-written backward."""
    from torch.utils.checkpoint import checkpoint

    def block_attention(q_blk, k_pre, v_pre, p_blk, r_pre, start):
        path = torch.cumsum(F.logsigmoid(p_blk @ r_pre.transpose(-1, -2)), dim=-1) * -slopes[:, None, None]
        logits = scale * (q_blk @ k_pre.transpose(-1, -2)) + path
        n, n_keys = q_blk.shape[2], k_pre.shape[2]
        future = torch.ones(n, n_keys, dtype=torch.bool, device=q.device).triu(1 + n_keys - n)
        return torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1) @ v_pre

    T = q.shape[2]
    outs = [checkpoint(block_attention, q[:, :, s:s + block], k[:, :, :s + block], v[:, :, :s + block],
                       p[:, :, s:s + block], r[:, :, :s + block], s, use_reentrant=False) for s in range(0, T, block)]
    return torch.cat(outs, dim=2)


# (BLOCK_M, BLOCK_N, warps, stages) of the forward, the query-major and the key-major backward kernels, then
# pass rows: the default at D = 128, the runners-up of the static cost (tools/kernel_resources.py: predicted
# cycles per score element on sm_90; the key-major kernel's wgmma tiles spill some registers) and the previous
# default (its key-major kernel on mma.sync, predicted bound by shared memory)
GRAPE_AP_TILES = [(64, 64, 4, 2, 128, 32, 8, 1, 128, 64, 8, 1, 2048), (128, 64, 8, 2, 128, 32, 8, 1, 128, 64, 8, 1, 2048),
                  (64, 64, 4, 2, 128, 64, 8, 1, 128, 64, 8, 1, 2048), (64, 64, 4, 2, 128, 32, 8, 1, 64, 64, 4, 1, 2048),
                  (64, 64, 4, 2, 64, 32, 4, 1, 128, 64, 8, 1, 2048), (64, 64, 4, 2, 128, 32, 8, 1, 128, 64, 8, 1, 4096),
                  (64, 64, 4, 2, 128, 16, 8, 1, 32, 64, 8, 1, 2048)]
# (fwd BLOCK_M, BLOCK_N, warps, stages, bwd short tile, long tile, warps, stages): the default, the previous
# default (8 backward warps) and neighbours
SEPARABLE_TILES = [(128, 64, 8, 3, 32, 64, 4, 3), (128, 64, 8, 3, 32, 64, 8, 3), (128, 64, 8, 3, 64, 64, 4, 3),
                   (128, 128, 8, 3, 32, 64, 4, 3), (64, 64, 4, 3, 32, 64, 4, 3), (128, 64, 8, 2, 32, 64, 4, 2),
                   (128, 64, 8, 3, 64, 64, 8, 3), (128, 64, 8, 3, 64, 128, 8, 3)]


def sweep_tiles(T: int, args, device, dtype) -> list[tuple]:
    """GPU only: forward+backward time of each Triton kernel per tile configuration: GRAPE-AP (when among
    --encodings) and the in-tile separable kernel (FoX's form, when fox is among them).
    Rows: (kernel, config, seconds or None, True for the default / an error note)."""
    from attention_kernels import grape_ap_triton, separable, separable_triton
    from attention_kernels.grape_ap import grape_ap_triton as grape_ap_kernels
    g = torch.Generator(device="cpu").manual_seed(0)
    B, H, D, dp = args.batch, args.heads, args.head_dim, args.p_head_dim
    q, k, v = ((torch.randn(B, H, T, D, generator=g)).to(device, dtype).requires_grad_(True) for _ in range(3))
    p = (torch.randn(B, H, T, dp, generator=g) / dp).to(device).requires_grad_(True)
    r = torch.randn(B, H, T, dp, generator=g).to(device).requires_grad_(True)
    features = torch.randn(B, H, T, 3, generator=g).cumsum(2).to(device).requires_grad_(True)
    slopes = torch.rand(H, device=device)
    grad = torch.randn(B, H, T, D, generator=g).to(device, dtype)
    kernels = []
    if "grape_ap" in args.encodings:
        kernels.append(("grape_ap", GRAPE_AP_TILES, grape_ap_triton.default_config(D, dtype),
                        lambda c: grape_ap_kernels(q, k, v, p, r, slopes, 1 / math.sqrt(D), config=c)))
    if "fox" in args.encodings:
        kernels.append(("separable", SEPARABLE_TILES, separable_triton.default_config(D),
                        lambda c: separable.separable_attention(q, k, v, features, features, 1 / math.sqrt(D),
                                                                has_rate=True, has_sum=True, config=c)))
    rows = []
    for name, configs, default, attention in kernels:
        for config in configs:
            def step():
                for t in (q, k, v, p, r, features):
                    t.grad = None
                attention(config).backward(grad)
            try:
                step()
                times = sorted(timed(step, device) for _ in range(max(3, args.repeats)))
                rows.append((name, config, times[len(times) // 2], tuple(config) == tuple(default)))
            except Exception as error:  # e.g. out of shared memory for large tiles
                rows.append((name, config, None, f"{type(error).__name__}: {str(error)[:80]}"))
    return rows


def profile_layers(pos: str, T: int, args, device, dtype) -> list[str]:
    """Markdown: the ops and kernels of one `pos` layer step and of one RoPE layer step, by their own
    device time (CPU time on the CPU), per step, from torch.profiler over 5 steps."""
    from torch.profiler import ProfilerActivity, profile
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    lines = [f"## Where the time goes: `{pos}` against `rope` (one layer, T = {T}, forward+backward)", "",
             "Self time per step of each op or kernel (torch.profiler, 5 steps after 3 warm-up steps), largest first.", ""]
    for name in ("rope", pos):
        step = layer_step(name, "auto", T, args, device, dtype)
        for _ in range(3):
            step()
        sync(device)
        with profile(activities=activities) as prof:
            for _ in range(5):
                step()
            sync(device)
        events = prof.key_averages()
        key = next((k for k in ("self_device_time_total", "self_cuda_time_total") if on_gpu and hasattr(events[0], k)),
                   "self_cpu_time_total")
        total = sum(getattr(e, key) for e in events) / 5
        lines += [f"`{name}`: {total / 1e3:.2f} ms of {'GPU' if on_gpu else 'CPU'} time per step.", "",
                  "| op / kernel | µs per step | share | calls per step |", "|---|---|---|---|"]
        for event in sorted(events, key=lambda e: getattr(e, key), reverse=True)[:15]:
            own = getattr(event, key) / 5
            label = event.key if len(event.key) <= 90 else event.key[:87] + "..."
            lines.append(f"| `{label.replace('|', '/')}` | {own:.1f} | {own / max(total, 1e-9):.1%} | {event.count / 5:g} |")
        lines.append("")
    return lines


# --------------------------------------------------------------------------------------------------
# report


def fmt_ratio(x):
    return "—" if x is None else f"{x:.2f}×"


MACHINE = {}  # the measuring run's machine line, kept when a report is re-rendered


def machine_line(device) -> str:
    if MACHINE.get("line"):
        return MACHINE["line"]
    if device.type == "cuda":
        return f"GPU: {torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    cpu = platform.processor() or "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU: {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def targets_section(layer, kernel, Ts, device, batch=1) -> list[str]:
    """The open targets, checked against this run's numbers."""
    lines = ["## Targets", ""]
    on_gpu = device.type == "cuda"
    T_check = 4096 if on_gpu else 2048
    limits = {"grape_ap": None if on_gpu else 4.0}  # on the GPU GRAPE-AP's target is its kernel's, below
    for pos in SEPARABLE + ["grape_m_basis"]:
        limits[pos] = 1.15 if on_gpu else (1.3 if pos in SEPARABLE else None)
    for T_check in ((4096, 8192) if on_gpu else (2048,)):
        if T_check not in Ts:
            continue
        where = "GPU bf16" if on_gpu else "CPU fp32"
        lines.append(f"Time at T = {T_check} ({where}, forward+backward, ratio to RoPE):")
        lines.append("")
        for pos, limit in limits.items():
            if (pos, "auto") not in layer[T_check] or limit is None:
                continue
            ratio = layer[T_check][(pos, "auto")][1]
            verdict = "holds" if ratio <= limit else "MISSED"
            lines.append(f"- `{pos}` layer: {ratio:.2f}× (target ≤ {limit}×): {verdict}, "
                         f"{'margin' if ratio <= limit else 'over by'} {abs(limit - ratio) / limit:.0%}")
        lines.append("")
    if on_gpu:  # the GPU fills only at T = 8192 for B·H = 8, or at T = 4096 with 4x the batch
        for T in sorted(kernel):
            for name, limit in (("grape_ap", 2.0), ("fox tile", 1.3)):
                if name in kernel[T] and (T >= 8192 or (batch >= 4 and T >= 4096)):
                    ratio = kernel[T][name][1]
                    lines.append(f"- `{name}` attention alone vs causal SDPA at T = {T}, B = {batch}: {ratio:.2f}× "
                                 f"(target ≤ {limit}×): {'holds' if ratio <= limit else 'MISSED'}")
        lines.append("")
    else:
        gpu_doc = os.path.join(ROOT, "docs", "benchmarks_gpu.md")
        lines.append("GPU targets (`grape_ap` kernel ≤ 2.0× causal SDPA at T = 8192 and at T = 4096 with batch 4; the "
                     "other additive encodings ≤ 1.15× the RoPE layer at T = 4096 and 8192, bf16): not measurable in "
                     "this CPU run; `bash scripts/gpu_check.sh` measures them into "
                     + ("`docs/benchmarks_gpu.md`." if os.path.exists(gpu_doc) else
                        "`docs/benchmarks_gpu.md` (not yet run: no GPU was available)."))
        lines.append("")
    limit = 2.1 if on_gpu else 2.2
    for small, large in zip(Ts, Ts[1:]):
        if large != 2 * small:
            continue
        growth = {pos: layer[large][(pos, "auto")][2] / max(1, layer[small][(pos, "auto")][2])
                  for pos, backend in layer[large] if backend == "auto"}
        worst = max(growth, key=growth.get)
        ok = all(g <= limit for g in growth.values())
        lines.append(f"Peak memory growth T = {small} → {large} (linear would be 2.0×; target ≤ {limit}×): "
                     f"{'holds for every encoding' if ok else 'MISSED'}; largest {growth[worst]:.2f}× (`{worst}`), "
                     f"smallest {min(growth.values()):.2f}×.")
        lines.append("")
    return lines


def write_report(path, png, layer, kernel, Ts, args, device, dtype, argv, sweep=None, profile=None):
    dense_Ts = [T for T in Ts if any(b == "dense" for _, b in layer[T])]
    lines = [
        "# Attention benchmarks", "",
        f"Generated by `python bench/bench_attention.py {' '.join(argv)}` (commit {git_commit()}); "
        f"{machine_line(device)}; {str(dtype).removeprefix('torch.')}; B = {args.batch}, H = {args.heads}, "
        f"head_dim = {args.head_dim}, n_embd = {args.n_embd}, d_p = {args.p_head_dim}.",
        f"Times are medians of {args.repeats} rounds; a ratio is taken within each round against the baseline "
        f"run in that round, then the median is reported"
        + (" (the 2 CPU cores are shared with other jobs, so single rounds can be off by 2× or more)."
           if device.type == "cpu" else "."),
        "Forward + backward of one step; memory is the peak above what was held before the step "
        + ("(resident set: the least of 3 steps, since allocator slack only adds to it)." if device.type == "cpu"
           else "(torch.cuda.max_memory_allocated)."),
        "",
    ]
    lines += targets_section(layer, kernel, Ts, device, args.batch)
    lines += ["## One attention layer per encoding (attn_backend=\"auto\")", "",
              "Time and peak memory as ratios to the RoPE layer at the same T (`rope`: fused causal SDPA). The last "
              "column is the encoding's own peak memory at T = 4096 over T = 2048 (2.0 = linear in T).", ""]
    header = "| encoding | " + " | ".join(f"T={T} time | mem" for T in Ts) + " | mem 4096/2048 |"
    lines += [header, "|" + "---|" * (2 * len(Ts) + 2)]
    for pos in LAYER_CASES:
        if (pos, "auto") not in layer[Ts[0]]:
            continue
        cells = []
        for T in Ts:
            _, ratio, peak = layer[T][(pos, "auto")]
            cells.append(f"{ratio:.2f}× | {peak / max(1, layer[T][('rope', 'auto')][2]):.2f}×")
        growth = "—"
        if 2048 in Ts and 4096 in Ts:
            growth = f"{layer[4096][(pos, 'auto')][2] / max(1, layer[2048][(pos, 'auto')][2]):.2f}×"
        lines.append(f"| `{pos}` | " + " | ".join(cells) + f" | {growth} |")
    lines += ["", "Absolute numbers of the RoPE layer: " + ", ".join(
        f"T={T}: {layer[T][('rope', 'auto')][0] * 1e3:.1f} ms, {layer[T][('rope', 'auto')][2] / 2**20:.0f} MiB" for T in Ts) + ".", ""]
    if dense_Ts:
        lines += ["### Additive encodings: fused (auto) against the dense bias", "",
                  "Ratios of the `attn_backend=\"auto\"` layer to the same encoding's `attn_backend=\"dense\"` layer "
                  "(the bias materialised as a (B, H, T, T) tensor, as in the official code); below 1 = faster / smaller.", "",
                  "| encoding | " + " | ".join(f"T={T} auto/dense time | auto/dense mem" for T in dense_Ts) + " |",
                  "|" + "---|" * (2 * len(dense_Ts) + 1)]
        for pos in LAYER_CASES:
            if (pos, "dense") not in layer[dense_Ts[0]]:
                continue
            cells = []
            for T in dense_Ts:
                auto, dense = layer[T][(pos, "auto")], layer[T][(pos, "dense")]
                cells.append(f"{auto[1] / dense[1]:.2f} | {auto[2] / max(1, dense[2]):.2f}")
            lines.append(f"| `{pos}` | " + " | ".join(cells) + " |")
        lines.append("")
    lifted_Ts = [T for T in Ts if any(b == "lifted" for _, b in layer[T])]
    if lifted_Ts:
        lines += ["### Separable biases: in-tile kernel (auto) against the lift", "",
                  "Each encoding's layer time as a ratio to the RoPE layer, with the bias added inside the Triton tile "
                  "(`attn_backend=\"tile\"`, what `auto` runs on CUDA) and through lifted q/k columns "
                  "(`attn_backend=\"lifted\"`), measured in the same rounds.", "",
                  "| encoding | " + " | ".join(f"T={T} tile | T={T} lifted" for T in lifted_Ts) + " |",
                  "|" + "---|" * (2 * len(lifted_Ts) + 1)]
        for pos in SEPARABLE:
            if (pos, "lifted") in layer[lifted_Ts[0]]:
                lines.append(f"| `{pos}` | " + " | ".join(
                    f"{layer[T][(pos, 'auto')][1]:.2f}× | {layer[T][(pos, 'lifted')][1]:.2f}×" for T in lifted_Ts) + " |")
        lines.append("")
    if kernel:
        kTs = sorted(kernel)
        lines += ["## Attention kernels alone", "",
                  "On raw inputs with gradients to all of them, against causal SDPA on the same q, k, v (ratios within "
                  f"each round). `grape_ap`: `attention_kernels.grape_ap_attention` ({'Triton' if device.type == 'cuda' else 'chunked PyTorch'}); "
                  "`grape_ap dense`: the dense bias (`attention.attend(backend=\"dense\")`); `fox tile`: the in-tile "
                  "kernel; `fox lifted`: the bf16 lift through SDPA; `fox flex`: FlexAttention's score_mod (compiled).", "",
                  "| T | kernel | ms | / SDPA time | / SDPA memory |", "|---|---|---|---|---|"]
        for T in kTs:
            sdpa = kernel[T]["sdpa"]
            lines.append(f"| {T} | sdpa | {sdpa[0] * 1e3:.2f} | 1.00× | 1.00× |")
            for name, values in kernel[T].items():
                if name != "sdpa" and name != "grape_ap checkpointed blocks":
                    lines.append(f"| {T} | {name} | {values[0] * 1e3:.2f} | {values[1]:.2f}× | "
                                 f"{values[2] / max(1, sdpa[2]):.2f}× |")
        lines.append("")
        ablation = [T for T in kTs if "grape_ap checkpointed blocks" in kernel[T]]
        if ablation:
            lines += ["Ablation: the same query blocks with plain autograd under `torch.utils.checkpoint` per block "
                      "instead of the hand-written backward:", "",
                      "| T | checkpointed / SDPA | hand-written / SDPA | checkpointed mem / SDPA mem |", "|---|---|---|---|"]
            for T in ablation:
                c, g, s = kernel[T]["grape_ap checkpointed blocks"], kernel[T]["grape_ap"], kernel[T]["sdpa"]
                lines.append(f"| {T} | {c[1]:.2f}× | {g[1]:.2f}× | {c[2] / max(1, s[2]):.2f}× |")
            lines.append("")
    if sweep:
        lines += [f"## Triton tile sweep (T = {sweep[0]}, forward+backward)", "",
                  "| kernel | tiles | ms | note |", "|---|---|---|---|"]
        for name, config, seconds, note in sweep[1]:
            note = "default" if note is True else ("" if note is False else note)
            lines.append(f"| {name} | {config} | {'—' if seconds is None else f'{seconds * 1e3:.2f}'} | {note} |")
        lines.append("")
    lines += profile or []
    if png:
        lines += [f"![time and memory ratios]({os.path.basename(png)})", ""]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines))
    os.replace(tmp, path)


def save_raw(path, layer, kernel, Ts, argv):
    """Every measured number, so the report can be re-rendered (--render) without re-measuring."""
    import json
    raw = {"argv": argv, "Ts": Ts, "machine": MACHINE.get("line"),
           "layer": {str(T): [[pos, backend, *values] for (pos, backend), values in layer[T].items()] for T in Ts},
           "kernel": {str(T): {name: list(values) for name, values in kernel[T].items()} for T in kernel}}
    with open(path + ".tmp", "w") as f:
        json.dump(raw, f, indent=1)
    os.replace(path + ".tmp", path)


def load_raw(path):
    import json
    with open(path) as f:
        raw = json.load(f)
    Ts = raw["Ts"]
    layer = {T: {(pos, backend): tuple(values) for pos, backend, *values in raw["layer"][str(T)]} for T in Ts}
    kernel = {int(T): {name: tuple(values) for name, values in d.items()} for T, d in raw["kernel"].items()}
    MACHINE["line"] = raw.get("machine")
    return layer, kernel, Ts, raw["argv"]


def plot(png, layer, Ts):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.get_cmap("tab20").colors
    for i, pos in enumerate(LAYER_CASES):
        if (pos, "auto") not in layer[Ts[0]]:
            continue
        additive = any(part in BIASES for part in pos.split("+"))
        style = dict(linestyle="--" if additive else "-", marker="os^vD"[i % 5], color=colors[i % len(colors)], label=pos)
        ax_t.plot(Ts, [layer[T][(pos, "auto")][1] for T in Ts], **style)
        ax_m.plot(Ts, [layer[T][(pos, "auto")][2] / 2**20 for T in Ts], **style)
    ax_t.set(xscale="log", xlabel="T", ylabel="time / RoPE layer", title="forward+backward time")
    ax_m.set(xscale="log", xlabel="T", ylabel="peak MiB above the start", title="peak memory of one layer (linear in T)")
    for ax in (ax_t, ax_m):
        ax.set_xticks(Ts, [str(T) for T in Ts])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    ax_t.legend(fontsize=7, ncol=2, title="dashed: additive", title_fontsize=7)
    fig.tight_layout()
    tmp = png + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, png)


# --------------------------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", default=None, help="comma-separated lengths (default 512,1024,2048,4096; +8192 on GPU)")
    ap.add_argument("--encodings", default=",".join(LAYER_CASES), help="comma-separated layer cases")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head_dim", type=int, default=64)
    ap.add_argument("--n_embd", type=int, default=512)
    ap.add_argument("--p_head_dim", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads (default 1: on a shared machine one thread gives stable ratios; 0 = torch's default)")
    ap.add_argument("--dense_max_T", type=int, default=None,
                    help="largest T for the dense-bias comparisons (default 2048 on CPU, 4096 on GPU: O(T²) memory)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--ablation", action="store_true",
                    help="also time GRAPE-AP with torch.utils.checkpoint per block instead of the hand-written backward")
    ap.add_argument("--sweep", action="store_true", help="GPU: also time the Triton kernels' tile configurations at the largest T")
    ap.add_argument("--flex", action="store_true",
                    help="GPU: also time FoX attention through FlexAttention (compiles for tens of seconds per T)")
    ap.add_argument("--profile", default=None, metavar="ENC",
                    help="also profile one ENC layer step against one RoPE layer step at the largest T")
    ap.add_argument("--render", default=None, metavar="JSON", help="only re-render the report from a previous run's .json")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--png", default=None, help="plot path (default: --out with .png)")
    args = ap.parse_args(argv)
    args.encodings = [e.strip() for e in args.encodings.split(",") if e.strip()]
    unknown = [e for e in args.encodings if e not in LAYER_CASES]
    if unknown:
        ap.error(f"unknown encodings {unknown}; valid: {', '.join(LAYER_CASES)}")
    if "rope" not in args.encodings:
        args.encodings.insert(0, "rope")  # the baseline
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.render:  # re-render the report from a previous run's raw numbers
        layer, kernel, Ts, run_argv = load_raw(args.render)
        saved = parse_args([a for a in run_argv if a != "--render"])
        device = torch.device("cuda" if torch.cuda.is_available() and "gpu" in args.out else "cpu")
        png = args.png or os.path.splitext(args.out)[0] + ".png"
        plot(png, layer, Ts)
        write_report(args.out, png, layer, kernel, Ts, saved, device,
                     torch.bfloat16 if device.type == "cuda" else torch.float32, run_argv)
        print(f"wrote {args.out} and {png} from {args.render}")
        return
    device, dtype = bench_device(args.device, args.threads, "bench_attention")
    if device.type == "cpu":
        malloc_mode(measure_memory=False)
    Ts = [int(t) for t in args.T.split(",")] if args.T else [512, 1024, 2048, 4096] + ([8192] if device.type == "cuda" else [])
    dense_max_T = args.dense_max_T or (4096 if device.type == "cuda" else 2048)
    png = args.png or os.path.splitext(args.out)[0] + ".png"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    layer, kernel = {}, {}
    MACHINE["line"] = machine_line(device)

    extra = {}

    def report(done):  # after every T, so a run cut short by a time limit still leaves its numbers
        save_raw(os.path.splitext(args.out)[0] + ".json", layer, kernel, done, argv)
        plot(png, layer, done)
        write_report(args.out, png, layer, kernel, done, args, device, dtype, argv, **extra)

    for T in Ts:
        cases = {}
        for pos in args.encodings:
            cases[(pos, "auto")] = layer_step(pos, "auto", T, args, device, dtype)
            additive = any(part in BIASES for part in pos.removesuffix("+kv_shift").split("+"))
            if additive and T <= dense_max_T:
                cases[(pos, "dense")] = layer_step(pos, "dense", T, args, device, dtype)
            if device.type == "cuda" and pos in SEPARABLE:  # the in-tile kernel (auto) against the lift
                cases[(pos, "lifted")] = layer_step(pos, "lifted", T, args, device, dtype)
        layer[T] = measure(cases, ("rope", "auto"), args.repeats, device)
        del cases
        if "grape_ap" in args.encodings or "fox" in args.encodings:
            steps = kernel_steps(T, args, device, dtype, with_dense=T <= dense_max_T)
            kernel[T] = measure(steps, "sdpa", args.repeats, device)
            del steps
        rope = layer[T][("rope", "auto")]
        print(f"T={T}: RoPE layer {rope[0] * 1e3:.1f} ms; " + ", ".join(
            f"{pos}{'' if b == 'auto' else ' ' + b} {r:.2f}×" for (pos, b), (_, r, _) in layer[T].items()
            if (pos, b) != ("rope", "auto")), flush=True)
        if T in kernel:
            print("       kernel: " + ", ".join(f"{n} {v[0] * 1e3:.1f} ms ({v[1]:.2f}×)" for n, v in kernel[T].items()),
                  flush=True)
        report(Ts[:Ts.index(T) + 1])
    if args.sweep:
        if device.type != "cuda":
            print("--sweep needs a GPU (Triton tiles); skipped")
        else:
            extra["sweep"] = sweep = (max(Ts), sweep_tiles(max(Ts), args, device, dtype))
            for name, config, seconds, note in sweep[1]:
                print(f"{name} tiles {config}: {'failed ' + note if seconds is None else f'{seconds * 1e3:.2f} ms'}", flush=True)
            report(Ts)
    if args.profile:
        extra["profile"] = profile_layers(args.profile, max(Ts), args, device, dtype)
        print("\n".join(extra["profile"]), flush=True)
        report(Ts)
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
