"""Fault injection: kill -9 while checkpoints and shards are written, flipped bits, a full disk, a dead or frozen
process of a 2-process job, and the mistaken settings a user meets. Every fault must end in one sentence with a
remedy that works when followed, nothing damaged may be loaded or trained on, and nothing good may be lost.

Runs a 2-layer byte-level model for a few steps; processes that must die are separate Python processes.
"""
import json
import math
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest
import torch

import checkpoints
import train
from training.checkpointing import load_checkpoint
from training.distributed import is_collective_failure
from config import ConfigError
from data import pipeline
from data import prepare as prep
from data.loader import verify_shards
from data.shards import DataError, HEADER_BYTES, write_shard
from model import GPT
from checkpoints import load_gpt
from tests.helpers import ProcessJob, same_payload, tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.fault]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": REPO}


def corpus_docs(n_docs=30):
    rng = random.Random(0)
    words = "the model reads every token and learns which word comes next in a sentence".split()
    return [" ".join(rng.choice(words) for _ in range(150)) + "." for _ in range(n_docs)]


def write_corpus(path, docs):
    with open(path, "w") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")


PREPARE_SETTINGS = {"tokenizer": "byte", "val_tokens": 2048, "shard_tokens": 6000, "workers": 1}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three files (three pieces for data/prepare.py), as a --files pattern."""
    root = tmp_path_factory.mktemp("fault_corpus")
    docs = corpus_docs()
    for i in range(3):
        write_corpus(root / f"corpus_{i}.jsonl", docs[i * 10:(i + 1) * 10])
    return str(root / "corpus_*.jsonl")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("fault_data") / "prepared"
    prep.prepare(prep.files_source(str(corpus)), str(out), progress_bar=False, **PREPARE_SETTINGS)
    return str(out)


@pytest.fixture
def config_file(tmp_path, data_dir):
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_config(data_dir, model={"pos": "rope"}, ckpt_interval=1))
    return str(path)


def directory_bytes(path):
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path))}


def train_losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, f) if r["type"] == "train"]


def run_script(script, args=(), timeout=120, **popen):
    """Run `script` (Python source) in a fresh interpreter from the repository root."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout, **popen)


# ----------------------------------------------------------------------------- checkpoints

# Runs train.py in this process, but SIGKILLs itself while writing checkpoint number argv[1], at the point
# argv[2] names: half-way through the bytes, after the bytes but before fsync, after fsync but before the
# rename, or right after the rename. (The test uses three: before fsync and before the rename are the same
# moment for a process that is killed, they differ only when the machine loses power.)
KILL_DURING_CHECKPOINT = """
    import io, os, signal, sys
    import checkpoints, train
    which, point = int(sys.argv[1]), sys.argv[2]
    calls = {"save": 0}
    real_save, real_replace, real_fsync = checkpoints.torch.save, checkpoints.os.replace, checkpoints.os.fsync
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)

    def save(obj, f):
        calls["save"] += 1
        if calls["save"] == which and point == "mid-write":
            buffer = io.BytesIO()
            real_save(obj, buffer)
            f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
            f.flush()
            die()
        real_save(obj, f)

    def fsync(fd):
        if calls["save"] == which and point == "before-fsync":
            die()
        real_fsync(fd)

    def replace(src, dst):
        if calls["save"] == which and point == "before-rename" and src.endswith("ckpt.pt.tmp"):
            die()
        real_replace(src, dst)
        if calls["save"] == which and point == "after-rename" and src.endswith("ckpt.pt.tmp"):
            die()

    checkpoints.torch.save, checkpoints.os.fsync, checkpoints.os.replace = save, fsync, replace
    sys.argv = ["train.py"] + sys.argv[3:]
    train.main()
"""


def test_kill9_while_writing_a_checkpoint_loses_nothing_and_resume_is_exact(config_file, tmp_path):
    reference = train.run([config_file, f"--out_dir={tmp_path / 'straight'}"])["losses"]
    rng = random.Random(12)
    points = {point: rng.randint(2, 5) for point in ("mid-write", "before-rename", "after-rename")}
    # which: a random checkpoint of the run, after the first; the four runs at once, to save time
    killed = {point: subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILL_DURING_CHECKPOINT), str(which),
                                       point, config_file, f"--out_dir={tmp_path / point}"], cwd=REPO, env=ENV,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for point, which in points.items()}
    for point, which in points.items():
        run_dir = tmp_path / point
        stderr = killed[point].communicate(timeout=120)[1]
        assert killed[point].returncode == -signal.SIGKILL, stderr[-2000:]
        on_disk = checkpoints.load(str(run_dir / "ckpt.pt"))  # intact: the previous one, or the new one
        assert on_disk["step"] == (which if point == "after-rename" else which - 1)
        resumed = train.run([config_file, f"--out_dir={run_dir}", "--resume"])
        assert resumed["step"] == 6 and not (run_dir / "ckpt.pt.tmp").exists()
        assert train_losses(run_dir) == reference, point  # bit for bit, each iteration once


def test_kill9_at_a_random_moment_then_resume_is_exact(config_file, tmp_path):
    reference = train.run([config_file, "--max_iters=15", f"--out_dir={tmp_path / 'straight'}"])["losses"]
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", config_file, "--max_iters=15", f"--out_dir={run_dir}"],
                            cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not (run_dir / "ckpt.pt").exists():
        time.sleep(0.01)
    time.sleep(random.Random(7).uniform(0.0, 0.5))  # checkpoints are written every step: often mid-write
    proc.kill()
    proc.wait()
    train.run([config_file, "--max_iters=15", f"--out_dir={run_dir}", "--resume"])
    assert train_losses(run_dir) == reference


def test_flipped_bits_in_a_checkpoint_are_refused_or_change_nothing(config_file, tmp_path, capsys):
    import sample

    run_dir = tmp_path / "run"
    train.run([config_file, "--max_iters=2", "--warmup_iters=1", f"--out_dir={run_dir}"])
    path = run_dir / "ckpt.pt"
    good = path.read_bytes()
    original = torch.load(path, weights_only=True)
    # Offsets inside the tensors' bytes (torch.load reads those without complaint) and anywhere in the file.
    with zipfile.ZipFile(path) as archive:
        records = [info for info in archive.infolist() if "/data/" in info.filename and info.file_size >= 64]
    rng = random.Random(3)
    in_tensors = []
    for info in rng.sample(records, 6):
        # Local file header: 30 bytes + name + extra field, whose lengths are stored at offsets 26 and 28.
        name_len, extra_len = np.frombuffer(good[info.header_offset + 26:info.header_offset + 30], dtype="<u2")
        start = info.header_offset + 30 + int(name_len) + int(extra_len)
        in_tensors.append(start + rng.randrange(info.file_size))
    anywhere = [rng.randrange(len(good)) for _ in range(20)]
    for offset in in_tensors + anywhere:
        damaged = bytearray(good)
        damaged[offset] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        try:
            loaded = load_checkpoint(str(path))
        except train.TrainError as error:
            assert str(path) in str(error) and "\n" not in str(error)
            with pytest.raises(SystemExit):  # sampling refuses it too, in one line
                sample.main(["--ckpt", str(run_dir)])
            err = capsys.readouterr().err
            assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
            continue
        assert offset not in in_tensors, "a flipped byte inside a tensor was loaded"
        loaded["checksum"] = original["checksum"]
        assert same_payload(loaded, original), offset  # e.g. a flip in zip padding: harmless
    path.write_bytes(good)
    assert same_payload(load_checkpoint(str(path)), {k: v for k, v in original.items() if k != "checksum"})


