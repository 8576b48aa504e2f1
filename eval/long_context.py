"""Long context the field's way: RULER's 13 tasks and BABILong qa1-qa5 through lm-evaluation-harness, at 1x to 8x
the training context.

    python eval/long_context.py --ckpt runs/medium/rope                     # RUN/eval/long_context.{md,json,png}
    python eval/long_context.py --ckpt RUN_A RUN_B --plot out/long_context.png --limit 100
    python eval/long_context.py --ckpt RUN --data-dir data_cache/long_context          # offline, local data
    python eval/long_context.py --export-data data_cache/long_context                  # (online, once) fetch it
    python eval/long_context.py --report-only --ckpt RUN_A RUN_B --plot out/long_context.png   # plot saved results

For a checkpoint trained at context L (model_config.block_size) and each length in --lengths (default L, 2L, 4L,
8L), every task runs as lm-eval defines it (eval/long_context_tasks.py writes task YAMLs that include lm-eval's
own; prompts, data generation and metrics are lm-eval's), with the `grape` adapter (eval/lm_adapter.py) and lm-eval's
seeds. RULER generates its documents for each length with the run's tokenizer, as Hugging Face files
(hf/tokenizer_files.py, what scripts/export_hf.py writes; --tokenizer DIR to name an export's folder); BABILong
reads the split built for that length (0k, 1k, 2k, 4k, ...: the longest one not longer than it).

Score: lm-eval's, in % (RULER: the fraction of reference strings found in the greedy answer; BABILong: the target
found in it); the RULER average of a length is the mean over its 13 tasks, as the RULER paper reports it. Models
read their positions as trained: no rescaling, unless --rope-scaling asks for one (the report says which).

Writes OUT/long_context.json and OUT/long_context.md (OUT defaults to RUN/eval; with several runs, each run's own
RUN/eval) and the plot of accuracy against context length (--plot; default OUT/long_context.png for one run).
Lengths run shortest first; the report is rewritten after each, and stderr gets progress lines (tokens, elapsed,
ETA) over the whole run. Tasks that need downloaded data (the essay haystack, SQuAD, HotpotQA, BABILong) read it
from --data-dir; offline without it the program stops at once naming the missing files.

Before anything slow, the program also stops with one sentence at a length that cannot work: one whose KV cache
for a single prompt of that many tokens (every layer's keys, values and encoding state, measured on the model)
exceeds the memory available on the device (the message names the longest length that fits), one shorter than the
answer of every chosen task (each document is a prompt plus the answer lm-eval generates within the length), and
an output directory it cannot write. A length at which no task got a score after all (lm-eval could not build a
document that short) ends the program with an error line and exit status 1, after the report is written.
"""
import contextlib
import importlib
import json
import math
import os
import resource
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import from the repo root, not from eval/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from eval import progress as timing  # noqa: E402
from config import UserError  # noqa: E402
from eval.outputs import check_writable, save_figure, write_atomic  # noqa: E402
from eval.runtime import describe_encoding  # noqa: E402
from eval.cli import make_parser  # noqa: E402
from eval.long_context_tasks import (BABILONG_SPLITS, BABILONG_TASKS, EXPORT_BABILONG_SPLITS,  # noqa: E402
                                     RULER_TASKS, babilong_split, expand_tasks, missing_files,
                                     missing_files_sentence, use_local_nltk_data)

DEFAULT_LENGTHS = "1x,2x,4x,8x"
ROPE_SCALINGS = {
    "none": "as trained, no rescaling",
    "linear": "position interpolation: every rotation frequency divided by length / training context",
    "ntk": "NTK-aware scaling: rotation frequency i multiplied by s^(-2i/(d-2)) with s = length / training context "
           "(RoPE base times s^(d/(d-2)))",
}


