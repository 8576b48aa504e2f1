"""compile = true under FSDP on a GPU: the compiled FSDP run's losses against the uncompiled one's (gpu_check.sh).

    python3 tools/fsdp_compile_check.py --out docs/fsdp_compile_gpu.md      # one GPU, NCCL, about a minute

Launches tests/distributed_runs.py under torchrun (one process per GPU asked for, NCCL) with two runs of the CPU
model (configs/cpu/rope.toml, byte tokens, offline) under FSDP: eager, then `--compile`, in fp32 and in bf16.
The test suite does the same on the CPU with gloo and inductor's C++ backend; here inductor emits Triton, and the
bf16 case, whose matrices are FSDP units of their own, breaks each block's graph at them (the start-up line says
so). Writes a table: each dtype's largest relative gap between the compiled and the eager losses, gradient norms
and validation losses, the graphs made and the graph breaks, beside the tolerance it is held to. Exit status 1
when a gap passes its tolerance or the compiled run made no graph.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# fp32: inductor's fused arithmetic rounds differently, ~1e-7 a step (measured on the CPU over 6 steps: 1.2e-6 on
# the gradient norms), so 1e-4 is far below what a wrong block or an unreduced gradient does. bf16: the matrices
# round to 8 bits in either run, but fused ops keep some intermediates in fp32 where the eager run rounds them:
# differences of a few bf16 units (2^-8 = 0.4%) per step, which 6 steps of a falling loss do not amplify past 2%.
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}
TRAIN = ["--max_iters=6", "--warmup_iters=2", "--global_batch_size=4", "--batch_size=1", "--eval_interval=3",
         "--eval_windows=4", "--log_interval=1", "--parallel=fsdp"]


def largest_gap(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def run(gpus: int, dtype: str, folder: str, seconds: float, device: str) -> tuple[dict, dict, str]:
    config = os.path.join(ROOT, "configs", "cpu", "rope.toml")
    runs = [[config, *TRAIN, f"--device={device}", f"--dtype={dtype}", f"--out_dir={os.path.join(folder, dtype, name)}",
             *more]
            for name, more in (("eager", []), ("compiled", ["--compile"]))]
    plan = os.path.join(folder, f"{dtype}.json")
    results = os.path.join(folder, f"{dtype}_results.json")
    with open(plan, "w") as f:
        json.dump({"runs": runs, "results": results}, f)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
                           os.path.join(ROOT, "tests", "distributed_runs.py"), plan],
                          capture_output=True, text=True, timeout=seconds, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun exit status {done.returncode}: {done.stderr[-2000:]}")
    with open(results) as f:
        eager, compiled = json.load(f)["runs"]
    start = next((line for line in done.stdout.splitlines() if line.startswith("model: ") and "compile: " in line
                  and "compile: off" not in line), "")
    said = re.search(r"compile: [^,(]*(?:\([^)]*\))?[^,]*", start)
    return eager, compiled, said.group(0) if said else "(no start-up line)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=1, help="processes, one per GPU (default 1)")
    parser.add_argument("--seconds", type=float, default=150, help="the most each dtype's launch may take")
    parser.add_argument("--out", default="docs/fsdp_compile_gpu.md", help="the Markdown table written")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the same launch with gloo, to try this script without a GPU (fp32 only)")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("fsdp_compile_check: no CUDA device; nothing run", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name() if args.device == "cuda" else "the CPU (gloo)"
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as folder:
        for dtype in ("fp32", "bf16") if args.device == "cuda" else ("fp32",):
            start = time.time()
            try:
                eager, compiled, said = run(args.gpus, dtype, folder, args.seconds, args.device)
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                rows.append(f"| {dtype} | failed: {' '.join(str(error).split())[:300]} | | | | | | |")
                failed = True
                write_table(args, where, rows)
                continue
            gaps = [largest_gap(compiled[key], eager[key]) for key in ("losses", "grad_norms")]
            gaps.append(largest_gap([v for _, v in compiled["val_losses"]], [v for _, v in eager["val_losses"]]))
            ok = max(gaps) <= TOLERANCE[dtype] and compiled["graphs"] > 0 and eager["graphs"] == 0
            failed |= not ok
            rows.append(f"| {dtype} | {gaps[0]:.2e} | {gaps[1]:.2e} | {gaps[2]:.2e} | {TOLERANCE[dtype]:g} | "
                        f"{compiled['graphs']} graphs, {compiled['graph_breaks']} breaks | {said} | "
                        f"{'ok' if ok else 'FAILED'} ({time.time() - start:.0f} s) |")
            print(rows[-1], flush=True)
            write_table(args, where, rows)  # after each dtype: cut short by gpu_check.sh, the rows before it stay
    return 1 if failed else 0


def write_table(args, where: str, rows: list[str]) -> None:
    import torch

    backend = "NCCL" if args.device == "cuda" else "gloo"
    text = ("# compile = true under FSDP on a GPU\n\n"
            f"`python3 tools/fsdp_compile_check.py --gpus {args.gpus} --device {args.device}` on {where}, torch "
            f"{torch.__version__}: configs/cpu/rope.toml for 6 steps under FSDP ({args.gpus} process(es), {backend}), "
            "compiled against eager; largest relative gap of each series.\n\n"
            "| dtype | losses | grad norms | validation losses | tolerance | torch.compile | start-up line "
            "| verdict |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
