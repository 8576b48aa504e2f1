"""Zero-shot evaluation on the paper's seven tasks with lm-evaluation-harness, beside the paper's numbers.

    python eval/zero_shot.py --ckpt runs/medium_rope --data-dir /data/zero_shot   # offline, local JSONL
    python eval/zero_shot.py --ckpt runs/medium_rope                              # tasks from the hub
    python eval/zero_shot.py --export-data /data/zero_shot                        # (online) fetch the JSONL

Writes OUT/zero_shot.json and OUT/zero_shot.md (OUT defaults to RUN_DIR/eval) and prints the table:
acc and acc_norm for every task, and the 7-task average of one metric per task. The paper does not name
its metric. By default (--metric convention) the average follows the field's convention, that of the
Forgetting Transformer's evaluation on which the paper's builds (and of the Mamba, GLA and DeltaNet
papers): acc for ARC-E, PIQA, SciQ and WinoGrande, acc_norm for ARC-C, HellaSwag and OpenBookQA.
--metric acc_norm averages acc_norm wherever lm-eval defines it (WinoGrande has only acc), --metric acc
averages acc everywhere; the JSON holds all three averages. While lm-eval scores, stderr gets progress lines
(padded tokens through the model, elapsed time, ETA); the JSON records the seconds taken (elapsed_s).
"""
import json
import math
import os
import socket
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import from the repo root, not from eval/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from config import UserError  # noqa: E402
from eval.runtime import describe_encoding  # noqa: E402
from eval import progress as timing  # noqa: E402
from eval.cli import make_parser  # noqa: E402
from eval.outputs import check_writable, unwritten, write_atomic  # noqa: E402
from eval.tasks import ZERO_SHOT_TASKS, check_data_file, expected_files_message  # noqa: E402

PAPER_RESULTS = Path(__file__).resolve().parent / "paper_results.json"  # copy of the paper's Tables 1-2
# The metric averaged per task, for each --metric choice.
AVERAGE_METRICS = {
    "convention": {"arc_easy": "acc", "arc_challenge": "acc_norm", "hellaswag": "acc_norm", "openbookqa": "acc_norm",
                   "piqa": "acc", "winogrande": "acc", "sciq": "acc"},
    "acc_norm": {task: "acc_norm" for task in ZERO_SHOT_TASKS} | {"winogrande": "acc"},  # it has no acc_norm
    "acc": {task: "acc" for task in ZERO_SHOT_TASKS},
}
METRIC_DESCRIPTIONS = {
    "convention": "the field's convention: acc for ARC-E, PIQA, SciQ and WinoGrande, acc_norm for ARC-C, "
                  "HellaSwag and OpenBookQA",
    "acc_norm": "acc_norm for every task but WinoGrande (acc; it has no acc_norm)",
    "acc": "acc for every task",
}
PAPER_SIZES = {"medium_353M": 353e6, "large_770M": 770e6}
PAPER_TOKENS = 50e9  # the paper's models were "pre-trained on 50B tokens" (paper_results.json's source)


