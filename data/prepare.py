"""Tokenise documents into uint16 token shards (llm.c / nanoGPT-speedrun format) with a JSON manifest.

    python -m data.prepare --dataset fineweb-edu --version 10B --out data_cache/fineweb-edu-10B
    python -m data.prepare --files 'corpus/**/*.jsonl' --out data_cache/mycorpus --val-tokens 1000000
    python -m data.prepare --default            # the embedded English corpus (what the quickstart uses)
    python -m data.prepare --verify data_cache/fineweb-edu-10B   # read every shard now and check it

The command line and the preparation's course. Every document is tokenised with <|endoftext|> in front of it; the
input is read in pieces, one per input file (data/sources.py), which worker processes tokenise into shards in a
scratch folder of the preparation's own (data/pipeline.py, data/scratch.py). A last step that reads almost nothing
names the shards in input order (data/assemble.py): the first --val-tokens tokens of the stream are the validation
split (val_000000.bin, ...), the rest the train split (train_NNNNNN.bin, numbered on from the validation shards).
So the output depends only on the arguments and the input, never on the number of workers, and a re-run of an
interrupted run with the same arguments keeps the finished pieces, redoes the others and ends with byte-identical
files. manifest.json marks the end.

A preparation deletes only what it can prove it wrote (data/scratch.py); an input inside OUT is refused. Preparations
of one OUT take turns on a lock beside OUT's real path, so a second one started meanwhile (two runs of a study on
a fresh clone) says that it waits, then finds the first one's result and uses it.
"""
import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import time

if __package__ in (None, ""):  # run as `python data/prepare.py`: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from data.assemble import adopt, name_shards, plan_shards, repair_shards
from data.manifest import FINEWEB_EDU_CONFIGS, adopt_command, read_manifest
from data.pipeline import available_cores, count_pieces, enough_pieces, finished_pieces, piece_path, tokenize_pieces
from data.scratch import (JOURNAL, PARTS, new_scratch, preparation_lock, read_json, remove_our_shards,
                          remove_unfinished, scratch_folders, write_error, write_json)
from data.shards import DataError, is_prepared_shard
from data.sources import (DEFAULT_CORPUS_FILE, DEFAULT_CORPUS_SHARD_TOKENS, DEFAULT_CORPUS_VAL_TOKENS, BadInput,
                          default_corpus_source, describe, files_source, hub_source)
from data.tokenizer import TOKENIZER_NAMES, get_tokenizer

DEFAULT_SHARD_TOKENS = 100_000_000  # 200 MB per shard, as in nanoGPT-speedrun
DEFAULT_HUB_VAL_TOKENS = 100_000_000  # the paper's 0.1B validation tokens
DEFAULT_FILES_VAL_TOKENS = 1_000_000
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prepare(source, out_dir, tokenizer="gpt2", val_tokens=DEFAULT_FILES_VAL_TOKENS,
            shard_tokens=DEFAULT_SHARD_TOKENS, max_tokens=None, workers=None, progress_bar=True,
            stop_after_pieces=None):
    """Prepare `source` into shards under out_dir and return the manifest (see the module docstring).

    workers: processes that tokenise pieces (default: the available cores; 1 tokenises in this process).
    stop_after_pieces (for tests) raises KeyboardInterrupt after that many pieces, as Ctrl-C would."""
    if shard_tokens < 1 or val_tokens < 0 or (max_tokens is not None and max_tokens < 1):
        raise DataError("--shard-tokens and --max-tokens must be positive and --val-tokens non-negative")
    _refuse_input_inside(source, out_dir)
    workers = available_cores() if workers is None else workers
    source.check()
    tok = get_tokenizer(tokenizer)
    if tok.n_vocab > 2**16:
        raise DataError(f"tokenizer {tokenizer} has {tok.n_vocab} ids; uint16 shards hold at most 65536")
    try:
        config = {"source": describe(source, workers), "tokenizer": tokenizer, "val_tokens": val_tokens,
                  "shard_tokens": shard_tokens, "max_tokens": max_tokens}
        with preparation_lock(out_dir):
            created = not os.path.isdir(out_dir)
            return _prepare(source, out_dir, tok, config, workers, progress_bar, stop_after_pieces, created)
    except OSError as error:  # a full disk or a read-only directory: what was completed stays usable for a re-run
        raise write_error(out_dir, error) from None


