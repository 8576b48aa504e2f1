"""Tokenizers, shard files and data/prepare.py (the command line, the preparation end to end, the embedded corpus),
with the byte tokenizer (no GPT-2 vocabulary needed)."""
import hashlib
import json
import lzma
import os
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from data.loader import load_split_tokens, read_manifest
from data.prepare import files_source, prepare
from data.shards import DataError, HEADER_BYTES, open_shard, read_header, write_shard
from data.tokenizer import get_tokenizer
from data import prepare as prep
from helpers import examples, write_position_shards
from prepare_helpers import (DOCS, expected_stream, write_jsonl, all_tokens, expected_layout, run_prepare, write_files,
                             LAYOUT, tree_bytes)


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


def test_everything_in_validation_is_an_error(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", DOCS[:3])
    with pytest.raises(DataError, match="all went to validation"):
        run_prepare(prep.files_source(str(tmp_path / "a.jsonl")), tmp_path / "out", val_tokens=10**6)


def test_resume_refuses_other_arguments(tmp_path):
    source = write_files(tmp_path / "in")
    with pytest.raises(KeyboardInterrupt):
        run_prepare(source, tmp_path / "out", stop_after_pieces=1)
    with pytest.raises(DataError, match="other arguments"):
        run_prepare(source, tmp_path / "out", shard_tokens=999)


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
    write_shard(str(out / "train_000001.bin"), np.arange(8), prepared=True)
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


@pytest.mark.fault
def test_an_outdated_cache_never_removes_a_file_its_manifest_names_without_a_preparations_mark(tmp_path):
    """The outdated cache's manifest names train_000001.bin, but that file is the user's (no mark in its header): a
    name in a manifest proves nothing, so it is kept byte for byte and the rebuild is refused in one sentence."""
    out = tmp_path / "cache"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps(OLD_DEFAULT))
    write_shard(str(out / "train_000001.bin"), np.arange(8))  # llm.c's layout, header[3] = 0
    before = (out / "train_000001.bin").read_bytes()
    with pytest.raises(DataError, match="train_000001.bin"):
        prep.ensure_default_corpus(out_dir=str(out), tokenizer="byte", progress_bar=False)
    assert (out / "train_000001.bin").read_bytes() == before


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


@pytest.mark.fault
def test_the_default_corpus_refuses_a_folder_with_another_tools_manifest(tmp_path):
    out = tmp_path / "cache"
    out.mkdir()
    (out / "manifest.json").write_text("[]")  # (was an AttributeError)
    with pytest.raises(DataError, match="manifest.json was not written by data.prepare \\(it holds a JSON list"):
        prep.ensure_default_corpus(str(out), tokenizer="byte", progress_bar=False)
    assert (out / "manifest.json").read_text() == "[]"


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


@pytest.mark.fault
def test_an_out_that_is_a_symlink_to_the_inputs_folder_is_refused_and_one_to_another_folder_is_not(tmp_path, capsys):
    """--out given as a symlink to the folder that holds the input (or to a folder above it) is that folder: refused
    as the input's own folder is, every file as it was; a symlink to a folder without the input is prepared into."""
    from data import scratch
    real = tmp_path / "real"
    (real / "parts").mkdir(parents=True)
    write_jsonl(real / "parts" / "a.jsonl", DOCS)
    (tmp_path / "link").symlink_to(real)
    before = tree_bytes(real)
    files = ["--files", str(real / "parts" / "*.jsonl"), "--tokenizer", "byte", "--val-tokens", "100", "--quiet"]
    for out in (tmp_path / "link", tmp_path / "link" / "parts"):
        assert prep.main(files + ["--out", str(out)]) == 2
        assert capsys.readouterr().err == (f"error: the input {real}/parts/a.jsonl lies inside --out {out}; give "
                                           "--out a folder that holds none of the input files\n")
        assert not os.path.exists(scratch.lock_path(str(out)))  # refused before any work
    assert tree_bytes(real) == before
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "other-link").symlink_to(tmp_path / "elsewhere")
    assert prep.main(files + ["--out", str(tmp_path / "other-link")]) == 0, capsys.readouterr().err
    assert np.array_equal(all_tokens(tmp_path / "elsewhere"), expected_stream(DOCS))
