"""GRAPE-AP attention kernels (attention_kernels/grape_ap*.py) against an independent dense reference written
from the definition:

    logit(i, j) = scale·q_i·k_j + Σ_{ℓ=j+1}^{t_i} α_h logsigmoid(p_i·r_ℓ),   t_i = Tk - Tq + i, j <= t_i.

The reference sums over ℓ with an explicit 0/1 matrix [j < ℓ] and a 0/1 mask [ℓ <= t_i] (no
cumulative sums, no row-constant tricks), so it shares nothing with the kernels but the formula. Values and gradients
(q, k, v, p, r) are compared in fp64 (chunked path) and fp32/fp16 (Triton under TRITON_INTERPRET=1,
tiny shapes: the interpreter is slow)."""
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from attention_kernels import grape_ap_attention
from attention_kernels.grape_ap import grape_ap_chunked
from model import GPTConfig
from tests.helpers import (flash_attention_bf16, poisoned_allocations, run_under_triton_interpreter,
                           tiny_model_logits_and_grads)


def dense_bias(p, r, slopes):
    """bias(i, j) = Σ_ℓ ψ(i, ℓ)·[j < ℓ <= t_i] (B, H, Tq, Tk), -inf where j > t_i."""
    Tq, Tk = p.shape[2], r.shape[2]
    t = torch.arange(Tq) + (Tk - Tq)
    j = torch.arange(Tk)
    ell = torch.arange(Tk)
    psi = slopes.to(p.dtype)[:, None, None] * F.logsigmoid(p @ r.transpose(-1, -2))  # (B, H, Tq, Tk): ψ(i, ℓ)
    psi = psi * (ell[None, :] <= t[:, None]).to(psi.dtype)  # only ℓ <= t_i enters a bias
    edge_after_key = (j[None, :] < ell[:, None]).to(psi.dtype)  # (Tk ℓ, Tk j): [j < ℓ]
    return (psi @ edge_after_key).masked_fill(j[None, :] > t[:, None], float("-inf"))


def dense_grape_ap(q, k, v, p, r, slopes, scale):
    logits = scale * (q @ k.transpose(-1, -2)) + dense_bias(p, r, slopes)
    return torch.softmax(logits, dim=-1) @ v


def random_inputs(B, H, Tq, Tk, D, dp, *, dtype=torch.float64, seed=0, path_scale=3.0):
    """Inputs like the model's: p already divided by d_p (path_scale makes logsigmoid's argument span
    its linear and saturated parts), r RMS-normalised; slopes 4x ALiBi's so the bias matters."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, Tk, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, Tk, D, generator=g, dtype=torch.float64)
    p = path_scale * torch.randn(B, H, Tq, dp, generator=g, dtype=torch.float64)
    r = torch.randn(B, H, Tk, dp, generator=g, dtype=torch.float64)
    r = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True))
    slopes = torch.tensor([4 * 2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float64)
    return [x.to(dtype) for x in (q, k, v, p, r)], slopes


def values_and_grads(fn, inputs, slopes, scale, grad_out):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves, slopes, scale)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
    return out.detach(), [g.detach() for g in grads]


def assert_matches_reference(fn, inputs, slopes, scale, *, atol, rtol):
    """fn's output and its five gradients against the fp64 dense reference."""
    ref_inputs = [x.double() for x in inputs]
    grad_out = torch.randn(ref_inputs[2].shape[:2] + (inputs[0].shape[2], inputs[2].shape[3]),
                           generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref_out, ref_grads = values_and_grads(dense_grape_ap, ref_inputs, slopes.double(), scale, grad_out)
    out, grads = values_and_grads(fn, inputs, slopes.to(inputs[0].dtype), scale, grad_out)
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol, msg=lambda m: f"output: {m}")
    for name, g, ref in zip("qkvpr", grads, ref_grads):
        torch.testing.assert_close(g.double(), ref, atol=atol, rtol=rtol, msg=lambda m, name=name: f"d{name}: {m}")


def test_reference_agrees_with_a_python_double_loop():
    # The reference itself, checked once against the definition spelled out entry by entry.
    (q, k, v, p, r), slopes = random_inputs(1, 2, 3, 6, 4, 2)
    scale = 0.5
    out = dense_grape_ap(q, k, v, p, r, slopes, scale)
    Tq, Tk = 3, 6
    for h in range(2):
        for i in range(Tq):
            t = Tk - Tq + i
            logits = []
            for j in range(t + 1):
                bias = sum(slopes[h] * F.logsigmoid(p[0, h, i] @ r[0, h, ell]) for ell in range(j + 1, t + 1))
                logits.append(scale * q[0, h, i] @ k[0, h, j] + bias)
            weights = torch.softmax(torch.stack(logits), dim=0)
            torch.testing.assert_close(out[0, h, i], weights @ v[0, h, : t + 1])


# (B, H, Tq, Tk, block): T not multiples of the block, several blocks, a KV cache (Tq < Tk), one-token decode
CHUNKED_CASES = [(2, 3, 37, 37, 8), (1, 2, 19, 19, 64), (1, 2, 1, 1, 4), (1, 2, 5, 29, 2), (2, 1, 1, 23, 16),
                 (1, 2, 24, 24, 8)]


@pytest.mark.parametrize("B,H,Tq,Tk,block", CHUNKED_CASES)
def test_chunked_matches_dense_reference_fp64(B, H, Tq, Tk, block):
    inputs, slopes = random_inputs(B, H, Tq, Tk, 8, 4)
    fn = lambda *a: grape_ap_chunked(*a, block_size=block)  # noqa: E731
    assert_matches_reference(fn, inputs, slopes, 1 / math.sqrt(8), atol=1e-10, rtol=1e-8)


