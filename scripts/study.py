"""Run a whole positional-encoding study (encodings x seeds, then the same evaluations for each) and write its report.

    python scripts/study.py configs/studies/smoke.toml            # CPU, offline, tiny settings
    python scripts/study.py configs/studies/table1_medium.toml    # the paper's Table 1 rows, torchrun on 8 GPUs

Each run trains with train.py into OUT/<encoding>/seed<seed>, then its evaluations write
OUT/<encoding>/seed<seed>/eval/. OUT/report.md, report.json and the plots are built only from those files.
Run the same command again to continue: finished runs and evaluations are skipped, an interrupted run resumes
from its checkpoint, an evaluation of a checkpoint that has since been replaced is redone, and a failed run
(or one whose records are lost) is reported while the others go on. The console shows each job, its time, and
the study's progress with an ETA. docs/study.md has the details.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import io
import json
import math
import os
import queue
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import tomllib
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import train  # noqa: E402
from training.errors import STUDY_COMMAND  # noqa: E402
from training.metrics import atomic_write_text  # noqa: E402
from config import MAX_SEED, ConfigError, closest_hint, resolve  # noqa: E402
from data.shards import DataError  # noqa: E402
from eval import progress as timing  # noqa: E402
from eval.cli import make_parser  # noqa: E402
from model import GPTConfig  # noqa: E402
from positional import ENCODINGS, parse_pos  # noqa: E402
from scripts import plot_runs  # noqa: E402

LAUNCH_MODES = ("in_process", "torchrun", "per_gpu", "cpu_jobs")
EVALUATIONS = ("extrapolation", "zero_shot", "long_context")  # eval/<name>.py, each with parse_args and main


def evaluation(name: str):
    """eval/<name>.py, imported when a study uses it: lm-eval and its dependencies are not needed by a study that
    runs no lm-eval task (the GPU study on an image with torch alone)."""
    return importlib.import_module(f"eval.{name}")
STUDY_KEYS = {"name", "base", "encodings", "seeds", "reference", "out_dir", "overrides", "variants", "launch", "eval"}
LAUNCH_KEYS = {"mode", "gpus", "gpus_per_run", "jobs"}
DEFAULT_SEEDS = [1337]  # train.py's own default seed
CONFIDENCE = 0.95
MIN_SEEDS_FOR_A_FINDING = 3  # with fewer, an interval that excludes 0 is too easily luck to report as a result
# Every key with its default: the text of --help and of docs/study.md (a test holds them equal, and the
# defaults stated here equal those load_study applies).
STUDY_FILE_EXAMPLE = """\
name = "my_study"                   # default: the study file's name without .toml
base = "../base/medium.toml"        # required: the base config, relative to the study file
encodings = ["rope", "alibi", "fox+kv_shift", "rope+grape_ap"]  # required: model.pos (+kv_shift: model.kv_shift)
seeds = [1337, 1338, 1339]          # default [1337]: train.seed (initialisation, order of the training windows)
reference = "rope"                  # default "rope" if listed, else the first encoding: differences are to it
                                    # (with variants: its first variant, or name one as "rope@mha")
out_dir = "runs/my_study"           # default runs/<name>, relative to the directory the study runs in

[overrides]                         # default none: any [model] or [train] key, as train.py's --key=value
max_iters = 5000                    # tokens per run = max_iters x global_batch_size x block_size
block_size = 2048

[variants]                          # default none: each encoding runs once per variant, as encoding@variant
mha = {}                            # a variant's [model] or [train] values, applied after [overrides]
gqa = {n_kv_head = 2}

[launch]
mode = "torchrun"                   # default "in_process"; "torchrun", "per_gpu" or "cpu_jobs" run jobs as subprocesses
gpus_per_run = 8                    # default 1: torchrun's processes (GPUs) per run; per_gpu uses 1
gpus = 8                            # default gpus_per_run: a count, or ids such as [0, 1, 2, 3]
jobs = 2                            # cpu_jobs: runs side by side on the CPU (default: the cores), cores/jobs threads each

[eval.extrapolation]                # default none: options of eval/extrapolation.py (its --help), _ for -
factors = [1, 2, 4, 8]
windows = 16
passkey_trials = 10

[eval.zero_shot]                    # default none: options of eval/zero_shot.py (its --help), _ for -
data_dir = "data_cache/zero_shot"   # python eval/zero_shot.py --export-data data_cache/zero_shot (online, once)
paper_size = "medium_353M"

[eval.long_context]                 # default none: options of eval/long_context.py (its --help), _ for -
lengths = ["1x", "2x", "4x", "8x"]  # RULER's 13 tasks and BABILong qa1-qa5 at 1x to 8x the training context
data_dir = "data_cache/long_context"  # python eval/long_context.py --export-data data_cache/long_context (online, once)
limit = 100
"""


class StudyError(Exception):
    """Mistakes in the study file (or another reason not to start), one line each; the message says what to do."""

    def __init__(self, errors: str | list[str]):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__(self.errors[0] if len(self.errors) == 1 else
                         f"{len(self.errors)} mistakes in the study file; nothing was trained:\n"
                         + "\n".join(f"  {error}" for error in self.errors))


class StudyInterrupted(Exception):
    """Ctrl-C (or SIGTERM) reached a run: it saved its checkpoint and the study stops."""


@dataclasses.dataclass
class Run:
    encoding: str
    seed: int
    run_dir: str
    train_args: list[str]          # train.py arguments without --resume
    final_iter: int  # the iteration train.py ends at: max_iters, or max_iters + 1 under the official schedule
    evals: dict[str, list[str]]    # evaluation name -> its CLI arguments
    model: dict                    # the resolved model config (dataclasses.asdict of GPTConfig)
    tokens: int                    # the tokens training reads: steps x global batch x context


@dataclasses.dataclass
class Study:
    name: str
    path: str
    base: str
    out_dir: str
    encodings: list[str]
    seeds: list[int]
    reference: str
    overrides: list[str]
    mode: str
    gpus: list[str]
    gpus_per_run: int
    runs: list[Run]
    seeds_defaulted: bool = False  # the file names no seeds: said on the console, since one seed has no spread
    jobs: int = 1                  # cpu_jobs: runs side by side


# ----------------------------------------------------------------------------- the study file

def split_encoding(name: str) -> tuple[str, bool]:
    """'fox+kv_shift' -> ('fox', True): the paper_results.json row name back to model.pos and model.kv_shift."""
    return (name[: -len("+kv_shift")], True) if name.endswith("+kv_shift") else (name, False)


def as_cli(key: str, value, dash: str = "_", bool_flags: bool = False) -> list[str]:
    """A TOML key/value as command-line arguments: lists comma-joined; with bool_flags (argparse's store_true
    options) true is a bare flag and false nothing, else --key=true/false."""
    flag = "--" + key.replace("_", dash)
    if isinstance(value, bool):
        if bool_flags:
            return [flag] if value else []
        value = str(value).lower()
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    return [f"{flag}={value}"]


def eval_arg_error(name: str, argv: list[str]) -> str | None:
    """Why an evaluation's arguments do not parse (argparse's own reason), or None: checked now, so that a typo fails
    before hours of training."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            evaluation(name).parse_args(argv)
    except SystemExit:
        return captured.getvalue().strip().splitlines()[-1].split("error: ", 1)[-1]
    return None


def encoding_hint(name: str) -> str:
    """'; did you mean 'fox'?' for 'fxo': each unknown part of an encoding name replaced by its closest valid one."""
    valid = ENCODINGS + ("kv_shift",)
    parts = name.split("+")
    fixed = [p if p in valid else next(iter(difflib.get_close_matches(p, valid, n=1, cutoff=0.6)), None) for p in parts]
    return f"; did you mean {'+'.join(fixed)!r}?" if None not in fixed and fixed != parts else ""


def config_mistakes(base: str, values: list[tuple[str, str]], tail: list[str], encoding: str):
    """((model config, train config), []) of one run: the base config, the study file's values ((key, --key=value)
    in the order they apply) and the study's own arguments (`tail`: encoding, seed, run directory); or (None, its
    mistakes as (key, message)). The values to blame are those that cannot be added to the others that resolve:
    added one at a time, again while one more fits, since a value may need another set after it (max_iters below the
    base's warmup_iters, then a smaller warmup_iters)."""
    def attempt(chosen, args=tail):
        return resolve(base, [values[i][1] for i in sorted(chosen)] + args, GPTConfig,
                       overrides_from="in the study file")
    try:
        return attempt(range(len(values))), []
    except ConfigError as e:
        whole = str(e)
    chosen, grew = set(), True
    while grew:
        grew = False
        for i in sorted(set(range(len(values))) - chosen):
            with contextlib.suppress(ConfigError):
                attempt(chosen | {i})
                chosen.add(i)
                grew = True
    try:
        attempt(chosen)
    except ConfigError as e:  # none of the file's values is to blame: the base config, or this encoding with it
        try:
            attempt([], tail[2:])  # tail[:2] is the encoding (--pos, --kv_shift)
        except ConfigError:
            return None, [("base", str(e))]
        return None, [(f'encodings "{encoding}"', str(e))]
    mistakes = []
    for i in sorted(set(range(len(values))) - chosen):
        try:
            attempt(chosen | {i})
        except ConfigError as e:
            mistakes.append((values[i][0], str(e)))
    return None, mistakes or [("[overrides]", whole)]


