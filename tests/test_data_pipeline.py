"""data/pipeline.py: pieces tokenised by workers into the scratch folder, resumed after a kill, and the documents each
piece reads (rows without text, text that is not a string, files that cannot be read)."""
import functools
import json
import os

import numpy as np
import pytest

from data.loader import read_manifest
from data.sources import Source
from data import pipeline
from data import prepare as prep
from prepare_helpers import (DOCS, expected_stream, write_jsonl, all_tokens, expected_layout, directory_bytes,
                             run_prepare, FILE_DOCS, write_files, LAYOUT)


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
    monkeypatch.setattr(pipeline, "tokenize_piece", lambda task: pytest.fail(f"piece {task[0]} tokenised again"))
    manifest = run_prepare(source, tmp_path / "out")
    assert manifest["tokens"] == reference["tokens"] and manifest["documents"] == len(DOCS)
    assert directory_bytes(tmp_path / "out") == directory_bytes(tmp_path / "full")


def test_max_tokens_reads_no_further_than_needed(tmp_path):
    # The first file holds more than --max-tokens: the second one, which is not JSON at all, is never read.
    write_jsonl(tmp_path / "a.jsonl", DOCS)
    (tmp_path / "b.jsonl").write_text("this is not JSON\n")
    manifest = run_prepare(prep.files_source(str(tmp_path / "*.jsonl")), tmp_path / "out", max_tokens=1000)
    assert manifest["tokens"]["total"] == 1000
    assert np.array_equal(all_tokens(tmp_path / "out"), expected_stream(DOCS)[:1000])


def test_pieces_are_counted_in_a_child_process(tmp_path):
    for i in range(3):
        (tmp_path / f"part{i}.jsonl").write_text(json.dumps({"text": f"document {i}"}) + "\n")
    files = sorted(str(p) for p in tmp_path.glob("*.jsonl"))
    import datasets
    source = Source({"kind": "test"}, functools.partial(datasets.load_dataset, "json", data_files=files,
                                                        split="train", streaming=True))
    assert source.pieces is None
    assert pipeline.count_pieces(source) == 3


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
        list(pipeline._document_batches(rows(), {"format": "text", "txt_sample_by": by}, str(big)))
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