def test_chunked_fp32_and_default_block_size():
    inputs, slopes = random_inputs(2, 2, 45, 45, 16, 8, dtype=torch.float32)
    assert_matches_reference(grape_ap_attention, inputs, slopes, 0.25, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_under_bf16_autocast_computes_in_fp32(dtype):
    # The model runs attention under autocast with bf16 (GPU) or fp32 (CPU) q, k, v and fp32 path vectors.
    # The chunked path must compute in fp32 whatever autocast says: on the same (rounded) inputs it matches
    # the fp64 reference to fp32 accuracy, where bf16 arithmetic would be off by ~1e-2, and it returns
    # v's dtype with every gradient in its input's dtype.
    inputs, slopes = random_inputs(1, 2, 30, 30, 8, 4, dtype=torch.float32)
    inputs = [x.to(dtype) for x in inputs[:3]] + inputs[3:]
    grad_out = torch.randn(1, 2, 30, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref, ref_grads = values_and_grads(dense_grape_ap, [x.double() for x in inputs], slopes.double(), 0.3,
                                      grad_out)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, grads = values_and_grads(lambda *a: grape_ap_chunked(*a, block_size=8), inputs, slopes, 0.3, grad_out)
    assert out.dtype == dtype and all(g.dtype == x.dtype for g, x in zip(grads, inputs))
    fp32 = dict(atol=2e-5, rtol=1e-4)
    # bf16 inputs: the fp32 output is rounded to bf16 once (relative error <= 2^-9 per element), and the
    # backward's D = dO·O reads that rounded O, an error of one bf16 unit of the largest gradient
    torch.testing.assert_close(out.double(), ref, **(fp32 if dtype == torch.float32 else dict(atol=0, rtol=2 ** -8)))
    for name, g, r in zip("qkvpr", grads, ref_grads):
        tol = fp32 if dtype == torch.float32 else dict(atol=2 ** -7 * r.abs().max().item(), rtol=0)
        torch.testing.assert_close(g.double(), r, **tol, msg=lambda m, name=name: f"d{name}: {m}")


def test_large_path_logits_do_not_overflow():
    # |p·r| far beyond where sigmoid underflows in fp32: logsigmoid and its derivative must stay finite.
    inputs, slopes = random_inputs(1, 2, 20, 20, 8, 4, dtype=torch.float32, path_scale=100.0)
    assert_matches_reference(lambda *a: grape_ap_chunked(*a, block_size=8), inputs, slopes, 0.3, atol=1e-4, rtol=1e-4)


def test_gradient_of_first_key_path_vector_is_exactly_zero():
    # ψ(i, 0) never enters a bias (the sum starts at ℓ = j + 1), so r_0 gets no gradient at all.
    inputs, slopes = random_inputs(1, 2, 10, 10, 8, 4, dtype=torch.float32)
    _, grads = values_and_grads(lambda *a: grape_ap_chunked(*a, block_size=4), inputs, slopes, 0.3,
                                torch.randn(1, 2, 10, 8))
    assert torch.all(grads[4][:, :, 0] == 0)


def test_custom_op_registration_passes_opcheck():
    # torch.library.opcheck: the fake (shape-only) implementation matches the real one in shapes, dtypes
    # and strides, the schema is honest (no mutation, no aliasing), and autograd goes through the
    # registered backward op; what torch.compile relies on to trace the op without a graph break.
    from attention_kernels.grape_ap import _path_attention_op
    (q, k, v, p, r), slopes = random_inputs(1, 2, 11, 13, 8, 4, dtype=torch.float32)
    leaves = [x.requires_grad_(True) for x in (q, k.transpose(2, 3).contiguous().transpose(2, 3), v, p, r)]
    results = torch.library.opcheck(_path_attention_op, (*leaves, slopes, 0.3, "chunked", [4]), raise_exception=False)
    assert results and all(outcome == "SUCCESS" for outcome in results.values()), results


def triton_opcheck():
    """Child process: opcheck of the forward op on the Triton path (its fake promises the row log-sum-exp
    the Triton backward reads, (B, H, Tq), where the chunked path's is empty)."""
    from attention_kernels.grape_ap import _path_attention_op
    from attention_kernels.grape_ap_triton import default_config
    (q, k, v, p, r), slopes = random_inputs(1, 2, 11, 13, 8, 4, dtype=torch.float32)
    leaves = [x.requires_grad_(True) for x in (q, k, v, p, r)]
    config = list(default_config(8, torch.float32))
    return torch.library.opcheck(_path_attention_op, (*leaves, slopes, 0.3, "triton", config), raise_exception=False)


def test_the_triton_paths_custom_op_passes_opcheck(triton_results):
    assert triton_results["opcheck"] and all(outcome == "SUCCESS" for outcome in triton_results["opcheck"].values()), \
        triton_results["opcheck"]


def test_backward_op_passes_opcheck_on_views_of_a_batch_of_one():
    # The model's q, k, v are (B, H, T, D) views of a (B, T, H, D) tensor. With B = 1 a reshape keeps them
    # views, and gradients allocated "like" them came back with those strides while the fake
    # implementation promised contiguous ones: inductor then fails its stride assertion.
    from attention_kernels.grape_ap import _path_attention_backward_op
    (q, k, v, p, r), slopes = random_inputs(1, 2, 11, 11, 8, 4, dtype=torch.float32)
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    grad_out = torch.randn(1, 2, 11, 8)
    out = grape_ap_chunked(q, k, v, p, r, slopes, 0.3, block_size=4)
    args = (grad_out, q, k, v, p, r, slopes, out, torch.empty(0), 0.3, "chunked", [4])
    results = torch.library.opcheck(_path_attention_backward_op, args, raise_exception=False)
    assert results and all(outcome == "SUCCESS" for outcome in results.values()), results


def test_inductor_compiles_a_grape_ap_attention_layer(one_thread):
    # The default torch.compile backend (inductor) generates code that checks every custom op output's
    # strides against the fake implementation (aot_eager below does not). A GRAPE-AP attention layer, batch
    # of one, forward and backward, against eager: about 15 s of compilation on one CPU core.
    from model import CausalSelfAttention
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = CausalSelfAttention(GPTConfig(n_layer=1, n_head=2, n_embd=32, head_dim=16, vocab_size=29, block_size=24,
                                          pos="grape_ap"))
    x = torch.randn(1, 21, 32)
    positions = torch.arange(21)
    results = []
    for run in (layer, torch.compile(layer, fullgraph=True)):
        leaf = x.clone().requires_grad_(True)
        out = run(leaf, positions)
        out.pow(2).sum().backward()
        results.append((out.detach(), leaf.grad, layer.bias.path.weight.grad.clone()))
        layer.zero_grad()
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    assert results[1][2].abs().sum() > 0  # the path projection gets its gradient through the compiled backward


def test_compiled_model_is_one_graph_and_equals_eager():
    # fullgraph=True makes any graph break an error: dynamo must trace the whole model, GRAPE-AP attention
    # included (one custom-op node), and the compiled forward and backward must equal eager.
    # (The inductor backend gives the same result, max difference 2e-7, but compiles for minutes on 2 CPU
    # cores; aot_eager runs the same traced forward and backward graphs without code generation.)
    torch._dynamo.reset()
    eager_logits, eager_grads = tiny_model_logits_and_grads("rope+grape_ap", True, "auto")
    compiled_logits, compiled_grads = tiny_model_logits_and_grads(
        "rope+grape_ap", True, "auto", wrap=lambda m: torch.compile(m, fullgraph=True, backend="aot_eager"))
    torch.testing.assert_close(compiled_logits, eager_logits, atol=1e-6, rtol=1e-6)
    for name, ref in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], ref, atol=1e-6, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    # the gradients reach the path projection through the compiled backward
    assert compiled_grads["blocks.0.attn.bias.path.weight"].abs().sum() > 0


def test_bad_shapes_get_one_clear_error():
    (q, k, v, p, r), slopes = random_inputs(1, 2, 4, 4, 8, 4)
    with pytest.raises(ValueError, match="Tq .* must be <= Tk"):
        grape_ap_attention(q, k[:, :, :3], v[:, :, :3], p, r[:, :, :3], slopes, 0.3)
    with pytest.raises(ValueError, match="one slope per head"):
        grape_ap_attention(q, k, v, p, r, slopes[:1], 0.3)
    with pytest.raises(ValueError, match="4-D"):
        grape_ap_attention(q[0], k, v, p, r, slopes, 0.3)
    with pytest.raises(ValueError, match="unknown grape_ap backend"):
        grape_ap_attention(q, k, v, p, r, slopes, 0.3, backend="flash")
    with pytest.raises(ValueError, match=r"k\(1, 2, 4, 6\) must be \(B, H_kv, Tk, 8\)"):
        grape_ap_attention(q, k[..., :6], v, p, r, slopes, 0.3)
    with pytest.raises(ValueError, match="k\\(1, 3, 4, 8\\) has 3 heads, which must divide q's 2"):
        grape_ap_attention(q, k.new_zeros(1, 3, 4, 8), v, p, r, slopes, 0.3)
    with pytest.raises(ValueError, match="r\\(1, 2, 4, 3\\) must be \\(B, H_kv, Tk, dp\\)"):
        grape_ap_attention(q, k, v, p, r[..., :3], slopes, 0.3)
    for window in (0, -2, True, 2.0):
        with pytest.raises(ValueError, match=f"window \\({window!r}\\) must be a positive number of keys"):
            grape_ap_attention(q, k, v, p, r, slopes, 0.3, window=window)
    # a window as wide as the keys is full causal attention
    torch.testing.assert_close(grape_ap_attention(q, k, v, p, r, slopes, 0.3, window=4),
                               grape_ap_attention(q, k, v, p, r, slopes, 0.3), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------------
# Triton kernel under the interpreter (fp32 and fp16; bf16 tl.dot is wrong in the interpreter).
# TRITON_INTERPRET=1 must be set before triton itself is imported (its own library functions are
# decorated at import), so the kernels run in a child process that writes its outputs and gradients
# to a file; the comparison with the reference happens here.

# (B, H, Tq, Tk, D, (BLOCK_M, BLOCK_N) of the forward, query-major and key-major kernels, dtype, backward
# pass rows): T not multiples of the tiles, Tq < Tk, one-token decode, a head dim that is not a power of
# two, tiles of unequal sizes, key-major tiles 2x and 4x as wide as the query-major ones, backward passes
# over several row ranges (the last one short); fp16 q, k, v with fp32 path vectors
F16, F16_32 = ((16, 16),) * 3, ((16, 16), (16, 16), (16, 32))
TRITON_CASES = [(1, 2, 21, 21, 16, F16, "float32", 2048), (2, 1, 9, 40, 12, F16_32, "float32", 2048),
                (1, 1, 1, 19, 16, F16, "float32", 2048),
                (1, 2, 33, 33, 16, ((32, 16), (32, 16), (16, 32)), "float32", 2048),
                (1, 1, 20, 37, 16, ((16, 32), (16, 16), (32, 64)), "float32", 2048),
                (1, 2, 27, 27, 16, F16_32, "float16", 2048),
                (1, 2, 45, 50, 16, F16, "float32", 16), (2, 1, 40, 40, 16, ((16, 32), (32, 16), (16, 32)), "float16", 32)]
# fp16 at a length where rounding errors that accumulate over keys show (the bf16 GPU failure seen on the
# CPU), with GPU-sized tiles and 4 backward passes
LONG_FP16_CASE = (1, 2, 512, 512, 64, ((64, 64), (64, 32), (32, 64)), "float16", 128)


def triton_config(case):
    (fm, fn), (qm, qn), (km, kn) = case[5]
    return (fm, fn, 1, 1, qm, qn, 1, 1, km, kn, 1, 1, case[7])


def triton_case_inputs(case):
    B, H, Tq, Tk, D, _, dtype, _ = case
    (q, k, v, p, r), slopes = random_inputs(B, H, Tq, Tk, D, 8, dtype=torch.float32)
    low = getattr(torch, dtype)
    return [q.to(low), k.to(low), v.to(low), p, r], slopes.float()  # the model passes p, r in fp32


def run_triton_cases(path):
    """Child process (TRITON_INTERPRET=1): every case's kernel output and gradients, whole models whose
    GRAPE-AP attention is forced onto the Triton kernels, and the checks below, saved to path."""
    import attention
    from attention_kernels.grape_ap import grape_ap_attention, grape_ap_triton
    from attention_kernels.triton_probe import triton_builds
    results = {"cases": [], "models": []}
    with poisoned_allocations(float("nan")):  # every case with its scratch and outputs full of NaN first
        for case in TRITON_CASES + [LONG_FP16_CASE]:
            inputs, slopes = triton_case_inputs(case)
            fn = lambda *a, case=case: grape_ap_triton(*a, config=triton_config(case))  # noqa: E731
            results["cases"].append(values_and_grads(fn, inputs, slopes, 1 / math.sqrt(case[4]), triton_grad_out(case)))
    results["poisoned"] = {}
    for config, dtype, shape in poison_cases():
        inputs, slopes = poison_inputs(dtype, shape)
        for value in POISONS:
            with poisoned_allocations(value):
                results["poisoned"][config, str(value)] = values_and_grads(
                    lambda *a, config=config: grape_ap_triton(*a, config=config), inputs, slopes, 0.25,
                    poison_grad_out(shape))
    inputs, slopes = large_positive_z_inputs()
    results["large_positive_z"] = values_and_grads(lambda *a: grape_ap_triton(*a), inputs, slopes, 0.25,
                                                   large_positive_z_grad_out())
    inputs, slopes = bf16_case_inputs()
    results["bf16"] = values_and_grads(lambda *a: grape_ap_triton(*a, config=BF16_TILES), inputs, slopes,
                                       1 / math.sqrt(BF16_SHAPE[4]), bf16_grad_out())
    results["empty"] = [empty_case_results(grape_ap_triton, *shape) for shape in EMPTY_SHAPES]
    inputs, slopes = random_inputs(*LARGE_Z_SHAPE, dtype=torch.float32, path_scale=100.0, seed=3)
    with torch.no_grad():
        results["large_z"] = grape_ap_triton(*inputs, slopes.float(), 0.25, config=LARGE_Z_TILES)
    inputs, slopes = random_inputs(*DECODE_SHAPE, dtype=torch.float32)
    with torch.no_grad():
        results["decode_full_forward"] = grape_ap_triton(*inputs, slopes.float(), 0.3)
    results["boundary_index"] = boundary_index_under_interpreter(*BOUNDARY_INDEX_ARGS)
    results["bf16_emulation"] = bf16_cast_and_dot_under_interpreter()
    results["opcheck"] = triton_opcheck()
    results["builds"] = [triton_builds("grape_ap", "fp32", 16), triton_builds("grape_ap", "fp16", 12, 20),
                         triton_builds("separable", "fp16", 32)]
    # the model calls attention.grape_ap_attention; on CPU tensors "auto" would pick the chunked path
    attention.grape_ap_attention = lambda *a, **kw: grape_ap_attention(*a, **kw, backend="triton")
    for pos, kv_shift in MODEL_CASES:
        results["models"].append(tiny_model_logits_and_grads(pos, kv_shift, "auto"))
    torch.save(results, path)


# Every tile configuration default_config chooses (as on a GPU, and under the interpreter), and key-major query
# tiles taller than the query-major ones, whose rows left of a key tile never had a carry stored (they read NaN
# scratch, and 0 x NaN reached dr). Each with its scratch and outputs filled with NaN and with -inf first, over
# a ragged second backward pass (pass rows = the taller query tile) that reuses the first one's scratch.
POISONS = (float("nan"), float("-inf"))
TALLER_KEY_MAJOR_TILES = (16, 16, 1, 1, 16, 16, 1, 1, 32, 32, 1, 1, 2048)


def poison_cases():
    """(config, dtype, (B, H, Tq, Tk, D)) for every configuration the code chooses and one a user may pass."""
    from attention_kernels.grape_ap_triton import default_config
    chosen = {}
    for interpreter in (False, True):
        for head_dim in (64, 128):
            for dtype in (torch.float32, torch.bfloat16):  # half precision runs as fp16 under the interpreter
                chosen.setdefault(default_config(head_dim, dtype, interpreter=interpreter),
                                  "float32" if dtype == torch.float32 else "float16")
    chosen[TALLER_KEY_MAJOR_TILES] = "float32"
    cases = []
    for config, dtype in chosen.items():
        rows = max(config[4], config[8])
        # a cached prefix wider than every key tile: the rows that read a stored carry are counted from the
        # query's absolute position (row + Tk - Tq), not from its row alone
        prefix = max(config[1], config[5], config[9]) + 8
        cases.append((config[:12] + (rows,), dtype, (1, 2, rows + 10, rows + 10 + prefix, 16)))
    return cases


def poison_inputs(dtype, shape):
    (q, k, v, p, r), slopes = random_inputs(*shape, 8, dtype=torch.float32, seed=4)
    low = getattr(torch, dtype)
    return [q.to(low), k.to(low), v.to(low), p, r], slopes.float()


def poison_grad_out(shape):
    B, H, Tq, _, D = shape
    return torch.randn(B, H, Tq, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)


# fp16 with every path logit z = p·r >= 11: α·sigmoid(-z) (down to 1e-9 here) lies far below fp16's normal range,
# where hi + lo parts in fp16 lost the path gradients (dp off by 31% of its size, dr by 23%)
LARGE_POSITIVE_Z_SHAPE = (1, 2, 48, 48, 16, 8)


def large_positive_z_inputs():
    g = torch.Generator().manual_seed(6)
    B, H, T, _, D, dp = LARGE_POSITIVE_Z_SHAPE
    (q, k, v, _, _), slopes = random_inputs(B, H, T, T, D, dp, dtype=torch.float32, seed=6)
    r = 1 + 0.2 * torch.randn(B, H, T, dp, generator=g)
    r = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True))
    p = 1.9 + 0.3 * torch.randn(B, H, T, dp, generator=g)
    return [q.half(), k.half(), v.half(), p, r], slopes.float()


