"""Benchmark data preparation (tokens/s, CPU time per token of the main process and of the workers) and batch assembly.

    python bench/bench_data.py            # prints tables, writes the "preparation" section of docs/data_benchmarks.md

Preparation runs data/prepare.py end to end on --copies copies of the embedded corpus, one JSONL file per copy (so
one piece per copy: the workers share them out), for each tokenizer and worker count, --repeats times. Besides the
wall time (which other jobs on a shared machine stretch) it reports CPU time per token, which sharing barely
changes: the main thread's (the serial part: handing out pieces, naming the shards, the manifest), the main
process's (with the threads that hash the input files) and the workers'. "Tokenise only" times encode_documents
in this process: the most one worker can do. Loader: TrainBatches.batch over the prepared shards (page cache warm).
"""
import argparse
import json
import lzma
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from data import prepare as prep  # noqa: E402
from data.loader import TrainBatches, validation_batches  # noqa: E402
from data.shards import DataError  # noqa: E402
from data.tokenizer import encode_documents, get_tokenizer, init_worker  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "data_benchmarks.md")


def write_section(name, text, path=DOC):
    """Print text and put it in docs/data_benchmarks.md between <!-- BEGIN name --> and <!-- END name --> (at the
    end if missing), so that each benchmark script rewrites only its own tables."""
    print(text)
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    old = open(path).read() if os.path.exists(path) else "# Data pipeline benchmarks\n"
    block = f"{begin}\n{text.strip()}\n{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    with open(path + ".tmp", "w") as f:
        f.write(new)
    os.replace(path + ".tmp", path)
    print(f"wrote {path}", file=sys.stderr)


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine():
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.1f} at the start")


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
    start, cpu = time.perf_counter(), time.thread_time()
    flat, _ = encode_documents(texts)
    return len(flat), time.perf_counter() - start, time.thread_time() - cpu


def measured_prepare(source, out, **kwargs):
    """Prepare into a fresh `out`; return (manifest, wall s, main-thread CPU s, main-process CPU s, workers' CPU s)."""
    shutil.rmtree(out, ignore_errors=True)
    before_self, before_children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    start, thread = time.perf_counter(), time.thread_time()
    manifest = prep.prepare(source, out, progress_bar=False, **kwargs)
    wall, thread = time.perf_counter() - start, time.thread_time() - thread
    after_self, after_children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = lambda a, b: (a.ru_utime + a.ru_stime) - (b.ru_utime + b.ru_stime)  # noqa: E731
    return manifest, wall, thread, cpu(after_self, before_self), cpu(after_children, before_children)


