"""data/prepare.py where generated mutants found no test (tools/mutants.py): the hub source streams and refuses at
once when offline (tested in-process: the script's own test runs it as __main__), pieces counted in a child
process, an adopted manifest's fields against a prepared one's, and the default corpus' cache folder (its name
per tokenizer; a damaged or outdated cache rebuilt, another folder left alone)."""
import functools
import json
import os

import numpy as np
import pytest

from data import prepare
from data.prepare import DataError, Source
from data.shards import write_shard
from helpers import prepare_byte_corpus


def test_the_hub_source_streams_and_checks_offline_mode_first(monkeypatch):
    calls = []

    class FakeDatasets:
        @staticmethod
        def load_dataset(*args, **kwargs):
            calls.append((args, kwargs))
            return "stream"
    monkeypatch.setattr(prepare, "_quiet_datasets", lambda: FakeDatasets)
    monkeypatch.setattr(prepare, "_check_hub", lambda: None)
    source = prepare.hub_source("100B")
    assert source.description == {"kind": "hub", "dataset": "HuggingFaceFW/fineweb-edu", "config": "sample-100BT"}
    assert source.open_dataset() == "stream"
    assert calls == [(("HuggingFaceFW/fineweb-edu",), {"name": "sample-100BT", "split": "train", "streaming": True})]
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="offline mode is on"):
        prepare.hub_source("10B").check()


def test_pieces_are_counted_in_a_child_process(tmp_path):
    for i in range(3):
        (tmp_path / f"part{i}.jsonl").write_text(json.dumps({"text": f"document {i}"}) + "\n")
    files = sorted(str(p) for p in tmp_path.glob("*.jsonl"))
    import datasets
    source = Source({"kind": "test"}, functools.partial(datasets.load_dataset, "json", data_files=files,
                                                        split="train", streaming=True))
    assert source.pieces is None
    assert prepare._count_pieces(source) == 3


def test_an_adopted_manifest_has_the_fields_of_a_prepared_one(tmp_path):
    (tmp_path / "x").mkdir()
    prepared_dir = prepare_byte_corpus(tmp_path / "x", ["some text " * 50], val_tokens=100)
    prepared = json.loads(open(os.path.join(prepared_dir, "manifest.json")).read())
    folder = tmp_path / "llmc"
    folder.mkdir()
    write_shard(str(folder / "fineweb_val_000000.bin"), np.arange(20))
    write_shard(str(folder / "fineweb_train_000001.bin"), np.arange(50256, 50257))
    adopted = prepare.adopt(str(folder))
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
    monkeypatch.setattr(prepare, "prepare", fake_prepare)
    return prepared


@pytest.mark.parametrize("tokenizer,folder", [("gpt2", "default"), ("byte", "default-byte")])
def test_the_default_corpus_folder_is_named_by_its_tokenizer(no_preparation, monkeypatch, tmp_path, tokenizer,
                                                              folder):
    monkeypatch.setattr(prepare, "REPO_ROOT", str(tmp_path))
    assert prepare.ensure_default_corpus(tokenizer=tokenizer) == str(tmp_path / "data_cache" / folder)
    assert no_preparation == [str(tmp_path / "data_cache" / folder)]


@pytest.mark.parametrize("manifest,rebuilt", [
    ("{damaged", True),                                                          # a damaged manifest of the cache
    (json.dumps({"config": {"source": {"kind": "default", "sha256": "older"}}}), True),  # another corpus version
    (json.dumps({"config": {"source": {"kind": "files"}}}), False),              # not a default-corpus folder
])
def test_a_damaged_or_outdated_default_corpus_cache_is_rebuilt(no_preparation, tmp_path, manifest, rebuilt):
    out = tmp_path / "cache"
    out.mkdir()
    (out / "manifest.json").write_text(manifest)
    (out / "train_000001.bin").write_bytes(b"old shard")
    prepare.ensure_default_corpus(out_dir=str(out), tokenizer="byte")
    assert (out / "train_000001.bin").exists() == (not rebuilt)
    assert no_preparation == [str(out)]
    if rebuilt:  # and a current cache is kept as it is
        prepare.ensure_default_corpus(out_dir=str(out), tokenizer="byte")
        (out / "keep").write_text("")
        prepare.ensure_default_corpus(out_dir=str(out), tokenizer="byte")
        assert (out / "keep").exists()
