"""checkpoints.py: a checkpoint with any byte changed is refused or loads the same content; the shard
directories a checkpoint no longer references."""
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import checkpoints
from helpers import examples, same_payload


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_shard_directories_without_a_readable_checkpoint(tmp_path):
    """No ckpt.pt (killed before the first commit, or lost): no shard directory counts as unreferenced, since nothing
    says they are this run's (they may be all that is left of a run, which --resume recovers). A ckpt.pt that cannot
    be read: none is either, so nothing is removed before its own load reports the damage. A readable one: every
    directory it does not name."""
    import checkpoints
    for name in ("step_000004", "step_000008"):
        (tmp_path / checkpoints.SHARDS_DIR / name).mkdir(parents=True)
    assert checkpoints.unreferenced_shard_directories(str(tmp_path)) == []
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert checkpoints.unreferenced_shard_directories(str(tmp_path)) == []
    checkpoints.save(str(tmp_path / "ckpt.pt"), {"shards": {"dir": os.path.join(checkpoints.SHARDS_DIR, "step_000008")}})
    assert checkpoints.unreferenced_shard_directories(str(tmp_path)) == [str(tmp_path / checkpoints.SHARDS_DIR /
                                                                            "step_000004")]


# ------------------------------------------------- properties: the data round trip and checkpoint damage, for any input
# Prepare then load gives, for any documents (empty ones, any Unicode but lone surrogates, which UTF-8 cannot encode),
# split over any number of input files, with any validation size and shard size: <|endoftext|> (256) then the
# document's UTF-8 bytes, document after document, the first val_tokens of that stream in the validation shards and
# the rest in the train shards. A checkpoint with any single byte changed is refused or loads content equal to the
# original.


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    """A small checkpoint of every kind of content train.py saves: tensors of several dtypes and shapes (one
    empty), an optimizer state with int keys, nested lists and dicts, strings, None and floats."""
    torch.manual_seed(0)
    state = {"model": {"w": torch.randn(6, 5), "b": torch.arange(7, dtype=torch.int64), "h": torch.randn(3).half(),
                       "e": torch.zeros(0, 4)},
             "model_config": {"n_layer": 2, "pos": "grape_ap", "qk_norm": "after", "spectrum_scale": 16.0},
             "tokenizer": "byte", "train_config": {"lr": 1e-3, "seed": 42, "reference_layout": "8x3"},
             "step": 1234, "optimizer": {"state": {0: {"exp_avg": torch.randn(6, 5), "step": torch.tensor(3.0)}},
                                         "param_groups": [{"lr": 1e-3, "params": [0], "betas": (0.9, 0.95)}]},
             "rng": {"torch": torch.get_rng_state(), "cuda": None}, "divergence": {"recent": [3.5, 3.25],
                                                                                  "min_loss": 3.25}}
    path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
    checkpoints.save(str(path), state)
    return state, path.read_bytes()


@examples(60)
@given(data=st.data())
def test_any_flipped_byte_is_refused_or_loads_the_same_content(saved_checkpoint, tmp_path_factory, data):
    state, raw = saved_checkpoint
    position = data.draw(st.integers(0, len(raw) - 1))
    mask = data.draw(st.sampled_from([1 << bit for bit in range(8)] + [0xFF]))
    damaged = bytearray(raw)
    damaged[position] ^= mask
    path = tmp_path_factory.mktemp("flip") / "ckpt.pt"
    path.write_bytes(bytes(damaged))
    try:
        loaded = checkpoints.load(str(path), required=("model", "model_config"))
    except checkpoints.CheckpointError as error:
        assert str(path) in str(error)
        return
    assert same_payload(loaded, state), f"byte {position} ^ {mask:#x} loaded different content"


def test_a_flip_in_every_tensor_payload_is_refused(saved_checkpoint, tmp_path):
    """Deterministic complement: the first byte of every stored tensor's data (where torch.load itself never looks)."""
    state, raw = saved_checkpoint
    import io
    import zipfile
    payloads = [info for info in zipfile.ZipFile(io.BytesIO(raw)).infolist()
                if "/data/" in info.filename and info.file_size]
    assert len(payloads) >= 6
    for info in payloads:
        # the data follow the local header: 30 bytes, then the name and the extra field (lengths at 26 and 28)
        name_length, extra_length = (int.from_bytes(raw[info.header_offset + k:info.header_offset + k + 2], "little")
                                     for k in (26, 28))
        start = info.header_offset + 30 + name_length + extra_length
        damaged = bytearray(raw)
        damaged[start] ^= 0x01
        (tmp_path / "ckpt.pt").write_bytes(bytes(damaged))
        with pytest.raises(checkpoints.CheckpointError, match="do not match the checksum"):
            checkpoints.load(str(tmp_path / "ckpt.pt"))


