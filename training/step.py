"""One optimizer step's forward and backward passes, and validation.

Each step sees global_batch_size sequences: batch_size per micro-batch per process, times the accumulation
steps, times the processes. Micro-batch `micro` of step `step` on rank `rank` reads batch number
(step * grad_accum + micro) * world_size + rank, so the sequences of a step do not depend on how the global
batch is split (1 process x 2 micro-batches reads what 2 processes x 1 read), and a resume needs only the step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from config import TrainConfig
from training.errors import TrainError

PROGRESS_EVERY_S = 30.0  # a validation longer than this prints its progress this often


def split_batch(global_batch_size: int, batch_size: int, world_size: int) -> tuple[int, int]:
    """(sequences per micro-batch on each process, micro-batches per step) of a global batch over world_size
    processes: batch_size is the most a micro-batch holds, and where it does not divide a process's share the
    largest number below it that does is used. A ValueError where the processes do not share the batch equally.
    train.py runs this split and training/memory.py plans it."""
    if global_batch_size % world_size:
        raise ValueError(f"global_batch_size {global_batch_size} cannot be split equally over {world_size} processes")
    share = global_batch_size // world_size
    micro = max(b for b in range(1, min(batch_size, share) + 1) if share % b == 0)
    return micro, share // micro


def process_counts(global_batch_size: int, world_size: int) -> str:
    """The numbers of processes nearest to world_size, below and above, that divide the global batch."""
    G = global_batch_size
    below = max(n for n in range(1, world_size) if G % n == 0)
    above = next((n for n in range(world_size + 1, G + 1) if G % n == 0), None)
    return str(below) if above is None else f"{below} or {above}"


@dataclass
class StepResult:
    loss: float                # mean loss over the global batch
    grad_norm: float | None    # before clipping (None for a forward pass alone)
    param_norm: float          # of all weights: not finite once any weight is not
    overflow: float            # GRAPE-M-basis generators past the range of their exponential when > 1
    stop: bool = False         # some process was asked to stop: all stop after this step


def train_step(model, raw_model, batches, step: int, grad_accum: int, cfg: TrainConfig, ddp, autocast,
               stops) -> StepResult | None:
    """Forward and backward passes of this process's micro-batches, gradient clipping, and one small all-reduce
    of the loss, the health of the weights and the stop vote. Returns None, with the gradients dropped, when a
    stop request arrives between micro-batches: the weights are still those after `step` steps, so a checkpoint
    resumes by redoing this step."""
    params = [p for p in raw_model.parameters() if p.requires_grad]
    vote_each_micro_batch = votes_each_micro_batch(grad_accum, ddp)
    loss_sum = torch.zeros((), device=ddp.device)
    for micro in range(grad_accum):
        x, y = batches.batch((step * grad_accum + micro) * ddp.world_size + ddp.rank)
        x, y = x.to(ddp.device, non_blocking=True), y.to(ddp.device, non_blocking=True)
        # Gradients are reduced over the processes only on the last micro-batch (under FSDP optionally on each,
        # so that they accumulate sharded).
        with ddp.gradient_sync(model, micro == grad_accum - 1 or ddp.sharded and cfg.fsdp_reduce_each_micro_batch):
            with autocast():
                loss = model(x, targets=y)[1]  # (not holding the logits through the backward pass)
            # The mean over the global batch (1/grad_accum here, DDP's mean over processes), times loss_scale.
            (loss * cfg.loss_scale / grad_accum).backward()
        loss_sum += loss.detach().float()
        if vote_each_micro_batch and micro < grad_accum - 1 and stops.any_process(ddp):
            for p in params:
                p.grad = None
            return None
    grad_norm = clip_gradients(params, cfg.grad_clip, ddp.sharded)
    return gather(loss_sum / grad_accum, raw_model, ddp, stops, grad_norm)


def clip_gradients(params: list, max_norm: float, sharded: bool) -> torch.Tensor:
    """The norm of all gradients, before clipping them to max_norm (0: no clipping). Under FSDP each process
    holds a shard of each gradient: the norm is that of the whole gradient (the shards' squares summed over the
    processes), the same on every process."""
    if not sharded:
        return torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    from torch.distributed.tensor import DTensor
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def gather(loss: torch.Tensor, raw_model, ddp, stops, grad_norm: torch.Tensor | None = None) -> StepResult:
    """One small all-reduce: the mean loss over the processes, the weights' health (under DDP the same on every
    process; under FSDP each process adds its shards' squares) and whether any process was asked to stop (all
    must stop at the same step)."""
    world = ddp.world_size
    with torch.no_grad():
        if ddp.sharded:
            from torch.distributed.tensor import DTensor
            local = [p.to_local() if isinstance(p, DTensor) else p for p in raw_model.parameters()]
            weights = sum(torch.linalg.vector_norm(p.detach().float()) ** 2 for p in local if p.numel())
        else:
            weights = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.detach().float())
                                                            for p in raw_model.parameters()]))
        overflow = raw_model.basis_overflow()
        if hasattr(overflow, "full_tensor"):  # computed from sharded generators: a DTensor
            overflow = overflow.full_tensor()
        stats = torch.stack([loss.float(), torch.as_tensor(weights, device=ddp.device).float(), overflow.float(),
                             stops.vote(ddp.device)])
    loss_sum, weights_sum, overflow_sum, votes = ddp.all_reduce_sum(stats).tolist()
    param_norm = weights_sum ** 0.5 if ddp.sharded else weights_sum / world
    return StepResult(loss=loss_sum / world, grad_norm=None if grad_norm is None else grad_norm.item(),
                      param_norm=param_norm, overflow=overflow_sum / world, stop=votes > 0)


@torch.no_grad()
def confirmation(raw_model, batches, step: int, grad_accum: int, ddp, autocast, stops) -> StepResult:
    """The current weights' loss on the first micro-batch of step `step` (the next one) and their health,
    checked before they are saved: a checkpoint never holds weights that no check has seen."""
    x, y = batches.batch(step * grad_accum * ddp.world_size + ddp.rank)
    with autocast():
        loss = raw_model(x.to(ddp.device), targets=y.to(ddp.device))[1]
    ddp.reshard(raw_model)
    return gather(loss, raw_model, ddp, stops)


def votes_each_micro_batch(grad_accum: int, ddp) -> bool:
    """A stop request is also honoured between the micro-batches of a step, so that a long accumulation (e.g. the
    GPU-sized global batch on a CPU) does not delay it by minutes. With several processes that costs one tiny
    all-reduce per micro-batch, paid only where steps are long anyway."""
    return grad_accum > 1 and (not ddp.enabled or grad_accum >= 8)


@torch.no_grad()
def evaluate(model, data, cfg: TrainConfig, block_size: int, ddp, autocast, stops=None) -> float | None:
    """Mean loss over the first eval_windows fixed validation windows of data (a data.prepared.PreparedData, opened
    and checked once by train.py, or a folder's path), the batches shared out over the processes.
    Each batch's mean loss is weighted by its number of windows (the last batch may be smaller). None when a stop
    request cut it short (checked between batches, so a stop never waits for a whole validation)."""
    from data.loader import validation_batches
    from training.metrics import duration
    model.eval()
    total = torch.zeros(3, dtype=torch.float64, device=ddp.device)  # loss x windows, windows, stopped
    started = last_said = time.perf_counter()
    batches = validation_batches(data, batch_size=cfg.batch_size, block_size=block_size,
                                 max_windows=cfg.eval_windows)
    # (x, y, whether it counts): under FSDP every forward gathers weights from all processes, so all of them run
    # the same number of forwards (the last round padded with uncounted repeats) and stop at the same round
    batches = in_lockstep(list(batches), ddp.world_size) if ddp.sharded else ((x, y, True) for x, y in batches)
    for i, (x, y, counted) in enumerate(batches):
        if stops is not None:
            stop = (i % ddp.world_size == 0 and stops.any_process(ddp)) if ddp.sharded else stops.requested
            if stop:
                total[2] = 1
                break
        now = time.perf_counter()
        if i and now - last_said > PROGRESS_EVERY_S:  # a long validation says how far it is
            done = i * cfg.batch_size
            ddp.say(f"validation: {done}/{cfg.eval_windows} windows, {duration(now - started)} elapsed, "
                    f"{duration((now - started) / done * (cfg.eval_windows - done))} left")
            last_said = now
        if i % ddp.world_size != ddp.rank:
            continue
        with autocast():
            loss = model(x.to(ddp.device), targets=y.to(ddp.device))[1]
        if counted:
            total[0] += loss.double() * len(x)
            total[1] += len(x)
    model.train()
    ddp.reshard(model)
    ddp.all_reduce_sum(total)
    if total[2].item() > 0:
        return None
    if total[1].item() == 0:
        raise TrainError(f"{getattr(data, 'path', data)} has no validation windows of length {block_size}; prepare a "
                         "larger validation split or lower block_size.")
    return (total[0] / total[1]).item()


def in_lockstep(batches: list, world_size: int) -> list:
    """The batches as (x, y, counted), padded to a whole number of rounds of world_size with uncounted repeats of
    the last round's first batch."""
    padded = [(x, y, True) for x, y in batches]
    while len(padded) % world_size:
        x, y, _ = padded[len(padded) // world_size * world_size]
        padded.append((x, y, False))
    return padded