def test_a_malicious_checkpoint_runs_no_code(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    torch.save({"model": Payload(), "model_config": {}}, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match="is refused: it holds Python objects") as info:
        load_gpt(str(tmp_path))
    assert "weights_only=False" not in str(info.value) and not marker.exists()


def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint(config_file, tmp_path):
    run_dir = tmp_path / "run"
    train.run([config_file, "--stop_iter=2", f"--out_dir={run_dir}"])
    before = (run_dir / "ckpt.pt").read_bytes()
    mount = tmp_path / "small"
    mount.mkdir()
    on_tmpfs = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                                                    capture_output=True).returncode == 0
    try:
        if on_tmpfs:  # a real full disk: copy the run there, then fill the disk up to ~64 KiB
            small_run = mount / "run"
            small_run.mkdir()
            for name in os.listdir(run_dir):
                (small_run / name).write_bytes((run_dir / name).read_bytes())
            with open(mount / "filler", "wb", buffering=0) as f:  # unbuffered: closing it flushes nothing
                try:
                    while f.write(b"\0" * 65536):
                        pass
                except OSError:
                    pass
            os.truncate(mount / "filler", os.path.getsize(mount / "filler") - 65536)
            target = small_run
        else:  # no root: the write reports a full disk as the file system would
            target = run_dir
        real_fsync = checkpoints.os.fsync

        def full_disk_fsync(fd):
            if os.readlink(f"/proc/self/fd/{fd}").endswith("ckpt.pt.tmp"):
                raise OSError(28, "No space left on device")
            real_fsync(fd)

        if not on_tmpfs:
            checkpoints.os.fsync = full_disk_fsync
        try:
            with pytest.raises(train.TrainError, match="could not write checkpoint .*no space left.*previous "
                                                       "checkpoint there is intact"):
                train.run([config_file, "--stop_iter=4", f"--out_dir={target}", "--resume"])
        finally:
            checkpoints.os.fsync = real_fsync
        assert (target / "ckpt.pt").read_bytes() == before and not (target / "ckpt.pt.tmp").exists()
        if on_tmpfs:
            os.remove(mount / "filler")  # the remedy: free space, then resume
        resumed = train.run([config_file, "--stop_iter=4", f"--out_dir={target}", "--resume"])
        assert resumed["step"] == 4
    finally:
        if on_tmpfs:
            subprocess.run(["umount", str(mount)], check=True)


def test_second_ctrl_c_while_a_checkpoint_is_written_keeps_it(config_file, tmp_path):
    slow_save = """
        import sys, time
        import checkpoints, train
        real_save = checkpoints.torch.save

        def save(obj, f):
            print("WRITING", flush=True)
            real_save(obj, f)
            time.sleep(1.5)

        checkpoints.torch.save = save
        sys.argv = ["train.py"] + sys.argv[1:]
        train.main()
    """
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(slow_save), config_file, "--max_iters=1000",
                             "--ckpt_interval=0", f"--out_dir={run_dir}"], cwd=REPO, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first_sent = False
    for line in proc.stdout:
        if line.startswith("iter") and not first_sent:
            proc.send_signal(signal.SIGINT)  # first Ctrl-C: checkpoint after this step
            first_sent = True
        if line.startswith("WRITING"):
            proc.send_signal(signal.SIGINT)  # second Ctrl-C, while the checkpoint is being written
            break
    output = line + proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, output
    assert "as soon as the checkpoint being written is complete" in output and "Traceback" not in output
    saved = checkpoints.load(str(run_dir / "ckpt.pt"))
    assert saved["step"] >= 1 and not (run_dir / "ckpt.pt.tmp").exists()


# ----------------------------------------------------------------------------- data

# Runs data/prepare.py in this process (one worker), SIGKILLing itself at the point argv[2] names: half-way
# through writing piece shard number argv[1], right before piece argv[1]'s record (its shards all written), or
# right after the last step has given its final name to shard argv[1].
KILL_DURING_PREPARE = """
    import os, signal, sys
    import numpy as np
    from data import pipeline
    from data import prepare as prep
    which, point = int(sys.argv[1]), sys.argv[2]
    calls = {"shards": 0, "named": 0}
    real_write_shard, real_write_json, real_replace = pipeline.write_shard, pipeline.write_json, os.replace
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)

    def write_shard(path, tokens, **kwargs):
        calls["shards"] += 1
        if calls["shards"] == which and point == "mid-shard":
            with open(path + ".tmp", "wb") as f:
                f.write(b"\\0" * 1024 + np.asarray(tokens, dtype="<u2").tobytes()[:100])
            die()
        return real_write_shard(path, tokens, **kwargs)

    def write_json(path, data):
        if point == "before-record" and path.endswith(f"piece_{which:06d}.json"):
            die()
        real_write_json(path, data)

    def replace(src, dst):
        real_replace(src, dst)
        if point == "naming" and dst.endswith(".bin") and os.path.basename(os.path.dirname(dst)) != "parts":
            calls["named"] += 1
            if calls["named"] == which:
                die()

    pipeline.write_shard, pipeline.write_json, os.replace = write_shard, write_json, replace
    sys.exit(prep.main(sys.argv[3:]))
"""


def prepare_args(corpus, out):
    return ["--files", str(corpus), "--out", str(out), "--tokenizer", "byte", "--val-tokens",
            str(PREPARE_SETTINGS["val_tokens"]), "--shard-tokens", str(PREPARE_SETTINGS["shard_tokens"]),
            "--workers", "1", "--quiet"]


def test_kill9_during_data_preparation_then_rerun_gives_identical_shards(corpus, data_dir, tmp_path):
    reference = directory_bytes(type(tmp_path)(data_dir))
    rng = random.Random(5)
    # 3 pieces of 2 shards each; 7 named shards (the first piece shard is cut at the validation split)
    points = {"mid-shard": rng.randint(2, 5), "before-record": rng.randint(0, 2), "naming": rng.randint(1, 5)}
    killed = {point: subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILL_DURING_PREPARE), str(which), point,
                                       *prepare_args(corpus, tmp_path / point)], cwd=REPO, env=ENV,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for point, which in points.items()}
    for point in points:
        stderr = killed[point].communicate(timeout=120)[1]
        assert killed[point].returncode == -signal.SIGKILL, stderr[-2000:]
        out = tmp_path / point
        assert not (out / "manifest.json").exists()
        assert prep.main(prepare_args(corpus, out)) == 0
        assert directory_bytes(out) == reference, point


def test_damaged_shards_are_refused_and_the_named_command_rewrites_exactly_them(config_file, corpus, tmp_path,
                                                                                capsys):
    out = tmp_path / "data"
    prep.main(prepare_args(corpus, out))
    reference = directory_bytes(out)
    config = tmp_path / "c.toml"
    config.write_text(tiny_config(out, model={"pos": "rope"}, ckpt_interval=1))
    manifest = json.loads(reference["manifest.json"])
    names = [s["file"] for s in manifest["shards"]]
    # A flipped token, a shard cut short with a header that agrees with its new size, a deleted shard.
    flipped = bytearray(reference[names[1]])
    flipped[HEADER_BYTES + 11] ^= 0x10
    tokens = np.frombuffer(reference[names[2]][HEADER_BYTES:], dtype="<u2")
    damages = {names[1]: lambda path: path.write_bytes(bytes(flipped)),
               names[2]: lambda path: write_shard(str(path), tokens[:-100]),
               names[-1]: os.remove}
    for name, damage in damages.items():  # each one alone is found, before any training step
        damage(out / name)
        with pytest.raises(DataError, match=f"{name} (is damaged|listed in manifest.json is missing)"):
            train.run([str(config), f"--out_dir={tmp_path / 'run'}"])
        assert not (tmp_path / "run" / "ckpt.pt").exists()
        (out / name).write_bytes(reference[name])
    for name, damage in damages.items():
        damage(out / name)
    with pytest.raises(DataError) as info:
        train.run([str(config), f"--out_dir={tmp_path / 'run'}"])
    message = str(info.value)
    assert names[-1] in message and "\n" not in message, message  # presence and headers come before content
    command = message.split("`")[1]
    assert command.startswith("python -m data.prepare ")
    stamps = {name: os.stat(out / name).st_mtime_ns for name in names if name not in damages}
    assert prep.main(shlex.split(command)[3:]) == 0  # the remedy the message names
    assert {name: os.stat(out / name).st_mtime_ns for name in stamps} == stamps  # only the damaged ones rewritten
    assert directory_bytes(out) == reference
    assert train.run([str(config), "--max_iters=1", "--warmup_iters=0", f"--out_dir={tmp_path / 'run'}"])["step"] == 1


def test_token_ids_beyond_the_vocabulary_are_refused_before_training(config_file, tmp_path):
    # A manifest-free llm.c-style directory (train.py reads those) whose shard holds id 400 >= vocab_size 320.
    bare = tmp_path / "bare"
    bare.mkdir()
    rng = np.random.default_rng(0)
    write_shard(str(bare / "val_000000.bin"), rng.integers(0, 320, 4000))
    bad = rng.integers(0, 320, 4000)
    bad[1234] = 400
    write_shard(str(bare / "train_000001.bin"), bad)
    assert prep.main(["--adopt", str(bare)]) == 0  # 400 is a GPT-2 id: the shards are adopted as they are
    args = [config_file, f"--data_dir={bare}", "--max_iters=1", "--warmup_iters=0", f"--out_dir={tmp_path / 'run'}"]
    with pytest.raises(ConfigError, match="the data's tokenizer 'gpt2' has 50257 tokens but model.vocab_size is 320; "
                                          "set --vocab_size=50257 or more"):
        train.run(args)  # adopted shards are GPT-2 tokens
    with pytest.raises(DataError, match="train_000001.bin holds token id 400.*vocab_size is 320.*--vocab_size=401"):
        verify_shards(str(bare), vocab_size=320)  # (what a model with a smaller vocabulary would meet, id by id)
    assert not (tmp_path / "run" / "ckpt.pt").exists()
    assert train.run(args + ["--vocab_size=50304"])["step"] == 1
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["tokenizer"] == "gpt2"