def large_positive_z_grad_out():
    B, H, T, _, D, _ = LARGE_POSITIVE_Z_SHAPE
    return torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


# bf16 with the GPU's rounding (attention_kernels/triton_common.py emulates it under the interpreter) and the GPU's tiles
BF16_SHAPE = (1, 2, 160, 160, 32, 8)
BF16_TILES = (64, 64, 1, 1, 128, 32, 1, 1, 32, 64, 1, 1, 2048)


def bf16_case_inputs():
    B, H, T, _, D, dp = BF16_SHAPE
    (q, k, v, p, r), slopes = random_inputs(B, H, T, T, D, dp, dtype=torch.float32, seed=8)
    q, k = (F.normalize(x, dim=-1) * math.sqrt(D) for x in (q, k))  # QK-normed, like the model's
    return [q.bfloat16(), k.bfloat16(), v.bfloat16(), p, r], slopes.float()


def bf16_grad_out():
    B, H, T, _, D, _ = BF16_SHAPE
    return torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(9), dtype=torch.float64)


# Tq = 0 (keys that no query sees yet) and an empty batch: (B, H, Tq, Tk)
EMPTY_SHAPES = [(1, 2, 0, 19), (0, 2, 5, 5)]


def empty_case_results(fn, B, H, Tq, Tk):
    (q, k, v, p, r), slopes = random_inputs(B, H, Tq, Tk, 16, 4, dtype=torch.float32)
    return values_and_grads(lambda *a: fn(*a), [q, k, v, p, r], slopes.float(), 0.25, torch.randn(B, H, Tq, 16))


