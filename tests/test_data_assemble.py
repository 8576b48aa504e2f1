"""data/assemble.py: the plan that names the shards, a kill while naming, the mark of prepared shards, and --adopt."""
import json
import os
import re

import numpy as np
import pytest

from data.shards import HEADER_BYTES, DataError, is_prepared_shard, write_shard
from data import assemble, pipeline
from data import prepare as prep
from helpers import prepare_byte_corpus, write_position_shards
from prepare_helpers import (DOCS, expected_stream, write_jsonl, all_tokens, directory_bytes, run_prepare, write_files,
                             LAYOUT)


def test_validation_split_spanning_several_shards_and_max_tokens(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", DOCS)
    manifest = run_prepare(prep.files_source(str(tmp_path / "a.jsonl")), tmp_path / "out",
                           val_tokens=1500, max_tokens=3001)
    # One file: shards of 700 from its start; the third is cut at 1500 tokens, the stream stops at 3001.
    assert [(s["split"], s["tokens"]) for s in manifest["shards"]] == [
        ("val", 700), ("val", 700), ("val", 100), ("train", 600), ("train", 700), ("train", 201)]
    assert manifest["documents"] == int(np.count_nonzero(expected_stream(DOCS)[:3001] == 256))
    assert np.array_equal(all_tokens(tmp_path / "out"), expected_stream(DOCS)[:3001])


def test_killed_while_naming_the_shards_resumes_to_identical_shards(tmp_path, monkeypatch, capsys):
    # Killed after half of the pieces were renamed or cut into named shards: their sources are gone, so the re-run
    # checks the named files and takes their hashes and document counts from them (the plan on disk has none for
    # the cut ones).
    source = write_files(tmp_path / "in")
    run_prepare(source, tmp_path / "full", **LAYOUT)
    real = prep.name_shards

    def killed_half_way(out_dir, parts, plan, eot):
        sources = list(dict.fromkeys(entry["from"] for entry in plan))
        done = set(sources[:len(sources) // 2])
        assert sum(entry["from"] in done and entry["sha256"] is None for entry in plan) >= 1  # a cut piece among them
        real(out_dir, parts, [entry for entry in plan if entry["from"] in done], eot)
        raise KeyboardInterrupt
    monkeypatch.setattr(prep, "name_shards", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        run_prepare(source, tmp_path / "out", **LAYOUT)
    monkeypatch.setattr(prep, "name_shards", real)
    monkeypatch.setattr(pipeline, "tokenize_piece", lambda task: pytest.fail(f"piece {task[0]} tokenised again"))
    manifest = run_prepare(source, tmp_path / "out", progress_bar=True, **LAYOUT)
    assert directory_bytes(tmp_path / "out") == directory_bytes(tmp_path / "full")
    seconds = re.search(rf"wrote {len(manifest['shards'])} shards to {re.escape(str(tmp_path / 'out'))}: "
                        rf"{manifest['tokens']['val']:,} val \+ {manifest['tokens']['train']:,} train tokens from "
                        rf"{manifest['documents']:,} documents \(([0-9.]+) s this run\)", capsys.readouterr().err)
    assert seconds and 0 <= float(seconds[1]) < 600


def test_a_rerun_rewrites_exactly_the_shards_that_are_missing_or_damaged_in_place(tmp_path, monkeypatch, capsys):
    """A shard with one token byte flipped (its size and header count unchanged) is as damaged as a deleted one:
    the same command again rewrites both, each from its own piece, and tokenises no other piece."""
    source = write_files(tmp_path / "in")
    out = tmp_path / "out"
    shards = run_prepare(source, out, **LAYOUT)["shards"]
    before = directory_bytes(out)
    deleted = shards[1]
    flipped = next(s for s in reversed(shards) if s["piece"] != deleted["piece"] and s["tokens"] > 100)
    damaged = bytearray((out / flipped["file"]).read_bytes())
    damaged[HEADER_BYTES + 2 * 50] ^= 1  # the 51st token's low byte
    (out / flipped["file"]).write_bytes(damaged)
    (out / deleted["file"]).unlink()
    tokenised = []
    real = assemble.tokenize_piece
    monkeypatch.setattr(assemble, "tokenize_piece", lambda task: tokenised.append(task[0]) or real(task))
    run_prepare(source, out, progress_bar=True, **LAYOUT)
    assert directory_bytes(out) == before
    assert sorted(tokenised) == sorted({deleted["piece"], flipped["piece"]})
    assert (f"rewrote 2 damaged or missing shard(s) of {out}: {deleted['file']}, {flipped['file']}\n"
            in capsys.readouterr().err)


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


def test_adopting_a_directory_that_has_a_manifest_points_to_verify(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_position_shards(folder, [40], val_first=100, val_tokens=16)
    with pytest.raises(DataError) as info:
        prep.adopt(str(folder))
    assert str(info.value) == (f"{folder} already has a manifest.json; `python -m data.prepare --verify {folder}` "
                               "checks its shards against it")


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
