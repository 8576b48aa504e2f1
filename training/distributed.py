"""Rank, world size and device, the few collectives training needs, and how the model is spread over the
processes: DDP (a whole replica each) or FSDP2 (weights, gradients and optimizer state sharded).

A process group exists when torchrun launched the process (RANK and WORLD_SIZE are set): NCCL on GPUs, gloo on
CPUs; under FSDP a single process without torchrun makes a group of its own (FSDP needs one). Every method is a
no-op on a single process without a group, so the loop is written once.
"""
from __future__ import annotations

import contextlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from config import ConfigError
from training.errors import launched_by_torchrun, process_rank


class Distributed:
    def __init__(self, device_pref: str, timeout_s: int = 600, parallel: str = "ddp"):
        self.sharded = parallel == "fsdp"
        self.enabled = launched_by_torchrun()
        self.owns_group = False  # a group of one made here (closed by close())
        self.rank = process_rank()
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0)) if self.enabled else 0
        self.world_size = int(os.environ.get("WORLD_SIZE", 1)) if self.enabled else 1
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
        if self.sharded and not self.enabled:
            if not dist.is_initialized():
                dist.init_process_group(backend="nccl" if use_cuda else "gloo", store=dist.HashStore(), rank=0,
                                        world_size=1, device_id=self.device if use_cuda else None)
                self.owns_group = True
            self.enabled = True
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

    def shard(self, model: torch.nn.Module, *, bf16_params: bool, reshard_after_forward: bool,
              compile_blocks: bool) -> None:
        """FSDP2, in place: each block its own group (its weights gathered for its forward and backward only), the
        embedding, final norm and tied head the root's. `bf16_params`: the weight matrices (qkv, proj, MLP, the
        embedding) are gathered and computed in bf16 and their gradients reduced in fp32; each block's own group
        then keeps the norms and positional parameters (spectra, gates, rates, path projections) fp32, since their
        phases and cumulative sums must stay fp32. `compile_blocks`: each block is compiled (nn.Module.compile, in
        place: its state_dict keys unchanged) before it is sharded, as torchtitan does; the root's embedding, final
        norm, LM head and loss stay eager (the start-up line says so: training/layout.py, describe_compile)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        matrices = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16_params else fp32
        for block in model.blocks:
            if compile_blocks:
                block.compile()
            if bf16_params:
                for part in (block.attn.qkv, block.attn.proj, block.mlp):
                    fully_shard(part, mp_policy=matrices, reshard_after_forward=reshard_after_forward)
            fully_shard(block, mp_policy=fp32, reshard_after_forward=reshard_after_forward)
        # the root's weights are needed again at once by the backward pass: kept gathered
        fully_shard(model, mp_policy=matrices, reshard_after_forward=False)

    def reshard(self, model: torch.nn.Module) -> None:
        """After forward passes without a backward (validation, the check before saving): free the weights that
        FSDP keeps gathered until a backward pass (the root's), which a training step would otherwise use without
        reducing their gradients."""
        if self.sharded:
            from torch.distributed.fsdp import FSDPModule
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model that trains: DDP around it when there are several processes (FSDP shards in place)."""
        if not self.enabled or self.sharded:
            return model
        # gradient_as_bucket_view: the gradients are views of DDP's reduction buckets, not a second copy of them
        return DistributedDataParallel(model, device_ids=[self.local_rank] if self.device.type == "cuda" else None,
                                       gradient_as_bucket_view=True)

    def gradient_sync(self, model: torch.nn.Module, sync: bool):
        """A context for one micro-batch's backward pass: gradients are reduced over the processes only when `sync`
        (the last micro-batch of a step); before it they accumulate locally (unsharded under FSDP)."""
        if self.sharded:
            model.set_requires_gradient_sync(sync)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if not self.enabled or sync else model.no_sync()

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()

    def release(self) -> None:
        """The group of one that this object made for FSDP, closed (a group torchrun's launch made stays)."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False


def is_collective_failure(error: RuntimeError) -> bool:
    """A failed collective (a peer died or froze), not an out-of-memory error or a bug on this process."""
    if isinstance(error, torch.OutOfMemoryError):
        return False
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error).lower()
    return any(word in text for word in ("gloo", "nccl", "connection", "timed out", "timeout", "socket", "peer"))
