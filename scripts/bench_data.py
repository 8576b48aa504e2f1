"""Benchmark the data pipeline: shard preparation throughput and training-batch assembly speed.

    python scripts/bench_data.py            # prints tables and writes docs/data_benchmarks.md

Preparation runs data/prepare.py end to end (datasets reads --repeat copies of the embedded corpus as JSONL, worker processes
tokenise, shards are written) for each tokenizer and worker count; tokens/s per worker = total / workers.
"Tokenise only" times encode_documents in this process, the upper bound of one worker.
Loader: TrainBatches.batch over the prepared train shards (memory-mapped, page cache warm).
"""
import argparse
import json
import lzma
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from data import prepare as prep  # noqa: E402
from data.loader import TrainBatches, validation_batches  # noqa: E402
from data.shards import DataError  # noqa: E402
from data.tokenizer import encode_documents, get_tokenizer, init_worker  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def available_tokenizers():
    names = ["byte"]
    try:
        get_tokenizer("gpt2")
        names.insert(0, "gpt2")
    except DataError as exc:
        print(f"skipping gpt2: {exc}", file=sys.stderr)
    return names


def bench_tokenize_only(name, texts):
    init_worker(name)
    start = time.perf_counter()
    flat, _ = encode_documents(texts)
    return len(flat), time.perf_counter() - start


def bench_prepare(name, workers, corpus_file, work_root):
    out = os.path.join(work_root, f"{name}-{workers}")
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    manifest = prep.prepare(prep.files_source(corpus_file), out, tokenizer=name, val_tokens=prep.DEFAULT_CORPUS_VAL_TOKENS,
                            shard_tokens=prep.DEFAULT_SHARD_TOKENS, workers=workers, progress_bar=False)
    return manifest["tokens"]["total"], time.perf_counter() - start


def bench_loader(data_dir, batch_size, block_size, n_batches):
    tb = TrainBatches(data_dir, batch_size=batch_size, block_size=block_size, seed=0)
    tb.batch(0)
    start = time.perf_counter()
    for i in range(n_batches):
        tb.batch(i)
    per_batch = (time.perf_counter() - start) / n_batches
    return per_batch, batch_size * block_size / per_batch


