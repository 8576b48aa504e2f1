"""lm-evaluation-harness's own command line, with this project's model registered as `grape`.

    python -m eval.lm_eval_cli --model grape --model_args ckpt=runs/medium/rope --tasks hellaswag,arc_easy
    python -m eval.lm_eval_cli --model grape --model_args ckpt=RUN --tasks piqa,sciq --data-dir DIR \\
        --batch_size 16 --limit 100 --output_path OUT --log_samples
    python -m eval.lm_eval_cli --model hf --model_args pretrained=EXPORT_DIR,trust_remote_code=True \\
        --tasks piqa,sciq --data-dir DIR --device cpu     # a Hugging Face export (scripts/export_hf.py)

    python -m eval.lm_eval_cli --model grape --model_args ckpt=RUN --tasks niah_single_1,ruler_vt \
        --metadata '{"max_seq_lengths":[4096,8192]}' --data-dir DIR         # RULER, offline (eval/long_context.py)

This imports the adapter (eval/lm_adapter.py, which registers the model name) and hands the arguments to
lm-eval's entry point, so every `lm-eval run` flag works as lm-eval documents it (`--model_args` also takes
`max_length`, `rolling_stride` and `prefill_chunk`). One flag is ours: `--data-dir DIR` reads the paper's seven
tasks named in --tasks from DIR/<task>.jsonl (hub schema, as `eval/zero_shot.py --data-dir`) and the data RULER's
and BABILong's tasks download from DIR's folder made by `eval/long_context.py --export-data DIR`, instead of the
network; other tasks come from lm-eval as usual. For RULER tasks with `--model grape`, the run's own tokenizer is
handed to RULER as Hugging Face files (`tokenizer=` in --model_args, unless given) and max_length defaults to the
longest of --metadata's max_seq_lengths (RULER's 4096 without it), so no prompt is cut. Without --output_path the results go to the run's own eval/ folder,
RUN_DIR/eval/lm_eval_<date>.json (lm-eval alone would save nothing); with --output_path FOLDER, for --model grape,
to FOLDER/<run>/results_<date>.json, the subfolder named after ckpt= as lm-eval names it after pretrained=
(runs/medium/rope -> runs__medium__rope; lm-eval alone would pick a random name). The file written is printed.
lm-eval asks for cuda:0 when --device is not given: without CUDA the adapter runs on the CPU and says so.
"""
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import from the repo root, not from eval/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from config import UserError  # noqa: E402
from eval.tasks import ZERO_SHOT_TASKS, check_data_file, expected_files_message  # noqa: E402


def take_option(argv, name):
    """(value of `name` given as `name VALUE` or `name=VALUE`, argv without it); value None if absent."""
    rest, value, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == name:
            if i + 1 >= len(argv):
                raise UserError(f"{name} needs a value")
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return value, rest


def with_local_task_files(argv, data_dir, yaml_dir):
    """argv with each of our seven tasks in --tasks replaced by a task YAML that reads DIR/<task>.jsonl."""
    from lm_eval.tasks import TaskManager

    from eval.tasks import write_offline_task_yamls

    tasks, rest = take_option(argv, "--tasks")
    if tasks is None:
        raise UserError("--data-dir needs --tasks naming some of: " + ",".join(ZERO_SHOT_TASKS))
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    local = [t for t in names if t in ZERO_SHOT_TASKS]
    if not local:  # long-context tasks only: prepare_long_context reads DIR
        return argv
    if not Path(data_dir).is_dir():
        raise UserError(f"--data-dir {data_dir} is not a directory.\n" + expected_files_message())
    problems = [p for p in (check_data_file(t, str(Path(data_dir) / f"{t}.jsonl")) for t in local) if p]
    if problems:
        raise UserError("; ".join(problems) + ".\n" + expected_files_message(data_dir))
    paths = dict(zip(local, write_offline_task_yamls(TaskManager(), local, data_dir, yaml_dir)))
    return rest + ["--tasks", ",".join(paths.get(t, t) for t in names)]