def main():
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts to try")
    parser.add_argument("--copies", type=int, default=8, help="copies of the corpus, one file each (more = steadier)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row; the table shows the median")
    parser.add_argument("--out", default=DOC)
    args = parser.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]
    with open(prep.DEFAULT_CORPUS_FILE, "rb") as f:
        texts = [json.loads(line)["text"] for line in lzma.decompress(f.read()).decode("utf-8").splitlines()]

    rows, runs = [], {}
    work_root = tempfile.mkdtemp(prefix="bench_data_")
    os.environ["GRAPE_CACHE_DIR"] = os.path.join(work_root, "cache")  # this run's shard checks, deleted with it
    for i in range(args.copies):
        with open(os.path.join(work_root, f"corpus_{i:03d}.jsonl"), "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    source = prep.files_source(os.path.join(work_root, "corpus_*.jsonl"))
    try:
        # An untimed run first imports what datasets loads lazily (torch included, ~2 s once per process).
        prep.prepare(prep.files_source(os.path.join(work_root, "corpus_000.jsonl")), os.path.join(work_root, "warm"),
                     tokenizer="byte", val_tokens=1000, workers=1, progress_bar=False)
        for name in available_tokenizers():
            tokens, seconds, cpu = bench_tokenize_only(name, texts)
            rows.append([name, "tokenise only (1 process)", f"{tokens:,}", f"{seconds:.2f}", f"{tokens / seconds:,.0f}",
                         "", "", f"{1e9 * cpu / tokens:.0f}"])
            for workers in worker_counts:
                results = [measured_prepare(source, os.path.join(work_root, f"{name}-{workers}"), tokenizer=name,
                                            val_tokens=prep.DEFAULT_CORPUS_VAL_TOKENS[name], workers=workers)
                           for _ in range(args.repeats)]
                tokens = results[0][0]["tokens"]["total"]
                wall, thread, main_cpu, worker_cpu = (statistics.median(r[k] for r in results) for k in range(1, 5))
                if workers == 1:  # the one worker is this process: its CPU time is the main process's
                    worker_cpu, main_cpu = main_cpu, 0.0
                runs[(name, workers)] = {"tokens": tokens, "wall": wall, "thread": thread, "main": main_cpu,
                                         "workers": worker_cpu}
                walls = ", ".join(f"{r[1]:.2f}" for r in results)
                rows.append([name, f"prepare.py, {workers} worker{'s' * (workers > 1)}", f"{tokens:,}",
                             f"{wall:.2f} ({walls})", f"{tokens / wall:,.0f}",
                             f"{1e9 * thread / tokens:.1f}" if workers > 1 else "(is the worker)",
                             f"{1e9 * main_cpu / tokens:.1f}" if workers > 1 else "(is the worker)",
                             f"{1e9 * worker_cpu / tokens:.0f}"])
        data_name = "gpt2" if ("gpt2", worker_counts[0]) in runs else "byte"
        data_dir = os.path.join(work_root, f"{data_name}-{worker_counts[0]}")
        loader_rows = []
        for batch_size, block_size in [(8, 128), (16, 1024), (20, 4096)]:
            tb = TrainBatches(data_dir, batch_size=batch_size, block_size=block_size, seed=0)
            tb.batch(0)
            start, cpu = time.perf_counter(), time.thread_time()
            for i in range(300):
                tb.batch(i)
            per_batch, cpu = (time.perf_counter() - start) / 300, (time.thread_time() - cpu) / 300
            loader_rows.append([f"TrainBatches.batch B={batch_size} T={block_size}", f"{per_batch * 1e6:,.0f}",
                                f"{cpu * 1e6:,.0f}", f"{batch_size * block_size / per_batch / 1e6:,.1f}"])
        start = time.perf_counter()
        n_val = sum(1 for _ in validation_batches(data_dir, batch_size=16, block_size=1024))
        per_val = (time.perf_counter() - start) / max(n_val, 1)
        loader_rows.append([f"validation_batches B=16 T=1024 ({n_val} batches)", f"{per_val * 1e6:,.0f}", "",
                            f"{16 * 1024 / per_val / 1e6:,.1f}"])
    finally:
        shutil.rmtree(work_root, ignore_errors=True)

    lines = [f"Command: `python bench/bench_data.py` (`--copies {args.copies} --repeats {args.repeats}`). Machine: "
             f"{machine()}; the 2 cores are shared with other jobs, so wall times vary from run to run (the repeats "
             "are in brackets) while CPU time per token barely does. Input: the embedded default corpus "
             f"({len(texts):,} documents, {sum(map(len, texts)):,} characters) written {args.copies} times, one local "
             "JSONL file per copy (no download time included).", "", "## Preparation", "",
             markdown_table(["tokenizer", "run", "tokens", "seconds: median (each run)", "tokens/s",
                             "main thread CPU ns/token", "main process CPU ns/token", "workers' CPU ns/token"], rows),
             ""]
    gpt2 = [runs.get(("gpt2", w)) for w in worker_counts if w > 1 and ("gpt2", w) in runs]
    if gpt2:
        run = gpt2[-1]
        per_worker = run["tokens"] / run["workers"]  # tokens per CPU-second of a worker: what one more core adds
        serial = run["thread"] / run["tokens"]  # main-thread CPU s per token: the part no worker count shortens
        main_total = run["main"] / run["tokens"]
        projection = []
        for workers in (1, 2, 16, 64):
            rate = min(workers * per_worker, 1 / serial)
            measured = runs.get(("gpt2", workers))
            label = f"{workers}" + (f" (measured here: {measured['tokens'] / measured['wall']:,.0f} tokens/s on "
                                    "shared cores)" if measured else "")
            projection.append([label, f"{rate:,.0f}", f"{1e9 / rate / 60:.1f} min", f"{1e11 / rate / 3600:.1f} h"])
        lines += ["Projection for GPT-2 tokens with more cores. Assumptions: each worker tokenises "
                  f"{per_worker:,.0f} tokens per CPU-second (the 2-worker run's tokens / its workers' CPU time: "
                  "cores of this machine's speed, not slowed by each other); the input has at least as many files as "
                  "there are workers (a worker takes whole files: a hub sample's parquet files, which prepare.py "
                  "counts and prints as pieces); the main thread's "
                  f"{1e9 * serial:.1f} ns of CPU per token is the only serial part, a cap of {1 / serial:,.0f} "
                  f"tokens/s (its process spends {1e9 * main_total:.1f} ns/token including the threads that hash the "
                  "input, which run in parallel); disks keep up (2 bytes written per token and the input read "
                  "once, about 5 bytes per token as JSONL); download time from the hub comes on top.", "",
                  markdown_table(["workers", "tokens/s", "per 1B tokens", "100B sample"], projection), ""]
    lines += ["## Loader", "", markdown_table(["operation", "µs per batch", "CPU µs per batch", "M tokens/s"],
                                               loader_rows), "",
              "Batch assembly is a gather of B windows from memory-mapped shards plus a uint16 -> int64 copy. The "
              "paper's per-GPU demand, the cold page cache and the background prefetching are measured by "
              "`python bench/bench_scale.py` (below).", ""]
    write_section("preparation", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()