def _refuse_input_inside(source, out_dir):
    """A DataError if an input file lies inside out_dir: the preparation would write beside its own input (and an
    earlier version deleted it there)."""
    root = os.path.realpath(out_dir) + os.sep
    inside = [path for path in source.files if os.path.realpath(path).startswith(root)]
    if inside:
        raise DataError(f"the input {inside[0]} lies inside --out {out_dir}; give --out a folder that holds none of "
                        "the input files")


def _prepare(source, out_dir, tok, config, workers, progress_bar, stop_after_pieces, created):
    os.makedirs(out_dir, exist_ok=True)
    manifest_path = os.path.join(out_dir, "manifest.json")
    scratches = scratch_folders(out_dir)
    for folder, journal in scratches:  # a repair cut short is redone whole
        if journal.get("repair"):
            shutil.rmtree(folder)
    scratches = [(folder, journal) for folder, journal in scratches if not journal.get("repair")]
    if os.path.exists(manifest_path):
        manifest = read_manifest(out_dir)  # a DataError if it is damaged
        if manifest.get("config") == config:
            for folder, _ in scratches:  # a run killed after writing the manifest
                shutil.rmtree(folder)
            repair_shards(source, out_dir, manifest, tok, workers, progress_bar)
            if progress_bar:
                print(f"{out_dir} is already prepared ({manifest['tokens']['total']:,} tokens)", file=sys.stderr)
            return manifest
        raise DataError(f"{out_dir} already holds data prepared with other arguments; use another --out or delete it")
    scratch = _resume_or_start(source, out_dir, config, scratches)
    started = time.time()
    parts, finalize_path = os.path.join(scratch, PARTS), os.path.join(scratch, "finalize.json")
    if not os.path.exists(finalize_path):
        plan = _tokenize_and_plan(source, out_dir, scratch, config, workers, progress_bar, stop_after_pieces, created)
        write_json(finalize_path, plan)
    plan = read_json(finalize_path)
    name_shards(out_dir, parts, plan, tok.eot_token)
    counts = {split: sum(e["tokens"] for e in plan if e["split"] == split) for split in ("val", "train")}
    counts["total"] = counts["val"] + counts["train"]
    empty = 0  # each piece's record knows its documents without text (read before the scratch folder goes)
    for piece in sorted({e["piece"] for e in plan}):
        with contextlib.suppress(OSError, DataError):  # (a record of an older version has no count)
            empty += read_json(piece_path(parts, piece)).get("empty_documents", 0)
    manifest = {
        "format": "llm.c uint16 token shards: 256 x int32 header (magic 20240520, version 1, token count), "
                  "then uint16 tokens",
        "source": config["source"], "tokenizer": config["tokenizer"], "vocab_size": tok.n_vocab,
        "eot_token": tok.eot_token, "documents": sum(e["documents"] for e in plan), "tokens": counts,
        "shards": [{"file": e["file"], "split": e["split"], "tokens": e["tokens"], "sha256": e["sha256"],
                    "piece": e["piece"], "part": e["part"], "start": e["start"]} for e in plan],
        "pieces": read_json(os.path.join(scratch, JOURNAL))["pieces"], "config": config, "empty_documents": empty,
    }
    write_json(os.path.join(scratch, "manifest.json"), manifest)
    os.replace(os.path.join(scratch, "manifest.json"), manifest_path)
    shutil.rmtree(scratch)
    if progress_bar:
        print(f"wrote {len(plan)} shards to {out_dir}: {counts['val']:,} val + {counts['train']:,} train tokens "
              f"from {manifest['documents']:,} documents ({time.time() - started:.1f} s this run)", file=sys.stderr)
    if empty:  # said even with --quiet: rows without text are usually a mistake in the input (a wrong field name)
        print(f"note: {empty:,} of the {manifest['documents']:,} documents had no text (a null 'text', no 'text' "
              "field among rows that have one, or an empty string); each is an <|endoftext|> token alone in the "
              "shards", file=sys.stderr)
    return manifest


