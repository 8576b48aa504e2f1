"""data/prepared.py: a prepared folder opened once (its manifest read once, its shards checked once) and handed
down; its identity kept in the checkpoint, so that a resume or an evaluation on a folder prepared again says so;
an evaluation whose data folder is gone says so before it reads the embedded corpus."""
import json
import os
import shutil

import pytest
import torch

import train
from config import UserError
from data import manifest as manifest_module
from data import verify
from data.loader import TrainBatches, validation_batches
from data.prepared import PreparedData
from eval.extrapolation import resolve_data_dir
from helpers import synthetic_corpus, tiny_config
from training.errors import TrainError


@pytest.fixture
def prepared(tmp_path):
    return synthetic_corpus(tmp_path, n_docs=12, n_words=400, val_tokens=3000, shard_tokens=9000)


def test_a_folder_is_opened_and_checked_once_however_many_readers_it_has(prepared, monkeypatch):
    """The manifest was read three times on the way from evaluate() to the batches, and the shards checked by every
    reader: now once, when the folder is opened, and once per split."""
    reads, checks = [], []
    real_read, real_verify = manifest_module.read_manifest_and_identity, verify._verify
    monkeypatch.setattr(manifest_module, "read_manifest_and_identity", lambda d: reads.append(d) or real_read(d))
    monkeypatch.setattr("data.prepared.read_manifest_and_identity", manifest_module.read_manifest_and_identity)
    monkeypatch.setattr(verify, "_verify", lambda data, splits, *a: checks.append(splits) or real_verify(data, splits, *a))
    data = PreparedData(prepared)
    verify.verify_shards(data, vocab_size=257)
    batches = TrainBatches(data, batch_size=3, block_size=32, seed=1)
    first = [list(validation_batches(data, batch_size=4, block_size=32, max_windows=9)) for _ in range(2)]
    assert reads == [prepared] and checks == [("train", "val")]
    # the same batches as from the folder's path, which opens it anew
    by_path = TrainBatches(prepared, batch_size=3, block_size=32, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(batches.batch(5), by_path.batch(5)))
    again = list(validation_batches(prepared, batch_size=4, block_size=32, max_windows=9))
    assert [torch.equal(a[0], b[0]) for a, b in zip(first[1], again)] == [True] * 3
    assert len(reads) == 3  # the two readers given the path opened it themselves


def test_the_identity_is_the_manifests_sha256_and_changes_when_prepared_again(prepared, tmp_path):
    import hashlib
    data = PreparedData(prepared)
    with open(os.path.join(prepared, "manifest.json"), "rb") as f:
        assert data.identity == hashlib.sha256(f.read()).hexdigest()
    shutil.rmtree(prepared)
    again = synthetic_corpus(tmp_path, n_docs=12, n_words=400, val_tokens=2000, shard_tokens=9000)
    assert again == prepared and PreparedData(again).identity not in (None, data.identity)


@pytest.mark.fault
def test_a_resume_on_a_folder_prepared_again_names_both_identities_and_the_flag(prepared, tmp_path, capsys):
    """A run resumed after its data folder was prepared again at the same path trained and validated on other data
    without a word."""
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(prepared, model={"pos": "rope"}, ckpt_interval=1))
    run_dir = tmp_path / "run"
    train.run([str(config), "--max_iters=4", "--stop_iter=2", "--warmup_iters=0", f"--out_dir={run_dir}"])
    trained_on = torch.load(run_dir / "ckpt.pt", weights_only=False)["data_identity"]
    assert trained_on == PreparedData(prepared).identity
    shutil.rmtree(prepared)  # prepared again at the same path, with another validation split
    synthetic_corpus(tmp_path, n_docs=12, n_words=400, val_tokens=2000, shard_tokens=9000)
    now = PreparedData(prepared).identity
    resume = [str(config), "--resume", "--max_iters=4", "--warmup_iters=0", f"--out_dir={run_dir}"]
    with pytest.raises(TrainError) as info:
        train.run(resume)
    assert str(info.value) == (
        f"cannot resume {run_dir / 'ckpt.pt'}: {prepared} now holds other data (manifest sha256 {now[:12]}...) than "
        f"the run was trained on (manifest sha256 {trained_on[:12]}... in the checkpoint): it was prepared again "
        "since; resume with --allow_changes=data to go on training on it (recorded in the run), or put back the data "
        "it was trained on.")
    assert train.run(resume + ["--allow_changes=data"])["step"] == 4
    assert torch.load(run_dir / "ckpt.pt", weights_only=False)["data_identity"] == now
    changes = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if '"change"' in line]
    assert changes == [{"type": "change", "iter": 2, "key": "data", "from": trained_on, "to": now}]


