"""How far RoPE's fp32 frequencies here are from the authors' and Hugging Face's, and what that does to logits.

Here θ_i = base^(-2i/d) is computed in fp64 and rounded once to fp32. The authors' code and Hugging Face's
Qwen3 compute 1 / base^(2i/d) in fp32, which rounds several times. This prints, per head_dim, how many of the
d/2 values are bitwise equal, the largest difference in ulps (of fp32) and relative, the largest angle
difference at the last position, and the logits of one random model at T = 4096 (fp32) with either θ against
the same model in fp64 with the exact θ.

    python3 tools/rope_theta.py            # prints a markdown table (docs/recipe.md quotes it)
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig  # noqa: E402


def fp32_formula_theta(base: float, d: int) -> torch.Tensor:
    """The authors' and Hugging Face's RoPE frequencies: 1 / base^(arange(0, d, 2) / d), in fp32."""
    return 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in units of fp32 spacing at b (positive fp32 values)."""
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def set_theta(model: GPT, theta: torch.Tensor) -> None:
    for block in model.blocks:  # log θ in fp64: exp of it rounds back to exactly this θ in fp32
        block.attn.rotation.log_theta.copy_(theta.double().log())


def main(base: float = 10000.0, T: int = 4096) -> None:
    torch.set_flush_denormal(True)
    print(f"| head_dim | bitwise equal θ_i | largest difference (fp32 ulps) | largest relative difference | "
          f"largest angle difference at position {T - 1} (rad) |")
    print("|---|---|---|---|---|")
    for d in (32, 64, 128):
        ours = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, head_dim=d, vocab_size=8, pos="rope", rope_base=base))
        theta = ours.blocks[0].attn.rotation.frequencies().numpy()
        other = fp32_formula_theta(base, d).numpy()
        relative = np.abs(other.astype(np.float64) / theta - 1).max()
        angle = np.abs(np.float32(T - 1) * other - np.float32(T - 1) * theta).max()
        print(f"| {d} | {int((theta == other).sum())} of {d // 2} | {int(ulps(other, theta).max())} | "
              f"{relative:.2e} | {angle:.2e} |")

    torch.manual_seed(0)
    config = GPTConfig(n_layer=4, n_head=8, n_embd=1024, head_dim=128, vocab_size=1024, block_size=T, pos="rope",
                       rope_base=base)
    model = GPT(config)
    idx = torch.randint(0, config.vocab_size, (1, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = GPT(config).double()
        exact.load_state_dict(model.state_dict())
        reference = exact(idx)[0][0]
        ours = model(idx)[0][0].double()
        set_theta(model, fp32_formula_theta(base, 128))
        theirs = model(idx)[0][0].double()
    scale = reference.abs().max().item()
    print(f"\nLogits of a 4-layer model with the medium config's heads (8 x 128, n_embd 1024), T = {T}, fp32, "
          f"against the same model in fp64 with the exact θ (largest logit {scale:.2f}):\n")
    print("| θ in the fp32 model | largest logit error | relative to the largest logit | "
          "largest difference between the two fp32 models |")
    print("|---|---|---|---|")
    between = (ours - theirs).abs().max().item()
    for name, logits in (("this project's (fp64, rounded once)", ours), ("authors' / Hugging Face's (fp32)", theirs)):
        error = (logits - reference).abs().max().item()
        print(f"| {name} | {error:.2e} | {error / scale:.2e} | {between:.2e} |")


if __name__ == "__main__":
    main()
