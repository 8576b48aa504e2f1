"""Logit parity of a native Qwen3 export with our model at long context (docs/hf_export.md quotes it).

A 4-layer, 256-wide random `rope` model with head_dim 128 and norm gains moved off 1, exported with
scripts/export_hf.py's code and loaded by transformers, in fp32: the largest logit difference relative to the
largest logit, and the share of positions whose argmax agrees, at T = 2048 and 4096.

    python3 tools/hf_native_parity.py
"""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from eval.tiny import save_run  # noqa: E402
from hf.export import export  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def main() -> None:
    from transformers import AutoModelForCausalLM
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=2, n_embd=256, head_dim=128, vocab_size=512, block_size=4096, pos="rope"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    with tempfile.TemporaryDirectory() as root:
        export(save_run(model, os.path.join(root, "run")), os.path.join(root, "out"))
        native = AutoModelForCausalLM.from_pretrained(os.path.join(root, "out"), dtype=torch.float32)
        print("| T | largest logit difference / largest logit | positions with the same argmax |")
        print("|---|---|---|")
        for T in (2048, 4096):
            idx = torch.randint(0, 512, (1, T), generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                ours, theirs = model(idx)[0], native(idx).logits
            error = ((ours - theirs).abs().max() / ours.abs().max()).item()
            same = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
            print(f"| {T} | {error:.1e} | {100 * same:.1f}% |")


if __name__ == "__main__":
    main()