def build_parser():
    p = make_parser(__doc__)
    p.add_argument("--ckpt", nargs="+", help="run directories holding ckpt.pt, or checkpoint files (required, except "
                                             "with --export-data)")
    p.add_argument("--lengths", default=DEFAULT_LENGTHS,
                   help="context lengths, comma-separated: multiples of the training context (2x) or tokens (8192); "
                        "refused before anything runs: a length whose KV cache for one prompt exceeds the memory "
                        "available on the device, or that is shorter than every chosen task's answer")
    p.add_argument("--tasks", default="ruler,babilong",
                   help="comma-separated: the groups ruler (13 tasks) and babilong (qa1-qa5), or task names")
    p.add_argument("--data-dir", help="folder made by --export-data, for the tasks that download data (default: "
                                      "lm-eval downloads them; offline, those tasks need this)")
    p.add_argument("--skip-missing", action="store_true",
                   help="run the tasks whose data is here and report the others as not run (default: stop and name "
                        "the missing files)")
    p.add_argument("--limit", type=int, default=None,
                   help="documents per task and length (default: all; RULER makes 500, BABILong has about 1000)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts of equal length decoded together")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="tokens per forward pass when reading a prompt into the KV cache (default: the training "
                        "context)")
    p.add_argument("--rope-scaling", choices=list(ROPE_SCALINGS), default="none",
                   help="rescale rotation frequencies beyond the training context: none (default), linear "
                        "(position interpolation) or ntk")
    p.add_argument("--tokenizer", help="folder of Hugging Face tokenizer files for RULER (default: the run's own "
                                       "tokenizer, written as scripts/export_hf.py writes it)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--out", help="output directory (default: RUN/eval; only with one --ckpt)")
    p.add_argument("--plot", help="the plot of accuracy against context length for all runs (default: "
                                  "OUT/long_context.png; required with several --ckpt)")
    p.add_argument("--log-samples", action="store_true",
                   help="also write OUT/long_context_samples/<task>_<length>.jsonl: every prompt, answer and score")
    p.add_argument("--report-only", action="store_true",
                   help="evaluate nothing: read each run's long_context.json and write the plot and tables again")
    p.add_argument("--export-data", metavar="DIR",
                   help="(needs internet) write the data the tasks download into DIR and exit (default: evaluate "
                        "--ckpt)")
    p.add_argument("--babilong-splits", default=",".join(EXPORT_BABILONG_SPLITS),
                   help="with --export-data: the BABILong splits to fetch, of " + ",".join(BABILONG_SPLITS))
    return p


def parse_lengths(text):
    """'1x,2x,8192' -> [(1.0, None), (2.0, None), (None, 8192)]: factors of the training context or token counts."""
    lengths = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        try:
            lengths.append((float(item[:-1]), None) if item.endswith("x") else (None, int(item)))
        except ValueError:
            raise ValueError(f"{item} is neither a factor such as 2x nor a whole number of tokens") from None
        factor = lengths[-1][0]
        if factor is not None and not math.isfinite(factor):
            raise ValueError(f"{item} is not a finite factor")
    if not lengths or any((n if f is None else f) <= 0 for f, n in lengths):  # (0x is a factor of 0)
        raise ValueError("no lengths, or one that is not positive")
    return lengths


def resolve_lengths(lengths, train_context):
    return sorted({n if n is not None else round(f * train_context) for f, n in lengths})


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.export_data:
        splits = [s.strip() for s in args.babilong_splits.split(",") if s.strip()]
        if not set(splits) <= set(BABILONG_SPLITS):
            p.error(f"--babilong-splits takes splits of {','.join(BABILONG_SPLITS)} (got {args.babilong_splits})")
        args.babilong_splits = splits
        return args
    if not args.ckpt:
        p.error("--ckpt RUN_DIR is required")
    try:
        args.lengths = parse_lengths(args.lengths)
    except ValueError as error:
        p.error(f"--lengths takes multiples of the training context such as 1x,2x,4x,8x or token counts such as "
                f"4096,8192 ({error})")
    try:
        args.tasks = expand_tasks(args.tasks)
    except ValueError as error:
        p.error(str(error))
    if not args.tasks:
        p.error("--tasks names no task")
    if args.batch_size < 1 or (args.limit is not None and args.limit < 1) or (args.prefill_chunk or 1) < 1:
        p.error(f"--batch-size, --limit and --prefill-chunk must be at least 1 (got {args.batch_size}, {args.limit}, "
                f"{args.prefill_chunk})")
    if args.out and len(args.ckpt) > 1:
        p.error("--out takes one --ckpt: with several, each run's report goes to its own RUN/eval")
    if len(args.ckpt) > 1 and not args.plot:
        p.error("--plot PATH is required with several --ckpt: it names the plot that compares them")
    if args.plot and os.path.isdir(args.plot):  # os.replace onto it would fail only after the whole evaluation
        p.error(f"--plot {args.plot} is a folder; name the PNG file to write, e.g. "
                f"{os.path.join(args.plot, 'long_context.png')}")
    return args


def run_dir_of(ckpt):
    return ckpt if os.path.isdir(ckpt) else os.path.dirname(ckpt) or "."


def out_dir_of(args, ckpt):
    return args.out or os.path.join(run_dir_of(ckpt), "eval")


# ----------------------------------------------------------------------------- positions beyond the training context

