"""Checkpoints of a run: what they hold, whether a resume may use one, saving and restoring.

RUN_DIR/ckpt.pt is written by the main process through checkpoints.save (a temp file, fsync, rename, and a
checksum of the contents), so a kill at any moment leaves the old or the new checkpoint, never a mix.

Under train.parallel = "fsdp" the weights and Adam moments are sharded: every process writes its part with
torch.distributed.checkpoint into a new directory RUN_DIR/ckpt.shards/<step>-<id>/, the processes hash the files
(a share each), and only then does the main process write ckpt.pt, naming that directory and every file's
sha256, and remove the older directories. ckpt.pt is the commit: a kill before it leaves the previous checkpoint
whole (the unnamed directory is removed at the next start), a kill after it the new one. Either kind of
checkpoint resumes under either mode and on any number of processes (torch.distributed.checkpoint reshards).

Nothing an earlier run saved is removed by a run that did not write it: a new run refuses a directory that holds
a checkpoint, or shards without their ckpt.pt (refuse_earlier_checkpoint), unless --start_over, which moves them
aside; --resume recovers shards whose ckpt.pt is gone (recover_from_shards).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
import uuid
import warnings

import torch
import torch.distributed as dist

import checkpoints
from config import AS_TRAINED_BEFORE_KEY_EXISTED, ConfigError, TrainConfig
from training.distributed import is_collective_failure
from training.errors import LostProcess, TrainError
from training.optimizer import load_optimizer_state, set_optimizer_settings

# Settings that shape the loss sequence: a resumed run must use the checkpoint's values unless --allow_changes
# names them. (batch_size and the number of processes may change: a step reads the same windows however the
# global batch is split.)
TRAJECTORY_KEYS = ("data_dir", "seed", "global_batch_size", "max_iters", "lr", "min_lr",
                   "warmup_iters", "weight_decay", "beta1", "beta2", "grad_clip", "dtype",
                   "decay_params", "lr_schedule", "grad_scale", "sampler", "reference_layout",
                   "retrieval_fraction", "retrieval_pairs")
# Trajectory keys that no resume may change, with the reason.
FIXED_FOR_A_RUN = {
    "global_batch_size": "the training windows are numbered by step x global batch, so another size would repeat "
                         "or skip data",
    "decay_params": "the optimizer's parameter groups, and the Adam moments saved with them, are built from it",
}
CHECKPOINT_KEYS = ("model", "model_config", "tokenizer", "train_config", "step", "optimizer", "rng")
# What --allow_changes names to let a resume go on with data that differ from the checkpoint's (the data folder
# prepared again at the same path: another manifest sha256, the checkpoint's "data_identity").
DATA_CHANGE = "data"


RESTORE_ADVICE = "restore it from a backup, or delete the run directory and start again"
# Weights that are not finite: resuming them only diverges again, and the divergence check would call this very
# checkpoint the last good one, so the advice names no resume of it.
DAMAGED_WEIGHTS_ADVICE = ("restore ckpt.pt from a backup, or start the run afresh with --start_over in place of "
                          "--resume (which moves this one aside)")


def load_checkpoint(path: str) -> dict:
    """The checkpoint at path, its checksum verified; every kind of damage is one TrainError sentence. A sharded
    checkpoint's shards are checked later, by all processes together (restore). Where path is gone but shards
    are beside it, what they hold (recover_from_shards)."""
    if not os.path.isfile(path):
        if checkpoints.shard_directories(os.path.dirname(path)):
            return recover_from_shards(path)
        raise TrainError(f"no checkpoint at {path}; run without --resume to start this run, "
                         "or point --out_dir at the run directory to continue.")
    try:
        ckpt = checkpoints.load(path, required=CHECKPOINT_KEYS, restore=RESTORE_ADVICE, assemble=False)
    except checkpoints.NonFiniteWeights as error:
        advice = damaged_weights_advice(path, {})  # (its weights were in the file: not a sharded checkpoint)
        raise TrainError(f"{checkpoints.non_finite_sentence(path, error.tensor, advice)}.") from None
    except checkpoints.CheckpointError as error:
        raise TrainError(f"{error}.") from None
    problem = checkpoints.non_finite(ckpt["optimizer"], "optimizer") if "optimizer" in ckpt else None
    if problem:  # NaN moments make NaN weights at the first step, which the divergence check would blame on the lr
        raise TrainError(f"{checkpoints.non_finite_sentence(path, problem, damaged_weights_advice(path, ckpt))}.")
    if "shards" in ckpt and not os.path.isdir(checkpoints.shard_directory(path, ckpt)):
        raise TrainError(f"checkpoint {path} is sharded, but its shard directory {checkpoints.shard_directory(path, ckpt)} "
                         f"is missing; {RESTORE_ADVICE}.")
    return ckpt


def damaged_weights_advice(path: str, ckpt: dict) -> str:
    """What to do about the checkpoint at `path` (ckpt.pt, or the shards `ckpt` was recovered from) whose weights are
    not finite: move it aside where an earlier complete sharded checkpoint is beside it (which --resume then
    recovers), else restore it or start over. Never a resume of the same weights, which would only diverge again."""
    run_dir = os.path.dirname(os.path.abspath(path))
    damaged = checkpoints.shard_directory(path, ckpt) if "shards" in ckpt else None
    others = [directory for directory in checkpoints.shard_directories(run_dir)
              if directory != damaged and checkpoints.SHARD_DIRECTORY_NAME.fullmatch(os.path.basename(directory))
              and checkpoints.shard_set_problem(directory) is None]
    if not others:
        return DAMAGED_WEIGHTS_ADVICE
    earlier = max(others, key=os.path.basename)  # the one recover_from_shards would take once these are gone
    aside = " and ".join(p for p in (path if os.path.exists(path) else None, damaged) if p)
    return (f"move {aside} out of {run_dir}, and --resume recovers the complete sharded checkpoint {earlier} of "
            f"iteration {int(os.path.basename(earlier).split('-')[0])}; or {DAMAGED_WEIGHTS_ADVICE}")


def recover_from_shards(path: str) -> dict:
    """The checkpoint of a run directory whose ckpt.pt (at `path`) is gone but whose ckpt.shards/ holds complete
    sharded checkpoints: the latest one's weights and Adam moments, its step (the directory's name), and from
    config.json the settings, tokenizer and deliberate changes that ckpt.pt held too. Lost with ckpt.pt: the shards'
    checksums (only .metadata, whose own checksum is taken now, is checked again before the load), the divergence
    checks' loss history (they start afresh) and the random-number state (training draws none)."""
    run_dir = os.path.dirname(path)
    found = checkpoints.latest_complete_shards(run_dir)
    if found is None:
        problems = "; ".join(f"{os.path.basename(d)}: {checkpoints.shard_set_problem(d) or 'not named <step>-<id>'}"
                             for d in checkpoints.shard_directories(run_dir))
        raise TrainError(f"cannot resume {run_dir}: its ckpt.pt is missing, and no sharded checkpoint in "
                         f"{checkpoints.SHARDS_DIR} is complete ({problems}); restore ckpt.pt from a backup, or start "
                         "a new run with --start_over (which moves these files aside) or in another --out_dir.")
    directory, step = found
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            run = json.load(f)
        settings = {"model_config": run["model"], "train_config": run["train"], "tokenizer": run["tokenizer"],
                    "data_identity": run.get("data_identity")}
    except (OSError, ValueError, KeyError, TypeError):
        raise TrainError(f"cannot resume {run_dir} from the shards in {directory}: its ckpt.pt is missing, and so is a "
                         "readable config.json, without which the shards do not say which model and settings they "
                         "belong to; restore ckpt.pt or config.json from a backup.") from None
    relative = os.path.relpath(directory, run_dir)
    metadata = os.path.join(directory, ".metadata")
    processes = len([name for name in os.listdir(directory) if name.endswith(".distcp")])  # one file each
    return {**settings, "step": step, "world_size": processes, "changes": run.get("resume_changes", []),
            "code_version": run.get("code_version", "unknown"),
            "shards": {"dir": relative, "files": {".metadata": checkpoints.file_sha256(metadata)}},
            "recovered": f"{path} is missing: resuming from the sharded checkpoint {directory} of iteration {step}, "
                         "the latest whose files are all there (its .metadata, written last, lists them), but they "
                         "cannot be checked against the checksums that were in ckpt.pt; the settings are "
                         "config.json's, and the divergence checks' loss history, also in ckpt.pt, starts afresh"}


