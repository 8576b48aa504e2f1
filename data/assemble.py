"""The shards of data.prepare: the plan that names them, carried out; the repair of a finished folder; the adoption of
shards made elsewhere.

The plan cuts the stream of the pieces' shards at --val-tokens and --max-tokens: the first tokens are the
validation shards val_000000.bin, ..., the rest train_NNNNNN.bin, numbered on from them. Whole piece shards are
moved into OUT; the ones cut are written in the scratch folder first, so OUT only ever gains whole files.
"""
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from data.manifest import split_files
from data.pipeline import tokenize_piece, worker_in_this_process
from data.scratch import new_scratch, write_json
from data.shards import DataError, file_sha256, open_shard, read_header, write_shard

def plan_shards(done, n_used, val_tokens, max_tokens):
    """The final shards, in stream order: each is a whole piece shard or a cut [start, start + tokens) of one."""
    plan, pos, limit = [], 0, float("inf") if max_tokens is None else max_tokens
    for i in range(n_used):
        for j, part in enumerate(done[i]["shards"]):
            lo, hi = pos, pos + part["tokens"]
            for split, a, b in (("val", lo, min(hi, val_tokens, limit)), ("train", max(lo, val_tokens), min(hi, limit))):
                if a < b:
                    whole = (a, b) == (lo, hi)
                    plan.append({"file": f"{split}_{len(plan):06d}.bin", "split": split, "tokens": int(b - a),
                                 "from": part["file"], "piece": i, "part": j, "start": int(a - lo),
                                 "sha256": part["sha256"] if whole else None,
                                 "documents": part["documents"] if whole else None})
            pos = hi
    return plan


def name_shards(out_dir, parts, plan, eot):
    """Carry out the plan: move whole piece shards from `parts` into out_dir, write the cut ones (in `parts`, then
    moved, so out_dir only ever gains whole files). Every step can be repeated, so a run killed half-way through
    re-runs the plan from finalize.json."""
    by_source = {}
    for entry in plan:
        by_source.setdefault(entry["from"], []).append(entry)
    for source, entries in by_source.items():
        src = os.path.join(parts, source)
        if os.path.exists(src):
            if len(entries) == 1 and entries[0]["sha256"] is not None:
                os.replace(src, os.path.join(out_dir, entries[0]["file"]))
                continue
            tokens = open_shard(src)
            for entry in entries:
                piece = tokens[entry["start"]:entry["start"] + entry["tokens"]]
                cut = os.path.join(parts, entry["file"])
                entry["sha256"] = write_shard(cut, piece, prepared=True)
                os.replace(cut, os.path.join(out_dir, entry["file"]))
                entry["documents"] = int(np.count_nonzero(piece == eot))
            del tokens
            os.remove(src)
            continue
        for entry in entries:  # done before a kill: the named files are complete (written whole, then renamed)
            dst = os.path.join(out_dir, entry["file"])
            if not os.path.exists(dst):
                raise DataError(f"{src} and {dst} are both missing, so {out_dir} cannot be completed; delete it and "
                                "prepare again")
            if entry["sha256"] is None or entry["documents"] is None:
                entry["sha256"] = file_sha256(dst)
                entry["documents"] = int(np.count_nonzero(open_shard(dst) == eot))


def repair_shards(source, out_dir, manifest, tok, workers, progress_bar):
    """Rewrite exactly the shards of a finished preparation that are missing or no longer match their sha256:
    each from its piece, tokenised again."""
    config = manifest["config"]

    def intact(shard):
        path = os.path.join(out_dir, shard["file"])
        try:
            return read_header(path) == shard["tokens"] and file_sha256(path) == shard["sha256"]
        except (OSError, DataError):
            return False

    with ThreadPoolExecutor(max(1, workers)) as pool:  # hashing releases the GIL
        damaged = [s for s, ok in zip(manifest["shards"], pool.map(intact, manifest["shards"])) if not ok]
    if not damaged:
        return
    if any("piece" not in shard for shard in damaged):
        raise DataError(f"{len(damaged)} shard(s) of {out_dir} are missing or damaged, and its manifest.json (written "
                        f"by an older version) does not record where each shard comes from; delete {out_dir} and "
                        "prepare it again")
    pieces = sorted({shard["piece"] for shard in damaged})
    n_pieces = manifest["pieces"]
    scratch = new_scratch(out_dir, {"repair": True})
    with worker_in_this_process(source, config["tokenizer"]):
        records = {i: tokenize_piece((i, n_pieces, scratch, config["shard_tokens"], config["max_tokens"]))
                   for i in pieces}
    for shard in damaged:
        part = open_shard(os.path.join(scratch, records[shard["piece"]]["shards"][shard["part"]]["file"]))
        rewritten = os.path.join(scratch, shard["file"])
        sha = write_shard(rewritten, part[shard["start"]:shard["start"] + shard["tokens"]], prepared=True)
        del part
        if sha != shard["sha256"]:
            shutil.rmtree(scratch)
            raise DataError(f"rewriting {shard['file']} gave other tokens than when {out_dir} was prepared: the "
                            f"source has changed since; delete {out_dir} and prepare it again")
        os.replace(rewritten, os.path.join(out_dir, shard["file"]))
    shutil.rmtree(scratch)
    if progress_bar:
        print(f"rewrote {len(damaged)} damaged or missing shard(s) of {out_dir}: "
              + ", ".join(shard["file"] for shard in damaged), file=sys.stderr)


def adopt(data_dir):
    """Write manifest.json for a manifest-free llm.c-style directory of GPT-2 token shards, from what they hold now
    (adopt a copy you trust): from then on a changed byte is caught. Returns the manifest."""
    from data.manifest import GPT2_VOCAB_SIZE
    from data.verify import check_content
    path = os.path.join(data_dir, "manifest.json")
    if os.path.exists(path):
        raise DataError(f"{data_dir} already has a manifest.json; `python -m data.prepare --verify {data_dir}` checks "
                        "its shards against it")
    shards = []
    for split in ("val", "train"):
        for shard in split_files(data_dir, split):  # by name: llm.c's fineweb_val_000000.bin, ...
            count = read_header(shard, redo="replace it with an intact copy, then adopt the directory")
            result = check_content(shard)
            if isinstance(result, str):
                raise DataError(result)
            _, digest, largest = result
            if largest >= GPT2_VOCAB_SIZE:
                raise DataError(f"shard {shard} holds token id {largest}, beyond GPT-2's {GPT2_VOCAB_SIZE} ids: it is "
                                "damaged or not GPT-2 tokens; replace it with an intact copy, then adopt again")
            shards.append({"file": os.path.basename(shard), "split": split, "tokens": count, "sha256": digest})
    counts = {split: sum(s["tokens"] for s in shards if s["split"] == split) for split in ("val", "train")}
    manifest = {"format": "llm.c uint16 token shards: 256 x int32 header (magic 20240520, version 1, token count), "
                          "then uint16 tokens",
                "source": {"kind": "adopted"}, "tokenizer": "gpt2", "vocab_size": GPT2_VOCAB_SIZE, "eot_token": 50256,
                "tokens": {**counts, "total": counts["val"] + counts["train"]}, "shards": shards}
    try:
        write_json(path, manifest)
    except OSError as error:
        raise DataError(f"cannot write {path} ({error.strerror or error}); for a read-only directory, make a "
                        f"writable one of links to its shards (mkdir NEW && ln -s {os.path.abspath(data_dir)}/*.bin "
                        "NEW/) and adopt that") from None
    return manifest