@contextlib.contextmanager
def rescaled_rotations(model, factor, method):
    """While open, the rotations (RoPE and the GRAPE-M family) of `model` are rescaled for `factor` x the training
    context by `method` (ROPE_SCALINGS); additive encodings are left as they are. Restored on exit."""
    import torch

    rotations = [block.attn.rotation for block in model.blocks if block.attn.rotation.kind != "nope"]
    if method == "none" or factor <= 1 or not rotations:
        yield
        return
    saved = []
    try:
        for rotation in rotations:
            name = "scaled_log_theta" if hasattr(rotation, "scaled_log_theta") else "log_theta"
            spectrum = getattr(rotation, name)  # log θ (times spectrum_scale for scaled_log_theta)
            half = spectrum.shape[-1]
            plane = torch.arange(half, dtype=torch.float64, device=spectrum.device)
            shift = (torch.full_like(plane, math.log(factor)) if method == "linear"
                     else plane * 2 / max(1, 2 * half - 2) * math.log(factor))
            saved.append((spectrum, spectrum.detach().clone()))
            with torch.no_grad():
                spectrum -= (shift * getattr(rotation, "spectrum_scale", 1.0)
                             if name == "scaled_log_theta" else shift).to(spectrum.dtype)
        yield
    finally:
        with torch.no_grad():
            for spectrum, original in saved:
                spectrum.copy_(original)


# ----------------------------------------------------------------------------- evaluation

def proc_status_gb(field):
    """VmRSS / VmHWM of this process from /proc (Linux), in GB; None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith(field + ":"))
        return int(line.split()[1]) * 1024 / 1e9
    except (OSError, StopIteration):
        return None


def reset_peak_memory(device):
    """Start measuring the peak memory of one length; returns the memory in use now (GB)."""
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 1e9
    try:  # Linux: "5" resets the peak resident set size (VmHWM) to the current one
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return proc_status_gb("VmRSS")


def peak_memory(device):
    """(peak memory since reset_peak_memory in GB, what it measures)."""
    import torch

    if str(device).startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 1e9, "CUDA memory allocated"
    peak = proc_status_gb("VmHWM")
    if peak is not None:
        return peak, "the process's peak resident memory during the length (VmHWM)"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, "the process's peak resident memory so far"


def hub_offline_reason():
    """Why the tasks' downloads cannot work now (offline variables set, or the hub unreachable), or None."""
    from eval.zero_shot import hub_is_offline, hub_unreachable

    if hub_is_offline():
        return "the Hugging Face hub is offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set)"
    unreachable = hub_unreachable()
    return f"the Hugging Face hub cannot be reached ({unreachable})" if unreachable else None


def plan_tasks(args, lengths, data_dir):
    """(tasks to run, {task: reason} for those left out) after checking the data the tasks need is here."""
    splits = [babilong_split(n) for n in lengths]
    offline = None if data_dir else hub_offline_reason()
    if data_dir is None and offline is None:
        return list(args.tasks), {}  # online: lm-eval downloads as usual
    missing = missing_files(args.tasks, splits, data_dir)
    if not missing:
        return list(args.tasks), {}
    if not args.skip_missing:
        prefix = f"{offline}, and " if offline else ""
        raise UserError(prefix + missing_files_sentence(missing, data_dir) + ".")
    where = data_dir or "DIR"
    left_out = {task: "not run: missing " + ", ".join(os.path.join(where, p) for p in paths)
                for task, paths in missing.items()}
    return [t for t in args.tasks if t not in missing], left_out


def score_of(results, task, metric):
    """(score in %, stderr in % or None, documents) of one lm-eval result; score None if lm-eval has none."""
    entry = results["results"][task]
    value = entry.get(f"{metric},none")
    stderr = entry.get(f"{metric}_stderr,none")
    n = int(results.get("n-samples", {}).get(task, {}).get("effective", 0))
    if not isinstance(value, (int, float)) or value < 0:  # RULER's "-1": no document of this length
        return None, None, n
    return 100.0 * value, 100.0 * stderr if isinstance(stderr, (int, float)) else None, n


class Counter:
    """Counts the tokens the model reads and writes for one length, and advances the run's progress line."""

    def __init__(self, progress):
        self.progress = progress
        self.reset(0)

    def reset(self, unit):
        self.unit, self.requests, self.prompt_tokens, self.generated_tokens = unit, 0, 0, 0

    def __call__(self, batch):
        for prompt_tokens, generated_tokens in batch:
            self.requests += 1
            self.prompt_tokens += prompt_tokens
            self.generated_tokens += generated_tokens
        self.progress.advance(self.unit * len(batch))


