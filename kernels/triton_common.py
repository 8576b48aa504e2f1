"""What the Triton kernels share: tile loads and stores, launch-size helpers, the interpreter switch."""
from __future__ import annotations

import os

import triton
import triton.language as tl

# TRITON_INTERPRET=1 runs the kernels on the CPU (the tests): read once, as triton itself does at import
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def load_tile(ptr, bh, n_rows, rows, row_ok, cols, width):
    """The (rows, cols) tile of a contiguous (B·H, n_rows, width) tensor, zeros outside it. The offset of
    the (batch·head) slice is 64-bit: B·H·T·D passes 2³¹ at e.g. B·H = 512, T = 32768, D = 128."""
    return tl.load(ptr + bh.to(tl.int64) * n_rows * width + rows[:, None] * width + cols[None, :],
                   mask=row_ok[:, None] & (cols[None, :] < width), other=0.0)


@triton.jit
def store_tile(ptr, value, bh, n_rows, rows, row_ok, cols, width):
    tl.store(ptr + bh.to(tl.int64) * n_rows * width + rows[:, None] * width + cols[None, :], value,
             mask=row_ok[:, None] & (cols[None, :] < width))


def pow2(n: int) -> int:
    """A tile width for n columns: tl.dot needs every dimension >= 16 and a power of two."""
    return max(16, triton.next_power_of_2(n))


@triton.jit
def query_tile(Tq, Tk, BLOCK_M: tl.constexpr):
    """A query-major program's (batch·head, rows, row_ok, t): grid (query tiles, B·H); the queries are the
    last Tq of the Tk keys, so row i is key position t_i = Tk - Tq + i."""
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    return bh, rows, rows < Tq, rows + (Tk - Tq)
