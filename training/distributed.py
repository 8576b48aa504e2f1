"""Rank, world size and device, and the few collectives training needs.

A process group exists only when torchrun launched the process (RANK and WORLD_SIZE are set): NCCL on GPUs,
gloo on CPUs. Every method is a no-op on a single process, so the loop is written once.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from config import ConfigError


class Distributed:
    def __init__(self, device_pref: str, timeout_s: int = 600):
        self.enabled = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        self.rank = int(os.environ.get("RANK", 0))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        use_cuda = torch.cuda.is_available() if device_pref == "auto" else device_pref == "cuda"
        if use_cuda and not torch.cuda.is_available():
            raise ConfigError("device=cuda but no CUDA GPU is visible; use --device=cpu or auto.")
        if use_cuda:
            self.device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        if self.enabled and not dist.is_initialized():
            # With a timeout a dead or frozen process ends the job (the others' next collective fails) instead
            # of blocking it forever.
            dist.init_process_group(backend="nccl" if use_cuda else "gloo", device_id=self.device if use_cuda else None,
                                    timeout=timedelta(seconds=timeout_s))
        self.is_main = self.rank == 0

    def say(self, *args, **kwargs) -> None:
        """print, on the main process only."""
        if self.is_main:
            print(*args, **kwargs)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def from_main(self, value):
        """The main process's value, on every process."""
        if not self.enabled:
            return value
        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model that trains: DDP around it when there are several processes."""
        if not self.enabled:
            return model
        return DistributedDataParallel(model, device_ids=[self.local_rank] if self.device.type == "cuda" else None)

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def is_collective_failure(error: RuntimeError) -> bool:
    """A failed collective (a peer died or froze), not an out-of-memory error or a bug on this process."""
    if isinstance(error, torch.OutOfMemoryError):
        return False
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error).lower()
    return any(word in text for word in ("gloo", "nccl", "connection", "timed out", "timeout", "socket", "peer"))
