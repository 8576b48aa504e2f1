"""One optimizer step's forward and backward passes, and validation.

Each step sees global_batch_size sequences: batch_size per micro-batch per process, times the accumulation
steps, times the processes. Micro-batch `micro` of step `step` on rank `rank` reads batch number
(step * grad_accum + micro) * world_size + rank, so the sequences of a step do not depend on how the global
batch is split (1 process x 2 micro-batches reads what 2 processes x 1 read), and a resume needs only the step.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from config import TrainConfig
from training.errors import TrainError


@dataclass
class StepResult:
    loss: float          # mean loss over the global batch
    grad_norm: float     # before clipping
    stop: bool           # some process was asked to stop: all stop after this step


def train_step(model, params, batches, step: int, grad_accum: int, loss_scale: float, cfg: TrainConfig, ddp,
               autocast, stops, vote_each_micro_batch: bool) -> StepResult | None:
    """Forward and backward passes of this process's micro-batches, gradient clipping, and one small all-reduce
    of the loss and the stop vote. Returns None, with the gradients dropped, when a stop request arrives between
    micro-batches: the weights are still those after `step` steps, so a checkpoint resumes by redoing this step."""
    loss_sum = torch.zeros((), device=ddp.device)
    for micro in range(grad_accum):
        x, y = batches.batch((step * grad_accum + micro) * ddp.world_size + ddp.rank)
        x, y = x.to(ddp.device, non_blocking=True), y.to(ddp.device, non_blocking=True)
        # Gradients are all-reduced only on the last micro-batch.
        sync = contextlib.nullcontext() if not ddp.enabled or micro == grad_accum - 1 else model.no_sync()
        with sync:
            with autocast():
                _, loss = model(x, targets=y)
            # The mean over the global batch (1/grad_accum here, DDP's mean over processes), times loss_scale.
            (loss * loss_scale / grad_accum).backward()
        loss_sum += loss.detach().float()
        if vote_each_micro_batch and micro < grad_accum - 1 and stops.any_process(ddp):
            for p in params:
                p.grad = None
            return None
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
    # One small all-reduce per step: the global loss, and whether any process was asked to stop (all must stop
    # at the same step).
    loss_value, votes = ddp.all_reduce_sum(torch.stack([loss_sum / grad_accum, stops.vote(ddp.device)])).tolist()
    return StepResult(loss=loss_value / ddp.world_size, grad_norm=grad_norm.item(), stop=votes > 0)


def votes_each_micro_batch(grad_accum: int, ddp) -> bool:
    """A stop request is also honoured between the micro-batches of a step, so that a long accumulation (e.g. the
    GPU-sized global batch on a CPU) does not delay it by minutes. With several processes that costs one tiny
    all-reduce per micro-batch, paid only where steps are long anyway."""
    return grad_accum > 1 and (not ddp.enabled or grad_accum >= 8)


def check_finite(result: StepResult, step: int, model, ckpt_path: str, saved_step: int | None) -> None:
    """A non-finite loss or gradient norm stops the run before the bad update is applied, naming a known cause
    and what to do; the last checkpoint is left as it is."""
    if math.isfinite(result.loss) and math.isfinite(result.grad_norm):
        return
    remedy = "lower --lr or raise --warmup_iters (or check the data)"
    if saved_step is None:
        remedy = f"no checkpoint was written before it, so start again with the same command but {remedy}"
    else:
        remedy = (f"the last good checkpoint {ckpt_path} (iteration {saved_step}) is kept: {remedy} and "
                  f"continue from it with --resume --allow_changes=lr,warmup_iters and the new values")
    raise TrainError(f"loss is {result.loss} (grad norm {result.grad_norm}) at iteration {step}: training "
                     f"diverged and stopped without updating the weights{model.nonfinite_cause()}; {remedy}.")


@torch.no_grad()
def evaluate(model, data_dir: str, cfg: TrainConfig, block_size: int, ddp, autocast) -> float:
    """Mean loss over the first eval_windows fixed validation windows, the batches shared out over the processes.
    Each batch's mean loss is weighted by its number of windows (the last batch may be smaller)."""
    from data.loader import validation_batches
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=ddp.device)
    for i, (x, y) in enumerate(validation_batches(data_dir, batch_size=cfg.batch_size, block_size=block_size,
                                                  max_windows=cfg.eval_windows)):
        if i % ddp.world_size != ddp.rank:
            continue
        with autocast():
            _, loss = model(x.to(ddp.device), targets=y.to(ddp.device))
        total[0] += loss.double() * len(x)
        total[1] += len(x)
    model.train()
    ddp.all_reduce_sum(total)
    if total[1].item() == 0:
        raise TrainError(f"{data_dir} has no validation windows of length {block_size}; prepare a larger "
                         "validation split or lower block_size.")
    return (total[0] / total[1]).item()