def config_file_of_run(run_dir: str) -> str | None:
    """The config file the run in run_dir was first started from (its config.json), or None when none is recorded."""
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    saved = saved.get("config_file") if isinstance(saved, dict) else None
    return saved if isinstance(saved, str) else None


def refuse_earlier_checkpoint(run_dir: str, default_for: str | None = None) -> None:
    """For a new run: an earlier run's checkpoint in run_dir (ckpt.pt, or shards whose ckpt.pt is gone, the
    weights that recover_from_shards can resume) is a ConfigError that names the way out; the run must not
    overwrite or remove it (--start_over moves it aside instead). `default_for`: the config file when run_dir is
    its default directory, which two config files of one name share (configs/cpu/fox.toml's runs/cpu/fox, and
    runs/fox of every fox.toml outside configs/): an earlier run there made from another config file that still
    exists is refused too, with both named, since --resume would be the wrong advice. (A run directory given
    with --out_dir, a study's, is the user's choice; a config file that is gone was moved with its checkout.)"""
    earlier = config_file_of_run(run_dir) if default_for else None
    if earlier and os.path.isfile(earlier) and not os.path.samefile(earlier, default_for):
        raise ConfigError(f"{run_dir} holds a run made from {earlier}, not from {default_for}; give this run its own "
                          "directory with --out_dir=DIR, or add --start_over to move the earlier run aside.")
    if os.path.exists(os.path.join(run_dir, "ckpt.pt")):
        raise ConfigError(f"{run_dir} already holds a checkpoint; add --resume to continue it, choose another "
                          "--out_dir, or add --start_over to move it aside and start a new run.")
    shards = checkpoints.shard_directories(run_dir)
    if not shards:
        return
    found = checkpoints.latest_complete_shards(run_dir)
    if found:
        raise ConfigError(f"{run_dir} holds the sharded checkpoint {found[0]} of iteration {found[1]} but no ckpt.pt; "
                          "add --resume to continue from it, choose another --out_dir, or add --start_over to move it "
                          "aside and start a new run.")
    raise ConfigError(f"{run_dir} holds sharded checkpoint files that no ckpt.pt names, none of them a complete "
                      f"checkpoint ({', '.join(os.path.basename(d) for d in shards)} in {checkpoints.SHARDS_DIR}); "
                      "choose another --out_dir, or add --start_over to move them aside and start a new run.")


