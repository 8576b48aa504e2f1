"""How accurately each operand format keeps GRAPE-AP's in-tile suffix sums (CPU emulation, no GPU needed).

    python tools/split_precision.py

The kernels sum ψ over a key tile as a product with a triangle of ones on the tensor cores. Products with 0/1
are exact and the tensor cores accumulate in fp32, so the error comes from rounding ψ into the operand format:
one part x_hi, or x_hi + x_lo with x_lo the rounded remainder (two products into one accumulator). This
emulates that on ψ tiles like the model's (α = 0.5, z = p·r with |p| about 3, 64 keys per tile, log2 units)
against fp64 and prints the errors of each format; docs/grape_ap_kernel.md quotes the table.
"""
import math

import torch


def tile_suffix(x: torch.Tensor) -> torch.Tensor:
    """Σ_{ℓ>j} x[:, ℓ] within the tile, accumulated in fp32 from exact products."""
    x = x.double()
    return (torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1]) - x).float().double()


def parts(x: torch.Tensor, dtype, n: int) -> list[torch.Tensor]:
    out, rest = [], x
    for _ in range(n):
        part = rest.to(dtype).float()
        out.append(part)
        rest = rest - part
    return out


def main():
    torch.manual_seed(0)
    psi = 0.5 * torch.nn.functional.logsigmoid(3 * torch.randn(4096, 64, dtype=torch.float64)) / math.log(2)
    exact = tile_suffix(psi)
    x = psi.float()
    tf32 = (x.view(torch.int32) & ~0x1FFF).view(torch.float32)  # 10 mantissa bits
    formats = [("fp32", [x]), ("tf32, one part", [tf32]), ("bf16, one part", parts(x, torch.bfloat16, 1)),
               ("bf16, hi + lo", parts(x, torch.bfloat16, 2)), ("fp16, one part", parts(x, torch.float16, 1)),
               ("fp16, hi + lo (the kernels)", parts(x, torch.float16, 2)),
               ("bf16, hi + lo + lo2", parts(x, torch.bfloat16, 3))]
    print("| operand | max abs error | median relative error | products per tile |\n|---|---|---|---|")
    for name, split in formats:
        error = (sum(tile_suffix(p) for p in split) - exact).abs()
        relative = (error / exact.abs())[exact.abs() > 1e-3]
        print(f"| {name} | {error.max():.1e} | {relative.median():.1e} | {len(split)} |")


if __name__ == "__main__":
    main()
