"""training/checkpointing.py: a run's checkpoints, directly and fast (no training loop).

What a checkpoint holds and restores (weights, Adam moments, random state, this run's optimizer settings), both
kinds (ckpt.pt alone, and sharded through torch.distributed.checkpoint on a group of one), the resume checks,
the new-run refusals and --start_over, and recovering a run whose ckpt.pt is gone from its shards. The
end-to-end versions (killed runs, several processes, damaged files) are in test_train.py, test_faults.py and
test_fsdp.py.
"""
import dataclasses
import json
import os

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

import checkpoints
from config import ConfigError, TrainConfig
from model import GPT, GPTConfig
from training import checkpointing
from checkpoints import latest_complete_shards
from training.checkpointing import (Checkpointer, TrainError, by_parameter_name, check_resume_compatible,
                                    check_resume_data, load_checkpoint, refuse_earlier_checkpoint, restore,
                                    set_aside_earlier_run)
from training.distributed import Distributed
from training.errors import LostProcess
from training.optimizer import make_optimizer
from training.stopping import StopSignals

pytestmark = pytest.mark.usefixtures("one_thread", "outside_torchrun")

MODEL = dict(n_layer=1, n_head=2, n_embd=16, head_dim=8, vocab_size=40, block_size=8, pos="rope")


def trained(seed=0, **train):
    """A tiny model, its optimizer after two steps (Adam moments that differ from a fresh one's), and their config."""
    torch.manual_seed(seed)
    cfg = TrainConfig(device="cpu", weight_decay=0.1, **train)
    model = GPT(GPTConfig(**MODEL))
    optimizer = make_optimizer(model, cfg, torch.device("cpu"))
    x = torch.randint(0, MODEL["vocab_size"], (2, MODEL["block_size"]))
    for _ in range(2):
        model(x, targets=x)[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer, cfg


def resolved(cfg, world_size=1):
    """What train.py writes to config.json and gives the Checkpointer."""
    return {"model": dataclasses.asdict(GPTConfig(**MODEL)), "train": dataclasses.asdict(cfg), "tokenizer": "bytes",
            "world_size": world_size, "grad_accum": 1, "code_version": "test", "resume_changes": [],
            "config_file": "tiny.toml"}


def save(run_dir, step, model, optimizer, cfg, parallel="ddp", divergence=None):
    ddp = Distributed("cpu", parallel=parallel)
    try:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump(resolved(cfg), f)
        checkpointer = Checkpointer(os.path.join(run_dir, "ckpt.pt"), ddp, StopSignals(say=lambda *a: None),
                                    resolved(cfg), wandb_id=None, saved_step=None)
        checkpointer.save(step, model, optimizer, divergence or {"losses": [1.0]})
        return checkpointer
    finally:
        ddp.release()


def fresh(seed=1):
    torch.manual_seed(seed)
    cfg = TrainConfig(device="cpu", weight_decay=0.1)
    model = GPT(GPTConfig(**MODEL))
    return model, make_optimizer(model, cfg, torch.device("cpu")), cfg


def assert_same_state(model_a, optimizer_a, model_b, optimizer_b):
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(a, b), name
    state_a, state_b = optimizer_a.state_dict()["state"], optimizer_b.state_dict()["state"]
    assert state_a.keys() == state_b.keys() and state_a
    for i in state_a:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(state_a[i][key]), torch.as_tensor(state_b[i][key])), (i, key)


# ----------------------------------------------------------------------------- save and restore

def test_a_checkpoint_restores_weights_moments_rng_and_step_into_a_fresh_model(tmp_path):
    model, optimizer, cfg = trained()
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    save(tmp_path, 17, model, optimizer, cfg, divergence={"losses": [2.5, 2.4]})
    ckpt = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert ckpt["step"] == 17 and ckpt["divergence"] == {"losses": [2.5, 2.4]}
    assert ckpt["windows_seen"] == 17 * cfg.global_batch_size
    assert ckpt["tokens_seen"] == 17 * cfg.global_batch_size * MODEL["block_size"]
    assert ckpt["model_config"] == dataclasses.asdict(GPTConfig(**MODEL)) and ckpt["tokenizer"] == "bytes"
    torch.manual_seed(999)
    other, other_optimizer, _ = fresh()
    assert restore(ckpt, other, other_optimizer, cfg, torch.device("cpu")) == 17
    assert_same_state(model, optimizer, other, other_optimizer)
    assert torch.equal(torch.rand(3), expected_draw)  # the random state as it was when saved


