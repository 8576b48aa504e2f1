"""Checkpoints of a run: what they hold, whether a resume may use one, saving and restoring.

RUN_DIR/ckpt.pt is written by the main process through checkpoints.save (a temp file, fsync, rename, and a
checksum of the contents), so a kill at any moment leaves the old or the new checkpoint, never a mix.
"""
from __future__ import annotations

import dataclasses
import os

import torch

import checkpoints
from config import AS_TRAINED_BEFORE_KEY_EXISTED, TrainConfig
from training.errors import TrainError
from training.optimizer import load_optimizer_state

# Settings that shape the loss sequence: a resumed run must use the checkpoint's values unless --allow_changes
# names them. (batch_size and the number of processes may change: a step reads the same windows however the
# global batch is split.)
TRAJECTORY_KEYS = ("data_dir", "seed", "global_batch_size", "max_iters", "lr", "min_lr",
                   "warmup_iters", "weight_decay", "beta1", "beta2", "grad_clip", "dtype",
                   "decay_params", "lr_schedule", "grad_scale", "sampler", "reference_layout")
# Trajectory keys that no resume may change, with the reason.
FIXED_FOR_A_RUN = {
    "global_batch_size": "the training windows are numbered by step x global batch, so another size would repeat "
                         "or skip data",
    "decay_params": "the optimizer's parameter groups, and the Adam moments saved with them, are built from it",
}
CHECKPOINT_KEYS = ("model", "model_config", "tokenizer", "train_config", "step", "optimizer", "rng")


def load_checkpoint(path: str) -> dict:
    """The checkpoint at path, its checksum verified; every kind of damage is one TrainError sentence."""
    if not os.path.isfile(path):
        raise TrainError(f"no checkpoint at {path}; run without --resume to start this run, "
                         "or point --out_dir at the run directory to continue.")
    try:
        return checkpoints.load(path, required=CHECKPOINT_KEYS,
                                restore="restore it from a backup, or delete the run directory and start again")
    except checkpoints.CheckpointError as error:
        raise TrainError(f"{error}.") from None


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


def differences(keys, here: dict, saved: dict, prefix: str) -> str:
    return "; ".join(f"{prefix}{key} is {here[key]!r} here but {saved[key]!r} in the checkpoint" for key in keys)


def flags(keys, values: dict) -> str:
    return " ".join(f"--{key}={values[key]}" for key in keys)


def restore(ckpt: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
            device: torch.device) -> int:
    """Weights, optimizer moments and random state from ckpt; returns its step."""
    model.load_state_dict(ckpt["model"])
    load_optimizer_state(optimizer, ckpt["optimizer"], cfg)
    torch.set_rng_state(ckpt["rng"]["torch"])
    if device.type == "cuda" and ckpt["rng"].get("cuda") is not None:
        torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
    return ckpt["step"]


class Checkpointer:
    """Saves the run's state to `path` (the main process writes, every process waits for it) and remembers
    the step of the checkpoint on disk (None before the first one). `resolved` is the run's config.json (the
    configs, tokenizer, layout, code version and deliberate changes, the same for the whole run)."""

    def __init__(self, path: str, ddp, stops, resolved: dict, wandb_id: str | None, saved_step: int | None):
        self.path, self.ddp, self.stops, self.resolved, self.wandb_id = path, ddp, stops, resolved, wandb_id
        self.saved_step = saved_step

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, divergence: dict) -> None:
        """`divergence`: the divergence monitor's state (the recent losses), so a resume checks from its first step."""
        if self.ddp.is_main:
            device, run = self.ddp.device, self.resolved
            rng = {"torch": torch.get_rng_state(),
                   "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}
            state = {"model": model.state_dict(), "model_config": run["model"], "tokenizer": run["tokenizer"],
                     "train_config": run["train"], "step": step, "optimizer": optimizer.state_dict(), "rng": rng,
                     "world_size": run["world_size"], "grad_accum": run["grad_accum"],
                     "windows_seen": step * run["train"]["global_batch_size"],
                     "tokens_seen": step * run["train"]["global_batch_size"] * run["model"]["block_size"],
                     "code_version": run["code_version"], "wandb_id": self.wandb_id, "changes": run["resume_changes"],
                     "divergence": divergence}
            with self.stops.writing_checkpoint():  # a second Ctrl-C now waits for the write instead of discarding it
                try:
                    checkpoints.save(self.path, state)
                except checkpoints.CheckpointError as error:
                    raise TrainError(str(error)) from None
        self.saved_step = step
        self.ddp.barrier()
