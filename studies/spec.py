"""The study file: its keys and defaults, its checks (every mistake in one report before any run), and the
runs it asks for (encodings x seeds, each with its train.py arguments and evaluations)."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import io
import os
import tomllib
from pathlib import Path


from config import MAX_SEED, ConfigError, UserError, closest_hint, resolve
from eval.cli import example_key
from model import GPTConfig
from positional import ENCODINGS, parse_pos


LAUNCH_MODES = ("in_process", "torchrun", "per_gpu", "cpu_jobs", "slurm")
EVALUATIONS = ("extrapolation", "zero_shot", "long_context", "retrieval", "reach")  # eval/<name>.py, each with
                                                                                    # parse_args and main


def evaluation(name: str):
    """eval/<name>.py, imported when a study uses it: lm-eval and its dependencies are not needed by a study that
    runs no lm-eval task (the GPU study on an image with torch alone)."""
    return importlib.import_module(f"eval.{name}")
STUDY_KEYS = {"name", "base", "encodings", "seeds", "reference", "out_dir", "overrides", "variants", "launch", "eval"}
LAUNCH_KEYS = {"mode", "gpus", "gpus_per_run", "jobs", "slurm"}
SLURM_KEYS = {"partition", "account", "qos", "time", "gpus_per_node", "cpus_per_task", "sbatch_options", "setup",
              "max_tries", "poll_s"}
DEFAULT_SEEDS = [1337]  # train.py's own default seed
# keys that every run of a study gets from the study itself (the last word on its command line), so that an
# [overrides] value of them would be dropped without a word
SET_BY_THE_STUDY = {"pos": "encodings", "kv_shift": "encodings", "seed": "seeds", "out_dir": "out_dir"}
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

[launch.slurm]                      # mode = "slurm" only: each run one sbatch job of scripts/slurm/train.sbatch
partition = "gpu"                   # default none (the cluster's default partition); likewise:
account = "my_project"              # default none: sbatch --account
qos = "normal"                      # default none: sbatch --qos
time = "24:00:00"                   # default none (the partition's limit): a job's time limit; train.py saves before it
gpus_per_node = 8                   # default 8: a run with more gpus_per_run spans nodes; 0 for a CPU partition
cpus_per_task = 32                  # default none: sbatch --cpus-per-task
sbatch_options = ["--exclusive"]    # default none: more sbatch options, as written on its command line
setup = "source ~/venv/bin/activate"  # default none: a shell line run first in each job (then `python` is its own)
max_tries = 3                       # default 3: submissions of a run's training (and of its evaluations) before failing
poll_s = 60                         # default 60: seconds between SLURM's answers under study.py --wait

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

[eval.retrieval]                    # default none: options of eval/retrieval.py (its --help), _ for -
edges = "0,1/4,1/2,1,2,4,8"         # gap buckets as multiples of L: (0, L/4], ..., (4L, 8L] (at most 8L)
sequences = 16

[eval.reach]                        # default none: options of eval/reach.py (its --help), _ for -
windows = 4
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
    slurm: "SlurmSettings | None" = None  # mode = "slurm": the [launch.slurm] table


@dataclasses.dataclass
class SlurmSettings:
    """[launch.slurm]: the site's sbatch settings and how the study treats its jobs (studies/slurm.py)."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    gpus_per_node: int = 8
    cpus_per_task: int | None = None
    sbatch_options: list[str] = dataclasses.field(default_factory=list)
    setup: str | None = None
    max_tries: int = 3
    poll_s: float = 60.0

    def nodes(self, gpus_per_run: int) -> int:
        """A run's nodes: its GPUs over the GPUs of a node; on a CPU partition (gpus_per_node = 0) one process a
        node."""
        return gpus_per_run if self.gpus_per_node == 0 else -(-gpus_per_run // self.gpus_per_node)


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


def retrieval_problem(options: list[str] | None, block_size: int, train_cfg) -> tuple[str, str] | None:
    """(key, sentence) where the retrieval evaluation's gap buckets, or the training's retrieval windows, cannot hold
    their facts at this context, found before any run (with the byte tokenizer's lengths: a fact takes at most one
    token a byte in any tokenizer here)."""
    from data.retrieval import Facts, check_fits
    from data.tokenizer import get_tokenizer
    facts = Facts(get_tokenizer("byte"))
    if train_cfg.retrieval_fraction:
        problem = check_fits(block_size, facts, train_cfg.retrieval_pairs)
        if problem:
            return "[overrides] retrieval_pairs", problem + "."
    if options is None:
        return None
    retrieval = evaluation("retrieval")
    args = retrieval.parse_args(["--ckpt", "RUN_DIR", "--out", "RUN_DIR/eval", *options])
    problem = retrieval.bucket_problem(args.edges, args.context or block_size, args.pairs, facts)
    return ("[eval.retrieval]", problem + ".") if problem else None


def load_study(path: str) -> Study:
    """Read and check a study file, resolving every run's train config and parsing every evaluation's options, so
    that every mistake in it is found before any run: all of them at once, in one StudyError whose lines each name
    the file and the key."""
    if not os.path.isfile(path):
        raise StudyError(f"study file {path} does not exist; pick one of configs/studies/*.toml.")
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))  # TOML is UTF-8, whatever the locale says
    except tomllib.TOMLDecodeError as e:
        raise StudyError(f"study file {path} is not valid TOML ({e}); fix the line it names.") from None
    except UnicodeDecodeError:  # e.g. a comment saved as Latin-1
        raise StudyError(f"study file {path} is not UTF-8 text; save it as UTF-8.") from None
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
        if os.path.isdir(base):
            wrong("base", f"{base} is a folder, not a config file; name a .toml file, e.g. base = \"../base/cpu.toml\" "
                          "(the path is relative to the study file).")
            base = None
        elif not os.path.isfile(base):
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
    # TOML's dotted keys (train.max_iters = 5) and sub-tables ([overrides.model]) arrive as tables: train.py's
    # --train.max_iters=5 form
    flat = [(f"{key}.{inner}", value) for key, table in overrides_table.items() if key in ("model", "train")
            and isinstance(table, dict) for inner, value in table.items()]
    flat += [(key, value) for key, value in overrides_table.items() if not (key in ("model", "train")
                                                                        and isinstance(value, dict))]
    named = {}  # the key each override sets (train.max_iters and max_iters are one key)
    for key, _ in flat:
        named.setdefault(key.split(".")[-1], []).append(key)
    for key, spellings in named.items():
        if len(spellings) > 1:  # the last would win silently
            wrong("[overrides]", f"sets {key} twice ({' and '.join(sorted(spellings))}); keep one.")
        if key in SET_BY_THE_STUDY:
            wrong(f"[overrides] {spellings[0]}", f"is set for each run by the study's {SET_BY_THE_STUDY[key]}, which "
                                                 f"would override it silently; remove it and set {SET_BY_THE_STUDY[key]}.")
    flat = [(key, value) for key, value in flat if key.split(".")[-1] not in SET_BY_THE_STUDY]
    override_values = [(f"[overrides] {key}", arg) for key, value in flat for arg in as_cli(key, value)]
    out_dir = raw.get("out_dir", os.path.join("runs", name))
    if not isinstance(out_dir, str) or not out_dir:
        wrong("out_dir", f"must be a directory such as \"runs/my_study\", not {out_dir!r}.")
        out_dir = os.path.join("runs", name)
    in_the_way = next((folder for folder in [out_dir, *Path(out_dir).parents] if os.path.lexists(folder)
                       and not os.path.isdir(folder)), None)
    if in_the_way is not None:  # found now, not after hours of runs that cannot write their directories
        wrong("out_dir", f"{out_dir!r} cannot be made: {str(in_the_way)!r} is a file, not a folder; move it or choose "
                         "another out_dir.")
    else:
        from eval.outputs import check_writable
        try:  # (a read-only mount: each run would fail in turn, each with its own traceback)
            check_writable(out_dir, "the study's runs", option="out_dir")
        except UserError as error:
            wrong("out_dir", f"{error}.")

    launch = raw.get("launch") or {}
    if not isinstance(launch, dict):
        wrong("[launch]", "must be a table such as mode = \"torchrun\".")
        launch = {}
    for key in sorted(set(launch) - LAUNCH_KEYS):
        wrong(f"[launch] {key}", f"unknown key; {closest_hint(key, LAUNCH_KEYS)} ([launch] has mode, gpus, "
                                 "gpus_per_run, jobs).")
    mode = launch.get("mode", "in_process")
    slurm = slurm_settings(launch.get("slurm", {}), wrong)
    if mode not in LAUNCH_MODES:
        wrong("[launch] mode", f"{mode!r} is not one of {', '.join(LAUNCH_MODES)}.")
        mode = "in_process"
    gpus_per_run = 1 if mode == "per_gpu" else launch.get("gpus_per_run", 1)
    jobs = launch.get("jobs", os.cpu_count() or 1)
    gpus = []
    if mode == "slurm":
        if "gpus" in launch:
            wrong("[launch] gpus", "is not used under mode = \"slurm\": SLURM places each run's job; remove it (a run's "
                                   "GPUs are gpus_per_run, a node's [launch.slurm] gpus_per_node).")
        if isinstance(gpus_per_run, bool) or not isinstance(gpus_per_run, int) or gpus_per_run < 1:
            wrong("[launch] gpus_per_run", f"must be a whole number of GPUs per run, at least 1, not {gpus_per_run!r}.")
        elif slurm and slurm.gpus_per_node and gpus_per_run > slurm.gpus_per_node \
                and gpus_per_run % slurm.gpus_per_node:
            wrong("[launch] gpus_per_run", f"{gpus_per_run} GPUs span nodes of {slurm.gpus_per_node} GPUs "
                                           "([launch.slurm] gpus_per_node) only as a whole number of nodes: make it a "
                                           "multiple of gpus_per_node.")
    elif mode == "cpu_jobs":
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
            hint = (f"; the keys are the options of eval/{eval_name}.py with _ for -, e.g. "
                    f"{example_key(evaluation(eval_name).build_parser())}" if "unrecognized arguments" in why else "")
            wrong(key, f"{why}{hint}.")

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
            problem = retrieval_problem(eval_options.get("retrieval"), model_cfg.block_size, train_cfg)
            if problem:
                mistakes.setdefault(problem, []).append(encoding)
                continue
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
                 mode, gpus, gpus_per_run, runs, "seeds" not in raw, jobs if mode == "cpu_jobs" else 1,
                 slurm if mode == "slurm" else None)