def plan_run(ckpt, args):
    """(lengths, tasks to run, {task: why not run}) of one checkpoint, before anything slow: a missing data file,
    a length that cannot fit in memory or holds no task's answer, and an output directory that cannot be written
    stop the program here, naming them."""
    from checkpoints import load_model

    model, _, _ = load_model(ckpt, "cpu")
    lengths = resolve_lengths(args.lengths, model.config.block_size)
    check_lengths_fit(model, lengths, evaluation_device(args.device), args.tasks)
    plan = (lengths, *plan_tasks(args, lengths, args.data_dir))
    check_writable(out_dir_of(args, ckpt), "the report")
    return plan


# ----------------------------------------------------------------------------- lengths that cannot work

# The tokens lm-eval lets each task generate (its generation_kwargs.max_gen_toks; RULER sizes prompt + answer to
# the length with the same number, its tokens_to_generate): a length must hold that and at least one prompt token.
ANSWER_TOKENS = {**{t: 128 for t in RULER_TASKS if t.startswith("niah_")}, "ruler_vt": 30, "ruler_cwe": 120,
                 "ruler_fwe": 50, "ruler_qa_squad": 32, "ruler_qa_hotpot": 32,
                 **{t: 16 for t in BABILONG_TASKS}}


def shorter_than_answer(task, length):
    """Why `task` cannot run at `length` tokens because its answer alone does not leave room for a prompt, or None."""
    if length <= ANSWER_TOKENS[task]:
        return (f"a document of {length:,} tokens leaves no room for a prompt beside the {ANSWER_TOKENS[task]} answer "
                f"tokens lm-eval generates")
    return None


def evaluation_device(device):
    """The device the evaluation will run on (eval.runtime.pick_device's choice, without its note)."""
    import torch

    if not device or (str(device).startswith("cuda") and not torch.cuda.is_available()):
        return "cuda" if not device and torch.cuda.is_available() else "cpu"
    return str(device)


def available_memory_bytes(device):
    """Bytes of memory free for this process on `device` now (CUDA: free device memory; CPU: the kernel's
    MemAvailable), or None where that cannot be known."""
    import torch

    if str(device).startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) * 1024
    except (OSError, StopIteration, ValueError):
        return None


def kv_cache_bytes_of(model, device):
    """A function n -> bytes of the KV cache of one sequence of n tokens (keys, values and every encoding's
    cached features and running state, in every layer; a layer with a sliding window keeps window - 1 slots),
    measured on a two-slot cache of the model itself, in the precision it runs in on `device` (bf16 autocast on
    CUDA)."""
    import torch

    cache = model.new_cache(1, 2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=str(device).startswith("cuda")):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache, last_logits=0)
    layers = []
    for layer in cache.layers:
        slots = layer.capacity
        per_slot = sum(t.numel() * t.element_size() for t in layer.buffers.values()) / slots if slots else 0.0
        state = sum(t.numel() * t.element_size() for t in layer.state.values())
        layers.append((per_slot, state, layer.window))

    def kv_bytes(n):
        return sum(per_slot * (n if window is None else min(window - 1, n)) + state
                   for per_slot, state, window in layers)
    return kv_bytes


def check_lengths_fit(model, lengths, device, tasks):
    """UserError for a length that cannot work: one whose KV cache for one prompt of that many tokens is more than
    the memory available on `device` beside the weights (so a batch of them cannot fit either), or one too short
    for the answer of every chosen task."""
    train = model.config.block_size

    def named(n):
        return f"{n:,} tokens ({n / train:g}x the training context of {train:,})"

    for n in lengths:
        if all(shorter_than_answer(task, n) for task in tasks):
            shortest = min(ANSWER_TOKENS[t] for t in tasks)
            answers = ", ".join(f"{t} {ANSWER_TOKENS[t]}" for t in tasks[:4]) + (", ..." if len(tasks) > 4 else "")
            raise UserError(f"--lengths asks for {named(n)}, too short for every chosen task: a document is a prompt "
                            f"plus the answer lm-eval generates within the length ({answers} tokens), so none can run "
                            f"below {shortest + 1} tokens; ask for longer --lengths")
    available = available_memory_bytes(device)
    if available is None:
        return
    free = available - sum(t.numel() * t.element_size() for t in model.state_dict().values())
    kv_bytes = kv_cache_bytes_of(model, device)
    for n in lengths:
        if kv_bytes(n) > free:
            low, high = 0, n  # kv_bytes grows with n: the longest that fits lies below n
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if kv_bytes(middle) <= free else (low, middle)
            fits = f"the longest that fits is {named(low)}" if low else "not even one token fits"
            raise UserError(f"--lengths asks for {named(n)}, and the KV cache of one prompt that long takes "
                            f"{kv_bytes(n) / 1e9:,.1f} GB, more than the {max(free, 0) / 1e9:,.1f} GB of {device} "
                            f"memory available beside the model's weights; {fits}, so ask for at most that")