def test_a_shard_damaged_after_its_check_is_caught_by_the_batch_check(config_file, data_dir, tmp_path,
                                                                       monkeypatch):
    # Damage that leaves a file's size and times alone (a disk flipping bits) is invisible to the recorded check at
    # start (stood in for here by no check at all); the batch that reads it must stop the run before a step uses it.
    import shutil
    import data.loader
    from data.loader import TrainBatches, permute

    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    clean = TrainBatches(str(copy), batch_size=4, block_size=32, seed=1337)
    window = int(permute([3 * 4], clean.windows_per_epoch, 1337, 0)[0])  # the first window of batch 3
    shard = int(np.searchsorted(clean.offsets, window, side="right")) - 1
    with open(clean.paths[shard], "r+b") as f:
        f.seek(HEADER_BYTES + 2 * ((window - int(clean.offsets[shard])) * 32 + 5))
        f.write(np.array([400], dtype="<u2").tobytes())
    monkeypatch.setattr(data.loader, "verify_shards", lambda *args, **kwargs: None)
    hit = [i for i in range(4) if 400 in TrainBatches(str(copy), 4, 32, 1337).batch(i)[0]]
    assert hit and hit[-1] == 3
    args = [config_file, f"--data_dir={copy}", f"--out_dir={tmp_path / 'run'}", "--max_iters=8"]
    with pytest.raises(DataError, match=f"training batch {hit[0]} holds token id 400, but vocab_size is 320"):
        train.run(args)
    # No step used it: the check before saving the weights after step 3 reads the first batch of step 3, so the last
    # checkpoint is that of step 2 (checkpoints after every step here).
    assert checkpoints.load(str(tmp_path / "run" / "ckpt.pt"))["step"] == hit[0] - 1


def test_a_source_edited_in_place_is_not_mixed_into_a_resumed_preparation(tmp_path):
    docs = corpus_docs()
    write_corpus(tmp_path / "a.jsonl", docs)
    source = prep.files_source(str(tmp_path / "a.jsonl"))
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(source, str(tmp_path / "out"), progress_bar=False, stop_after_pieces=1, **PREPARE_SETTINGS)
    edited = [doc.replace("the", "THE") for doc in docs]  # same size, other content
    write_corpus(tmp_path / "a.jsonl", edited)
    assert os.path.getsize(tmp_path / "a.jsonl") == len("".join(json.dumps({"text": d}) + "\n" for d in docs))
    with pytest.raises(DataError, match="other arguments"):
        prep.prepare(prep.files_source(str(tmp_path / "a.jsonl")), str(tmp_path / "out"), progress_bar=False,
                     **PREPARE_SETTINGS)


@pytest.mark.parametrize("case", ["empty file", "all validation"])
def test_a_failed_preparation_leaves_nothing_that_looks_prepared(tmp_path, case):
    if case == "empty file":
        (tmp_path / "a.txt").write_text("")
        args = ["--files", str(tmp_path / "a.txt"), "--val-tokens", "10"]
        expected = "holds no text"
    else:
        write_corpus(tmp_path / "a.jsonl", ["a few words"])
        args = ["--files", str(tmp_path / "a.jsonl"), "--val-tokens", "1000"]
        expected = "all went to validation.*smaller --val-tokens"
    args += ["--out", str(tmp_path / "out"), "--tokenizer", "byte", "--quiet"]
    for _ in range(2):  # the same command fails the same way: no "already prepared"
        with pytest.raises(DataError, match=expected):
            prep.prepare(prep.files_source(args[1]), str(tmp_path / "out"), tokenizer="byte",
                         val_tokens=int(args[3]), progress_bar=False, workers=1)
        assert not (tmp_path / "out").exists()


def test_a_full_disk_while_preparing_is_one_sentence_and_resumable(corpus, data_dir, tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        failed = run_script("import sys; from data import prepare; sys.exit(prepare.main(sys.argv[1:]))",
                            prepare_args(corpus, mount / "out"))
        assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
        assert "cannot write to" in failed.stderr and "No space left on device" in failed.stderr
        assert not [n for n in os.listdir(mount / "out") if n.endswith(".tmp")]
        subprocess.run(["mount", "-o", "remount,size=4m", str(mount)], check=True)  # the remedy: more space
        assert prep.main(prepare_args(corpus, mount / "out")) == 0
        assert directory_bytes(mount / "out") == directory_bytes(type(tmp_path)(data_dir))
    finally:
        subprocess.run(["umount", str(mount)], check=True)


# Runs data/prepare.py in this process once a second copy of this script has started too (both wait for each other's
# file beside argv[1]), recording every piece it tokenises in argv[1]; each piece takes at least half a second, so
# the two are sure to overlap.
PREPARE_AT_ONCE = """
    import os, sys, time
    from data import pipeline
    from data import prepare as prep
    record = sys.argv[1]
    real_tokenize = pipeline.tokenize_piece

    def tokenize(task):
        with open(record, "a") as f:
            f.write(f"{os.getpid()} {task[0]}\\n")
        time.sleep(0.5)
        return real_tokenize(task)

    pipeline.tokenize_piece = tokenize
    open(f"{record}.{os.getpid()}.started", "w").close()
    folder = os.path.dirname(record)
    while sum(name.endswith(".started") for name in os.listdir(folder)) < 2:
        time.sleep(0.01)
    sys.exit(prep.main(sys.argv[2:]))
"""


def embedded_corpus_bytes():
    import lzma
    with open(prep.DEFAULT_CORPUS_FILE, "rb") as f:
        docs = [json.loads(line)["text"] for line in lzma.decompress(f.read()).decode("utf-8").splitlines()]
    return np.array([t for doc in docs for t in [256, *doc.encode("utf-8")]], dtype=np.uint16)


@pytest.mark.parametrize("what", ["--default", "--files"])
def test_two_preparations_of_one_directory_at_once_take_turns(corpus, data_dir, tmp_path, what):
    """Two processes prepare the same fresh output directory at the same moment (what two runs of a study launched
    per GPU do with the embedded corpus on a fresh clone). One tokenises, the other says that it waits, then finds
    the finished preparation: both succeed, and the shards are those of one preparation alone."""
    from data.loader import load_split_tokens
    out = tmp_path / "cache" / "prepared"
    args = (["--default", "--out", str(out), "--tokenizer", "byte", "--quiet"] if what == "--default"
            else prepare_args(corpus, out))
    (tmp_path / "sync").mkdir()
    record = tmp_path / "sync" / "tokenised"
    both = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(PREPARE_AT_ONCE), str(record), *args], cwd=REPO,
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=180) + (p.returncode,) for p in both]
    for stdout, stderr, code in results:
        assert code == 0 and stdout.strip() == str(out) and "Traceback" not in stderr, stderr[-3000:]
    waited = [stderr for _, stderr, _ in results if "waiting for another process to finish preparing" in stderr]
    assert len(waited) == 1, [stderr for _, stderr, _ in results]
    assert f"waiting for another process to finish preparing {out} (it holds {tmp_path / 'cache' / '.prepared.lock'})" \
        in waited[0]
    pids = {line.split()[0] for line in record.read_text().splitlines()}
    assert len(pids) == 1  # one preparation, not two
    if what == "--files":
        assert directory_bytes(out) == directory_bytes(type(tmp_path)(data_dir))
    else:
        tokens = np.concatenate([load_split_tokens(str(out), "val"), load_split_tokens(str(out), "train")])
        assert np.array_equal(tokens, embedded_corpus_bytes())
    assert prep.main(["--verify", str(out)]) == 0