def slurm_settings(table, wrong) -> SlurmSettings | None:
    """The [launch.slurm] table as SlurmSettings (its mistakes reported through `wrong`); None if it is not a table.
    Read whatever the mode, so that its mistakes are found before the mode is switched to slurm."""
    if not isinstance(table, dict):
        wrong("[launch.slurm]", "must be a table such as partition = \"gpu\" (docs/study.md, \"On a cluster\").")
        return None
    for key in sorted(set(table) - SLURM_KEYS):
        wrong(f"[launch.slurm] {key}", f"unknown key; {closest_hint(key, SLURM_KEYS)} ([launch.slurm] has "
                                       f"{', '.join(sorted(SLURM_KEYS))}).")
    settings = SlurmSettings()
    for key in ("partition", "account", "qos", "time", "setup"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip() or "\n" in value):
            wrong(f"[launch.slurm] {key}", f"must be one line of text such as {key} = "
                                           f"{SLURM_EXAMPLES[key]}, not {value!r}.")
        elif value is not None:
            setattr(settings, key, value)
    for key, least in (("gpus_per_node", 0), ("cpus_per_task", 1), ("max_tries", 1)):
        value = table.get(key, getattr(settings, key))
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            wrong(f"[launch.slurm] {key}", f"must be a whole number, at least {least}, not {value!r}.")
        else:
            setattr(settings, key, value)
    options = table.get("sbatch_options", [])
    if not isinstance(options, list) or not all(isinstance(o, str) and o.startswith("-") for o in options):
        wrong("[launch.slurm] sbatch_options", "must be a list of sbatch options as written on its command line, "
                                               f"e.g. [\"--exclusive\", \"--constraint=h100\"], not {options!r}.")
    else:
        settings.sbatch_options = options
    poll = table.get("poll_s", settings.poll_s)
    if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not poll > 0:
        wrong("[launch.slurm] poll_s", f"must be a number of seconds above 0, not {poll!r}.")
    else:
        settings.poll_s = float(poll)
    return settings


SLURM_EXAMPLES = {"partition": '"gpu"', "account": '"my_project"', "qos": '"normal"', "time": '"24:00:00"',
                  "setup": '"source ~/venv/bin/activate"'}


# ----------------------------------------------------------------------------- what is already done