def test_load_model_gives_the_saved_model_in_eval_mode_with_its_tokenizer(tmp_path):
    """What sample.py, the evaluations and the export get: the saved weights (the same logits as the model that was
    saved), in eval mode on the device asked for, the checkpoint's tokenizer, and the checkpoint dict."""
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, head_dim=8, vocab_size=320, block_size=16, pos="fox"))
    checkpoints.save(str(tmp_path / "ckpt.pt"), {"model": model.state_dict(), "model_config": vars(model.config),
                                                 "tokenizer": "byte", "step": 3})
    loaded, tokenizer, ckpt = checkpoints.load_model(str(tmp_path), device="cpu")
    assert loaded.training is False and ckpt["step"] == 3 and tokenizer.encode("ab") == [97, 98]
    idx = torch.randint(0, 320, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], model.eval()(idx)[0])
    with pytest.raises(checkpoints.UserError, match="no checkpoint at"):
        checkpoints.load_model(str(tmp_path / "missing"))


def test_a_folder_is_refused_only_for_a_file_at_it_or_above_it(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "afile").write_text("x")
    for free in (tmp_path / "run", tmp_path / "run" / "new", tmp_path / "new" / "deeper"):
        assert checkpoints.file_in_the_way(str(free)) is None
        assert checkpoints.not_a_folder(str(free), "the run directory", "--out_dir") is None
    for blocked in (tmp_path / "afile", tmp_path / "afile" / "sub", tmp_path / "afile" / "sub" / "deeper"):
        assert checkpoints.file_in_the_way(str(blocked)) == str(tmp_path / "afile")
        assert checkpoints.not_a_folder(str(blocked), "the run directory", "--out_dir") == (
            f"the run directory {blocked} cannot be made: {tmp_path / 'afile'} is a file, not a folder; choose another "
            "--out_dir (or move the file)")


def test_another_file_given_as_a_checkpoint_is_named_with_what_to_pass_instead(tmp_path, monkeypatch):
    from config import UserError
    run, loose = tmp_path / "run", tmp_path / "loose"
    run.mkdir(), loose.mkdir()
    torch.save({"step": 1}, run / "ckpt.pt")
    (run / "config.json").write_text('{"model": {}}')
    (run / "metrics.jsonl").write_text('{"type": "train"}\n')
    (loose / "notes.json").write_text('  [1, 2]')
    (loose / "weights.bin").write_bytes(b"\x00\x01binary")
    (loose / "empty").write_bytes(b"")

    def sentence(path, argument="--ckpt"):
        with pytest.raises(UserError) as info:
            checkpoints.not_a_checkpoint(str(path), argument)
        return str(info.value)
    assert sentence(run / "config.json") == (f"{run / 'config.json'} is train.py's record of the run's settings, not "
                                             f"a checkpoint: pass --ckpt {run} (its run directory, which holds ckpt.pt)")
    assert sentence(run / "metrics.jsonl", "CKPT").endswith(
        f"is train.py's log of the run's losses, not a checkpoint: give {run} as CKPT (its run directory, which "
        "holds ckpt.pt)")
    monkeypatch.chdir(run)
    assert sentence("config.json").endswith("pass --ckpt . (its run directory, which holds ckpt.pt)")
    assert sentence(loose / "notes.json") == (f"{loose / 'notes.json'} is a JSON file, not a checkpoint: --ckpt takes a "
                                              "run directory that holds ckpt.pt (written by train.py), or the path "
                                              "of that file")
    assert sentence(loose / "weights.bin").startswith(f"{loose / 'weights.bin'} is a file that torch.save did not "
                                                      "write, not a checkpoint: ")
    assert checkpoints.not_a_checkpoint(str(run / "ckpt.pt")) is None  # torch.save's: the loader's to judge
    assert checkpoints.not_a_checkpoint(str(loose / "empty")) is None


