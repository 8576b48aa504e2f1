"""data/verify.py and data/prefetch.py: shard contents read once and recorded, the first read split over processes,
every batch's token ids checked, and prefetched batches equal to the loader's own."""
import contextlib
import json
import os
import threading

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from data import verify
from data.loader import TrainBatches
from data.prefetch import DamagedBatch, PrefetchedBatches
from data.shards import DataError, HEADER_BYTES, write_shard
from helpers import write_position_shards

T = 8
SIZES = [101, 57, 8, 40, 66]  # train shards; token = its global position, so a window shows where it came from


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    return write_position_shards(folder, SIZES, val_first=1000, val_tokens=83)


@pytest.fixture
def reads(monkeypatch):
    """The shards read in full, in a fresh process's state (no checks remembered in memory), with every check
    recordable at once (the racy-time guard off)."""
    monkeypatch.setattr(verify, "_checked", {})
    monkeypatch.setattr(verify, "RACY_NS", 0)
    seen = []
    real = verify.hash_and_max

    def counting(path):
        seen.append(os.path.basename(path))
        return real(path)
    monkeypatch.setattr(verify, "hash_and_max", counting)
    return seen


def shard_names(data_dir):
    return sorted(name for name in os.listdir(data_dir) if name.endswith(".bin"))


def new_process():
    verify._checked.clear()


def flip_in_place(path, token_index, value):
    """Change one token without changing the file's size, as a disk or a stray write would."""
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES + 2 * token_index)
        f.write(np.array([value], dtype="<u2").tobytes())


def test_contents_are_read_once_then_only_headers(data_dir, reads):
    verify.verify_shards(data_dir, vocab_size=2000)
    assert sorted(reads) == shard_names(data_dir)
    record = verify.record_path(data_dir)
    assert record.startswith(os.environ["GRAPE_CACHE_DIR"]) and not record.startswith(data_dir)
    reads.clear()
    new_process()
    verify.verify_shards(data_dir, vocab_size=2000)
    assert reads == []
    # The recorded largest id still refuses a smaller vocabulary without reading anything.
    new_process()
    with pytest.raises(DataError, match="train_000004.bin holds token id 205, but the model's vocab_size is 200"):
        verify.verify_shards(data_dir, vocab_size=200)
    assert reads == []


def test_a_changed_shard_is_read_again_even_with_its_old_mtime(data_dir, reads):
    verify.verify_shards(data_dir)
    path = os.path.join(data_dir, "train_000002.bin")
    stat = os.stat(path)
    flip_in_place(path, 3, 7)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # what `touch -r` or a copy keeping times does
    reads.clear()
    new_process()
    with pytest.raises(DataError, match="train_000002.bin is damaged: its sha256 differs"):
        verify.verify_shards(data_dir)
    assert reads == ["train_000002.bin"]


def test_a_shard_changed_within_the_racy_time_is_checked_but_not_recorded(data_dir, reads, monkeypatch):
    """At a racy time away from its default: a shard whose last change (its ctime: the mtimes are set 10 s back
    here, as a copy keeping times does) is exactly RACY_NS before now is recorded; one nanosecond less, it is
    checked and read again by the next process, while the shards changed earlier stay recorded."""
    from types import SimpleNamespace
    monkeypatch.setattr(verify, "RACY_NS", 5 * 10**9)
    for name in shard_names(data_dir):
        stat = os.stat(os.path.join(data_dir, name))
        os.utime(os.path.join(data_dir, name), ns=(stat.st_atime_ns, stat.st_mtime_ns - 10 * 10**9))
    changed = {name: os.stat(os.path.join(data_dir, name)).st_ctime_ns for name in shard_names(data_dir)}
    newest = max(changed.values())
    for now, read_again in ((newest + verify.RACY_NS, []),
                            (newest + verify.RACY_NS - 1, sorted(n for n, t in changed.items() if t == newest))):
        monkeypatch.setattr(verify, "time", SimpleNamespace(time_ns=lambda now=now: now))
        with contextlib.suppress(FileNotFoundError):
            os.remove(verify.record_path(data_dir))
        new_process()
        verify.verify_shards(data_dir)
        reads.clear()
        new_process()
        verify.verify_shards(data_dir)
        assert sorted(reads) == read_again


