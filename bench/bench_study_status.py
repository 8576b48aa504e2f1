"""What one `python study.py STUDY.toml` (or `--status`) call costs on a login node for a study of 39 runs: the
paper's Table 1 (13 encodings x 3 seeds, configs/studies/table1_medium.toml) under mode = "slurm", with a third of
its runs finished (25,000 iterations of records each, evaluations marked done), a third training (12,000
iterations) and a third queued. SLURM's answer comes from a stub squeue on PATH, so only study.py's own work is
timed: loading and checking the study file, reading every run's files, deciding what to submit (nothing here:
every run has its job) and printing the table.

    python bench/bench_study_status.py      # prints the table and writes docs/benchmarks_study_status.md

Timed in this process (the study file's first load, then the median of 5 calls of the rest, after imports) and as a
whole `python study.py --status` process (imports included).
"""
from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from studies import launch, slurm  # noqa: E402
from studies.spec import load_study  # noqa: E402

OUT = REPO / "docs" / "benchmarks_study_status.md"
TABLE1 = REPO / "configs" / "studies" / "table1_medium.toml"


def study_file(folder: Path) -> str:
    """Table 1's study file on SLURM, its runs under folder."""
    text = TABLE1.read_text().replace('base = "../base/medium.toml"', f'base = "{REPO / "configs/base/medium.toml"}"')
    text = text.replace('mode = "torchrun"\ngpus_per_run = 8\ngpus = 8',
                        'mode = "slurm"\ngpus_per_run = 8\n\n[launch.slurm]\ngpus_per_node = 8\n')
    text = f'out_dir = "{folder / "out"}"\n' + text  # (a top-level key: before the file's first table)
    path = folder / "table1_slurm.toml"
    path.write_text(text)
    return str(path)


def fake_runs(loaded) -> dict[str, tuple[str, str]]:
    """Write every run's files (finished, training, or none) and the study's job records; {job: squeue's state}."""
    records, states = {}, {}
    for index, run in enumerate(loaded.runs):
        job = str(1000 + index)
        key = slurm.run_key(run)
        records[key] = {"train": [job], "eval": [{"job": str(2000 + index), "after": job}]}
        kind = index % 3
        os.makedirs(run.run_dir, exist_ok=True)
        if kind == 2:  # queued
            states[job], states[str(2000 + index)] = ("PENDING", "Priority"), ("PENDING", "Dependency")
            continue
        last = run.final_iter if kind == 0 else 12000
        with open(os.path.join(run.run_dir, "metrics.jsonl"), "w") as f:
            for it in range(10, last + 1, 10):  # the medium config logs every 10 iterations, validates every 1000
                f.write(json.dumps({"type": "train", "iter": it, "tokens": it * 1966080, "loss": 3 + 1000 / it,
                                    "lr": 1e-3, "grad_norm": 0.3, "param_norm": 300.0, "tokens_per_s": 1.5e6,
                                    "mfu": 0.4, "ms_per_iter": 1300.0, "elapsed_s": it * 1.3,
                                    "eta_s": (run.final_iter - it) * 1.3}) + "\n")
                if it % 1000 == 0:
                    f.write(json.dumps({"type": "val", "iter": it, "tokens": it * 1966080, "val_loss": 3.1}) + "\n")
            if kind == 0:  # (the final iteration is max_iters + 1 under the official schedule)
                f.write(json.dumps({"type": "val", "iter": last, "tokens": last * 1966080, "val_loss": 3.0}) + "\n")
                f.write(json.dumps({"type": "summary", "iter": last, "stopped": "done"}) + "\n")
        Path(run.run_dir, "ckpt.pt").write_bytes(b"0" * 1024)
        if kind == 0:
            states[job], states[str(2000 + index)] = ("COMPLETED", "None"), ("COMPLETED", "None")
            for name, argv in run.evals.items():
                os.makedirs(os.path.join(run.run_dir, "eval"), exist_ok=True)
                Path(run.run_dir, "eval", f"{name}.json").write_text("{}")
                Path(launch.eval_marker(run, name)).write_text(json.dumps(
                    {"argv": argv, "checkpoint": launch.checkpoint_identity(run)}))
        else:
            states[job], states[str(2000 + index)] = ("RUNNING", "None"), ("PENDING", "Dependency")
    slurm.write_records(loaded, records)
    return states


def stub_squeue(folder: Path, states: dict) -> None:
    """An squeue that prints the recorded jobs' states as `squeue --format=%i|%T|%r` does."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    answer = "".join(f"{job}|{state}|{reason}\n" for job, (state, reason) in states.items())
    (bin_dir / "squeue").write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer}EOF\n")
    (bin_dir / "squeue").chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def median_seconds(function, repeats: int = 5) -> tuple[float, float]:
    """(median wall-clock seconds, median CPU seconds of this process) of `function` over `repeats` calls: on a
    machine shared with other work the CPU time is the steadier of the two."""
    walls, cpus = [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        function()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = study_file(folder)
        start, cpu = time.perf_counter(), time.process_time()
        loaded = load_study(path)  # the first call in a process also imports the evaluations' argument parsers
        first_load = (time.perf_counter() - start, time.process_time() - cpu)
        stub_squeue(folder, fake_runs(loaded))
        rows = slurm.SlurmStudy(loaded).advance(submit=False)
        table = slurm.table(rows)
        print(table)
        assert not any("submitted" in row.state for row in rows), "the benchmark's study should submit nothing"
        timings = {
            "load and check the study file (39 runs; the first call in the process)": first_load,
            "ask SLURM (stub squeue), read every run's files, decide": median_seconds(
                lambda: (launch._parsed_metrics.clear(), slurm.SlurmStudy(loaded).advance(submit=True))),
            "draw the table": median_seconds(lambda: slurm.table(rows)),
        }
        timings["study.py's own work per call (the three above)"] = tuple(map(sum, zip(*timings.values())))
        start, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, str(REPO / "study.py"), path, "--status"], check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        process = (time.perf_counter() - start,
                   after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime)
    lines = ["# study.py's own work per call on a login node (39 runs on SLURM)", "",
             "`python bench/bench_study_status.py` (bench/bench_study_status.py writes this file): the paper's Table "
             "1 study under `[launch] mode = \"slurm\"`, 13 runs finished (25,000 iterations of records, evaluations "
             "marked done), 13 training (12,000 iterations), 13 queued; SLURM's answer from a stub `squeue`, so "
             "only study.py's own work is timed: the study file's first load in the process, then the median of 5 "
             "calls of the rest, each reading every run's files anew.", "",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
             f"{platform.python_version()}; shared with other work while measured.", "",
             "| step | wall-clock s | CPU s |", "|---|---:|---:|"]
    lines += [f"| {name} | {wall:.3f} | {cpu:.3f} |" for name, (wall, cpu) in timings.items()]
    lines += [f"| a whole `python study.py STUDY --status` process (its imports, torch's among them, included) | "
              f"{process[0]:.2f} | {process[1]:.2f} |", "",
              "The table it printed:", "", "```", table, "```", ""]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines[8:8 + len(timings) + 1]))
    print(f"wrote {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
