"""Benchmark the data path at sizes where it matters: datasets of 1 and 4 GB of shards (byte tokens) made here.

    python bench/bench_scale.py            # prints tables, writes the "scale" section of docs/data_benchmarks.md
    python bench/bench_scale.py --sizes-gb 1,4 --baseline d9f9fd3 --repeats 2

1. Each dataset is prepared with 2 workers from copies of the embedded corpus (JSONL files of 32 copies each, 88M tokens).
2. Launch to first step: `torchrun --standalone --nproc_per_node=2 train.py` (a 2-layer model, one step of 4 x 32
   tokens: 2 per process) until its "iter 1" line, with the code of commit --baseline (every process reads every shard in full at
   every start), and with this code at the first start (no record yet: the 2 processes share the reading) and at
   later starts (recorded: headers only). The shards are evicted from the page cache before each launch
   (posix_fadvise DONTNEED), as on a node that has not read them yet.
3. The loader alone at the paper's per-GPU demand (micro-batches of 20 x 4096 tokens, 3 per step: 480 sequences on
   8 GPUs) on the largest dataset, page cache warm and evicted; then PrefetchedBatches feeding a consumer that takes
   10x what one H200 trains on (~150k tokens/s for the medium model, compiled): a sleep of 20 x 4096 / 1.5M s per
   micro-batch. The consumer's waits for data are what a training step would wait.
The machine's 2 cores are shared with other jobs: times vary between runs (all repeats are shown); CPU time per
batch barely does.
"""
import argparse
import json
import lzma
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_data import machine, markdown_table, measured_prepare, write_section  # noqa: E402
from data import prepare as prep  # noqa: E402
from data.loader import TrainBatches  # noqa: E402
from data.manifest import split_files  # noqa: E402
from data.prefetch import PrefetchedBatches  # noqa: E402
from data.verify import verify_all  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPIES_PER_FILE = 32
H200_TOKENS_PER_S = 150_000


def make_dataset(work, size_gb, texts):
    """Prepare about size_gb GB of byte-token shards from copies of the corpus; return (dir, prepare timings)."""
    folder = os.path.join(work, f"input-{size_gb}gb")
    os.makedirs(folder, exist_ok=True)
    copy = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    tokens_per_copy = sum(len(t.encode()) + 1 for t in texts)
    copies = int(size_gb * 1e9 / 2 / tokens_per_copy + 1)
    for i in range(0, copies, COPIES_PER_FILE):
        with open(os.path.join(folder, f"part_{i // COPIES_PER_FILE:04d}.jsonl"), "w") as f:
            for _ in range(min(COPIES_PER_FILE, copies - i)):
                f.write(copy)
    out = os.path.join(work, f"data-{size_gb}gb")
    timings = measured_prepare(prep.files_source(os.path.join(folder, "*.jsonl")), out, tokenizer="byte",
                               val_tokens=1_000_000, workers=2)
    shutil.rmtree(folder)  # the input is not needed any more: keep the disk for the shards
    return out, timings


