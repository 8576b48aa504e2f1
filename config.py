"""Training configuration: the TrainConfig dataclass and the TOML config loader with CLI overrides.

A config file is TOML with up to three top-level entries:

    include = "../base/medium.toml"   # optional; a path relative to this file, merged first
    [model]                           # keys of model.GPTConfig
    pos = "fox"
    [train]                           # keys of TrainConfig below
    lr = 1e-3

Files are merged include-first, so a per-encoding file only says what differs from its base.
Command-line overrides `--key=value` (or `--model.key=value` / `--train.key=value` when a name is
ambiguous) are applied last. Every key is checked: a misspelling is an error that names the closest
valid key, and every value is converted to the type of its field.

`train.recipe` names a preset of the model and training options in which the official code and this
project differ (RECIPES below, docs/recipe.md): it fills each of those keys that no file and no override
sets. "official" reproduces the authors' training; "clean" is this project's alternative.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import glob
import json
import math
import os
import re
import tomllib
import typing
from dataclasses import dataclass

# study.py sets this to its own command line for the runs it starts, in its process and in subprocesses: a
# study's run is continued by rerunning the study (which adds --resume itself, with the study's settings), so the
# advice to continue with train.py --resume would send its user past the study.
STUDY_COMMAND = "GRAPE_STUDY_COMMAND"


def study_command() -> str | None:
    """The command line of the study this run belongs to, or None when train.py runs on its own."""
    return os.environ.get(STUDY_COMMAND) or None


def how_to_continue(alone: str = "continue with --resume") -> str:
    """The advice after a stop that left a checkpoint: `alone` for train.py on its own, or to rerun the study."""
    command = study_command()
    return f"rerun the study command ({command}) to continue" if command else alone


SECTIONS = ("model", "train")
LOSSES = ("auto", "chunked", "plain", "liger", "cce")  # train.loss (lm_loss.py)

def official_spectrum_scale(model: dict) -> float:
    """The authors' non-contextual GRAPE-M learns log_freq = 16·log θ; their contextual one learns log θ itself
    (its 16 is the temperature of ω, ctx_temperature here)."""
    return 1.0 if "grape_m_ctx" in str(model.get("pos", "")).replace(" ", "").split("+") else 16.0


# What each recipe sets (docs/recipe.md: the effect of each difference and the test that shows it). A value may
# be a function of the model section, for a setting whose official value depends on the encoding.
RECIPES = {
    "official": {  # as the authors' code trains
        "model": {"qk_norm": "after",                     # rotate, then QK RMSNorm
                  "spectrum_scale": official_spectrum_scale,
                  "p_norm_eps": 0.0},                     # GRAPE-AP's p̂: F.rms_norm's default epsilon (the dtype's)
        "train": {"decay_params": "all_but_norm_gains", "lr_schedule": "official",
                  "grad_scale": "official",               # sum over a process's micro-batches, mean over processes
                  "sampler": "random_offsets", "seed": 42},
    },
    "clean": {  # this project's alternative (and the defaults of GPTConfig and TrainConfig)
        "model": {"qk_norm": "before", "spectrum_scale": 1.0, "p_norm_eps": 1e-5},
        "train": {"decay_params": "matrices", "lr_schedule": "clean", "grad_scale": "mean", "sampler": "windows",
                  "seed": 1337},
    },
}


MAX_SEED = 2**64 - 1  # torch.manual_seed takes 0 .. 2**64 - 1; numpy's seeds take any integer


class ConfigError(Exception):
    """A user mistake in a config file or on the command line; the message says what to do."""


class UserError(Exception):
    """A mistake in a command's arguments or inputs (a checkpoint path, a data folder): printed as one sentence,
    without a traceback."""


@dataclass(kw_only=True)
class TrainConfig:
    # data and output
    data_dir: str = "default"        # a prepared data directory; "default" / "default-byte" = the embedded corpus
                                     # with GPT-2 or byte tokens (prepared once, offline)
    out_dir: str = ""                # run directory; "" = runs/<config path below configs/, without .toml>
    seed: int = 1337                 # initial weights and the sampler's order (the same on every process)
    init_from: str = ""              # start a new run from these weights: a run directory or checkpoint file, or a
                                     # Hugging Face directory (Qwen3 of this architecture, or an export of ours);
                                     # "" = random init. Ignored on --resume (hf/init_from.py, docs/hf_export.md)
    # batch: global_batch_size sequences per optimizer step = micro-batch x grad_accum x world_size
    batch_size: int = 4              # the most sequences a micro-batch holds on each process: the largest number up
                                     # to it that divides each process's share of global_batch_size is used
    global_batch_size: int = 480     # sequences per optimizer step over all processes
    recipe: str = "clean"            # official | clean: presets for the keys below and some model keys (RECIPES)
    sampler: str = "windows"         # windows: every aligned window once per epoch, in a seeded permutation |
                                     # random_offsets: the authors' (a random shard and start per sequence, with
                                     # replacement, drawn as their processes draw them; needs reference_layout)
    grad_scale: str = "mean"         # mean: the gradient of the mean loss over the global batch | official: the
                                     # authors' sum over each process's micro-batches (the mean x their micro-batches
                                     # per process, from reference_layout), whatever this run's own split
    reference_layout: str = ""       # the authors' launch as PROCESSESxMICRO_BATCHES (medium 8x3, large 8x4), for
                                     # grad_scale = official and sampler = random_offsets; "" = not needed
    retrieval_fraction: float = 0.0  # the share of training windows rewritten to hold associative-recall facts and
                                     # their queries between pieces of their text (data/retrieval.py; the retrieval
                                     # axis of eval/retrieval.py); 0 = plain text
    retrieval_pairs: int = 8         # facts (each queried once, later) in each such window
    # optimizer and schedule (AdamW)
    decay_params: str = "matrices"   # weight decay on: matrices (Linear and Embedding weights) | all_but_norm_gains
    lr_schedule: str = "clean"       # clean: max_iters steps, warm-up lr·(s+1)/warmup_iters | official: iterations
                                     # 0..max_iters (max_iters + 1 steps), warm-up lr·it/warmup_iters; both cosine
                                     # to min_lr at iteration max_iters
    max_iters: int = 25000           # the step at which the cosine reaches min_lr and training ends
    lr: float = 1e-3                 # peak learning rate, reached after warm-up
    min_lr: float = 3e-5             # learning rate at the end of the cosine decay
    warmup_iters: int = 2000         # linear warm-up steps
    weight_decay: float = 0.01       # AdamW weight decay, on the parameters decay_params names
    beta1: float = 0.9               # AdamW first-moment decay
    beta2: float = 0.95              # AdamW second-moment decay
    grad_clip: float = 1.0           # 0 = no clipping
    spike_factor: float = 2.0        # stop as diverged when the loss exceeds this many times its recent average
                                     # (the last 50 steps); 0 = off (non-finite values, a zero gradient and a return
                                     # to the uniform-prediction loss always stop the run)
    # evaluation, logging, checkpoints
    log_interval: int = 10           # a train record (loss, lr, grad norm, tokens/s, time left) every this many steps
    eval_interval: int = 1000        # validation every this many iterations (and at the first and last); 0 = never
    eval_windows: int = 200          # validation sequences per evaluation: the first ones of the fixed list (or
                                     # all, if fewer), so every run (any batch_size, encoding) scores the same ones
    ckpt_interval: int = 1000        # checkpoint every this many iterations (and at the end); 0 = only at the end
    stop_iter: int = 0               # stop with a checkpoint after this many iterations (time-limited jobs); 0 = max_iters
    # system
    device: str = "auto"             # auto | cpu | cuda
    dtype: str = "auto"              # auto (bf16 autocast on GPU, fp32 on CPU) | bf16 | fp32
    compile: bool = False            # torch.compile the model (under fsdp: each block, before sharding)
    # memory: past one GPU (docs/train.md, "Memory"; python -m training.memory CONFIG plans a run)
    parallel: str = "ddp"            # ddp: every process holds the whole model, its gradients and Adam state (the
                                     # paper's sizes) | fsdp: all three sharded over the processes (FSDP2; 1.3B and up)
    fsdp_reshard_after_forward: bool = True  # fsdp: free each block's gathered weights after its forward (gathered
                                     # again for its backward); false keeps them: one all-gather less, more memory
    fsdp_bf16: str = "params"        # fsdp with bf16: params (the weight matrices gathered in bf16 and computed in
                                     # bf16, gradients reduced in fp32; norms and positional parameters stay fp32) |
                                     # autocast (fp32 weights, bf16 autocast, as ddp)
    fsdp_reduce_each_micro_batch: bool = False  # fsdp with accumulation: reduce-scatter every micro-batch's
                                     # gradients (they accumulate sharded) instead of only the last one's (they
                                     # accumulate unsharded: 4 bytes a parameter on every GPU until the step's end)
    activation_checkpointing: str = "none"  # none | blocks (recompute every block's activations in the backward) |
                                     # every_k (every activation_checkpointing_every-th block)
    activation_checkpointing_every: int = 2  # every_k: recompute blocks k-1, 2k-1, ...
    loss: str = "auto"               # auto (liger, then cce, where installed on CUDA, else chunked) | chunked (LM head
                                     # + cross-entropy in chunks of tokens: never the full logits) | plain (full
                                     # logits) | liger | cce (fused CUDA kernels: pip install liger-kernel /
                                     # cut-cross-entropy)
    loss_chunk_tokens: int = 256     # chunked: tokens per chunk of the LM head and loss (its logits are
                                     # 256 x vocabulary x 4 bytes; larger chunks may run faster on a GPU)
    dist_timeout_s: int = 600        # with several processes: a process that waits this long for another (dead
                                     # or frozen) ends the job with a message instead of blocking forever
    # wandb (disabled unless asked; offline by default, so no account is needed)
    wandb: bool = False              # also log to Weights & Biases
    wandb_project: str = "grape"     # its project name
    wandb_mode: str = "offline"      # offline | online
    wandb_run_name: str = ""         # "" = the run directory's name

    def validate(self, in_study_file: bool = False) -> None:
        """A ConfigError for the first setting that cannot train. `in_study_file`: the settings come from a study
        file, whose [overrides] set keys (warmup_iters = 10), not train.py's flags (--warmup_iters=10), so the
        remedy is written that way."""
        # (whether the value is valid, what is wrong, the key whose usual value is suggested as the remedy, or None
        # when the sentence already says what to do)
        checks = [
            (self.batch_size >= 1, f"batch_size must be at least 1, not {self.batch_size}", "batch_size"),
            (self.global_batch_size >= self.batch_size,
             f"global_batch_size ({self.global_batch_size}) must be at least batch_size ({self.batch_size}): it counts "
             "the sequences of a step over all processes; raise --global_batch_size or lower --batch_size", None),
            (self.max_iters >= 1, f"max_iters must be at least 1, not {self.max_iters}", "max_iters"),
            (0 <= self.warmup_iters < self.max_iters,
             f"warmup_iters ({self.warmup_iters}) must be between 0 and max_iters - 1 ({self.max_iters - 1}); lower "
             f"--warmup_iters or raise --max_iters", None),
            (0 <= self.seed <= MAX_SEED,
             f"seed must be between 0 and {MAX_SEED} (2**64 - 1, what the random generators take), not {self.seed}",
             "seed"),
            (math.isfinite(self.lr) and self.lr > 0, f"lr must be a positive number, not {self.lr}"
             + (f" (the peak learning rate has no sign); write --lr={-self.lr:g}" if -math.inf < self.lr < 0 else ""),
             None if -math.inf < self.lr < 0 else "lr"),
            (0 <= self.min_lr <= self.lr, f"min_lr must be between 0 and lr ({self.lr}), not {self.min_lr}; set "
             f"--min_lr to at most --lr, e.g. --min_lr={self.lr / 10:g}", None),
            (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
             f"beta1 and beta2 must be in [0, 1), not {self.beta1} and {self.beta2}; e.g. --beta1={TrainConfig.beta1} "
             f"--beta2={TrainConfig.beta2} (the defaults)", None),
            (0 <= self.weight_decay < math.inf, f"weight_decay must be 0 or positive, not {self.weight_decay}",
             "weight_decay"),
            (0 <= self.grad_clip < math.inf, f"grad_clip must be 0 (no clipping) or positive, not {self.grad_clip}",
             "grad_clip"),
            (self.spike_factor == 0 or 1 < self.spike_factor < math.inf,
             f"spike_factor must be 0 (off) or a number above 1, not {self.spike_factor}", "spike_factor"),
            (self.dist_timeout_s >= 1, f"dist_timeout_s must be at least 1 second, not {self.dist_timeout_s}",
             "dist_timeout_s"),
            (self.log_interval >= 1, f"log_interval must be at least 1, not {self.log_interval}", "log_interval"),
            (self.eval_interval >= 0 and self.ckpt_interval >= 0 and self.stop_iter >= 0,
             f"eval_interval, ckpt_interval and stop_iter must be 0 or positive, not {self.eval_interval}, "
             f"{self.ckpt_interval} and {self.stop_iter}; 0 turns each off", None),
            (self.eval_windows >= 1, f"eval_windows must be at least 1, not {self.eval_windows}", "eval_windows"),
            (self.device in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda, not {self.device!r}", "device"),
            (self.dtype in ("auto", "bf16", "fp32"), f"dtype must be auto, bf16 or fp32, not {self.dtype!r}", "dtype"),
            (self.wandb_mode in ("offline", "online"), f"wandb_mode must be offline or online, not {self.wandb_mode!r}",
             "wandb_mode"),
            (self.recipe in RECIPES, f"recipe must be {' or '.join(RECIPES)}, not {self.recipe!r}", "recipe"),
            (self.decay_params in ("matrices", "all_but_norm_gains"),
             f"decay_params must be matrices or all_but_norm_gains, not {self.decay_params!r}", "decay_params"),
            (0 <= self.retrieval_fraction <= 1, "retrieval_fraction must be between 0 (plain text) and 1 (every "
             f"window), not {self.retrieval_fraction}", "retrieval_fraction"),
            (self.retrieval_pairs >= 1, f"retrieval_pairs must be at least 1, not {self.retrieval_pairs}",
             "retrieval_pairs"),
            (self.lr_schedule in ("clean", "official"), f"lr_schedule must be clean or official, not {self.lr_schedule!r}",
             "lr_schedule"),
            (self.sampler in ("windows", "random_offsets"),
             f"sampler must be windows or random_offsets, not {self.sampler!r}", "sampler"),
            (self.grad_scale in ("mean", "official"), f"grad_scale must be mean or official, not {self.grad_scale!r}",
             "grad_scale"),
            (self.parallel in ("ddp", "fsdp"), f"parallel must be ddp or fsdp, not {self.parallel!r}", "parallel"),
            (self.fsdp_bf16 in ("params", "autocast"), f"fsdp_bf16 must be params or autocast, not {self.fsdp_bf16!r}",
             "fsdp_bf16"),
            (self.activation_checkpointing in ("none", "blocks", "every_k"),
             f"activation_checkpointing must be none, blocks or every_k, not {self.activation_checkpointing!r}",
             "activation_checkpointing"),
            (self.activation_checkpointing_every >= 1, "activation_checkpointing_every must be at least 1, not "
             f"{self.activation_checkpointing_every}", "activation_checkpointing_every"),
            (self.loss in LOSSES, f"loss must be one of {', '.join(LOSSES)}, not {self.loss!r}", "loss"),
            (self.loss_chunk_tokens >= 1, f"loss_chunk_tokens must be at least 1, not {self.loss_chunk_tokens}",
             "loss_chunk_tokens"),
        ]
        for ok, message, key in checks:
            if not ok and in_study_file:
                remedy = f"; set it in [overrides], e.g. {key} = {json.dumps(getattr(TrainConfig, key))} (the " \
                         "default)" if key else ""
                as_keys = re.sub(r"--(\w+)=", r"\1 = ", re.sub(r"--(\w+)\b(?!=)", r"\1", message))
                raise ConfigError(as_keys + remedy + ".")
            if not ok:
                remedy = f"; set it in [train] or with --{key}=..., e.g. --{key}={getattr(TrainConfig, key)} (the " \
                         "default)" if key else ""
                raise ConfigError(message + remedy + ".")
        if self.grad_scale == "official" or self.sampler == "random_offsets" or self.reference_layout:
            self.reference_processes_and_micro_steps()  # a ConfigError that says what to set

    def reference_processes_and_micro_steps(self) -> tuple[int, int]:
        """(P, M) of reference_layout = "PxM": the authors' processes and micro-batches per process; each of
        their micro-batches holds global_batch_size / (P·M) sequences."""
        needs = ("grad_scale = official" if self.grad_scale == "official" else
                 "sampler = random_offsets" if self.sampler == "random_offsets" else "it")
        text = self.reference_layout.lower().replace(" ", "")
        parts = text.split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ConfigError(f"train.reference_layout = {self.reference_layout!r}: {needs} needs the authors' launch "
                              "as PROCESSESxMICRO_BATCHES, e.g. --reference_layout=8x3 (the medium configs; 8x4 for "
                              "large), or --recipe=clean.")
        processes, micro_steps = int(parts[0]), int(parts[1])
        if self.global_batch_size % (processes * micro_steps):
            raise ConfigError(f"train.reference_layout = {self.reference_layout!r} does not divide global_batch_size "
                              f"{self.global_batch_size} into {processes} x {micro_steps} equal micro-batches; fix one "
                              "of the two.")
        return processes, micro_steps

    @property
    def loss_scale(self) -> int:
        """What each micro-batch's mean loss is multiplied by, beyond the 1/accumulation of the mean: the authors'
        micro-batches per process under grad_scale = official (their gradient is that many times the mean's)."""
        return self.reference_processes_and_micro_steps()[1] if self.grad_scale == "official" else 1

    @property
    def num_steps(self) -> int:
        """Optimizer steps of a whole run: the official loop runs iterations 0..max_iters inclusive."""
        return self.max_iters + 1 if self.lr_schedule == "official" else self.max_iters


# The values of train keys that runs (and their checkpoints) written before the key existed were trained with.
AS_TRAINED_BEFORE_KEY_EXISTED = {"decay_params": "matrices", "lr_schedule": "clean", "grad_scale": "mean",
                                 "sampler": "windows", "reference_layout": "", "retrieval_fraction": 0.0,
                                 "retrieval_pairs": 8}

# Names other training codebases use for our keys; spelling similarity alone would miss them.
KEY_ALIASES = {"learning_rate": "lr", "max_lr": "lr", "min_learning_rate": "min_lr", "lr_min": "min_lr",
               "warmup_steps": "warmup_iters", "max_steps": "max_iters", "num_iterations": "max_iters",
               "micro_batch_size": "batch_size", "total_batch_size": "global_batch_size", "wd": "weight_decay",
               "clip_grad": "grad_clip", "grad_clip_norm": "grad_clip", "context_length": "block_size",
               "seq_len": "block_size", "n_ctx": "block_size"}


def closest_hint(name: str, valid: typing.Iterable[str]) -> str:
    valid = list(valid)
    if KEY_ALIASES.get(name) in valid:
        return f"did you mean {KEY_ALIASES[name]!r}?"
    match = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    return f"did you mean {match[0]!r}?" if match else "valid keys: " + ", ".join(sorted(valid))


def field_help(cls) -> dict[str, str]:
    """Each field's meaning: the comment on its line in the class source and the comment lines below it that
    continue it (so --help cannot drift from the code)."""
    import ast
    import inspect
    import io
    import tokenize
    source = inspect.getsource(cls)
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = (token.start[1], token.string.lstrip("#").strip())
    lines = source.splitlines()
    fields = {node.target.id: node.lineno for node in ast.parse(source).body[0].body
              if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    meanings = {}
    for name, line in fields.items():
        if line not in comments:
            meanings[name] = ""
            continue
        column, text = comments[line]
        parts, below = [text], line + 1
        while below in comments and comments[below][0] == column and not lines[below - 1][:column].strip():
            parts.append(comments[below][1])  # a continuation: a comment alone, in the same column
            below += 1
        meanings[name] = " ".join(parts)
    return meanings


def describe_keys(cls, section: str) -> str:
    """One line per field of a config dataclass: --key=default (type), then its meaning."""
    kinds, meanings = field_kinds(cls), field_help(cls)
    rows = []
    for f in dataclasses.fields(cls):
        kind = kinds[f.name].__name__ if kinds[f.name] else "value"
        default = str(f.default).lower() if isinstance(f.default, bool) else f.default if f.default != "" else '""'
        rows.append(f"  --{f.name}={default} ({kind})\n      {meanings[f.name]}")
    return f"{section} keys ([{section}] in a config file, or --key=value; --{section}.key=value if a name is " \
           f"in both):\n" + "\n".join(rows)


def field_kinds(cls) -> dict[str, object]:
    """Map field name -> the type its values are converted to (bool/int/float/str, or None if unknown)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: fall back to the defaults' types below
        hints = {}
    kinds = {}
    for f in dataclasses.fields(cls):
        kind = hints.get(f.name)
        if kind not in (bool, int, float, str):
            # Optional or other annotation: fall back to the default's type, if it is a plain one.
            default = f.default if f.default is not dataclasses.MISSING else None
            kind = type(default) if isinstance(default, (bool, int, float, str)) else None
        kinds[f.name] = kind
    return kinds


def convert(section: str, key: str, value, kind):
    """Convert a TOML or command-line value to the field's type; one clear error if impossible."""
    where = f"{section}.{key}"
    if kind is None:
        if isinstance(value, str):  # optional or unusual field type: guess from the text
            if value.lower() in ("none", "null"):
                return None
            for parse in (int, float):
                try:
                    return parse(value)
                except ValueError:
                    pass
            if value.lower() in ("true", "false"):
                return value.lower() == "true"
        return value
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, int):
                return value
            with contextlib.suppress(ValueError):
                return int(str(value))  # exact, however large (a float would round 2**64 - 1 up)
            number = float(value)  # accepts "2.5e4" and 2.5e4, but not 2.5
            if not number.is_integer():
                raise ValueError
            return int(number)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind is str:
            return str(value)
    except (ValueError, TypeError):
        pass
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[kind]
    raise ConfigError(f"{where} = {value!r} is not valid; it must be {expected}.")


def read_toml(path: str, seen: tuple[str, ...] = ()) -> dict[str, dict]:
    """Read a config file and everything it includes; later files override earlier ones."""
    path = os.path.abspath(path)
    if path in seen:
        raise ConfigError(f"config include cycle: {' -> '.join(seen + (path,))}; remove one of the includes.")
    if not os.path.isfile(path):
        if seen:
            raise ConfigError(f"config file {path}, included from {seen[-1]}, does not exist; fix the include line "
                              "there (its paths are relative to that file).")
        raise ConfigError(f"config file {path} does not exist; pick one of the files under configs/.")
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML ({e}); fix the line it names.") from None
    except UnicodeDecodeError:  # TOML is UTF-8 by definition; an editor's Latin-1 comment is enough to break it
        raise ConfigError(f"config file {path} is not UTF-8 text; save it as UTF-8.") from None
    merged: dict[str, dict] = {s: {} for s in SECTIONS}
    include = raw.pop("include", None)
    if include is not None:
        includes = [include] if isinstance(include, str) else include
        # checked before any is read: a number (or a table) here would otherwise end in a TypeError traceback
        if not isinstance(includes, list) or not all(isinstance(inc, str) for inc in includes):
            raise ConfigError(f"{path}: include = {include!r} is not valid; include must be a file path or a list "
                              "of file paths (include = \"base.toml\" or include = [\"a.toml\", \"b.toml\"]).")
        for inc in includes:
            base = read_toml(os.path.join(os.path.dirname(path), inc), seen + (path,))
            for s in SECTIONS:
                merged[s].update(base[s])
    for name, table in raw.items():
        if name in SECTIONS and not isinstance(table, dict):  # a section's name with a plain value: not a typo
            raise ConfigError(f"{path}: {name} = {table!r} is not valid; {name} must be a table: write [{name}] on "
                              f"a line of its own and its keys below it.")
        if name not in SECTIONS:
            raise ConfigError(f"{path}: unknown top-level entry {name!r}; "
                              f"{closest_hint(name, SECTIONS + ('include',))} "
                              "(a config file has only include, [model] and [train]).")
        merged[name].update(table)
    return merged


def parse_overrides(args: list[str], model_kinds: dict, train_kinds: dict) -> dict[str, dict]:
    """--key=value / --model.key=value / --train.key=value / --flag (a bool set to true)."""
    out: dict[str, dict] = {s: {} for s in SECTIONS}
    kinds = {"model": model_kinds, "train": train_kinds}
    keys = {"model": set(model_kinds), "train": set(train_kinds)}
    for arg in args:
        if not arg.startswith("--") or len(arg) < 3:
            raise ConfigError(f"unexpected argument {arg!r}; overrides are written --key=value.")
        name, has_value, value = arg[2:].partition("=")
        if not has_value:
            value = "true"  # a bare --flag switches a bool on
        name = name.replace("-", "_")
        section, dot, key = name.partition(".")
        if dot:
            if section not in SECTIONS:
                raise ConfigError(f"override {arg!r}: unknown section {section!r}; use model. or train.")
        else:
            key = name
            owners = [s for s in SECTIONS if key in keys[s]]
            if len(owners) > 1:
                raise ConfigError(f"override {arg!r} is ambiguous; write --model.{key}=... or --train.{key}=....")
            if not owners:
                raise ConfigError(f"unknown config key {key!r} in {arg!r}; "
                                  f"{closest_hint(key, keys['model'] | keys['train'])}")
            section = owners[0]
        if key not in keys[section]:
            other = "train" if section == "model" else "model"
            hint = f"it is a {other} key: --{other}.{key}=..." if key in keys[other] else closest_hint(key, keys[section])
            raise ConfigError(f"unknown {section} key {key!r} in {arg!r}; {hint}")
        if not has_value and kinds[section][key] is not bool:
            raise ConfigError(f"{arg} needs a value: write {arg}=VALUE (only true/false keys may stand alone).")
        out[section][key] = value
    return out


def default_out_dir(config_path: str) -> str:
    """runs/<path below configs/ without .toml>, e.g. configs/medium/fox.toml -> runs/medium/fox."""
    path = os.path.abspath(config_path)
    parts = path.split(os.sep)
    stem = os.path.splitext(path)[0]
    if "configs" in parts:
        i = len(parts) - 1 - parts[::-1].index("configs")
        rel = os.path.splitext(os.path.join(*parts[i + 1:]))[0]
    else:
        rel = os.path.basename(stem)
    return os.path.join("runs", rel)


def read_run_config(run_dir: str) -> dict[str, dict]:
    """A run's own settings, from RUN_DIR/config.json (train.py writes it at every start), as [model] and [train]
    sections: every key explicit; a key the run predates gets the value it was trained with."""
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{run_dir} holds no config.json, so it is not a run directory of train.py; give a config "
                          "file (python train.py CONFIG --out_dir=RUN_DIR --resume) instead.")
    try:
        with open(path) as f:
            saved = json.load(f)
        sections = {s: dict(saved[s]) for s in SECTIONS}
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{path} is not a config.json written by train.py ({error}); give the run's config file "
                          "instead.") from None
    # stop_iter belongs to one invocation (a time-limited job): the run continues to its end unless given again
    sections["train"] = {**AS_TRAINED_BEFORE_KEY_EXISTED, **sections["train"], "out_dir": run_dir, "stop_iter": 0}
    return sections


