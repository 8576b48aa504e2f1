"""data/scratch.py: a preparation deletes only what it can prove it wrote (its scratch folder, its marked shards),
refuses an input inside --out and a folder of someone else's shards, and takes turns on a lock keyed on the real
path."""
import errno
import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from data.shards import DataError, write_shard
from data import scratch
from data import prepare as prep
from prepare_helpers import REPO, DOCS, write_jsonl, run_prepare, write_files, LAYOUT, tree_bytes


def test_damaged_progress_file_is_one_clear_error(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", DOCS)
    folder = tmp_path / "out" / ".prepare-k3x9q2aa"
    folder.mkdir(parents=True)
    (folder / "progress.json").write_text('{"config": {"a": 1}, "pieces": [')  # (a disk that lost its end)
    with pytest.raises(DataError, match=f"{folder}/progress.json is damaged .*; delete {folder} and prepare again"):
        run_prepare(prep.files_source(str(tmp_path / "a.jsonl")), tmp_path / "out")


def test_the_preparation_lock_is_skipped_only_where_it_cannot_be_made(tmp_path, monkeypatch):
    """A lock file that cannot be made because the folder is read-only or not ours (EACCES, EPERM, EROFS) means
    this process could not write the shards either: it takes no turn and goes on (the preparation then says what
    is wrong). Any other failure to make it (a full disk, say) is raised, not silently run without the lock."""
    import errno

    from data import prepare as prep

    out = tmp_path / "corpus"
    with scratch.preparation_lock(str(out)):
        assert os.path.isfile(scratch.lock_path(str(out)))  # the normal case makes the lock file beside out
    real_open = open

    def refused(code):
        def opener(path, *args, **kwargs):
            if str(path).endswith(".lock"):
                raise OSError(code, os.strerror(code), str(path))
            return real_open(path, *args, **kwargs)
        return opener

    for code in (errno.EACCES, errno.EPERM, errno.EROFS):
        monkeypatch.setattr(scratch, "open", refused(code), raising=False)
        with scratch.preparation_lock(str(tmp_path / "other")):
            entered = code
        assert entered == code
    for code in (errno.ENOSPC, errno.EIO):
        monkeypatch.setattr(scratch, "open", refused(code), raising=False)
        with pytest.raises(OSError) as error:
            with scratch.preparation_lock(str(tmp_path / "other")):
                pytest.fail("entered without the lock after an error that is not a read-only folder")
        assert error.value.errno == code


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
    assert not os.path.exists(scratch.lock_path(str(folder)))  # refused before any work: not even the lock was taken


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
def test_a_users_folder_named_like_a_scratch_folder_is_neither_resumed_nor_removed(tmp_path):
    """OUT/.prepare-notes of the user's own, with a progress.json that another tool wrote (a written_by field of its
    own, and "repair"): only the mark a preparation writes makes a scratch folder, so the resume finds the real
    one beside it and the user's is kept byte for byte, through the resume and a re-run of the finished folder."""
    source = write_files(tmp_path / "in")
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_prepare(source, out, stop_after_pieces=1, **LAYOUT)
    [(ours, journal)] = scratch.scratch_folders(str(out))
    assert journal["written_by"] == scratch.SCRATCH_MARK
    users = {".prepare-notes/progress.json": json.dumps({"written_by": "my notes tool", "repair": True}).encode(),
             ".prepare-notes/notes.md": b"# what I tried"}
    (out / ".prepare-notes").mkdir()
    for name, content in users.items():
        (out / name).write_bytes(content)
    assert scratch.scratch_folders(str(out)) == [(ours, journal)]
    for _ in range(2):  # the resume, then the same command on the finished folder
        run_prepare(source, out, **LAYOUT)
        after = tree_bytes(out)
        assert {name: after.get(name) for name in users} == users
    assert not os.path.exists(ours) and scratch.scratch_folders(str(out)) == []


@pytest.mark.fault
def test_a_preparation_through_a_symlink_and_one_through_the_real_path_take_turns(tmp_path):
    """The lock file was named from the path as given, so two preparations of one folder, one through a symlink,
    did not wait for each other."""
    real = tmp_path / "real" / "corpus"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    link = tmp_path / "link" / "corpus"
    assert scratch.lock_path(str(link)) == scratch.lock_path(str(real)) == str(tmp_path / "real" / ".corpus.lock")
    script = (f"from data import prepare as p\nwith p.preparation_lock({str(link)!r}):\n    print('got it', flush=True)")
    with scratch.preparation_lock(str(real)):
        other = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        waiting = other.stderr.readline()
        assert waiting.startswith(f"waiting for another process to finish preparing {link}"), waiting
        assert other.poll() is None
    assert other.communicate(timeout=60)[0] == "got it\n" and other.returncode == 0


@pytest.mark.fault
def test_an_unfinished_preparation_is_named_as_such_with_the_command_that_resumes_it(tmp_path):
    """The journal of an unfinished preparation lives in its scratch folder now: a reader of the folder still says
    that the preparation did not finish, and the repair hint still names the command that made it."""
    from data.loader import PreparedData
    from data.manifest import prepare_command
    source = write_files(tmp_path / "in")
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_prepare(source, out, stop_after_pieces=1, **LAYOUT)
    with pytest.raises(DataError, match=f"the preparation of {out} did not finish; run the same data.prepare command "
                                        "again to complete it"):
        PreparedData(str(out))
    pattern = shlex.quote(str(tmp_path / "in" / "part*.jsonl"))
    assert prepare_command(out) == (f"python -m data.prepare --files {pattern} --out {out} --tokenizer byte "
                                    "--val-tokens 900 --shard-tokens 333 --max-tokens 3000")