def evict(data_dir):
    for split in ("val", "train"):
        for path in split_files(data_dir, split):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def launch_to_first_step(code_dir, config, out_dir, cache_dir):
    """Seconds from starting torchrun (2 processes) to the first step's log line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "GRAPE_CACHE_DIR": cache_dir}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", config, f"--out_dir={out_dir}"], cwd=code_dir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds, output = None, []
    for line in proc.stdout:
        output.append(line)
        if seconds is None and re.match(r"iter +1/", line):
            seconds = time.perf_counter() - start
    proc.wait()
    if proc.returncode != 0 or seconds is None:
        raise RuntimeError("".join(output[:40]))
    shutil.rmtree(out_dir)
    return seconds


CHECK = """
import json, sys, time
from data.loader import verify_shards
start, cpu = time.perf_counter(), time.process_time()
verify_shards(sys.argv[1], vocab_size=320)
print(json.dumps([time.perf_counter() - start, time.process_time() - cpu]))
"""


def check_alone(code_dir, data_dir, cache_dir):
    """(seconds, CPU seconds) of one process's shard check (verify_shards of train and validation) at start."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRAPE_CACHE_DIR": cache_dir, "PYTHONPATH": code_dir}
    done = subprocess.run([sys.executable, "-c", CHECK, data_dir], cwd=code_dir, env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def loader_rates(data_dir, batches, cold):
    """Seconds and CPU seconds per TrainBatches.batch of 20 x 4096 tokens, page cache warm or evicted."""
    tb = TrainBatches(data_dir, batch_size=20, block_size=4096, seed=1)
    if cold:
        evict(data_dir)
    else:
        for i in range(batches):  # the same batches once, so that their pages are cached
            tb.batch(i)
    start, cpu = time.perf_counter(), time.thread_time()
    for i in range(batches):
        tb.batch(i)
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    return wall / batches, cpu / batches


def prefetch_waits(data_dir, steps, micro=3):
    """Per step, the seconds a consumer of 10x an H200's tokens/s spends in PrefetchedBatches.batch (page cache
    evicted), the seconds per micro-batch of its compute, and how many batches after the first step were not
    ready when asked for (a wait on data; the rest of a wall-clock wait is this busy machine's scheduling)."""
    tb = TrainBatches(data_dir, batch_size=20, block_size=4096, seed=2)
    batches = PrefetchedBatches(tb, stride=8, vocab_size=257)  # rank 0 of 8 GPUs: every 8th batch index
    compute = 20 * 4096 / (10 * H200_TOKENS_PER_S)
    evict(data_dir)
    waits, late = [], 0
    for step in range(steps):
        waited = 0.0
        for m in range(micro):
            start = time.perf_counter()
            batches.batch((step * micro + m) * 8)
            waited += time.perf_counter() - start
            time.sleep(compute)
        waits.append(waited)
        if step == 0:
            late = batches.late  # the first batch is always read on demand
    return waits, compute, batches.late - late


def growth_sentence(sizes, medians, checks):
    """What the measurements say at the paper's 100B GPT-2 tokens (200 GB of shards)."""
    large = max(sizes)
    per_gb = checks[(large, None)] / large
    return (f"Before, every start cost every process {per_gb:.2f} CPU seconds per GB of shards (sha256 and the largest "
            f"id of each, {checks[(large, None)]:.1f} s at {large} GB): about {200 * per_gb / 60:.0f} CPU minutes per "
            "process per start at 200 GB, and the disk had to deliver the 200 GB to every process (8 per node) at every "
            f"start. With the record a start's check costs {1e3 * checks[(large, 'kept')]:.0f} ms of CPU at {large} GB:"
            f" one header read per shard (1,000 shards at 200 GB); launch to first step was "
            f"{medians[(min(sizes), 'kept')]:.1f} s at {min(sizes)} GB and "
            f"{medians[(large, 'kept')]:.1f} s at {large} GB. The first start on new data reads it once, shared by the "
            "processes (or not at all after `python -m data.prepare --verify DIR`).")


def main():
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-gb", default="1,4", help="dataset sizes (GB of shards)")
    parser.add_argument("--baseline", default="d9f9fd3", help="commit whose start-up is the 'before' row")
    parser.add_argument("--repeats", type=int, default=3, help="launches per row")
    parser.add_argument("--work", default=None, help="folder for the data (default: a temp folder, deleted after)")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "data_benchmarks.md"))
    args = parser.parse_args()
    sizes = [float(s) if "." in s else int(s) for s in args.sizes_gb.split(",")]
    with open(prep.DEFAULT_CORPUS_FILE, "rb") as f:
        texts = [json.loads(line)["text"] for line in lzma.decompress(f.read()).decode("utf-8").splitlines()]
    work = tempfile.mkdtemp(prefix="bench_scale_", dir=args.work)
    os.environ["GRAPE_CACHE_DIR"] = os.path.join(work, "cache-loader")  # this run's shard checks, deleted with it
    baseline = os.path.join(work, "baseline")
    os.makedirs(baseline)
    subprocess.run(f"git archive {args.baseline} | tar -x -C {baseline}", shell=True, cwd=REPO, check=True)
    prep_rows, start_rows, check_rows, datasets, medians, checks = [], [], [], {}, {}, {}
    try:
        for size in sizes:
            data_dir, (manifest, wall, thread, main_cpu, worker_cpu) = make_dataset(work, size, texts)
            datasets[size] = data_dir
            tokens = manifest["tokens"]["total"]
            prep_rows.append([f"{size} GB", f"{tokens:,}", len(manifest["shards"]), f"{wall:.1f}",
                              f"{tokens / wall / 1e6:.1f}", f"{1e9 * thread / tokens:.2f}",
                              f"{1e9 * worker_cpu / tokens:.1f}"])
            config = os.path.join(work, f"tiny-{size}.toml")
            with open(config, "w") as f:
                f.write(tiny_config(data_dir, model={"pos": "rope"}, batch_size=2, max_iters=1, warmup_iters=0))
            cases = [("before", f"baseline {args.baseline}: every process reads every shard", baseline, None),
                     ("first", "this code, first start: no record, the 2 processes share the reading", REPO, "new"),
                     ("later", "this code, later starts: recorded, headers only", REPO, "kept")]
            cache = os.path.join(work, f"cache-{size}")
            for _, label, code, record in cases:  # the check alone, one process
                if record == "new":
                    shutil.rmtree(cache, ignore_errors=True)
                evict(data_dir)
                seconds, cpu = check_alone(code, data_dir, cache)
                check_rows.append([f"{size} GB", label.split(":")[0], f"{seconds:.3f}", f"{cpu:.3f}",
                                   "(headers: per shard)" if record == "kept" else f"{cpu / size:.2f}"])
                checks[(size, record)] = cpu
            for _, label, code, record in cases:
                seconds = []
                for _ in range(args.repeats):
                    if record == "new":
                        shutil.rmtree(cache, ignore_errors=True)
                    evict(data_dir)
                    seconds.append(launch_to_first_step(code, config, os.path.join(work, "run"), cache))
                medians[(size, record)] = statistics.median(seconds)
                start_rows.append([f"{size} GB", label, f"{statistics.median(seconds):.1f}",
                                   ", ".join(f"{s:.1f}" for s in seconds)])
                print(start_rows[-1], file=sys.stderr)
        largest = datasets[max(sizes)]
        evict(largest)
        start = time.perf_counter()
        count, size_bytes, problems = verify_all(largest, workers=2)
        verify_seconds = time.perf_counter() - start
        assert not problems, problems
        loader_rows = []
        for cold in (False, True):
            per_batch, cpu = loader_rates(largest, 200, cold)
            loader_rows.append([f"TrainBatches.batch, page cache {'evicted' if cold else 'warm'}",
                                f"{per_batch * 1e3:.2f}", f"{cpu * 1e3:.2f}", f"{20 * 4096 / per_batch / 1e6:.1f}",
                                f"{20 * 4096 / per_batch / H200_TOKENS_PER_S:.0f}x"])
        waits, compute, late = prefetch_waits(largest, steps=60)
        later = sorted(waits[1:])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = [f"Command: `python bench/bench_scale.py --sizes-gb {args.sizes_gb} --baseline {args.baseline} "
             f"--repeats {args.repeats}`. Machine: {machine()}; shared, so times vary between runs (each run is "
             "listed).", "",
             "## Preparing the datasets (byte tokens, 2 workers)", "",
             markdown_table(["shards", "tokens", "shard files", "seconds", "M tokens/s", "main thread CPU ns/token",
                             "workers' CPU ns/token"], prep_rows), "",
             "## Launch to first step (2 processes, shards evicted from the page cache before each launch)", "",
             markdown_table(["data", "code", "seconds: median", "each launch"], start_rows), "",
             "The shard check alone, one process (`verify_shards` of both splits as train.py calls it, shards "
             "evicted; CPU time is what a busy machine barely changes):", "",
             markdown_table(["data", "code", "seconds", "CPU seconds", "CPU seconds per GB"], check_rows), "",
             growth_sentence(sizes, medians, checks), "",
             f"`python -m data.prepare --verify` on the {max(sizes)} GB dataset (evicted, 2 threads): {count} shards, "
             f"{size_bytes / 1e9:.1f} GB in {verify_seconds:.1f} s.", "",
             "## The loader at the paper's per-GPU demand (20 x 4096 tokens per micro-batch)", "",
             markdown_table(["case", "ms per batch", "CPU ms per batch", "M tokens/s", "x one H200's 150k tokens/s"],
                            loader_rows), "",
             f"PrefetchedBatches (depth 4, stride 8: rank 0 of 8 GPUs) feeding a consumer that sleeps {compute * 1e3:.1f}"
             f" ms per micro-batch (10 x 150k tokens/s) for 60 steps of 3 micro-batches, page cache evicted first: "
             f"the first step spent {waits[0] * 1e3:.1f} ms in batch() (its first batch is read on demand); of the "
             f"other {3 * (len(waits) - 1)} batches, {late} were not ready when asked for, and the 59 steps spent "
             f"{statistics.median(later) * 1e3:.2f} ms in batch() at the median and {later[-1] * 1e3:.2f} ms at most "
             f"(scheduling on the busy cores included), against {3 * compute * 1e3:.0f} ms of compute per step.", ""]
    write_section("scale", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()