def _resume_or_start(source, out_dir, config, scratches):
    """The scratch folder of an unfinished preparation of out_dir with this config, or a new one (after refusing
    .bin files in out_dir that no preparation made, and removing those an earlier one did)."""
    for folder, journal in scratches:
        if journal.get("config") == config:
            return folder
    if scratches:
        raise DataError(f"{out_dir} holds an unfinished preparation with other arguments (in {scratches[0][0]}); use "
                        f"the same arguments to resume it, or another --out (or delete {scratches[0][0]}) to start a "
                        "new one")
    # Only our own marked shards may be replaced (a finished preparation whose damaged manifest.json the user
    # deleted, as its error message advises, to prepare the folder afresh); a name alone proves nothing.
    foreign = sorted(name for name in os.listdir(out_dir)
                     if name.endswith(".bin") and not is_prepared_shard(os.path.join(out_dir, name)))
    if foreign:
        raise DataError(f"{out_dir} already holds {len(foreign)} .bin file(s) that no preparation made "
                        f"({foreign[0]}, ...), which preparing there would delete; give --out a new folder, or "
                        f"record shards made elsewhere with `{adopt_command(out_dir)}`")
    remove_our_shards(out_dir)
    return new_scratch(out_dir, {"config": config, "pieces": source.pieces or count_pieces(source)})


def _tokenize_and_plan(source, out_dir, scratch, config, workers, progress_bar, stop_after_pieces, created):
    """Tokenise the pieces not yet done into the scratch folder and return the plan of the final shards; a
    preparation that cannot succeed removes its scratch folder before it says why."""
    n_pieces = read_json(os.path.join(scratch, JOURNAL))["pieces"]
    done = finished_pieces(os.path.join(scratch, PARTS))
    bar = None
    if progress_bar:
        from tqdm import tqdm

        bar = tqdm(total=config["max_tokens"], initial=sum(r["tokens"] for r in done.values()), unit="tok",
                   unit_scale=True, dynamic_ncols=True, mininterval=1.0,
                   desc=f"tokenizing {n_pieces} piece(s) ({workers} worker{'s' * (workers > 1)})")
    try:
        tokenize_pieces(source, os.path.join(scratch, PARTS), config["tokenizer"], n_pieces, workers, config, done,
                         bar, stop_after_pieces)
    except BadInput:
        remove_unfinished(out_dir, scratch, created)  # the fixed input is another source: nothing could resume
        raise
    finally:
        if bar is not None:
            bar.close()
    n_used = enough_pieces(done, config["max_tokens"]) or n_pieces
    plan = plan_shards(done, n_used, config["val_tokens"], config["max_tokens"])
    counts = {split: sum(e["tokens"] for e in plan if e["split"] == split) for split in ("val", "train")}
    if counts["train"] == 0:
        remove_unfinished(out_dir, scratch, created)  # the same command would fail the same way: leave nothing
        documents = sum(s["documents"] for i in range(n_used) for s in done[i]["shards"])
        if sum(done[i]["tokens"] for i in range(n_used)) <= documents:  # each document gave only its eot token
            raise DataError(f"the source holds no text ({documents:,} document(s), all empty); check --files "
                            f"(and the 'text' field), then prepare again")
        raise DataError(f"the source has only {counts['val']:,} tokens and all went to validation "
                        f"(--val-tokens {config['val_tokens']:,}); prepare it again with a smaller --val-tokens")
    return plan


# ---- the embedded default corpus --------------------------------------------------------------------------------


