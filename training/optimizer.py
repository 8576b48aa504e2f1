"""AdamW with the recipe's parameter groups, and the learning-rate schedule (docs/recipe.md)."""
from __future__ import annotations

import math

import torch

from config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr over warmup_iters steps, then cosine decay to min_lr at step max_iters.
    The official warm-up (nanoGPT's) is lr·step/warmup_iters, so its first step has lr 0; the clean one
    lr·(step+1)/warmup_iters reaches lr at the last warm-up step."""
    if step < cfg.warmup_iters:
        return cfg.lr * (step + (cfg.lr_schedule != "official")) / cfg.warmup_iters
    progress = min(1.0, (step - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def param_groups(model: torch.nn.Module, weight_decay: float, decay_params: str = "matrices") -> list[dict]:
    """AdamW groups. "matrices": weight decay on the weight matrices of Linear and Embedding layers only;
    norm gains and the encodings' own parameters get none, whatever their shape: decay would pull a per-head
    spectrum log θ (H, d/2) towards θ = 1 rad, the learned basis towards B = I, GRAPE-A's rates and (H, d)
    gate vectors towards 0. "all_but_norm_gains": every parameter except the RMSNorm gains, as the official
    code does (so it also decays the spectrum, GRAPE-A's rates and gates, FoX's and the phase's biases)."""
    from model import RMSNorm
    if decay_params == "all_but_norm_gains":
        gains = {id(m.weight) for m in model.modules() if isinstance(m, RMSNorm)}
        decayed = {id(p) for p in model.parameters() if id(p) not in gains}
    else:
        decayed = {id(m.weight) for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if id(p) in decayed]
    no_decay = [p for p in params if id(p) not in decayed]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay, cfg.decay_params), lr=cfg.lr,
                             betas=(cfg.beta1, cfg.beta2), fused=device.type == "cuda")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict, cfg: TrainConfig) -> None:
    """The saved moments, with this run's weight decay and betas (load_state_dict restores the saved ones, but a
    change allowed on resume must take effect)."""
    optimizer.load_state_dict(state)
    set_optimizer_settings(optimizer, cfg)


def set_optimizer_settings(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> None:
    """This run's weight decay and betas over the ones restored with the moments."""
    for group, decay in zip(optimizer.param_groups, (cfg.weight_decay, 0.0)):
        group["weight_decay"], group["betas"] = decay, (cfg.beta1, cfg.beta2)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
