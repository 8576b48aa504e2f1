"""What a run records: console lines, RUN_DIR/metrics.jsonl (one JSON object per record: train, val, change,
summary) and, if enabled, wandb; tokens/s, MFU and peak memory."""
from __future__ import annotations

import json
import os
import resource
import shlex
import subprocess
import time

import torch

from config import ConfigError, TrainConfig
from training.errors import TrainError, how_to_continue

# bf16 dense peak FLOP/s per GPU, for MFU: the first key found in torch.cuda.get_device_name wins, so the
# slower H100 variants come before the SXM one ("NVIDIA H100 80GB HBM3").
GPU_PEAK_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


def gpu_peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_FLOPS.items() if key in name), None)


def code_version() -> str:
    """git commit of this repository (+ "-dirty" with uncommitted changes), or "unknown"."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit + ("-dirty" if dirty else "")) if commit else "unknown"


def provenance(run_dir: str, config_path: str, overrides: list[str], argv: list[str], resumed_at: int | None,
               version: str) -> dict:
    """Where a run came from, for its config.json: the config file, overrides and command of its first start, and
    one record per resume (the iteration it continued from, its command, when, and the code). A resume keeps the
    first start's entries from the config.json on disk and adds its own record."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    here = {"config_file": os.path.abspath(config_path), "overrides": overrides,
            "command": shlex.join(["train.py", *argv]), "started": now}
    if resumed_at is None:
        return {**here, "resumes": []}
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            before = json.load(f)
    except (OSError, ValueError):
        before = None
    if not isinstance(before, dict):
        before = {}  # none, or unreadable: this resume is the earliest start on record
    first = {key: before.get(key, here[key]) for key in here}
    resumes = before.get("resumes") if isinstance(before.get("resumes"), list) else []
    return {**first, "resumes": resumes + [{"iter": resumed_at, "command": here["command"], "started": now,
                                            "code_version": version}]}


def atomic_write_text(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def trim_metrics(path: str, step: int) -> int:
    """On resume, drop log lines written after the checkpoint (they will be written again). Returns how many lines
    that were not records it dropped (binary garbage, lines cut short), a last line cut by a kill not counted."""
    if not os.path.isfile(path):
        return 0
    kept, damaged = [], 0
    with open(path, errors="replace") as f:  # binary garbage: a damaged line, not a UnicodeDecodeError
        lines = f.readlines()
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            damaged += number < len(lines) or line.endswith("\n")  # (else a line cut by a kill)
            continue
        if record.get("type") == "change" and record.get("iter", 0) >= step:
            continue  # a resume at this step writes its own deliberate changes again
        if record.get("iter", 0) <= step and record.get("type") != "summary":
            kept.append(json.dumps(record) + "\n")
    atomic_write_text(path, "".join(kept))
    return damaged


class Metrics:
    """Console + metrics.jsonl + (optionally) wandb, on the main process only (path None elsewhere). `directory`:
    the run directory as its lock holds it (training/run_lock.py): the lines are appended to the file in that
    directory, wherever it is now, never to one that has taken its path (the loop checks the path before each
    log line, on every process together: Checkpointer.check_directory)."""

    def __init__(self, path: str | None, wandb_run=None, directory=None):
        self.path, self.wandb_run, self.directory = path, wandb_run, directory

    def write(self, record: dict, console: str) -> None:
        if self.path is None:
            return
        print(console, flush=True)
        name = os.path.basename(self.path)
        try:
            with self.directory.open_append(name) if self.directory else open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as error:
            raise TrainError(f"cannot write {self.path} ({error.strerror or error}), so the run stops: the last "
                             f"checkpoint in {os.path.dirname(self.path)} is intact; free space or make the directory "
                             f"writable, then {how_to_continue()}") from None
        if self.wandb_run is not None:
            step = record.get("iter")
            values = {f"{record['type']}/{k}": v for k, v in record.items()
                      if k not in ("type", "iter") and isinstance(v, (int, float)) and v is not None}
            self.to_wandb(lambda run: run.log(values, step=step))

    def to_wandb(self, call) -> None:
        """call(wandb run); where wandb fails, the run goes on without it. Under SLURM a preemption or requeue sends
        SIGTERM to every process of the job, wandb's own service among them: the run must still save its checkpoint
        (which keeps the wandb id, so the resumed run logs to the same wandb run)."""
        try:
            call(self.wandb_run)
        except Exception as error:  # wandb's errors have no common base: a lost service is ConnectionResetError
            self.wandb_run = None
            print(f"warning: wandb stopped working ({type(error).__name__}: {error}); the run goes on without it, "
                  f"and {self.path} keeps every record.", flush=True)

    def wandb_id(self, default: str | None) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else default

    def close(self) -> None:
        if self.wandb_run is not None:
            self.to_wandb(lambda run: run.finish())


def start_wandb(cfg: TrainConfig, run_name: str, resolved: dict, run_id: str | None):
    try:
        import wandb
    except Exception as e:  # ImportError, or a broken install raising something else
        raise ConfigError(f"wandb=true but wandb cannot be imported ({e}); pip install wandb, "
                          "or run with --wandb=false.") from None
    return wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or run_name, config=resolved,
                      mode=cfg.wandb_mode, dir=cfg.out_dir, id=run_id, resume="allow" if run_id else None)


class Throughput:
    """Tokens/s and MFU over the steps since the last reading (time spent validating or checkpointing is left
    out by calling restart() after it), and the elapsed time and estimated time left of this invocation (those
    include everything: they are what a user waits for)."""

    def __init__(self, step: int, tokens_per_step: int, flops_per_token: float, peak_flops: float | None,
                 world_size: int):
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.peak = peak_flops * world_size if peak_flops else None
        self.started, self.first_step = time.perf_counter(), step
        self.restart(step)

    def restart(self, step: int) -> None:
        self.time, self.step = time.perf_counter(), step

    def read(self, step: int, end_step: int) -> dict:
        now = time.perf_counter()
        seconds = max(now - self.time, 1e-9)
        tokens_per_s = (step - self.step) * self.tokens_per_step / seconds
        mfu = self.flops_per_token * tokens_per_s / self.peak if self.peak else None
        elapsed = now - self.started
        eta = elapsed / max(step - self.first_step, 1) * (end_step - step)
        return {"tokens_per_s": tokens_per_s, "mfu": mfu, "ms_per_iter": 1000 * seconds / (step - self.step),
                "elapsed_s": elapsed, "eta_s": eta}


def duration(seconds: float) -> str:
    """3h05m, 4m10s, 12s."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def peak_memory(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"peak_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30, "memory_kind": "cuda max allocated"}
    return {"peak_memory_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # Linux reports KiB
            "memory_kind": "process max RSS"}