def load_study(path: str) -> Study:
    """Read and check a study file, resolving every run's train config and parsing every evaluation's options, so
    that every mistake in it is found before any run: all of them at once, in one StudyError whose lines each name
    the file and the key."""
    if not os.path.isfile(path):
        raise StudyError(f"study file {path} does not exist; pick one of configs/studies/*.toml.")
    try:
        raw = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as e:
        raise StudyError(f"study file {path} is not valid TOML ({e}); fix the line it names.") from None
    errors = []

    def wrong(key: str, message: str) -> None:
        errors.append(f"{path} {key}: {message}")

    for key in sorted(set(raw) - STUDY_KEYS):
        wrong(key, f"unknown entry; {closest_hint(key, STUDY_KEYS)} (a study file has "
                   f"{', '.join(sorted(STUDY_KEYS))}).")
    name = raw.get("name", Path(path).stem)
    if not isinstance(name, str) or not name:
        wrong("name", f"must be a name such as \"my_study\", not {name!r}.")
        name = Path(path).stem
    base = raw.get("base")
    if base is None:
        wrong("base", "the study file names no base config: add base = \"../medium/rope.toml\" (relative to the "
                      "study file).")
    elif not isinstance(base, str):
        wrong("base", f"must be the path of a config file, relative to the study file, not {base!r}.")
        base = None
    else:
        base = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), base))
        if not os.path.isfile(base):
            wrong("base", f"config file {base} does not exist (the path is relative to the study file).")
            base = None

    encodings = raw.get("encodings")
    if not isinstance(encodings, list) or not encodings or not all(isinstance(e, str) for e in encodings):
        wrong("encodings", "must be a list of distinct names such as [\"rope\", \"fox+kv_shift\"].")
        encodings = []
    elif len(set(encodings)) != len(encodings):
        repeated = sorted({e for e in encodings if encodings.count(e) > 1})
        wrong("encodings", f"{', '.join(repeated)} listed more than once; encodings must be distinct names.")
        encodings = list(dict.fromkeys(encodings))
    usable = []  # the encodings whose runs can be resolved
    for encoding in encodings:
        try:
            parse_pos(split_encoding(encoding)[0])
            usable.append(encoding)
        except ValueError as e:
            wrong(f'encodings "{encoding}"', f"{e}{encoding_hint(encoding) or '.'}")

    seeds = raw.get("seeds", DEFAULT_SEEDS)
    integers = isinstance(seeds, list) and all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_SEED
                                               for s in seeds or [None])
    if not integers or len(set(seeds)) != len(seeds):
        wrong("seeds", f"must be a list of distinct integers from 0 to 2**64 - 1, e.g. [1, 2, 3], not {seeds!r}.")
        seeds = DEFAULT_SEEDS  # for checking the rest

    variants = raw.get("variants") or {}
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        wrong("[variants]", "must give each variant a table of [model] or [train] values, e.g. gqa = {n_kv_head = 2}.")
        variants = {}
    for variant in [v for v in variants if not v or not all(c.isalnum() or c in "_-." for c in v)]:
        wrong(f"[variants] {variant!r}", "a variant's name names run directories: use letters, digits, _, - and . "
                                         "only.")
        del variants[variant]
    labels = [(f"{e}@{v}" if variants else e, e, v) for e in encodings for v in (variants or [""])]
    reference = raw.get("reference", "rope" if "rope" in encodings else encodings[0] if encodings else None)
    if variants and reference in encodings:
        reference = f"{reference}@{next(iter(variants))}"
    if labels and reference not in [label for label, _, _ in labels]:
        wrong("reference", f"{reference!r} is not one of the encodings {[label for label, _, _ in labels]}.")
    overrides_table = raw.get("overrides") or {}
    if not isinstance(overrides_table, dict):
        wrong("[overrides]", "must be a table of [model] or [train] keys, e.g. max_iters = 5000.")
        overrides_table = {}
    override_values = [(f"[overrides] {key}", arg) for key, value in overrides_table.items()
                       for arg in as_cli(key, value)]
    out_dir = raw.get("out_dir", os.path.join("runs", name))
    if not isinstance(out_dir, str) or not out_dir:
        wrong("out_dir", f"must be a directory such as \"runs/my_study\", not {out_dir!r}.")
        out_dir = os.path.join("runs", name)

    launch = raw.get("launch") or {}
    if not isinstance(launch, dict):
        wrong("[launch]", "must be a table such as mode = \"torchrun\".")
        launch = {}
    for key in sorted(set(launch) - LAUNCH_KEYS):
        wrong(f"[launch] {key}", f"unknown key; {closest_hint(key, LAUNCH_KEYS)} ([launch] has mode, gpus, "
                                 "gpus_per_run, jobs).")
    mode = launch.get("mode", "in_process")
    if mode not in LAUNCH_MODES:
        wrong("[launch] mode", f"{mode!r} is not one of {', '.join(LAUNCH_MODES)}.")
        mode = "in_process"
    gpus_per_run = 1 if mode == "per_gpu" else launch.get("gpus_per_run", 1)
    jobs = launch.get("jobs", os.cpu_count() or 1)
    gpus = []
    if mode == "cpu_jobs":
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            wrong("[launch] jobs", f"must be a whole number of runs side by side, e.g. jobs = 2, not {jobs!r}.")
        gpus_per_run = 0  # no GPU: each job is told to use none
    elif mode != "in_process":
        gpus = launch.get("gpus", gpus_per_run)
        if isinstance(gpus_per_run, bool) or not isinstance(gpus_per_run, int) or gpus_per_run < 1:
            wrong("[launch] gpus_per_run", f"must be a whole number of GPUs per run, at least 1, not {gpus_per_run!r}.")
        elif isinstance(gpus, bool) or not isinstance(gpus, (int, list)):
            wrong("[launch] gpus", f"must be a count such as 8 or a list of ids such as [0, 1, 2, 3], not {gpus!r}.")
        else:
            gpus = [str(g) for g in (range(gpus) if isinstance(gpus, int) else gpus)]
            if len(gpus) < gpus_per_run:
                wrong("[launch] gpus", f"{len(gpus)} GPU(s), fewer than gpus_per_run = {gpus_per_run}: [launch] needs "
                                       "at least that many (gpus = 8 or a list of ids such as [0, 1, 2, 3]).")

    eval_tables = raw.get("eval") or {}
    if not isinstance(eval_tables, dict):
        wrong("[eval]", f"must hold tables such as [eval.extrapolation]; the evaluations are {', '.join(EVALUATIONS)}.")
        eval_tables = {}
    eval_options = {}  # evaluation name -> its options' arguments, once they parse
    for eval_name, options in eval_tables.items():
        table = f"[eval.{eval_name}]"
        if eval_name not in EVALUATIONS:
            wrong(table, f"unknown evaluation; choose from {', '.join(EVALUATIONS)} (the final validation loss comes "
                         "from training itself).")
            continue
        if not isinstance(options, dict):
            wrong(table, f"must be a table of options of eval/{eval_name}.py (its --help), _ for -.")
            continue
        by_key = {key: as_cli(key, value, dash="-", bool_flags=True) for key, value in options.items()}
        placeholder = ["--ckpt", "RUN_DIR", "--out", "RUN_DIR/eval"]  # (the parsers do not look at the paths)
        reason = eval_arg_error(eval_name, placeholder + [arg for args in by_key.values() for arg in args])
        if reason is None:
            eval_options[eval_name] = [arg for args in by_key.values() for arg in args]
            continue
        # Each option alone, so that every bad one is named; if none is bad alone, they clash: the table is named.
        blamed = [(f"{table} {key}", why) for key, args in by_key.items()
                  if (why := eval_arg_error(eval_name, placeholder + args)) is not None]
        for key, why in blamed or [(table, reason)]:
            wrong(key, f"{why}; the keys are the options of eval/{eval_name}.py with _ for -, e.g. passkey_trials = 4.")

    runs = []
    mistakes: dict[tuple[str, str], list[str]] = {}  # (key, message) -> the runs (encoding@variant) it holds for
    checked = [label for label, encoding, _ in labels if encoding in usable]
    # Seed by seed, every encoding for each: a study stopped part-way has comparable encodings, not some done
    # with every seed and others with none.
    for seed in seeds if base else []:  # (without a base config no run can be resolved)
        for encoding, plain_encoding, variant in labels:
            if encoding not in checked or any(encoding in held for held in mistakes.values()):
                continue  # a mistake of another seed's run of it is this one's too: said once
            pos, kv_shift = split_encoding(plain_encoding)
            variant_values = variants.get(variant, {}).items()
            values = override_values + [(f"[variants] {variant}.{key}", arg) for key, value in variant_values
                                        for arg in as_cli(key, value)]
            run_dir = os.path.join(out_dir, encoding, f"seed{seed}")
            tail = [f"--pos={pos}", f"--kv_shift={str(kv_shift).lower()}", f"--seed={seed}", f"--out_dir={run_dir}"]
            configs, found = config_mistakes(base, values, tail, plain_encoding)
            if configs and configs[1].eval_interval == 0:
                setting = [key for key, arg in values
                           if arg.split("=")[0] in ("--eval_interval", "--train.eval_interval")]
                found = [((setting or ["base"])[-1], "eval_interval is 0, so no run would report its final validation "
                                                     "loss; set eval_interval in [overrides].")]
            for mistake in found:
                mistakes.setdefault(mistake, []).append(encoding)
            if found:
                continue
            model_cfg, train_cfg = configs
            evals = {eval_name: ["--ckpt", run_dir, "--out", os.path.join(run_dir, "eval"), *options]
                     for eval_name, options in eval_options.items()}
            tokens = train_cfg.num_steps * train_cfg.global_batch_size * model_cfg.block_size
            runs.append(Run(encoding, seed, run_dir, [base, *[arg for _, arg in values], *tail], train_cfg.num_steps,
                            evals, dataclasses.asdict(model_cfg), tokens))
    for (key, message), held in mistakes.items():
        # An override that is wrong for some encodings only (a value one encoding cannot take) says for which.
        which = f" (for {', '.join(held)})" if key.startswith("[overrides]") and len(held) < len(checked) else ""
        wrong(key + which, message)
    if errors:
        raise StudyError(errors)
    return Study(name, os.path.abspath(path), base, out_dir, [label for label, _, _ in labels], list(seeds),
                 reference, [arg for _, arg in override_values],
                 mode, gpus, gpus_per_run, runs, "seeds" not in raw, jobs if mode == "cpu_jobs" else 1)