def task_names(tasks):
    """lm-eval's --tasks value (a string or a list of them, comma-separated) as a list of names."""
    items = [tasks] if isinstance(tasks, str) else list(tasks or [])
    return [t.strip() for item in items for t in item.split(",") if t.strip()]


def prepare_long_context(args, data_dir, yaml_dir):
    """RULER and BABILong as eval/long_context.py runs them: for `--model grape`, the run's tokenizer as the
    Hugging Face files RULER sizes its documents with and max_length large enough for them; with --data-dir, the
    tasks that download data read it from DIR. Offline without the data: one error naming the files."""
    from eval.long_context_tasks import (BABILONG_SPLITS, BABILONG_TASKS, LONG_CONTEXT_TASKS, RULER_TASKS, TASK_GROUPS,
                                         missing_files, missing_files_sentence, needed_files, use_local_nltk_data,
                                         write_task_yaml)

    groups = TASK_GROUPS | {"babilong_longctx": BABILONG_TASKS}
    names = task_names(args.tasks)
    expanded = [t for name in names for t in (groups.get(name, (name,)) if data_dir else (name,))]
    chosen = [t for name in names for t in groups.get(name, (name,)) if t in LONG_CONTEXT_TASKS]
    if not chosen:
        return
    metadata = dict(args.model_args or {}) | dict(getattr(args, "metadata", None) or {})
    lengths = metadata.get("max_seq_lengths")
    if lengths is not None and any(t in BABILONG_TASKS for t in chosen) and not (
            isinstance(lengths, str) and lengths in BABILONG_SPLITS):
        raise UserError(f"BABILong reads one split, named in --metadata max_seq_lengths (one of "
                        f"{', '.join(BABILONG_SPLITS)}), while RULER takes a list of lengths (got {lengths!r}): run "
                        "them in separate commands, or use eval/long_context.py, which runs both at each length")
    if data_dir is None:
        from eval.long_context import hub_offline_reason

        offline = hub_offline_reason() if any(needed_files(t) for t in chosen) else None
        if offline:
            missing = missing_files(chosen, [lengths if isinstance(lengths, str) else "0k"], None)
            raise UserError(f"{offline}, and " + missing_files_sentence(missing, None, skip_option=False) + ".")
    else:
        use_local_nltk_data(data_dir)
        missing = missing_files(chosen, [lengths if isinstance(lengths, str) else "0k"], data_dir)
        if missing:
            raise UserError(missing_files_sentence(missing, data_dir, skip_option=False) + ".")
        from eval.long_context_tasks import task_manager as make_task_manager

        task_manager = make_task_manager()
        args.tasks = ",".join(write_task_yaml(task_manager, t, os.path.join(yaml_dir, f"{t}.yaml"), data_dir=data_dir)
                              if t in chosen and needed_files(t) else t for t in expanded)
    model_args = args.model_args if isinstance(args.model_args, dict) else {}
    if args.model != "grape" or not model_args.get("ckpt"):
        return
    ruler = any(t in RULER_TASKS for t in chosen)
    if ruler and "tokenizer" not in metadata:
        from checkpoints import load_model
        from eval.long_context_tasks import write_hf_tokenizer

        _, tokenizer, _ = load_model(model_args["ckpt"], "cpu")
        model_args["tokenizer"] = write_hf_tokenizer(tokenizer.name, os.path.join(yaml_dir, "tokenizer"), 1 << 30)
    if "max_length" not in model_args:  # nothing cut: RULER sizes prompt + answer to the length; BABILong about so
        needed = [max(lengths) if isinstance(lengths, list) and lengths else 4096] if ruler else []
        if any(t in BABILONG_TASKS for t in chosen):
            needed.append(max(2048, 2 * BABILONG_SPLITS[lengths if isinstance(lengths, str) else "0k"]))
        model_args["max_length"] = max(needed)
    args.model_args = model_args