def evaluate_run(ckpt, args, plan, task_manager, yaml_dir):
    """Runs every task at every length on one checkpoint; writes and returns its report."""
    import lm_eval
    import torch

    from eval.lm_adapter import GrapeLM
    from eval.long_context_tasks import check_hf_tokenizer, too_short, write_hf_tokenizer, write_task_yaml

    start = timing.clock()
    lengths, tasks, left_out = plan
    lm = GrapeLM(ckpt=ckpt, batch_size=args.batch_size, device=args.device, prefill_chunk=args.prefill_chunk)
    config = lm.model.config
    train_context = config.block_size
    name = os.path.normpath(run_dir_of(ckpt))
    # one folder per tokenizer: RULER caches the tokenizer it loads by its path
    hf_tokenizer_dir = args.tokenizer or write_hf_tokenizer(lm.tok.name, os.path.join(yaml_dir, f"tokenizer_{lm.tok.name}"),
                                                            model_max_length=1 << 30)
    check_hf_tokenizer(hf_tokenizer_dir, lm.tok)
    from transformers import AutoTokenizer
    hf_tokenizer = AutoTokenizer.from_pretrained(hf_tokenizer_dir)

    out_dir = out_dir_of(args, ckpt)
    os.makedirs(out_dir, exist_ok=True)
    report = {
        "ckpt": ckpt, "name": name, "encoding": describe_encoding({"pos": config.pos, "kv_shift": config.kv_shift}),
        "n_params": lm.model.num_params(), "step": lm.step, "train_context": train_context, "lengths": lengths,
        "tasks": list(args.tasks), "rope_scaling": args.rope_scaling,
        "rotation": any(b.attn.rotation.kind != "nope" for b in lm.model.blocks),
        "limit": args.limit, "data_dir": os.path.abspath(args.data_dir) if args.data_dir else "downloaded by lm-eval",
        "tokenizer": lm.tok.name, "hf_tokenizer": args.tokenizer or "the run's own, written by hf/tokenizer_files.py",
        "lm_eval_version": lm_eval.__version__, "device": str(lm.device),
        "scores": {task: {} for task in args.tasks}, "speed": {}, "lm_eval": {},
    }
    for task, reason in left_out.items():
        for length in lengths:
            report["scores"][task][str(length)] = {"score": None, "status": reason}

    # Progress in tokens: each document of a length counts that length (RULER builds its prompt + answer to fit it).
    planned_docs = {task: args.limit or (500 if task in RULER_TASKS else 1000) for task in tasks}
    progress = timing.Progress(f"long_context {name}", sum(planned_docs[t] * n for t in tasks for n in lengths),
                               "tokens")
    counter = Counter(progress)
    lm.on_generated = counter
    babilong_done = {}  # (task, split) -> the cell evaluated first with that split
    if any(t.startswith("niah_") for t in tasks):  # its 10-million-word list, before the first length's memory
        importlib.import_module("lm_eval.tasks.ruler.prepare_niah")
    for length in lengths:
        lm.max_length = 2 * length  # nothing is cut: RULER sizes prompt + answer to the length, BABILong about so
        counter.reset(length)
        memory_at_start = reset_peak_memory(lm.device)
        length_start, generation_start, cpu_start = timing.clock(), lm.generation_s, lm.generation_cpu_s
        report["lm_eval"][str(length)] = {}
        for task in tasks:
            done_before = progress.done
            cell = run_cell(lm, task, length, args, task_manager, yaml_dir, hf_tokenizer_dir, hf_tokenizer,
                            babilong_done, train_context, write_task_yaml, too_short, report, out_dir)
            report["scores"][task][str(length)] = cell
            left = planned_docs[task] * length - (progress.done - done_before)  # fewer documents than planned
            if left > 0:
                progress.advance(left)
        seconds, cpu_seconds = lm.generation_s - generation_start, lm.generation_cpu_s - cpu_start
        tokens = counter.prompt_tokens + counter.generated_tokens
        peak, kind = peak_memory(lm.device)
        report["speed"][str(length)] = {
            "requests": counter.requests, "prompt_tokens": counter.prompt_tokens,
            "generated_tokens": counter.generated_tokens, "model_s": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else None, "model_cpu_s": cpu_seconds,
            "tokens_per_cpu_s": tokens / cpu_seconds if cpu_seconds > 0 else None,
            "wall_s": timing.clock() - length_start,
            "memory_at_start_gb": memory_at_start, "peak_memory_gb": peak, "peak_memory_kind": kind,
            "threads": torch.get_num_threads(),
        }
        summarize(report)
        report["elapsed_s"] = timing.clock() - start
        try:
            write_report(report, out_dir)
        except OSError as error:  # (checked writable at the start): the scores so far must not be lost
            print(markdown_report(report))
            raise UserError(f"cannot write the report to {out_dir} ({error.strerror or error}), so the scores so far "
                            "are printed above instead; free space or choose another --out, then run again") from None
    return report