def run_directories(root: str, max_depth: int = 3, limit: int = 2000) -> list[str]:
    """The run directories (holding a ckpt.pt) at most max_depth levels below root, sorted; at most `limit`
    directories are looked into, so a large tree costs no time."""
    found, todo, seen = [], [(root, 0)], 0
    while todo and seen < limit:
        directory, depth = todo.pop()
        seen += 1
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError:
            continue
        if any(entry.name == "ckpt.pt" and entry.is_file() for entry in entries) and directory != root:
            found.append(os.path.normpath(directory))
            continue
        if depth < max_depth:
            todo += [(entry.path, depth + 1) for entry in reversed(entries)
                     if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".")]
    return sorted(found)


def existing_runs(run_dir: str) -> str:
    """For a run directory that does not exist: the closest run that does and the runs beside it, or that there are
    none, as the end of a sentence."""
    parent = os.path.dirname(os.path.normpath(run_dir)) or "."
    while not os.path.isdir(parent):
        parent = os.path.dirname(parent) or "."
    if os.path.dirname(os.path.abspath(parent)) == os.path.abspath(parent):
        return "check the path"  # nothing of it exists below the file system's root: not worth a search
    runs = run_directories(parent)
    if not runs:
        return (f"there is no run of train.py with a checkpoint under {os.path.join(parent, '')}; start one with "
                "python train.py CONFIG, e.g. configs/quickstart.toml")
    below = {os.path.relpath(run, parent): run for run in runs}  # compared below parent: not by the common prefix
    close = difflib.get_close_matches(os.path.relpath(run_dir, parent), below, n=1, cutoff=0.6)
    shown = ", ".join(runs[:10]) + (f" and {len(runs) - 10} more" if len(runs) > 10 else "")
    return (f"did you mean {below[close[0]]}? " if close else "") + \
        f"the runs that exist under {os.path.join(parent, '')}: {shown}"