# The fp32 forward on edges with large |z| (logsigmoid(z) ~ z down to -300): tiles of 64 keys, where the
# earlier carry + total - cumsum form lost accuracy in proportion to the tile width (3.7e-5 at 64 keys,
# 9.1e-6 at 16, measured at commit d9f9fd3 on these inputs; the triangular dots give 8.6e-7 at both)
LARGE_Z_SHAPE = (1, 2, 256, 256, 16, 8)
LARGE_Z_TILES = (64, 64, 1, 1, 64, 64, 1, 1, 64, 64, 1, 1, 2048)
DECODE_SHAPE = (1, 2, 37, 37, 16, 8)
# (batch·head, key tiles, key tile, pass rows, row) at B·H = 512, Tk = 128k in 32-key tiles:
# (511·4096 + 4095)·2048 + 2047 = 2³² - 1, past int32
BOUNDARY_INDEX_ARGS = (511, 4096, 4095, 2048, 2047)


def boundary_index_under_interpreter(bh, n_key_tiles, key_tile, pass_rows, pass_row):
    """The kernels' boundary-carry index for these int32 arguments, computed by the kernels' own helper."""
    global boundary_index  # a jitted kernel looks its helpers up among its module's globals
    import triton
    import triton.language as tl
    from attention_kernels.grape_ap_triton import boundary_index

    @triton.jit
    def kernel(OUT, ARGS):  # int32 operands, as the kernels' program id and launch arguments are
        tl.store(OUT, boundary_index(tl.load(ARGS), tl.load(ARGS + 1), tl.load(ARGS + 2), tl.load(ARGS + 3),
                                     tl.load(ARGS + 4)))
    out = torch.zeros(1, dtype=torch.int64)
    kernel[(1,)](out, torch.tensor([bh, n_key_tiles, key_tile, pass_rows, pass_row], dtype=torch.int32))
    return out.item()


def bf16_operands():
    """fp32 values with ties (exactly half a bf16 step between two bf16 numbers, both parities), values just off
    a tie, and random ones; and a bf16 matrix to multiply them by."""
    g = torch.Generator().manual_seed(11)
    base = torch.randn(16, 16, generator=g).bfloat16().float()
    # one bf16 unit in the last place: 8 significant bits, so 2^(exponent - 7); base + half of it is an exact
    # tie in fp32, which round to nearest even sends to whichever neighbour has an even last bit
    step = torch.exp2(torch.floor(torch.log2(base.abs())) - 7)
    x = torch.randn(16, 16, generator=g)
    x[:4] = base[:4] + step[:4] / 2  # ties
    x[4:8] = base[4:8] + step[4:8] * 0.51
    return x, torch.randn(16, 16, generator=g).bfloat16()


def bf16_cast_and_dot_under_interpreter():
    """(x.to(bf16), tl.dot(x.to(bf16), y)) as the interpreter computes them."""
    global _bf16_kernel
    import triton
    import triton.language as tl

    @triton.jit
    def _bf16_kernel(X, Y, CAST, DOT):
        a = tl.arange(0, 16)
        x = tl.load(X + a[:, None] * 16 + a[None, :]).to(tl.bfloat16)
        tl.store(CAST + a[:, None] * 16 + a[None, :], x)
        tl.store(DOT + a[:, None] * 16 + a[None, :], tl.dot(x, tl.load(Y + a[:, None] * 16 + a[None, :])))
    x, y = bf16_operands()
    cast, dot = torch.empty(16, 16, dtype=torch.bfloat16), torch.empty(16, 16)
    _bf16_kernel[(1,)](x, y, cast, dot)
    return cast, dot