def _drop_outdated_cache(out_dir, expected):
    """Remove out_dir's manifest.json and the shards it lists when they are a cache of another version of the
    embedded corpus (e.g. after a git pull), or a damaged manifest (then prepare() replaces the marked shards it
    finds); any other file of out_dir is left as it is."""
    manifest_path = os.path.join(out_dir, "manifest.json")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
        # another tool's manifest (a list, say) is no cache of ours: prepare() then says what it is
        config = manifest.get("config") if isinstance(manifest, dict) else None
        config = config if isinstance(config, dict) else {}
    except ValueError:  # a damaged manifest of this cache: rebuild it
        manifest, config = {}, {"source": {"kind": "default"}}
    if config == expected or config.get("source", {}).get("kind") != "default":
        return
    listed = [os.path.join(out_dir, os.path.basename(str(shard.get("file", ""))))
              for shard in manifest.get("shards", []) if isinstance(shard, dict)]
    for path in listed:  # a name in a manifest proves nothing: only shards carrying a preparation's mark go
        if path.endswith(".bin") and os.path.isfile(path) and is_prepared_shard(path):
            os.remove(path)
    os.remove(manifest_path)


def ensure_default_corpus(out_dir=None, tokenizer="gpt2", progress_bar=True):
    """Prepare the embedded English corpus once (offline) and return its directory (a cache: a directory
    prepared from another version of the corpus is rebuilt)."""
    if out_dir is None:
        suffix = "" if tokenizer == "gpt2" else f"-{tokenizer}"
        out_dir = os.path.join(REPO_ROOT, "data_cache", f"default{suffix}")
    source = default_corpus_source(out_dir)
    manifest_path = os.path.join(out_dir, "manifest.json")
    expected = {"source": source.description, "tokenizer": tokenizer, "val_tokens": DEFAULT_CORPUS_VAL_TOKENS[tokenizer],
                "shard_tokens": DEFAULT_CORPUS_SHARD_TOKENS, "max_tokens": None}
    try:
        with preparation_lock(out_dir):  # the check and the rebuild too: another process may be preparing it now
            if os.path.exists(manifest_path):
                _drop_outdated_cache(out_dir, expected)
            os.makedirs(out_dir, exist_ok=True)
            prepare(source, out_dir, tokenizer=tokenizer, val_tokens=expected["val_tokens"],
                    shard_tokens=expected["shard_tokens"], progress_bar=progress_bar)
    except OSError as error:
        raise write_error(out_dir, error) from None
    return out_dir