def missing_config(path: str, resume: bool) -> ConfigError:
    """The sentence for a CONFIG argument that does not exist: a config file named without .toml gets the file it
    meant; with --resume a path that is not a .toml file is a run directory, answered with the runs that exist."""
    if not path.endswith(".toml") and os.path.isfile(path + ".toml"):
        return ConfigError(f"config file {path} does not exist; did you mean {path}.toml?")
    if resume and not path.endswith(".toml"):
        run_dir = path.removesuffix("config.json").rstrip(os.sep) or "."
        return ConfigError(f"run directory {run_dir} does not exist; {existing_runs(run_dir)}.")
    folder = os.path.dirname(path)
    siblings = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder or ".", "*.toml")))
    # by file name: whole paths share their folder, so any sibling looked close to any name
    close = difflib.get_close_matches(os.path.basename(path), siblings, n=1, cutoff=0.6)
    return ConfigError(f"config file {path} does not exist; " + (
        f"did you mean {os.path.join(folder, close[0])}?" if close else "pick one of the files under configs/."))


def resolve(config_path: str, overrides: list[str], model_config_cls, resume: bool = False,
            overrides_from: str | None = None) -> tuple[object, TrainConfig]:
    """Config file (or a run directory, or its config.json: that run's own settings) + overrides ->
    (model config object, TrainConfig), all keys checked and typed. `resume`: the path is to be resumed, so one
    that does not exist is answered as a missing run directory. `overrides_from`: where the overrides were written,
    for the messages that blame them (None: the command line; a study says its file)."""
    if not os.path.exists(config_path):
        raise missing_config(config_path, resume)
    from_run = os.path.isdir(config_path) or config_path.endswith(".json")
    if from_run:
        config_path = os.path.dirname(config_path) if config_path.endswith(".json") else config_path
        merged = read_run_config(config_path)
    else:
        merged = read_toml(config_path)
    file_model_values = dict(merged["model"])
    model_kinds = field_kinds(model_config_cls)
    train_kinds = field_kinds(TrainConfig)
    cli = parse_overrides(overrides, model_kinds, train_kinds)
    for s in SECTIONS:
        merged[s].update(cli[s])
    recipe = str(merged["train"].get("recipe", TrainConfig.recipe))
    if recipe not in RECIPES:
        raise ConfigError(f"train.recipe = {recipe!r} is not valid; it must be {' or '.join(RECIPES)}.")
    for s in SECTIONS:  # (a run's own settings already hold every key)
        preset = {k: v(merged["model"]) if callable(v) else v for k, v in RECIPES[recipe][s].items()}
        merged[s] = {**preset, **merged[s]}  # keys set in a file or on the command line win

    for section, kinds, other, other_kinds in (("train", train_kinds, "model", model_kinds),
                                               ("model", model_kinds, "train", train_kinds)):
        for key in merged[section]:
            if key in other_kinds and key not in kinds:
                raise ConfigError(f"{key!r} is a {other} key, not a {section} key, in {config_path}; "
                                  f"move it under [{other}].")
            if key not in kinds:
                raise ConfigError(f"unknown {section} key {key!r} in {config_path}; {closest_hint(key, kinds)}")
    train_values = {k: convert("train", k, v, train_kinds[k]) for k, v in merged["train"].items()}
    model_values = {k: convert("model", k, v, model_kinds[k]) for k, v in merged["model"].items()}

    train = TrainConfig(**train_values)
    if not train.out_dir:
        train.out_dir = default_out_dir(config_path)
    train.validate(in_study_file=overrides_from is not None)
    try:
        model = model_config_cls.from_dict(model_values)
    except (ValueError, TypeError) as e:
        where = f"in {config_path}"
        if cli["model"]:  # blame the command line if the file's own values are fine
            try:
                model_config_cls.from_dict({k: convert("model", k, v, model_kinds[k])
                                            for k, v in file_model_values.items()})
                where = f"given {overrides_from}" if overrides_from else \
                    "given on the command line (" + " ".join(f"--{k}={v}" for k, v in cli["model"].items()) + ")"
            except (ValueError, TypeError):
                pass
        raise ConfigError(f"model config {where}: {e}") from None
    return model, train
