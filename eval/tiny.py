"""Tiny byte-level models and run directories, for eval tests and the README's CPU examples."""
import dataclasses
import os

import torch

import checkpoints


def tiny_model(pos="rope", block_size=64, seed=0, n_layer=2, n_embd=64, n_head=4, kv_shift=False):
    """A randomly initialised GPT over the "byte" tokenizer (vocab 257, padded to 320)."""
    from model import GPT, GPTConfig

    torch.manual_seed(seed)
    config = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, head_dim=n_embd // n_head,
                       vocab_size=320, block_size=block_size, pos=pos, kv_shift=kv_shift)
    return GPT(config).eval()


def save_run(model, run_dir, step=0, train_config=None):
    """Writes RUN_DIR/ckpt.pt with the checkpoint contract's keys (tokenizer "byte")."""
    os.makedirs(run_dir, exist_ok=True)
    ckpt = {
        "model": model.state_dict(),
        "model_config": dataclasses.asdict(model.config),
        "tokenizer": "byte",
        "train_config": dict(train_config or {}),
        "step": int(step),
    }
    checkpoints.save(os.path.join(run_dir, "ckpt.pt"), ckpt)
    return run_dir