def bench_validation(data_dir, batch_size, block_size):
    start = time.perf_counter()
    n = sum(1 for _ in validation_batches(data_dir, batch_size=batch_size, block_size=block_size))
    return n, (time.perf_counter() - start) / max(n, 1)


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts to try")
    parser.add_argument("--repeat", type=int, default=4, help="copies of the corpus to prepare (more = steadier)")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "data_benchmarks.md"))
    args = parser.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]
    with open(prep.DEFAULT_CORPUS_FILE, "rb") as f:
        texts = [json.loads(line)["text"] for line in lzma.decompress(f.read()).decode("utf-8").splitlines()]

    prep_rows, per_worker, totals = [], {}, {}
    work_root = tempfile.mkdtemp(prefix="bench_data_")
    corpus_file = os.path.join(work_root, "corpus.jsonl")
    with open(corpus_file, "w") as f:
        for _ in range(args.repeat):
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    try:
        # A first tiny run imports what datasets loads lazily (torch included, ~2 s once per process), untimed.
        warm = os.path.join(work_root, "warm.jsonl")
        with open(warm, "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts[:20])
        prep.prepare(prep.files_source(warm), os.path.join(work_root, "warm"), tokenizer="byte", val_tokens=1000,
                     workers=1, progress_bar=False)
        for name in available_tokenizers():
            tokens, seconds = bench_tokenize_only(name, texts)
            prep_rows.append([name, "tokenise only (1 process)", f"{tokens:,}", f"{seconds:.2f}",
                              f"{tokens / seconds:,.0f}", f"{tokens / seconds:,.0f}"])
            for workers in worker_counts:
                tokens, seconds = bench_prepare(name, workers, corpus_file, work_root)
                per_worker[(name, workers)] = tokens / seconds / workers
                totals[name] = tokens
                prep_rows.append([name, f"prepare.py, {workers} worker{'s' * (workers > 1)}", f"{tokens:,}",
                                  f"{seconds:.2f}", f"{tokens / seconds:,.0f}", f"{tokens / seconds / workers:,.0f}"])
        bytes_per_gpt2_token = totals["byte"] / totals["gpt2"] if "gpt2" in totals else 1.0
        data_name = "gpt2" if ("gpt2", worker_counts[0]) in per_worker else "byte"
        data_dir = os.path.join(work_root, f"{data_name}-{worker_counts[0]}")
        loader_rows = []
        for batch_size, block_size in [(8, 128), (16, 1024), (64, 1024), (8, 4096)]:
            per_batch, rate = bench_loader(data_dir, batch_size, block_size, n_batches=300)
            loader_rows.append([f"TrainBatches.batch B={batch_size} T={block_size}", f"{per_batch * 1e6:,.0f}",
                                f"{rate / 1e6:,.1f}"])
        n_val, per_val = bench_validation(data_dir, 16, 1024)
        loader_rows.append([f"validation_batches B=16 T=1024 ({n_val} batches)", f"{per_val * 1e6:,.0f}",
                            f"{16 * 1024 / per_val / 1e6:,.1f}"])
    finally:
        shutil.rmtree(work_root, ignore_errors=True)

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    prep_table = markdown_table(["tokenizer", "run", "tokens", "seconds", "tokens/s", "tokens/s per worker"],
                                prep_rows)
    loader_table = markdown_table(["operation", "µs per batch", "M tokens/s"], loader_rows)
    # The main process (datasets reading, the shard loop) caps the total rate whatever the worker count. The
    # byte-tokenizer runs, whose tokenisation costs almost nothing, measure that cap in bytes of text per
    # second; converted at the corpus's bytes per GPT-2 token it is a conservative cap in GPT-2 tokens/s.
    byte_cap = max((rate * w for (n, w), rate in per_worker.items() if n == "byte"), default=float("inf"))
    cap = byte_cap / bytes_per_gpt2_token
    extrapolation = []

    def extrapolated_row(label, rate):
        minutes = 1e9 / rate / 60
        extrapolation.append([label, f"{rate:,.0f}", f"{minutes:.0f} min", f"{minutes * 10 / 60:.1f} h",
                              f"{minutes * 100 / 60:.1f} h"])

    for (name, workers), rate in sorted(per_worker.items()):
        if name == "gpt2":
            extrapolated_row(f"{workers} (measured)", rate * workers)
    gpt2_rates = [rate for (name, _), rate in per_worker.items() if name == "gpt2"]
    if gpt2_rates:
        for workers in (8, 16, 32):
            extrapolated_row(f"{workers} (extrapolated)", min(max(gpt2_rates) * workers, cap))
    lines = ["# Data pipeline benchmarks", "",
             f"Machine: {machine}. Command: `python scripts/bench_data.py`. Input: the embedded default corpus "
             f"({len(texts):,} documents, {sum(map(len, texts)):,} characters) written {args.repeat} times to one "
             "local JSONL file (no download time included). Each row is one run after an untimed warm-up run (imports), including worker start-up; the "
             "machine may be shared with other jobs.", "", "## Preparation", "", prep_table, ""]
    if extrapolation:
        lines += ["Time to prepare GPT-2 tokens, measured here and extrapolated to more cores (local files, no "
                  "download time). Extrapolated rows multiply the best tokens/s per worker by the worker count, "
                  f"capped at {cap:,.0f} tokens/s: the main process alone reads {byte_cap:,.0f} bytes of text per "
                  "second (the fastest byte-tokenizer run, whose tokenisation is nearly free), which is "
                  f"{cap:,.0f} GPT-2 tokens/s at this corpus's {bytes_per_gpt2_token:.2f} bytes per token. The "
                  "extrapolated rows are estimates of the CPU part, not measurements: they assume the workers "
                  "scale linearly up to that cap:", "",
                  markdown_table(["workers", "tokens/s", "per 1B tokens", "10B sample", "100B sample"], extrapolation),
                  ""]
    lines += ["## Loader", "", loader_table, "",
              "Batch assembly is a gather of B windows from memory-mapped shards plus a uint16 -> int64 copy; "
              "it is far below a training step's time, so train.py needs no background loader.", ""]
    text = "\n".join(lines)
    print(text)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