EARLIER_RUN_FILES = ("ckpt.pt", "ckpt.pt.tmp", checkpoints.SHARDS_DIR, "config.json", "metrics.jsonl")


def set_aside_earlier_run(run_dir: str) -> tuple[str, list[str]] | None:
    """For --start_over: the earlier run's files moved into a new folder RUN_DIR/earlier-<UTC time>-<random>/,
    nothing deleted (with its ckpt.pt the folder is a run directory that --resume continues). Returns the folder and
    the names moved, or None when there was nothing to move."""
    present = [name for name in EARLIER_RUN_FILES if os.path.exists(os.path.join(run_dir, name))]
    if not present:
        return None
    folder = tempfile.mkdtemp(prefix=time.strftime("earlier-%Y%m%dT%H%M%SZ-", time.gmtime()), dir=run_dir)
    for name in present:
        os.rename(os.path.join(run_dir, name), os.path.join(folder, name))
    return folder, present


def check_resume_compatible(ckpt: dict, model_cfg: dict, train_cfg: TrainConfig, path: str,
                            allowed: tuple[str, ...] | list[str] = ()) -> list[dict]:
    """Refuse a resume whose model or trajectory settings differ from the checkpoint's, except the keys in
    `allowed`; return those deliberate changes as [{"key", "from", "to"}]."""
    from model import GPTConfig
    try:  # a key the checkpoint predates gets the default it was trained with
        saved_model = dataclasses.asdict(GPTConfig.from_dict(ckpt["model_config"]))
    except (ValueError, TypeError) as e:
        raise TrainError(f"cannot resume {path}: its model config is not valid here ({e}).") from None
    if saved_model != model_cfg:
        diff = sorted(k for k in model_cfg if model_cfg[k] != saved_model[k])
        older = any(k not in ckpt["model_config"] for k in diff)
        raise TrainError(f"cannot resume {path}: the model config differs from the checkpoint's in "
                         f"{', '.join(diff)} ({differences(diff, model_cfg, saved_model, 'model.')}); resume with "
                         f"{flags(diff, saved_model)} (the run's own config.json holds them all)"
                         + ("; a checkpoint from before the recipe option was trained with --recipe=clean."
                            if older else "."))
    saved = {key: ckpt["train_config"].get(key, AS_TRAINED_BEFORE_KEY_EXISTED.get(key)) for key in TRAJECTORY_KEYS}
    current = {key: getattr(train_cfg, key) for key in TRAJECTORY_KEYS}
    uses_layout = [values["grad_scale"] == "official" or values["sampler"] == "random_offsets"
                   for values in (saved, current)]
    if not all(uses_layout):  # unused on at least one side: the change of grad_scale or sampler is what counts
        saved["reference_layout"] = current["reference_layout"] = ""
    changed = [key for key in TRAJECTORY_KEYS if saved[key] is not None and saved[key] != current[key]]
    refused = [key for key in changed if key not in allowed]
    if refused:
        them = "it" if len(refused) == 1 else "them"
        raise TrainError(f"cannot resume {path}: {differences(refused, current, saved, 'train.')}; the loss sequence "
                         f"depends on {them}, so resume with {flags(refused, saved)} (the values it was trained with), "
                         f"or add --allow_changes={','.join(refused)} to change {them} on purpose (recorded in the "
                         "run), or start a new run in another --out_dir.")
    return [{"key": key, "from": saved[key], "to": current[key]} for key in changed]