@pytest.mark.fault
def test_an_evaluation_of_a_run_whose_data_is_gone_says_so_before_reading_the_embedded_corpus(tmp_path, capsys,
                                                                                               monkeypatch):
    import data.prepare
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    gone = str(tmp_path / "mycorpus")
    (run_dir / "config.json").write_text(json.dumps({"data_dir_resolved": gone}))
    monkeypatch.setattr(data.prepare, "ensure_default_corpus", lambda tokenizer, progress_bar: f"embedded-{tokenizer}")
    ckpt = {"tokenizer": "byte", "train_config": {"data_dir": gone}}
    assert resolve_data_dir(str(run_dir), ckpt, None) == "embedded-byte"
    assert capsys.readouterr().err == (
        f"note: the data folder of {run_dir}, {gone}, is gone; reading the validation split of the embedded corpus "
        "(byte tokens) instead (pass --data-dir to read another folder)\n")
    # a run on the embedded corpus itself, whose cache is gone, is simply prepared again: nothing to say
    ckpt = {"tokenizer": "byte", "train_config": {"data_dir": "default-byte"}}
    (run_dir / "config.json").write_text(json.dumps({"data_dir_resolved": str(tmp_path / "data_cache" / "default-byte")}))
    assert resolve_data_dir(str(run_dir), ckpt, None) == "embedded-byte" and capsys.readouterr().err == ""


@pytest.mark.fault
def test_an_evaluation_on_the_runs_folder_prepared_again_is_refused_with_the_flag_that_accepts_it(prepared, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"data_dir_resolved": prepared}))
    trained_on = PreparedData(prepared).identity
    ckpt = {"tokenizer": "byte", "train_config": {"data_dir": prepared}, "data_identity": trained_on}
    assert resolve_data_dir(str(run_dir), ckpt, None) == prepared
    shutil.rmtree(prepared)
    synthetic_corpus(tmp_path, n_docs=12, n_words=400, val_tokens=2000, shard_tokens=9000)
    now = PreparedData(prepared).identity
    with pytest.raises(UserError) as info:
        resolve_data_dir(str(run_dir), ckpt, None)
    assert str(info.value) == (
        f"{prepared} now holds other data (manifest sha256 {now[:12]}...) than the run was trained on (manifest "
        f"sha256 {trained_on[:12]}... in the checkpoint): it was prepared again since, so {run_dir} would be "
        f"evaluated on data it was not trained on; pass --data-dir {prepared} to evaluate on it as it is now, or put "
        "back the data the run was trained on")
    assert resolve_data_dir(str(run_dir), ckpt, prepared) == prepared  # the flag that accepts it
    # a checkpoint from before identities were recorded is not refused
    assert resolve_data_dir(str(run_dir), {**ckpt, "data_identity": None}, None) == prepared


def test_a_split_checked_at_one_vocabulary_size_is_not_checked_at_another(prepared):
    """verified: a split checked against 257 counts for 257 and for 'any size', never for 258 nor for the other
    split; a split checked against any size does not count for a given one."""
    data = PreparedData(prepared)
    assert not data.verified("train") and not data.verified("train", 257)
    data.mark_verified(["train"], 257)
    assert data.verified("train", 257) and data.verified("train")
    assert not data.verified("train", 258) and not data.verified("train", 256) and not data.verified("val")
    data.mark_verified(["val"])
    assert data.verified("val") and not data.verified("val", 257)
    data.mark_verified(["val"], 258)
    assert data.verified("val", 258) and not data.verified("val", 257) and not data.verified("train", 258)
    data.mark_verified(["train"], 258)  # a second size kept beside the first
    assert data.verified("train", 258) and data.verified("train", 257)
