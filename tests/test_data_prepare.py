"""Tokenizers, shard files and data/prepare.py, with the byte tokenizer (no GPT-2 vocabulary needed)."""
import errno
import functools
import hashlib
import json
import re
import lzma
import os
import socket
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from data.loader import load_split_tokens, read_manifest
from data.prepare import Source, files_source, prepare
from data.shards import DataError, HEADER_BYTES, is_prepared_shard, open_shard, read_header, write_shard
from data.tokenizer import get_tokenizer
from data import prepare as prep
from helpers import examples, prepare_byte_corpus, write_position_shards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [f"Document {i}: the quick brown fox jumps over the lazy dog {i * 7} times. " * (1 + i % 4)
        for i in range(40)] + ["Ünïcödé — ∑ 日本語 😀", ""]


def expected_stream(docs):
    """Independent reference: eot (256) then the UTF-8 bytes of every document."""
    out = []
    for doc in docs:
        out.append(256)
        out.extend(doc.encode("utf-8"))
    return np.array(out, dtype=np.uint16)


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc, "id": len(doc)}) + "\n")


def all_tokens(out_dir):
    return np.concatenate([load_split_tokens(out_dir, "val"), load_split_tokens(out_dir, "train")])


def expected_layout(file_docs, val_tokens, shard_tokens, max_tokens=None):
    """Independent reference for the shard sizes: the stream (every file's documents, each file cut to max_tokens)
    is cut at every file start, every shard_tokens within a file, at val_tokens and at max_tokens; the pieces that
    end by val_tokens are validation. Returns [(split, tokens), ...]."""
    cuts, offset = set(), 0
    for docs in file_docs:
        n = min(len(expected_stream(docs)), max_tokens or 10**18)
        cuts |= {offset + k for k in range(0, n, shard_tokens)}
        offset += n
    end = min(offset, max_tokens or offset)
    bounds = sorted(c for c in cuts | {val_tokens, end} if 0 < c < end) + [end]
    return [("val" if b <= val_tokens else "train", b - a) for a, b in zip([0] + bounds, bounds)]


def directory_bytes(path):
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path))}


def run_prepare(source, out_dir, **kw):
    kw = {"tokenizer": "byte", "val_tokens": 500, "shard_tokens": 700, "workers": 1, "progress_bar": False, **kw}
    return prep.prepare(source, str(out_dir), **kw)


def test_byte_tokenizer_round_trip():
    tok = get_tokenizer("byte")
    text = "plain ASCII, Ünïcödé and 😀"
    assert tok.encode(text) == list(text.encode("utf-8"))
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([104, 105, tok.eot_token, 33]) == "hi<|endoftext|>!"
    assert (tok.n_vocab, tok.eot_token) == (257, 256)


def test_unknown_tokenizer_and_bad_local_ranks(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="unknown tokenizer 'gpt3'"):
        get_tokenizer("gpt3")
    fake = tmp_path / "gpt2.tiktoken"
    fake.write_bytes(b"aGVsbG8= 0\n")
    monkeypatch.setenv("GRAPE_GPT2_RANKS", str(fake))
    get_tokenizer.cache_clear()
    try:
        with pytest.raises(DataError, match="is not that of the GPT-2 ranks"):
            get_tokenizer("gpt2")
    finally:
        get_tokenizer.cache_clear()


def test_whisper_ranks_found_without_importing_whisper(tmp_path, monkeypatch):
    from data import tokenizer

    assets = tmp_path / "whisper" / "assets"
    assets.mkdir(parents=True)
    (tmp_path / "whisper" / "__init__.py").write_text("raise ImportError('whisper must not be imported')\n")
    (assets / "gpt2.tiktoken").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert tokenizer._whisper_ranks_path() == str(assets / "gpt2.tiktoken")
    assert "whisper" not in sys.modules


def test_shard_written_by_hand_reads_back(tmp_path):
    # Build the file with plain numpy, independently of write_shard.
    tokens = np.array([0, 1, 65535, 256, 50256], dtype="<u2")
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    path = tmp_path / "x_val_000000.bin"
    path.write_bytes(header.tobytes() + tokens.tobytes())
    assert np.array_equal(open_shard(path), tokens)
    sha = write_shard(str(tmp_path / "y.bin"), tokens)
    assert (tmp_path / "y.bin").read_bytes() == path.read_bytes()
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("damage,message", [
    (lambda b: b[:100], "less than the 1024-byte shard header"),
    (lambda b: np.int32(123).tobytes() + b[4:], "magic number 123 is not 20240520"),
    (lambda b: b[:4] + np.int32(2).tobytes() + b[8:], "shard version 2 is not supported"),
    (lambda b: b[:-2], "header says 10 tokens"),
    (lambda b: b + b"\0\0", "header says 10 tokens"),
])
def test_header_errors_name_the_file(tmp_path, damage, message):
    path = tmp_path / "train_000001.bin"
    write_shard(str(path), np.arange(10))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataError, match=message) as err:
        read_header(path)
    assert str(path) in str(err.value) and "prepare" in str(err.value)