def check_resume_data(ckpt: dict, data, path: str, allowed: tuple[str, ...] | list[str] = ()) -> list[dict]:
    """Refuse a resume on a data folder (a data.prepared.PreparedData) whose identity differs from the one the
    checkpoint recorded, unless `allowed` names DATA_CHANGE; return that deliberate change as [{"key", "from",
    "to"}] (none when they agree, or either is unknown)."""
    from data.prepared import other_data_problem
    problem = other_data_problem(ckpt.get("data_identity"), data)
    if problem is None:
        return []
    if DATA_CHANGE not in allowed:
        raise TrainError(f"cannot resume {path}: {problem}; resume with --allow_changes={DATA_CHANGE} to go on "
                         "training on it (recorded in the run), or put back the data it was trained on.")
    return [{"key": DATA_CHANGE, "from": ckpt["data_identity"], "to": data.identity}]


def differences(keys, here: dict, saved: dict, prefix: str) -> str:
    return "; ".join(f"{prefix}{key} is {here[key]!r} here but {saved[key]!r} in the checkpoint" for key in keys)


def flags(keys, values: dict) -> str:
    return " ".join(f"--{key}={values[key]}" for key in keys)


def restore(ckpt: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
            device: torch.device, ddp=None, path: str = "") -> int:
    """Weights, optimizer moments and random state from ckpt (read from `path`); returns its step. `ddp`: the
    run's Distributed, for a sharded checkpoint or a sharded model (FSDP); None for neither."""
    if "shards" in ckpt:
        restore_from_shards(ckpt, model, optimizer, ddp, path)
        set_optimizer_settings(optimizer, cfg)
    elif ddp is not None and ddp.sharded:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        full = StateDictOptions(full_state_dict=True)  # every process holds the whole file and keeps its shard
        set_model_state_dict(model, ckpt["model"], options=full)
        set_optimizer_state_dict(model, optimizer, by_parameter_name(ckpt["optimizer"], model, optimizer), options=full)
        set_optimizer_settings(optimizer, cfg)
    else:
        model.load_state_dict(ckpt["model"])
        load_optimizer_state(optimizer, ckpt["optimizer"], cfg)
    if "rng" in ckpt:  # (not in one recovered from its shards alone; training draws no random numbers)
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
    return ckpt["step"]


