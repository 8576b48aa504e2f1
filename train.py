"""Pretrain a GPT with any positional encoding, on one process or many (DDP through torchrun).

    python train.py configs/quickstart.toml                       # CPU, a few minutes, offline
    python train.py configs/medium/fox.toml --batch_size=8        # any key can be overridden: --key=value
    torchrun --nproc_per_node=8 train.py configs/medium/fox.toml  # NCCL on GPUs, gloo on CPUs
    python train.py configs/medium/fox.toml --resume              # continue RUN_DIR/ckpt.pt exactly
    python train.py configs/medium/fox.toml --resume --allow_changes=lr,warmup_iters --lr=5e-4
                                                                  # continue with deliberately changed settings

Each optimizer step sees global_batch_size sequences: batch_size per micro-batch per process, times the
gradient-accumulation steps, times the number of processes. Micro-batch `micro` of step `step` on rank
`rank` reads training window batch (step * grad_accum + micro) * world_size + rank, so the windows of a
step do not depend on how the global batch is split; that is why 1 process with 2 accumulation steps
equals 2 processes with 1, why a resumed run needs only the step, and why a resume may change the
number of processes.

RUN_DIR (train.out_dir, default runs/<config path below configs/>) gets config.json (the resolved
config), metrics.jsonl (one JSON object per log line: train, val, summary) and ckpt.pt.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import checkpoints
from config import ConfigError, TrainConfig, resolve
from data.prefetch import DamagedBatch
from data.shards import DataError

# Settings that shape the loss sequence: a resumed run must use the checkpoint's values unless --allow_changes
# names them. (batch_size and the number of processes may change: a step reads the same windows however the
# global batch is split.)
TRAJECTORY_KEYS = ("data_dir", "seed", "global_batch_size", "max_iters", "lr", "min_lr",
                   "warmup_iters", "weight_decay", "beta1", "beta2", "grad_clip", "dtype",
                   "decay_params", "lr_schedule")
# Trajectory keys that no resume may change, with the reason.
FIXED_FOR_A_RUN = {
    "global_batch_size": "the training windows are numbered by step x global batch, so another size would repeat "
                         "or skip data",
    "decay_params": "the optimizer's parameter groups, and the Adam moments saved with them, are built from it",
}
# The values of keys that checkpoints written before the key existed were trained with.
TRAJECTORY_KEYS_BEFORE_RECIPES = {"decay_params": "matrices", "lr_schedule": "clean"}
CHECKPOINT_KEYS = ("model", "model_config", "tokenizer", "train_config", "step", "optimizer", "rng")
# bf16 dense peak FLOP/s per GPU, for MFU: the first key found in torch.cuda.get_device_name wins, so the
# slower H100 variants come before the SXM one ("NVIDIA H100 80GB HBM3").
GPU_PEAK_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


class TrainError(Exception):
    """A problem the user must act on (bad checkpoint, diverged run, ...); the message says what to do."""


# ----------------------------------------------------------------------------- small pieces

def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr over warmup_iters steps, then cosine decay to min_lr at step max_iters.
    The official warm-up (nanoGPT's) is lr·step/warmup_iters, so its first step has lr 0; the clean one
    lr·(step+1)/warmup_iters reaches lr at the last warm-up step."""
    if step < cfg.warmup_iters:
        return cfg.lr * (step + (cfg.lr_schedule != "official")) / cfg.warmup_iters
    progress = min(1.0, (step - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def param_groups(model: torch.nn.Module, weight_decay: float, decay_params: str = "matrices") -> list[dict]:
    """AdamW groups. "matrices": weight decay on the weight matrices of Linear and Embedding layers only;
    norm gains and the encodings' own parameters get none, whatever their shape: decay would pull a per-head
    spectrum log θ (H, d/2) towards θ = 1 rad, the learned basis towards B = I, GRAPE-A's rates and (H, d)
    gate vectors towards 0. "all_but_norm_gains": every parameter except the RMSNorm gains, as the official
    code does (so it also decays the spectrum, GRAPE-A's rates and gates, FoX's and the phase's biases)."""
    from model import RMSNorm
    if decay_params == "all_but_norm_gains":
        gains = {id(m.weight) for m in model.modules() if isinstance(m, RMSNorm)}
        decayed = {id(p) for p in model.parameters() if id(p) not in gains}
    else:
        decayed = {id(m.weight) for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if id(p) in decayed]
    no_decay = [p for p in params if id(p) not in decayed]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def gpu_peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_FLOPS.items() if key in name), None)


