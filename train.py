"""Pretrain a GPT with any positional encoding, on one process or many (DDP through torchrun).

    python train.py configs/quickstart.toml                       # CPU, a few minutes, offline
    python train.py configs/medium/fox.toml --batch_size=8        # any key can be overridden: --key=value
    torchrun --nproc_per_node=8 train.py configs/medium/fox.toml  # NCCL on GPUs, gloo on CPUs
    python train.py configs/medium/fox.toml --resume              # continue RUN_DIR/ckpt.pt exactly
    python train.py --resume runs/medium/fox                      # the same, with the run's own settings
    python train.py configs/medium/fox.toml --resume --allow_changes=lr,warmup_iters --lr=5e-4
                                                                  # continue with deliberately changed settings

Each optimizer step sees global_batch_size sequences: a micro-batch per process (batch_size, or the largest number
below it that divides each process's share), times the gradient-accumulation steps, times the number of processes.
The batches are numbered so that any split reads the same sequences (a config runs as it is on any number of
processes that divides its global batch), a resumed run needs only the step, and a resume may change the number of
processes (training/step.py).

RUN_DIR (train.out_dir, default runs/<config path below configs/>) gets config.json (the resolved
config), metrics.jsonl (one JSON object per log line: train, val, change, summary) and ckpt.pt.
This file reads top to bottom: the set-up, then run() (set-up, the loop, the ending); the pieces it uses
are in training/ (docs/train.md has the map).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import sys
import time

from training.errors import LostProcess, TrainError, exit_interrupted, how_to_continue, process_rank

if __name__ == "__main__":  # a Ctrl-C while torch and the rest import (seconds) ends as a later one does
    signal.signal(signal.SIGINT, exit_interrupted)


def leave_quietly(signum=None, frame=None) -> None:
    """SIGTERM on a process other than the main one under torchrun, outside the training loop (whose own handler
    saves a checkpoint): torchrun sends it to end the others when one process has failed, and an exit with
    status 0 keeps this one out of torchrun's report of failures, which then names the real one alone."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # (not sys.exit: no clean-up that could wait on the process that failed)


if __name__ == "__main__" and "TORCHELASTIC_ERROR_FILE" in os.environ and process_rank() != 0:
    signal.signal(signal.SIGTERM, leave_quietly)  # from the start: the failure may come while this one imports

import torch
import torch.distributed as dist

from checkpoints import not_a_folder, unreferenced_shard_directories
from config import ConfigError, TrainConfig, default_out_dir, describe_keys, read_toml, resolve
from data.prefetch import DamagedBatch
from data.shards import DataError
from hf.init_from import initial_state
from attention_kernels.triton_probe import probe_summary
from lm_loss import describe_loss
from training.checkpointing import (DATA_CHANGE, FIXED_FOR_A_RUN, TRAJECTORY_KEYS, Checkpointer,
                                    check_resume_compatible, check_resume_data, load_checkpoint,
                                    refuse_earlier_checkpoint, restore, set_aside_earlier_run)
from training.distributed import Distributed, is_collective_failure
from training.metrics import (Metrics, Throughput, atomic_write_text, code_version, duration, gpu_peak_flops,
                              peak_memory, provenance, start_wandb, trim_metrics)
from training.layout import bf16_parameters, describe_compile, lay_out, wrapped_for_training
from training.divergence import DivergenceMonitor, divergence_error
from training.optimizer import lr_at, make_optimizer, set_lr
from training.run_lock import LockedDirectory, run_directory_lock
from training.step import StepResult, confirmation, evaluate, process_counts, split_batch, train_step
from training.stopping import StopSignals


HELP_OPTIONS = """usage: python train.py CONFIG [--key=value ...] [--resume [--allow_changes=KEY,...] | --start_over]
       python train.py --resume RUN_DIR [--key=value ...]

options:
  CONFIG                  a TOML config file (configs/); or, with --resume, a run directory or its config.json,
                          which continues that run with its own settings
  --resume                continue RUN_DIR/ckpt.pt exactly (RUN_DIR: train.out_dir); the settings that shape the
                          loss sequence must be the checkpoint's (without ckpt.pt: the latest complete sharded
                          checkpoint in RUN_DIR/ckpt.shards/, with the settings of RUN_DIR/config.json)
  --allow_changes=K1,K2   with --resume: let these of those settings change on purpose (recorded in the run): """ \
    + ", ".join(k for k in TRAJECTORY_KEYS if k not in FIXED_FOR_A_RUN) + """, or
                          data (the data folder was prepared again since: its manifest differs from the
                          checkpoint's, which a resume otherwise refuses)
  --start_over            a new run in a RUN_DIR that holds an earlier run's checkpoint (ckpt.pt, or shards in
                          ckpt.shards/ without it), which a new run otherwise refuses: the earlier run's files are
                          moved into RUN_DIR/earlier-<UTC time>-*/ first; nothing is deleted
  --key=value             any key below (a bare --flag sets a true/false key to true)
  -h, --help              this text"""


@dataclasses.dataclass
class Arguments:
    config_path: str
    resume: bool
    start_over: bool            # a new run: move the earlier run's checkpoint aside (never deleted)
    overrides: list[str]        # --key=value
    allowed_changes: list[str]  # the keys --allow_changes=k1,k2 names
    argv: list[str]             # all of them, as given (recorded in config.json)