MODEL_CASES = [("grape_ap", False), ("rope+grape_ap", True)]


def triton_grad_out(case):
    B, H, Tq, _, D, _, _, _ = case
    return torch.randn(B, H, Tq, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


@pytest.fixture(scope="module")
def triton_results(tmp_path_factory):
    return run_under_triton_interpreter(__file__, tmp_path_factory.mktemp("triton") / "results.pt")


@pytest.mark.parametrize("index", range(len(TRITON_CASES)), ids=[
    f"B{c[0]}H{c[1]}Tq{c[2]}Tk{c[3]}D{c[4]}tiles{'-'.join(f'{m}x{n}' for m, n in c[5])}-{c[6]}-pass{c[7]}"
    for c in TRITON_CASES])
def test_triton_interpreter_matches_dense_reference(triton_results, index):
    case = TRITON_CASES[index]
    inputs, slopes = triton_case_inputs(case)
    scale = 1 / math.sqrt(case[4])
    ref_out, ref_grads = values_and_grads(dense_grape_ap, [x.double() for x in inputs], slopes.double(), scale,
                                          triton_grad_out(case))
    out, grads = triton_results["cases"][index]
    tol = dict(atol=2e-5, rtol=1e-4) if case[6] == "float32" else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.double(), ref_out, **tol, msg=lambda m: f"output: {m}")
    for name, g, ref in zip("qkvpr", grads, ref_grads):
        assert g.dtype == inputs["qkvpr".index(name)].dtype
        torch.testing.assert_close(g.double(), ref, **tol, msg=lambda m, name=name: f"d{name}: {m}")


def test_triton_fp16_path_gradients_as_accurate_as_attention_gradients(triton_results):
    # The path gradients dp, dr sum the logits' gradient over every key left of each edge. Written as a
    # suffix that assumes the rows of dS sum to zero, fp16/bf16 rounding of P and O made their error grow
    # with T (dp 3.5e-2 relative at T = 512 against 7e-4 for dv); the left prefix keeps it below the level
    # of dq, dk, dv. Relative errors: max |error| / max |reference|, fp64 reference on the same inputs.
    case = LONG_FP16_CASE
    inputs, slopes = triton_case_inputs(case)
    ref_out, ref_grads = values_and_grads(dense_grape_ap, [x.double() for x in inputs], slopes.double(),
                                          1 / math.sqrt(case[4]), triton_grad_out(case))
    out, grads = triton_results["cases"][len(TRITON_CASES)]
    rel = {name: ((g.double() - ref).abs().max() / ref.abs().max()).item()
           for name, g, ref in zip("qkvpr", grads, ref_grads)}
    attention_worst = max(rel["q"], rel["k"], rel["v"])
    assert attention_worst < 2e-3, rel  # fp16's own level (unit roundoff 4.9e-4)
    # at most the attention gradients' error (measured 0.5x and 0.3x): the hi + lo operands of the path
    # gradients' products and of the in-tile sums hold them there (one fp16 part each: 1.8x)
    assert rel["p"] <= attention_worst and rel["r"] <= attention_worst, rel
    assert ((out.double() - ref_out).abs().max() / ref_out.abs().max()).item() < 1e-3


@pytest.mark.parametrize("index", range(len(poison_cases())), ids=[
    f"{'-'.join(map(str, c[:12]))}-{d}" for c, d, _ in poison_cases()])
def test_triton_tiles_read_no_unwritten_scratch(triton_results, index):
    # Requirement: every tile configuration the code chooses, and every one check_config accepts, gives the
    # reference's values and gradients whatever its scratch and output buffers held before (NaN, -inf).
    config, dtype, shape = poison_cases()[index]
    inputs, slopes = poison_inputs(dtype, shape)
    ref_out, ref_grads = values_and_grads(dense_grape_ap, [x.double() for x in inputs], slopes.double(), 0.25,
                                          poison_grad_out(shape))
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == "float32" else dict(atol=2e-2, rtol=2e-2)
    for value in POISONS:
        out, grads = triton_results["poisoned"][config, str(value)]
        torch.testing.assert_close(out.double(), ref_out, **tol, msg=lambda m, value=value: f"output ({value}): {m}")
        for name, g, ref in zip("qkvpr", grads, ref_grads):
            torch.testing.assert_close(g.double(), ref, **tol, msg=lambda m, n=name, value=value: f"d{n} ({value}): {m}")


@pytest.mark.parametrize("config, message", [
    ((16, 16, 1, 1, 16, 32, 1, 1, 32, 16, 1, 1, 64), "key tile \\(16\\) must be a multiple of the query-major kernel's \\(32\\)"),
    ((16, 16, 1, 1, 16, 16, 1, 1, 16, 48, 1, 1, 64), "tile 16x48 must be powers of two of at least 16"),
    ((16, 8, 1, 1, 16, 16, 1, 1, 16, 32, 1, 1, 64), "forward kernel's tile 16x8"),
    ((16, 16, 1, 1, 16, 16, 3, 1, 16, 32, 1, 1, 64), "3 warps"),
    ((16, 16, 1, 1, 16, 16, 1, 1, 16, 32, 1, 1, 0), "pass rows must be positive"),
    ((16, 16, 1, 1, 16, 16, 1, 1, 16, 32, 1, 1), "expected 13 integers")])
def test_triton_refuses_tile_configs_it_cannot_run(config, message):
    # A key-major key tile narrower than the query-major one made the carry ratio 0 (a division by zero in the
    # kernel); the others would fail inside the compiler. Refused before any launch, in one sentence.
    pytest.importorskip("triton")
    (q, k, v, p, r), slopes = random_inputs(1, 1, 20, 20, 16, 4, dtype=torch.float32)
    from attention_kernels.grape_ap import grape_ap_triton
    with pytest.raises(ValueError, match=message):
        grape_ap_triton(q, k, v, p, r, slopes, 0.25, config=config)


@pytest.mark.parametrize("version, key_stages", [((3, 4), 1), ((3, 5), 2), ((3, 6), 2), ((3, 7), 2), ((3, 8), 1),
                                                 ((3, 9), 1), ((4, 0), 1)])
def test_key_major_stages_follow_the_triton_version_at_head_dim_64(version, key_stages):
    # Compiled for sm_90, the key-major kernel at head dim 64 spills less and predicts fewer cycles in two pipeline
    # stages under Triton 3.5-3.7 (3.6: 320 B of stack and 0.443 cycles per element against 504 B and 0.476) and
    # in one under 3.8 and 3.9 (3.9: 336 B, 0.395 against 792 B, 0.631); versions not measured keep one. Nothing
    # else of the configuration changes, and head dim 128, fp32 and the interpreter's tiles never change.
    pytest.importorskip("triton")
    from attention_kernels.grape_ap_triton import default_config
    chosen = default_config(64, torch.bfloat16, interpreter=False, triton_version=version)
    reference = default_config(64, torch.bfloat16, interpreter=False, triton_version=(3, 9))
    assert chosen[11] == key_stages
    assert chosen[:11] + chosen[12:] == reference[:11] + reference[12:]
    assert default_config(64, torch.float16, interpreter=False, triton_version=version) == chosen
    for head_dim, dtype, interpreter in ((128, torch.bfloat16, False), (64, torch.float32, False),
                                         (64, torch.bfloat16, True)):
        assert default_config(head_dim, dtype, interpreter=interpreter, triton_version=version) == \
            default_config(head_dim, dtype, interpreter=interpreter, triton_version=(3, 9))


