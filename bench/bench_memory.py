"""Memory and time of the options for training past one GPU's memory, measured on this machine, and the memory
planner's table for the paper-sized and larger configs. Writes docs/memory.md.

    python bench/bench_memory.py                      # all three parts (minutes on a 2-core CPU)
    python bench/bench_memory.py --skip-planner       # without the planner's table
    python bench/bench_memory.py --out /tmp/memory.md

1. The loss alone at the quickstart's vocabulary (50,304) and width (128): the plain loss (full fp32 logits)
   against the chunked one, forward and backward, at the quickstart's micro-batch (8 x 128 tokens) and a larger
   one (8 x 512). Peak memory above the inputs (the profiler's record of every allocation) and time (7 alternating
   rounds: the median time, and the median of the rounds' ratios, robust to a shared machine's load).
2. A training step per option, on random tokens (training.memory.training_steps: train.py's set-up and step):
   peak memory of a step (measured as the planner is validated) and the median step time, as ratios to a
   baseline measured in the same run; 2-process options run under torchrun (gloo). Then the precision options
   (fp32, bf16 autocast, FSDP's bf16 parameters) train 30 steps of the byte-level embedded corpus: their
   losses against fp32's.
3. The planner's per-GPU plan (python -m training.memory) for medium, large, 1.3B and 2.7B under DDP and FSDP,
   with and without activation checkpointing: GiB at micro-batch 1 and the largest micro-batch that fits on
   24, 40, 80 and 141 GB GPUs (bf16).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from config import resolve  # noqa: E402
from lm_loss import DEFAULT_CHUNK_TOKENS, chunked_cross_entropy, plain_loss  # noqa: E402
from model import GPTConfig  # noqa: E402
from training import memory  # noqa: E402
from training.distributed import Distributed  # noqa: E402

QUICKSTART = os.path.join(ROOT, "configs", "quickstart.toml")
MiB = 2 ** 20
# the training-step options: a 4-layer model of the quickstart's width at 1,024 tokens a micro-batch, with a
# vocabulary small enough that the blocks, not the head, set the time (the loss has its own table)
STEP_MODEL = ["--n_layer=4", "--block_size=256", "--batch_size=4", "--global_batch_size=8", "--vocab_size=8192",
              "--device=cpu", "--pos=fox"]
ONE_PROCESS = [("baseline: plain loss, no checkpointing", ["--loss=plain"]),
               ("chunked loss", ["--loss=chunked"]),
               ("activation checkpointing: blocks", ["--loss=plain", "--activation_checkpointing=blocks"]),
               ("activation checkpointing: every_k (k = 2)", ["--loss=plain", "--activation_checkpointing=every_k"]),
               ("chunked loss + checkpointing: blocks", ["--loss=chunked", "--activation_checkpointing=blocks"])]
TWO_PROCESSES = [("DDP, 2 processes (baseline)", ["--loss=chunked"]),
                 ("FSDP, 2 processes", ["--loss=chunked", "--parallel=fsdp"]),
                 ("FSDP, kept gathered after forward", ["--loss=chunked", "--parallel=fsdp",
                                                        "--fsdp_reshard_after_forward=false"]),
                 ("FSDP, sharded accumulation", ["--loss=chunked", "--parallel=fsdp",
                                                 "--fsdp_reduce_each_micro_batch"]),
                 ("FSDP + checkpointing: blocks", ["--loss=chunked", "--parallel=fsdp",
                                                   "--activation_checkpointing=blocks"])]
PRECISIONS = [("fp32", []), ("bf16 autocast (DDP)", ["--dtype=bf16"]),
              ("FSDP bf16 parameters, fp32 reduction", ["--dtype=bf16", "--parallel=fsdp"]),
              ("FSDP bf16 autocast", ["--dtype=bf16", "--parallel=fsdp", "--fsdp_bf16=autocast"])]
PLANNED = [("medium", "configs/medium/fox.toml"), ("large", "configs/large/fox.toml"),
           ("1.3B", "configs/1.3b/fox.toml"), ("2.7B", "configs/2.7b/fox.toml")]
GPU_GB = (24, 40, 80, 141)


# ----------------------------------------------------------------------------- 1. the loss alone

def bench_loss(tokens: int, repeats: int = 7) -> dict:
    V, C = 50304, 128
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, C, generator=g).requires_grad_()
    weight = (0.02 * torch.randn(V, C, generator=g)).requires_grad_()
    targets = torch.randint(0, V, (tokens,), generator=g)
    variants = {"plain": lambda: plain_loss(hidden, weight, targets),
                "chunked": lambda: chunked_cross_entropy(hidden, weight, targets, DEFAULT_CHUNK_TOKENS)}

    def run(fn):
        hidden.grad = weight.grad = None
        fn().backward()

    def peak(fn):  # from the same start for both: no gradients held (freeing the last ones would count)
        hidden.grad = weight.grad = None
        return memory.profiled_peak(lambda: fn().backward())
    peaks = {name: peak(fn) for name, fn in variants.items()}
    times = {name: [] for name in variants}
    for _ in range(repeats):  # alternating, so both see the same load; the speed-up is the median of the rounds'
        for name, fn in variants.items():
            start = time.perf_counter()
            run(fn)
            times[name].append(time.perf_counter() - start)
    speedup = statistics.median(p / c for p, c in zip(times["plain"], times["chunked"]))
    return {"tokens": tokens, "peak": peaks, "seconds": {name: statistics.median(t) for name, t in times.items()},
            "speedup": speedup}


# ----------------------------------------------------------------------------- 2. training steps

def bench_step(overrides: list[str], steps: int = 3) -> dict:
    """Peak bytes and the median seconds of a training step of STEP_MODEL with `overrides` on this process (and
    its group, under torchrun)."""
    model_cfg, cfg = resolve(QUICKSTART, STEP_MODEL + overrides, GPTConfig)
    ddp = Distributed("cpu", 600, cfg.parallel)
    try:
        use_bf16 = cfg.dtype == "bf16"
        peak = memory.measure_peak(model_cfg, cfg, ddp, use_bf16)
        step, _, _ = memory.training_steps(model_cfg, cfg, ddp, use_bf16)
        step(0)
        times = []
        for i in range(1, steps + 1):
            ddp.barrier()
            start = time.perf_counter()
            step(i)
            times.append(time.perf_counter() - start)
        planned = memory.plan(model_cfg, cfg, ddp.world_size, use_bf16=use_bf16).total
    finally:
        ddp.release()
    return {"peak": peak, "seconds": statistics.median(times), "planned": planned}


def worker(out: str) -> None:
    """Under torchrun: TWO_PROCESSES, each measured on every process; the main process writes them to out."""
    results = [bench_step(overrides) for _, overrides in TWO_PROCESSES]
    if int(os.environ.get("RANK", 0)) == 0:
        with open(out, "w") as f:
            json.dump(results, f)


def bench_two_processes() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "two.json")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        os.path.abspath(__file__), "--worker", out], cwd=ROOT, env=env, check=True,
                       capture_output=True, text=True)
        with open(out) as f:
            return json.load(f)


def bench_precisions(steps: int = 30) -> list[dict]:
    """30 steps of the byte-level embedded corpus under each precision (1 process; FSDP on a group of one):
    the losses, compared with fp32's."""
    import train
    from data.prepare import ensure_default_corpus
    data_dir = ensure_default_corpus(tokenizer="byte", progress_bar=False)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in PRECISIONS:
            start = time.perf_counter()
            out = train.run([QUICKSTART, f"--data_dir={data_dir}", "--vocab_size=320", "--block_size=128",
                             "--batch_size=8", "--global_batch_size=16", f"--max_iters={steps}", "--warmup_iters=5",
                             "--eval_interval=0", "--log_interval=1000", "--ckpt_interval=0",
                             f"--out_dir={os.path.join(tmp, str(len(results)))}", *overrides])
            results.append({"losses": out["losses"], "seconds": time.perf_counter() - start})
    return results