def run_cell(lm, task, length, args, task_manager, yaml_dir, hf_tokenizer_dir, hf_tokenizer, babilong_done,
             train_context, write_task_yaml, too_short, report, out_dir):
    """One task at one length through lm_eval.simple_evaluate; the table cell (score, documents, status)."""
    import lm_eval

    reason = shorter_than_answer(task, length)
    if reason:
        return {"score": None, "status": f"not run: {reason}"}
    if task in BABILONG_TASKS:
        split = babilong_split(length)
        if (task, split) in babilong_done:
            return dict(babilong_done[(task, split)]) | {"same_as": babilong_done[(task, split)]["length"]}
        metadata, metric = {"max_seq_lengths": split}, "acc"
    else:
        reason = too_short(task, length, hf_tokenizer)
        if reason:
            return {"score": None, "status": f"not run: {reason}"}
        split, metadata, metric = None, {"max_seq_lengths": [length], "tokenizer": hf_tokenizer_dir}, str(length)
    path = write_task_yaml(task_manager, task, os.path.join(yaml_dir, f"{task}_{length}.yaml"), metadata, args.data_dir)
    factor = length / train_context
    try:
        with rescaled_rotations(lm.model, factor, args.rope_scaling), contextlib.redirect_stdout(sys.stderr):
            results = lm_eval.simple_evaluate(model=lm, tasks=[path], task_manager=task_manager, limit=args.limit,
                                              log_samples=args.log_samples, bootstrap_iters=1000)
    except (KeyboardInterrupt, UserError):
        raise
    except Exception as error:  # e.g. RULER cannot build a document this short: the others go on
        message = " ".join(str(error).split())
        return {"score": None, "status": f"failed: {type(error).__name__}: {message[:300]}"}
    score, stderr, n = score_of(results, task, metric)
    report["lm_eval"][str(length)][task] = {"results": results["results"][task],
                                            "n-samples": results.get("n-samples", {}).get(task),
                                            "version": results.get("versions", {}).get(task)}
    if args.log_samples:
        write_samples(results.get("samples", {}).get(task, []), os.path.join(
            out_dir, "long_context_samples", f"{task}_{length}.jsonl"))
    cell = {"score": score, "stderr": stderr, "n": n, "status": "ok" if score is not None else "no score",
            "metric": metric, "length": length, "prompts_cut": lm.prompts_cut}
    if split is not None:
        cell["split"] = split
        babilong_done[(task, split)] = cell
    return cell