@pytest.mark.fault
def test_a_run_whose_own_ckpt_pt_is_not_a_torch_file_is_called_corrupt_without_pointing_back_at_it(tmp_path):
    """The advice above ("pass --ckpt RUN_DIR, which holds ckpt.pt") used to be given for RUN_DIR/ckpt.pt itself: the
    user had passed RUN_DIR, and following it looped."""
    from config import UserError
    (tmp_path / "ckpt.pt").write_text("hello\n")
    (tmp_path / "config.json").write_text('{"model": {}}')
    for given, argument in ((tmp_path, "--ckpt"), (tmp_path / "ckpt.pt", "--ckpt"), (tmp_path, "CKPT")):
        with pytest.raises(UserError) as info:
            checkpoints.load_model(str(given), argument=argument)
        assert str(info.value) == (f"checkpoint {tmp_path / 'ckpt.pt'} is corrupt or was not written by torch.save "
                                   "(it does not begin as a torch.save file does); restore it from a backup, or pass "
                                   f"another run directory or checkpoint file as {argument}")
    (tmp_path / "ckpt.pt").write_text('{"model": {}}')
    with pytest.raises(UserError, match=r"\(it holds JSON text\); restore it from a backup"):
        checkpoints.not_a_checkpoint(str(tmp_path / "ckpt.pt"))


VALID_DEVICES = "use cpu, cuda, cuda:N (N counts the GPUs from 0) or mps"


@pytest.mark.parametrize("device, gpus, sentence", [
    ("gpu", 1, f"device 'gpu' is not a device name; {VALID_DEVICES}"),
    ("CUDA", 1, f"device 'CUDA' is not a device name; {VALID_DEVICES}"),
    ("meta", 1, f"device 'meta' is not one this project runs on; {VALID_DEVICES}"),
    ("cuda", 0, "device cuda was asked for, but no CUDA GPU is visible on this machine; use cpu"),
    ("cuda:1", 1, "device cuda:1 does not exist: this machine has 1 CUDA GPU, cuda:0"),
    ("cuda:2", 2, "device cuda:2 does not exist: this machine has 2 CUDA GPUs, cuda:0 to cuda:1"),
])
@pytest.mark.fault
def test_load_model_refuses_a_device_it_cannot_use_in_one_sentence(tmp_path, monkeypatch, device, gpus, sentence):
    """model.to(device) used to end sample.py and the evaluations in a raw RuntimeError; the checkpoint is read only
    after the device is found usable. The number of GPUs is pretended, so the test means the same on any machine."""
    from config import UserError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    torch.save({"step": 1}, tmp_path / "ckpt.pt")
    with pytest.raises(UserError) as info:
        checkpoints.load_model(str(tmp_path), device=device)
    assert str(info.value) == sentence
    assert checkpoints.device_problem("cpu") is None
    assert checkpoints.device_problem("cuda:0" if gpus else "cpu") is None


def test_a_sharded_checkpoint_loads_as_the_whole_model_on_one_process(tmp_path, outside_torchrun):
    """train.py under FSDP saves shards (written here on a group of one); evaluation, sampling and the export read
    them back as one state dict, the same tensors as the model that was saved."""
    from test_checkpointing import save, trained
    model, optimizer, cfg = trained()
    save(tmp_path, 3, model, optimizer, cfg, parallel="fsdp")
    ckpt = checkpoints.load(str(tmp_path / "ckpt.pt"))
    assert "shards" in ckpt and set(ckpt["model"]) == set(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(ckpt["model"][name], tensor), name
    loaded, _ = checkpoints.load_gpt(str(tmp_path))
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_a_shard_directory_is_complete_only_with_every_file_its_metadata_names(tmp_path, outside_torchrun):
    from test_checkpointing import save, trained
    model, optimizer, cfg = trained()
    save(tmp_path, 3, model, optimizer, cfg, parallel="fsdp")
    directory, = checkpoints.shard_directories(str(tmp_path))
    assert checkpoints.shard_set_problem(directory) is None
    data, = [name for name in os.listdir(directory) if name.endswith(".distcp")]
    with open(os.path.join(directory, data), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(directory, data)) - 1)
    assert checkpoints.shard_set_problem(directory) == f"{data} is shorter than its .metadata says"
    os.remove(os.path.join(directory, data))
    assert checkpoints.shard_set_problem(directory) == f"{data} is missing"
    with open(os.path.join(directory, ".metadata"), "r+b") as f:
        f.truncate(20)
    assert checkpoints.shard_set_problem(directory) == "its .metadata cannot be read"
    os.remove(os.path.join(directory, ".metadata"))
    assert checkpoints.shard_set_problem(directory) == "it has no .metadata, which is written last: the write was cut short"