def test_a_restore_takes_this_runs_weight_decay_and_betas_over_the_saved_ones(tmp_path):
    model, optimizer, cfg = trained()
    save(tmp_path, 3, model, optimizer, cfg)
    changed = dataclasses.replace(cfg, weight_decay=0.25, beta1=0.5, beta2=0.75)
    other, other_optimizer, _ = fresh()
    restore(load_checkpoint(str(tmp_path / "ckpt.pt")), other, other_optimizer, changed, torch.device("cpu"))
    decay, no_decay = other_optimizer.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.25, 0.0)
    assert decay["betas"] == no_decay["betas"] == (0.5, 0.75)


def test_a_sharded_checkpoint_restores_the_same_state_and_names_every_file_with_its_checksum(tmp_path):
    model, optimizer, cfg = trained()
    save(tmp_path, 5, model, optimizer, cfg, parallel="fsdp")
    ckpt = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert "model" not in ckpt and ckpt["shards"]["world_size"] == 1
    directory = checkpoints.shard_directory(str(tmp_path / "ckpt.pt"), ckpt)
    assert os.path.basename(directory).startswith("00000005-")
    files = sorted(os.listdir(directory))
    assert sorted(ckpt["shards"]["files"]) == files and ".metadata" in files
    for name, digest in ckpt["shards"]["files"].items():
        assert digest == checkpoints.file_sha256(os.path.join(directory, name)), name
    other, other_optimizer, _ = fresh()
    assert restore(ckpt, other, other_optimizer, cfg, torch.device("cpu"), path=str(tmp_path / "ckpt.pt")) == 5
    assert_same_state(model, optimizer, other, other_optimizer)


