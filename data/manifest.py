"""What a prepared data directory holds: its manifest.json, the shard files of each split, and the command that made it.

Both data/prepare.py (which writes directories) and data/loader.py / data/verify.py (which read them) import this
module, so neither needs the other.
"""
import glob
import json
import os
import shlex

from data.shards import DataError

FINEWEB_EDU_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_EDU_CONFIGS = {"10B": "sample-10BT", "100B": "sample-100BT", "350B": "sample-350BT"}
GPT2_VOCAB_SIZE = 50257
PREPARE_HINT = "prepare one with `python -m data.prepare --default` (or --files / --dataset, see README)"


def read_manifest(data_dir):
    """The manifest.json that data/prepare.py wrote, as a dict (has "tokenizer", "tokens", "shards", ...)."""
    path = os.path.join(data_dir, "manifest.json")
    if not os.path.isdir(data_dir):
        raise DataError(f"data directory {data_dir} does not exist; {PREPARE_HINT}")
    if not os.path.exists(path):
        if os.path.exists(os.path.join(data_dir, "progress.json")):
            raise DataError(f"the preparation of {data_dir} did not finish; run the same data.prepare command again "
                            f"to complete it")
        raise DataError(f"{data_dir} has no manifest.json, so it is not a prepared data directory; {PREPARE_HINT}")
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as error:
        raise DataError(f"{path} is damaged ({error}); delete it and run the data.prepare command that made "
                        f"{data_dir} again, which prepares it afresh") from None


def split_files(data_dir, split):
    """Shard paths of a split, in order: from the manifest, or for llm.c-style folders without one, by name."""
    if split not in ("train", "val"):
        raise DataError(f"unknown split {split!r}; use 'train' or 'val'")
    if not os.path.isdir(data_dir):
        raise DataError(f"data directory {data_dir} does not exist; {PREPARE_HINT}")
    if os.path.exists(os.path.join(data_dir, "manifest.json")) or os.path.exists(os.path.join(data_dir, "progress.json")):
        manifest = read_manifest(data_dir)
        paths = [os.path.join(data_dir, s["file"]) for s in manifest["shards"] if s["split"] == split]
    else:  # e.g. llm.c's fineweb_val_000000.bin, fineweb_train_000001.bin
        paths = sorted(set(glob.glob(os.path.join(data_dir, f"{split}_*.bin")))
                       | set(glob.glob(os.path.join(data_dir, f"*_{split}_*.bin"))))
    if not paths:
        raise DataError(f"{data_dir} has no {split} shards; {PREPARE_HINT}")
    return paths


def prepare_command(out_dir):
    """The `python -m data.prepare ...` command that made (or resumes, or repairs) out_dir, from its manifest."""
    out_dir = os.fspath(out_dir)
    for name in ("manifest.json", "progress.json"):
        try:
            with open(os.path.join(out_dir, name)) as f:
                config = json.load(f)["config"]
            break
        except (OSError, ValueError, KeyError):
            config = None
    if config is None:
        return f"python -m data.prepare ... --out {shlex.quote(out_dir)}"
    source = config["source"]
    if source["kind"] == "default":
        return f"python -m data.prepare --default --out {shlex.quote(out_dir)} --tokenizer {config['tokenizer']}"
    if source["kind"] == "hub":
        version = next(v for v, c in FINEWEB_EDU_CONFIGS.items() if c == source["config"])
        words = ["--dataset", "fineweb-edu", "--version", version]
    else:
        words = ["--files", source["pattern"]]
        if source.get("txt_sample_by", "document") != "document":
            words += ["--txt-sample-by", source["txt_sample_by"]]
    words += ["--out", out_dir, "--tokenizer", config["tokenizer"], "--val-tokens", str(config["val_tokens"]),
              "--shard-tokens", str(config["shard_tokens"])]
    if config["max_tokens"] is not None:
        words += ["--max-tokens", str(config["max_tokens"])]
    return "python -m data.prepare " + " ".join(shlex.quote(w) for w in words)


def repair_hint(data_dir):
    """What to run when a shard of data_dir is damaged or missing."""
    if not os.path.exists(os.path.join(data_dir, "manifest.json")):
        return "replace it with an intact copy (this directory has no manifest.json to rebuild it from)"
    if adopted(data_dir):
        return ("replace it with an intact copy (this directory was adopted with --adopt: there is no source to "
                "rebuild it from)")
    return f"run `{prepare_command(data_dir)}` (the command that prepared it): it finds and rewrites the damaged shards"


def adopted(data_dir):
    """Whether data_dir's manifest was written by `python -m data.prepare --adopt` (shards made elsewhere)."""
    try:
        return read_manifest(data_dir).get("source", {}).get("kind") == "adopted"
    except DataError:
        return False


def adopt_command(data_dir):
    return f"python -m data.prepare --adopt {shlex.quote(os.fspath(data_dir))}"


def data_vocab_size(data_dir):
    """How many ids the tokenizer of data_dir's shards has: its manifest's, or GPT-2's 50257 for an llm.c-style
    directory without one (such directories hold GPT-2 tokens). None if unknown."""
    if not os.path.exists(os.path.join(data_dir, "manifest.json")):
        return GPT2_VOCAB_SIZE
    manifest = read_manifest(data_dir)
    return manifest.get("vocab_size") or manifest.get("n_vocab")