def parse_args(argv: list[str]) -> Arguments:
    config_path, resume, start_over, overrides, allowed = None, False, False, [], []
    for arg in argv:
        if arg == "--resume":
            resume = True
        elif arg == "--start_over":
            start_over = True
        elif arg.split("=")[0] in ("--allow_changes", "--allow-changes"):
            allowed += [key.strip() for key in arg.partition("=")[2].split(",") if key.strip()]
            unknown = [key for key in allowed if key not in (*TRAJECTORY_KEYS, DATA_CHANGE)]
            if unknown or not allowed:
                raise ConfigError(f"--allow_changes takes a comma-separated list of the settings a resume may change "
                                  f"({', '.join(k for k in TRAJECTORY_KEYS if k not in FIXED_FOR_A_RUN)}, "
                                  f"{DATA_CHANGE}), "
                                  f"not {arg.partition('=')[2]!r}.")
            fixed = [key for key in allowed if key in FIXED_FOR_A_RUN]
            if fixed:
                raise ConfigError(f"--allow_changes cannot change {fixed[0]}: {FIXED_FOR_A_RUN[fixed[0]]}; start a "
                                  f"new run in another --out_dir to change it.")
        elif arg.startswith("--"):
            name, equals, value = arg.partition("=")
            if name.replace("-", "_") == "__out_dir" and equals and not value.strip():
                raise ConfigError("--out_dir= is empty, which would train into the config's default directory; give "
                                  "the run directory (--out_dir=runs/NAME), or leave --out_dir out for the default.")
            overrides.append(arg)
        elif config_path is None:
            config_path = arg
        else:
            raise ConfigError(f"unexpected argument {arg!r}: give one config file, then --key=value overrides.")
    if config_path is None:
        raise ConfigError("no config file given: python train.py CONFIG [--key=value ...], e.g. "
                          "python train.py configs/quickstart.toml, or python train.py --resume RUN_DIR to continue "
                          "a run with its own settings")
    if os.path.basename(config_path) == "ckpt.pt" and os.path.isfile(config_path):  # a run's checkpoint: its run
        run_dir = os.path.dirname(config_path) or "."
        if not resume:
            raise ConfigError(f"{config_path} is a checkpoint, not a config file; continue its run with python "
                              f"train.py --resume {run_dir}, or give a TOML config file to start a new one.")
        config_path = run_dir
    if allowed and not resume:
        raise ConfigError("--allow_changes only applies to --resume (a new run takes any settings).")
    if start_over and resume:
        raise ConfigError("--start_over starts a new run, moving the earlier run's checkpoint aside; give --resume to "
                          "continue it, or --start_over, not both.")
    return Arguments(config_path, resume, start_over, overrides, allowed, list(argv))


# ----------------------------------------------------------------------------- set-up, in the order run() calls it

def config_of_default_directory(config_path: str | None, out_dir: str) -> str | None:
    """The config file when out_dir is the default run directory of it (a TOML file, not a run's own settings)."""
    if not config_path or not config_path.endswith(".toml") or not os.path.isfile(config_path):
        return None
    return config_path if os.path.abspath(out_dir) == os.path.abspath(default_out_dir(config_path)) else None


def encoding_name(pos: str, kv_shift: bool) -> str:
    """The encoding as the config files name it: 'rope', 'fox+kv_shift'."""
    return pos + ("+kv_shift" if kv_shift else "")


def own_run_directory(args: Arguments, model_cfg, cfg: TrainConfig) -> TrainConfig:
    """cfg with the run directory of a run whose --pos or --kv_shift changes its config file's encoding without an
    --out_dir: runs/<config>_as_<encoding> (configs/cpu/rope.toml --pos=fox: runs/cpu/rope_as_fox), since the
    config's own directory holds runs of the config's own encoding. The same command with --resume finds it."""
    config_file = config_of_default_directory(args.config_path, cfg.out_dir)
    given = any(arg.partition("=")[0].replace("-", "_") == "__out_dir" for arg in args.overrides)
    if config_file is None or given:
        return cfg
    from model import GPTConfig
    file_model = read_toml(config_file)["model"]  # (the file's own keys: it may be valid only with the overrides)
    own = encoding_name(file_model.get("pos", GPTConfig.pos), file_model.get("kv_shift", GPTConfig.kv_shift))
    encoding = encoding_name(model_cfg.pos, model_cfg.kv_shift)
    if own == encoding:
        return cfg
    out_dir = f"{os.path.normpath(cfg.out_dir)}_as_{encoding}"
    if process_rank() == 0:
        print(f"note: the overrides change {config_file}'s encoding ({own}) to {encoding}, so this run's directory "
              f"is {out_dir}, not {cfg.out_dir} (--out_dir chooses another).", flush=True)
    return dataclasses.replace(cfg, out_dir=out_dir)


def open_checkpoint(args: Arguments, cfg: TrainConfig, model_cfg: dict) -> tuple[dict | None, list[dict], dict | None]:
    """(the checkpoint a resume continues, checked against the settings, or None for a new run; the deliberate
    changes that --allow_changes lets through; a new run's initial weights from init_from, or None). Both are read
    before the data, so that a mistake fails fast."""
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    if not args.resume:
        if not args.start_over:
            refuse_earlier_checkpoint(cfg.out_dir, config_of_default_directory(args.config_path, cfg.out_dir))
        return None, [], initial_state(cfg.init_from, model_cfg) if cfg.init_from else None
    ckpt = load_checkpoint(path)  # fail fast on a missing or damaged checkpoint
    return ckpt, check_resume_compatible(ckpt, model_cfg, cfg, path, args.allowed_changes), None


