"""data/sources.py: the document sources (hub, local files) and what a source that cannot be read says."""
import errno
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.shards import DataError
from data import sources
from data import prepare as prep
from prepare_helpers import REPO, DOCS, expected_stream, write_jsonl, all_tokens, run_prepare


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


def test_upper_case_extensions_are_the_kind_their_lower_case_names_are(tmp_path):
    """A.JSONL and B.TXT (names another tool or system chose) are read as .jsonl and .txt, and an upper- and a
    lower-case .jsonl go in one run, in sorted path order."""
    (tmp_path / "js").mkdir()
    write_jsonl(tmp_path / "js" / "A.JSONL", DOCS[:20])
    write_jsonl(tmp_path / "js" / "b.jsonl", DOCS[20:])
    source = prep.files_source(str(tmp_path / "js" / "*"))
    assert source.description["format"] == "json"
    run_prepare(source, tmp_path / "js-out")
    assert np.array_equal(all_tokens(tmp_path / "js-out"), expected_stream(DOCS))

    books = tmp_path / "books"
    books.mkdir()
    texts = ["Upper-case name.\nTwo lines.\n", "Mixed case. " * 100]
    (books / "0.TXT").write_text(texts[0])
    (books / "1.Txt").write_text(texts[1])
    source = prep.files_source(str(books / "*"))
    assert (source.description["format"], source.description["txt_sample_by"]) == ("text", "document")
    run_prepare(source, tmp_path / "txt-out", val_tokens=100)
    assert np.array_equal(all_tokens(tmp_path / "txt-out"), expected_stream(texts))


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


def test_the_hub_source_streams_and_checks_offline_mode_first(monkeypatch):
    calls = []

    class FakeDatasets:
        @staticmethod
        def load_dataset(*args, **kwargs):
            calls.append((args, kwargs))
            return "stream"
    monkeypatch.setattr(sources, "_quiet_datasets", lambda: FakeDatasets)
    monkeypatch.setattr(sources, "_check_hub", lambda: None)
    source = prep.hub_source("100B")
    assert source.description == {"kind": "hub", "dataset": "HuggingFaceFW/fineweb-edu", "config": "sample-100BT"}
    assert source.open_dataset() == "stream"
    assert calls == [(("HuggingFaceFW/fineweb-edu",), {"name": "sample-100BT", "split": "train", "streaming": True})]
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="offline mode is on"):
        prep.hub_source("10B").check()


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
        sources._check_hub()
    assert tried == [address]