def write_samples(samples, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = [json.dumps({"doc_id": s["doc_id"], "prompt": s["arguments"][0][0], "answer": s["resps"][0][0],
                         "target": s["target"], "metrics": {m: s[m] for m in s.get("metrics", []) if m in s}},
                        default=str) for s in samples]
    write_atomic(path, "\n".join(lines) + "\n")


def summarize(report):
    """RULER's average (over its 13 tasks) and BABILong's (qa1-qa5) per length, from the cells."""
    for key, family in (("ruler", RULER_TASKS), ("babilong", BABILONG_TASKS)):
        chosen = [t for t in report["tasks"] if t in family]
        averages, counts = {}, {}
        for length in report["lengths"]:
            scores = [report["scores"][t].get(str(length), {}).get("score") for t in chosen]
            scores = [s for s in scores if s is not None]
            averages[str(length)] = sum(scores) / len(scores) if scores else None
            counts[str(length)] = len(scores)
        report[f"{key}_average"], report[f"{key}_average_tasks"] = averages, counts


# ----------------------------------------------------------------------------- reports

def write_report(report, out_dir):
    write_atomic(os.path.join(out_dir, "long_context.json"), json.dumps(report, indent=2, default=str) + "\n")
    write_atomic(os.path.join(out_dir, "long_context.md"), markdown_report(report))


def fmt(value, digits=1):
    return "–" if value is None else f"{value:.{digits}f}"


def markdown_report(report):
    lengths = report["lengths"]
    train = report["train_context"]
    header = "| task | " + " | ".join(f"{n:,} ({n / train:g}×)" for n in lengths) + " |"
    rule = "|---|" + "---:|" * len(lengths)
    limit = f"the first {report['limit']} documents" if report["limit"] else "all documents"
    positions = ROPE_SCALINGS[report["rope_scaling"]] if report["rotation"] else "as trained (no rotation to rescale)"
    lines = [f"Long-context accuracy (%) of `{report['ckpt']}` ({report['encoding']}, "
             f"{report['n_params'] / 1e6:.2f}M parameters, step {report['step']}, trained at {train:,} tokens), "
             f"lm-eval {report['lm_eval_version']}, {limit} per task and length. Positions: {positions} "
             f"(`--rope-scaling {report['rope_scaling']}`).", ""]
    notes = {}  # (task, why) -> the lengths it applies to

    def cell_text(task, length):
        cell = report["scores"][task].get(str(length))
        if cell is None:
            return "…"  # not reached yet
        if cell.get("score") is None:
            notes.setdefault((task, cell["status"]), []).append(length)
            return "–"
        text = fmt(cell["score"])
        if "split" in cell:
            text += f" ({cell['split']})"
        return text

    ruler = [t for t in report["tasks"] if t in RULER_TASKS]
    babilong = [t for t in report["tasks"] if t in BABILONG_TASKS]
    for family, chosen, key, full in (("RULER", ruler, "ruler", len(RULER_TASKS)),
                                      ("BABILong", babilong, "babilong", len(BABILONG_TASKS))):
        if not chosen:
            continue
        lines += [f"**{family}**", "", header, rule]
        for task in chosen:
            lines.append(f"| {task} | " + " | ".join(cell_text(task, n) for n in lengths) + " |")
        averages, counts = report.get(f"{key}_average", {}), report.get(f"{key}_average_tasks", {})
        cells = []
        for n in lengths:
            count = counts.get(str(n), 0)
            value = fmt(averages.get(str(n)))
            cells.append(value if count == full or value == "–" else f"{value} ({count} of {full})")
        label = f"{family} average ({full} tasks)" if family == "RULER" else f"{family} average (qa1-qa5)"
        lines += [f"| **{label}** | " + " | ".join(cells) + " |", ""]
    if babilong:
        lines.append("BABILong cells name the split each length reads (the longest built for at most that many "
                     "tokens); a split shared by several lengths is evaluated once.")
    lines.append("An average over fewer tasks than the family has says how many; it is not comparable with "
                 "published averages.")
    if notes:
        lines += ["", "Cells without a score:", ""]
        for (task, why), at in notes.items():
            where = "every length" if len(at) == len(lengths) else ", ".join(f"{n:,}" for n in at)
            lines.append(f"- {task} at {where}: {why}")
    speed = report.get("speed", {})
    if speed:
        lines += ["", "| length | requests | prompt tokens | generated tokens | model time (s) | tokens/s | "
                      "tokens per CPU-second | wall time (s) | memory at start (GB) | peak memory (GB) |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n in lengths:
            s = speed.get(str(n))
            if s:
                lines.append(f"| {n:,} | {s['requests']} | {s['prompt_tokens']:,} | {s['generated_tokens']:,} | "
                             f"{s['model_s']:.1f} | {fmt(s['tokens_per_s'], 0)} | {fmt(s.get('tokens_per_cpu_s'), 0)} | "
                             f"{s['wall_s']:.1f} | {fmt(s.get('memory_at_start_gb'), 2)} | {s['peak_memory_gb']:.2f} |")
        first = next(iter(speed.values()))
        lines += ["", f"tokens/s: prompt and generated tokens over the time in the model's generate calls "
                      f"({report['device']}, {first.get('threads', '?')} threads); per CPU-second: over the CPU time "
                      "this process spent there, all threads (on a shared machine the wall-clock rate falls with the "
                      "load, this one much less); wall time also counts lm-eval "
                      f"building the documents. Memory: {first['peak_memory_kind']}, and what was in use when the "
                      "length started (on the CPU, with RULER's needle tasks, that includes lm-eval's word list of "
                      "about 1.1 GB, built once before the first length)."]
    return "\n".join(lines) + "\n"


def plot_accuracy_vs_length(reports, path):
    """RULER and BABILong averages against context length, one line per run (dashed vertical: training context)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [(key, label) for key, label in (("ruler", "RULER"), ("babilong", "BABILong"))
                if any(r.get(f"{key}_average") and any(v is not None for v in r[f"{key}_average"].values())
                       for r in reports)]
    if not families:
        return None
    fig, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 4), squeeze=False)
    for ax, (key, label) in zip(axes[0], families):
        for i, r in enumerate(reports):
            points = [(n, r[f"{key}_average"].get(str(n)), r[f"{key}_average_tasks"].get(str(n), 0))
                      for n in r["lengths"]]
            points = [(n, v, c) for n, v, c in points if v is not None]
            if not points:
                continue
            line, = ax.plot([n for n, _, _ in points], [v for _, v, _ in points], marker="o",
                            label=r.get("label") or f"{r['name']} ({r['encoding']})")
            ax.axvline(r["train_context"], color=line.get_color(), linestyle="--", linewidth=0.8)
            for n, v, c in points:
                ax.annotate(str(c), (n, v), textcoords="offset points", xytext=(0, 5), fontsize=7, ha="center")
        ax.set_xscale("log", base=2)
        ticks = sorted({n for r in reports for n in r["lengths"]} | {r["train_context"] for r in reports})
        ax.set_xticks(ticks, [f"{n:,}" for n in ticks])
        ax.minorticks_off()
        ax.set_xlabel("context length (tokens); dashed: training context")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.set_title(f"{label}: mean over its tasks (number of tasks at each point)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_figure(fig, path)
    return path


# ----------------------------------------------------------------------------- main

def run(args):
    from eval.long_context_tasks import task_manager as make_task_manager

    plans = [plan_run(ckpt, args) for ckpt in args.ckpt]  # every data problem before lm-eval's slow start
    check_writable(os.path.dirname(os.path.abspath(plot_path(args))), "the plot", "--plot")
    use_local_nltk_data(args.data_dir)  # before lm-eval imports RULER, which otherwise tries to download it
    task_manager = make_task_manager()
    reports = []
    with tempfile.TemporaryDirectory(prefix="grape_long_context_") as yaml_dir:
        for ckpt, plan in zip(args.ckpt, plans):
            reports.append(evaluate_run(ckpt, args, plan, task_manager, yaml_dir))
    return reports


def read_reports(args):
    reports = []
    for ckpt in args.ckpt:
        path = os.path.join(out_dir_of(args, ckpt), "long_context.json")
        try:
            reports.append(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError):
            raise UserError(f"no readable {path}: evaluate that run first (without --report-only)") from None
    return reports


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.export_data:
            from eval.long_context_tasks import export_data
            from eval.zero_shot import is_connection_error

            try:
                for line in export_data(args.export_data, args.babilong_splits):
                    print(f"wrote {line}")
            except Exception as error:
                if is_connection_error(error) or isinstance(error, ConnectionError):
                    raise UserError("could not download the data: --export-data needs internet access; run it on a "
                                    "connected machine and copy the folder") from None
                raise
            return None
        if args.report_only:
            reports = read_reports(args)
            for report in reports:
                check_writable(out_dir_of(args, report["ckpt"]), "the report")
            check_writable(os.path.dirname(os.path.abspath(plot_path(args))), "the plot", "--plot")
        else:
            reports = run(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    for report in reports:
        out_dir = out_dir_of(args, report["ckpt"])
        if args.report_only:
            write_report(report, out_dir)
        print(markdown_report(report))
    written = plot_accuracy_vs_length(reports, plot_path(args))
    where = ", ".join(os.path.join(out_dir_of(args, r["ckpt"]), "long_context.{json,md}") for r in reports)
    print(f"wrote {where}" + (f" and {written}" if written else " (no scores to plot)"))
    unscored = [(r, n) for r in reports for n in r["lengths"]
                if r["tasks"] and all(r["scores"][t].get(str(n), {}).get("score") is None for t in r["tasks"])]
    if unscored and not args.report_only:
        report, n = unscored[0]
        why = report["scores"][report["tasks"][0]].get(str(n), {}).get("status", "not reached").split(". ")[0]
        print(f"error: no task got a score at {n:,} tokens ({n / report['train_context']:g}x) of {report['ckpt']}"
              + (f" and at {len(unscored) - 1} more length(s)" if len(unscored) > 1 else "")
              + f" ({report['tasks'][0]}: {why[:200]}; each cell's reason is in "
              f"{os.path.join(out_dir_of(args, report['ckpt']), 'long_context.md')}); evaluate longer --lengths or "
              "other --tasks",
              file=sys.stderr)
        sys.exit(1)
    return reports


def plot_path(args):
    return args.plot or os.path.join(out_dir_of(args, args.ckpt[0]), "long_context.png")


if __name__ == "__main__":
    main()