# ---- command line -----------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--dataset", choices=["fineweb-edu"], help="a hub dataset, streamed")
    which.add_argument("--files", help="glob of local .jsonl/.json/.parquet (with a 'text' field) or .txt files")
    which.add_argument("--default", action="store_true", help="the embedded English corpus (offline)")
    which.add_argument("--verify", metavar="DIR", help="read every shard of a prepared directory now and check its "
                                                       "sha256 and token ids (training does this once per shard)")
    which.add_argument("--adopt", metavar="DIR", help="record the sha256 of every shard of an llm.c-style directory "
                                                      "made elsewhere (GPT-2 tokens, *train_*.bin / *val_*.bin) in a "
                                                      "manifest.json, so that training can tell damage from data")
    parser.add_argument("--version", default="10B", choices=sorted(FINEWEB_EDU_CONFIGS),
                        help="FineWeb-Edu sample size (default 10B; the paper used 100B)")
    parser.add_argument("--out", help="output directory (default data_cache/<name>)")
    parser.add_argument("--tokenizer", default="gpt2", choices=TOKENIZER_NAMES)
    parser.add_argument("--val-tokens", type=int, default=None,
                        help=f"validation tokens, taken from the start of the stream (default {DEFAULT_HUB_VAL_TOKENS:,}"
                             f" for the hub, {DEFAULT_FILES_VAL_TOKENS:,} for --files)")
    parser.add_argument("--shard-tokens", type=int, default=None,
                        help=f"most tokens per shard (default {DEFAULT_SHARD_TOKENS:,}; each input file starts a new "
                             "one)")
    parser.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens in all")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes, each tokenising whole input files (default: the available cores; 1 "
                             "tokenises in this process)")
    parser.add_argument("--txt-sample-by", default="document", choices=["document", "paragraph", "line"],
                        help="what one document of a .txt file is (default: the whole file)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args, extra = parser.parse_known_args(argv)
    if extra and args.files and all(os.path.exists(path) for path in extra):
        example = os.path.join(os.path.dirname(args.files), "*" + os.path.splitext(args.files)[1])
        parser.error(f"--files takes one pattern, but the shell expanded it into {len(extra) + 1} paths; quote it so "
                     f"that this script expands it, e.g. --files '{example}'")
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _refuse_fixed_layout_flags(args):
    """--default prepares the embedded corpus with its own fixed split and shard size (what the quickstart's cache
    holds): a DataError naming the flags given with it, which it would otherwise ignore."""
    given = [flag for flag in ("--val-tokens", "--max-tokens", "--shard-tokens")
             if getattr(args, flag[2:].replace("-", "_")) is not None]
    if given:
        raise DataError(f"--default prepares the embedded corpus with its fixed split and shard size, so it does not "
                        f"take {', '.join(given)}; prepare the corpus file {DEFAULT_CORPUS_FILE} with --files (after "
                        "unpacking it with xz -dk) to choose those")


def verify_command(data_dir, workers=None):
    """--verify DIR: every shard read in full (its sha256 against manifest.json, its token ids), in parallel."""
    from data.manifest import repair_hint
    from data.verify import verify_all

    started = time.time()
    count, size, problems = verify_all(data_dir, workers or available_cores())
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} of {count} shard(s) of {data_dir} are damaged or missing; {repair_hint(data_dir)}",
              file=sys.stderr)
        return 2
    print(f"{data_dir}: all {count} shard(s) intact: sha256 as recorded, token ids within the tokenizer's "
          f"({size / 1e9:.2f} GB read in {time.time() - started:.1f} s)")
    return 0


def _stop_now(signum, frame):
    # Ctrl-C or kill: stop the workers and leave at once. Unwinding through Pool.terminate() can hang while its
    # task thread is blocked on a full pipe, and nothing needs cleaning up: shards and records are only ever
    # replaced whole, and the next run deletes what an unfinished piece left.
    for child in multiprocessing.active_children():
        child.kill()
    print("interrupted: finished pieces are kept; run the same command again to continue", file=sys.stderr)
    os._exit(128 + signum)


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGINT, _stop_now)
    signal.signal(signal.SIGTERM, _stop_now)
    try:
        if args.verify:
            return verify_command(args.verify, args.workers)
        if args.adopt:
            manifest = adopt(args.adopt)
            print(f"{args.adopt}: recorded {len(manifest['shards'])} shard(s), {manifest['tokens']['total']:,} GPT-2 "
                  "tokens, in manifest.json; training now checks them against it")
            return 0
        if args.default:
            _refuse_fixed_layout_flags(args)
            out = ensure_default_corpus(args.out, tokenizer=args.tokenizer, progress_bar=not args.quiet)
            print(out)
            return 0
        if args.dataset:
            source = hub_source(args.version)
            out = args.out or os.path.join("data_cache", f"fineweb-edu-{args.version}")
            val_tokens = DEFAULT_HUB_VAL_TOKENS if args.val_tokens is None else args.val_tokens
        else:
            source = files_source(args.files, args.txt_sample_by)
            if not args.out:
                raise DataError("--files needs --out DIR, the directory for the shards")
            out = args.out
            val_tokens = DEFAULT_FILES_VAL_TOKENS if args.val_tokens is None else args.val_tokens
        shard_tokens = DEFAULT_SHARD_TOKENS if args.shard_tokens is None else args.shard_tokens
        prepare(source, out, tokenizer=args.tokenizer, val_tokens=val_tokens, shard_tokens=shard_tokens,
                max_tokens=args.max_tokens, workers=args.workers, progress_bar=not args.quiet)
        print(out)
        return 0
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
