"""How the model runs in training, beyond its architecture: the loss implementation (lm_loss.py), activation
checkpointing, FSDP's sharding and mixed precision (training/distributed.py), and what torch.compile compiles.
train.py and the memory measurements (training/memory.py) set a model up through the same function."""
from __future__ import annotations

from config import ConfigError, TrainConfig
from lm_loss import resolve_loss


def bf16_parameters(cfg: TrainConfig, use_bf16: bool) -> bool:
    """Whether FSDP gathers and computes the weight matrices in bf16 (its mixed-precision policy) instead of the
    run computing under bf16 autocast."""
    return use_bf16 and cfg.parallel == "fsdp" and cfg.fsdp_bf16 == "params"


def lay_out(raw_model, cfg: TrainConfig, ddp, use_bf16: bool) -> None:
    """Set the model's loss and activation checkpointing, and shard it in place under FSDP (before its optimizer
    is made: the optimizer holds the sharded parameters)."""
    try:
        raw_model.loss_impl = resolve_loss(cfg.loss, ddp.device)
    except ValueError as error:
        raise ConfigError(f"train.{error}.") from None
    raw_model.loss_chunk_tokens = cfg.loss_chunk_tokens
    raw_model.set_activation_checkpointing(cfg.activation_checkpointing, cfg.activation_checkpointing_every)
    if ddp.sharded:
        ddp.shard(raw_model, bf16_params=bf16_parameters(cfg, use_bf16),
                  reshard_after_forward=cfg.fsdp_reshard_after_forward, compile_blocks=cfg.compile)


def wrapped_for_training(raw_model, cfg: TrainConfig, ddp):
    """The module the training step calls: with compile = true the whole model compiled (under FSDP lay_out has
    compiled each block before sharding it instead), inside DDP's wrapper when there are several processes."""
    import torch
    return ddp.wrap(torch.compile(raw_model) if cfg.compile and not ddp.sharded else raw_model)


def compiled_blocks(raw_model) -> int:
    """How many of the model's blocks have a compiled call (nn.Module.compile, as Distributed.shard gives each block
    under FSDP before sharding it)."""
    return sum(getattr(block, "_compiled_call_impl", None) is not None for block in raw_model.blocks)


def describe_compile(raw_model, cfg: TrainConfig, ddp, use_bf16: bool = False) -> str:
    """The start-up line's account of torch.compile: off; the whole model (train.py compiles it under DDP and on one
    process); or, under FSDP, the blocks that have a compiled call, counted on the model itself, out of all of them
    (each compiled before fully_shard, as torchtitan does; FSDP's hooks, which torch.compile does not trace, gather
    and free the weights eagerly around each block's graph). The FSDP root's part (the embedding, the final norm,
    the LM head and the loss) runs eagerly. Under bf16 parameters the qkv, proj and MLP are FSDP units of their own
    inside each block, and their hooks break the block's graph there (seen with torch 2.13: several graphs a block)."""
    if not cfg.compile:
        return "compile: off"
    if not ddp.sharded:
        return "compile: whole model"
    broken = "; each block's graph broken at its bf16 qkv, proj and MLP units" if bf16_parameters(cfg, use_bf16) else ""
    return (f"compile: {compiled_blocks(raw_model)} of {len(raw_model.blocks)} blocks (per block, before fully_shard"
            f"{broken}; embedding, final norm, LM head and loss eager)")