def code_version() -> str:
    """git commit of this file's repository (+ "-dirty" with uncommitted changes), or "unknown"."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit + ("-dirty" if dirty else "")) if commit else "unknown"


def atomic_write_text(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict:
    """The checkpoint at path, its checksum verified; every kind of damage is one TrainError sentence."""
    if not os.path.isfile(path):
        raise TrainError(f"no checkpoint at {path}; run without --resume to start this run, "
                         "or point --out_dir at the run directory to continue.")
    try:
        return checkpoints.load(path, required=CHECKPOINT_KEYS,
                                restore="restore it from a backup, or delete the run directory and start again")
    except checkpoints.CheckpointError as error:
        raise TrainError(f"{error}.") from None


class Distributed:
    """Rank, world size and device; a process group only when launched by torchrun (RANK is set)."""

    def __init__(self, device_pref: str, timeout_s: int = 600):
        self.enabled = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        self.rank = int(os.environ.get("RANK", 0))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        use_cuda = torch.cuda.is_available() if device_pref == "auto" else device_pref == "cuda"
        if use_cuda and not torch.cuda.is_available():
            raise ConfigError("device=cuda but no CUDA GPU is visible; use --device=cpu or auto.")
        if use_cuda:
            self.device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        if self.enabled and not dist.is_initialized():
            # With a timeout a dead or frozen process ends the job (the others' next collective fails) instead
            # of blocking it forever.
            dist.init_process_group(backend="nccl" if use_cuda else "gloo", device_id=self.device if use_cuda else None,
                                    timeout=timedelta(seconds=timeout_s))
        self.is_main = self.rank == 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- the run

def parse_args(argv: list[str]) -> tuple[str, bool, list[str], list[str]]:
    """(config path, --resume, --key=value overrides, keys named by --allow_changes=k1,k2)."""
    config_path, resume, overrides, allowed = None, False, [], []
    for arg in argv:
        if arg == "--resume":
            resume = True
        elif arg.split("=")[0] in ("--allow_changes", "--allow-changes"):
            allowed += [key.strip() for key in arg.partition("=")[2].split(",") if key.strip()]
            unknown = [key for key in allowed if key not in TRAJECTORY_KEYS]
            if unknown or not allowed:
                raise ConfigError(f"--allow_changes takes a comma-separated list of the settings a resume may change "
                                  f"({', '.join(k for k in TRAJECTORY_KEYS if k not in FIXED_FOR_A_RUN)}), "
                                  f"not {arg.partition('=')[2]!r}.")
            fixed = [key for key in allowed if key in FIXED_FOR_A_RUN]
            if fixed:
                raise ConfigError(f"--allow_changes cannot change {fixed[0]}: {FIXED_FOR_A_RUN[fixed[0]]}; start a "
                                  f"new run in another --out_dir to change it.")
        elif arg.startswith("--"):
            overrides.append(arg)
        elif config_path is None:
            config_path = arg
        else:
            raise ConfigError(f"unexpected argument {arg!r}: give one config file, then --key=value overrides.")
    if config_path is None:
        raise ConfigError("no config file given: python train.py CONFIG [--key=value ...], e.g. "
                          "python train.py configs/quickstart.toml")
    if allowed and not resume:
        raise ConfigError("--allow_changes only applies to --resume (a new run takes any settings).")
    return config_path, resume, overrides, allowed


def check_resume_compatible(ckpt: dict, model_cfg: dict, train_cfg: TrainConfig, path: str,
                            allowed: tuple[str, ...] | list[str] = ()) -> list[dict]:
    """Refuse a resume whose model or trajectory settings differ from the checkpoint's, except the keys in
    `allowed`; return those deliberate changes as [{"key", "from", "to"}]."""
    from model import GPTConfig
    try:  # a key the checkpoint predates gets the default it was trained with
        saved_model = dataclasses.asdict(GPTConfig.from_dict(ckpt["model_config"]))
    except (ValueError, TypeError) as e:
        raise TrainError(f"cannot resume {path}: its model config is not valid here ({e}).") from None
    if saved_model != model_cfg:
        diff = sorted(k for k in model_cfg if model_cfg[k] != saved_model[k])
        older = any(k not in ckpt["model_config"] for k in diff)
        raise TrainError(f"cannot resume {path}: the model config differs from the checkpoint's in "
                         f"{', '.join(diff)}; resume with the same config (see config.json in the run directory)"
                         + ("; a checkpoint from before the recipe option was trained with --recipe=clean."
                            if older else "."))
    saved = ckpt["train_config"]
    changes = []
    for key in TRAJECTORY_KEYS:
        saved_value = saved.get(key, TRAJECTORY_KEYS_BEFORE_RECIPES.get(key))
        if saved_value is not None and saved_value != getattr(train_cfg, key):
            if key in allowed:
                changes.append({"key": key, "from": saved_value, "to": getattr(train_cfg, key)})
                continue
            raise TrainError(f"cannot resume {path}: train.{key} is {getattr(train_cfg, key)!r} here but "
                             f"{saved_value!r} in the checkpoint; the loss sequence depends on it, so resume "
                             f"with --{key}={saved_value}, or add --allow_changes={key} to change it on purpose "
                             f"(recorded in the run), or start a new run in another --out_dir.")
    return changes


def trim_metrics(path: str, step: int) -> None:
    """On resume, drop log lines written after the checkpoint (they will be written again)."""
    if not os.path.isfile(path):
        return
    kept = []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if record.get("type") == "change" and record.get("iter", 0) >= step:
                continue  # a resume at this step writes its own deliberate changes again
            if record.get("iter", 0) <= step and record.get("type") != "summary":
                kept.append(json.dumps(record) + "\n")
    atomic_write_text(path, "".join(kept))


class Metrics:
    """Console + metrics.jsonl + (optionally) wandb, on the main process only."""

    def __init__(self, path: str | None, wandb_run=None):
        self.path, self.wandb_run = path, wandb_run

    def write(self, record: dict, console: str) -> None:
        if self.path is None:
            return
        print(console, flush=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb_run is not None:
            step = record.get("iter")
            values = {f"{record['type']}/{k}": v for k, v in record.items()
                      if k not in ("type", "iter") and isinstance(v, (int, float)) and v is not None}
            self.wandb_run.log(values, step=step)


def start_wandb(cfg: TrainConfig, run_name: str, resolved: dict, run_id: str | None):
    try:
        import wandb
    except Exception as e:  # ImportError, or a broken install raising something else
        raise ConfigError(f"wandb=true but wandb cannot be imported ({e}); pip install wandb, "
                          "or run with --wandb=false.") from None
    return wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or run_name, config=resolved,
                      mode=cfg.wandb_mode, dir=cfg.out_dir, id=run_id, resume="allow" if run_id else None)


@torch.no_grad()
def evaluate(model, data_dir: str, cfg: TrainConfig, block_size: int, ddp: Distributed, autocast) -> float:
    """Mean loss over the first eval_windows fixed validation windows, the batches shared out over the processes.
    Each batch's mean loss is weighted by its number of windows (the last batch may be smaller)."""
    from data.loader import validation_batches
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=ddp.device)
    for i, (x, y) in enumerate(validation_batches(data_dir, batch_size=cfg.batch_size, block_size=block_size,
                                                  max_windows=cfg.eval_windows)):
        if i % ddp.world_size != ddp.rank:
            continue
        with autocast():
            _, loss = model(x.to(ddp.device), targets=y.to(ddp.device))
        total[0] += loss.double() * len(x)
        total[1] += len(x)
    model.train()
    ddp.all_reduce_sum(total)
    if total[1].item() == 0:
        raise TrainError(f"{data_dir} has no validation windows of length {block_size}; prepare a larger "
                         "validation split or lower block_size.")
    return (total[0] / total[1]).item()