def batch_split(cfg: TrainConfig, ddp: Distributed, resumed: bool) -> tuple[int, int]:
    """(sequences per micro-batch on each process, micro-batches per step). batch_size is the most a micro-batch
    holds: where it does not divide each process's share of the global batch, the largest number below it that
    does is used. A step reads the same windows however it is split (training/step.py), so a config runs as it
    is, with the same losses up to float rounding, on any number of processes that divides global_batch_size;
    only the speed and the memory change."""
    G, world = cfg.global_batch_size, ddp.world_size
    try:
        micro, grad_accum = split_batch(G, cfg.batch_size, world)
    except ValueError as problem:
        if not resumed:
            raise ConfigError(f"{problem}; launch {process_counts(G, world)} processes (a number that divides {G}) "
                              "or change --global_batch_size.") from None
        raise ConfigError(f"{problem}, and a resume keeps global_batch_size; resume on {process_counts(G, world)} "
                          f"processes instead (a number that divides {G}).") from None
    share = G // world
    if micro < min(cfg.batch_size, share):  # (a share smaller than batch_size is simply one micro-batch)
        ddp.say(f"note: batch_size {cfg.batch_size} does not divide {share}, each process's share of the global "
                f"batch: micro-batches of {micro} sequences, {grad_accum} a step.")
    if ddp.device.type == "cpu" and grad_accum >= 16 and not resumed:
        ddp.say(f"note: each step accumulates {grad_accum} micro-batches ({G} sequences, "
                f"{'the GPU default' if G == TrainConfig.global_batch_size else 'as configured'}) "
                "on the CPU, so a step takes long; set global_batch_size in the config for a CPU-sized run.")
    return micro, grad_accum


