"""RULER and BABILong as lm-evaluation-harness runs them, with their downloads answered from a local folder.

Nothing of the tasks is re-implemented: every task YAML written here `include:`s lm-eval's own definition
(prompts, data generation, metrics) and sets only what lm-eval leaves to the user (the lengths and the
tokenizer, in `metadata`) and, with a local folder, where the four downloaded sources come from:

    DIR/ruler/paul_graham_essays.jsonl        the essay haystack (hub dataset baber/paul_graham_essays, train)
    DIR/nltk_data/tokenizers/punkt_tab/       nltk's sentence splitter, which the essay tasks use
    DIR/ruler/dev-v2.0.json                   SQuAD v2 dev set (ruler_qa_squad)
    DIR/ruler/hotpot_dev_distractor_v1.json   HotpotQA dev set (ruler_qa_hotpot)
    DIR/babilong/<split>/qa<k>.jsonl          BABILong (hub dataset RMT-team/babilong-1k-samples, config <split>)

`python eval/long_context.py --export-data DIR` writes them on a machine with internet access. Offline, each
task's YAML names `local_dataset` (below) as its custom_dataset: it calls lm-eval's own dataset function with the
three places that download (the `datasets` module seen by RULER's haystack loader and by BABILong's loader, and
RULER's `download_json`) pointed at these files for the duration of the call.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import urllib.parse

import yaml

from config import UserError

RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multiquery", "niah_multivalue", "ruler_vt", "ruler_cwe", "ruler_fwe",
               "ruler_qa_squad", "ruler_qa_hotpot")  # lm-eval's `ruler` group, in its order
BABILONG_TASKS = tuple(f"babilong_qa{k}" for k in range(1, 6))  # the tasks BABILong has at every length
LONG_CONTEXT_TASKS = RULER_TASKS + BABILONG_TASKS
TASK_GROUPS = {"ruler": RULER_TASKS, "babilong": BABILONG_TASKS}

# What each task asks of the model (docs/eval.md and the report's notes).
TASK_DESCRIPTIONS = {
    "niah_single_1": "one needle (a word key and a 7-digit number) in repeated filler sentences: passkey retrieval",
    "niah_single_2": "one needle (word key, 7-digit number) in Paul Graham essays: the classic needle in a haystack",
    "niah_single_3": "one needle whose value is a UUID, in essays",
    "niah_multikey_1": "four needles with different keys in essays; the value of one key is asked",
    "niah_multikey_2": "a haystack made only of needles (key-value lines); one key is asked",
    "niah_multikey_3": "as niah_multikey_2 with UUID keys and values",
    "niah_multiquery": "four needles in essays; the values of all four keys are asked",
    "niah_multivalue": "one key with four values in essays; all four are asked",
    "ruler_vt": "variable tracking: chains of assignments (VAR B = VAR A) in filler; name every variable that "
                "holds a value (multi-hop tracing, one in-context example)",
    "ruler_cwe": "common word extraction: the 10 most frequent words of a long numbered word list (aggregation)",
    "ruler_fwe": "frequent word extraction: the 3 most frequent coded words of a Zipf-distributed text (aggregation)",
    "ruler_qa_squad": "question answering (SQuAD v2) with the gold paragraph among distractor paragraphs",
    "ruler_qa_hotpot": "multi-hop question answering (HotpotQA) with the gold paragraphs among distractors",
    "babilong_qa1": "bAbI qa1 (single supporting fact: where is a person) with the facts spread through book text",
    "babilong_qa2": "bAbI qa2 (two supporting facts: where is an object someone carried) in book text",
    "babilong_qa3": "bAbI qa3 (three supporting facts: where was an object before a place) in book text",
    "babilong_qa4": "bAbI qa4 (two-argument relations: what is north of a place) in book text",
    "babilong_qa5": "bAbI qa5 (three-argument relations: who gave what to whom) in book text",
}

ESSAYS_HUB_ID = "baber/paul_graham_essays"  # read by lm-eval's RULER prepare_niah.get_haystack("essay")
BABILONG_HUB_ID = "RMT-team/babilong-1k-samples"  # read by lm-eval's babilong common_utils.load_dataset
# BABILong's splits and the context length (tokens) each is built for; qa1-qa5 exist in every split.
BABILONG_SPLITS = {"0k": 0, "1k": 1024, "2k": 2048, "4k": 4096, "8k": 8192, "16k": 16384, "32k": 32768,
                   "64k": 65536, "128k": 131072}
EXPORT_BABILONG_SPLITS = ("0k", "1k", "2k", "4k", "8k", "16k", "32k")  # up to 8x a 4096-token context
ESSAY_TASKS = ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multiquery", "niah_multivalue")
ESSAYS_FILE = "ruler/paul_graham_essays.jsonl"
PUNKT_DIR = "nltk_data/tokenizers/punkt_tab"


def expand_tasks(spec: str) -> list[str]:
    """'ruler,babilong_qa1' -> task names (groups expanded, order kept, no repeats); ValueError naming a bad one."""
    names = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        group = TASK_GROUPS.get(item, (item,))
        for task in group:
            if task not in LONG_CONTEXT_TASKS:
                raise ValueError(f"unknown task {item!r}; choose from the groups {', '.join(TASK_GROUPS)} or the "
                                 f"tasks {', '.join(LONG_CONTEXT_TASKS)}")
            if task not in names:
                names.append(task)
    return names


def babilong_split(length: int) -> str:
    """The BABILong split for a context length: the longest one built for at most that many tokens."""
    return max((s for s, n in BABILONG_SPLITS.items() if n <= length), key=BABILONG_SPLITS.get)


def qa_urls() -> dict[str, str]:
    """{task: URL} of the files lm-eval's RULER QA tasks download (their readers' default arguments)."""
    import inspect

    from lm_eval.tasks.ruler import qa_utils

    return {"ruler_qa_squad": inspect.signature(qa_utils.read_squad).parameters["url"].default,
            "ruler_qa_hotpot": inspect.signature(qa_utils.read_hotpotqa).parameters["url"].default}


def url_file(url: str) -> str:
    return "ruler/" + os.path.basename(urllib.parse.urlsplit(url).path)


def needed_files(task: str, babilong_splits=("0k",)) -> list[tuple[str, str]]:
    """[(path relative to the data folder, where it comes from)] that `task` reads (BABILong: in these splits)."""
    if task in ESSAY_TASKS:
        return [(ESSAYS_FILE, f"hub dataset {ESSAYS_HUB_ID}"), (PUNKT_DIR, "nltk's punkt_tab")]
    if task in ("ruler_qa_squad", "ruler_qa_hotpot"):
        url = qa_urls()[task]
        return [(url_file(url), url)]
    if task in BABILONG_TASKS:
        qa = task.removeprefix("babilong_")
        return [(f"babilong/{split}/{qa}.jsonl", f"hub dataset {BABILONG_HUB_ID}, config {split}, split {qa}")
                for split in dict.fromkeys(babilong_splits)]
    return []


def missing_files(tasks: list[str], babilong_splits, data_dir: str | None) -> dict[str, list[str]]:
    """{task: [missing paths]} for the tasks that need downloaded data not in data_dir (all of it without one)."""
    missing = {}
    for task in tasks:
        paths = [path for path, _ in needed_files(task, babilong_splits)
                 if data_dir is None or not os.path.exists(os.path.join(data_dir, path))]
        if paths:
            missing[task] = paths
    return missing


def missing_files_sentence(missing: dict[str, list[str]], data_dir: str | None, skip_option: bool = True) -> str:
    """One sentence: which tasks lack which files, and the ways out (--skip-missing is eval/long_context.py's)."""
    where = data_dir or "DIR"
    files = sorted({os.path.join(where, p) for paths in missing.values() for p in paths})
    runnable = [t for t in LONG_CONTEXT_TASKS if not needed_files(t)]
    skip = ", or pass --skip-missing to run the others and report these as not run" if skip_option else ""
    return (f"{len(missing)} task(s) ({', '.join(missing)}) need downloaded data that is not here: "
            f"{', '.join(files)}; make the folder once on a machine with internet access with "
            f"`python eval/long_context.py --export-data {where}` and pass --data-dir {where}, or run only the tasks "
            f"that need no download (--tasks {','.join(runnable)}){skip}")


# ----------------------------------------------------------------------------- task YAMLs

def task_manager():
    """lm-eval's TaskManager over RULER's and BABILong's folders only (0.05 s): the default one indexes every task
    lm-eval ships (about 20 s on a busy 2-core machine)."""
    from lm_eval.tasks import TaskManager

    stock = os.path.dirname(importlib.import_module("lm_eval.tasks").__file__)
    return TaskManager(include_path=[os.path.join(stock, "ruler"), os.path.join(stock, "babilong")],
                       include_defaults=False)


class FunctionRef(str):
    """A YAML `!function module.name` reference (lm-eval imports it when it loads the task)."""


class _TaskYamlDumper(yaml.SafeDumper):
    pass


_TaskYamlDumper.add_representer(FunctionRef, lambda dumper, ref: dumper.represent_scalar("!function", str(ref)))


def stock_dataset_function(stock_yaml: str, stock_config: dict) -> str:
    """'lm_eval.tasks.ruler.niah_utils.niah_single_2' from the stock YAML's `custom_dataset: !function ...`."""
    ref = stock_config["custom_dataset"]
    tasks_root = os.path.dirname(importlib.import_module("lm_eval.tasks").__file__)
    package = os.path.relpath(os.path.dirname(stock_yaml), tasks_root).replace(os.sep, ".")
    return f"lm_eval.tasks.{package}.{ref}"


def write_task_yaml(task_manager, task: str, path: str, metadata: dict | None = None,
                    data_dir: str | None = None) -> str:
    """Writes a YAML that runs lm-eval's `task` with `metadata` merged into its own and, when data_dir is given and
    the task downloads data, that data read from data_dir. Returns the path."""
    from eval.tasks import read_stock_config, stock_yaml_path

    stock_yaml = stock_yaml_path(task_manager, task)
    stock = read_stock_config(stock_yaml)
    config = {"include": stock_yaml, "task": task}
    if metadata:
        config["metadata"] = dict(stock.get("metadata") or {}) | metadata
    if data_dir is not None and needed_files(task):
        config["custom_dataset"] = FunctionRef("eval.long_context_tasks.local_dataset")
        config["dataset_kwargs"] = dict(stock.get("dataset_kwargs") or {}) | {
            "stock_dataset": stock_dataset_function(stock_yaml, stock), "local_data": os.path.abspath(data_dir)}
    with open(path, "w", encoding="utf-8") as f:
        yaml.dump(config, f, Dumper=_TaskYamlDumper, sort_keys=False)
    return path


# ----------------------------------------------------------------------------- local sources

def local_file(data_dir: str, relative: str) -> str:
    path = os.path.join(data_dir, relative)
    if not os.path.exists(path):
        raise UserError(f"missing {path}: make the folder once on a machine with internet access with "
                        f"`python eval/long_context.py --export-data {data_dir}`")
    return path


class LocalHub:
    """Stands in for the `datasets` module inside an lm-eval task module: load_dataset of the two hub datasets
    long-context tasks use reads the local JSONL instead; everything else is the real module."""

    def __init__(self, data_dir: str):
        import datasets

        self._datasets, self._data_dir = datasets, data_dir

    def __getattr__(self, name):
        return getattr(self._datasets, name)

    def load_dataset(self, path, name=None, split=None, **kwargs):
        if path == ESSAYS_HUB_ID:
            relative = ESSAYS_FILE
        elif path == BABILONG_HUB_ID:
            relative = f"babilong/{name}/{split}.jsonl"
        else:
            return self._datasets.load_dataset(path, name, split=split, **kwargs)
        split = split or "train"
        return self._datasets.load_dataset("json", data_files={split: local_file(self._data_dir, relative)},
                                           split=split)


def use_local_nltk_data(data_dir: str | None) -> None:
    """Lets nltk find punkt_tab in DIR/nltk_data (RULER's essay tasks split sentences with it; without it
    importing RULER tries to download it)."""
    if data_dir and os.path.isdir(os.path.join(data_dir, "nltk_data")):
        import nltk

        path = os.path.abspath(os.path.join(data_dir, "nltk_data"))
        if path not in nltk.data.path:
            nltk.data.path.insert(0, path)


@contextlib.contextmanager
def local_sources(function, data_dir: str):
    """While open, the downloads of lm-eval's dataset `function` read data_dir instead (see the module doc)."""
    names = function.__globals__
    patches = []  # (namespace, name, replacement)
    if "datasets" in names:  # BABILong's load_dataset
        patches.append((names, "datasets", LocalHub(data_dir)))
    haystack = names.get("get_haystack")  # RULER's niah tasks read the essays in prepare_niah.get_haystack
    if haystack is not None:
        patches.append((haystack.__wrapped__.__globals__, "datasets", LocalHub(data_dir)))
    if "download_json" in names:  # RULER's QA tasks
        patches.append((names, "download_json",
                        lambda url: json.loads(open(local_file(data_dir, url_file(url)), encoding="utf-8").read())))
    cached = [f for f in (haystack, names.get("read_squad"), names.get("read_hotpotqa")) if f is not None]
    saved = [(namespace, name, namespace[name]) for namespace, name, _ in patches]
    use_local_nltk_data(data_dir)
    for f in cached:  # results cached from another source must not be reused, nor ours leak out
        f.cache_clear()
    try:
        for namespace, name, replacement in patches:
            namespace[name] = replacement
        yield
    finally:
        for namespace, name, original in saved:
            namespace[name] = original
        for f in cached:
            f.cache_clear()


def local_dataset(**kwargs):
    """custom_dataset of tasks whose data comes from a local folder: lm-eval's own dataset function (the
    `stock_dataset` the YAML names) with its downloads answered from `local_data`."""
    module_name, _, function_name = kwargs.pop("stock_dataset").rpartition(".")
    data_dir = kwargs.pop("local_data")
    function = getattr(importlib.import_module(module_name), function_name)
    with local_sources(function, data_dir):
        return function(**kwargs)


# ----------------------------------------------------------------------------- export (needs internet)

def write_jsonl(rows, path: str) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    n = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            n += 1
    os.replace(path + ".tmp", path)
    return n


def export_data(data_dir: str, babilong_splits=EXPORT_BABILONG_SPLITS) -> list[str]:
    """Downloads every source the long-context tasks read into data_dir (the layout of the module doc)."""
    import datasets
    import nltk
    import requests

    written = []
    path = os.path.join(data_dir, ESSAYS_FILE)
    n = write_jsonl(datasets.load_dataset(ESSAYS_HUB_ID, split="train"), path)
    written.append(f"{path} ({n} essays)")
    for url in qa_urls().values():
        path = os.path.join(data_dir, url_file(url))
        response = requests.get(url, timeout=120)
        response.raise_for_status()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(response.content)
        os.replace(path + ".tmp", path)
        written.append(f"{path} ({len(response.content):,} bytes)")
    if not nltk.download("punkt_tab", download_dir=os.path.join(data_dir, "nltk_data"), quiet=True):
        raise ConnectionError("nltk could not download punkt_tab")
    written.append(os.path.join(data_dir, PUNKT_DIR))
    for split in babilong_splits:
        for task in BABILONG_TASKS:
            qa = task.removeprefix("babilong_")
            path = os.path.join(data_dir, "babilong", split, f"{qa}.jsonl")
            n = write_jsonl(datasets.load_dataset(BABILONG_HUB_ID, split, split=qa), path)
            written.append(f"{path} ({n} rows)")
    return written


# ----------------------------------------------------------------------------- the tokenizer RULER sizes with

PROBE_TEXT = ("Some special magic numbers are hidden within the following text.\nOne of the special magic numbers "
              "for rabid-goodie is: 9152513. The grass is green. VAR QWERT = 12345 VAR ASDFG = VAR QWERT\n\n"
              "1. apple 2. banana-split 3. ... ywbzkq Document 1:\nÉcole d'été — naïve café, 10 000 €. "
              "2a1b3c4d-0e9f-4a8b-9c7d-6e5f4a3b2c1d Answer:")


def check_hf_tokenizer(path: str, tokenizer) -> None:
    """RULER sizes its prompts with the Hugging Face tokenizer at `path`: it must cut text as the model's does."""
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise UserError(f"no Hugging Face tokenizer at {path} ({error}); pass the folder of a run exported with "
                        "scripts/export_hf.py, or leave it out to use the run's own tokenizer") from None
    ours, theirs = tokenizer.encode(PROBE_TEXT), hf(PROBE_TEXT, add_special_tokens=False).input_ids
    if ours != theirs:
        raise UserError(f"the tokenizer at {path} cuts text differently from the checkpoint's {tokenizer.name!r} "
                        f"tokenizer ({len(theirs)} vs {len(ours)} tokens for the same text), so RULER would size its "
                        "prompts wrongly; use the run's own tokenizer files (scripts/export_hf.py)")


def write_hf_tokenizer(name: str, out_dir: str, model_max_length: int) -> str:
    """The run's tokenizer as Hugging Face files (those scripts/export_hf.py writes) in out_dir; returns out_dir."""
    from hf.tokenizer_files import write_tokenizer

    if not os.path.isfile(os.path.join(out_dir, "tokenizer.json")):  # several runs of one tokenizer: once
        os.makedirs(out_dir, exist_ok=True)
        write_tokenizer(name, out_dir, model_max_length)
    return out_dir


# ----------------------------------------------------------------------------- lengths a task can be built at

def too_short(task: str, length: int, hf_tokenizer) -> str | None:
    """Why lm-eval cannot build `task` at `length` tokens, or None. Only for the tasks whose data generation
    would loop forever (variable tracking, common words) or produce prompts without a haystack (frequent
    words) at too small a length; the others stop with their own error, which the caller reports."""
    import random

    import numpy as np

    def count(text):
        return len(hf_tokenizer(text, add_special_tokens=False).input_ids)

    state = random.getstate(), np.random.get_state()  # probes must not change the data lm-eval generates next
    try:
        if task == "ruler_vt":
            from lm_eval.tasks.ruler import vt_utils
            answer_tokens = vt_utils.CONFIG["variable_tracking"]["tokens_to_generate"]
            # lm-eval first builds an in-context example of at most 500 tokens from 5 filler lines; if even that
            # does not fit, its generator retries forever
            text, answer = vt_utils.generate_input_output(5, 1, 4, is_icl=True)
            if count(text + " " + " ".join(answer)) + answer_tokens > 500:
                return (f"cannot be built with this tokenizer at any length: lm-eval's in-context example of 5 "
                        f"filler lines takes {count(text)} tokens, more than the 500 it allows")
            # then the smallest sample (10 filler lines, one chain of 4 hops) after that example
            text, answer = vt_utils.generate_input_output(10, 1, 4)
            need = count(text + " " + " ".join(answer)) + answer_tokens + 500
        elif task == "ruler_cwe":
            from lm_eval.tasks.ruler import cwe_utils
            rng = cwe_utils.RNG.getstate()
            example, text, answer = cwe_utils.generate_input_output(20, length)  # 20 words: room to shrink to 10
            cwe_utils.RNG.setstate(rng)
            need = count(example + "\n" + text + " " + " ".join(answer)) + cwe_utils.CONFIG["tokens_to_generate"]
        elif task == "ruler_fwe":
            from lm_eval.tasks.ruler import fwe_utils
            need = 2 * count(fwe_utils.TEMPLATE.format(context="", query="")) + fwe_utils.CONFIG["tokens_to_generate"]
        else:
            return None
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
    if length < need:
        return f"needs at least about {need} tokens (prompt template, smallest haystack and answer)"
    return None