# ----------------------------------------------------------------------------- 3. the planner

def planner_rows() -> list[dict]:
    rows = []
    for name, path in PLANNED:
        for parallel in ("ddp", "fsdp"):
            for checkpointing in ("none", "blocks"):
                model_cfg, cfg = resolve(os.path.join(ROOT, path), [f"--parallel={parallel}",
                                                                    f"--activation_checkpointing={checkpointing}",
                                                                    "--batch_size=1"], GPTConfig)
                one = memory.plan(model_cfg, cfg, 8, use_bf16=True)
                fits = [memory.largest_micro_batch(model_cfg, cfg, 8, gb * memory.GiB, parallel, True)
                        for gb in GPU_GB]
                params = memory.parameter_counts(model_cfg)[0]
                rows.append({"model": name, "params": params, "parallel": parallel, "checkpointing": checkpointing,
                             "one": one, "fits": fits})
                print(f"planned {name} {parallel} {checkpointing}: {one.total / memory.GiB:.1f} GiB at 1, fits {fits}",
                      flush=True)
    return rows


# ----------------------------------------------------------------------------- the report

def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report(losses, one, two, precisions, rows, command) -> str:
    lines = ["# Memory: measured options and the planner", "",
             f"Generated by `{command}` (commit {commit()}); CPU, {torch.get_num_threads()} thread(s), shared "
             f"machine; torch {torch.__version__}. One run: ratios are against a baseline measured in the same run. "
             "Peak memory on the CPU is the profiler's record of every allocation (what CUDA's max_memory_allocated "
             "reports on a GPU), not the process's RSS.", ""]
    if losses:
        lines += ["## The loss alone", "",
                  f"LM head + cross-entropy, forward and backward, vocabulary 50,304 and width 128 (the quickstart's), "
                  f"chunks of {DEFAULT_CHUNK_TOKENS} tokens (the default). Peak above the inputs and the head's "
                  "weight; time: median of 7 rounds that alternate the two, the speed-up the median of the rounds' "
                  "ratios.", "",
                  "| tokens | plain peak | chunked peak | memory plain / chunked | plain time | chunked time | "
                  "speed chunked / plain |", "|---|---|---|---|---|---|---|"]
        for r in losses:
            p, c = r["peak"], r["seconds"]
            lines.append(f"| {r['tokens']:,} | {p['plain'] / MiB:,.0f} MiB | {p['chunked'] / MiB:,.0f} MiB | "
                         f"{p['plain'] / p['chunked']:.1f}× | {c['plain'] * 1e3:,.0f} ms | {c['chunked'] * 1e3:,.0f} ms "
                         f"| {r['speedup']:.2f}× |")
        lines.append("")
    if one or two:
        lines += ["## A training step per option", "",
                  "4 layers, width 128, FoX, 4 x 256 tokens a micro-batch, 2 micro-batches a step, vocabulary 8,192, "
                  "fp32, random tokens; peak of one step (weights, gradients, AdamW state and activations of this "
                  "process), median time of 3 steps. The planner's prediction beside the measurement.", "",
                  "| option | peak | planned | memory vs baseline | step time | time vs baseline |",
                  "|---|---|---|---|---|---|"]
        for options, results in ((ONE_PROCESS, one), (TWO_PROCESSES, two)):
            if not results:
                continue
            base = results[0]
            for (name, _), r in zip(options, results):
                lines.append(f"| {name} | {r['peak'] / MiB:,.1f} MiB | {r['planned'] / MiB:,.1f} MiB | "
                             f"{r['peak'] / base['peak']:.2f}× | {r['seconds'] * 1e3:,.0f} ms | "
                             f"{r['seconds'] / base['seconds']:.2f}× |")
        lines.append("")
    if precisions:
        reference = precisions[0]["losses"]
        lines += ["## Precision: FSDP's bf16 parameters against bf16 autocast", "",
                  f"{len(reference)} steps of the byte-level embedded corpus (4 layers, width 128, 8 x 128 tokens a "
                  "micro-batch, 2 a step), one process (FSDP on a group of one), the same seed: each run's losses "
                  "against fp32's. CPU bf16 matmuls are slow, so the times say nothing about a GPU.", "",
                  "| precision | last loss | mean |loss − fp32| | max |loss − fp32| | time |", "|---|---|---|---|---|"]
        for (name, _), r in zip(PRECISIONS, precisions):
            gaps = [abs(a - b) for a, b in zip(r["losses"], reference)]
            lines.append(f"| {name} | {r['losses'][-1]:.4f} | {statistics.mean(gaps):.4f} | {max(gaps):.4f} | "
                         f"{r['seconds']:.0f} s |")
        lines.append("")
    if rows:
        lines += ["## The planner's table (8 GPUs, bf16)", "",
                  "`python -m training.memory CONFIG --gpus 8 --gpu-memory GB` for the FoX configs (the other encodings "
                  "differ by a few percent): GiB per GPU at micro-batch 1 (4,096 tokens), and the largest micro-batch "
                  "that fits on each GPU size (0: none). FSDP's gradients accumulate unsharded between the micro-batches "
                  "of a step (4 bytes a parameter) unless `fsdp_reduce_each_micro_batch`.", "",
                  "| model | parameters | parallel | activation checkpointing | GiB at micro-batch 1 | "
                  + " | ".join(f"fits on {gb} GB" for gb in GPU_GB) + " |",
                  "|---|---|---|---|---|" + "---|" * len(GPU_GB)]
        for r in rows:
            lines.append(f"| {r['model']} | {r['params'] / 1e9:.2f}B | {r['parallel']} | {r['checkpointing']} | "
                         f"{r['one'].total / memory.GiB:.1f} | " + " | ".join(str(f) for f in r["fits"]) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "memory.md"), help="the Markdown file to write")
    parser.add_argument("--skip-planner", action="store_true", help="leave out the planner's table")
    parser.add_argument("--skip-training", action="store_true", help="leave out the training steps and precisions")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    torch.set_num_threads(1)
    losses = [bench_loss(tokens) for tokens in (8 * 128, 8 * 512)]
    print("loss (tokens, memory plain / chunked, speed-up):", [(r["tokens"], round(r["peak"]["plain"] / r["peak"][
        "chunked"], 2), round(r["speedup"], 2)) for r in losses], flush=True)
    one = two = precisions = []
    if not args.skip_training:
        one = []
        for name, overrides in ONE_PROCESS:
            one.append(bench_step(overrides))
            print(f"{name}: peak {one[-1]['peak'] / MiB:.1f} MiB (planned {one[-1]['planned'] / MiB:.1f}), "
                  f"{one[-1]['seconds']:.3f} s a step", flush=True)
        two = bench_two_processes()
        print("two processes:", [(round(r["peak"] / MiB, 1), round(r["seconds"], 3)) for r in two], flush=True)
        precisions = bench_precisions()
    rows = [] if args.skip_planner else planner_rows()
    shown = [os.path.relpath(__file__, ROOT)] + [a for a in ("--skip-planner", "--skip-training")
                                                  if getattr(args, a[2:].replace("-", "_"))]
    text = report(losses, one, two, precisions, rows, "python " + " ".join(shown))
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