def build_parser():
    p = make_parser(__doc__)
    p.add_argument("--ckpt", help="run directory holding ckpt.pt, or a checkpoint file (required, except with "
                                  "--export-data)")
    p.add_argument("--tasks", default=",".join(ZERO_SHOT_TASKS),
                   help="comma-separated subset of: " + ",".join(ZERO_SHOT_TASKS))
    p.add_argument("--data-dir", help="directory with <task>.jsonl in the hub schema, for offline evaluation "
                                      "(default: the tasks from the Hugging Face hub)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass")
    p.add_argument("--limit", type=int, default=None,
                   help="evaluate only the first N documents per task (default: all)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--out", help="output directory (default: RUN_DIR/eval)")
    p.add_argument("--metric", choices=list(AVERAGE_METRICS), default="convention",
                   help="metric averaged per task: convention (default: acc for ARC-E, PIQA, SciQ, WinoGrande; "
                        "acc_norm for ARC-C, HellaSwag, OBQA), acc_norm (wherever defined) or acc")
    p.add_argument("--paper-size", choices=["auto", *PAPER_SIZES], default="auto",
                   help="paper table to compare with (auto: the size nearest to this model's)")
    p.add_argument("--log-samples", action="store_true",
                   help="also write OUT/samples_<task>.jsonl: per-document choice loglikelihoods")
    p.add_argument("--export-data", metavar="DIR",
                   help="(needs internet) write each task's evaluation split to DIR/<task>.jsonl and exit "
                        "(default: evaluate --ckpt)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in args.tasks if t not in ZERO_SHOT_TASKS]
    if unknown:
        p.error(f"unknown task(s) {unknown}; choose from {', '.join(ZERO_SHOT_TASKS)}")
    if args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        p.error(f"--batch-size and --limit must be at least 1 (got {args.batch_size} and {args.limit})")
    if not args.ckpt and not args.export_data:
        p.error("--ckpt RUN_DIR is required")
    return args


def hub_is_offline():
    return any(os.environ.get(v, "0").lower() in ("1", "true", "yes")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_unreachable(timeout_s=3.0):
    """None when a TCP connection to the hub (HF_ENDPOINT, or the HTTPS proxy when one is set) opens within
    timeout_s, else "host:port: why not". Offline, the datasets library retries for about 23 s before it fails."""
    url = urllib.parse.urlsplit(urllib.request.getproxies().get("https")
                                or os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return None
    except OSError as error:
        return f"{host}:{port}: {error.strerror or error or type(error).__name__}"


def is_connection_error(error):
    names = {type(e).__name__ for e in _error_chain(error)}
    return bool(names & {"ConnectionError", "OfflineModeIsEnabled", "LocalEntryNotFoundError",
                         "ConnectTimeout", "ReadTimeout", "MaxRetryError", "NameResolutionError"})


def _error_chain(error):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def pick_paper_size(n_params, requested):
    if requested != "auto":
        return requested
    return min(PAPER_SIZES, key=lambda size: abs(math.log(PAPER_SIZES[size] / n_params)))


def summarize(results, tasks, metric="convention"):
    """Per-task acc / acc_norm (in %) from lm-eval's results dict, and the average of each --metric choice.
    Returns (rows, {choice: average}); each row's "score" is the metric averaged under `metric`."""
    rows = {}
    for task in tasks:
        r = results["results"][task]
        row = {"n": int(results.get("n-samples", {}).get(task, {}).get("effective", 0)),
               "average_metric": AVERAGE_METRICS[metric][task]}
        for name in ("acc", "acc_norm"):
            if f"{name},none" in r:
                row[name] = 100.0 * r[f"{name},none"]
                stderr = r.get(f"{name}_stderr,none")
                row[f"{name}_stderr"] = 100.0 * stderr if isinstance(stderr, (int, float)) else None
        row["score"] = row[row["average_metric"]]
        rows[task] = row
    averages = {choice: sum(rows[t][chosen[t]] for t in tasks) / len(tasks) for choice, chosen in AVERAGE_METRICS.items()}
    return rows, averages


def paper_row(encoding, size):
    table = json.loads(PAPER_RESULTS.read_text())
    values = table.get(size, {}).get(encoding)
    if values is None:
        return None
    return dict(zip(table["columns"], values))


def markdown_table(report):
    size, encoding = report["paper_size"], report["encoding"]
    paper = report["paper"]
    header = f"paper {size.replace('_', ' ')} {encoding}"
    lines = [
        f"Zero-shot accuracy (%) of `{report['ckpt']}` ({encoding}, {report['n_params'] / 1e6:.2f}M parameters, "
        f"step {report['step']}){' on the first ' + str(report['limit']) + ' documents per task' if report['limit'] else ''}.",
        "",
        f"| task | docs | acc | acc_norm | ours (metric averaged) | {header} |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    fmt = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    for task, row in report["tasks"].items():
        theirs = paper.get(task) if paper else None
        lines.append(f"| {task} | {row['n']} | {fmt(row.get('acc'))} | {fmt(row.get('acc_norm'))} | "
                     f"{fmt(row['score'])} ({row['average_metric']}) | {fmt(theirs)} |")
    complete = len(report["tasks"]) == len(ZERO_SHOT_TASKS)
    label = "7-task average" if complete else f"average of {len(report['tasks'])} tasks (not the paper's 7)"
    theirs = paper.get("avg") if paper and complete else None
    lines.append(f"| **{label}** | | | | **{fmt(report['average'])}** | {fmt(theirs)} |")
    lines.append("")
    if paper is None:
        lines.append(f"The paper has no {size} row for {encoding}.")
    others = ", ".join(f"{report['averages'][m]:.2f} with `--metric {m}`" for m in AVERAGE_METRICS if m != report["metric"])
    lines.append(f"The average uses {METRIC_DESCRIPTIONS[report['metric']]} (`--metric {report['metric']}`); the same "
                 f"scores average {others}. The paper does not name its metric; the default, `--metric convention`, "
                 "is the convention of the Forgetting Transformer's evaluation, on which the paper's builds.")
    return "\n".join(lines) + "\n"


def write_samples(results, out_dir):
    for task, samples in (results.get("samples") or {}).items():
        lines = []
        for s in samples:
            lines.append(json.dumps({
                "doc_id": s["doc_id"], "target": s["target"],
                "loglikelihoods": [float(r[0]) for r in s["filtered_resps"]],
                "arguments": [list(a) if isinstance(a, tuple) else a for a in s["arguments"]],
            }))
        write_atomic(os.path.join(out_dir, f"samples_{task}.jsonl"), "\n".join(lines) + "\n")


def run(args):
    out_dir = args.out or os.path.join(args.ckpt if os.path.isdir(args.ckpt) else os.path.dirname(args.ckpt), "eval")
    # said before the evaluation, whose scores would be lost after it
    check_writable(out_dir, "the results", folder="the results folder")
    if args.data_dir and not os.path.isdir(args.data_dir):
        raise UserError(f"--data-dir {args.data_dir} is not a directory.\n" + expected_files_message())
    if args.data_dir:
        problems = [check_data_file(t, os.path.join(args.data_dir, f"{t}.jsonl")) for t in args.tasks]
        problems = [p for p in problems if p]
        if problems:
            raise UserError("; ".join(problems) + ".\n" + expected_files_message(args.data_dir))
    elif hub_is_offline():
        raise UserError("the Hugging Face hub is offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set), so "
                        "the task data must come from local files: pass --data-dir DIR.\n"
                        + expected_files_message())
    elif unreachable := hub_unreachable():
        raise UserError(f"the Hugging Face hub cannot be reached ({unreachable}), so the task data must come from "
                        "local files: pass --data-dir DIR (or set HF_DATASETS_OFFLINE=1 to use tasks already in "
                        "the Hugging Face cache).\n" + expected_files_message())

    import lm_eval
    from lm_eval.tasks import TaskManager

    from eval.lm_adapter import GrapeLM
    from eval.tasks import write_offline_task_yamls

    start = timing.clock()
    lm = GrapeLM(ckpt=args.ckpt, batch_size=args.batch_size, device=args.device)
    task_manager = TaskManager()
    with tempfile.TemporaryDirectory(prefix="grape_tasks_") as yaml_dir:
        if args.data_dir:
            task_specs = write_offline_task_yamls(task_manager, args.tasks, args.data_dir, yaml_dir)
        else:
            task_specs = list(args.tasks)
        try:
            results = lm_eval.simple_evaluate(model=lm, tasks=task_specs, task_manager=task_manager,
                                              num_fewshot=0, limit=args.limit, batch_size=args.batch_size,
                                              log_samples=args.log_samples, bootstrap_iters=1000)
        except Exception as error:
            if not args.data_dir and is_connection_error(error):
                raise UserError("could not download the task data from the Hugging Face hub (no network?): "
                                "pass --data-dir DIR with local copies.\n" + expected_files_message()) from None
            raise

    model_config = lm.model.config
    encoding = describe_encoding({"pos": model_config.pos, "kv_shift": model_config.kv_shift})
    n_params = lm.model.num_params()
    size = pick_paper_size(n_params, args.paper_size)
    rows, averages = summarize(results, args.tasks, args.metric)
    report = {
        "ckpt": args.ckpt, "encoding": encoding, "n_params": n_params, "step": lm.step,
        "limit": args.limit, "data_dir": os.path.abspath(args.data_dir) if args.data_dir else "hub",
        "tasks": rows, "metric": args.metric, "average": averages[args.metric], "averages": averages,
        "average_metric": AVERAGE_METRICS[args.metric],
        "paper_size": size, "paper": paper_row(encoding, size),
        "lm_eval_version": lm_eval.__version__, "elapsed_s": timing.clock() - start,
    }
    table = markdown_table(report)
    try:
        os.makedirs(out_dir, exist_ok=True)
        write_atomic(os.path.join(out_dir, "zero_shot.json"), json.dumps(report, indent=2) + "\n")
        write_atomic(os.path.join(out_dir, "zero_shot.md"), table)
        if args.log_samples:
            write_samples(results, out_dir)
    except OSError as error:  # (checked writable before): the disk filled; the JSON holds every score
        print(table)
        print(json.dumps(report, indent=2))
        raise UserError(unwritten("the results", out_dir, error)) from None
    print(table)
    print(f"wrote {os.path.join(out_dir, 'zero_shot.json')} and zero_shot.md "
          f"({timing.duration(report['elapsed_s'])} for {len(args.tasks)} tasks)")
    return report


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.export_data:
            from lm_eval.tasks import TaskManager

            from eval.tasks import export_hub_data

            try:
                export_hub_data(TaskManager(), args.tasks, args.export_data)
            except Exception as error:
                if is_connection_error(error):
                    raise UserError("could not reach the Hugging Face hub: --export-data needs internet "
                                    "access; run it on a connected machine and copy the files") from None
                raise
            return None
        return run(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