def test_jsonl_text_to_shards_to_text(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", DOCS[:20])
    write_jsonl(tmp_path / "b.jsonl", DOCS[20:])
    out = tmp_path / "out"
    manifest = run_prepare(prep.files_source(str(tmp_path / "*.jsonl")), out)
    reference = expected_stream(DOCS)
    assert np.array_equal(all_tokens(out), reference)
    # Decoding the shards and splitting at end-of-text gives back the documents.
    text = get_tokenizer("byte").decode(all_tokens(out).tolist())
    assert text.split("<|endoftext|>")[1:] == DOCS
    # Validation first (500 tokens), then train shards of at most 700, a new one at each file.
    sizes = [(s["split"], s["tokens"]) for s in manifest["shards"]]
    assert sizes == expected_layout([DOCS[:20], DOCS[20:]], 500, 700)
    assert [s["file"] for s in manifest["shards"]] == ["val_000000.bin"] + [f"train_{i:06d}.bin"
                                                                            for i in range(1, len(sizes))]
    n = len(reference) - 500
    assert manifest["tokens"] == {"val": 500, "train": n, "total": len(reference)}
    assert manifest["documents"] == len(DOCS) and read_manifest(str(out))["tokenizer"] == "byte"
    for shard in manifest["shards"]:
        assert shard["sha256"] == hashlib.sha256((out / shard["file"]).read_bytes()).hexdigest()
    assert sorted(os.listdir(out)) == sorted(["manifest.json"] + [s["file"] for s in manifest["shards"]])


def test_validation_split_spanning_several_shards_and_max_tokens(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", DOCS)
    manifest = run_prepare(prep.files_source(str(tmp_path / "a.jsonl")), tmp_path / "out",
                           val_tokens=1500, max_tokens=3001)
    # One file: shards of 700 from its start; the third is cut at 1500 tokens, the stream stops at 3001.
    assert [(s["split"], s["tokens"]) for s in manifest["shards"]] == [
        ("val", 700), ("val", 700), ("val", 100), ("train", 600), ("train", 700), ("train", 201)]
    assert manifest["documents"] == int(np.count_nonzero(expected_stream(DOCS)[:3001] == 256))
    assert np.array_equal(all_tokens(tmp_path / "out"), expected_stream(DOCS)[:3001])


def test_parquet_json_and_txt_sources(tmp_path):
    pq.write_table(pa.table({"text": DOCS[:30], "n": list(range(30))}), tmp_path / "p1.parquet")
    pq.write_table(pa.table({"text": DOCS[30:]}), tmp_path / "p2.parquet")
    run_prepare(prep.files_source(str(tmp_path / "*.parquet")), tmp_path / "pq")
    assert np.array_equal(all_tokens(tmp_path / "pq"), expected_stream(DOCS))

    (tmp_path / "arr.json").write_text(json.dumps([{"text": d} for d in DOCS]))
    run_prepare(prep.files_source(str(tmp_path / "arr.json")), tmp_path / "js")
    assert np.array_equal(all_tokens(tmp_path / "js"), expected_stream(DOCS))

    books = tmp_path / "books"
    books.mkdir()
    texts = ["First book.\nIt has two lines.\n", "Second book,\n\nwith a blank line.\n", "Third. " * 200]
    for i, text in enumerate(texts):
        (books / f"{i}.txt").write_text(text)
    # One document per .txt file by default.
    run_prepare(prep.files_source(str(books / "*.txt")), tmp_path / "txt", val_tokens=100)
    assert np.array_equal(all_tokens(tmp_path / "txt"), expected_stream(texts))


def test_source_errors(tmp_path):
    with pytest.raises(DataError, match="no files match"):
        prep.files_source(str(tmp_path / "*.jsonl"))
    (tmp_path / "a.jsonl").write_text('{"body": "no text field"}\n')
    (tmp_path / "b.txt").write_text("text")
    with pytest.raises(DataError, match="mixes .jsonl, .txt files"):
        prep.files_source(str(tmp_path / "*"))
    with pytest.raises(DataError, match="have no 'text' field \\(fields: body\\)"):
        run_prepare(prep.files_source(str(tmp_path / "a.jsonl")), tmp_path / "out")
    (tmp_path / "c.csv").write_text("text\nhello\n")
    with pytest.raises(DataError, match="type .csv"):
        prep.files_source(str(tmp_path / "*.csv"))


def test_everything_in_validation_is_an_error(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", DOCS[:3])
    with pytest.raises(DataError, match="all went to validation"):
        run_prepare(prep.files_source(str(tmp_path / "a.jsonl")), tmp_path / "out", val_tokens=10**6)


FILE_DOCS = [DOCS[0:9], [], DOCS[9:13], DOCS[13:30], DOCS[30:42]]  # five files, one of them empty


def write_files(folder, file_docs=FILE_DOCS):
    folder.mkdir(exist_ok=True)
    for i, docs in enumerate(file_docs):
        write_jsonl(folder / f"part{i}.jsonl", docs)
    return prep.files_source(str(folder / "part*.jsonl"))


# Validation ends inside the first file's third shard, and the stream stops inside the fourth file.
LAYOUT = {"val_tokens": 900, "shard_tokens": 333, "max_tokens": 3000}


def test_any_worker_count_gives_the_same_files(tmp_path):
    source = write_files(tmp_path / "in")
    one = run_prepare(source, tmp_path / "one", workers=1, **LAYOUT)
    assert [(s["split"], s["tokens"]) for s in one["shards"]] == expected_layout(FILE_DOCS, **LAYOUT)
    assert np.array_equal(all_tokens(tmp_path / "one"), expected_stream(DOCS[:42])[:3000])
    reference = directory_bytes(tmp_path / "one")
    for workers in (2, 3):
        run_prepare(source, tmp_path / f"w{workers}", workers=workers, **LAYOUT)
        assert directory_bytes(tmp_path / f"w{workers}") == reference, workers


@pytest.mark.parametrize("stop_after", [1, 2])
def test_interrupted_preparation_resumes_to_identical_shards(tmp_path, stop_after):
    source = write_files(tmp_path / "in")
    run_prepare(source, tmp_path / "full", **LAYOUT)
    reference = directory_bytes(tmp_path / "full")
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        run_prepare(source, out, stop_after_pieces=stop_after, **LAYOUT)
    # What a kill leaves behind, all in the preparation's scratch folder: a piece's partial temp file, a shard of a
    # piece without its record, and, killed while writing the plan, its temp file.
    [scratch] = out.glob(".prepare-*")
    (scratch / "parts" / "piece_000003_000000.bin.tmp").write_bytes(b"partial")
    (scratch / "parts" / "piece_000003_000000.bin").write_bytes(b"garbage")
    (scratch / ".finalize.json.x1y2z3.tmp").write_bytes(b'[{"file": ')
    with pytest.raises(KeyboardInterrupt):
        run_prepare(source, out, stop_after_pieces=1, workers=2, **LAYOUT)
    assert not (out / "manifest.json").exists()
    run_prepare(source, out, **LAYOUT)
    assert directory_bytes(out) == reference


def test_killed_after_the_last_piece_only_names_the_shards(tmp_path, monkeypatch):
    # Killed after the last piece's record: the re-run tokenises nothing again, it only names the shards.
    write_jsonl(tmp_path / "a.jsonl", DOCS)
    source = prep.files_source(str(tmp_path / "a.jsonl"))
    reference = run_prepare(source, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run_prepare(source, tmp_path / "out", stop_after_pieces=1)
    assert not (tmp_path / "out" / "manifest.json").exists()
    monkeypatch.setattr(prep, "_tokenize_piece", lambda task: pytest.fail(f"piece {task[0]} tokenised again"))
    manifest = run_prepare(source, tmp_path / "out")
    assert manifest["tokens"] == reference["tokens"] and manifest["documents"] == len(DOCS)
    assert directory_bytes(tmp_path / "out") == directory_bytes(tmp_path / "full")


def test_killed_while_naming_the_shards_resumes_to_identical_shards(tmp_path, monkeypatch, capsys):
    # Killed after half of the pieces were renamed or cut into named shards: their sources are gone, so the re-run
    # checks the named files and takes their hashes and document counts from them (the plan on disk has none for
    # the cut ones).
    source = write_files(tmp_path / "in")
    run_prepare(source, tmp_path / "full", **LAYOUT)
    real = prep._name_shards

    def killed_half_way(out_dir, parts, plan, eot):
        sources = list(dict.fromkeys(entry["from"] for entry in plan))
        done = set(sources[:len(sources) // 2])
        assert sum(entry["from"] in done and entry["sha256"] is None for entry in plan) >= 1  # a cut piece among them
        real(out_dir, parts, [entry for entry in plan if entry["from"] in done], eot)
        raise KeyboardInterrupt
    monkeypatch.setattr(prep, "_name_shards", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        run_prepare(source, tmp_path / "out", **LAYOUT)
    monkeypatch.setattr(prep, "_name_shards", real)
    monkeypatch.setattr(prep, "_tokenize_piece", lambda task: pytest.fail(f"piece {task[0]} tokenised again"))
    manifest = run_prepare(source, tmp_path / "out", progress_bar=True, **LAYOUT)
    assert directory_bytes(tmp_path / "out") == directory_bytes(tmp_path / "full")
    seconds = re.search(rf"wrote {len(manifest['shards'])} shards to {re.escape(str(tmp_path / 'out'))}: "
                        rf"{manifest['tokens']['val']:,} val \+ {manifest['tokens']['train']:,} train tokens from "
                        rf"{manifest['documents']:,} documents \(([0-9.]+) s this run\)", capsys.readouterr().err)
    assert seconds and 0 <= float(seconds[1]) < 600


def test_max_tokens_reads_no_further_than_needed(tmp_path):
    # The first file holds more than --max-tokens: the second one, which is not JSON at all, is never read.
    write_jsonl(tmp_path / "a.jsonl", DOCS)
    (tmp_path / "b.jsonl").write_text("this is not JSON\n")
    manifest = run_prepare(prep.files_source(str(tmp_path / "*.jsonl")), tmp_path / "out", max_tokens=1000)
    assert manifest["tokens"]["total"] == 1000
    assert np.array_equal(all_tokens(tmp_path / "out"), expected_stream(DOCS)[:1000])


def test_resume_refuses_other_arguments(tmp_path):
    source = write_files(tmp_path / "in")
    with pytest.raises(KeyboardInterrupt):
        run_prepare(source, tmp_path / "out", stop_after_pieces=1)
    with pytest.raises(DataError, match="other arguments"):
        run_prepare(source, tmp_path / "out", shard_tokens=999)


def test_script_entry_point_and_offline_hub_message(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", DOCS)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "data/prepare.py", "--files", str(tmp_path / "*.jsonl"), "--out",
                           str(tmp_path / "out"), "--tokenizer", "byte", "--val-tokens", "100", "--quiet"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(all_tokens(tmp_path / "out"), expected_stream(DOCS))

    hub = subprocess.run([sys.executable, "-m", "data.prepare", "--dataset", "fineweb-edu", "--version", "10B",
                          "--out", str(tmp_path / "hub")], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert hub.returncode == 2
    assert "offline" in hub.stderr and "--files" in hub.stderr and "Traceback" not in hub.stderr


def test_unreachable_hub_fails_at_once(monkeypatch):
    # A port on this machine with nothing listening stands in for a hub that cannot be reached.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(DataError, match="cannot reach the Hugging Face hub.*--files"):
        prep.hub_source("100B").open_dataset()
    with pytest.raises(DataError, match="unknown FineWeb-Edu version '5B'"):
        prep.hub_source("5B")


def test_default_corpus_is_the_embedded_text(tmp_path):
    out = prep.ensure_default_corpus(str(tmp_path / "default"), tokenizer="byte", progress_bar=False)
    with open(prep.DEFAULT_CORPUS_FILE, "rb") as f:
        docs = [json.loads(line)["text"] for line in lzma.decompress(f.read()).decode("utf-8").splitlines()]
    assert np.array_equal(all_tokens(out), expected_stream(docs))
    manifest = read_manifest(out)
    assert manifest["tokens"]["val"] == prep.DEFAULT_CORPUS_VAL_TOKENS["byte"] and manifest["tokens"]["train"] > 10**6
    stamp = os.path.getmtime(os.path.join(out, manifest["shards"][-1]["file"]))
    assert prep.ensure_default_corpus(out, tokenizer="byte", progress_bar=False) == out
    assert os.path.getmtime(os.path.join(out, manifest["shards"][-1]["file"])) == stamp
    # A cache made from another version of the corpus is rebuilt, not refused.
    manifest["config"]["source"]["sha256"] = manifest["source"]["sha256"] = "0" * 64
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    prep.ensure_default_corpus(out, tokenizer="byte", progress_bar=False)
    assert read_manifest(out)["source"]["sha256"] != "0" * 64
    assert np.array_equal(all_tokens(out), expected_stream(docs))


def test_damaged_progress_file_is_one_clear_error(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", DOCS)
    scratch = tmp_path / "out" / ".prepare-k3x9q2aa"
    scratch.mkdir(parents=True)
    (scratch / "progress.json").write_text('{"config": {"a": 1}, "pieces": [')  # (a disk that lost its end)
    with pytest.raises(DataError, match=f"{scratch}/progress.json is damaged .*; delete {scratch} and prepare again"):
        run_prepare(prep.files_source(str(tmp_path / "a.jsonl")), tmp_path / "out")


def test_verify_command_reads_every_shard(tmp_path, capsys):
    source = write_files(tmp_path / "in")
    manifest = run_prepare(source, tmp_path / "out", **LAYOUT)
    assert prep.main(["--verify", str(tmp_path / "out")]) == 0
    assert f"all {len(manifest['shards'])} shard(s) intact" in capsys.readouterr().out
    name = manifest["shards"][2]["file"]
    data = bytearray((tmp_path / "out" / name).read_bytes())
    data[HEADER_BYTES + 5] ^= 1  # still a byte token (< 257), so only the sha256 can tell
    (tmp_path / "out" / name).write_bytes(bytes(data))
    assert prep.main(["--verify", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{name} is damaged" in err and "1 of " in err and "python -m data.prepare --files" in err


def test_an_unquoted_files_glob_is_answered_with_how_to_quote_it(tmp_path, capsys):
    from data.prepare import parse_args
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        (tmp_path / name).write_text("{}\n")
    expanded = [str(tmp_path / name) for name in ("a.jsonl", "b.jsonl", "c.jsonl")]  # what the shell passes
    with pytest.raises(SystemExit):
        parse_args(["--files", *expanded, "--out", str(tmp_path / "out")])
    assert f"expanded it into 3 paths; quote it so that this script expands it, e.g. --files '{tmp_path}/*.jsonl'" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit):  # anything else unknown is still argparse's plain error
        parse_args(["--files", expanded[0], "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--file", expanded[0]])  # no abbreviations


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_the_hub_source_streams_and_checks_offline_mode_first(monkeypatch):
    calls = []

    class FakeDatasets:
        @staticmethod
        def load_dataset(*args, **kwargs):
            calls.append((args, kwargs))
            return "stream"
    monkeypatch.setattr(prep, "_quiet_datasets", lambda: FakeDatasets)
    monkeypatch.setattr(prep, "_check_hub", lambda: None)
    source = prep.hub_source("100B")
    assert source.description == {"kind": "hub", "dataset": "HuggingFaceFW/fineweb-edu", "config": "sample-100BT"}
    assert source.open_dataset() == "stream"
    assert calls == [(("HuggingFaceFW/fineweb-edu",), {"name": "sample-100BT", "split": "train", "streaming": True})]
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="offline mode is on"):
        prep.hub_source("10B").check()


def test_pieces_are_counted_in_a_child_process(tmp_path):
    for i in range(3):
        (tmp_path / f"part{i}.jsonl").write_text(json.dumps({"text": f"document {i}"}) + "\n")
    files = sorted(str(p) for p in tmp_path.glob("*.jsonl"))
    import datasets
    source = Source({"kind": "test"}, functools.partial(datasets.load_dataset, "json", data_files=files,
                                                        split="train", streaming=True))
    assert source.pieces is None
    assert prep._count_pieces(source) == 3


def test_an_adopted_manifest_has_the_fields_of_a_prepared_one(tmp_path):
    (tmp_path / "x").mkdir()
    prepared_dir = prepare_byte_corpus(tmp_path / "x", ["some text " * 50], val_tokens=100)
    prepared = json.loads(open(os.path.join(prepared_dir, "manifest.json")).read())
    folder = tmp_path / "llmc"
    folder.mkdir()
    write_shard(str(folder / "fineweb_val_000000.bin"), np.arange(20))
    write_shard(str(folder / "fineweb_train_000001.bin"), np.arange(50256, 50257))
    adopted = prep.adopt(str(folder))
    assert adopted["format"] == prepared["format"]
    assert adopted["eot_token"] == 50256 and adopted["tokenizer"] == "gpt2" and adopted["vocab_size"] == 50257
    assert adopted["tokens"] == {"val": 20, "train": 1, "total": 21}
    assert {"format", "tokenizer", "eot_token", "tokens", "shards"} <= set(prepared) & set(adopted)
    assert json.loads((folder / "manifest.json").read_text()) == adopted


@pytest.fixture
def no_preparation(monkeypatch):
    """ensure_default_corpus with prepare() replaced by a recorder that writes a manifest of the expected config."""
    prepared = []

    def fake_prepare(source, out_dir, tokenizer, val_tokens, shard_tokens, progress_bar):
        prepared.append(out_dir)
        config = {"source": source.description, "tokenizer": tokenizer, "val_tokens": val_tokens,
                  "shard_tokens": shard_tokens, "max_tokens": None}
        with open(os.path.join(out_dir, "manifest.json"), "w") as f:
            json.dump({"config": config}, f)
    monkeypatch.setattr(prep, "prepare", fake_prepare)
    return prepared


@pytest.mark.parametrize("tokenizer,folder", [("gpt2", "default"), ("byte", "default-byte")])
def test_the_default_corpus_folder_is_named_by_its_tokenizer(no_preparation, monkeypatch, tmp_path, tokenizer,
                                                              folder):
    monkeypatch.setattr(prep, "REPO_ROOT", str(tmp_path))
    assert prep.ensure_default_corpus(tokenizer=tokenizer) == str(tmp_path / "data_cache" / folder)
    assert no_preparation == [str(tmp_path / "data_cache" / folder)]


OLD_DEFAULT = {"config": {"source": {"kind": "default", "sha256": "older"}}, "shards": [{"file": "train_000001.bin"}]}


@pytest.mark.parametrize("manifest,rebuilt,shard_removed", [
    ("{damaged", True, False),                      # a damaged manifest of the cache: prepare() then judges the .bin
    (json.dumps(OLD_DEFAULT), True, True),          # another corpus version: the shards it lists go with it
    (json.dumps({"config": {"source": {"kind": "files"}}, "shards": [{"file": "train_000001.bin"}]}), False, False),
])
def test_a_damaged_or_outdated_default_corpus_cache_is_rebuilt(no_preparation, tmp_path, manifest, rebuilt,
                                                               shard_removed):
    """Rebuilding a cache removes its manifest.json and the shards that manifest lists, nothing else (it removed the
    whole folder, a user's README.txt in it too)."""
    out = tmp_path / "cache"
    out.mkdir()
    (out / "manifest.json").write_text(manifest)
    (out / "train_000001.bin").write_bytes(b"old shard")
    (out / "README.txt").write_text("my notes")
    prep.ensure_default_corpus(out_dir=str(out), tokenizer="byte")
    assert (out / "train_000001.bin").exists() == (not shard_removed)
    assert (out / "README.txt").read_text() == "my notes"
    assert no_preparation == [str(out)]
    if rebuilt:  # and a current cache is kept as it is
        prep.ensure_default_corpus(out_dir=str(out), tokenizer="byte")
        (out / "keep").write_text("")
        prep.ensure_default_corpus(out_dir=str(out), tokenizer="byte")
        assert (out / "keep").exists()


@pytest.mark.parametrize("endpoint, address", [("https://hub.example", ("hub.example", 443)),
                                               ("http://mirror.example", ("mirror.example", 80)),
                                               ("http://mirror.example:8080", ("mirror.example", 8080))])
def test_the_hub_check_connects_to_the_endpoints_port(monkeypatch, endpoint, address):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    tried = []

    def refuse(target, timeout):
        tried.append(target)
        raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(DataError, match=f"cannot reach the Hugging Face hub at {address[0]}:{address[1]} "):
        prep._check_hub()
    assert tried == [address]


def test_adopting_a_directory_that_has_a_manifest_points_to_verify(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_position_shards(folder, [40], val_first=100, val_tokens=16)
    with pytest.raises(DataError) as info:
        prep.adopt(str(folder))
    assert str(info.value) == (f"{folder} already has a manifest.json; `python -m data.prepare --verify {folder}` "
                               "checks its shards against it")


def test_the_default_corpus_never_rebuilds_over_a_directory_it_did_not_make(tmp_path):
    """A directory whose manifest has no preparation config (an adopted llm.c copy) is someone's data: refused in
    one sentence and left as it was, not deleted as a stale cache of the embedded corpus."""
    folder = tmp_path / "adopted"
    folder.mkdir()
    write_position_shards(folder, [40], val_first=100, val_tokens=16)
    before = {name: (folder / name).read_bytes() for name in os.listdir(folder)}
    with pytest.raises(DataError, match="already holds data prepared with other arguments; use another --out"):
        prep.ensure_default_corpus(str(folder), progress_bar=False)
    assert {name: (folder / name).read_bytes() for name in os.listdir(folder)} == before


def test_prepare_offers_its_tokenizers_and_every_txt_unit_on_the_command_line(capsys):
    args = prep.parse_args(["--default", "--txt-sample-by", "paragraph"])
    assert args.txt_sample_by == "paragraph"
    with pytest.raises(SystemExit):
        prep.parse_args(["--default", "--tokenizer", "nope"])
    assert "argument --tokenizer: invalid choice: 'nope'" in capsys.readouterr().err


# ------------------------------------------------- properties: the data round trip and checkpoint damage, for any input
# Prepare then load gives, for any documents (empty ones, any Unicode but lone surrogates, which UTF-8 cannot encode),
# split over any number of input files, with any validation size and shard size: <|endoftext|> (256) then the
# document's UTF-8 bytes, document after document, the first val_tokens of that stream in the validation shards and
# the rest in the train shards. A checkpoint with any single byte changed is refused or loads content equal to the
# original.


EOT = 256


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@examples(6)
@given(files=st.lists(st.lists(texts, min_size=1, max_size=4), min_size=1, max_size=3), data=st.data())
def test_prepare_then_load_gives_the_utf8_bytes_of_every_document(tmp_path_factory, files, data):
    root = tmp_path_factory.mktemp("docs")
    for i, documents in enumerate(files):
        with open(root / f"part{i}.jsonl", "w", encoding="utf-8") as f:
            for text in documents:
                f.write(json.dumps({"text": text}, ensure_ascii=data.draw(st.booleans())) + "\n")
    stream = [token for documents in files for text in documents for token in [EOT, *text.encode("utf-8")]]
    val_tokens = data.draw(st.integers(1, len(stream) - 1)) if len(stream) > 1 else 0
    shard_tokens = data.draw(st.integers(1, max(1, len(stream))))
    if val_tokens == 0:
        return  # a single empty document: nothing to split
    out = root / "prepared"
    manifest = prepare(files_source(str(root / "*.jsonl")), str(out), tokenizer="byte", val_tokens=val_tokens,
                       shard_tokens=shard_tokens, workers=1, progress_bar=False)
    val, train = load_split_tokens(str(out), "val"), load_split_tokens(str(out), "train")
    assert val.tolist() == stream[:val_tokens]
    assert train.tolist() == stream[val_tokens:]
    assert manifest["tokens"]["val"] == val_tokens and manifest["tokens"]["train"] == len(stream) - val_tokens
    assert all(shard["tokens"] <= shard_tokens for shard in manifest["shards"])


@given(text=texts)
def test_the_byte_tokenizer_is_utf8_and_round_trips(text):
    from data.tokenizer import get_tokenizer
    tok = get_tokenizer("byte")
    assert tok.encode(text) == list(text.encode("utf-8"))
    assert tok.decode(tok.encode(text)) == text
    assert tok.eot_token == EOT and tok.n_vocab > EOT


# -------------------------------------------------- properties: every threshold at, just below and just above its limit
# Each limit is written here from its documented rule, not read from the code: the divergence rules
# (training/divergence.py's docstring), the config's ranges (TrainConfig's field comments), token ids against the
# vocabulary (a batch, a shard, an adopted GPT-2 folder) and the memory check before any work. "Just below" and "just
# above" are the neighbouring float (math.nextafter) or integer, so a comparison moved by one is caught.


@pytest.mark.parametrize("largest,accepted", [(50255, True), (50256, True), (50257, False), (65535, False)])
def test_adopt_accepts_gpt2_ids_only(tmp_path, largest, accepted):
    from data.prepare import adopt
    write_shard(str(tmp_path / "fineweb_val_000000.bin"), np.arange(30))
    write_shard(str(tmp_path / "fineweb_train_000001.bin"), np.r_[np.arange(30), largest])
    if accepted:
        manifest = adopt(str(tmp_path))
        assert manifest["vocab_size"] == 50257 and [s["tokens"] for s in manifest["shards"]] == [30, 31]
    else:
        with pytest.raises(DataError, match=f"holds token id {largest}, beyond GPT-2's 50257 ids"):
            adopt(str(tmp_path))
        assert not os.path.exists(tmp_path / "manifest.json")


def test_the_preparation_lock_is_skipped_only_where_it_cannot_be_made(tmp_path, monkeypatch):
    """A lock file that cannot be made because the folder is read-only or not ours (EACCES, EPERM, EROFS) means
    this process could not write the shards either: it takes no turn and goes on (the preparation then says what
    is wrong). Any other failure to make it (a full disk, say) is raised, not silently run without the lock."""
    import errno

    from data import prepare as prep

    out = tmp_path / "corpus"
    with prep.preparation_lock(str(out)):
        assert os.path.isfile(prep.lock_path(str(out)))  # the normal case makes the lock file beside out
    real_open = open

    def refused(code):
        def opener(path, *args, **kwargs):
            if str(path).endswith(".lock"):
                raise OSError(code, os.strerror(code), str(path))
            return real_open(path, *args, **kwargs)
        return opener

    for code in (errno.EACCES, errno.EPERM, errno.EROFS):
        monkeypatch.setattr(prep, "open", refused(code), raising=False)
        with prep.preparation_lock(str(tmp_path / "other")):
            entered = code
        assert entered == code
    for code in (errno.ENOSPC, errno.EIO):
        monkeypatch.setattr(prep, "open", refused(code), raising=False)
        with pytest.raises(OSError) as error:
            with prep.preparation_lock(str(tmp_path / "other")):
                pytest.fail("entered without the lock after an error that is not a read-only folder")
        assert error.value.errno == code


# ------------------------------------------------------------------ input no re-run can read: named, with its fix

@pytest.mark.fault
def test_a_text_that_is_not_a_string_names_its_row_and_leaves_nothing_to_resume(tmp_path, capsys):
    rows = [{"text": DOCS[i]} for i in range(3)] + [{"text": 5}] + [{"text": DOCS[i]} for i in range(4, 9)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert prep.main(["--files", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out"), "--tokenizer", "byte",
                      "--val-tokens", "100", "--workers", "1", "--quiet"]) == 2  # (was a TypeError traceback)
    assert capsys.readouterr().err == (f"error: the 'text' of row 4 of {tmp_path / 'in.jsonl'} is 5, not a string; "
                                       "fix or remove that row, then run the same command again\n")
    assert not (tmp_path / "out").exists()  # the fixed file is another source: no unfinished run is left in the way
    rows[3]["text"] = DOCS[3]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_prepare(prep.files_source(str(tmp_path / "in.jsonl")), tmp_path / "out", val_tokens=100)
    assert np.array_equal(all_tokens(tmp_path / "out"), expected_stream(DOCS[:9]))


def test_a_null_text_is_an_empty_document_as_a_row_without_text_is(tmp_path):
    # datasets gives null for a row that lacks 'text' where other rows have it, so null is taken as "" is.
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": DOCS[0]}) + "\n" + json.dumps({"text": None}) + "\n"
                                       + json.dumps({"body": "x"}) + "\n" + json.dumps({"text": DOCS[1]}) + "\n")
    manifest = run_prepare(prep.files_source(str(tmp_path / "in.jsonl")), tmp_path / "out", val_tokens=10)
    assert manifest["documents"] == 4 and manifest["empty_documents"] == 2
    assert np.array_equal(all_tokens(tmp_path / "out"), expected_stream([DOCS[0], "", "", DOCS[1]]))


@pytest.mark.fault
def test_documents_without_text_are_counted_aloud_even_when_quiet(tmp_path, capsys):
    """Rows with a null 'text' or none became empty documents silently (a wrong field name looks like that)."""
    rows = [{"text": DOCS[0]}, {"text": None}, {"body": "x"}, {"text": ""}, {"text": DOCS[1]}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert prep.main(["--files", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out"), "--tokenizer", "byte",
                      "--val-tokens", "10", "--quiet"]) == 0
    assert capsys.readouterr().err == ("note: 3 of the 5 documents had no text (a null 'text', no 'text' field among "
                                       "rows that have one, or an empty string); each is an <|endoftext|> token "
                                       "alone in the shards\n")
    (tmp_path / "full.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[:3]))
    assert prep.main(["--files", str(tmp_path / "full.jsonl"), "--out", str(tmp_path / "full"), "--tokenizer", "byte",
                      "--val-tokens", "10", "--quiet"]) == 0
    assert capsys.readouterr().err == "" and read_manifest(str(tmp_path / "full"))["empty_documents"] == 0


@pytest.mark.fault
@pytest.mark.parametrize("by,error,other", [
    ("document", "ArrowCapacityError", " or read it by paragraph (--txt-sample-by paragraph, each blank-line-separated "
                                       "paragraph one document)"),
    ("line", "MemoryError", ""),
])
def test_a_text_file_too_large_to_read_at_once_says_how_to_split_it(tmp_path, by, error, other):
    """A 3 GB .txt read as one document was 'cannot be read as UTF-8 text (ArrowCapacityError ...)', and by line
    '(MemoryError: )': the cause is the size of one piece, and the remedy is to split the file."""
    import pyarrow
    big = tmp_path / "big.txt"
    big.write_text("x" * 1000)
    exc = pyarrow.lib.ArrowCapacityError("array cannot contain more than 2147483646 bytes") \
        if error == "ArrowCapacityError" else MemoryError()

    def rows():
        yield {"text": "a first document"}
        raise exc
    with pytest.raises(prep.BadInput) as refused:
        list(prep._document_batches(rows(), {"format": "text", "txt_sample_by": by}, str(big)))
    assert str(refused.value) == (
        f"{big} (1,000 bytes) holds a {by} too large to read at once ({error}); split it into files of a few hundred "
        f"MB at line ends, e.g. `split -C 256M --additional-suffix=.txt {big} {big}.part_`, and prepare those "
        f"(--files '{big}.part_*.txt'){other}")


@pytest.mark.parametrize("name,content,kind", [
    ("a.jsonl", b"this is plain text\nnot json\n", "JSON"),
    ("a.jsonl", b'{"text": "whole"}\n{"text": "cut off mid-wri', "JSON"),  # a truncated last line
    ("a.txt", "caf\u00e9 au lait\n".encode("latin-1"), "UTF-8 text"),
])
@pytest.mark.fault
def test_input_that_cannot_be_read_names_the_file_to_fix_not_a_rerun(tmp_path, capsys, name, content, kind):
    write_jsonl(tmp_path / "0.jsonl", DOCS[:3]) if name.endswith(".jsonl") else (tmp_path / "0.txt").write_text("ok")
    (tmp_path / name).write_bytes(content)
    pattern = str(tmp_path / ("*" + os.path.splitext(name)[1]))
    assert prep.main(["--files", pattern, "--out", str(tmp_path / "out"), "--tokenizer", "byte", "--val-tokens", "10",
                      "--workers", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / name} cannot be read as {kind} (") and err.count("\n") == 1
    assert err.endswith("); fix or remove that file, then run the same command again\n") and "re-run" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.fault
@pytest.mark.parametrize("out", ["afile", "afile/below"])
def test_an_out_that_is_a_file_or_below_one_says_a_file_is_in_the_way(tmp_path, capsys, out):
    write_jsonl(tmp_path / "in.jsonl", DOCS)
    (tmp_path / "afile").write_text("mine")
    for command in (["--files", str(tmp_path / "in.jsonl")], ["--default"]):
        assert prep.main(command + ["--out", str(tmp_path / out), "--tokenizer", "byte", "--quiet"]) == 2
        assert capsys.readouterr().err == (f"error: cannot prepare into {tmp_path / out}: {tmp_path / 'afile'} is a "
                                           "file, not a folder; give --out another path or move that file aside\n")
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.fault
def test_an_out_holding_shards_no_preparation_made_is_refused_and_they_are_kept(tmp_path, capsys):
    """An --out folder that already holds .bin files of the user's own (llm.c shards, say) and no preparation of
    ours: starting afresh there deleted every one of them; refused now, each file as it was."""
    write_jsonl(tmp_path / "in.jsonl", DOCS)
    out = tmp_path / "shards"
    out.mkdir()
    (out / "fineweb_train_000001.bin").write_bytes(b"mine" * 100)
    (out / "notes.txt").write_text("kept")
    assert prep.main(["--files", str(tmp_path / "in.jsonl"), "--out", str(out), "--tokenizer", "byte", "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"error: {out} already holds 1 .bin file(s) that no preparation made (fineweb_train_000001.bin, ...), which "
        f"preparing there would delete; give --out a new folder, or record shards made elsewhere with "
        f"`python -m data.prepare --adopt {out}`\n")
    assert (out / "fineweb_train_000001.bin").read_bytes() == b"mine" * 100
    assert sorted(os.listdir(out)) == ["fineweb_train_000001.bin", "notes.txt"]


@pytest.mark.fault
def test_a_users_shards_named_like_ours_are_refused_and_kept(tmp_path, capsys):
    """llm.c-style shards of the user's own, named val_000000.bin and train_00000N.bin as ours are, in a folder
    without manifest: a name proves nothing, so they were overwritten; only shards whose header carries
    data.prepare's mark are its own."""
    write_jsonl(tmp_path / "in.jsonl", DOCS)
    out = tmp_path / "mine"
    out.mkdir()
    for name in ("val_000000.bin", "train_000001.bin", "train_000002.bin"):
        write_shard(str(out / name), np.arange(50))  # a valid shard, as llm.c writes it
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert prep.main(["--files", str(tmp_path / "in.jsonl"), "--out", str(out), "--tokenizer", "byte", "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"error: {out} already holds 3 .bin file(s) that no preparation made (train_000001.bin, ...), which "
        f"preparing there would delete; give --out a new folder, or record shards made elsewhere with "
        f"`python -m data.prepare --adopt {out}`\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_prepared_shards_carry_the_mark_and_others_do_not(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", DOCS)
    out = tmp_path / "data"
    prep.prepare(prep.files_source(str(tmp_path / "in.jsonl")), str(out), tokenizer="byte", val_tokens=100,
                 workers=1, progress_bar=False)
    shards = sorted(out.glob("*.bin"))
    assert shards and all(is_prepared_shard(p) for p in shards)
    assert all(int(np.fromfile(p, dtype="<i4", count=4)[3]) == int.from_bytes(b"GRPE", "little") for p in shards)
    write_shard(str(tmp_path / "plain.bin"), np.arange(5))
    assert not is_prepared_shard(tmp_path / "plain.bin") and not is_prepared_shard(tmp_path / "absent.bin")
    (tmp_path / "short.bin").write_bytes(b"GRPE")
    assert not is_prepared_shard(tmp_path / "short.bin")


@pytest.mark.fault
def test_the_default_corpus_refuses_a_folder_with_another_tools_manifest(tmp_path):
    out = tmp_path / "cache"
    out.mkdir()
    (out / "manifest.json").write_text("[]")  # (was an AttributeError)
    with pytest.raises(DataError, match="manifest.json was not written by data.prepare \\(it holds a JSON list"):
        prep.ensure_default_corpus(str(out), tokenizer="byte", progress_bar=False)
    assert (out / "manifest.json").read_text() == "[]"


@pytest.mark.fault
def test_a_damaged_manifest_deleted_as_advised_then_prepares_the_folder_afresh(tmp_path, capsys):
    """The advice for a damaged manifest.json is to delete it and run the same command again: the folder's own
    shards (named train_/val_NNNNNN.bin) are then no one else's files, and are prepared afresh, not refused."""
    write_jsonl(tmp_path / "in.jsonl", DOCS)
    out = tmp_path / "data"
    command = ["--files", str(tmp_path / "in.jsonl"), "--out", str(out), "--tokenizer", "byte", "--val-tokens", "100",
               "--quiet"]
    assert prep.main(command) == 0
    shards = {p.name: p.read_bytes() for p in out.glob("*.bin")}
    assert shards and all(re.fullmatch(r"(train|val)_\d{6}\.bin", name) for name in shards)
    (out / "manifest.json").write_text("{damaged")
    assert prep.main(command) == 2 and "delete it and run the data.prepare command" in capsys.readouterr().err
    (out / "manifest.json").unlink()
    assert prep.main(command) == 0, capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.glob("*.bin")} == shards and (out / "manifest.json").exists()


# ------------------------------------------------------------------ a preparation deletes only what it wrote

def tree_bytes(folder):
    """Every file under folder (hidden ones too), by relative path, with its bytes."""
    return {os.path.relpath(os.path.join(root, name), folder): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(folder) for name in names}


@pytest.mark.fault
def test_an_input_inside_out_is_refused_before_any_work_and_kept(tmp_path, capsys):
    """`--files 'DIR/parts/*.jsonl' --out DIR` removed DIR/parts/ (the input itself and a README.txt beside it),
    then said the input "is not JSON"; refused now in one sentence, every file as it was."""
    folder = tmp_path / "DIR"
    (folder / "parts").mkdir(parents=True)
    write_jsonl(folder / "parts" / "a.jsonl", DOCS)
    (folder / "parts" / "README.txt").write_text("where these documents come from")
    before = tree_bytes(folder)
    code = prep.main(["--files", str(folder / "parts" / "*.jsonl"), "--out", str(folder), "--tokenizer", "byte",
                      "--quiet"])
    assert code == 2
    assert capsys.readouterr().err == (f"error: the input {folder}/parts/a.jsonl lies inside --out {folder}; give "
                                       "--out a folder that holds none of the input files\n")
    assert tree_bytes(folder) == before
    assert not os.path.exists(prep.lock_path(str(folder)))  # refused before any work: not even the lock was taken


@pytest.mark.fault
@pytest.mark.parametrize("stop_after", [None, 1])
def test_a_users_files_in_out_are_left_byte_for_byte_whatever_their_names(tmp_path, capsys, stop_after):
    """With the input elsewhere, a user's DIR/parts/*, DIR/*.tmp and DIR/README.txt were deleted silently with exit
    0 (the preparation's scratch names were OUT/parts and *.tmp). They are kept now, through an interrupted run and
    its resume too, and the shards are those of a preparation into an empty folder."""
    source = write_files(tmp_path / "in")
    run_prepare(source, tmp_path / "clean", **LAYOUT)
    folder = tmp_path / "DIR"
    (folder / "parts").mkdir(parents=True)
    users = {"parts/piece_000000.json": b'{"mine": 1}', "parts/notes.md": b"# notes", "x.tmp": b"half an edit",
             "manifest.json.tmp": b"draft", "finalize.json": b"[]", "README.txt": b"what this folder is for"}
    for name, content in users.items():
        (folder / name).write_bytes(content)
    if stop_after is not None:
        with pytest.raises(KeyboardInterrupt):
            run_prepare(source, folder, stop_after_pieces=stop_after, **LAYOUT)
    run_prepare(source, folder, **LAYOUT)
    after = tree_bytes(folder)
    assert {name: after.get(name) for name in users} == users
    assert {name: data for name, data in after.items() if name not in users} == tree_bytes(tmp_path / "clean")


@pytest.mark.fault
def test_a_preparation_through_a_symlink_and_one_through_the_real_path_take_turns(tmp_path):
    """The lock file was named from the path as given, so two preparations of one folder, one through a symlink,
    did not wait for each other."""
    real = tmp_path / "real" / "corpus"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    link = tmp_path / "link" / "corpus"
    assert prep.lock_path(str(link)) == prep.lock_path(str(real)) == str(tmp_path / "real" / ".corpus.lock")
    script = (f"from data import prepare as p\nwith p.preparation_lock({str(link)!r}):\n    print('got it', flush=True)")
    with prep.preparation_lock(str(real)):
        other = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        waiting = other.stderr.readline()
        assert waiting.startswith(f"waiting for another process to finish preparing {link}"), waiting
        assert other.poll() is None
    assert other.communicate(timeout=60)[0] == "got it\n" and other.returncode == 0


@pytest.mark.fault
@pytest.mark.parametrize("flags", [["--val-tokens", "1000"], ["--max-tokens=5000"], ["--shard-tokens", "700"],
                                   ["--val-tokens", "0", "--shard-tokens", "700"]])
def test_default_refuses_the_layout_flags_it_does_not_honour(tmp_path, capsys, flags):
    """--default silently ignored --val-tokens, --max-tokens and --shard-tokens (and --val-tokens 0 too)."""
    out = tmp_path / "default"
    assert prep.main(["--default", "--out", str(out), "--tokenizer", "byte", "--quiet", *flags]) == 2
    named = ", ".join(flag.split("=")[0] for flag in flags if flag.startswith("--"))
    assert capsys.readouterr().err == (
        f"error: --default prepares the embedded corpus with its fixed split and shard size, so it does not take "
        f"{named}; prepare the corpus file {prep.DEFAULT_CORPUS_FILE} with --files (after unpacking it with xz -dk) "
        "to choose those\n")
    assert not out.exists()