def by_parameter_name(state: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """An optimizer state_dict keyed by parameter number (torch's, as ckpt.pt holds it) keyed by parameter name
    instead, as torch.distributed.checkpoint.state_dict takes it."""
    names = {id(p): name for name, p in model.named_parameters()}
    ordered = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    return {"state": {ordered[i]: value for i, value in state["state"].items()},
            "param_groups": [{**group, "params": [ordered[i] for i in group["params"]]}
                             for group in state["param_groups"]]}


def sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """{"model", "optimizer"} as torch.distributed.checkpoint saves and loads them: keyed by parameter name, each
    process's shards as DTensors under FSDP, whole tensors otherwise."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def restore_from_shards(ckpt: dict, model, optimizer, ddp, path: str) -> None:
    """Check the shards (the processes share the reading) and load them into this run's model and optimizer,
    whatever the number of processes that wrote them and whether this run shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    rank, world = (ddp.rank, ddp.world_size) if ddp is not None and ddp.enabled else (0, 1)
    names = sorted(ckpt["shards"]["files"])
    problems = checkpoints.damaged_shards(path, ckpt, names[rank::world])
    if world > 1:
        found = [None] * world
        dist.all_gather_object(found, problems)
        problems = sorted(p for share in found for p in share)
    if problems:
        raise TrainError(f"{checkpoints.shard_damage_error(path, ckpt, problems, RESTORE_ADVICE)}.")
    state = sharded_state(model, optimizer)
    alone = world == 1 and not dist.is_initialized()
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is, when alone
        if alone:
            warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=checkpoints.shard_directory(path, ckpt), no_dist=alone)
    problem = checkpoints.non_finite(state["model"]) or checkpoints.non_finite(state["optimizer"], "optimizer")
    if world > 1:  # (each process has read its own shard of every tensor)
        found = [None] * world
        dist.all_gather_object(found, problem)
        problem = next((p for p in found if p), None)
    if problem:
        name = checkpoints.shard_directory(path, ckpt) if "recovered" in ckpt else path
        raise TrainError(f"{checkpoints.non_finite_sentence(name, problem, damaged_weights_advice(path, ckpt))}.")
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


