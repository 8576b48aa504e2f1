"""Whole-model training throughput per positional encoding (tokens/s, and MFU on a GPU).

    python bench/bench_train.py                                    # CPU: configs/quickstart.toml at T=512
    python bench/bench_train.py --config configs/base/medium.toml --out docs/benchmarks_train_gpu.md   # GPU
    python bench/bench_train.py --config configs/quickstart.toml --block_size=256 --batch_size=4  # overrides

A training step is what train.py does per micro-batch: forward, loss, backward, AdamW step (bf16
autocast on a GPU, fp32 on the CPU), on random tokens (data loading is not measured), with
torch.compile when the config sets `compile = true` as train.py would (the paper configs do; the
quickstart does not), unless --compile / --no-compile says otherwise. Every encoding is
timed in rounds alternating with a RoPE model of the same config, and its speed is reported as the
median ratio to RoPE within a round (robust to the load of a shared machine) beside the median tokens/s.
MFU = model.flops_per_token(T) · tokens/s / the GPU's bf16 dense peak. On a GPU each encoding's
peak memory is measured over one training step of its own, above what was allocated before the step
(weights, gradients and optimizer state of the models held), so the column compares activations.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from config import ConfigError, resolve  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from positional import ENCODINGS  # noqa: E402
from bench.bench_attention import PeakMemory, bench_device  # noqa: E402
from training.metrics import gpu_peak_flops  # noqa: E402
from training.optimizer import param_groups  # noqa: E402

DEFAULT_ENCODINGS = list(ENCODINGS) + ["rope+kv_shift", "rope+grape_ap"]
SEPARABLE = ["alibi", "grape_a_q", "grape_a_k", "grape_a_qk", "fox"]  # the target below is for these


def make_model(model_cfg: GPTConfig, pos: str, device, compile_model: bool):
    kv_shift = pos.endswith("+kv_shift")
    cfg = dataclasses.replace(model_cfg, pos=pos.removesuffix("+kv_shift"), kv_shift=kv_shift or model_cfg.kv_shift)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.95), fused=device.type == "cuda")
    runner = torch.compile(model) if compile_model else model
    return model, runner, optimizer


def make_step(runner, optimizer, batch, T, vocab, device, dtype):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, vocab, (batch, T + 1), generator=g).to(device)
    x, y = idx[:, :-1], idx[:, 1:]
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step():
        with autocast:
            _, loss = runner(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def timed(fn, n, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def parse_args(argv):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                 epilog="Unknown --key=value arguments override the config file's model/train keys.")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "quickstart.toml"))
    ap.add_argument("--encodings", default=",".join(DEFAULT_ENCODINGS))
    ap.add_argument("--steps", type=int, default=3, help="training steps per timed round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile each model (default: the config's train.compile, as train.py runs)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1: stable on a shared machine; 0 = torch's default)")
    ap.add_argument("--peak_tflops", type=float, default=None, help="bf16 peak of the GPU if not in the built-in table")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks_train.md"))
    args, overrides = ap.parse_known_args(argv)
    bad = [o for o in overrides if not o.startswith("--")]
    if bad:
        ap.error(f"unexpected arguments {bad}; overrides are --key=value")
    args.encodings = [e.strip() for e in args.encodings.split(",") if e.strip()]
    return args, overrides


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parse_args(argv)
    on_cpu_default = args.config == os.path.join(ROOT, "configs", "quickstart.toml")
    if on_cpu_default and not any(o.startswith(("--block_size", "--model.block_size")) for o in overrides):
        overrides = ["--block_size=512", *overrides]  # long enough for attention to matter
    try:
        model_cfg, train_cfg = resolve(args.config, overrides, GPTConfig)
    except (ConfigError, FileNotFoundError, ValueError) as error:
        sys.exit(f"bench_train: {error}")
    for pos in args.encodings:
        try:
            dataclasses.replace(model_cfg, pos=pos.removesuffix("+kv_shift"))
        except ValueError as error:
            sys.exit(f"bench_train: {error}")
    device, dtype = bench_device(args.device, args.threads, "bench_train")
    if args.compile is None:
        args.compile = train_cfg.compile
    peak = args.peak_tflops * 1e12 if args.peak_tflops and device.type == "cuda" else gpu_peak_flops(device)
    T, batch = model_cfg.block_size, train_cfg.batch_size
    tokens = batch * T * args.steps

    rope, rope_runner, rope_opt = make_model(model_cfg, "rope", device, args.compile)
    rope_step = make_step(rope_runner, rope_opt, batch, T, model_cfg.vocab_size, device, dtype)
    for _ in range(args.warmup):
        rope_step()
    attention_flops = 12 * model_cfg.n_layer * model_cfg.n_head * model_cfg.head_dim * T
    attention_share = attention_flops / rope.flops_per_token(T)
    rows = []
    for pos in args.encodings:
        model, runner, opt = (rope, rope_runner, rope_opt) if pos == "rope" else make_model(model_cfg, pos, device, args.compile)
        step = rope_step if pos == "rope" else make_step(runner, opt, batch, T, model_cfg.vocab_size, device, dtype)
        for _ in range(args.warmup):
            step()
        mem = None
        if device.type == "cuda":
            with PeakMemory(device) as peak_memory:
                step()
            mem = peak_memory.peak / 2**30
        speeds, ratios = [], []
        for _ in range(args.rounds):
            base = timed(rope_step, args.steps, device)
            seconds = base if pos == "rope" else timed(step, args.steps, device)
            speeds.append(tokens / seconds)
            ratios.append(base / seconds)
        tok_s = statistics.median(speeds)
        mfu = model.flops_per_token(T) * tok_s / peak if peak else None
        rows.append((pos, tok_s, statistics.median(ratios), mfu, mem, model.attention_backend))
        print(f"{pos:>16}: {tok_s:10.0f} tokens/s, {statistics.median(ratios):.2f}x RoPE"
              + (f", MFU {mfu:.1%}" if mfu is not None else "") + (f", peak {mem:.1f} GiB" if mem else ""), flush=True)
        if pos != "rope":
            del model, runner, opt, step
        # after every encoding, so a run cut short by a time limit still leaves its numbers
        write_report(args, argv, rows, model_cfg, train_cfg, device, dtype, peak, attention_share)


def write_report(args, argv, rows, model_cfg, train_cfg, device, dtype, peak, attention_share):
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    where = (f"GPU {torch.cuda.get_device_name(device)}" if device.type == "cuda"
             else f"CPU, {torch.get_num_threads()} thread(s) (shared machine)")
    lines = ["# Training throughput per encoding", "",
             f"Generated by `python bench/bench_train.py {' '.join(argv)}` (commit {commit or 'unknown'}); {where}; "
             f"torch {torch.__version__}; {str(dtype).removeprefix('torch.')}"
             + (" autocast" if dtype != torch.float32 else "") + (", torch.compile" if args.compile else "") + ".",
             f"Model: {model_cfg.n_layer} layers, n_embd {model_cfg.n_embd}, {model_cfg.n_head} heads of {model_cfg.head_dim}, "
             f"T = {model_cfg.block_size}, vocabulary {model_cfg.vocab_size}, batch {train_cfg.batch_size} sequences per step "
             f"(random tokens; forward, backward, AdamW). Attention scores and values are {attention_share:.0%} of RoPE's "
             "training FLOPs at this size, which bounds how much any encoding can change the speed.",
             f"Median over {args.rounds} rounds of {args.steps} steps; each round also times the RoPE model, and "
             "`speed vs RoPE` is the median within-round speed ratio (above 1 = faster than RoPE)."
             + (f" MFU against a bf16 dense peak of {peak / 1e12:.0f} TFLOP/s, FLOPs = model.flops_per_token(T)." if peak else ""),
             "",
             "| encoding | attention backend | tokens/s | speed vs RoPE |"
             + (" MFU | step peak GiB | memory vs RoPE |" if device.type == "cuda" else ""),
             "|---|---|---|---|" + ("---|---|---|" if device.type == "cuda" else "")]
    additive = [row for row in rows if row[0] in SEPARABLE]
    if device.type == "cuda" and additive:
        worst = min(additive, key=lambda row: row[2])
        lines[-2:-2] = [f"Target (GPU): every additive encoding at ≥ 0.95× RoPE's tokens/s: "
                        f"{'holds' if worst[2] >= 0.95 else 'MISSED'} (slowest `{worst[0]}` at {worst[2]:.2f}×, "
                        f"{len(additive)} measured).", ""]
    rope_mem = next((row[4] for row in rows if row[0] == "rope"), None)
    for pos, tok_s, ratio, mfu, mem, backend in rows:
        line = f"| `{pos}` | {backend} | {tok_s:,.0f} | {ratio:.2f}× |"
        if device.type == "cuda":
            line += (f" {'—' if mfu is None else f'{mfu:.1%}'} | {mem:.2f} |"
                     f" {f'{mem / rope_mem:.2f}×' if rope_mem else '—'} |")
        lines.append(line)
    lines.append("")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines))
    os.replace(tmp, args.out)
    print(f"wrote {args.out} ({len(rows)} encodings)")


if __name__ == "__main__":
    main()