def test_a_whole_checkpoint_restores_into_a_model_sharded_by_fsdp(tmp_path):
    """ckpt.pt written without FSDP, resumed under it: each process keeps its shard of the whole file's tensors."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    model, optimizer, cfg = trained()
    save(tmp_path, 9, model, optimizer, cfg)
    ckpt = load_checkpoint(str(tmp_path / "ckpt.pt"))
    ddp = Distributed("cpu", parallel="fsdp")
    try:
        other = GPT(GPTConfig(**MODEL))
        ddp.shard(other, bf16_params=False, reshard_after_forward=True, compile_blocks=False)
        other_optimizer = make_optimizer(other, cfg, torch.device("cpu"))
        assert restore(ckpt, other, other_optimizer, cfg, torch.device("cpu"), ddp=ddp) == 9
        full = StateDictOptions(full_state_dict=True)
        weights = get_model_state_dict(other, options=full)
        moments = get_optimizer_state_dict(other, other_optimizer, options=full)["state"]
    finally:
        ddp.release()
    for name, value in model.state_dict().items():
        assert torch.equal(weights[name], value), name
    for name, p in model.named_parameters():
        assert torch.equal(moments[name]["exp_avg_sq"], optimizer.state[p]["exp_avg_sq"]), name


def test_a_new_sharded_checkpoint_removes_the_previous_ones_shards_and_an_unsharded_one_removes_all(tmp_path):
    model, optimizer, cfg = trained()
    save(tmp_path, 1, model, optimizer, cfg, parallel="fsdp")
    first = checkpoints.shard_directories(str(tmp_path))
    save(tmp_path, 2, model, optimizer, cfg, parallel="fsdp")
    second = checkpoints.shard_directories(str(tmp_path))
    assert len(first) == len(second) == 1 and first != second
    assert os.path.basename(second[0]).startswith("00000002-")
    save(tmp_path, 3, model, optimizer, cfg)  # the run resumed without FSDP: ckpt.pt holds the weights
    assert checkpoints.shard_directories(str(tmp_path)) == []
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 3


def test_by_parameter_name_keys_the_moments_by_the_parameters_names():
    model, optimizer, _ = trained()
    by_name = by_parameter_name(optimizer.state_dict(), model, optimizer)
    parameters = dict(model.named_parameters())
    assert set(by_name["state"]) == {name for name, p in parameters.items() if p in optimizer.state}
    for name, state in by_name["state"].items():
        assert torch.equal(state["exp_avg"], optimizer.state[parameters[name]]["exp_avg"]), name
    for group, named in zip(optimizer.param_groups, by_name["param_groups"]):
        assert [parameters[name] for name in named["params"]] == group["params"]
        assert named["weight_decay"] == group["weight_decay"]


# ----------------------------------------------------------------------------- loading and recovering

def test_a_missing_checkpoint_without_shards_says_how_to_start(tmp_path):
    with pytest.raises(TrainError, match="no checkpoint at .*run without --resume"):
        load_checkpoint(str(tmp_path / "ckpt.pt"))


def test_a_sharded_checkpoint_whose_shard_directory_is_gone_is_refused(tmp_path):
    model, optimizer, cfg = trained()
    save(tmp_path, 4, model, optimizer, cfg, parallel="fsdp")
    directory, = checkpoints.shard_directories(str(tmp_path))
    os.rename(directory, str(tmp_path / "elsewhere"))
    with pytest.raises(TrainError, match="is sharded, but its shard directory .* is missing"):
        load_checkpoint(str(tmp_path / "ckpt.pt"))


def test_shards_whose_ckpt_pt_is_gone_resume_from_the_latest_complete_set(tmp_path):
    model, optimizer, cfg = trained()
    save(tmp_path, 2, model, optimizer, cfg, parallel="fsdp")
    kept = checkpoints.shard_directories(str(tmp_path))[0]
    aside = str(tmp_path.parent / (tmp_path.name + "-aside"))
    os.rename(kept, aside)  # out of the run directory, so that the next save does not remove it
    save(tmp_path, 6, model, optimizer, cfg, parallel="fsdp")
    os.rename(aside, kept)
    latest, = [d for d in checkpoints.shard_directories(str(tmp_path)) if d != kept]
    cut_short = str(tmp_path / checkpoints.SHARDS_DIR / "00000009-0123abcd")  # a later save killed midway
    os.makedirs(cut_short)
    os.remove(tmp_path / "ckpt.pt")
    assert latest_complete_shards(str(tmp_path)) == (latest, 6)
    ckpt = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert ckpt["step"] == 6 and ckpt["world_size"] == 1 and "recovered" in ckpt and "rng" not in ckpt
    assert ckpt["model_config"] == resolved(cfg)["model"] and ckpt["train_config"] == resolved(cfg)["train"]
    assert ckpt["code_version"] == "test" and ckpt["tokenizer"] == "bytes"  # config.json's, as ckpt.pt held them
    assert ckpt["shards"]["dir"] == os.path.relpath(latest, tmp_path)
    other, other_optimizer, _ = fresh()
    assert restore(ckpt, other, other_optimizer, cfg, torch.device("cpu"), path=str(tmp_path / "ckpt.pt")) == 6
    assert_same_state(model, optimizer, other, other_optimizer)
    os.remove(os.path.join(latest, ".metadata"))  # the latest incomplete too: the earlier one
    assert latest_complete_shards(str(tmp_path)) == (kept, 2)


def test_shards_without_a_complete_set_or_without_config_json_are_refused_with_the_reason(tmp_path):
    model, optimizer, cfg = trained()
    save(tmp_path, 2, model, optimizer, cfg, parallel="fsdp")
    os.remove(tmp_path / "ckpt.pt")
    os.remove(tmp_path / "config.json")
    with pytest.raises(TrainError, match="so is a readable config.json"):
        load_checkpoint(str(tmp_path / "ckpt.pt"))
    directory, = checkpoints.shard_directories(str(tmp_path))
    os.remove(os.path.join(directory, ".metadata"))
    with pytest.raises(TrainError, match=f"no sharded checkpoint in {checkpoints.SHARDS_DIR} is complete "
                                         rf"\({os.path.basename(directory)}: it has no .metadata"):
        load_checkpoint(str(tmp_path / "ckpt.pt"))


# ----------------------------------------------------------------------------- a new run in a used directory

def test_a_new_run_is_refused_a_directory_with_a_checkpoint_or_with_shards_alone(tmp_path):
    refuse_earlier_checkpoint(str(tmp_path))  # empty: nothing to refuse
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    refuse_earlier_checkpoint(str(tmp_path))  # no weights in it
    model, optimizer, cfg = trained()
    save(tmp_path, 2, model, optimizer, cfg, parallel="fsdp")
    with pytest.raises(ConfigError, match="already holds a checkpoint; add --resume"):
        refuse_earlier_checkpoint(str(tmp_path))
    os.remove(tmp_path / "ckpt.pt")
    directory, = checkpoints.shard_directories(str(tmp_path))
    with pytest.raises(ConfigError, match=f"holds the sharded checkpoint {directory} of iteration 2 but no ckpt.pt"):
        refuse_earlier_checkpoint(str(tmp_path))
    os.remove(os.path.join(directory, ".metadata"))
    with pytest.raises(ConfigError, match="none of them a complete checkpoint"):
        refuse_earlier_checkpoint(str(tmp_path))
    assert os.listdir(directory)  # refused, never removed


def test_a_default_run_directory_made_from_another_existing_config_file_is_refused(tmp_path):
    ours, theirs = tmp_path / "a" / "fox.toml", tmp_path / "b" / "fox.toml"
    for path in (ours, theirs):
        path.parent.mkdir()
        path.write_text("[model]\n")
    run = tmp_path / "runs"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config_file": str(theirs)}))
    with pytest.raises(ConfigError, match=f"holds a run made from {theirs}, not from {ours}"):
        refuse_earlier_checkpoint(str(run), default_for=str(ours))
    refuse_earlier_checkpoint(str(run))  # a directory given with --out_dir: the user's choice
    refuse_earlier_checkpoint(str(run), default_for=str(theirs))  # the same config file
    os.remove(theirs)
    refuse_earlier_checkpoint(str(run), default_for=str(ours))  # a config file that is gone moved with its checkout
    assert checkpointing.config_file_of_run(str(run)) == str(theirs)
    (run / "config.json").write_text("[1, 2]")
    assert checkpointing.config_file_of_run(str(run)) is None


def test_start_over_moves_the_earlier_runs_files_aside_unchanged_and_leaves_the_rest(tmp_path):
    assert set_aside_earlier_run(str(tmp_path)) is None
    model, optimizer, cfg = trained()
    save(tmp_path, 2, model, optimizer, cfg, parallel="fsdp")
    (tmp_path / "metrics.jsonl").write_text('{"type": "train"}\n')
    (tmp_path / "notes.txt").write_text("mine")
    before = {name: (tmp_path / name).read_bytes() for name in ("ckpt.pt", "config.json", "metrics.jsonl")}
    folder, moved = set_aside_earlier_run(str(tmp_path))
    assert moved == ["ckpt.pt", checkpoints.SHARDS_DIR, "config.json", "metrics.jsonl"]
    assert os.path.dirname(folder) == str(tmp_path) and os.path.basename(folder).startswith("earlier-")
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(folder), "notes.txt"])
    for name, data in before.items():
        assert open(os.path.join(folder, name), "rb").read() == data, name
    assert load_checkpoint(os.path.join(folder, "ckpt.pt"))["step"] == 2  # a run directory that --resume continues


# ----------------------------------------------------------------------------- may this checkpoint be resumed?

def checkpoint_of(cfg, **model):
    return {"model_config": {**dataclasses.asdict(GPTConfig(**MODEL)), **model}, "train_config": dataclasses.asdict(cfg)}


def test_a_resume_with_the_same_settings_changes_nothing_and_batch_size_may_change():
    cfg = TrainConfig(lr=3e-3)
    here = dataclasses.asdict(GPTConfig(**MODEL))
    assert check_resume_compatible(checkpoint_of(cfg), here, cfg, "run/ckpt.pt") == []
    assert check_resume_compatible(checkpoint_of(cfg), here, dataclasses.replace(cfg, batch_size=1), "run") == []


def test_a_changed_trajectory_key_is_refused_with_the_saved_value_unless_allowed():
    saved, here = TrainConfig(lr=3e-3, seed=1), TrainConfig(lr=1e-3, seed=2)
    model = dataclasses.asdict(GPTConfig(**MODEL))
    with pytest.raises(TrainError) as refused:
        check_resume_compatible(checkpoint_of(saved), model, here, "run/ckpt.pt")
    message = str(refused.value)
    assert "train.seed is 2 here but 1 in the checkpoint" in message and "train.lr is 0.001 here but 0.003" in message
    assert "--seed=1 --lr=0.003" in message and "--allow_changes=seed,lr" in message and "them" in message
    with pytest.raises(TrainError, match="--allow_changes=seed to change it on purpose"):
        check_resume_compatible(checkpoint_of(saved), model, here, "run", allowed=("lr",))
    assert check_resume_compatible(checkpoint_of(saved), model, here, "run", allowed=("lr", "seed")) == [
        {"key": "seed", "from": 1, "to": 2}, {"key": "lr", "from": 3e-3, "to": 1e-3}]


def test_a_changed_model_is_refused_naming_the_flags_that_resume_it():
    cfg = TrainConfig()
    here = {**dataclasses.asdict(GPTConfig(**MODEL)), "n_layer": 3}
    with pytest.raises(TrainError, match=r"differs from the checkpoint's in n_layer \(model.n_layer is 3 here but 1 "
                                         r"in the checkpoint\); resume with --n_layer=1 \(the run's own config.json"):
        check_resume_compatible(checkpoint_of(cfg), here, cfg, "run", allowed=("n_layer",))
    with pytest.raises(TrainError, match="its model config is not valid here .*unknown model config key 'n_layers'"):
        check_resume_compatible(checkpoint_of(cfg, n_layers=1), here, cfg, "run")


def test_a_key_the_checkpoint_predates_counts_as_the_value_it_was_trained_with():
    old = checkpoint_of(TrainConfig())
    del old["train_config"]["lr_schedule"]  # trained before the key existed: "clean"
    model = dataclasses.asdict(GPTConfig(**MODEL))
    assert check_resume_compatible(old, model, TrainConfig(lr_schedule="clean"), "run") == []
    with pytest.raises(TrainError, match="train.lr_schedule is 'official' here but 'clean'"):
        check_resume_compatible(old, model, TrainConfig(lr_schedule="official"), "run")


def test_the_reference_layout_counts_only_where_both_sides_use_it():
    model = dataclasses.asdict(GPTConfig(**MODEL))
    saved, here = TrainConfig(reference_layout="a"), TrainConfig(reference_layout="b")  # both unused
    assert check_resume_compatible(checkpoint_of(saved), model, here, "run") == []
    official = dict(grad_scale="official", sampler="random_offsets")
    saved, here = TrainConfig(reference_layout="a", **official), TrainConfig(reference_layout="b", **official)
    with pytest.raises(TrainError, match="train.reference_layout is 'b' here but 'a'"):
        check_resume_compatible(checkpoint_of(saved), model, here, "run")


def test_a_resume_on_other_data_is_refused_unless_allowed_and_then_recorded_from_the_old_identity_to_the_new():
    from types import SimpleNamespace
    trained_on, now = "a" * 64, "b" * 64
    data = SimpleNamespace(identity=now, path="data_cache/corpus")  # what check_resume_data reads of PreparedData
    with pytest.raises(TrainError) as refused:
        check_resume_data({"data_identity": trained_on}, data, "run/ckpt.pt", allowed=("lr",))
    assert str(refused.value) == (
        "cannot resume run/ckpt.pt: data_cache/corpus now holds other data (manifest sha256 bbbbbbbbbbbb...) than the "
        "run was trained on (manifest sha256 aaaaaaaaaaaa... in the checkpoint): it was prepared again since; resume "
        "with --allow_changes=data to go on training on it (recorded in the run), or put back the data it was trained "
        "on.")
    assert check_resume_data({"data_identity": trained_on}, data, "run/ckpt.pt", allowed=("lr", "data")) == [
        {"key": "data", "from": trained_on, "to": now}]
    assert check_resume_data({"data_identity": now}, data, "run/ckpt.pt") == []
    assert check_resume_data({}, data, "run/ckpt.pt") == []  # a checkpoint from before identities were recorded
    assert check_resume_data({"data_identity": trained_on}, SimpleNamespace(identity=None, path="x"), "run") == []


# ----------------------------------------------------------------------------- failed sharded writes

class Failures(CheckpointException):
    def __init__(self, *causes):
        super().__init__("dcp.save failed", {rank: (cause, "traceback") for rank, cause in enumerate(causes)})


def test_a_failed_sharded_write_names_a_lost_process_or_the_systems_reason(tmp_path):
    checkpointer = Checkpointer(str(tmp_path / "ckpt.pt"), Distributed("cpu"), None, {}, None, None)
    lost = checkpointer.shard_write_failure("D", Failures(ValueError("x"), RuntimeError("Connection closed by peer")))
    assert isinstance(lost, LostProcess)
    assert "another process died or stopped responding while the sharded checkpoint D was written" in str(lost)
    assert "(Connection closed by peer); no earlier checkpoint exists" in str(lost)
    (tmp_path / "ckpt.pt").write_bytes(b"saved")
    full = checkpointer.shard_write_failure("D", Failures(OSError(28, "No space left on device")))
    assert not isinstance(full, LostProcess)
    assert str(full).startswith("could not write the sharded checkpoint D: ")
    assert f"the previous checkpoint {tmp_path / 'ckpt.pt'} is intact" in str(full)
    other = checkpointer.shard_write_failure("D", ValueError("first line\nsecond line"))
    assert str(other).startswith("could not write the sharded checkpoint D (first line); the previous checkpoint")


# ----------------------------------------------------------------------------- weights that are not finite

def poisoned(value, where="model"):
    """trained()'s model and optimizer with `value` in one element of a weight past the first (or of that weight's
    second Adam moment), and the name non_finite gives it."""
    model, optimizer, cfg = trained()
    name, param = list(model.named_parameters())[3]
    with torch.no_grad():
        if where == "model":
            param.view(-1)[2] = value
        else:
            optimizer.state[param]["exp_avg_sq"].view(-1)[2] = value
    if where == "model":
        return model, optimizer, cfg, name
    number = [id(p) for group in optimizer.param_groups for p in group["params"]].index(id(param))  # torch's key
    return model, optimizer, cfg, f"optimizer.state.{number}.exp_avg_sq"


@pytest.mark.fault
@pytest.mark.parametrize("where", ["model", "optimizer"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_resume_of_weights_that_are_not_finite_says_the_checkpoint_is_damaged_and_names_no_resume(
        tmp_path, value, where):
    """Such a checkpoint resumed, diverged at its first step, and the divergence check called it the last good
    checkpoint to resume with a lower lr: a loop. The weights (or Adam moments) are checked when it is read."""
    model, optimizer, cfg, name = poisoned(value, where)
    save(tmp_path, 9, model, optimizer, cfg)
    with pytest.raises(TrainError) as info:
        load_checkpoint(str(tmp_path / "ckpt.pt"))
    kind = "NaN" if value != value else "infinite"
    assert str(info.value).startswith(f"checkpoint {tmp_path / 'ckpt.pt'} is damaged: its tensor {name} (1 {kind} "
                                      "of ")
    assert str(info.value).endswith(f"; {checkpointing.DAMAGED_WEIGHTS_ADVICE}.")


@pytest.mark.fault
def test_a_sharded_checkpoint_with_a_nan_weight_is_refused_and_an_earlier_complete_one_is_named(tmp_path):
    model, optimizer, cfg = trained()
    save(tmp_path, 2, model, optimizer, cfg, parallel="fsdp")
    kept = checkpoints.shard_directories(str(tmp_path))[0]
    aside = str(tmp_path.parent / (tmp_path.name + "-aside"))
    os.rename(kept, aside)  # out of the run directory, so that the next save does not remove it
    model, optimizer, cfg, name = poisoned(float("nan"))
    save(tmp_path, 6, model, optimizer, cfg, parallel="fsdp")
    damaged, = checkpoints.shard_directories(str(tmp_path))
    path = str(tmp_path / "ckpt.pt")
    other, other_optimizer, _ = fresh()
    with pytest.raises(TrainError) as info:
        restore(load_checkpoint(path), other, other_optimizer, cfg, torch.device("cpu"), path=path)
    assert str(info.value) == (f"checkpoint {path} is damaged: its tensor {name} (1 NaN of 256 values) is not finite "
                               f"(every result from it would be NaN); {checkpointing.DAMAGED_WEIGHTS_ADVICE}.")
    os.rename(aside, kept)
    with pytest.raises(TrainError) as info:
        restore(load_checkpoint(path), other, other_optimizer, cfg, torch.device("cpu"), path=path)
    assert str(info.value).endswith(f"; move {path} and {damaged} out of {tmp_path}, and --resume recovers the complete "
                                    f"sharded checkpoint {kept} of iteration 2; or "
                                    f"{checkpointing.DAMAGED_WEIGHTS_ADVICE}.")
    os.rename(path, str(tmp_path.parent / "damaged-ckpt.pt"))  # as the advice says: the earlier one then resumes
    os.rename(damaged, str(tmp_path.parent / "damaged-shards"))
    assert restore(load_checkpoint(path), other, other_optimizer, cfg, torch.device("cpu"), path=path) == 2