@pytest.mark.fault
@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_weights_that_are_not_finite_are_a_damaged_checkpoint_naming_the_first_such_tensor(tmp_path, value):
    """A NaN or an infinity in a weight passes the checksum (the bytes are as written) but makes every result NaN:
    load_model (sample.py, the evaluations and the export) refuses it in one sentence naming the tensor."""
    from helpers import run_with_non_finite_weight
    named = run_with_non_finite_weight(tmp_path, value)
    with pytest.raises(checkpoints.UserError) as info:
        checkpoints.load_model(str(tmp_path))
    assert str(info.value) == (f"checkpoint {tmp_path / 'ckpt.pt'} {named} (every result from it would be NaN); "
                               "restore it from a backup, or train again")
    state = {"a": torch.ones(3), "b": torch.tensor([1.0, value, 2.0, value]), "c": torch.tensor([value]),
             "steps": torch.arange(3)}
    kind = "NaN" if value != value else "infinite"
    assert checkpoints.non_finite(state) == f"b (2 {kind} of 4 values)"  # the first of two, counted
    assert checkpoints.non_finite({"state": {0: {"exp_avg": state["c"]}}}, "optimizer") == \
        f"optimizer.state.0.exp_avg (1 {kind} of 1 value)"
    assert checkpoints.non_finite({"a": state["a"], "steps": state["steps"]}) is None


def _damaged_copy(good: bytes) -> bytes:
    """The same size as `good`, its second half zeros: no longer a readable archive."""
    return good[:len(good) // 2] + bytes(len(good) - len(good) // 2)


def _replace(path, data: bytes, how: str) -> None:
    """Replace path's content by `data` the way `how` says, keeping the other two of inode, time and size:
    "rename" a new inode (same time and size), "in place" a new time (same inode and size), "longer" a new size
    (same inode and time)."""
    before = os.stat(path)
    if how == "rename":
        path.with_suffix(".next").write_bytes(data)
        os.replace(path.with_suffix(".next"), path)
    else:
        with open(path, "r+b") as f:
            f.write(data + (b"\0" if how == "longer" else b""))
    mtime = before.st_mtime_ns + (10**9 if how == "in place" else 0)
    os.utime(path, ns=(before.st_atime_ns, mtime))
    after = os.stat(path)
    assert [after.st_ino != before.st_ino, after.st_mtime_ns != before.st_mtime_ns,
            after.st_size != before.st_size] == [how == "rename", how == "in place", how == "longer"]


@pytest.mark.parametrize("how", ["rename", "in place", "longer"])
@pytest.mark.parametrize("into", ["good", "damaged"])
def test_a_read_that_fails_while_ckpt_pt_is_replaced_once_reads_it_again(tmp_path, monkeypatch, how, into):
    """A damaged ckpt.pt replaced once while it is read (whichever of inode, time or size the replacement changes)
    is read a second time: into a good checkpoint, that one is loaded; into another damaged file, its damage is the
    sentence, after those two reads (not 'replaced 5 times'). A damaged file that does not change: one read."""
    state = {"model": {"w": torch.arange(6.0)}, "model_config": {"n_layer": 1}}
    path = tmp_path / "ckpt.pt"
    checkpoints.save(str(path), state)
    good = path.read_bytes()
    path.write_bytes(_damaged_copy(good))
    real, reads = checkpoints._load_once, []
    replacements = [good if into == "good" else _damaged_copy(good[::-1])]  # one, during the first read

    def replaced_during_the_first_read(*args):
        reads.append(path.read_bytes())
        try:
            return real(*args)
        finally:
            if replacements:
                _replace(path, replacements.pop(), how)
    monkeypatch.setattr(checkpoints, "_load_once", replaced_during_the_first_read)
    if into == "good":
        assert same_payload(checkpoints.load(str(path)), state)
    else:
        with pytest.raises(checkpoints.CheckpointError, match="is corrupt or truncated"):
            checkpoints.load(str(path))
    assert len(reads) == 2 and reads[0] != reads[1]

    reads.clear()  # a damaged file left as it is: refused at its first read
    path.write_bytes(_damaged_copy(good))
    with pytest.raises(checkpoints.CheckpointError, match="is corrupt or truncated"):
        checkpoints.load(str(path))
    assert len(reads) == 1