def relative_errors(grads, ref_grads):
    return {name: ((g.double() - ref).abs().max() / ref.abs().max()).item()
            for name, g, ref in zip("qkvpr", grads, ref_grads)}


def test_triton_fp16_path_gradients_survive_large_positive_path_logits(triton_results):
    # fp16, every z = p·r >= 11: the path gradients stay as accurate, relative to their size, as dq, dk, dv.
    inputs, slopes = large_positive_z_inputs()
    z = inputs[3] @ inputs[4].transpose(-1, -2)
    assert z.min() >= 11, z.min()  # the premise: α·sigmoid(-z) <= 4·2^-4·e^-11 < 6.1e-5, fp16's smallest normal
    ref_out, ref_grads = values_and_grads(dense_grape_ap, [x.double() for x in inputs], slopes.double(), 0.25,
                                          large_positive_z_grad_out())
    rel = relative_errors(triton_results["large_positive_z"][1], ref_grads)
    attention_worst = max(rel["q"], rel["k"], rel["v"])
    assert attention_worst < 2e-3, rel
    assert rel["p"] <= attention_worst and rel["r"] <= attention_worst, rel


def test_triton_bf16_as_accurate_as_flash_attention_in_bf16(triton_results):
    # bf16 with the GPU's rounding: output, dq, dk and dv within 1.25x the error of FlashAttention's own bf16
    # arithmetic (emulated on the same inputs and the exact bias: P, dS and every output rounded to bf16), the
    # path gradients within the attention gradients' relative error; errors as ‖kernel - fp64‖ / ‖fp64‖.
    # Measured: 0.79-1.00x the floor; with the interpreter's truncating bf16 casts 1.41-1.84x.
    inputs, slopes = bf16_case_inputs()
    scale = 1 / math.sqrt(BF16_SHAPE[4])
    double = [x.double() for x in inputs]
    ref_out, ref_grads = values_and_grads(dense_grape_ap, double, slopes.double(), scale, bf16_grad_out())
    floor = flash_attention_bf16(*inputs[:3], dense_bias(*double[3:], slopes.double()), scale, bf16_grad_out())
    out, grads = triton_results["bf16"]
    assert out.dtype == torch.bfloat16 and all(g.dtype == x.dtype for g, x in zip(grads, inputs))
    rel = {name: ((got.double() - ref).norm() / ref.norm()).item()
           for name, got, ref in zip(["out", "q", "k", "v", "p", "r"], [out] + grads, [ref_out] + ref_grads)}
    for name, emulated, ref in zip(["out", "q", "k", "v"], floor, [ref_out] + ref_grads[:3]):
        floor_error = ((emulated - ref).norm() / ref.norm()).item()
        assert rel[name] <= 1.25 * floor_error, (name, rel[name], floor_error)
    assert max(rel["p"], rel["r"]) <= max(rel["q"], rel["k"], rel["v"]), rel


@pytest.mark.parametrize("index", range(len(MODEL_CASES)), ids=[f"{p}{'+kv_shift' if kv else ''}" for p, kv in MODEL_CASES])
def test_triton_interpreter_in_the_model_matches_dense_backend(triton_results, index):
    pos, kv_shift = MODEL_CASES[index]
    logits, grads = triton_results["models"][index]
    ref_logits, ref_grads = tiny_model_logits_and_grads(pos, kv_shift, "dense")
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    for name, ref in ref_grads.items():
        torch.testing.assert_close(grads[name], ref, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    assert grads["blocks.0.attn.bias.path.weight"].abs().sum() > 0


def assert_empty_case(results, B, H, Tq, Tk):
    out, (dq, dk, dv, dp, dr) = results
    assert out.shape == (B, H, Tq, 16) and dq.shape == (B, H, Tq, 16) and dp.shape == (B, H, Tq, 4)
    for name, g in (("dk", dk), ("dv", dv), ("dr", dr)):  # no query: the keys get exactly zero gradients
        assert g.shape[:3] == (B, H, Tk) and torch.all(g == 0), name


@pytest.mark.parametrize("index", range(len(EMPTY_SHAPES)), ids=["Tq0", "B0"])
def test_triton_handles_no_queries_and_an_empty_batch(triton_results, index):
    # The backward divided by zero rows per pass at Tq = 0 and would leave dk, dv, dr uninitialised.
    assert_empty_case(triton_results["empty"][index], *EMPTY_SHAPES[index])


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=["Tq0", "B0"])
def test_chunked_handles_no_queries_and_an_empty_batch(shape):
    # The chunked forward reshaped its empty output with a -1 dimension, which fails on 0 elements.
    assert_empty_case(empty_case_results(grape_ap_chunked, *shape), *shape)


def test_triton_fp32_forward_accurate_on_large_path_logits(triton_results):
    # Requirement: fp32 output within 5e-6 of the fp64 reference, relative to its largest entry.
    inputs, slopes = random_inputs(*LARGE_Z_SHAPE, dtype=torch.float32, path_scale=100.0, seed=3)
    ref = dense_grape_ap(*[x.double() for x in inputs], slopes.double(), 0.25)
    error = ((triton_results["large_z"].double() - ref).abs().max() / ref.abs().max()).item()
    assert error <= 5e-6, error


def test_boundary_carry_index_is_64_bit(triton_results):
    bh, n_key_tiles, key_tile, pass_rows, pass_row = BOUNDARY_INDEX_ARGS
    assert triton_results["boundary_index"] == (bh * n_key_tiles + key_tile) * pass_rows + pass_row


def test_interpreter_rounds_and_multiplies_bf16_as_the_gpu_does(triton_results):
    # The interpreter truncated fp32 -> bf16 (the GPU rounds to nearest even) and multiplied bf16's raw bits in
    # tl.dot; attention_kernels/triton_common.py replaces both under TRITON_INTERPRET=1. torch's conversion rounds to
    # nearest even, and a product of bf16 values is exact in fp32.
    x, y = bf16_operands()
    cast, dot = triton_results["bf16_emulation"]
    assert torch.equal(cast.view(torch.int16), x.bfloat16().view(torch.int16))
    torch.testing.assert_close(dot, x.bfloat16().double().matmul(y.double()).float(), atol=1e-5, rtol=1e-6)


def test_probe_finds_that_the_interpreter_builds_both_kernel_families(triton_results):
    assert triton_results["builds"] == [True, True, True]