def run(argv: list[str]) -> dict:
    """Train as the arguments say; returns a summary (per-step losses of this invocation, final step, ...)."""
    from model import GPT, GPTConfig
    from data.loader import TrainBatches, data_description, verify_shards
    from data.prefetch import PrefetchedBatches

    config_path, resume, overrides, allowed_changes = parse_args(argv)
    model_cfg, cfg = resolve(config_path, overrides, GPTConfig)
    model_cfg_dict = dataclasses.asdict(model_cfg)
    T = model_cfg.block_size

    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    if not resume and os.path.exists(ckpt_path):
        raise ConfigError(f"{cfg.out_dir} already holds a checkpoint; add --resume to continue it, "
                          "or choose another --out_dir.")
    ckpt = load_checkpoint(ckpt_path) if resume else None  # fail fast on a missing or damaged checkpoint
    changes, change_history = [], []
    if ckpt is not None:
        changes = check_resume_compatible(ckpt, model_cfg_dict, cfg, ckpt_path, allowed_changes)
        change_history = ckpt.get("changes", []) + [{"iter": ckpt["step"], **c} for c in changes]

    ddp = Distributed(cfg.device, cfg.dist_timeout_s)
    is_main = ddp.is_main
    say = print if is_main else (lambda *a, **k: None)
    per_step = cfg.batch_size * ddp.world_size
    if cfg.global_batch_size % per_step:
        raise ConfigError(f"global_batch_size {cfg.global_batch_size} is not a multiple of batch_size "
                          f"{cfg.batch_size} x {ddp.world_size} processes; change --batch_size or --global_batch_size.")
    grad_accum = cfg.global_batch_size // per_step
    if ddp.device.type == "cpu" and grad_accum >= 16 and not resume:
        say(f"note: each step accumulates {grad_accum} micro-batches ({cfg.global_batch_size} sequences, "
            f"{'the GPU default' if cfg.global_batch_size == TrainConfig.global_batch_size else 'as configured'}) "
            "on the CPU, so a step takes long; set global_batch_size in the config for a CPU-sized run.")

    use_bf16 = cfg.dtype == "bf16" or (cfg.dtype == "auto" and ddp.device.type == "cuda")
    autocast = (lambda: torch.autocast(ddp.device.type, dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext
    if ddp.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_flush_denormal(True)  # decaying attention makes denormals, which are slow on CPUs

    # data
    if cfg.data_dir == "default":
        from data.prepare import ensure_default_corpus
        data_dir = ensure_default_corpus() if is_main else None
        if ddp.enabled:  # the main process prepares it once; the others wait and use the same directory
            holder = [data_dir]
            dist.broadcast_object_list(holder, src=0)
            data_dir = holder[0]
    else:
        data_dir = cfg.data_dir
    manifest = data_description(data_dir)  # a DataError that says how to prepare the directory
    tokenizer_name = manifest["tokenizer"]
    if manifest["shards"] is None:
        say(f"note: {data_dir} has no manifest.json, so its shards are taken as llm.c GPT-2 tokens (the checkpoint "
            "records tokenizer gpt2); their token ids are checked against vocab_size.")
    n_vocab = manifest.get("n_vocab") or manifest.get("vocab_size")
    if n_vocab is not None and n_vocab > model_cfg.vocab_size:
        raise ConfigError(f"the data's tokenizer {tokenizer_name!r} has {n_vocab} tokens but model.vocab_size is "
                          f"{model_cfg.vocab_size}; set --vocab_size={n_vocab} or more.")
    # Headers of every shard; content (sha256, token ids < vocab_size) once per shard version, shared out over
    # the processes and recorded, so a start costs the same however large the data is.
    verify_shards(data_dir, vocab_size=model_cfg.vocab_size, rank=ddp.rank, world_size=ddp.world_size)
    # Read ahead in the background (this process's next micro-batches are world_size indices apart) and each batch
    # checked for token ids >= vocab_size before it is used.
    train_batches = PrefetchedBatches(TrainBatches(data_dir, batch_size=cfg.batch_size, block_size=T, seed=cfg.seed),
                                      stride=ddp.world_size, vocab_size=model_cfg.vocab_size,
                                      pin_memory=ddp.device.type == "cuda")

    # model and optimizer (same seed on every process, so every replica starts equal)
    torch.manual_seed(cfg.seed)
    raw_model = GPT(model_cfg).to(ddp.device)
    optimizer = torch.optim.AdamW(param_groups(raw_model, cfg.weight_decay, cfg.decay_params), lr=cfg.lr,
                                  betas=(cfg.beta1, cfg.beta2), fused=ddp.device.type == "cuda")
    step, wandb_id = 0, None
    if ckpt is not None:
        raw_model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        for group, decay in zip(optimizer.param_groups, (cfg.weight_decay, 0.0)):
            # load_state_dict restores the checkpoint's values; a change allowed on resume must take effect
            group["weight_decay"], group["betas"] = decay, (cfg.beta1, cfg.beta2)
        step = ckpt["step"]
        torch.set_rng_state(ckpt["rng"]["torch"])
        if ddp.device.type == "cuda" and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], ddp.device)
        wandb_id = ckpt.get("wandb_id")
        saved_world = ckpt.get("world_size", ddp.world_size)
        say(f"resuming {ckpt_path} at iteration {step} (saved by code {ckpt.get('code_version', 'unknown')})")
        if saved_world != ddp.world_size:
            say(f"note: saved with {saved_world} processes, resumed with {ddp.world_size}: each step reads the same "
                f"training windows; gradient accumulation is now {grad_accum}.")
        del ckpt

    version = code_version()
    resolved = {"config_file": os.path.abspath(config_path), "overrides": overrides, "model": model_cfg_dict,
                "train": dataclasses.asdict(cfg), "data_dir_resolved": os.path.abspath(data_dir),
                "tokenizer": tokenizer_name, "world_size": ddp.world_size, "grad_accum": grad_accum,
                "code_version": version, "resume_changes": change_history}
    wandb_run = None
    if is_main:
        try:
            os.makedirs(cfg.out_dir, exist_ok=True)
            atomic_write_text(os.path.join(cfg.out_dir, "config.json"), json.dumps(resolved, indent=2) + "\n")
            if resume:
                trim_metrics(metrics_path, step)
            elif os.path.exists(metrics_path):
                # Left by an earlier run that never wrote a checkpoint (stopped or diverged early): this run's
                # lines must not be appended to it. Keep it aside rather than delete it.
                os.replace(metrics_path, metrics_path + ".prev")
                say(f"note: moved the earlier {metrics_path} (a run without a checkpoint) to {metrics_path}.prev")
            for change in changes:
                say(f"note: --allow_changes: {change['key']} changes from {change['from']!r} to {change['to']!r} "
                    f"at iteration {step} (recorded in config.json, metrics.jsonl and the checkpoint)")
                with open(metrics_path, "a") as f:
                    f.write(json.dumps({"type": "change", "iter": step, **change}) + "\n")
        except OSError as error:
            raise ConfigError(f"cannot write to the run directory {cfg.out_dir} ({error.strerror or error}); "
                              "make it writable or choose another --out_dir.") from None
        if cfg.wandb:
            wandb_run = start_wandb(cfg, os.path.basename(os.path.normpath(cfg.out_dir)), resolved, wandb_id)
            wandb_id = wandb_run.id
    metrics = Metrics(metrics_path if is_main else None, wandb_run)

    model = torch.compile(raw_model) if cfg.compile else raw_model
    train_model = DistributedDataParallel(model, device_ids=[ddp.local_rank] if ddp.device.type == "cuda" else None) \
        if ddp.enabled else model
    params = [p for p in raw_model.parameters() if p.requires_grad]
    flops_per_token = raw_model.flops_per_token(T)
    peak = gpu_peak_flops(ddp.device)
    tokens_per_step = cfg.global_batch_size * T
    end_iter = min(cfg.num_steps, cfg.stop_iter) if cfg.stop_iter else cfg.num_steps
    say(f"model: {raw_model.num_params() / 1e6:.2f}M parameters, pos={model_cfg.pos}, kv_shift={model_cfg.kv_shift} | "
        f"{ddp.world_size} process(es) on {ddp.device.type}, {'bf16 autocast' if use_bf16 else 'fp32'}, "
        f"batch {cfg.global_batch_size} x {T} tokens = {cfg.batch_size} x {grad_accum} accum x {ddp.world_size} | "
        f"data {data_dir} ({tokenizer_name}) | run dir {cfg.out_dir}")

    saved_step = step if resume else None  # the iteration of the checkpoint on disk, if any
    writing_checkpoint = threading.Event()
    interrupt_after_write = threading.Event()

    def checkpoint() -> None:
        nonlocal saved_step
        if is_main:
            rng = {"torch": torch.get_rng_state(),
                   "cuda": torch.cuda.get_rng_state(ddp.device) if ddp.device.type == "cuda" else None}
            writing_checkpoint.set()  # a second Ctrl-C now waits for the write instead of discarding it
            try:
                write_checkpoint({
                "model": raw_model.state_dict(), "model_config": model_cfg_dict, "tokenizer": tokenizer_name,
                "train_config": dataclasses.asdict(cfg), "step": step, "optimizer": optimizer.state_dict(),
                "rng": rng, "world_size": ddp.world_size, "grad_accum": grad_accum,
                "windows_seen": step * cfg.global_batch_size, "tokens_seen": step * tokens_per_step,
                "code_version": version, "wandb_id": wandb_id, "changes": change_history})
            finally:
                writing_checkpoint.clear()
            if interrupt_after_write.is_set():
                raise KeyboardInterrupt
        saved_step = step
        ddp.barrier()

    def write_checkpoint(state: dict) -> None:
        try:
            checkpoints.save(ckpt_path, state)
        except checkpoints.CheckpointError as error:
            raise TrainError(str(error)) from None

    def validate() -> float:
        val_loss = evaluate(model, data_dir, cfg, T, ddp, autocast)
        metrics.write({"type": "val", "iter": step, "tokens": step * tokens_per_step, "val_loss": val_loss},
                      f"iter {step:>6} | val loss {val_loss:.4f}")
        return val_loss

    # SIGTERM (preemption) or a first Ctrl-C: finish the current step, save, exit cleanly. A second
    # Ctrl-C stops at once (the last checkpoint on disk stays intact: checkpoints are atomic).
    term_requested = threading.Event()
    previous_handlers = {}

    def request_stop(signum, frame):
        if signum == signal.SIGINT and term_requested.is_set():
            if writing_checkpoint.is_set():
                say("Ctrl-C: stopping as soon as the checkpoint being written is complete.")
                interrupt_after_write.set()
                return
            raise KeyboardInterrupt
        say(("Ctrl-C" if signum == signal.SIGINT else "SIGTERM") + ": stopping with a checkpoint after the current "
            "micro-batch" + (" (Ctrl-C again to stop at once)." if signum == signal.SIGINT else "."))
        term_requested.set()

    if threading.current_thread() is threading.main_thread():
        previous_handlers = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}

    # A stop request is also honoured between the micro-batches of a step, so that a long accumulation (e.g. the
    # GPU-sized global batch on a CPU) does not delay it by minutes. With several processes that costs one tiny
    # all-reduce per micro-batch, paid only where steps are long anyway.
    vote_each_micro_batch = grad_accum > 1 and (not ddp.enabled or grad_accum >= 8)

    def stop_votes() -> float:
        if not ddp.enabled:  # one process: no tensor, so no GPU sync per micro-batch
            return float(term_requested.is_set())
        return ddp.all_reduce_sum(torch.tensor(float(term_requested.is_set()), device=ddp.device)).item()

    def stop_with_checkpoint() -> None:
        checkpoint()
        say(f"stop requested (SIGTERM or Ctrl-C): saved {ckpt_path} at iteration {step}; continue with --resume.")

    losses: list[float] = []
    val_losses: list[tuple[int, float]] = []
    stopped = "done"
    try:
        if step == 0 and cfg.eval_interval:
            val_losses.append((step, validate()))
        train_model.train()
        last_time, last_step = time.perf_counter(), step
        while step < end_iter:
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=ddp.device)
            stop_mid_step = False
            for micro in range(grad_accum):
                x, y = train_batches.batch((step * grad_accum + micro) * ddp.world_size + ddp.rank)
                x, y = x.to(ddp.device, non_blocking=True), y.to(ddp.device, non_blocking=True)
                # Gradients are all-reduced only on the last micro-batch.
                sync = contextlib.nullcontext() if not ddp.enabled or micro == grad_accum - 1 else train_model.no_sync()
                with sync:
                    with autocast():
                        _, loss = train_model(x, targets=y)
                    (loss / grad_accum).backward()
                loss_sum += loss.detach().float()
                if vote_each_micro_batch and micro < grad_accum - 1 and stop_votes() > 0:
                    stop_mid_step = True
                    break
            if stop_mid_step:
                # Drop the partial step: the weights are still those after `step` iterations, so the checkpoint
                # resumes exactly by doing this step again.
                optimizer.zero_grad(set_to_none=True)
                stopped = "sigterm"
                stop_with_checkpoint()
                break
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            # One small all-reduce per step: the global loss, and whether any process got SIGTERM
            # (all must stop at the same step).
            stats = torch.stack([loss_sum / grad_accum, torch.tensor(float(term_requested.is_set()), device=ddp.device)])
            loss_value, term_votes = ddp.all_reduce_sum(stats).tolist()
            loss_value /= ddp.world_size
            grad_norm_value = grad_norm.item()
            if not (math.isfinite(loss_value) and math.isfinite(grad_norm_value)):
                stopped = "diverged"
                remedy = "lower --lr or raise --warmup_iters (or check the data)"
                if saved_step is None:
                    remedy = (f"no checkpoint was written before it, so start again with the same command but "
                              f"{remedy}")
                else:
                    remedy = (f"the last good checkpoint {ckpt_path} (iteration {saved_step}) is kept: {remedy} and "
                              f"continue from it with --resume --allow_changes=lr,warmup_iters and the new values")
                cause = raw_model.nonfinite_cause()
                raise TrainError(f"loss is {loss_value} (grad norm {grad_norm_value}) at iteration {step}: training "
                                 f"diverged and stopped without updating the weights{cause}; {remedy}.")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            losses.append(loss_value)

            if step % cfg.log_interval == 0 or step == end_iter:
                now = time.perf_counter()
                tokens_per_s = (step - last_step) * tokens_per_step / max(now - last_time, 1e-9)
                mfu = flops_per_token * tokens_per_s / (peak * ddp.world_size) if peak else None
                metrics.write(
                    {"type": "train", "iter": step, "tokens": step * tokens_per_step, "loss": loss_value, "lr": lr,
                     "grad_norm": grad_norm_value, "tokens_per_s": tokens_per_s, "mfu": mfu,
                     "ms_per_iter": 1000 * (now - last_time) / (step - last_step)},
                    f"iter {step:>6}/{cfg.num_steps} | loss {loss_value:.4f} | lr {lr:.2e} | grad norm "
                    f"{grad_norm_value:.3f} | {tokens_per_s:,.0f} tok/s"
                    + (f" | MFU {100 * mfu:.1f}%" if mfu is not None else ""))
            logged = step % cfg.log_interval == 0
            evaluated = bool(cfg.eval_interval) and (step % cfg.eval_interval == 0 or step == cfg.num_steps)
            if evaluated:
                val_losses.append((step, validate()))
            if term_votes > 0:
                stopped = "sigterm"
                stop_with_checkpoint()
                break
            saved = step == end_iter or (cfg.ckpt_interval > 0 and step % cfg.ckpt_interval == 0)
            if saved:
                checkpoint()
            if logged or evaluated or saved:  # keep validation and checkpoint time out of tokens/s
                last_time, last_step = time.perf_counter(), step
        if not losses and stopped == "done":
            say(f"{ckpt_path} is already at iteration {step} (this run ends at {end_iter}); nothing to do.")
        if stopped == "done" and step < cfg.num_steps:
            stopped = "stop_iter"

        if ddp.device.type == "cuda":
            peak_mem_gb = torch.cuda.max_memory_allocated(ddp.device) / 2**30
        else:
            peak_mem_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
        metrics.write({"type": "summary", "iter": step, "stopped": stopped, "peak_memory_gb": peak_mem_gb,
                       "memory_kind": "cuda max allocated" if ddp.device.type == "cuda" else "process max RSS"},
                      f"{stopped} at iteration {step} | peak memory {peak_mem_gb:.2f} GiB | run dir {cfg.out_dir}")
        return {"losses": losses, "val_losses": val_losses, "step": step, "stopped": stopped, "out_dir": cfg.out_dir,
                "grad_accum": grad_accum, "peak_memory_gb": peak_mem_gb}
    finally:
        if ddp.device.type == "cpu":
            torch.set_flush_denormal(False)  # back to the default for whatever runs next in this process
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        if wandb_run is not None:
            wandb_run.finish()


