"""What the Triton kernels share: tile loads and stores, tile ranges, the online softmax, the interpreter switch
(and, under the interpreter, the GPU's bf16 rounding)."""
from __future__ import annotations

import os
import re

import triton
import triton.language as tl

# TRITON_INTERPRET=1 runs the kernels on the CPU (the tests): read once, as triton itself does at import
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# (major, minor) of the installed Triton: some tile choices compile better under some versions
TRITON_VERSION = tuple(int(part) for part in re.findall(r"\d+", triton.__version__)[:2])


def emulate_gpu_bf16_in_interpreter() -> bool:
    """Make Triton's CPU interpreter treat bf16 as the GPU does, so that bf16 kernels can be tested on the CPU.

    The interpreter stores bf16 as raw 16-bit integers: its fp32 -> bf16 conversion truncates (the GPU's cvt.rn
    rounds to nearest even) and its tl.dot multiplies the integers themselves. Replaced here by round to nearest
    even and by a dot of the bf16 values widened to fp32 (a bf16 product is exact in fp32; the tensor cores
    accumulate in fp32). Conversions and dots without bf16 keep the interpreter's own code. Returns whether the
    interpreter was patched (False where this Triton's interpreter has another shape)."""
    import numpy as np
    try:
        from triton.runtime import interpreter
        builder = interpreter.InterpreterBuilder
        handle = interpreter.TensorHandle
        original_cast, original_dot = builder.cast_impl, builder.create_dot
    except (ImportError, AttributeError):
        return False
    if getattr(builder, "_gpu_bf16", False):
        return True

    def widen(data):  # bf16 bits -> fp32 values (exact)
        return (data.astype(np.uint32) << 16).view(np.float32)

    def round_to_bf16(values):  # fp32 -> bf16 bits, round to nearest even; NaN stays NaN
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)

    def cast_impl(self, src, dst_type):
        src_type, dst = src.dtype.scalar, dst_type.scalar
        if src_type == tl.bfloat16 and dst == tl.float32:
            return handle(widen(src.data), dst)
        if dst == tl.bfloat16 and src_type.is_floating() and src_type != tl.bfloat16:
            return handle(round_to_bf16(src.data.astype(np.float32)), dst)
        return original_cast(self, src, dst_type)

    def create_dot(self, a, b, d, *rest):
        if tl.bfloat16 not in (a.dtype.scalar, b.dtype.scalar):
            return original_dot(self, a, b, d, *rest)
        a_data, b_data = (widen(x.data) if x.dtype.scalar == tl.bfloat16 else x.data.astype(np.float32) for x in (a, b))
        return handle(np.matmul(a_data, b_data, dtype=np.float32) + d.data, d.dtype.scalar)

    builder.cast_impl, builder.create_dot, builder._gpu_bf16 = cast_impl, create_dot, True
    return True


if INTERPRET:
    emulate_gpu_bf16_in_interpreter()


@triton.jit
def _tile_pointers_and_mask(ptr, bh, n_rows, rows, row_ok, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """Pointers and mask of the (rows, BLOCK) tile of a contiguous (B·H, n_rows, WIDTH) tensor. The offset of
    the (batch·head) slice is a 64-bit scalar (B·H·T·D passes 2³¹ at e.g. B·H = 512, T = 32768, D = 128);
    the offsets within it stay 32-bit, one register per vector instead of two. WIDTH is a compile-time
    constant so that the compiler sees the row offsets and the column mask constant over 16-byte runs:
    with a run-time width a row's loads split into one per element."""
    cols = tl.arange(0, BLOCK)
    base = ptr + bh.to(tl.int64) * n_rows * WIDTH
    return base + (rows[:, None] * WIDTH + cols[None, :]), row_ok[:, None] & (cols[None, :] < WIDTH)


@triton.jit
def load_tile(ptr, bh, n_rows, rows, row_ok, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """The (rows, BLOCK) tile of a contiguous (B·H, n_rows, WIDTH) tensor, zeros outside it."""
    pointers, mask = _tile_pointers_and_mask(ptr, bh, n_rows, rows, row_ok, WIDTH, BLOCK)
    return tl.load(pointers, mask=mask, other=0.0)


@triton.jit
def store_tile(ptr, value, bh, n_rows, rows, row_ok, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    pointers, mask = _tile_pointers_and_mask(ptr, bh, n_rows, rows, row_ok, WIDTH, BLOCK)
    tl.store(pointers, value, mask=mask)


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


@triton.jit
def key_tile_range(first_row, Tq, Tk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For the query tile starting at row first_row: the key tiles [0, n_full) that all its rows see
    whole (no mask needed) and the end n_tiles of those any of them sees."""
    first_t = Tk - Tq + first_row
    return (first_t + 1) // BLOCK_N, tl.minimum(first_t + BLOCK_M - 1, Tk - 1) // BLOCK_N + 1


@triton.jit
def window_tile_range(first_row, Tq, Tk, window, n_full, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """With a sliding window (a query at t sees keys t - window + 1 ... t), for the query tile starting at row
    first_row: the first key tile lo any of its rows sees and the first key tile lo_full that all of them see
    whole on the window's side, clamped to [lo, n_full] (n_full from key_tile_range). Tiles left of lo are
    skipped; [lo, lo_full) need the window mask."""
    first_t = Tk - Tq + first_row
    last_t = tl.minimum(first_t + BLOCK_M - 1, Tk - 1)
    lo = tl.maximum(first_t - window + 1, 0) // BLOCK_N
    lo_full = tl.cdiv(tl.maximum(last_t - window + 1, 0), BLOCK_N)
    return lo, tl.minimum(tl.maximum(lo_full, lo), n_full)


@triton.jit
def online_softmax(acc, m_i, l_i, s, v, PRECISION: tl.constexpr, BASE2: tl.constexpr):
    """FlashAttention's running softmax over one key tile of logits s (natural units, or log2 units when
    BASE2): the new row maxima, row sums and output accumulator."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    if BASE2:
        alpha = tl.exp2(m_i - m_new)
        probs = tl.exp2(s - m_new[:, None])
    else:
        alpha = tl.exp(m_i - m_new)
        probs = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(probs, axis=1)
    acc = acc * alpha[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i