def test_decode_matches_the_full_forward_and_the_reference():
    # One new token against the whole cache (O(Tk)), against the chunked forward's last row and the fp64
    # reference; "auto" takes it for one query on every device.
    from attention_kernels.grape_ap import auto_backend, decode_attention
    (q, k, v, p, r), slopes = random_inputs(2, 3, 1, 41, 8, 4)
    ref = dense_grape_ap(q, k, v, p, r, slopes, 0.3)
    torch.testing.assert_close(decode_attention(q, k, v, p, r, slopes, 0.3), ref, atol=1e-12, rtol=1e-10)
    (q, k, v, p, r), slopes = random_inputs(2, 3, 41, 41, 8, 4, dtype=torch.float32)
    full = grape_ap_chunked(q, k, v, p, r, slopes, 0.3, block_size=8)
    last = decode_attention(q[:, :, -1:], k, v, p[:, :, -1:], r, slopes, 0.3)
    torch.testing.assert_close(last, full[:, :, -1:], atol=1e-6, rtol=1e-5)
    assert auto_backend(torch.device("cuda"), torch.bfloat16, 1, 64) == "decode"
    assert auto_backend(torch.device("cpu"), torch.float32, 1, 64) == "decode"


def test_decode_matches_the_triton_full_forward(triton_results):
    from attention_kernels.grape_ap import decode_attention
    (q, k, v, p, r), slopes = random_inputs(*DECODE_SHAPE, dtype=torch.float32)
    last = decode_attention(q[:, :, -1:], k, v, p[:, :, -1:], r, slopes.float(), 0.3)
    torch.testing.assert_close(last, triton_results["decode_full_forward"][:, :, -1:], atol=1e-6, rtol=1e-5)


def test_auto_falls_back_with_one_warning_when_triton_cannot_build(monkeypatch, capsys):
    from attention_kernels import triton_probe
    from attention_kernels.grape_ap import auto_backend

    def cannot_build(dtype, device, head_dim, value_dim):
        raise RuntimeError("PassManager::run failed\n(the rest of a long compiler message)")
    monkeypatch.setattr(triton_probe, "_BUILDS", {})
    monkeypatch.setitem(triton_probe.PROBES, "grape_ap", cannot_build)
    assert auto_backend(torch.device("cuda"), torch.bfloat16, 64, 64) == "chunked"
    assert auto_backend(torch.device("cuda"), torch.bfloat16, 64, 64) == "chunked"  # asked once per process
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cannot run the grape_ap attention kernel for bf16 at head dim 64" in lines[0], lines
    assert "PassManager::run failed" in lines[0] and "portable" in lines[0]
    monkeypatch.setitem(triton_probe.PROBES, "grape_ap", lambda dtype, device, head_dim, value_dim: None)
    assert auto_backend(torch.device("cuda"), torch.float16, 64, 64) == "triton"
    assert auto_backend(torch.device("cpu"), torch.float16, 64, 64) == "chunked"


def test_the_probe_is_asked_per_value_dim_too(monkeypatch, capsys):
    # a value head dim whose build does not fit must not reuse the answer given for another value dim
    from attention_kernels import triton_probe
    probed = []

    def launch(dtype, device, head_dim, value_dim):
        probed.append((head_dim, value_dim))
        if value_dim > 128:
            raise RuntimeError("out of resource: shared memory")
    monkeypatch.setattr(triton_probe, "_BUILDS", {})
    monkeypatch.setitem(triton_probe.PROBES, "grape_ap", launch)
    monkeypatch.setattr(triton_probe, "_version", lambda version: (99, 0))
    assert triton_probe.triton_builds("grape_ap", "bf16", 64, 64) is True
    assert triton_probe.triton_builds("grape_ap", "bf16", 64, 256) is False
    assert triton_probe.triton_builds("grape_ap", "bf16", 64) is True  # value dim = head dim, answered from cache
    assert probed == [(64, 64), (64, 256)]
    assert "at head dim 64 (values 256)" in capsys.readouterr().err


def test_auto_decides_per_head_dim_from_the_builds_shared_memory(monkeypatch, capsys):
    # The probe built head dim 64 only, so "auto" chose kernels that cannot launch at head dim 256 (the separable
    # forward needs 258 KiB of shared memory there, an H100/H200 block 227 KiB). Each (dtype, head dim) is probed
    # at its own size; a build beyond the GPU's limit (Triton's OutOfResources: the build's report against the
    # device's) sends that head dim to the portable path with one warning that says so.
    pytest.importorskip("triton")
    import attention
    from positional import build_bias
    from attention_kernels import triton_probe
    from attention_kernels.grape_ap import auto_backend

    class OutOfResources(Exception):  # what Triton raises at launch: required, limit, name
        def __init__(self, required, limit, name):
            super().__init__(f"out of resource: {name}, Required: {required}, Hardware limit: {limit}")
            self.required, self.limit, self.name = required, limit, name

    probed = []

    def launch(dtype, device, head_dim, value_dim):
        probed.append(head_dim)
        if head_dim > 128:
            raise OutOfResources(258 * 1024, 227 * 1024, "shared memory")
    monkeypatch.setattr(triton_probe, "_BUILDS", {})
    for family in ("grape_ap", "separable"):
        monkeypatch.setitem(triton_probe.PROBES, family, launch)
    monkeypatch.setattr(attention, "TRITON_AVAILABLE", True)
    cuda = torch.device("cuda")
    assert auto_backend(cuda, torch.bfloat16, 512, 64) == "triton"
    assert auto_backend(cuda, torch.bfloat16, 512, 256) == "chunked"
    assert auto_backend(cuda, torch.bfloat16, 512, 256) == "chunked"
    bias = build_bias("fox", n_head=2, head_dim=8, n_embd=8, grape_a_omega_init=1.0, fox_gate_bias_init=0.0,
                      p_head_dim=8)
    assert attention.resolve_backend("auto", bias, cuda, torch.bfloat16, 128) == "tile"
    assert attention.resolve_backend("auto", bias, cuda, torch.bfloat16, 256) == "lifted"
    assert probed == [64, 256, 128, 256]  # once per family and head dim
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    for family, line in zip(("grape_ap", "separable"), lines):
        assert (f"cannot run the {family} attention kernel for bf16 at head dim 256 (its build needs 258 KiB of "
                "shared memory per block, this GPU allows 227 KiB)") in line, line


def test_probe_does_not_try_a_triton_older_than_proven(monkeypatch, capsys):
    # Triton 3.0 and 3.1 abort the process compiling the key-major kernel: no exception the probe could catch.
    pytest.importorskip("triton")
    import triton
    from attention_kernels import triton_probe
    probed = []
    monkeypatch.setattr(triton_probe, "_BUILDS", {})
    monkeypatch.setitem(triton_probe.PROBES, "grape_ap", lambda dtype, *sizes: probed.append(dtype))
    monkeypatch.setattr(triton, "__version__", "3.1.0")
    assert triton_probe.triton_builds("grape_ap", "bf16", 64) is False and probed == []
    err = capsys.readouterr().err
    assert "triton 3.1.0 cannot run the grape_ap attention kernel" in err and "need triton >= 3.2" in err, err