def test_an_output_directory_removed_by_another_process_is_named_as_the_cause(corpus, tmp_path, monkeypatch):
    """Another process deletes the output directory while a shard is being written (what a second, unlocked
    preparation of the same directory did): the one sentence names that cause, not a full disk, and once nothing
    interferes the same command prepares it."""
    import shutil
    out = tmp_path / "out"
    real_write_shard = pipeline.write_shard
    calls = {"n": 0}

    def write_shard(path, tokens, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            shutil.rmtree(out)
        return real_write_shard(path, tokens, **kwargs)

    monkeypatch.setattr(pipeline, "write_shard", write_shard)
    with pytest.raises(DataError) as info:
        prep.prepare(prep.files_source(corpus), str(out), progress_bar=False, **PREPARE_SETTINGS)
    message = str(info.value)
    assert re.match(rf"{re.escape(str(out))}/\.prepare-\w{{8}}/parts/piece_000000_000001\.bin\.tmp vanished while this "
                    rf"process was writing it: another process removed or replaced {re.escape(str(out))} meanwhile",
                    message), message
    assert "free space" not in message and "\n" not in message
    assert message.endswith(f"let nothing else write to or delete {out}, then run the same command again to continue")
    monkeypatch.setattr(pipeline, "write_shard", real_write_shard)
    prep.prepare(prep.files_source(corpus), str(out), progress_bar=False, **PREPARE_SETTINGS)
    assert prep.main(["--verify", str(out)]) == 0


# ----------------------------------------------------------------------------- two processes (gloo)

# One rank of a 2-process job (launched like torchrun does, without its supervisor, so that the test sees
# what the surviving process does): rank 1 dies or freezes when it reaches training step 3.
RANK_FAULT = """
    import os, signal, sys, time
    import data.prefetch, train
    fault = sys.argv[1]
    real_batch = data.prefetch.PrefetchedBatches.batch

    def batch(self, index):
        if os.environ["RANK"] == "1" and index >= 2 * 4:  # step 4, after the checkpoint at 3 (which reads step 3's)
            if fault == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # frozen
        return real_batch(self, index)

    data.prefetch.PrefetchedBatches.batch = batch
    sys.argv = ["train.py"] + sys.argv[2:]
    train.main()
"""


def test_a_dead_or_frozen_process_ends_the_job_with_a_message(config_file, tmp_path):
    jobs = {}
    try:
        for fault in ("killed", "frozen"):  # both jobs at once, to save time
            args = [fault, config_file, "--batch_size=2", "--max_iters=100", "--ckpt_interval=3", "--dist_timeout_s=4",
                    f"--out_dir={tmp_path / fault}"]
            jobs[fault] = ProcessJob(textwrap.dedent(RANK_FAULT), args, ENV, REPO)
        for fault, job in jobs.items():
            err = job.wait(0, timeout=90)
            assert job.returncodes()[0] == 1, (fault, job.report())
            assert "process 0 stopped: a collective operation with the other processes failed" in err, job.report()
            assert "continue with --resume" in err and "Traceback" not in err
            assert checkpoints.load(str(tmp_path / fault / "ckpt.pt"))["step"] == 3  # the last one before the fault
    finally:
        for job in jobs.values():
            job.kill()


# ----------------------------------------------------------------------------- settings and recovery

def test_nan_advice_works_when_followed(config_file, tmp_path, monkeypatch):
    forward = GPT.forward
    calls = {"n": 0}

    def forward_that_breaks_on_call_5(self, idx, targets=None, **kwargs):
        logits, loss = forward(self, idx, targets, **kwargs)
        calls["n"] += torch.is_grad_enabled()  # training forwards only (not the check before each save)
        return logits, (loss * float("nan") if calls["n"] == 5 and torch.is_grad_enabled() else loss)

    monkeypatch.setattr(GPT, "forward", forward_that_breaks_on_call_5)
    # before any checkpoint: no checkpoint is named, and the advice is to start again
    with pytest.raises(train.TrainError) as info:
        train.run([config_file, "--ckpt_interval=0", f"--out_dir={tmp_path / 'early'}"])
    assert "no checkpoint was written" in str(info.value) and "ckpt.pt" not in str(info.value)
    # after one: resume it with changed lr and warm-up, which --allow_changes accepts and records
    calls["n"] = 0
    run_dir = tmp_path / "run"
    with pytest.raises(train.TrainError, match=r"iteration 4\).*--resume --allow_changes=lr,warmup_iters"):
        train.run([config_file, "--ckpt_interval=2", f"--out_dir={run_dir}"])
    monkeypatch.setattr(GPT, "forward", forward)
    changed = [config_file, "--ckpt_interval=2", f"--out_dir={run_dir}", "--resume", "--lr=5e-3",
               "--warmup_iters=5"]
    with pytest.raises(train.TrainError, match="--allow_changes=lr"):
        train.run(changed)  # never silently
    resumed = train.run(changed + ["--allow_changes=lr,warmup_iters"])
    assert resumed["step"] == 6
    with open(run_dir / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    change_records = [(r["iter"], r["key"], r["from"], r["to"]) for r in records if r["type"] == "change"]
    assert change_records == [(4, "lr", 1e-2, 5e-3), (4, "warmup_iters", 2, 5)]
    # the schedule after the change: warm-up to the new lr over 5 steps, written out
    assert [r["lr"] for r in records if r["type"] == "train" and r["iter"] == 5] == [5e-3 * 5 / 5]
    history = json.loads((run_dir / "config.json").read_text())["resume_changes"]
    assert [(c["iter"], c["key"]) for c in history] == [(4, "lr"), (4, "warmup_iters")]
    assert checkpoints.load(str(run_dir / "ckpt.pt"))["changes"] == history


@pytest.mark.fault
def test_a_resume_of_a_checkpoint_with_a_nan_weight_says_it_is_damaged_and_its_advice_works(config_file, tmp_path):
    """Such a checkpoint (its checksum valid) resumed, diverged at once, and the divergence check called it the last
    good checkpoint to resume with a lower lr, which diverged again: a loop. Now the resume refuses it, naming the
    tensor, and the advice it gives (start afresh with --start_over) trains."""
    run_dir = tmp_path / "run"
    train.run([config_file, "--ckpt_interval=0", f"--out_dir={run_dir}"])
    ckpt = checkpoints.load(str(run_dir / "ckpt.pt"))
    name = list(ckpt["model"])[4]
    ckpt["model"][name].view(-1)[1] = float("nan")
    checkpoints.save(str(run_dir / "ckpt.pt"), ckpt)
    with pytest.raises(train.TrainError) as info:
        train.run([config_file, "--ckpt_interval=0", f"--out_dir={run_dir}", "--resume"])
    said = str(info.value)
    assert said.startswith(f"checkpoint {run_dir / 'ckpt.pt'} is damaged: its tensor {name} (1 NaN of ")
    assert said.endswith("restore ckpt.pt from a backup, or start the run afresh with --start_over in place of "
                         "--resume (which moves this one aside).") and "last good" not in said
    assert train.run([config_file, "--ckpt_interval=0", f"--out_dir={run_dir}", "--start_over"])["step"] == 6


@pytest.mark.parametrize("override,message", [
    ("--beta1=2", "beta1 and beta2 must be in \\[0, 1\\)"),
    ("--seed=-1", "seed must be between 0 and 18446744073709551615 \\(2\\*\\*64 - 1, .*\\), not -1"),
    ("--seed=100000000000000000000000000000", "seed must be between 0 and 18446744073709551615 .*--seed=1337"),
    ("--seed=18446744073709551616", "not 18446744073709551616"),
    ("--lr=nan", "lr must be a positive number, not nan; .* e.g. --lr=0.001"),
    ("--lr=-3e-3", "lr must be a positive number, not -0.003 \\(the peak learning rate has no sign\\); write "
                   "--lr=0.003"),
    ("--weight_decay=-1", "weight_decay must be 0 or positive"), ("--grad_clip=-1", "grad_clip must be 0"),
    ("--learning_rate=1e-3", "did you mean 'lr'"), ("--pos=ropee", "given on the command line \\(--pos=ropee\\)"),
    ("--allow_changes=lr", "only applies to --resume"), ("--allow_changes=n_layer", "--allow_changes takes"),
    ("--rope_base=-1", "rope_base must be positive \\(got -1.0\\)"),
    ("--norm_eps=nan", "norm_eps must be a finite number \\(got nan\\)"),
    ("--fox_gate_bias_init=nan", "fox_gate_bias_init must be a finite number"),
    ("--ctx_temperature=0", "ctx_temperature must be positive \\(got 0.0\\)"),
    ("--spike_factor=0.5", "spike_factor must be 0 \\(off\\) or a number above 1, not 0.5"),
    ("--max_iters=6 --warmup_iters=20", "warmup_iters \\(20\\) must be between 0 and max_iters - 1 \\(5\\)"),
    ("--pos=alibi --attn_backend=tile", "model.attn_backend = 'tile': .*needs a CUDA device.*use attn_backend='auto'"),
    ("--vocab_size=1000000000", "needs about [0-9,.]+ GB for its weights, gradients and Adam state.*lower vocab_size"),
    ("--batch_size=100000000 --global_batch_size=100000000", "a micro-batch of 100000000 x 32 tokens at least [0-9,.]+ GB for its activations"),
])
def test_mistaken_settings_are_one_sentence_before_anything_is_written(config_file, tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        train.run([config_file, *override.split(), f"--out_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("below", ["", "run", "run/deeper"])
def test_a_file_where_the_run_directory_goes_is_named_as_a_file(config_file, tmp_path, below):
    """A file at the run directory's path or at one of its parents: the sentence says which path is a file (it
    said "File exists" or "Not a directory"; a resume said that no checkpoint exists there), for a new run and a
    resume, and the file is left as it was."""
    blocker = tmp_path / "file"
    blocker.write_text("a file where the run directory should go")
    out_dir = blocker / below if below else blocker
    for resume in ([], ["--resume"]):  # said before the data and the checkpoint are read
        with pytest.raises(ConfigError) as error:
            train.run([config_file, f"--out_dir={out_dir}", *resume])
        assert str(error.value) == (f"the run directory {out_dir} cannot be made: {blocker} is a file, not a folder; "
                                    "choose another --out_dir (or move the file).")
    assert blocker.read_text() == "a file where the run directory should go"


def test_unwritable_run_directory_is_one_sentence(config_file, tmp_path, monkeypatch):
    def refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(train.os, "makedirs", refused)  # a read-only mount (root may write anywhere else)
    with pytest.raises(ConfigError, match=r"cannot write to the run directory .* \(Permission denied\); make it "
                                          "writable or choose another --out_dir"):
        train.run([config_file, f"--out_dir={tmp_path / 'run'}"])


def test_stop_request_is_honoured_between_micro_batches(config_file, data_dir, tmp_path):
    # 20,000 micro-batches per step (tens of seconds): a stop must not wait for the step to end, and must not
    # half-apply it.
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", config_file, "--batch_size=1", "--global_batch_size=20000",
                             "--max_iters=1", "--warmup_iters=0", f"--out_dir={run_dir}"], cwd=REPO, env=ENV,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in proc.stdout:
        if line.startswith("model:"):
            time.sleep(1.0)  # the signal handlers are installed right after this line
            proc.send_signal(signal.SIGTERM)
            break
    output = line + proc.communicate(timeout=120)[0]
    assert proc.returncode == 0 and "SIGTERM: stopping" in output, output
    saved = checkpoints.load(str(run_dir / "ckpt.pt"))
    assert saved["step"] == 0  # the only step was abandoned, not finished and not half-applied
    config = load_gpt(str(run_dir))[0].config
    torch.manual_seed(1337)  # train.py's seed: the weights before any step
    fresh = GPT(config)
    assert all(torch.equal(saved["model"][k], v) for k, v in fresh.state_dict().items())


def test_sampling_past_memory_or_the_training_context_is_said(tmp_path, capsys):
    import sample
    from eval.tiny import save_run, tiny_model

    save_run(tiny_model(block_size=32), tmp_path / "run")
    sample.main(["--ckpt", str(tmp_path / "run"), "--prompt", "x" * 40, "--max-new-tokens", "2"])
    assert "note: prompt + new tokens (40 + 2) exceed the 32 positions" in capsys.readouterr().err
    # 10**12 tokens of KV cache is more memory than any machine has (and more than a 47-bit address space)
    with pytest.raises(SystemExit) as info:
        sample.main(["--ckpt", str(tmp_path / "run"), "--max-new-tokens", str(10**12)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "does not fit in cpu memory; use a smaller --max-new-tokens" in err
    assert "Traceback" not in err


def test_allowed_optimizer_changes_take_effect_and_fixed_keys_are_refused(config_file, tmp_path):
    # The optimizer's state dict carries its own weight decay and betas: an allowed change must override them.
    run_dir = tmp_path / "run"
    train.run([config_file, "--stop_iter=2", f"--out_dir={run_dir}"])
    train.run([config_file, "--stop_iter=3", f"--out_dir={run_dir}", "--resume",
               "--allow_changes=weight_decay,beta2", "--weight_decay=0.5", "--beta2=0.9"])
    groups = checkpoints.load(str(run_dir / "ckpt.pt"))["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0]
    assert [tuple(g["betas"]) for g in groups] == [(0.9, 0.9), (0.9, 0.9)]
    for key, why in (("decay_params", "parameter groups"), ("global_batch_size", "repeat or skip data")):
        with pytest.raises(ConfigError, match=f"cannot change {key}: .*{why}"):
            train.parse_args([config_file, "--resume", f"--allow_changes={key}"])


def test_a_resume_on_processes_that_cannot_split_the_global_batch_names_counts_that_can():
    """Resuming a global-batch-8 run on 3 processes: the advice was to change --batch_size or --global_batch_size
    (no batch size splits 8 over 3, and --allow_changes=global_batch_size is refused); it names the process counts
    that work, and each works when followed. A batch_size that does not divide a process's share is no longer an
    error: the largest micro-batch up to it that does is used (the same windows a step, the same losses)."""
    from types import SimpleNamespace
    from config import TrainConfig
    notes = []
    processes = lambda n: SimpleNamespace(world_size=n, device=torch.device("cpu"), say=notes.append)  # noqa: E731
    resumed = TrainConfig(global_batch_size=8, batch_size=1, device="cpu")
    with pytest.raises(ConfigError) as info:
        train.batch_split(resumed, processes(3), resumed=True)
    assert str(info.value) == ("global_batch_size 8 cannot be split equally over 3 processes, and a resume keeps "
                               "global_batch_size; resume on 2 or 4 processes instead (a number that divides 8).")
    assert [train.batch_split(resumed, processes(n), resumed=True) for n in (2, 4)] == [(1, 4), (1, 2)]
    with pytest.raises(ConfigError, match="over 3 processes; launch 2 or 4 processes \\(a number that divides 8\\) "
                                          "or change --global_batch_size.$"):
        train.batch_split(resumed, processes(3), resumed=False)  # a new run may change either
    assert notes == []
    # batch_size 3 does not divide 4, each of 2 processes' share: micro-batches of 2, said in a note
    assert train.batch_split(TrainConfig(global_batch_size=8, batch_size=3, device="cpu"), processes(2),
                             resumed=True) == (2, 2)
    assert notes == ["note: batch_size 3 does not divide 4, each process's share of the global batch: micro-batches "
                     "of 2 sequences, 2 a step."]
    # the quickstart's batch_size 8 = global_batch_size 8: on 1, 2, 4 processes one micro-batch of 8, 4, 2; no note
    quickstart = TrainConfig(global_batch_size=8, batch_size=8, device="cpu")
    assert [train.batch_split(quickstart, processes(n), resumed=False) for n in (1, 2, 4, 8)] == \
        [(8, 1), (4, 1), (2, 1), (1, 1)]
    assert len(notes) == 1


def test_a_resume_rewrites_the_change_records_of_its_step(config_file, tmp_path):
    # A resume killed before its next checkpoint, then resumed again without the change: the log must not keep
    # the first resume's change record.
    run_dir = tmp_path / "run"
    train.run([config_file, "--stop_iter=2", f"--out_dir={run_dir}"])
    checkpoint = (run_dir / "ckpt.pt").read_bytes()
    train.run([config_file, "--stop_iter=3", f"--out_dir={run_dir}", "--resume", "--allow_changes=lr", "--lr=5e-3"])
    with open(run_dir / "metrics.jsonl") as f:
        assert [r["key"] for r in map(json.loads, f) if r["type"] == "change"] == ["lr"]
    (run_dir / "ckpt.pt").write_bytes(checkpoint)  # as if killed before the checkpoint at iteration 3
    train.run([config_file, "--stop_iter=3", f"--out_dir={run_dir}", "--resume"])
    with open(run_dir / "metrics.jsonl") as f:
        assert [r for r in map(json.loads, f) if r["type"] == "change"] == []


@pytest.mark.parametrize("failure", [IndexError("pop from empty list"), AssertionError("saved_id must be a tuple")])
def test_any_unpickling_failure_is_one_sentence(tmp_path, monkeypatch, failure):
    # Flipped bytes in a checkpoint's pickled data raised these from torch.load (5 of 300 random flips).
    path = tmp_path / "ckpt.pt"
    checkpoints.save(str(path), {"model": {}, "model_config": {}})

    def damaged_load(*args, **kwargs):
        raise failure
    monkeypatch.setattr(checkpoints.torch, "load", damaged_load)
    with pytest.raises(checkpoints.CheckpointError, match="is corrupt or truncated"):
        checkpoints.load(str(path))


def test_only_failed_collectives_are_reported_as_a_lost_process():
    # Under DDP an out-of-memory error or a bug on this process must keep its own traceback, not be called a
    # dead peer; the messages below are gloo's and torch's own.
    assert is_collective_failure(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
                                                    "closed by peer [127.0.0.1]:29500"))
    assert is_collective_failure(RuntimeError("Timed out waiting 4000ms for recv operation to complete"))
    assert not is_collective_failure(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x32 and 16x32)"))


# ----------------------------------------------------------------------------- divergence that is not a NaN

def advice_flags(message):
    """The flags a divergence message tells the user to resume with."""
    import re
    return re.search(r"with (--resume --allow_changes=\S+)", message).group(1).split()


def test_a_diverging_run_never_saves_the_blown_up_weights_and_its_advice_works(config_file, tmp_path):
    """lr 1e3 blows the weights up at the first update; a checkpoint is due after every step, but the check before
    saving sees the spike in those weights' own loss, so none is written, and starting again as told works."""
    run_dir = tmp_path / "run"
    with pytest.raises(train.TrainError) as info:
        train.run([config_file, "--lr=1e3", "--max_iters=8", f"--out_dir={run_dir}"])
    message = str(info.value)
    assert "failed the check before saving" in message and "jumped to" in message
    assert "no checkpoint was written before it, so start again" in message
    assert not (run_dir / "ckpt.pt").exists()
    done = train.run([config_file, "--lr=1e-2", "--max_iters=8", f"--out_dir={run_dir}"])  # the advice
    assert done["stopped"] == "done" and max(done["losses"][-2:]) < math.log(320) - 0.3


def test_resuming_a_good_checkpoint_with_a_bad_lr_keeps_it_and_its_advice_works(config_file, tmp_path):
    run_dir = tmp_path / "run"
    train.run([config_file, "--ckpt_interval=4", "--max_iters=40", "--stop_iter=8", f"--out_dir={run_dir}"])
    good = (run_dir / "ckpt.pt").read_bytes()
    with pytest.raises(train.TrainError) as info:
        train.run([config_file, "--ckpt_interval=4", "--max_iters=40", f"--out_dir={run_dir}", "--resume",
                   "--allow_changes=lr", "--lr=1e3"])
    message = str(info.value)
    assert "training diverged at iteration 9" in message and "last good checkpoint" in message
    assert "(iteration 8) is kept" in message
    assert (run_dir / "ckpt.pt").read_bytes() == good  # the loss history came with the checkpoint: caught at once
    resumed = train.run([config_file, "--ckpt_interval=4", "--max_iters=40", "--stop_iter=16", f"--out_dir={run_dir}",
                         *advice_flags(message), "--lr=5e-3", "--warmup_iters=2"])
    assert resumed["step"] == 16 and all(math.isfinite(x) for x in resumed["losses"])
    # the loss history behind the checks crossed both resumes: all 16 losses, not only this invocation's 8
    logged = [r["loss"] for r in map(json.loads, open(run_dir / "metrics.jsonl")) if r["type"] == "train"]
    assert checkpoints.load(str(run_dir / "ckpt.pt"))["divergence"]["recent"] == pytest.approx(logged) and len(logged) == 16


def zeroing_nan_attention(monkeypatch):
    """What torch 2.13's fused CPU attention does on some CPUs (AMD EPYC, AVX-512): zeros, not NaN, for NaN
    inputs, on every machine, so that no check can lean on NaN reaching the loss."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def zeroing(q, k, v, *args, **kwargs):
        return torch.nan_to_num(sdpa(q, k, v, *args, **kwargs), nan=0.0)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", zeroing)


def poison_after(monkeypatch, updates, poison):
    """Apply poison(model) right after the optimizer's `updates`-th step."""
    make_optimizer = train.make_optimizer

    def make(model, cfg, device):
        optimizer = make_optimizer(model, cfg, device)
        step, calls = optimizer.step, {"n": 0}

        def poisoned_step(*args, **kwargs):
            out = step(*args, **kwargs)
            calls["n"] += 1
            if calls["n"] == updates:
                with torch.no_grad():
                    poison(model)
            return out
        optimizer.step = poisoned_step
        return optimizer
    monkeypatch.setattr(train, "make_optimizer", make)


def test_a_nan_weight_stops_the_run_even_where_attention_turns_nan_into_zeros(config_file, tmp_path, monkeypatch):
    zeroing_nan_attention(monkeypatch)
    poison_after(monkeypatch, 3, lambda model: model.blocks[0].attn.qkv.weight.view(-1)[5].fill_(float("nan")))
    with pytest.raises(train.TrainError, match="training diverged at iteration 3: the weights are no longer finite"):
        train.run([config_file, "--ckpt_interval=0", f"--out_dir={tmp_path / 'run'}"])


def test_a_basis_generator_past_its_range_stops_the_run_with_its_cause(config_file, tmp_path, monkeypatch):
    zeroing_nan_attention(monkeypatch)
    poison_after(monkeypatch, 2, lambda model: model.blocks[1].attn.rotation.basis_generator[0, 1].fill_(5000.0))
    with pytest.raises(train.TrainError, match="iteration 2: a learned basis generator is beyond the range of its "
                                               "matrix exponential \\(layer 1's learned basis generator"):
        train.run([config_file, "--pos=grape_m_basis", "--ckpt_interval=0", f"--out_dir={tmp_path / 'run'}"])


# ----------------------------------------------------------------------------- stops, disks, leftovers

def test_a_stop_during_validation_does_not_wait_for_it(config_file, tmp_path, monkeypatch):
    """SIGTERM during a validation of 64 batches: at most one more batch is scored, then the run saves a checkpoint
    at that iteration and ends; the interrupted validation is not recorded, and the run resumes exactly."""
    forward, seen = GPT.forward, {"validation": 0, "after_signal": 0}

    def forward_sending_sigterm(self, *args, **kwargs):
        if not self.training:
            seen["validation"] += 1
            if seen["validation"] == 64 + 3:  # the third batch of the validation at iteration 2
                os.kill(os.getpid(), signal.SIGTERM)
            elif seen["validation"] > 64 + 3:
                seen["after_signal"] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward_sending_sigterm)
    run_dir = tmp_path / "run"
    args = [config_file, "--batch_size=1", "--global_batch_size=4", "--eval_interval=2", "--eval_windows=64",
            "--ckpt_interval=0", "--max_iters=6"]
    out = train.run(args + [f"--out_dir={run_dir}"])
    assert out["stopped"] == "sigterm" and out["step"] == 2 and seen["after_signal"] <= 1
    assert [step for step, _ in out["val_losses"]] == [0]
    assert checkpoints.load(str(run_dir / "ckpt.pt"))["step"] == 2
    monkeypatch.setattr(GPT, "forward", forward)
    resumed = train.run(args + [f"--out_dir={run_dir}", "--resume"])
    whole = train.run(args + [f"--out_dir={tmp_path / 'whole'}"])
    assert resumed["losses"] == pytest.approx(whole["losses"][2:], rel=1e-6)


@pytest.mark.parametrize("errno_, reason", [(28, "No space left on device"), (30, "Read-only file system")])
def test_a_full_or_read_only_run_directory_during_training_is_one_sentence(config_file, tmp_path, monkeypatch,
                                                                           errno_, reason):
    import training.metrics
    import training.run_lock
    run_dir = tmp_path / "run"
    writes = {"n": 0}

    def failing_open(path, mode="r", *args, **kwargs):
        if str(path).endswith("metrics.jsonl") and "a" in mode:
            writes["n"] += 1
            if writes["n"] == 6:
                raise OSError(errno_, reason)
        return open(path, mode, *args, **kwargs)

    # the lines go through the locked run directory (its file descriptor), or by path where nothing is locked
    real_open_append = training.run_lock.LockedDirectory.open_append

    def failing_open_append(self, name):
        failing_open(os.path.join(self.path, name), "a").close()  # counts the write, fails the sixth
        return real_open_append(self, name)

    monkeypatch.setattr(training.metrics, "open", failing_open, raising=False)
    monkeypatch.setattr(training.run_lock.LockedDirectory, "open_append", failing_open_append)
    with pytest.raises(train.TrainError, match=f"cannot write .*metrics.jsonl \\({reason}\\), so the run stops: the "
                                               "last checkpoint .* is intact"):
        train.run([config_file, "--ckpt_interval=2", f"--out_dir={run_dir}"])
    assert checkpoints.load(str(run_dir / "ckpt.pt"))["step"] == 4


def test_a_partial_checkpoint_write_left_by_a_kill_is_removed_at_the_next_start(config_file, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.run([config_file, "--stop_iter=2", f"--out_dir={run_dir}"])
    (run_dir / "ckpt.pt.tmp").write_bytes(b"half a checkpoint")
    train.run([config_file, "--stop_iter=3", "--resume", f"--out_dir={run_dir}"])
    assert not (run_dir / "ckpt.pt.tmp").exists()
    assert "removed" in capsys.readouterr().out and checkpoints.load(str(run_dir / "ckpt.pt"))["step"] == 3


def test_a_partial_write_of_the_first_checkpoint_is_not_said_to_leave_one_intact(config_file, tmp_path, capsys):
    """A ckpt.pt.tmp left by a kill during a run's first checkpoint, and no ckpt.pt: the note on removing it said
    "(ckpt.pt is intact)" where no ckpt.pt exists"""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ckpt.pt.tmp").write_bytes(b"half a checkpoint")
    train.run([config_file, "--max_iters=1", "--warmup_iters=0", f"--out_dir={run_dir}"])
    notes = [line for line in capsys.readouterr().out.splitlines() if "ckpt.pt.tmp" in line]
    assert notes == [f"note: removed {run_dir / 'ckpt.pt.tmp'}, a checkpoint write cut short by an earlier kill."]


# ----------------------------------------------------------------------------- messages that show their values

def test_under_torchrun_the_sentence_ends_torchruns_report(config_file, tmp_path):
    """A configuration error under torchrun: it was printed by the main process, then repeated for every process
    inside torchrun's traceback and summary (about 50 lines), and it is said once, as the last line. A process
    cannot shorten torchrun's report, so the main process says it through the report's last line (before its
    border of '='), and no other process is listed as failed"""
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", config_file, "--global_batch_size=3", "--batch_size=1",
                             f"--out_dir={tmp_path / 'run'}"], cwd=REPO, env=ENV, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode != 0  # (torchrun's status: the job failed)
    output = result.stdout + result.stderr
    sentence = ("error: global_batch_size 3 cannot be split equally over 2 processes; launch 1 or 3 processes (a "
                "number that divides 3) or change --global_batch_size.")
    lines = [line.strip() for line in output.splitlines() if line.strip() and set(line.strip()) != {"="}]
    assert lines[-1] == sentence and output.count(sentence) == 1, output[-3000:]
    assert "<NO_OTHER_FAILURES>" in output and "To enable traceback" not in output, output[-3000:]


def test_an_include_that_is_missing_names_the_file_that_includes_it(tmp_path):
    child = tmp_path / "child.toml"
    child.write_text('include = "../base/nowhere.toml"\n[model]\npos = "fox"\n')
    with pytest.raises(ConfigError, match="nowhere.toml, included from .*child.toml, does not exist; fix the include"):
        train.run([str(child)])


def test_missing_paper_data_names_the_command_that_prepares_it(tmp_path):
    with pytest.raises(DataError, match="fineweb-edu-10B does not exist; prepare it with `python -m "
                                        "data.prepare --dataset fineweb-edu --version 10B --out .*fineweb-edu-10B`"):
        train.run([os.path.join(REPO, "configs", "small_gpu.toml"), "--device=cpu", "--n_layer=1", "--n_embd=32",
                   "--n_head=1", "--head_dim=32", "--block_size=32", "--batch_size=1", "--global_batch_size=2",
                   f"--data_dir={tmp_path / 'fineweb-edu-10B'}", f"--out_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()



def test_a_directory_without_a_manifest_is_adopted_before_training_and_its_damage_is_then_caught(config_file, tmp_path):
    """llm.c-style shards have no checksums: training refuses them until `--adopt` records them; a byte flipped
    after that is refused as damage, and an id no GPT-2 tokenizer makes is never answered with a larger vocabulary."""
    bare = tmp_path / "bare"
    bare.mkdir()
    rng = np.random.default_rng(1)
    write_shard(str(bare / "fineweb_val_000000.bin"), rng.integers(0, 320, 4000))
    write_shard(str(bare / "fineweb_train_000001.bin"), rng.integers(0, 320, 4000))
    args = [config_file, f"--data_dir={bare}", "--max_iters=1", "--warmup_iters=0", "--vocab_size=50304",
            f"--out_dir={tmp_path / 'run'}"]
    with pytest.raises(DataError, match="has no manifest.json, so its shards cannot be checked for damage.*"
                                        f"`python -m data.prepare --adopt {bare}`"):
        train.run(args)
    assert prep.main(["--adopt", str(bare)]) == 0
    shard = bare / "fineweb_train_000001.bin"
    with open(shard, "r+b") as f:  # a flipped byte: the size stays, the token becomes 65535 + ...
        f.seek(HEADER_BYTES + 2 * 100)
        f.write(b"\xff\xff")
    with pytest.raises(DataError, match="fineweb_train_000001.bin is damaged: its sha256 differs.*replace it with an "
                                        "intact copy \\(this directory was adopted"):
        train.run(args)
    assert not (tmp_path / "run" / "ckpt.pt").exists()
    os.remove(bare / "manifest.json")
    with pytest.raises(DataError, match="holds token id 65535, beyond GPT-2's 50257 ids: it is damaged"):
        prep.adopt(str(bare))  # adopting the damaged copy is refused too
    # a manifest whose tokenizer has fewer ids than a shard holds: damage, not a reason for a larger vocabulary
    write_shard(str(shard), rng.integers(0, 320, 4000))
    prep.adopt(str(bare))
    manifest = json.loads((bare / "manifest.json").read_text())
    manifest["vocab_size"] = 300
    (bare / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="which its tokenizer \\(300 ids\\) never produces: the shard is damaged") as info:
        verify_shards(str(bare), vocab_size=1000)
    assert "--vocab_size" not in str(info.value)


# ----------------------------------------------------------------------------- a new user's mistakes and limits

@pytest.mark.parametrize("override", ["--seed=100000000000000000000000000000", "--lr=-3e-3", "--batch_size=0"])
def test_a_setting_out_of_range_names_a_remedy_that_works(config_file, tmp_path, override):
    """A seed past what the generators take (it was a traceback from torch.manual_seed), a negative lr (it named no
    remedy): the sentence names a flag, and that flag, given instead, trains"""
    args = [config_file, "--max_iters=1", "--warmup_iters=0"]
    with pytest.raises(ConfigError) as info:
        train.run(args + [override, f"--out_dir={tmp_path / 'refused'}"])
    assert not (tmp_path / "refused").exists()
    remedy = re.search(r"(?:write|e\.g\.) (--\w+=[^\s;,()]+)", str(info.value)).group(1).rstrip(".")
    assert remedy.split("=")[0] == override.split("=")[0]
    assert train.run(args + [remedy, f"--out_dir={tmp_path / 'run'}"])["step"] == 1


def test_a_seed_past_the_generators_range_is_one_sentence_when_sampling_too(tmp_path, capsys):
    """sample.py --seed=2**64 was a traceback from torch.Generator.manual_seed"""
    import sample
    from eval.tiny import save_run, tiny_model
    save_run(tiny_model(block_size=32), tmp_path / "run")
    with pytest.raises(SystemExit) as info:
        sample.main(["--ckpt", str(tmp_path / "run"), "--max-new-tokens", "2", "--seed", str(2**64)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--seed must be between 0 and 18446744073709551615" in err
    assert "Traceback" not in err and "error: --seed" in err.strip().splitlines()[-1]
    sample.main(["--ckpt", str(tmp_path / "run"), "--max-new-tokens", "2", "--seed", str(2**64 - 1)])


def test_the_largest_seed_the_generators_take_trains(config_file, tmp_path):
    """18446744073709551615 (2⁶⁴ − 1), the top of the range the sentence gives, reaches torch.manual_seed and the
    batch order"""
    assert train.run([config_file, "--max_iters=1", "--warmup_iters=0", "--seed=18446744073709551615",
                      f"--out_dir={tmp_path / 'run'}"])["step"] == 1


def test_a_model_too_large_for_memory_is_refused_from_its_configuration(config_file, tmp_path, monkeypatch):
    """--n_layer=100000 --n_embd=1024: the memory check used to build all 100,000 blocks on the meta device first
    (over 4 minutes without a word); it counts one block's parameters now. The sentence gives the exact count, and
    the check builds no more than two blocks"""
    import model
    built = {"blocks": 0}
    real_init = model.Block.__init__

    def counted(self, config, *args):  # (a block's window)
        built["blocks"] += 1
        assert built["blocks"] <= 10, "the memory check builds the model block by block"
        real_init(self, config, *args)
    monkeypatch.setattr(model.Block, "__init__", counted)
    with pytest.raises(ConfigError) as info:
        train.run([config_file, "--n_layer=100000", "--n_embd=1024", f"--out_dir={tmp_path / 'run'}"])
    # counted by hand: per block two RMSNorm gains, qkv, proj, the q and k norm gains, the SwiGLU MLP; the embedding
    # (tied with lm_head) and the final norm once. The tiny config: 2 heads of 16, vocabulary 320, rope (no weights).
    L, C, H, d, V = 100_000, 1024, 2, 16, 320
    per_block = 2 * C + C * 3 * H * d + H * d * C + 2 * d + 3 * C * (8 * C // 3)
    assert f"this model ({(V * C + C + L * per_block) / 1e6:,.0f}M parameters) needs about" in str(info.value)
    assert built["blocks"] <= 2 and not (tmp_path / "run").exists()


def test_a_file_size_limit_is_named_not_called_a_full_disk(config_file, tmp_path):
    """Under `ulimit -f` the checkpoint write fails with EFBIG, which torch.save hides behind "unexpected pos": it was
    reported as no space left on the device (with gigabytes free). The sentence names the limit; the previous
    checkpoint is kept and, the limit lifted, the resume goes on"""
    import resource
    run_dir = tmp_path / "run"
    train.run([config_file, "--stop_iter=2", f"--out_dir={run_dir}"])
    before = (run_dir / "ckpt.pt").read_bytes()
    limit = len(before) // 2  # room for config.json and metrics.jsonl, not for a checkpoint

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    args = [config_file, "--stop_iter=4", f"--out_dir={run_dir}", "--resume"]
    result = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                            timeout=120, preexec_fn=limited)
    err = result.stderr.strip()
    assert result.returncode == 1 and len(err.splitlines()) == 1, result.stderr[-3000:]
    assert err.startswith(f"error: could not write checkpoint {run_dir / 'ckpt.pt'}: File too large: the file would "
                          f"exceed this process's file-size limit of {limit / 2**20:,.1f} MiB (ulimit -f); the "
                          "previous checkpoint there is intact. Raise the limit"), err
    assert "space" not in err
    assert (run_dir / "ckpt.pt").read_bytes() == before and not (run_dir / "ckpt.pt.tmp").exists()
    assert train.run(args)["step"] == 4


CTRL_C_AT = """
    import os, runpy, signal, sys
    when = sys.argv[1]
    ctrl_c = lambda: os.kill(os.getpid(), signal.SIGINT)

    class CtrlCWhenTorchImports:
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                sys.meta_path.remove(self)
                ctrl_c()
            return None

    if when == "import":
        sys.meta_path.insert(0, CtrlCWhenTorchImports())
    else:  # during the set-up, before the training loop's own handlers
        import train
        real = train.check_model_fits
        train.check_model_fits = lambda *args: (ctrl_c(), real(*args))
    sys.argv = ["train.py"] + sys.argv[2:]
    runpy.run_path("train.py", run_name="__main__") if when == "import" else train.main()
"""


@pytest.mark.parametrize("when", ["import", "set-up"])
def test_ctrl_c_before_the_training_loop_is_the_same_one_line(config_file, tmp_path, when):
    """Ctrl-C while train.py imports torch (before any handler is installed: it was a KeyboardInterrupt traceback),
    and during the set-up: the one line and exit status 130 of a Ctrl-C during training"""
    result = run_script(CTRL_C_AT, [when, config_file, f"--out_dir={tmp_path / 'run'}"])
    assert (result.returncode, result.stderr) == \
        (130, "interrupted: the last checkpoint written (if any) is intact; continue with --resume.\n")
    assert not (tmp_path / "run").exists()


def test_a_missing_run_directory_or_config_file_names_what_exists(config_file, tmp_path, monkeypatch):
    """`--resume runs/typo` was answered as a missing config file ("pick one of the files under configs/"), and a
    config path without .toml got no hint: now the runs that exist are listed, and the .toml file named"""
    import shutil
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    shutil.copy(config_file, "configs/tiny.toml")
    train.run(["configs/tiny.toml", "--stop_iter=2", "--out_dir=runs/tiny"])
    with pytest.raises(ConfigError) as info:
        train.run(["--resume", "runs/tinny"])
    assert str(info.value) == ("run directory runs/tinny does not exist; did you mean runs/tiny? the runs that exist "
                               "under runs/: runs/tiny.")
    with pytest.raises(ConfigError) as info:
        train.run(["configs/tiny"])
    assert str(info.value) == "config file configs/tiny does not exist; did you mean configs/tiny.toml?"
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ConfigError, match="no run of train.py with a checkpoint under elsewhere/; start one"):
        train.run(["--resume", "elsewhere/run"])
    assert train.run(["--resume", "runs/tiny", "--stop_iter=3"])["step"] == 3  # the run it named


def test_config_json_keeps_where_the_run_came_from_across_resumes(config_file, tmp_path):
    """After `--resume RUN_DIR`, config.json said the run came from the run directory with no overrides: the first
    start's config file, overrides and command stay, and each resume's command is recorded beside them"""
    run_dir = tmp_path / "run"
    first = [config_file, "--stop_iter=2", "--lr=5e-3", f"--out_dir={run_dir}"]
    train.run(first)
    origin = json.loads((run_dir / "config.json").read_text())
    assert (origin["config_file"], origin["overrides"], origin["command"], origin["resumes"]) == \
        (os.path.abspath(config_file), first[1:], shlex.join(["train.py", *first]), [])
    second = ["--resume", str(run_dir), "--stop_iter=4"]
    third = [config_file, "--resume", f"--out_dir={run_dir}", "--lr=5e-3"]
    train.run(second)
    train.run(third)
    resolved = json.loads((run_dir / "config.json").read_text())
    assert {key: resolved[key] for key in ("config_file", "overrides", "command", "started")} == \
        {key: origin[key] for key in ("config_file", "overrides", "command", "started")}
    assert [(r["iter"], r["command"], r["code_version"]) for r in resolved["resumes"]] == \
        [(2, shlex.join(["train.py", *second]), resolved["code_version"]),
         (4, shlex.join(["train.py", *third]), resolved["code_version"])]
    assert checkpoints.load(str(run_dir / "ckpt.pt"))["step"] == 6


def test_help_for_pos_lists_every_encoding(monkeypatch, capsys):
    """`--help` said "an encoding of positional.ENCODINGS" for pos"""
    from positional import BIASES, ROTATIONS
    monkeypatch.setattr(sys, "argv", ["train.py", "--help"])
    train.main()
    meaning = capsys.readouterr().out.split("  --pos=rope (str)\n")[1].splitlines()[0]
    assert [name for name in ROTATIONS + BIASES if not re.search(rf"\b{name}\b", meaning)] == []


def test_a_resume_past_binary_garbage_in_metrics_jsonl_says_what_it_dropped(config_file, tmp_path, capsys):
    """A run's metrics.jsonl with a line of binary garbage: the resume, which rewrites the file up to the checkpoint,
    stopped with a UnicodeDecodeError traceback; it drops that line with a note, and every record stays"""
    run_dir = tmp_path / "run"
    train.run([config_file, "--stop_iter=3", f"--out_dir={run_dir}"])
    lines = (run_dir / "metrics.jsonl").read_bytes().split(b"\n")
    (run_dir / "metrics.jsonl").write_bytes(b"\n".join(lines[:1] + [b"\x80\xff\x00 garbage"] + lines[1:]))
    capsys.readouterr()
    train.run([config_file, f"--out_dir={run_dir}", "--resume"])
    assert "note: dropped the lines of" in capsys.readouterr().out
    assert train_losses(run_dir) == train.run([config_file, f"--out_dir={tmp_path / 'whole'}"])["losses"]
