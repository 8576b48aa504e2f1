"""What a prepared data directory holds: its manifest.json, the shard files of each split, and the command that made it.

Both data/prepare.py (which writes directories) and data/loader.py / data/verify.py (which read them) import this
module, so neither needs the other.
"""
import glob
import hashlib
import json
import os
import shlex

from data.scratch import JOURNAL, SCRATCH_PREFIX
from data.shards import DataError

FINEWEB_EDU_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_EDU_CONFIGS = {"10B": "sample-10BT", "100B": "sample-100BT", "350B": "sample-350BT"}
GPT2_VOCAB_SIZE = 50257
PREPARE_HINT = "prepare one with `python -m data.prepare --default` (or --files / --dataset, see README)"


def require_folder(data_dir):
    if os.path.isdir(data_dir):
        return
    if os.path.exists(data_dir):  # e.g. its manifest.json or a shard given instead of the folder
        raise DataError(f"data directory {data_dir} is a file, not a folder; give the folder that holds the prepared "
                        f"shards and manifest.json, or {PREPARE_HINT}")
    raise DataError(f"data directory {data_dir} does not exist; {PREPARE_HINT}")


def _shape_problem(manifest):
    """What a manifest.json lacks that its readers index (train.py, split_files, verify), or None: another tool's
    manifest.json, valid JSON, must not end in a KeyError or TypeError far from where it was read."""
    if not isinstance(manifest, dict):
        return f"it holds a JSON {type(manifest).__name__}, not an object"
    if not isinstance(manifest.get("tokenizer"), str):
        return "it has no 'tokenizer' name"
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) and isinstance(s.get("file"), str)
                                               and s.get("split") in ("train", "val") for s in shards):
        return "it has no 'shards' list whose entries each name a 'file' and a 'split' (train or val)"
    for key in ("vocab_size", "n_vocab"):
        if manifest.get(key) is not None and (not isinstance(manifest[key], int) or isinstance(manifest[key], bool)):
            return f"its '{key}' is not a whole number"
    return None


def journals(data_dir):
    """The journals of unfinished preparations of data_dir: in its scratch folders, or (older versions) beside the
    shards."""
    return (sorted(glob.glob(os.path.join(glob.escape(data_dir), SCRATCH_PREFIX + "*", JOURNAL)))
            + [p for p in [os.path.join(data_dir, "progress.json")] if os.path.exists(p)])


def read_manifest(data_dir):
    """The manifest.json that data/prepare.py wrote, as a dict (has "tokenizer", "tokens", "shards", ...)."""
    return read_manifest_and_identity(data_dir)[0]


def read_manifest_and_identity(data_dir):
    """(the manifest, the sha256 of its bytes: what identifies the data, since it lists every shard's sha256),
    from one read of the file."""
    path = os.path.join(data_dir, "manifest.json")
    require_folder(data_dir)
    if not os.path.exists(path):
        if journals(data_dir):
            raise DataError(f"the preparation of {data_dir} did not finish; run the same data.prepare command again "
                            f"to complete it")
        raise DataError(f"{data_dir} has no manifest.json, so it is not a prepared data directory; {PREPARE_HINT}")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        manifest = json.loads(raw)
    except ValueError as error:
        raise DataError(f"{path} is damaged ({error}); delete it and run the data.prepare command that made "
                        f"{data_dir} again, which prepares it afresh") from None
    problem = _shape_problem(manifest)
    if problem:  # a new --out folder: data.prepare clears *.bin files from the folder it prepares
        raise DataError(f"{path} was not written by data.prepare ({problem}); prepare the data again with "
                        f"`python -m data.prepare` (--files, --dataset or --default) into a new --out folder, or for "
                        f"llm.c-style shards made elsewhere move that file aside and record them with "
                        f"`{adopt_command(data_dir)}`")
    return manifest, hashlib.sha256(raw).hexdigest()


def split_files(data_dir, split):
    """Shard paths of a split, in order: from the manifest, or for llm.c-style folders without one, by name."""
    require_folder(data_dir)
    marked = os.path.exists(os.path.join(data_dir, "manifest.json")) or journals(data_dir)
    return shard_paths(data_dir, read_manifest(data_dir) if marked else None, split)


def shard_paths(data_dir, manifest, split):
    """Shard paths of a split of data_dir, in order: from its manifest (already read), or with None for an
    llm.c-style folder without one, by name."""
    if split not in ("train", "val"):
        raise DataError(f"unknown split {split!r}; use 'train' or 'val'")
    if manifest is not None:
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
    for path in [os.path.join(out_dir, "manifest.json")] + journals(out_dir):
        try:
            with open(path) as f:
                config = json.load(f)["config"]
            break
        except (OSError, ValueError, KeyError, TypeError):  # TypeError: valid JSON of another shape
            config = None
    return command_of(out_dir, config)


def command_of(out_dir, config):
    """The `python -m data.prepare ...` command of a preparation's config (its manifest's "config"; None: unknown)."""
    if not isinstance(config, dict):
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


def repair_hint(data_dir, manifest=None):
    """What to run when a shard of data_dir is damaged or missing; from its manifest when given (already read),
    else from its files."""
    if manifest is None and not os.path.exists(os.path.join(data_dir, "manifest.json")):
        return "replace it with an intact copy (this directory has no manifest.json to rebuild it from)"
    if adopted(data_dir) if manifest is None else manifest.get("source", {}).get("kind") == "adopted":
        return ("replace it with an intact copy (this directory was adopted with --adopt: there is no source to "
                "rebuild it from)")
    command = prepare_command(data_dir) if manifest is None else command_of(os.fspath(data_dir), manifest.get("config"))
    return f"run `{command}` (the command that prepared it): it finds and rewrites the damaged shards"


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