def probe_on_cpu(monkeypatch, wrong=None):
    """triton_builds with the interpreter's device (CPU) and a stand-in "Triton" path: the portable one, made wrong
    by wrong(output) -> output where given, so that the numeric check is what decides. Returns the call log."""
    pytest.importorskip("triton")
    import attention_kernels.grape_ap as grape_ap
    import attention_kernels.triton_common as triton_common
    from attention_kernels import triton_probe
    calls, portable = [], grape_ap.grape_ap_attention

    def stand_in(*args, backend="auto", **kwargs):
        if backend != "triton":
            return portable(*args, backend=backend, **kwargs)
        calls.append(args[0].dtype)
        out = portable(*args, backend="chunked", **kwargs)
        return out if wrong is None else wrong(out)
    monkeypatch.setattr(grape_ap, "grape_ap_attention", stand_in)
    monkeypatch.setattr(triton_common, "INTERPRET", True)
    monkeypatch.setattr(triton_probe, "_BUILDS", {})
    monkeypatch.setattr(triton_probe, "_PROBE_SECONDS", {})
    monkeypatch.setattr(triton_probe, "_version", lambda version: (99, 0))
    return calls


class ScaleGradient(torch.autograd.Function):
    """Identity forward; the gradient scaled: a backward kernel that is wrong while its forward is right."""
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


@pytest.mark.parametrize("wrong, what", [
    (lambda out: out * 1.02, "output"),  # 2%: a lost bias term or a wrong scale is larger
    (lambda out: torch.cat([out[:, :, :1] * 0, out[:, :, 1:]], dim=2), "output"),  # one row lost (a mask's edge)
    (lambda out: ScaleGradient.apply(out, 1.05), "gradient"),
    (lambda out: out + float("nan") * (out[..., :1, :1] > 1e9), "non-finite"),  # a NaN only where no value is big
    (lambda out: torch.where(torch.arange(out.shape[2])[:, None] == 79, float("inf"), out), "non-finite"),
])
def test_a_kernel_that_builds_but_computes_wrong_never_trains(monkeypatch, capsys, wrong, what):
    from attention_kernels import triton_probe
    from attention_kernels.grape_ap import auto_backend
    calls = probe_on_cpu(monkeypatch, wrong)
    assert triton_probe.triton_builds("grape_ap", "bf16", 32) is False
    assert calls == [torch.bfloat16]  # the "kernel" ran, in bf16, and its answer was checked
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "the grape_ap attention kernel computes wrong" in lines[0] and "bf16 at head dim 32" in lines[0]
    assert what in lines[0] and "portable PyTorch path there for this process" in lines[0], lines[0]
    monkeypatch.setattr(triton_probe, "_version", lambda version: (99, 0))
    assert auto_backend(torch.device("cuda"), torch.bfloat16, 64, 32) == "chunked"  # the model's choice follows
    assert calls == [torch.bfloat16] and capsys.readouterr().err == ""  # asked once per process
    assert "grape_ap bf16 d32 portable path" in triton_probe.probe_summary()


@pytest.mark.parametrize("dtype_name, dtype", [("fp32", torch.float32), ("fp16", torch.float16),
                                               ("bf16", torch.bfloat16)])
def test_a_kernel_that_agrees_within_its_dtype_is_kept_and_its_check_is_timed(monkeypatch, capsys, dtype_name, dtype):
    from attention_kernels import triton_probe
    calls = probe_on_cpu(monkeypatch)
    assert triton_probe.triton_builds("grape_ap", dtype_name, 32) is True
    assert triton_probe.triton_builds("grape_ap", dtype_name, 32) is True
    assert calls == [dtype] and capsys.readouterr().err == ""
    summary = triton_probe.probe_summary()
    assert summary.startswith(f"grape_ap {dtype_name} d32 Triton, checked against the portable path in ")
    assert summary.endswith(" s") and float(summary.split(" in ")[1][:-2]) >= 0


def test_the_probes_tolerance_separates_a_kernels_rounding_from_an_error():
    """compare_with_portable on the portable path in bf16 itself (its rounding only) passes; the same with the
    softmax scale off by 2% fails, as does fp32's tolerance applied to bf16 rounding."""
    from attention_kernels import triton_probe
    from attention_kernels.triton_probe import KernelMismatch, compare_with_portable, separable_reference
    g = torch.Generator().manual_seed(0)
    T, D = 80, 32
    pos = torch.arange(T, dtype=torch.float32).expand(1, 2, T)
    qf = torch.stack([pos, torch.rand(1, 2, T, generator=g) * 0.05, -torch.rand(1, 2, T, generator=g).cumsum(-1)], -1)
    kf = torch.stack([pos[:, :1], torch.rand(1, 1, T, generator=g) * 0.05, qf[:, :1, :, 2]], -1)
    inputs = [torch.randn(1, 2, T, D, generator=g), torch.randn(1, 1, T, D, generator=g),
              torch.randn(1, 1, T, D, generator=g), qf, kf]
    grad = torch.randn(1, 2, T, D, generator=g)
    reference = lambda *x: separable_reference(*x, D ** -0.5)  # noqa: E731
    in_bf16 = lambda q, k, v, qf, kf: separable_reference(q.float(), k.float(), v.float(), qf, kf,  # noqa: E731
                                                          D ** -0.5).to(torch.bfloat16)
    compare_with_portable(in_bf16, reference, inputs, grad, torch.bfloat16)
    off = lambda q, k, v, qf, kf: separable_reference(q.float(), k.float(), v.float(), qf, kf, 1.02 * D ** -0.5)  # noqa: E731
    with pytest.raises(KernelMismatch, match="off the portable path's by"):
        compare_with_portable(off, reference, inputs, grad, torch.bfloat16)
    with pytest.raises(KernelMismatch):
        compare_with_portable(in_bf16, reference, inputs, grad, torch.float32)  # bf16 rounding is not fp32's
    assert triton_probe.PROBE_TOLERANCE[torch.float32] < triton_probe.PROBE_TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("pos", ["alibi", "fox", "grape_a_qk"])
def test_separable_reference_is_the_dense_backends_bias(pos):
    """The probe's written-out separable bias, fed the tile features of ALiBi, FoX and GRAPE-A, equals the model's
    dense attention with that bias (its own formula), so the probe compares kernels with the right thing."""
    from attention import attend
    from attention_kernels.triton_probe import separable_reference
    from positional import build_bias
    g = torch.Generator().manual_seed(1)
    H, T, D = 2, 20, 8
    torch.manual_seed(0)
    bias = build_bias(pos, n_head=H, head_dim=D, n_embd=H * D, grape_a_omega_init=1.0, fox_gate_bias_init=0.0,
                      p_head_dim=8)
    with torch.no_grad():
        for p in bias.parameters():
            p.add_(torch.randn(p.shape, generator=g))  # off the init, so that every term counts
    x = torch.randn(1, T, H * D, generator=g)
    q, k, v = (torch.randn(1, H, T, D, generator=g) for _ in range(3))
    positions = torch.arange(T)
    qf, kf = bias.features(x, q, k, positions, {})
    dense = attend(q, k, v, backend="dense", scale=D ** -0.5, q_pos=positions, k_pos=positions, bias=bias,
                   qf=qf, kf=kf)
    q_features, k_features = bias.tile_features(qf, kf)
    written = separable_reference(q, k, v, q_features.expand(1, H, T, 3), k_features.expand(1, -1, T, 3).float(),
                                  D ** -0.5)
    torch.testing.assert_close(written, dense, atol=1e-6, rtol=1e-5)

if __name__ == "__main__":
    run_triton_cases(sys.argv[1])
