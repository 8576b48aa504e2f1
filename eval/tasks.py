"""The paper's seven zero-shot tasks as lm-eval task YAMLs that read local JSONL files.

Each generated YAML `include:`s lm-eval's own task definition (prompts, choices, metrics stay
stock) and overrides only where the documents come from: dataset_path json, absolute data_files for
the split lm-eval evaluates, and no other splits (lm-eval would otherwise try to load a 'train'
split even at 0-shot).
"""
import json
import os

import yaml

ZERO_SHOT_TASKS = ("arc_easy", "arc_challenge", "hellaswag", "openbookqa", "piqa", "winogrande", "sciq")

# Hub dataset and the fields lm-eval's task definition reads, per task (for messages and checks).
HUB_SCHEMA = {
    "arc_easy": ("allenai/ai2_arc ARC-Easy, test split", ["question", "choices", "answerKey"]),
    "arc_challenge": ("allenai/ai2_arc ARC-Challenge, test split", ["question", "choices", "answerKey"]),
    "hellaswag": ("Rowan/hellaswag, validation split", ["activity_label", "ctx_a", "ctx_b", "endings", "label"]),
    "openbookqa": ("allenai/openbookqa main, test split", ["question_stem", "choices", "answerKey"]),
    "piqa": ("baber/piqa, validation split", ["goal", "sol1", "sol2", "label"]),
    "winogrande": ("allenai/winogrande winogrande_xl, validation split", ["sentence", "option1", "option2", "answer"]),
    "sciq": ("allenai/sciq, test split",
             ["question", "distractor1", "distractor2", "distractor3", "correct_answer", "support"]),
}


def expected_files_message(data_dir=None):
    lines = [f"  {task}.jsonl  ({source}; fields: {', '.join(fields)})"
             for task, (source, fields) in HUB_SCHEMA.items()]
    where = f" in {data_dir}" if data_dir else ""
    return ("--data-dir must hold one JSONL file per task" + where + ", one hub-schema row per line:\n"
            + "\n".join(lines)
            + "\nOn a machine with internet access, `python -m eval.zero_shot --export-data DIR` writes them.")


def stock_yaml_path(task_manager, task):
    """Path of lm-eval's own YAML for `task` (TaskManager().task_index; a dict in older 0.4.x)."""
    entry = task_manager.task_index.get(task)
    if entry is None:
        raise KeyError(f"lm-eval has no task named {task!r}")
    path = entry["yaml_path"] if isinstance(entry, dict) else entry.yaml_path
    return os.path.abspath(str(path))


def evaluation_split(stock_config):
    """The split lm-eval scores zero-shot: test when the task has one, else validation."""
    return stock_config.get("test_split") or stock_config.get("validation_split")


class _TaskYamlLoader(yaml.SafeLoader):
    """Reads lm-eval task YAMLs without importing the functions their !function tags name."""


_TaskYamlLoader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


def read_stock_config(yaml_path):
    """The stock task's YAML with its `include:`s merged (local keys win), as lm-eval merges them."""
    with open(yaml_path, encoding="utf-8") as f:
        config = yaml.load(f, Loader=_TaskYamlLoader)
    includes = config.pop("include", None) or []
    merged = {}
    for include in [includes] if isinstance(includes, str) else includes:
        merged.update(read_stock_config(os.path.join(os.path.dirname(yaml_path), include)))
    merged.update(config)
    return merged


def check_data_file(task, path):
    """One clear sentence if the file is missing or its first row lacks the task's fields."""
    source, fields = HUB_SCHEMA[task]
    if not os.path.isfile(path):
        return f"missing {path} ({source})"
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return f"{path} is not JSONL (its first line is not a JSON object)"
    if not isinstance(row, dict):
        return f"{path} is not JSONL (its first line is not a JSON object)"
    missing = [name for name in fields if name not in row]
    if missing:
        return f"{path} lacks the fields {missing} of the hub schema ({source})"
    return None


def write_offline_task_yamls(task_manager, tasks, data_dir, out_dir):
    """Writes out_dir/<task>.yaml for each task, reading data_dir/<task>.jsonl. Returns the paths."""
    data_dir = os.path.abspath(data_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for task in tasks:
        stock = stock_yaml_path(task_manager, task)
        split = evaluation_split(read_stock_config(stock))
        config = {
            "include": stock,
            "task": task,
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {split: os.path.join(data_dir, f"{task}.jsonl")}},
            "training_split": None,
            "validation_split": split if split == "validation" else None,
            "test_split": split if split == "test" else None,
            "fewshot_split": None,
        }
        path = os.path.join(out_dir, f"{task}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        paths.append(path)
    return paths


def export_hub_data(task_manager, tasks, out_dir):
    """Downloads each task's evaluation split from the hub into out_dir/<task>.jsonl (needs internet)."""
    import datasets

    os.makedirs(out_dir, exist_ok=True)
    for task in tasks:
        config = read_stock_config(stock_yaml_path(task_manager, task))
        split = evaluation_split(config)
        rows = datasets.load_dataset(config["dataset_path"], config.get("dataset_name"), split=split)
        path = os.path.join(out_dir, f"{task}.jsonl")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        os.replace(path + ".tmp", path)
        print(f"wrote {len(rows)} rows to {path}")