def main() -> None:
    rank = int(os.environ.get("RANK", 0))
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(__doc__.strip() + "\n\ntrain keys and defaults:\n" + "\n".join(
            f"  --{f.name}={f.default}" for f in dataclasses.fields(TrainConfig))
            + "\nmodel keys: the fields of model.GPTConfig (--model.<key>=... if a name is ambiguous).")
        return
    try:
        run(sys.argv[1:])
    except KeyboardInterrupt:
        if rank == 0:
            print("interrupted: the last checkpoint written (if any) is intact; continue with --resume.",
                  file=sys.stderr, flush=True)
        sys.exit(130)
    except (ConfigError, TrainError, DataError) as e:
        if rank == 0 or isinstance(e, DamagedBatch):  # a damaged batch is seen only by the process that read it
            print(f"error: {e}", file=sys.stderr, flush=True)
        code = 2 if isinstance(e, ConfigError) else 1
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        sys.exit(code)
    except RuntimeError as e:  # DistBackendError and gloo's own errors are RuntimeErrors
        if not (dist.is_available() and dist.is_initialized()) or not is_collective_failure(e):
            raise
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        # Every rank says it: the main process may be the one that died or froze.
        print(f"error: process {rank} stopped: a collective operation with the other processes failed ({first_line}); "
              "another process died or stopped responding (waits end after train.dist_timeout_s). The last "
              "checkpoint is intact: fix the cause and continue with --resume.", file=sys.stderr, flush=True)
        sys.exit(1)  # without destroy_process_group, which could wait on the dead process
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_collective_failure(error: RuntimeError) -> bool:
    """A failed collective (a peer died or froze), not an out-of-memory error or a bug on this process."""
    if isinstance(error, torch.OutOfMemoryError):
        return False
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error).lower()
    return any(word in text for word in ("gloo", "nccl", "connection", "timed out", "timeout", "socket", "peer"))


if __name__ == "__main__":
    main()
