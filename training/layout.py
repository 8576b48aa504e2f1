"""How the model runs in training, beyond its architecture: the loss implementation (lm_loss.py), activation
checkpointing, and FSDP's sharding and mixed precision (training/distributed.py). train.py and the memory
measurements (training/memory.py) set a model up through the same function."""
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