class Checkpointer:
    """Saves the run's state to `path` (the main process writes, every process waits for it) and remembers
    the step of the checkpoint on disk (None before the first one). `resolved` is the run's config.json (the
    configs, tokenizer, layout, code version and deliberate changes, the same for the whole run). `directory`: the
    run directory as its lock holds it (training/run_lock.py), checked before each save and before ckpt.pt is
    replaced, so that a run whose directory was moved writes nothing into what is now at its path."""

    def __init__(self, path: str, ddp, stops, resolved: dict, wandb_id: str | None, saved_step: int | None,
                 directory=None):
        self.path, self.ddp, self.stops, self.resolved, self.wandb_id = path, ddp, stops, resolved, wandb_id
        self.saved_step, self.directory = saved_step, directory

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, divergence: dict) -> None:
        """`divergence`: the divergence monitor's state (the recent losses), so a resume checks from its first step."""
        self.check_directory()  # (every process stops, the others' shards unwritten)
        with self.stops.writing_checkpoint():  # a second Ctrl-C now waits for the write instead of discarding it
            if self.ddp.sharded:
                self.save_sharded(step, model, optimizer, divergence)
            elif self.ddp.is_main:
                self.write({**self.description(step, divergence), "model": model.state_dict(),
                            "optimizer": optimizer.state_dict()})
                remove_unreferenced_shards(self.path)  # a sharded run resumed without FSDP: its last shards
        self.saved_step = step
        self.ddp.barrier()

    def check_directory(self) -> None:
        """On every process together: a TrainError when the run directory's path no longer leads to the directory
        the main process locked, so that all of them stop at once with the main process's sentence (not the others
        with a failed collective when the main one stops alone)."""
        moved = self.ddp.from_main(self.directory.problem() if self.directory and self.ddp.is_main else None)
        if moved:
            raise TrainError(moved)

    def description(self, step: int, divergence: dict) -> dict:
        """Everything a checkpoint holds beside the weights and the optimizer state."""
        device, run = self.ddp.device, self.resolved
        rng = {"torch": torch.get_rng_state(),
               "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}
        return {"model_config": run["model"], "tokenizer": run["tokenizer"], "train_config": run["train"],
                "step": step, "rng": rng, "world_size": run["world_size"], "grad_accum": run["grad_accum"],
                "windows_seen": step * run["train"]["global_batch_size"],
                "tokens_seen": step * run["train"]["global_batch_size"] * run["model"]["block_size"],
                "code_version": run["code_version"], "wandb_id": self.wandb_id, "changes": run["resume_changes"],
                "divergence": divergence, "data_identity": run.get("data_identity")}

    def write(self, state: dict) -> None:
        try:
            checkpoints.save(self.path, state, before_replace=self.directory.check if self.directory else None)
        except checkpoints.CheckpointError as error:
            raise TrainError(str(error)) from None

    def save_sharded(self, step: int, model, optimizer, divergence: dict) -> None:
        """Every process writes its shards into a new directory and hashes a share of its files; then the main
        process commits them by writing ckpt.pt, and removes the directories it no longer names."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        run_dir, ddp = os.path.dirname(os.path.abspath(self.path)), self.ddp
        name = os.path.join(checkpoints.SHARDS_DIR,
                            ddp.from_main(f"{step:08d}-{uuid.uuid4().hex[:8]}" if ddp.is_main else None))
        directory = os.path.join(run_dir, name)
        try:
            dcp.save(sharded_state(model, optimizer), storage_writer=checkpoints.shard_writer(directory))
        except (Exception, CheckpointException) as error:  # CheckpointException is a BaseException
            if ddp.is_main:  # this save's own files, which nothing names: no use, and on a full disk in the way
                shutil.rmtree(directory, ignore_errors=True)
            raise self.shard_write_failure(directory, error) from None
        ddp.barrier()
        files = sorted(os.listdir(directory))
        hashes = {file: checkpoints.file_sha256(os.path.join(directory, file))
                  for file in files[ddp.rank::ddp.world_size]}
        shares = [None] * ddp.world_size
        dist.all_gather_object(shares, hashes)
        if ddp.is_main:
            fsync_directory(directory)
            shards = {"dir": name, "files": {f: h for share in shares for f, h in share.items()},
                      "world_size": ddp.world_size}
            self.write({**self.description(step, divergence), "shards": shards})
            remove_unreferenced_shards(self.path)

    def shard_write_failure(self, directory: str, error: BaseException) -> TrainError:
        """The sentence of a failed dcp.save: another process lost (every process says it: the main one may be the
        one that died), or the system's reason (torch.distributed.checkpoint gathers each process's exception into
        one CheckpointException, which arrives on every process)."""
        from torch.distributed.checkpoint.api import CheckpointException
        causes = [cause for cause, _ in error.failures.values()] if isinstance(error, CheckpointException) else [error]
        previous = f"the previous checkpoint {self.path} is intact" if os.path.exists(self.path) else \
            "no earlier checkpoint exists"
        lost = [cause for cause in causes if isinstance(cause, RuntimeError) and is_collective_failure(cause)]
        if lost:
            return LostProcess(f"process {self.ddp.rank} stopped: another process died or stopped responding while the "
                               f"sharded checkpoint {directory} was written ({first_line(lost[0])}); {previous}. Fix "
                               f"the cause, then {checkpoints.again()}.")
        system = next((cause for cause in causes if isinstance(cause, OSError)), None)
        if system is None:
            return TrainError(f"could not write the sharded checkpoint {directory} ({first_line(causes[0])}); "
                              f"{previous}. Fix the cause, then {checkpoints.again()}.")
        return TrainError(checkpoints.write_failure_sentence(f"the sharded checkpoint {directory}", system,
                                                             os.path.dirname(os.path.abspath(self.path)), previous))


def remove_unreferenced_shards(path: str) -> None:
    """After ckpt.pt at `path` is written: the shard directories beside it that it does not name (the previous
    sharded checkpoint's) are no longer needed."""
    for stale in checkpoints.unreferenced_shard_directories(os.path.dirname(os.path.abspath(path))):
        shutil.rmtree(stale, ignore_errors=True)


def fsync_directory(directory: str) -> None:
    """The directory's entries on disk (the files' own contents are synced by their writer)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
