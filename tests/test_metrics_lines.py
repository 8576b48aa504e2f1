"""Damaged lines of metrics.jsonl, line by line: what a resume (training.metrics.trim_metrics) and the study report
(studies/launch.py read_metrics) keep, drop and count. A line that is not a JSON object is damage wherever it stands,
except the file's last line when it lacks its newline (a write a kill cut short)."""
import json

import pytest

from training.metrics import trim_metrics
from studies.launch import read_metrics

RECORDS = [{"type": "train", "iter": i, "loss": 10.0 - i} for i in (1, 2, 3)]
NOT_RECORDS = [b"123", b"[]", b'"x"', b"null", b"\xff\xfe garbage", b'{"type": "train", "iter": 4, "lo']


def write(path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def record_lines():
    return [json.dumps(r).encode() + b"\n" for r in RECORDS]


@pytest.mark.parametrize("bad", NOT_RECORDS)
@pytest.mark.parametrize("where", ["middle", "last_with_newline", "last_cut"])
def test_lines_that_are_not_records(tmp_path, bad, where):
    lines = record_lines()
    if where == "middle":
        lines.insert(1, bad + b"\n")
        bad_number = 2
    else:
        lines.append(bad + (b"\n" if where == "last_with_newline" else b""))
        bad_number = 4
    damaged = [] if where == "last_cut" else [bad_number]
    path = tmp_path / "metrics.jsonl"
    write(path, lines)

    records, damaged_lines = read_metrics(str(tmp_path))
    assert records == RECORDS
    assert damaged_lines == damaged

    assert trim_metrics(str(path), step=3) == len(damaged)
    assert [json.loads(line) for line in path.read_text().splitlines()] == RECORDS


def test_trim_keeps_records_up_to_the_step_and_drops_summaries_and_later_changes(tmp_path):
    kept = [{"type": "train", "iter": 1}, {"type": "val", "iter": 2}, {"type": "change", "iter": 1, "key": "lr"}]
    dropped = [{"type": "train", "iter": 3}, {"type": "summary", "iter": 2}, {"type": "change", "iter": 2, "key": "lr"}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in kept + dropped))
    assert trim_metrics(str(path), step=2) == 0
    assert [json.loads(line) for line in path.read_text().splitlines()] == kept