def default_output_path(args):
    """lm-eval saves nothing without --output_path: for our model, RUN_DIR/eval/lm_eval.json (lm-eval adds the
    date: RUN_DIR/eval/lm_eval_<date>.json, and samples_<task>_<date>.jsonl beside it with --log_samples)."""
    if args.output_path or getattr(args, "config", None) or args.model != "grape":
        return args.output_path
    ckpt = (args.model_args or {}).get("ckpt")
    if not ckpt:
        return None
    run_dir = ckpt if os.path.isdir(ckpt) else os.path.dirname(ckpt)
    return os.path.join(run_dir, "eval", "lm_eval.json")


def named_output_path(args):
    """--output_path as lm-eval will use it. Given a folder, lm-eval writes FOLDER/<model>/results_<date>.json,
    <model> being the pretrained=/path= value of --model_args; `ckpt=` is none of its keys, so for our model it
    picks a random name (FOLDER/i82qcls7/). For `--model grape` the folder is named after the run instead, as
    lm-eval names it after `pretrained=` (the same sanitising: runs/medium/rope -> runs__medium__rope): a
    FOLDER/<run>/results.json path, which lm-eval turns into FOLDER/<run>/results_<date>.json."""
    from lm_eval.utils import sanitize_model_name

    path = args.output_path
    ckpt = (args.model_args or {}).get("ckpt") if isinstance(args.model_args, dict) else None
    if not path or args.model != "grape" or not ckpt or Path(path).suffix == ".json":
        return path
    return os.path.join(path, sanitize_model_name(str(ckpt)), "results.json")


def results_written_since(output_path: str, started: float) -> list[str]:
    """The results files lm-eval wrote under output_path (a file name it dates, or a folder it adds a subfolder
    of its own naming to) since `started`, newest last."""
    folder = output_path if os.path.isdir(output_path) else os.path.dirname(os.path.abspath(output_path))
    found = []
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".json") and (name.startswith("results") or name.startswith("lm_eval")) \
                    and os.path.getmtime(path) >= started:
                found.append(path)
    return sorted(found, key=os.path.getmtime)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["-h"], ["--help"]):  # our flag and default first, then the options of `lm-eval run`
        print(__doc__.strip() + "\n\nThe options of lm-eval's own command line (`lm-eval run`):\n")
        argv = ["run", "--help"]
    try:
        data_dir, argv = take_option(argv, "--data-dir")
        from eval.lm_adapter import model_args_problem  # (the import registers the model name "grape")
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging

        with tempfile.TemporaryDirectory(prefix="grape_tasks_") as yaml_dir:
            if data_dir is not None:
                argv = with_local_task_files(argv, data_dir, yaml_dir)
            sys.argv = ["lm-eval", *argv]  # lm-eval's parser reads sys.argv
            # lm_eval.__main__.cli_evaluate, with our default output path set between parsing and running
            setup_logging()
            cli = HarnessCLI()
            args = cli.parse_args()
            if getattr(args, "command", None) == "run":
                if args.model == "grape" and not getattr(args, "config", None):  # (a --config file may hold them)
                    problem = model_args_problem(args.model_args)
                    if problem:  # before lm-eval's slow start, which would end in GrapeLM's traceback
                        raise UserError(problem)
                prepare_long_context(args, data_dir, yaml_dir)
                args.output_path = named_output_path(args) if args.output_path else default_output_path(args)
                if args.output_path:
                    print(f"results go to {args.output_path} (with the date added to the name)", file=sys.stderr)
            started = time.time()
            cli.execute(args)
            if getattr(args, "command", None) == "run" and args.output_path:
                written = results_written_since(args.output_path, started)
                if written:  # lm-eval adds the date (and for other models a subfolder): say where it went
                    print(f"results written to {', '.join(written)}", file=sys.stderr)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