# ----------------------------------------------------------------------------- what is already done

def read_metrics(run_dir: str) -> tuple[list[dict], list[int]]:
    """(the records of RUN_DIR/metrics.jsonl, the numbers of its lines that are not a record: binary garbage, or a
    line cut short inside the file). A last line cut short without its newline is a kill's unfinished write, which
    train.py's resume removes: it is skipped, not counted as damage."""
    path = os.path.join(run_dir, "metrics.jsonl")
    try:
        with open(path, "rb") as f:
            pieces = f.read().split(b"\n")
    except OSError:  # none yet (or unreadable: then nothing is on record either)
        return [], []
    lines = [piece + b"\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    records, damaged = [], []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif number < len(lines) or line.endswith(b"\n"):
            damaged.append(number)
    return records, damaged


def read_records(run_dir: str) -> list[dict]:
    return read_metrics(run_dir)[0]


def damaged_records(run: Run) -> str | None:
    """Why the run's metrics.jsonl has lost records (lines that are not records), or None. Neither resuming nor
    reporting can bring them back, so the run is a failure until the file is restored or the lines deleted."""
    damaged = read_metrics(run.run_dir)[1]
    if not damaged:
        return None
    metrics, one = os.path.join(run.run_dir, "metrics.jsonl"), len(damaged) == 1
    listed = ", ".join(map(str, damaged[:5])) + (f" and {len(damaged) - 5} more" if len(damaged) > 5 else "")
    return (f"{metrics} {'line' if one else 'lines'} {listed} {'is not a record' if one else 'are not records'} "
            f"(binary garbage or a line cut short), so {'its record is' if one else 'their records are'} lost; "
            f"restore {metrics} from a backup, or delete {'that line' if one else 'those lines'} to go on without "
            f"{'it' if one else 'them'}, then run the study again")


def run_trained(run: Run) -> bool:
    """train.py wrote its end-of-run summary at the final iteration (a resumed run drops older summaries) and the
    checkpoint: nothing is left to train."""
    summaries = [r for r in read_records(run.run_dir) if r.get("type") == "summary"]
    return (os.path.isfile(os.path.join(run.run_dir, "ckpt.pt")) and bool(summaries)
            and summaries[-1].get("stopped") == "done" and summaries[-1].get("iter") == run.final_iter)


def final_val_loss(run: Run) -> float | None:
    """The validation loss train.py logged at the final iteration, None if metrics.jsonl lacks it."""
    vals = [r for r in read_records(run.run_dir) if r.get("type") == "val" and r.get("iter") == run.final_iter]
    return vals[-1]["val_loss"] if vals else None


def run_finished(run: Run) -> bool:
    """Trained, with its final validation loss on record and no record lost: only such runs enter the report's
    tables, all of them."""
    return run_trained(run) and final_val_loss(run) is not None and damaged_records(run) is None


def lost_records(run: Run) -> str | None:
    """Why a trained run cannot be reported (its metrics.jsonl deleted or cut), or None. Resuming cannot repair it:
    train.py finds its checkpoint at the final iteration and has nothing to do."""
    if not run_trained(run) or final_val_loss(run) is not None:
        return None
    metrics = os.path.join(run.run_dir, "metrics.jsonl")
    return (f"{run.run_dir}/ckpt.pt is at the final iteration {run.final_iter} but {metrics} has no validation loss "
            f"at that iteration (the file was deleted or cut short), so the run's final loss is unknown and resuming "
            f"cannot log it again; restore {metrics}, or move {run.run_dir} aside and run the study again to train "
            "the run anew")


def checkpoint_identity(run: Run) -> dict | None:
    """What tells the checkpoint an evaluation read from a retrained one, without reading it: its size and
    modification time (rewriting ckpt.pt changes them; a copy that keeps times, cp -p or shutil.copy2, does not)."""
    try:
        stat = os.stat(os.path.join(run.run_dir, "ckpt.pt"))
    except OSError:
        return None
    return {"step": run.final_iter, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def eval_marker(run: Run, name: str) -> str:
    return os.path.join(run.run_dir, "eval", f"{name}.study.json")


def diverged_marker(run: Run) -> str:
    """Written when the run's training diverged: later invocations report it instead of diverging again."""
    return os.path.join(run.run_dir, "study_diverged.json")


def eval_finished(run: Run, name: str) -> bool:
    """Its output exists and the marker written after it says: same arguments, same checkpoint file."""
    output = os.path.join(run.run_dir, "eval", f"{name}.json")
    try:
        marker = json.loads(Path(eval_marker(run, name)).read_text())
        json.loads(Path(output).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    identity = checkpoint_identity(run)
    if identity is None:
        return False
    if marker == {"argv": run.evals[name], "step": run.final_iter}:
        # Written by an older study.py, which recorded no checkpoint: it holds if the checkpoint is older than the
        # marker, so upgrading does not redo finished evaluations (hours on the GPU) while a retrained one is redone.
        return identity["mtime_ns"] < os.stat(eval_marker(run, name)).st_mtime_ns
    return marker == {"argv": run.evals[name], "checkpoint": identity}


def run_done(run: Run) -> bool:
    return run_finished(run) and all(eval_finished(run, name) for name in run.evals)


def add_wall_clock(run: Run, key: str, seconds: float) -> None:
    """Accumulate over invocations (an interrupted run's earlier time counts) in RUN_DIR/study_time.json."""
    path = os.path.join(run.run_dir, "study_time.json")
    times = json.loads(Path(path).read_text()) if os.path.isfile(path) else {}
    times[key] = times.get(key, 0.0) + seconds
    os.makedirs(run.run_dir, exist_ok=True)
    atomic_write_text(path, json.dumps(times) + "\n")


# ----------------------------------------------------------------------------- launching

def train_argv(run: Run) -> list[str]:
    resume = os.path.isfile(os.path.join(run.run_dir, "ckpt.pt"))
    return run.train_args + (["--resume"] if resume else [])


def gpu_slots(study: Study) -> list[list[str]]:
    """Disjoint groups of gpus_per_run GPUs; each runs one job at a time, the groups side by side. Under cpu_jobs,
    `jobs` slots of no GPU."""
    if study.mode == "cpu_jobs":
        return [[] for _ in range(study.jobs)]
    k = study.gpus_per_run
    return [study.gpus[i:i + k] for i in range(0, len(study.gpus) - k + 1, k)]


def job_command(study: Study, job: str, argv: list[str], slot: list[str]) -> tuple[list[str], dict[str, str]]:
    """(command line, extra environment) of a train or evaluation job in a subprocess on the GPUs `slot`."""
    env = {"CUDA_VISIBLE_DEVICES": ",".join(slot)}
    if study.mode == "cpu_jobs":
        # Each job its share of the cores: a job with more threads than its cores stalls at every parallel region
        # while one of them waits for a core (seen here: 13,000 tokens/s alone, 700-2,400 beside other work).
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // study.jobs))
    if job != "train":
        return [sys.executable, str(REPO / "eval" / f"{job}.py"), *argv], env
    if study.mode == "torchrun":
        # --standalone picks a free rendezvous port, so several torchrun jobs can run side by side.
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={len(slot)}",
                str(REPO / "train.py"), *argv], env
    return [sys.executable, str(REPO / "train.py"), *argv], env


def last_error_line(text: str) -> str | None:
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    return lines[-1][len("error:"):].strip() if lines else None


class Tee(io.TextIOBase):
    """Writes to several streams: an evaluation's stderr is both kept (for its error line) and shown."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def in_process_job(job: str, argv: list[str], run_dir: str) -> str | None:
    """Run train.run or an evaluation's main here; returns None on success, else one sentence."""
    captured = io.StringIO()
    try:
        if job == "train":
            result = train.run(argv)
            if result["stopped"] in ("sigterm", "interrupted"):
                raise StudyInterrupted
            return None
        with contextlib.redirect_stderr(Tee(captured, sys.stderr)):  # its progress lines still reach the console
            evaluation(job).main(argv)
        return None
    except (ConfigError, train.TrainError, DataError) as e:
        return str(e)
    except SystemExit as e:  # the evaluation CLIs exit 2 on a usage or data error, after printing it
        if e.code in (0, None):
            return None
        return last_error_line(captured.getvalue()) or f"eval/{job}.py exited with code {e.code}"
    except (KeyboardInterrupt, StudyInterrupted):
        raise
    except Exception as e:  # an unforeseen failure of one run must not stop the others: keep its traceback
        log = os.path.join(run_dir, f"study_{job}_error.log")
        os.makedirs(run_dir, exist_ok=True)
        Path(log).write_text(traceback.format_exc())
        return f"{type(e).__name__}: {e} (traceback in {log})"


def raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


class Runner:
    """Takes every run through training and its evaluations, skipping what is finished."""

    def __init__(self, study: Study):
        self.study = study
        self.stop = threading.Event()
        self.status: dict[tuple[str, int], dict] = {}
        self.children: set[subprocess.Popen] = set()

    def job(self, run: Run, job: str, argv: list[str], slot) -> str | None:
        if self.study.mode == "in_process":
            return in_process_job(job, argv, run.run_dir)
        return self.subprocess_job(job, argv, run.run_dir, slot)

    def subprocess_job(self, job: str, argv: list[str], run_dir: str, slot: list[str]) -> str | None:
        command, env = job_command(self.study, job, argv, slot)
        log = os.path.join(run_dir, f"study_{job}.log")
        os.makedirs(run_dir, exist_ok=True)
        with open(log, "a") as out:
            out.write(f"$ CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} {' '.join(command)}\n")
            out.flush()
            child = subprocess.Popen(command, env=os.environ | env, stdout=out, stderr=subprocess.STDOUT)
            self.children.add(child)
            try:
                code = child.wait()
            finally:
                self.children.discard(child)
        if code == 0:
            return None
        if code in (130, -2, -15) or self.stop.is_set():  # Ctrl-C or SIGTERM reached the child too
            raise StudyInterrupted
        return last_error_line(Path(log).read_text()) or f"exit code {code}; see {log}"

    def timed_job(self, run: Run, job: str, argv: list[str], slot, label: str) -> str | None:
        """A job with its time: on the console when it ends, and added to RUN_DIR/study_time.json."""
        start = timing.clock()
        try:
            error = self.job(run, job, argv, slot)
        finally:
            seconds = timing.clock() - start
            add_wall_clock(run, f"{job}_s", seconds)
        if error is None:
            print(f"[study] {job} {label} took {timing.duration(seconds)}", flush=True)
        return error

    def process(self, run: Run, slot=None) -> None:
        label = f"{run.encoding} seed {run.seed}"
        status = {"status": "done", "errors": []}
        self.status[(run.encoding, run.seed)] = status
        try:
            if self.stop.is_set():
                raise StudyInterrupted
            diverged = read_json(diverged_marker(run))
            if diverged and not run_trained(run):  # it would diverge again from the same checkpoint
                status.update(status="diverged", errors=[f"training: {diverged['error']}"])
                print(f"[study] DIVERGED {label} (earlier): {diverged['error']} (delete {diverged_marker(run)} to "
                      "train it again)", flush=True)
                return
            damaged = damaged_records(run)  # before training: a resume would drop those lines
            if damaged:
                status.update(status="failed", errors=[f"records: {damaged}"])
                print(f"[study] FAILED {label}: records: {damaged}", flush=True)
                return
            if not run_trained(run):
                argv = train_argv(run)
                print(f"[study] {'resume' if '--resume' in argv else 'train'} {label} -> {run.run_dir}", flush=True)
                error = self.timed_job(run, "train", argv, slot, label)
                if error is None and not run_trained(run):
                    summary = next((r for r in reversed(read_records(run.run_dir)) if r.get("type") == "summary"), {})
                    if self.stop.is_set() or summary.get("stopped") in ("sigterm", "interrupted"):
                        raise StudyInterrupted
                    error = (f"training stopped at iteration {summary.get('iter')} of {run.final_iter} "
                             f"({summary.get('stopped')})")
                if error is not None and error.startswith("training diverged"):
                    atomic_write_text(diverged_marker(run), json.dumps({"error": error}) + "\n")
                    status.update(status="diverged", errors=[f"training: {error}"])
                    print(f"[study] DIVERGED {label}: {error}", flush=True)
                    return
                if error is not None:
                    status.update(status="failed", errors=[f"training: {error}"])
                    print(f"[study] FAILED {label}: training: {error}", flush=True)
                    return
            lost = lost_records(run)
            if lost:
                status.update(status="failed", errors=[f"records: {lost}"])
                print(f"[study] FAILED {label}: records: {lost}", flush=True)
                return
            for name, argv in run.evals.items():
                if eval_finished(run, name):
                    continue
                if self.stop.is_set():
                    raise StudyInterrupted
                print(f"[study] {name} {label}", flush=True)
                checkpoint = checkpoint_identity(run)  # before the job: the file it is about to read
                error = self.timed_job(run, name, argv, slot, label)
                if error is not None:
                    status.update(status="failed")
                    status["errors"].append(f"{name}: {error}")
                    print(f"[study] FAILED {label}: {name}: {error}", flush=True)
                    continue
                atomic_write_text(eval_marker(run, name), json.dumps({"argv": argv, "checkpoint": checkpoint}) + "\n")
        except (StudyInterrupted, KeyboardInterrupt):
            status.update(status="interrupted")
            self.stop.set()

    def run_all(self) -> None:
        """SIGTERM is handled like Ctrl-C (train.py replaces the handler while it trains in-process)."""
        in_main_thread = threading.current_thread() is threading.main_thread()  # only there may handlers be set
        previous = signal.signal(signal.SIGTERM, raise_keyboard_interrupt) if in_main_thread else None
        try:
            self.run_each()
        finally:
            if in_main_thread:
                signal.signal(signal.SIGTERM, previous)

    def run_each(self) -> None:
        runs = self.study.runs
        # The ETA counts only runs with work left: finished ones are skipped in no time.
        pending = {id(run) for run in runs if not run_done(run)}
        progress = timing.Progress("[study] progress", len(pending), "runs", every_s=0, stream="stdout")

        def process_and_count(run, slot=None):
            self.process(run, slot)
            if id(run) in pending and not self.stop.is_set():
                progress.advance(1)

        if self.study.mode == "in_process":
            for run in runs:  # in the main thread, so train.py's Ctrl-C handler (checkpoint, then stop) works
                process_and_count(run)
                if self.stop.is_set():
                    raise StudyInterrupted
            return
        slots: queue.Queue = queue.Queue()
        for slot in gpu_slots(self.study):
            slots.put(slot)

        def on_free_slot(run):
            slot = slots.get()
            try:
                process_and_count(run, slot)
            finally:
                slots.put(slot)

        pool = ThreadPoolExecutor(max_workers=slots.qsize())
        try:
            futures = [pool.submit(on_free_slot, run) for run in runs]
            for future in futures:
                future.result()
        except KeyboardInterrupt:
            self.stop.set()
            for child in list(self.children):  # a Ctrl-C reached them already, a SIGTERM to the study did not
                child.send_signal(signal.SIGTERM)  # train.py then saves a checkpoint and exits
            print("[study] stopping: waiting for the running jobs to save their checkpoints...", flush=True)
        pool.shutdown(wait=True, cancel_futures=True)
        if self.stop.is_set():
            raise StudyInterrupted


# ----------------------------------------------------------------------------- statistics

def describe(values: list[float]) -> dict:
    """Mean and sample standard deviation (n - 1; None for one value) of per-seed values."""
    n = len(values)
    return {"values": values, "n": n, "mean": statistics.fmean(values) if n else None,
            "std": statistics.stdev(values) if n > 1 else None}


def mean_interval(values: list[float]) -> dict:
    """describe(values) with the two-sided 95% Student-t interval of their mean, whether it excludes 0 ("exceeds
    the seed spread"), and whether that is a finding: it excludes 0 over at least MIN_SEEDS_FOR_A_FINDING seeds."""
    result = describe(values)
    if result["n"] < 2:
        return result | {"interval": None, "exceeds_seed_spread": None, "finding": False}
    from scipy.stats import t as student_t  # (here: a one-seed study, the GPU study, runs without scipy)

    half_width = student_t.ppf(0.5 + CONFIDENCE / 2, result["n"] - 1) * result["std"] / math.sqrt(result["n"])
    interval = [result["mean"] - half_width, result["mean"] + half_width]
    excludes = not interval[0] <= 0 <= interval[1]
    return result | {"interval": interval, "exceeds_seed_spread": excludes,
                     "finding": excludes and result["n"] >= MIN_SEEDS_FOR_A_FINDING}


def paired_difference(values: dict[int, float], reference: dict[int, float]) -> dict:
    """mean_interval of the per-seed differences to the reference encoding (same seed = same data order and
    init), over the seeds both have."""
    seeds = sorted(set(values) & set(reference))
    return mean_interval([values[s] - reference[s] for s in seeds]) | {"seeds": seeds}


def finding_word(diff: dict | None) -> str:
    """The table's word for a difference: lower / higher where it is a finding, else not resolved."""
    if not diff or not diff["n"]:
        return "–"
    return ("lower" if diff["mean"] < 0 else "higher") if diff["finding"] else "not resolved"


def verdict(encoding: str, reference: str, diff: dict | None) -> str:
    if encoding == reference:
        return f"{encoding} is the reference."
    if diff is None or diff["n"] == 0:
        return f"{encoding}: no seed finished for both {encoding} and {reference}, so there is no comparison."
    spread = f" ± {diff['std']:.4f} (mean ± sample std)" if diff["std"] is not None else ""
    head = f"{encoding} − {reference} = {diff['mean']:+.4f}{spread} over {diff['n']} paired seed(s)"
    if diff["n"] < MIN_SEEDS_FOR_A_FINDING:
        return (f"{head}: not resolved at this budget (a difference counts only when its {CONFIDENCE:.0%} paired "
                f"t-interval over at least {MIN_SEEDS_FOR_A_FINDING} seeds excludes 0).")
    lo, hi = diff["interval"]
    if diff["finding"]:
        return (f"{head}; the {CONFIDENCE:.0%} t-interval [{lo:+.4f}, {hi:+.4f}] excludes 0: {encoding} is "
                f"{finding_word(diff)} than {reference} at this budget.")
    return f"{head}; the {CONFIDENCE:.0%} t-interval [{lo:+.4f}, {hi:+.4f}] contains 0: not resolved at this budget."


# ----------------------------------------------------------------------------- the report, from the runs' files

def read_json(path: str):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def run_row(run: Run, status: dict) -> dict:
    records = read_records(run.run_dir)
    curves = plot_runs.read_curves(run.run_dir) if records else {"train": [], "val": []}
    trains = [r for r in records if r.get("type") == "train"]
    summary = next((r for r in reversed(records) if r.get("type") == "summary"), {})
    finished = run_finished(run)
    times = read_json(os.path.join(run.run_dir, "study_time.json")) or {}
    resolved = read_json(os.path.join(run.run_dir, "config.json")) or {}
    on_gpu = str(summary.get("memory_kind", "")).startswith("cuda")
    gpus = resolved.get("world_size", 1) if on_gpu else 0
    wall = sum(times.values())
    return {
        "encoding": run.encoding, "seed": run.seed, "run_dir": run.run_dir,
        "status": status.get("status", "done" if finished else "not run"), "errors": status.get("errors", []),
        "finished": finished, "iter": trains[-1]["iter"] if trains else 0,
        "tokens": trains[-1]["tokens"] if trains else 0,
        "final_val_loss": final_val_loss(run) if finished else None,
        "val_curve": curves["val"], "wall_clock_s": times, "gpus": gpus,
        "gpu_hours": wall / 3600 * gpus, "peak_memory_gb": summary.get("peak_memory_gb"),
    }


def extrapolation_summary(results: list[dict]) -> dict:
    """Per context (as a multiple of L): non-overlapping loss, loss beyond L, sliding loss; passkey by length."""
    out: dict = {"contexts": {}}
    first = results[0]
    for context in first["contexts"]:
        factor = str(int(context) // first["train_context"])
        cells = [r["contexts"][context] for r in results]
        beyond = [c["nonoverlapping"]["mean_beyond_train_context"] for c in cells]
        out["contexts"][factor] = {
            "context": int(context),
            "nonoverlapping": describe([c["nonoverlapping"]["mean"] for c in cells]),
            "beyond_train_context": describe(beyond) if None not in beyond else None,
            "sliding": describe([c["sliding"]["mean"] for c in cells]),
        }
    if all("passkey" in r for r in results):
        per_seed = [[statistics.fmean(row) for row in r["passkey"]["accuracy"]] for r in results]
        out["passkey"] = {"lengths": first["passkey"]["actual_lengths"], "depths": first["passkey"]["depths"],
                          "trials_per_cell": first["passkey"]["trials"],
                          "accuracy_by_length": [describe([seed[i] for seed in per_seed])
                                                 for i in range(len(first["passkey"]["lengths"]))]}
    return out


def zero_shot_summary(reports: list[dict]) -> dict:
    tasks = {}
    for task, row in reports[0]["tasks"].items():
        tasks[task] = {"average_metric": row["average_metric"]}
        for metric in ("acc", "acc_norm", "score"):
            if metric in row:
                tasks[task][metric] = describe([r["tasks"][task][metric] for r in reports])
    return {"tasks": tasks, "average": describe([r["average"] for r in reports]),
            "paper_size": reports[0]["paper_size"], "paper": reports[0]["paper"]}


def long_context_summary(reports: list[dict]) -> dict:
    """Per length: the RULER and BABILong averages and every task's score (%), mean ± std over seeds."""
    first = reports[0]
    lengths = [str(n) for n in first["lengths"]]

    def over_seeds(values):
        return describe([v for v in values if v is not None])

    out = {"lengths": first["lengths"], "train_context": first["train_context"], "rope_scaling": first["rope_scaling"],
           "limit": first["limit"], "tasks": {}}
    for family in ("ruler", "babilong"):
        out[f"{family}_average"] = {n: over_seeds([r[f"{family}_average"].get(n) for r in reports]) for n in lengths}
        out[f"{family}_average_tasks"] = {n: first[f"{family}_average_tasks"].get(n, 0) for n in lengths}
    for task in first["tasks"]:
        out["tasks"][task] = {n: over_seeds([r["scores"][task].get(n, {}).get("score") for r in reports])
                              for n in lengths}
    return out


def eval_outputs_by_seed(study: Study, encoding: str, name: str) -> dict[int, dict]:
    """seed -> the finished evaluation `name` of that encoding's run (its first result where the file holds a list)."""
    found = {}
    for run in study.runs:
        if run.encoding == encoding and name in run.evals and run_finished(run) and eval_finished(run, name):
            output = read_json(os.path.join(run.run_dir, "eval", f"{name}.json"))
            output = output[0] if isinstance(output, list) and output else output
            if output:
                found[run.seed] = output
    return found


def extrapolation_comparison(study: Study, encoding: str) -> dict:
    """Per seed, then over seeds: the non-overlapping loss at L, and for each longer context kL the loss beyond L
    and its rise over the loss at L (does the loss grow past the training context?), and the paired difference of
    the loss beyond L to the reference encoding's."""
    def per_seed(results):
        out = {}
        for seed, r in results.items():
            train_context = r["train_context"]
            cells = {int(c) // train_context: cell["nonoverlapping"] for c, cell in r["contexts"].items()}
            if 1 in cells:
                out[seed] = {"at_L": cells[1]["mean"], "beyond": {k: c["mean_beyond_train_context"]
                                                                    for k, c in cells.items() if k > 1}}
        return out

    mine = per_seed(eval_outputs_by_seed(study, encoding, "extrapolation"))
    if not mine:
        return {}
    reference = per_seed(eval_outputs_by_seed(study, study.reference, "extrapolation"))
    factors = sorted({k for v in mine.values() for k in v["beyond"]})
    seeds = sorted(mine)
    return {"seeds": seeds, "at_L": mean_interval([mine[s]["at_L"] for s in seeds]),
            "rise": {str(k): mean_interval([mine[s]["beyond"][k] - mine[s]["at_L"] for s in seeds
                                            if mine[s]["beyond"].get(k) is not None]) for k in factors},
            "beyond_minus_reference": {str(k): paired_difference(
                {s: v["beyond"][k] for s, v in mine.items() if v["beyond"].get(k) is not None},
                {s: v["beyond"][k] for s, v in reference.items() if v["beyond"].get(k) is not None})
                for k in factors}}


def long_context_differences(study: Study, encoding: str) -> dict:
    """Per family and length, the paired difference of the average to the reference encoding's (same seed)."""
    def by_seed(name):
        return eval_outputs_by_seed(study, name, "long_context")

    mine, reference = by_seed(encoding), by_seed(study.reference)
    if not mine or not reference:
        return {}
    lengths = [str(n) for n in next(iter(mine.values()))["lengths"]]
    diffs = {}
    for family in ("ruler", "babilong"):
        def values(reports, n):
            return {seed: r[f"{family}_average"][n] for seed, r in reports.items()
                    if r.get(f"{family}_average", {}).get(n) is not None}
        diffs[family] = {n: paired_difference(values(mine, n), values(reference, n)) for n in lengths}
    return diffs


def count_parameters(model: dict) -> int:
    """A model's parameter count from its config alone (built on the meta device: no memory, no initialisation)."""
    import torch
    from model import GPT

    with torch.device("meta"):
        return GPT(GPTConfig(**model)).num_params()


def setup_summary(study: Study, first_outputs: dict) -> dict:
    """What every number was measured on: the model, the tokens per run, the evaluation sizes (from the first
    output of each evaluation), and whether the paper's row shown beside ours comes from a comparable model."""
    run = study.runs[0]  # the runs differ only in encoding and seed
    model = run.model
    params = {e: count_parameters(next(r.model for r in study.runs if r.encoding == e)) for e in study.encodings}
    setup = {"model": {key: model[key] for key in ("n_layer", "n_embd", "n_head", "head_dim", "block_size",
                                                   "vocab_size")},
             "parameters": params, "tokens_per_run": run.tokens, "iterations": run.final_iter,
             "sequences_per_iteration": run.tokens // (run.final_iter * model["block_size"])}
    zs, ex, lc = first_outputs.get("zero_shot"), first_outputs.get("extrapolation"), first_outputs.get("long_context")
    if lc:
        setup["long_context"] = {"lengths": lc["lengths"], "train_context": lc["train_context"],
                                 "tasks": lc["tasks"], "limit": lc["limit"], "rope_scaling": lc["rope_scaling"]}
    if zs:
        size = zs["paper_size"]
        setup["zero_shot_documents"] = {task: row["n"] for task, row in zs["tasks"].items()}
        setup["paper"] = {"size": size, "parameters": evaluation("zero_shot").PAPER_SIZES[size],
                          "tokens": evaluation("zero_shot").PAPER_TOKENS,
                          # within a factor 2 in size and 10 in tokens: the paper's numbers are a fair target
                          "comparable": min(params.values()) >= evaluation("zero_shot").PAPER_SIZES[size] / 2
                          and run.tokens >= evaluation("zero_shot").PAPER_TOKENS / 10}
    if ex:
        setup["extrapolation"] = {"val_tokens": ex["val_tokens"], "windows": {
            context: cell["nonoverlapping"]["windows"] for context, cell in ex["contexts"].items()}}
        if "passkey" in ex:
            setup["passkey"] = {"lengths": ex["passkey"]["actual_lengths"], "depths": len(ex["passkey"]["depths"]),
                                "trials": ex["passkey"]["trials"]}
    return setup


def build_report(study: Study, statuses: dict) -> dict:
    rows = [run_row(run, statuses.get((run.encoding, run.seed), {})) for run in study.runs]
    final = {e: {r["seed"]: r["final_val_loss"] for r in rows if r["encoding"] == e and r["final_val_loss"] is not None}
             for e in study.encodings}
    encodings, first_outputs = {}, {}
    for encoding in study.encodings:
        finished = [run for run in study.runs if run.encoding == encoding and run_finished(run)]
        diff = None if encoding == study.reference else paired_difference(final[encoding], final[study.reference])
        entry = {"final_val_loss": describe([final[encoding][s] for s in sorted(final[encoding])]) |
                 {"seeds": sorted(final[encoding])}, "difference_to_reference": diff,
                 "verdict": verdict(encoding, study.reference, diff)}
        for name, summarize in (("extrapolation", extrapolation_summary), ("zero_shot", zero_shot_summary),
                                ("long_context", long_context_summary)):
            outputs = [read_json(os.path.join(run.run_dir, "eval", f"{name}.json"))
                       for run in finished if name in run.evals and eval_finished(run, name)]
            outputs = [o[0] if isinstance(o, list) else o for o in outputs if o]
            if outputs:
                entry[name] = summarize(outputs) | {"seeds": [run.seed for run in finished if eval_finished(run, name)]}
                first_outputs.setdefault(name, outputs[0])
        if "long_context" in entry and encoding != study.reference:
            entry["long_context"]["difference_to_reference"] = long_context_differences(study, encoding)
        if "extrapolation" in entry:
            entry["extrapolation"]["by_seed"] = extrapolation_comparison(study, encoding)
        entry["diverged_seeds"] = [r["seed"] for r in rows if r["encoding"] == encoding and r["status"] == "diverged"]
        if entry["diverged_seeds"]:
            entry["verdict"] += (f" Diverged (no final loss, left out above): seed(s) "
                                 f"{', '.join(map(str, entry['diverged_seeds']))}.")
        encodings[encoding] = entry
    return {"study": study.name, "study_file": study.path, "base": study.base, "overrides": study.overrides,
            "seeds": study.seeds, "reference": study.reference, "launch": {"mode": study.mode, "gpus": study.gpus,
                                                                           "gpus_per_run": study.gpus_per_run},
            "rule": f"a difference to {study.reference} is a finding only when the two-sided {CONFIDENCE:.0%} "
                    f"Student-t interval of the mean per-seed paired difference, over at least "
                    f"{MIN_SEEDS_FOR_A_FINDING} seeds, excludes 0; otherwise it is not resolved at this budget",
            "setup": setup_summary(study, first_outputs), "runs": rows, "encodings": encodings}


def fmt(stat: dict | None, digits: int = 4) -> str:
    if not stat or stat.get("mean") is None:
        return "–"
    return f"{stat['mean']:.{digits}f}" + (f" ± {stat['std']:.{digits}f}" if stat.get("std") is not None else "")


def setup_lines(setup: dict) -> list[str]:
    m = setup["model"]
    params = ", ".join(f"{encoding} {n:,}" for encoding, n in setup["parameters"].items())
    lines = [f"- Model: {m['n_layer']} layers, width {m['n_embd']} ({m['n_head']} heads × {m['head_dim']}), context "
             f"{m['block_size']} tokens, vocabulary {m['vocab_size']}; parameters: {params}.",
             f"- Training: {setup['tokens_per_run']:,} tokens per run ({setup['iterations']} iterations × "
             f"{setup['sequences_per_iteration']} sequences × {m['block_size']} tokens); the Runs table has each "
             "run's own count."]
    if "zero_shot_documents" in setup:
        lines.append("- Zero-shot: documents per task: "
                     + ", ".join(f"{task} {n}" for task, n in setup["zero_shot_documents"].items()) + ".")
    if "extrapolation" in setup:
        ex = setup["extrapolation"]
        lines.append(f"- Extrapolation: the first {ex['val_tokens']:,} validation tokens; non-overlapping windows "
                     "per context: " + ", ".join(f"{c} tokens: {n}" for c, n in ex["windows"].items()) + ".")
    if "long_context" in setup:
        lc = setup["long_context"]
        factors = ", ".join(f"{n:,} ({n / lc['train_context']:g}×)" for n in lc["lengths"])
        documents = f"the first {lc['limit']}" if lc["limit"] else "all"
        lines.append(f"- Long context: RULER and BABILong through lm-eval at {factors} tokens; {len(lc['tasks'])} tasks, "
                     f"{documents} documents per task and length; positions: `--rope-scaling {lc['rope_scaling']}`.")
    if "passkey" in setup:
        p = setup["passkey"]
        trials = f"{p['trials']} trial{'s' if p['trials'] != 1 else ''}"
        lines.append(f"- Passkey: prompts of {', '.join(map(str, p['lengths']))} tokens × {p['depths']} depths × "
                     f"{trials} = {len(p['lengths']) * p['depths'] * p['trials']} prompts per run.")
    return lines


def paper_warning(setup: dict) -> list[str]:
    paper = setup.get("paper")
    if not paper or paper["comparable"]:
        return []
    params = ", ".join(f"{n:,}" for n in sorted(set(setup["parameters"].values())))
    return [f"**Warning:** the paper's {paper['size']} row below comes from a {paper['parameters'] / 1e6:,.0f}M-"
            f"parameter model trained on {paper['tokens'] / 1e9:,.0f}B tokens; this study's model has {params} "
            f"parameters and saw {setup['tokens_per_run']:,} tokens per run. Beside it, our numbers show that the "
            "pipeline works, not how the encodings compare at the paper's scale.", ""]


def markdown(report: dict, plots: dict) -> str:
    ref = report["reference"]
    enc = report["encodings"]
    lines = [f"# Study `{report['study']}`", "",
             f"Base config `{os.path.relpath(report['base'])}`, overrides `{' '.join(report['overrides']) or 'none'}`, "
             f"seeds {report['seeds']}, launch {report['launch']['mode']}. Every number is mean ± sample standard "
             "deviation over seeds, read from the runs' own metrics.jsonl and eval/*.json "
             "(report.json holds them all).",
             "", "## Setup", "", *setup_lines(report["setup"]),
             "", "## Final validation loss", "",
             f"| encoding | seeds | val loss | − {ref} (paired) | {CONFIDENCE:.0%} t-interval "
             "| finding | diverged |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for name, e in enc.items():
        d = e["difference_to_reference"]
        interval = f"[{d['interval'][0]:+.4f}, {d['interval'][1]:+.4f}]" if d and d["interval"] else "–"
        lines.append(f"| {name} | {e['final_val_loss']['n']} | {fmt(e['final_val_loss'])} | {fmt(d)} | "
                     f"{interval} | {finding_word(d) if name != ref else '–'} | {len(e.get('diverged_seeds', []))} |")
    lines += ["", f"Rule: {report['rule']}.", ""] + [f"- {e['verdict']}" for e in enc.values()]
    if "loss_curves" in plots:
        lines += ["", f"![loss curves]({plots['loss_curves']})"]
    if any("extrapolation" in e for e in enc.values()):
        lines += ["", "## Loss beyond the training context", "",
                  "| encoding | C/L | C | non-overlapping | beyond L | sliding |", "|---|---:|---:|---:|---:|---:|"]
        for name, e in enc.items():
            for factor, c in e.get("extrapolation", {}).get("contexts", {}).items():
                lines.append(f"| {name} | {factor} | {c['context']} | {fmt(c['nonoverlapping'])} | "
                             f"{fmt(c['beyond_train_context'])} | {fmt(c['sliding'])} |")
        lines += extrapolation_comparison_lines(report)
        if "loss_vs_position" in plots:
            lines += ["", f"![loss vs position]({plots['loss_vs_position']})"]
        passkeys = {n: e["extrapolation"]["passkey"] for n, e in enc.items() if "passkey" in e.get("extrapolation", {})}
        if passkeys:
            lengths = next(iter(passkeys.values()))["lengths"]
            lines += ["", "## Passkey retrieval accuracy (mean over depths, then over seeds)", "",
                      "| encoding | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
                      "|---|" + "---:|" * len(lengths)]
            for name, p in passkeys.items():
                lines.append(f"| {name} | " + " | ".join(fmt(a, 2) for a in p["accuracy_by_length"]) + " |")
    zs = {n: e["zero_shot"] for n, e in enc.items() if "zero_shot" in e}
    if zs:
        first = next(iter(zs.values()))
        tasks = list(first["tasks"])
        lines += ["", "## Zero-shot accuracy (%)", "", *paper_warning(report["setup"]),
                  "The metric eval/zero_shot.py averages (named per task), ours beside the paper's row:", "",
                  "| encoding | " + " | ".join(f"{t} ({first['tasks'][t]['average_metric']})" for t in tasks)
                  + " | average |", "|---|" + "---:|" * (len(tasks) + 1)]
        for name, z in zs.items():
            lines.append(f"| {name} (ours) | " + " | ".join(fmt(z["tasks"][t].get("score"), 2) for t in tasks)
                         + f" | {fmt(z['average'], 2)} |")
            paper = z["paper"]
            complete = paper is not None and len(tasks) == len(paper) - 1
            lines.append(f"| {name} (paper, {z['paper_size']}) | " + " | ".join(
                "–" if not paper or paper.get(t) is None else f"{paper[t]:.2f}" for t in tasks)
                + (f" | {paper['avg']:.2f} |" if complete else " | – |"))
        lines += ["", "Both metrics, acc / acc_norm:", "", "| encoding | " + " | ".join(tasks) + " |",
                  "|---|" + "---:|" * len(tasks)]
        for name, z in zs.items():
            lines.append(f"| {name} | " + " | ".join(
                f"{fmt(z['tasks'][t].get('acc'), 2)} / {fmt(z['tasks'][t].get('acc_norm'), 2)}" for t in tasks) + " |")
    lines += long_context_lines(report, plots)
    lines += ["", "## Runs", "", "| encoding | seed | status | iterations | tokens | final val loss | wall-clock (h) "
              "| GPU-hours | run directory |", "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in report["runs"]:
        loss = "–" if r["final_val_loss"] is None else f"{r['final_val_loss']:.4f}"
        lines.append(f"| {r['encoding']} | {r['seed']} | {r['status']} | {r['iter']} | {r['tokens']:,} | {loss} | "
                     f"{sum(r['wall_clock_s'].values()) / 3600:.3f} | {r['gpu_hours']:.2f} | `{r['run_dir']}` |")
    failed = [r for r in report["runs"] if r["errors"]]
    if failed:
        lines += ["", "## Failed or diverged runs", ""]
        lines += [f"- {r['encoding']} seed {r['seed']}: {'; '.join(r['errors'])}" for r in failed]
    return "\n".join(lines) + "\n"


def interval_cell(stat: dict | None, digits: int = 3) -> str:
    """mean [95% interval], with * where it is a finding (excludes 0 over enough seeds)."""
    if not stat or stat.get("mean") is None:
        return "–"
    if stat["interval"] is None:
        return f"{stat['mean']:+.{digits}f} ({stat['n']} seed)"
    lo, hi = stat["interval"]
    return f"{stat['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]" + ("*" if stat["finding"] else "")


def extrapolation_comparison_lines(report: dict) -> list[str]:
    comparisons = {n: e["extrapolation"]["by_seed"] for n, e in report["encodings"].items()
                   if e.get("extrapolation", {}).get("by_seed")}
    if not comparisons:
        return []
    factors = sorted({k for c in comparisons.values() for k in c["rise"]}, key=int)
    header = " | ".join(f"{k}L" for k in factors)
    ref = report["reference"]
    lines = ["", f"Per seed, then the mean and its {CONFIDENCE:.0%} t-interval over seeds (* where the interval "
             f"excludes 0 over at least {MIN_SEEDS_FOR_A_FINDING} seeds): the rise of the loss beyond L over the "
             "loss at L, in the same windows (positive: the loss grows past the training context).", "",
             f"| encoding | loss at L | rise at {header.replace(' | ', ' | rise at ')} |",
             "|---|---:|" + "---:|" * len(factors)]
    for name, c in comparisons.items():
        lines.append(f"| {name} | {fmt(c['at_L'], 3)} | "
                     + " | ".join(interval_cell(c["rise"].get(k)) for k in factors) + " |")
    lines += ["", f"The loss beyond L minus {ref}'s (paired by seed):", "", f"| encoding | {header} |",
              "|---|" + "---:|" * len(factors)]
    for name, c in comparisons.items():
        if name != ref:
            lines.append(f"| {name} − {ref} | "
                         + " | ".join(interval_cell(c["beyond_minus_reference"].get(k)) for k in factors) + " |")
    return lines


def long_context_lines(report: dict, plots: dict) -> list[str]:
    enc = {n: e["long_context"] for n, e in report["encodings"].items() if "long_context" in e}
    if not enc:
        return []
    first = next(iter(enc.values()))
    lengths = [str(n) for n in first["lengths"]]
    header = " | ".join(f"{int(n):,} ({int(n) / first['train_context']:g}×)" for n in lengths)
    lines = ["", "## Long context: RULER and BABILong (accuracy %)", "",
             "Each cell: lm-eval's score, mean ± sample std over seeds (eval/long_context.py; each run's "
             "eval/long_context.md has its tables). An average over fewer tasks than RULER's 13 or BABILong's 5 says "
             "how many.", "", f"| encoding | average | {header} |", "|---|---|" + "---:|" * len(lengths)]
    for name, lc in enc.items():
        for family, label, full in (("ruler", "RULER", 13), ("babilong", "BABILong", 5)):
            counts = lc[f"{family}_average_tasks"]
            if not any(counts.values()):
                continue
            cells = [fmt(lc[f"{family}_average"][n], 2) + (f" ({counts[n]} of {full})" if 0 < counts[n] < full else "")
                     for n in lengths]
            lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    ref = report["reference"]
    diffs = {n: lc.get("difference_to_reference") for n, lc in enc.items() if lc.get("difference_to_reference")}
    if diffs:
        lines += ["", f"Paired difference to {ref} (per seed, then mean; {CONFIDENCE:.0%} t-interval; * where it "
                      f"excludes 0 over at least {MIN_SEEDS_FOR_A_FINDING} seeds):", "", f"| encoding | average | {header} |",
                  "|---|---|" + "---:|" * len(lengths)]
        for name, families in diffs.items():
            for family, label in (("ruler", "RULER"), ("babilong", "BABILong")):
                cells = []
                for n in lengths:
                    d = families[family][n]
                    cells.append(interval_cell(d, 2) if d["n"] else "–")
                if any(c != "–" for c in cells):
                    lines.append(f"| {name} − {ref} | {label} | " + " | ".join(cells) + " |")
    lines += ["", "Per task:", "", f"| encoding | task | {header} |", "|---|---|" + "---:|" * len(lengths)]
    for name, lc in enc.items():
        for task, cells in lc["tasks"].items():
            lines.append(f"| {name} | {task} | " + " | ".join(fmt(cells[n], 1) for n in lengths) + " |")
    if "long_context" in plots:
        lines += ["", f"![accuracy against context length]({plots['long_context']})"]
    return lines


def mean_over_seeds(results: list[dict]) -> dict:
    """An extrapolation result whose longest context's binned loss curve is the mean of the seeds' curves (the
    same validation tokens and bins for every seed)."""
    longest = max(results[0]["contexts"], key=int)
    curves = [r["contexts"][longest]["nonoverlapping"]["binned_loss"] for r in results]
    cell = {"binned_positions": results[0]["contexts"][longest]["nonoverlapping"]["binned_positions"],
            "binned_loss": [statistics.fmean(column) for column in zip(*curves)]}
    return {"train_context": results[0]["train_context"], "contexts": {longest: {"nonoverlapping": cell}}}


def write_plots(study: Study, report: dict) -> dict:
    plots = {}
    done = [r for r in report["runs"] if r["finished"]]
    if done:
        path = os.path.join(study.out_dir, "loss_curves.png")
        labels = [f"{r['encoding']} seed {r['seed']}" for r in done]
        with contextlib.redirect_stdout(io.StringIO()):  # plot_runs prints the path
            plot_runs.main([r["run_dir"] for r in done] + ["--out", path, "--title", study.name, "--labels", *labels,
                                                           "--groups", *[r["encoding"] for r in done]])
        plots["loss_curves"] = "loss_curves.png"
    results = []  # one line per encoding: its seeds' loss at each position of the longest context, averaged
    for encoding in study.encodings:
        seeds = eval_outputs_by_seed(study, encoding, "extrapolation")
        if seeds:
            results.append(mean_over_seeds(list(seeds.values())) | {"name": encoding,
                                                                     "encoding": f"{len(seeds)} seeds"})
    if results:
        evaluation("extrapolation").plot_loss_vs_position(results, os.path.join(study.out_dir, "loss_vs_position.png"))
        plots["loss_vs_position"] = "loss_vs_position.png"
    lines = []  # one line per encoding: the mean over seeds of each average
    for name, entry in report["encodings"].items():
        lc = entry.get("long_context")
        if lc:
            means = {f: {n: v["mean"] for n, v in lc[f"{f}_average"].items()} for f in ("ruler", "babilong")}
            lines.append({"name": name, "encoding": name, "label": f"{name} (mean of {len(lc['seeds'])} seeds)",
                          "lengths": lc["lengths"], "train_context": lc["train_context"],
                          "ruler_average": means["ruler"], "babilong_average": means["babilong"],
                          "ruler_average_tasks": lc["ruler_average_tasks"],
                          "babilong_average_tasks": lc["babilong_average_tasks"]})
    if lines and evaluation("long_context").plot_accuracy_vs_length(lines, os.path.join(study.out_dir, "long_context.png")):
        plots["long_context"] = "long_context.png"
    return plots


def write_report(study: Study, statuses: dict) -> dict:
    report = build_report(study, statuses)
    os.makedirs(study.out_dir, exist_ok=True)
    plots = write_plots(study, report)
    report["plots"] = plots
    atomic_write_text(os.path.join(study.out_dir, "report.json"), json.dumps(report, indent=2) + "\n")
    atomic_write_text(os.path.join(study.out_dir, "report.md"), markdown(report, plots))
    return report


REPORT_BEGIN, REPORT_END = "<!-- study report: begin (scripts/study.py --publish writes this part) -->", \
    "<!-- study report: end -->"


def check_publish_target(target: str) -> str:
    """The text of `target` (the two markers alone for a missing file), refused before any work when it lacks the
    markers or its folder cannot be written: a study of hours must not end in an error that loses its report."""
    text = Path(target).read_text() if os.path.exists(target) else f"{REPORT_BEGIN}\n{REPORT_END}\n"
    if text.count(REPORT_BEGIN) != 1 or text.count(REPORT_END) != 1 or text.index(REPORT_BEGIN) > text.index(REPORT_END):
        raise StudyError(f"{target} must hold the lines {REPORT_BEGIN} and {REPORT_END} once each, in that order: "
                         "the report goes between them; add them where it belongs.")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise StudyError(f"--publish {target}: its folder {folder} does not exist or cannot be written; "
                         "make it or choose another file.")
    return text


def publish(study: Study, report: dict, target: str) -> None:
    """The report into `target` between REPORT_BEGIN and REPORT_END (the text around them is kept; a new file gets
    just the markers and the report), one heading level down, with its plots copied beside the file as
    <target stem>_<plot>.png."""
    import shutil

    text = check_publish_target(target)
    folder, stem = os.path.dirname(os.path.abspath(target)), Path(target).stem
    plots = {}
    for key, name in report["plots"].items():
        plots[key] = f"{stem}_{name}"
        shutil.copyfile(os.path.join(study.out_dir, name), os.path.join(folder, plots[key]))
    body = "\n".join("#" + line if line.startswith("#") else line for line in markdown(report, plots).splitlines())
    before, rest = text.split(REPORT_BEGIN)
    after = rest.split(REPORT_END)[1]
    atomic_write_text(target, f"{before}{REPORT_BEGIN}\n{body}\n{REPORT_END}{after}")
    print(f"[study] wrote the report into {target} and its plots beside it", flush=True)


def rerun_command(script: Path, args: list[str]) -> str:
    """The command line that runs `script` with `args` again, from the directory it runs in (a study's out_dir may be
    relative to it): the script's path relative to it when below it, else absolute."""
    shown = os.path.relpath(script) if script.is_relative_to(Path.cwd().resolve()) else str(script)
    return shlex.join(["python", shown, *args])


@contextlib.contextmanager
def advice_names(command: str):
    """While the study runs, train.py's advice after a stop names `command`: a study's run is continued by rerunning
    the study, not by train.py --resume. Set in the environment, so its subprocesses (and torchrun's) see it too."""
    previous = os.environ.get(STUDY_COMMAND)
    os.environ[STUDY_COMMAND] = command
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(STUDY_COMMAND, None)
        else:
            os.environ[STUDY_COMMAND] = previous


def run_study(path: str, publish_to: str | None = None, command: str | None = None) -> dict:
    """`command`: what reruns it, for train.py's advice after a stop (default: scripts/study.py with these
    arguments)."""
    study = load_study(path)
    if publish_to:
        check_publish_target(publish_to)
    seeds = f"seeds {study.seeds}" + (" (the default; set seeds = [...] for a seed spread)"
                                      if study.seeds_defaulted else "")
    print(f"[study] {study.name}: {len(study.encodings)} encodings x {len(study.seeds)} seeds = "
          f"{len(study.runs)} runs, {seeds}, launch {study.mode}, output {study.out_dir}", flush=True)
    runner = Runner(study)
    try:
        rerun = [path] + (["--publish", publish_to] if publish_to else [])
        with advice_names(command or rerun_command(REPO / "scripts" / "study.py", rerun)):
            runner.run_all()
    except (StudyInterrupted, KeyboardInterrupt):
        # What finished is reported (a time-limited study, gpu_study.sh, ends this way); the rest continues later.
        report = write_report(study, runner.status)
        print(f"[study] wrote {os.path.join(study.out_dir, 'report.md')} with the runs finished so far", flush=True)
        if publish_to:
            publish(study, report, publish_to)
        raise
    report = write_report(study, runner.status)
    failed = sum(r["status"] == "failed" for r in report["runs"])
    diverged = sum(r["status"] == "diverged" for r in report["runs"])
    trouble = [f"{n} run(s) {word}" for n, word in ((failed, "failed"), (diverged, "diverged")) if n]
    print(f"[study] wrote {os.path.join(study.out_dir, 'report.md')} and report.json"
          + (f"; {' and '.join(trouble)}, see the report's last section" if trouble else ""), flush=True)
    if publish_to:
        publish(study, report, publish_to)
    return report


def build_parser():
    parser = make_parser(__doc__, epilog="The study file (TOML), every key with its default:\n\n"
                         + STUDY_FILE_EXAMPLE)
    parser.add_argument("study", help="the study file, e.g. configs/studies/smoke.toml")
    parser.add_argument("--publish", metavar="FILE.md",
                        help="also write the report into FILE.md between the lines "
                             f"'{REPORT_BEGIN}' and '{REPORT_END}' (the rest of the file is kept; a missing file is "
                             "made), its plots beside it as FILE_<plot>.png (docs/results_cpu.md is made this way)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    try:
        report = run_study(args.study, args.publish)
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (StudyInterrupted, KeyboardInterrupt):
        print("stopped: finished runs and evaluations are kept and an interrupted run has its last checkpoint; "
              "run the same command again to continue.", file=sys.stderr, flush=True)
        sys.exit(130)
    if any(r["status"] == "failed" for r in report["runs"]):
        sys.exit(1)
    return report


if __name__ == "__main__":
    main()