def precision(cfg: TrainConfig, device: torch.device):
    """(whether the run computes in bf16, a factory of the forward pass's context manager: bf16 autocast, or
    nothing for fp32 and for FSDP's bf16 parameters, which compute in bf16 without it)."""
    use_bf16 = cfg.dtype == "bf16" or (cfg.dtype == "auto" and device.type == "cuda")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_flush_denormal(True)  # decaying attention makes denormals, which are slow on CPUs
    autocast = use_bf16 and not bf16_parameters(cfg, use_bf16)
    return use_bf16, (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext


# data_dir names of the embedded English corpus, prepared on first use, and the tokenizer each reads it with
EMBEDDED_CORPORA = {"default": "gpt2", "default-byte": "byte"}


def training_data(cfg: TrainConfig, vocab_size: int, block_size: int, ddp: Distributed):
    """(the data folder, opened once and every shard checked: a data.prepared.PreparedData, which the batch sources
    and the validation read; its tokenizer's name; the batch source)."""
    from data.loader import PreparedData, RandomOffsetBatches, TrainBatches, verify_shards
    from data.manifest import adopt_command
    from data.prefetch import PrefetchedBatches
    if cfg.data_dir in EMBEDDED_CORPORA:  # the main process prepares it once; the others wait and use it
        from data.prepare import ensure_default_corpus
        tokenizer = EMBEDDED_CORPORA[cfg.data_dir]
        data_dir = ddp.from_main(ensure_default_corpus(tokenizer=tokenizer) if ddp.is_main else None)
    else:
        data_dir = cfg.data_dir
    if not os.path.exists(data_dir):
        raise DataError(f"data directory {data_dir} does not exist; prepare it with `{prepare_command_for(data_dir)}`, "
                        "or point --data_dir at a prepared directory.")
    data = PreparedData(data_dir)  # a DataError that says how to prepare the directory
    tokenizer_name = data.tokenizer
    if data.manifest is None:
        raise DataError(f"{data_dir} has no manifest.json, so its shards cannot be checked for damage (a changed byte "
                        f"would be trained on without notice); record their checksums once with "
                        f"`{adopt_command(data_dir)}` (it reads every shard once and takes them as GPT-2 tokens), "
                        "then train.")
    n_vocab = data.vocab_size
    if n_vocab is not None and n_vocab > vocab_size:
        raise ConfigError(f"the data's tokenizer {tokenizer_name!r} has {n_vocab} tokens but model.vocab_size is "
                          f"{vocab_size}; set --vocab_size={n_vocab} or more.")
    # Headers and sizes now; each shard's content (sha256, token ids) once per version of the file, the reading
    # shared out over the processes; then every batch's ids as it is read (data/verify.py, data/prefetch.py).
    verify_shards(data, vocab_size=vocab_size, rank=ddp.rank, world_size=ddp.world_size)
    if cfg.sampler == "random_offsets":
        batches = RandomOffsetBatches(data, batch_size=cfg.batch_size, block_size=block_size, seed=cfg.seed,
                                      global_batch_size=cfg.global_batch_size,
                                      layout=cfg.reference_processes_and_micro_steps())
    else:
        batches = TrainBatches(data, batch_size=cfg.batch_size, block_size=block_size, seed=cfg.seed)
    if cfg.retrieval_fraction:
        from data.retrieval import RetrievalMix
        from data.tokenizer import get_tokenizer
        try:
            batches = RetrievalMix(batches, cfg.retrieval_fraction, get_tokenizer(tokenizer_name), cfg.retrieval_pairs)
        except ValueError as error:
            raise ConfigError(f"{error}.") from None
    # this process's next micro-batches are read in the background (their numbering strides by the world size)
    batches = PrefetchedBatches(batches, stride=ddp.world_size, vocab_size=vocab_size,
                                pin_memory=ddp.device.type == "cuda")
    return data, tokenizer_name, batches


def prepare_command_for(data_dir: str) -> str:
    """The data.prepare command that makes a missing data directory of the shipped configs."""
    for version in ("10B", "100B", "350B"):
        if os.path.basename(os.path.normpath(data_dir)) == f"fineweb-edu-{version}":
            return f"python -m data.prepare --dataset fineweb-edu --version {version} --out {data_dir}"
    return (f"python -m data.prepare --files 'PATTERN' --out {data_dir}` (your own text) or "
            f"`python -m data.prepare --dataset fineweb-edu --version 10B --out {data_dir}")


def check_model_fits(model_cfg, cfg: TrainConfig, ddp: Distributed, use_bf16: bool, grad_accum: int) -> None:
    """Before any work: the attention backend runs on this device, and a training step fits in its free memory
    (shared by the processes on this machine where they share its memory, the CPU). First a lower bound from the
    parameter count alone (so an absurd size is refused at once), then the memory planner's peak (training/memory.py,
    on fake tensors: no memory is taken and the time does not grow with the model)."""
    from model import Block
    from training.memory import GiB, generous_bound, largest_micro_batch, parameter_counts, plan
    # Shapes only (nothing is allocated), and one block for all n_layer: the check takes no longer for 10^5 layers.
    params, _, _ = parameter_counts(model_cfg)
    with torch.device("meta"):
        block = Block(model_cfg)
    try:
        block.attn.backend(ddp.device, torch.bfloat16 if use_bf16 else torch.float32)
    except ValueError as error:
        raise ConfigError(f"model.attn_backend = {model_cfg.attn_backend!r}: {error}.") from None
    free_gb = free_memory_gb(ddp.device)
    if free_gb is None:
        return
    sharing = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if ddp.device.type == "cpu" else 1
    free_gb /= sharing
    shards = ddp.world_size if ddp.sharded else 1
    state_gb = 16 * params / shards / GiB
    tokens, V, C = cfg.batch_size * model_cfg.block_size, model_cfg.vocab_size, model_cfg.n_embd
    logits = tokens if cfg.loss == "plain" else min(tokens, cfg.loss_chunk_tokens)
    least_gb = 4 * (model_cfg.n_layer * tokens * C + logits * V) / GiB  # each block's input, one loss chunk
    where = f"free on {ddp.device}" + (f" for each of its {sharing} processes" if sharing > 1 else "")
    if state_gb + least_gb > free_gb:
        raise ConfigError(f"this model ({params / 1e6:,.0f}M parameters) needs about {state_gb:,.1f} GB for its "
                          f"weights, gradients and Adam state{' (sharded)' if shards > 1 else ''}, and a micro-batch "
                          f"of {cfg.batch_size} x {model_cfg.block_size} tokens at least {least_gb:,.1f} GB for its "
                          f"activations and logits, more than the {free_gb:,.1f} GB {where}; lower vocab_size, the "
                          "model size, batch_size or block_size.")
    if generous_bound(model_cfg, cfg, ddp.world_size) <= free_gb * GiB:
        return  # certainly fits: the planner's probes (a second or two) are not needed
    need = plan(model_cfg, cfg, ddp.world_size, use_bf16=use_bf16, grad_accum=grad_accum)
    if need.total > free_gb * GiB:
        fits = largest_micro_batch(model_cfg, cfg, ddp.world_size, free_gb * GiB, cfg.parallel, use_bf16)
        remedies = ([f"--batch_size={fits} (the largest micro-batch that fits)"] if fits else []) \
            + (["--activation_checkpointing=blocks"] if cfg.activation_checkpointing != "blocks" else []) \
            + (["--parallel=fsdp"] if not ddp.sharded and ddp.world_size > 1 else []) \
            + (["--loss=chunked"] if cfg.loss == "plain" else [])
        raise ConfigError(f"a training step needs about {need.total / GiB:,.1f} GB per process at its peak (weights, "
                          f"gradients and Adam state {(need.weights + need.gradients + need.optimizer) / GiB:,.1f}, "
                          f"activations {need.activations / GiB:,.1f}, loss {need.loss / GiB:,.1f}, the rest "
                          f"{(need.total - need.weights - need.gradients - need.optimizer - need.activations - need.loss) / GiB:,.1f}), "
                          f"more than the {free_gb:,.1f} GB {where}; "
                          + (f"try {' or '.join(remedies)}" if remedies else "use a smaller model or block_size")
                          + "; python -m training.memory CONFIG --gpus N --gpu-memory GB shows the whole plan.")


def free_memory_gb(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] / 2**30
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 2**20
    except (OSError, StopIteration, ValueError):
        return None  # not Linux: not checked


def build_model(model_cfg, cfg: TrainConfig, ddp: Distributed, ckpt: dict | None, init_state: dict | None,
                grad_accum: int, use_bf16: bool = False):
    """(model, optimizer, the step to start from, the divergence monitor), restored from ckpt on a resume, or
    starting from init_state's weights. The seed is the same on every process, so every replica starts equal
    (under FSDP each process then keeps its shard)."""
    from model import GPT
    torch.manual_seed(cfg.seed)
    raw_model = GPT(model_cfg).to(ddp.device)
    if init_state is not None:
        raw_model.load_state_dict(init_state)
        ddp.say(f"initialised the weights from {cfg.init_from}")
    lay_out(raw_model, cfg, ddp, use_bf16)
    optimizer = make_optimizer(raw_model, cfg, ddp.device)
    step = resume_from(ckpt, raw_model, optimizer, cfg, ddp, grad_accum) if ckpt else 0
    monitor = DivergenceMonitor(model_cfg.vocab_size, cfg.spike_factor, ckpt.get("divergence") if ckpt else None)
    return raw_model, optimizer, step, monitor


def resume_from(ckpt: dict, model, optimizer, cfg: TrainConfig, ddp: Distributed, grad_accum: int) -> int:
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    step = restore(ckpt, model, optimizer, cfg, ddp.device, ddp, path)
    if "recovered" in ckpt:
        ddp.say(f"note: {ckpt['recovered']}.")
        path = os.path.join(cfg.out_dir, ckpt["shards"]["dir"])
    ddp.say(f"resuming {path} at iteration {step} ({'sharded, ' if 'shards' in ckpt else ''}saved by code "
            f"{ckpt.get('code_version', 'unknown')})")
    saved_world = ckpt.get("world_size", ddp.world_size)
    if saved_world != ddp.world_size:
        ddp.say(f"note: saved with {saved_world} processes, resumed with {ddp.world_size}: each step reads the same "
                f"training windows; gradient accumulation is now {grad_accum}.")
    return step


def resolved_config(args: Arguments, model_cfg, cfg: TrainConfig, ckpt: dict | None, changes: list[dict],
                    ddp: Distributed, grad_accum: int, data_dir: str, tokenizer_name: str,
                    micro_batch_size: int | None = None) -> dict:
    """What RUN_DIR/config.json records: where the run came from (its first start's config file, overrides and
    command, and each resume's command), the resolved configs, data, layout, code version, and every deliberate
    change made on a resume (from the checkpoint's history and this resume's)."""
    history = [] if ckpt is None else ckpt.get("changes", []) + [{"iter": ckpt["step"], **c} for c in changes]
    version = code_version()
    origin = provenance(cfg.out_dir, args.config_path, args.overrides, args.argv,
                        None if ckpt is None else ckpt["step"], version)
    return {**origin, "model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(cfg),
            "data_dir_resolved": os.path.abspath(data_dir), "tokenizer": tokenizer_name,
            "world_size": ddp.world_size, "micro_batch_size": micro_batch_size or cfg.batch_size,
            "grad_accum": grad_accum, "code_version": version,
            "resume_changes": history}


def open_run_directory(cfg: TrainConfig, resolved: dict, step: int, resumed: bool, changes: list[dict],
                       ddp: Distributed, wandb_id: str | None, start_over: bool = False,
                       run_dir: LockedDirectory | None = None) -> Metrics:
    """config.json written, metrics.jsonl made ready (trimmed to the checkpoint on resume), the deliberate
    changes recorded and wandb started, on the main process; elsewhere a Metrics that writes nothing.
    `start_over`: the earlier run's files are moved aside first. `run_dir`: the directory as locked, checked first
    (the set-up since the lock may have taken minutes) and by the Metrics before each line."""
    if not ddp.is_main:
        return Metrics(None)
    if run_dir is not None:
        run_dir.check()
    metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    try:
        os.makedirs(cfg.out_dir, exist_ok=True)
        aside = set_aside_earlier_run(cfg.out_dir) if start_over else None
        if aside:
            ddp.say(f"note: --start_over: moved the earlier run's {', '.join(aside[1])} to {aside[0]} (nothing was "
                    "deleted).")
        atomic_write_text(os.path.join(cfg.out_dir, "config.json"), json.dumps(resolved, indent=2) + "\n")
        partial = os.path.join(cfg.out_dir, "ckpt.pt.tmp")
        if os.path.exists(partial):  # a checkpoint write that a kill cut short; ckpt.pt itself is whole
            os.remove(partial)
            ddp.say(f"note: removed {partial}, a checkpoint write cut short by an earlier kill"
                    + (" (ckpt.pt is intact)." if os.path.exists(os.path.join(cfg.out_dir, "ckpt.pt")) else "."))
        stale = unreferenced_shard_directories(cfg.out_dir)  # (only beside a ckpt.pt, which a resume has checked)
        for directory in stale:  # sharded writes that a kill cut short before ckpt.pt named them
            shutil.rmtree(directory, ignore_errors=True)
        if stale:
            ddp.say(f"note: removed {len(stale)} sharded checkpoint director{'y' if len(stale) == 1 else 'ies'} that "
                    f"ckpt.pt does not name ({', '.join(os.path.basename(d) for d in stale)}): writes cut short by an "
                    "earlier kill; the checkpoint is intact.")
        if resumed:
            if trim_metrics(metrics_path, step):
                ddp.say(f"note: dropped the lines of {metrics_path} that were not records (binary garbage or lines "
                        "cut short); what they recorded is lost.")
        elif os.path.exists(metrics_path):
            # Left by an earlier run that never wrote a checkpoint (stopped or diverged early): this run's
            # lines must not be appended to it. Keep it aside rather than delete it.
            os.replace(metrics_path, metrics_path + ".prev")
            ddp.say(f"note: moved the earlier {metrics_path} (a run without a checkpoint) to {metrics_path}.prev")
        for change in changes:
            ddp.say(f"note: --allow_changes: {change['key']} changes from {change['from']!r} to {change['to']!r} "
                    f"at iteration {step} (recorded in config.json, metrics.jsonl and the checkpoint)")
            with open(metrics_path, "a") as f:
                f.write(json.dumps({"type": "change", "iter": step, **change}) + "\n")
    except OSError as error:
        problem = not_a_folder(cfg.out_dir, "the run directory", "--out_dir")
        raise ConfigError(problem + "." if problem else f"cannot write to the run directory {cfg.out_dir} "
                          f"({error.strerror or error}); make it writable or choose another --out_dir.") from None
    wandb_run = start_wandb(cfg, os.path.basename(os.path.normpath(cfg.out_dir)), resolved, wandb_id) \
        if cfg.wandb else None
    return Metrics(metrics_path, wandb_run, run_dir)


def describe(raw_model, cfg: TrainConfig, ddp: Distributed, use_bf16: bool, grad_accum: int, data_dir: str,
             tokenizer_name: str) -> None:
    model_cfg, scale = raw_model.config, cfg.loss_scale
    precision_name = ("bf16 weight matrices (fp32 reduction)" if bf16_parameters(cfg, use_bf16) else
                      "bf16 autocast" if use_bf16 else "fp32")
    checkpointed = len(raw_model.checkpointed_blocks)
    ddp.say(f"model: {raw_model.num_params() / 1e6:.2f}M parameters, pos={model_cfg.pos}, kv_shift={model_cfg.kv_shift} | "
            f"{ddp.world_size} process(es) on {ddp.device.type}, "
            f"{'FSDP (sharded)' if ddp.sharded else 'DDP' if ddp.world_size > 1 else 'one replica'}, {precision_name}, "
            f"loss {describe_loss(raw_model.loss_impl, raw_model.loss_chunk_tokens)}, "
            f"{describe_compile(raw_model, cfg, ddp, use_bf16)}, "
            + (f"activation checkpointing on {checkpointed} of {model_cfg.n_layer} blocks, " if checkpointed else "")
            + 
            f"batch {cfg.global_batch_size} x {model_cfg.block_size} tokens = {cfg.batch_size} x {grad_accum} accum x "
            f"{ddp.world_size} | {cfg.sampler} sampler, seed {cfg.seed}"
            + (f", gradient {scale} x the mean (grad_scale official)" if scale != 1 else "")
            + (f" | {torch.get_num_threads()} CPU thread(s)" if ddp.device.type == "cpu" else "")
            + f" | data {data_dir} ({tokenizer_name}) | run dir {cfg.out_dir}"
            + (f" | kernels: {probe_summary()}" if probe_summary() else ""))
    hint = busy_cores_hint(ddp.device)
    if hint:
        ddp.say(hint)


def busy_cores_hint(device: torch.device, load: float | None = None) -> str | None:
    """A note when the CPU cores this run may use are already busy with other work (the load average, `load`
    when given, at least the number of cores): torch's threads then wait for one another at every step (the
    quickstart took 8 minutes instead of 2 on shared cores), and fewer threads are faster. None on GPUs, and
    where the cores are free or the load cannot be read."""
    if device.type != "cpu":
        return None
    try:
        load = os.getloadavg()[0] if load is None else load
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    except OSError:
        return None
    threads = torch.get_num_threads() * int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if load < cores or threads <= 1:
        return None
    return (f"note: the load average is {load:.1f} on the {cores} core(s) this run may use, so other work keeps them "
            f"busy, and the run's {threads} CPU thread(s) will wait for them at every step (it can take several times "
            "longer); fewer threads usually help (OMP_NUM_THREADS=1 before the command), or train when the cores are "
            "free.")


# ----------------------------------------------------------------------------- the loop's records

def validate(model, data, cfg: TrainConfig, block_size: int, ddp: Distributed, autocast, metrics: Metrics,
             step: int, stops: StopSignals, val_losses: list) -> None:
    """The validation loss, recorded and appended to val_losses; nothing if a stop request cut it short."""
    val_loss = evaluate(model, data, cfg, block_size, ddp, autocast, stops)
    if val_loss is not None:
        metrics.write({"type": "val", "iter": step, "tokens": step * cfg.global_batch_size * block_size,
                       "val_loss": val_loss}, f"iter {step:>6} | val loss {val_loss:.4f}")
        val_losses.append((step, val_loss))


def log_train(metrics: Metrics, throughput: Throughput, step: int, end_iter: int, lr: float, result: StepResult,
              cfg: TrainConfig, tokens_per_step: int) -> None:
    rate = throughput.read(step, end_iter)
    metrics.write({"type": "train", "iter": step, "tokens": step * tokens_per_step, "loss": result.loss, "lr": lr,
                   "grad_norm": result.grad_norm, "param_norm": result.param_norm, **rate},
                  f"iter {step:>6}/{cfg.num_steps} | loss {result.loss:.4f} | lr {lr:.2e} | grad norm "
                  f"{result.grad_norm:.3f} | {rate['tokens_per_s']:,.0f} tok/s"
                  + (f" | MFU {100 * rate['mfu']:.1f}%" if rate["mfu"] is not None else "")
                  + f" | {duration(rate['elapsed_s'])} elapsed, {duration(rate['eta_s'])} left")


def check(monitor: DivergenceMonitor, result: StepResult, step: int, raw_model, checkpointer: Checkpointer,
          before_saving: bool = False) -> None:
    """Stop a diverged run (training/divergence.py) before its weights are used or saved."""
    problem = monitor.problem(result.loss, result.grad_norm, result.param_norm, result.overflow)
    if problem:
        raise divergence_error(problem, step, raw_model.nonfinite_cause(), checkpointer.path, checkpointer.saved_step,
                               before_saving)


def save_checked(checkpointer: Checkpointer, monitor: DivergenceMonitor, raw_model, optimizer, batches, step: int,
                 grad_accum: int, ddp: Distributed, autocast, stops: StopSignals) -> None:
    """Save the weights after `step` steps once their own loss and health pass the divergence checks, so that the
    checkpoint on disk is always one that passed them (its advice can be followed)."""
    check(monitor, confirmation(raw_model, batches, step, grad_accum, ddp, autocast, stops), step, raw_model,
          checkpointer, before_saving=True)
    checkpointer.save(step, raw_model, optimizer, monitor.state_dict())


def end_of_loop(stop_reason: str | None, trained: bool, recovered: bool, save, path: str, step: int,
                end_iter: int, num_steps: int, ddp: Distributed) -> str:
    """How the loop ended, for the summary ("done", "stop_iter", "sigterm" or "interrupted"), after the checkpoint
    a stop request or a recovered sharded checkpoint still needs. `stop_reason`: the stop request's ("" or None
    when it was asked on another process: a scheduler's SIGTERM), None without one."""
    if stop_reason is not None:
        stopped = stop_reason or "sigterm"
        save(step)
        ddp.say(f"stop requested ({'Ctrl-C' if stopped == 'interrupted' else 'SIGTERM'}): saved {path} at iteration "
                f"{step}; {how_to_continue()}.")
        return stopped
    if not trained and recovered:  # nothing to train, but the shards' weights have no ckpt.pt to name them
        save(step)
        ddp.say(f"wrote {path} at iteration {step} from the recovered sharded checkpoint (this run ends at "
                f"{end_iter}); nothing else to do.")
    elif not trained:
        ddp.say(f"{path} is already at iteration {step} (this run ends at {end_iter}); nothing to do.")
    return "stop_iter" if step < num_steps else "done"


# ----------------------------------------------------------------------------- the run

def run(argv: list[str]) -> dict:
    """Train as the arguments say; returns a summary (per-step losses of this invocation, final step, ...)."""
    from model import GPTConfig
    args = parse_args(argv)
    model_cfg, cfg = resolve(args.config_path, args.overrides, GPTConfig, resume=args.resume)
    cfg = own_run_directory(args, model_cfg, cfg)
    problem = not_a_folder(cfg.out_dir, "the run directory", "--out_dir")
    if problem:  # said now, before the data and the model, not when the run directory is first written
        raise ConfigError(problem + ".")
    # one run at a time in a run directory, from before its checkpoint is read (training/run_lock.py)
    # Every write of the run checks that out_dir still leads to the directory locked here (a moved run stops).
    with run_directory_lock(cfg.out_dir, argv, is_main=process_rank() == 0, create=not args.resume) as run_dir:
        ckpt, changes, init_state = open_checkpoint(args, cfg, dataclasses.asdict(model_cfg))
        ddp = Distributed(cfg.device, cfg.dist_timeout_s, cfg.parallel)
        try:
            return train(args, model_cfg, cfg, ckpt, changes, init_state, ddp, run_dir)
        finally:
            if ddp.device.type == "cpu":
                torch.set_flush_denormal(False)  # back to the default for whatever runs next in this process, also
                                                 # after a set-up error (precision() sets it before the loop's try)
            ddp.release()


def train(args: Arguments, model_cfg, cfg: TrainConfig, ckpt: dict | None, changes: list[dict],
          init_state: dict | None, ddp: Distributed, run_dir: LockedDirectory) -> dict:
    """run() from the processes' set-up on."""
    micro, grad_accum = batch_split(cfg, ddp, resumed=ckpt is not None)
    configured_batch_size = cfg.batch_size  # (config.json keeps it: a resume on other processes splits anew)
    cfg = dataclasses.replace(cfg, batch_size=micro)  # the micro-batch that every piece below reads
    use_bf16, autocast = precision(cfg, ddp.device)
    check_model_fits(model_cfg, cfg, ddp, use_bf16, grad_accum)
    T = model_cfg.block_size
    data, tokenizer_name, batches = training_data(cfg, model_cfg.vocab_size, T, ddp)
    data_dir = data.path
    if ckpt is not None:  # a data folder prepared again since the checkpoint: refused, or recorded as a change
        changes = changes + check_resume_data(ckpt, data, os.path.join(cfg.out_dir, "ckpt.pt"), args.allowed_changes)
    raw_model, optimizer, step, monitor = build_model(model_cfg, cfg, ddp, ckpt, init_state, grad_accum, use_bf16)
    resolved = resolved_config(args, model_cfg, dataclasses.replace(cfg, batch_size=configured_batch_size), ckpt,
                               changes, ddp, grad_accum, data_dir, tokenizer_name, micro)
    resolved["data_identity"] = data.identity  # (kept in config.json and every checkpoint)
    wandb_id = ckpt.get("wandb_id") if ckpt else None
    recovered = bool(ckpt and ckpt.get("recovered"))  # resumed from shards whose ckpt.pt is gone
    metrics = open_run_directory(cfg, resolved, step, ckpt is not None, changes, ddp, wandb_id, args.start_over,
                                 run_dir)
    del ckpt
    model = wrapped_for_training(raw_model, cfg, ddp)  # (the start-up line says what is compiled)
    tokens_per_step = cfg.global_batch_size * T
    throughput = Throughput(step, tokens_per_step, raw_model.flops_per_token(T), gpu_peak_flops(ddp.device),
                            ddp.world_size)
    end_iter = min(cfg.num_steps, cfg.stop_iter) if cfg.stop_iter else cfg.num_steps
    describe(raw_model, cfg, ddp, use_bf16, grad_accum, data_dir, tokenizer_name)

    losses, val_losses = [], []
    try:
        with StopSignals(ddp.say) as stops:
            checkpointer = Checkpointer(os.path.join(cfg.out_dir, "ckpt.pt"), ddp, stops, resolved,
                                        metrics.wandb_id(wandb_id), step if args.resume else None, run_dir)
            save = functools.partial(save_checked, checkpointer, monitor, raw_model, optimizer, batches,
                                     grad_accum=grad_accum, ddp=ddp, autocast=autocast, stops=stops)
            if step == 0 and cfg.eval_interval:
                validate(model, data, cfg, T, ddp, autocast, metrics, step, stops, val_losses)
            stop = stops.any_process(ddp)  # asked during the first validation; later, voted with each step
            model.train()
            while step < end_iter and not stop:
                lr = lr_at(step, cfg)
                set_lr(optimizer, lr)
                result = train_step(model, raw_model, batches, step, grad_accum, cfg, ddp, autocast, stops)
                if result is None:  # a stop request between micro-batches: the partial step was dropped
                    stop = True
                    break
                check(monitor, result, step, raw_model, checkpointer)
                monitor.record(result.loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                losses.append(result.loss)
                logged = step % cfg.log_interval == 0 or step == end_iter
                if logged:
                    checkpointer.check_directory()  # (the main process's writes check it too, on their own)
                    log_train(metrics, throughput, step, end_iter, lr, result, cfg, tokens_per_step)
                evaluated = bool(cfg.eval_interval) and (step % cfg.eval_interval == 0 or step == cfg.num_steps)
                if evaluated:
                    validate(model, data, cfg, T, ddp, autocast, metrics, step, stops, val_losses)
                stop = result.stop or evaluated and stops.any_process(ddp)
                saved = not stop and (step == end_iter or cfg.ckpt_interval > 0 and step % cfg.ckpt_interval == 0)
                if saved:
                    save(step)
                if logged or evaluated or saved:  # keep validation and checkpoint time out of tokens/s
                    throughput.restart(step)
            stopped = end_of_loop(stops.reason if stop else None, bool(losses), recovered, save, checkpointer.path,
                                  step, end_iter, cfg.num_steps, ddp)
            memory = peak_memory(ddp.device)
            metrics.write({"type": "summary", "iter": step, "stopped": stopped, **memory},
                          f"{stopped} at iteration {step} | peak memory {memory['peak_memory_gb']:.2f} GiB | "
                          f"run dir {cfg.out_dir}")
        return {"losses": losses, "val_losses": val_losses, "step": step, "stopped": stopped, "out_dir": cfg.out_dir,
                "grad_accum": grad_accum, "micro_batch_size": cfg.batch_size,
                "peak_memory_gb": memory["peak_memory_gb"]}
    finally:
        metrics.close()


def main() -> None:
    rank = process_rank()
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        from model import GPTConfig
        print(__doc__.strip() + "\n\n" + HELP_OPTIONS + "\n\n" + describe_keys(TrainConfig, "train") + "\n\n"
              + describe_keys(GPTConfig, "model"))
        return
    if signal.getsignal(signal.SIGINT) is exit_interrupted:  # imports done: from here Ctrl-C is a KeyboardInterrupt,
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as when train.run is called from Python
    try:
        run(sys.argv[1:])
    except KeyboardInterrupt:
        exit_interrupted()
    except (ConfigError, TrainError, DataError) as e:
        code = 2 if isinstance(e, ConfigError) else 1
        # a damaged batch is seen only by the process that read it; a lost process may be the main one
        own = isinstance(e, (DamagedBatch, LostProcess))
        if TORCHRUN_ERROR_FILE in os.environ and not own:
            # Under torchrun, a process that exits with an error is followed by torchrun's own report (its
            # traceback, then a block for each failed process), which no process can shorten or silence. That
            # report ends with the first failed process's error file: the main process puts the sentence there
            # and does not print it, so that it is read once, and last.
            if rank != 0:
                leave_it_to_the_main_process()
        elif rank == 0 or own:
            print(f"error: {e}", file=sys.stderr, flush=True)
        report_to_torchrun(f"error: {e}", code)
        if TORCHRUN_ERROR_FILE in os.environ:
            # Said and recorded: exit now. Releasing a DDP model's reducer can wait for ever on its gloo group's
            # worker thread (seen after an error inside the loop), until torchrun's SIGTERM 30 s later makes a
            # second failure of it in the report.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if dist.is_available() and dist.is_initialized() and not isinstance(e, LostProcess):  # (it would wait on it)
            dist.destroy_process_group()
        sys.exit(code)
    except RuntimeError as e:  # DistBackendError and gloo's own errors are RuntimeErrors
        if not (dist.is_available() and dist.is_initialized()) or not is_collective_failure(e):
            raise
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        # Every rank says it: the main process may be the one that died or froze.
        print(f"error: process {rank} stopped: a collective operation with the other processes failed ({first_line}); "
              "another process died or stopped responding (waits end after train.dist_timeout_s). The last "
              f"checkpoint is intact: fix the cause and {how_to_continue()}.", file=sys.stderr, flush=True)
        sys.exit(1)  # without destroy_process_group, which could wait on the dead process
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


TORCHRUN_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # set by torchrun for each process it starts (also above)
MAIN_PROCESS_REPORTS_WITHIN_S = 30.0  # its exit takes seconds (torch unloading) on a busy machine


def report_to_torchrun(sentence: str, code: int) -> None:
    """Under torchrun, put the sentence in this process's error file: torchrun's failure report then ends with it
    (on a line of its own, where study.py's error line is looked for), instead of a pointer to its
    documentation."""
    path = os.environ.get(TORCHRUN_ERROR_FILE)
    if path:
        try:
            with open(path, "w") as f:
                json.dump({"message": f"none (train.py's own error, exit status {code}):\n{sentence}",
                           "timestamp": int(time.time())}, f)
        except OSError:
            pass  # the report then says less; nothing else can be done


def leave_it_to_the_main_process() -> None:
    """A process other than the main one, under torchrun, with an error that every process meets alike: the main
    process reports it, and when it exits, torchrun's SIGTERM ends this one quietly (leave_quietly). If none comes,
    the error was this process's own (the main one is waiting on it in a collective, or on another node): the
    caller then reports it as its own."""
    signal.signal(signal.SIGTERM, leave_quietly)
    time.sleep(MAIN_PROCESS_REPORTS_WITHIN_S)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":
    main()