def test_a_record_changed_once_is_trusted_only_where_it_still_agrees(data_dir, reads):
    """The record re-read at a start after it changed once: cut short, every shard is read again and the record
    written afresh; one shard's sha256 changed in it (not the manifest's any more), that shard alone is read again."""
    verify.verify_shards(data_dir)
    record = verify.record_path(data_dir)
    text = open(record).read()
    with open(record, "w") as f:
        f.write(text[:len(text) // 2])
    reads.clear()
    new_process()
    verify.verify_shards(data_dir)
    assert sorted(reads) == shard_names(data_dir)
    assert json.loads(open(record).read()) == json.loads(text)

    entries = json.loads(text)
    entries["shards"]["train_000003.bin"]["sha256"] = "0" * 64
    with open(record, "w") as f:
        json.dump(entries, f)
    reads.clear()
    new_process()
    verify.verify_shards(data_dir)
    assert reads == ["train_000003.bin"]


@pytest.mark.fault
@pytest.mark.parametrize("record_text, read_again", [
    ('{"shards": []}', "all"), ('[1, 2]', "all"), ('"text"', "all"), ('{"shards": {"train_000003.bin": 7}}', "all"),
    ("one entry without its max_token", ["train_000003.bin"])])
def test_a_record_of_another_shape_is_damaged_and_its_shards_are_read_again(data_dir, reads, record_text, read_again):
    """A record that is valid JSON of another shape ({"shards": []}) was an AttributeError traceback out of
    verify_shards; it is now a damaged record like one cut short: the shards it cannot vouch for are read again and
    the record rewritten. An entry that agrees on state and sha256 but lacks its result vouches for nothing."""
    verify.verify_shards(data_dir)
    record = verify.record_path(data_dir)
    text = open(record).read()
    if read_again != "all":
        entries = json.loads(text)
        del entries["shards"]["train_000003.bin"]["max_token"]
        record_text = json.dumps(entries)
    with open(record, "w") as f:
        f.write(record_text)
    reads.clear()
    new_process()
    verify.verify_shards(data_dir)
    assert sorted(reads) == (shard_names(data_dir) if read_again == "all" else read_again)
    assert json.loads(open(record).read()) == json.loads(text)


def test_an_unwritable_record_is_a_note_and_the_check_still_runs(data_dir, reads, monkeypatch, capsys):
    blocker = os.path.join(data_dir, "..", "a_file")
    open(blocker, "w").close()
    monkeypatch.setenv("GRAPE_CACHE_DIR", os.path.join(blocker, "cache"))
    verify.verify_shards(data_dir)
    verify.verify_shards(data_dir)  # in-memory: not read again, and the note is not repeated
    assert "note: cannot record the shard checks" in capsys.readouterr().err
    assert len(reads) == len(SIZES) + 1
    flip_in_place(os.path.join(data_dir, "train_000001.bin"), 0, 9)
    with pytest.raises(DataError, match="train_000001.bin is damaged"):
        verify.verify_shards(data_dir)


def test_the_first_read_is_shared_out_and_every_process_raises_the_same_error(data_dir, reads, monkeypatch):
    # Two "processes" as threads, exchanging results as torch.distributed.all_gather_object would.
    barrier, shared = threading.Barrier(2), {}

    def all_gather(results, world_size):
        shared.update(results)
        barrier.wait()
        return dict(shared)
    monkeypatch.setattr(verify, "_all_gather", all_gather)
    read_by, errors = {"0": [], "1": [], "MainThread": []}, {}
    counting = verify.hash_and_max
    monkeypatch.setattr(verify, "hash_and_max",
                        lambda path: read_by[threading.current_thread().name].append(path) or counting(path))

    def process(rank):
        try:
            verify.verify_shards(data_dir, rank=rank, world_size=2)
        except DataError as error:
            errors[rank] = str(error)

    flip_in_place(os.path.join(data_dir, "train_000004.bin"), 1, 2)
    threads = [threading.Thread(target=process, args=(rank,), name=str(rank)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(reads) == shard_names(data_dir)  # each shard read once, by one of the two
    assert len(read_by["0"]) == len(read_by["1"]) == 3
    assert errors[0] == errors[1] and "train_000004.bin is damaged" in errors[0]
    # The intact shards were recorded all the same: after the repair only the damaged one is read again.
    flip_in_place(os.path.join(data_dir, "train_000004.bin"), 1, sum(SIZES[:3]) + 1)
    reads.clear()
    new_process()
    verify.verify_shards(data_dir)
    assert reads == ["train_000004.bin"]


def test_prefetched_batches_equal_the_loaders(data_dir):
    loader = TrainBatches(data_dir, batch_size=3, block_size=T, seed=4)
    prefetched = PrefetchedBatches(loader, stride=2, depth=3, vocab_size=2000)
    # A rank's micro-batches (stride 2), a resume's jump, a repeat and going back.
    for index in [1, 3, 5, 7, 21, 23, 23, 2, 0, 40]:
        x, y = prefetched.batch(index)
        reference_x, reference_y = TrainBatches(data_dir, batch_size=3, block_size=T, seed=4).batch(index)
        assert torch.equal(x, reference_x) and torch.equal(y, reference_y), index
    assert prefetched.windows_per_epoch == loader.windows_per_epoch


def test_a_batch_with_an_id_beyond_the_vocabulary_is_refused(data_dir):
    loader = TrainBatches(data_dir, batch_size=2, block_size=T, seed=1)
    clean = [loader.batch(i) for i in range(40)]
    # Token 120 (position 120: shard 2, which starts at 101) becomes 999 after the shards were checked.
    flip_in_place(os.path.join(data_dir, "train_000002.bin"), 120 - 101, 999)
    prefetched = PrefetchedBatches(loader, stride=1, depth=4, vocab_size=500)
    hit = [i for i, (x, y) in enumerate(clean) if 120 in x or 120 in y]  # independent of the check itself
    assert hit
    for i in range(40):
        if i in hit:
            with pytest.raises(DamagedBatch, match=f"training batch {i} holds token id 999, but vocab_size is 500"
                                                   f".*nothing of this batch was trained on.*--verify {data_dir}"):
                prefetched.batch(i)
        else:
            assert torch.equal(prefetched.batch(i)[0], clean[i][0])


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_verify_all_reports_a_damaged_header_in_the_shards_own_words(tmp_path, monkeypatch):
    monkeypatch.setattr(verify, "_checked", {})
    folder = tmp_path / "data"
    folder.mkdir()
    write_position_shards(folder, [40, 30], val_first=100, val_tokens=16)
    damaged = folder / "train_000002.bin"
    damaged.write_bytes(damaged.read_bytes()[:100])  # shorter than the header
    count, _, problems = verify.verify_all(str(folder))
    assert count == 3
    assert problems == [f"{damaged}: file has 100 bytes, less than the 1024-byte shard header; it is truncated or "
                        "not a token shard: see the command below"]


def test_the_verified_shards_record_lives_under_the_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv(verify.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert verify.record_path(tmp_path / "data").startswith(str(tmp_path / "xdg" / "grape" / "verified") + os.sep)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert verify.record_path(tmp_path / "data").startswith(str(tmp_path / "home" / ".cache" / "grape") + os.sep)


# -------------------------------------------------- properties: every threshold at, just below and just above its limit
# Each limit is written here from its documented rule, not read from the code: the divergence rules
# (training/divergence.py's docstring), the config's ranges (TrainConfig's field comments), token ids against the
# vocabulary (a batch, a shard, an adopted GPT-2 folder) and the memory check before any work. "Just below" and "just
# above" are the neighbouring float (math.nextafter) or integer, so a comparison moved by one is caught.


def shard_folder(root, largest, vocab_in_manifest):
    from data import verify
    root.mkdir(parents=True, exist_ok=True)
    write_shard(str(root / "val_000000.bin"), np.arange(40) % 50)
    write_shard(str(root / "train_000001.bin"), np.r_[np.arange(60) % 50, largest])
    shards = [{"file": "val_000000.bin", "split": "val", "tokens": 40},
              {"file": "train_000001.bin", "split": "train", "tokens": 61}]
    for shard in shards:
        shard["sha256"] = verify.hash_and_max(str(root / shard["file"]))[0]
    (root / "manifest.json").write_text(json.dumps({"tokenizer": "t", "vocab_size": vocab_in_manifest,
                                                    "shards": shards}))
    return str(root)


@given(largest=st.integers(50, 65535))
def test_shard_ids_against_the_model_and_the_tokenizer(tmp_path_factory, largest):
    """A shard's largest id must be below the model's vocab_size (else: a larger vocab_size is the advice) and below
    its tokenizer's id count (else: the shard is damaged), each limit hit exactly."""
    from data import verify
    verify._checked.clear()
    data_dir = shard_folder(tmp_path_factory.mktemp("d"), largest, vocab_in_manifest=65536)
    verify.verify_shards(data_dir, vocab_size=largest + 1)
    with pytest.raises(DataError, match=f"set --vocab_size={largest + 1} or more"):
        verify.verify_shards(data_dir, vocab_size=largest)
    damaged = shard_folder(tmp_path_factory.mktemp("d"), largest, vocab_in_manifest=largest + 1)
    verify.verify_shards(damaged, vocab_size=65536)
    at_limit = shard_folder(tmp_path_factory.mktemp("d"), largest, vocab_in_manifest=largest)
    with pytest.raises(DataError, match="never produces: the shard is damaged"):
        verify.verify_shards(at_limit, vocab_size=65536)


@pytest.mark.fault
def test_verifying_a_folder_of_another_tools_manifest_or_a_file_is_one_sentence(data_dir, capsys):
    from data import prepare
    manifest = os.path.join(data_dir, "manifest.json")
    with open(manifest, "w") as f:
        json.dump({"version": 1, "files": ["train_000001.bin"]}, f)  # valid JSON, not data.prepare's
    with pytest.raises(DataError, match="manifest.json was not written by data.prepare \\(it has no 'tokenizer'"):
        verify.verify_all(data_dir)  # (was KeyError: 'shards')
    with pytest.raises(DataError, match="manifest.json was not written by data.prepare"):
        verify.verify_shards(data_dir)
    assert prepare.main(["--verify", data_dir]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {manifest} was not written by data.prepare") and err.count("\n") == 1
    assert prepare.main(["--verify", manifest]) == 2  # a file, not the folder
    assert capsys.readouterr().err.startswith(f"error: data directory {manifest} is a file, not a folder; ")
