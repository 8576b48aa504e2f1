"""The in-tile separable-bias kernel (attention_kernels/separable*.py, attn_backend="tile") against dense references.

Kernel level: the reference builds the logits scale·q·kᵀ - (t_i - s_j)(a_i + b_j) + (c_i - c_j) as a
(Tq, Tk) matrix in fp64 and takes gradients by autograd, sharing nothing with the kernel but the formula.
Model level: every separable encoding on attn_backend="tile" against attn_backend="dense" (the bias as
the paper writes it, positional.*.dense), logits and every parameter's gradient, and KV-cache decoding
(the cache stores key features; one decoding query takes the dense row) against the full forward.
The Triton kernels run under TRITON_INTERPRET=1 in a child process, in fp32, fp16 and bf16 (with the GPU's bf16
rounding, which attention_kernels/triton_common.py gives the interpreter)."""
import math
import sys

import pytest
import torch

from attention import resolve_backend
from model import GPT, GPTConfig
from positional import build_bias
from tests.helpers import flash_attention_bf16, run_under_triton_interpreter, tiny_model_logits_and_grads

SEPARABLE = ["alibi", "grape_a_q", "grape_a_k", "grape_a_qk", "fox"]


def dense_separable(q, k, v, qf, kf, scale, has_rate, has_sum):
    Tq, Tk = q.shape[2], k.shape[2]
    dist = qf[..., 0, None] - kf[..., None, :, 0]
    logits = scale * q @ k.transpose(-1, -2)
    if has_rate:
        logits = logits - dist * (qf[..., 1, None] + kf[..., None, :, 1])
    if has_sum:
        logits = logits + qf[..., 2, None] - kf[..., None, :, 2]
    t = torch.arange(Tq) + Tk - Tq
    logits = logits.masked_fill(torch.arange(Tk)[None, :] > t[:, None], float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


# (B, H, Tq, Tk, D, has_rate, has_sum, dtype, tiles (fwd M, N, bwd short, long)): lengths that are not
# multiples of the tiles, a KV cache (Tq < Tk), one-token decode, a head dim that is not a power of two,
# unequal tiles, each bias term alone and both, fp16 q, k, v
KERNEL_CASES = [(2, 2, 37, 37, 16, 1, 0, "float32", (16, 16, 16, 32)),
                (1, 2, 50, 50, 16, 0, 1, "float32", (32, 16, 16, 32)),
                (2, 1, 45, 45, 12, 1, 1, "float32", (16, 32, 16, 16)),
                (1, 2, 5, 41, 16, 1, 1, "float32", (16, 16, 16, 32)),
                (1, 1, 1, 23, 16, 1, 1, "float32", (16, 16, 16, 16)),
                (1, 2, 40, 40, 16, 1, 1, "float16", (16, 16, 16, 32))]
# fp16 FoX over 384 tokens with log-gates summing to ~-1000: the bias must keep fp32 accuracy in the tile
LONG_FP16_CASE = (1, 2, 384, 384, 64, 0, 1, "float16", (64, 64, 32, 64))
# bf16 with the GPU's rounding (attention_kernels/triton_common.py emulates it under the interpreter), both bias terms
BF16_CASE = (1, 2, 160, 160, 32, 1, 1, "bfloat16", (64, 64, 32, 64))


def kernel_case_inputs(case):
    B, H, Tq, Tk, D, has_rate, has_sum, dtype, _ = case
    g = torch.Generator().manual_seed(Tq * 7 + Tk)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for T in (Tq, Tk, Tk))
    pos = torch.arange(Tk, dtype=torch.float64) + 3  # absolute positions need not start at 0
    gate_sums = torch.log(torch.rand(B, H, Tk, generator=g, dtype=torch.float64) * 0.1 + 0.9).mul(30).cumsum(-1)
    kf = torch.stack((pos.expand(B, H, Tk), 0.2 * torch.rand(B, H, Tk, generator=g, dtype=torch.float64),
                      gate_sums), dim=-1)
    qf = torch.stack((pos[Tk - Tq:].expand(B, H, Tq), 0.2 * torch.rand(B, H, Tq, generator=g, dtype=torch.float64),
                      gate_sums[..., Tk - Tq:]), dim=-1)
    low = getattr(torch, dtype)
    return [q.to(low), k.to(low), v.to(low), qf.float(), kf.float()]


def kernel_grad_out(case):
    B, H, Tq, _, D = case[:5]
    return torch.randn(B, H, Tq, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def values_and_grads(fn, inputs, grad_out):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    return out.detach(), [g.detach() for g in torch.autograd.grad(out, leaves, grad_out.to(out.dtype))]


def reference(case):
    inputs = [x.double() for x in kernel_case_inputs(case)]
    scale = 1 / math.sqrt(case[4])
    return values_and_grads(lambda *a: dense_separable(*a, scale, case[5], case[6]), inputs, kernel_grad_out(case))


def kernel(case):
    from attention_kernels.separable import separable_attention
    fwd_m, fwd_n, short, long = case[8]
    config = (fwd_m, fwd_n, 1, 1, short, long, 1, 1)
    scale = 1 / math.sqrt(case[4])
    return values_and_grads(lambda *a: separable_attention(*a, scale, has_rate=bool(case[5]), has_sum=bool(case[6]),
                                                           config=config),
                            kernel_case_inputs(case), kernel_grad_out(case))


MODEL_CASES = [(pos, False) for pos in SEPARABLE] + [("rope+grape_a_qk", True), ("rope+fox", True)]
# Grouped keys and windows in the model (21 tokens; the interpreter's tiles are 16 keys wide, its key-major ones
# 32): a window of one tile, of a tile and a key, of 5 keys with one key head (multi-query)
GROUPED_WINDOW_CASES = [("fox", dict(n_head=4, n_kv_head=2, window=16)),
                        ("rope+grape_a_k", dict(n_head=4, n_kv_head=2, window=17)),
                        ("grape_a_qk", dict(n_head=4, n_kv_head=1, window=5))]
DECODE_GROUPED_WINDOW = dict(n_head=4, n_kv_head=2, window=6, global_every=2)


def decode_logits(pos, backend, **config):
    """Logits of a prefill of 9 tokens, a chunk of 4 and 5 single-token steps through the KV cache."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**dict(n_layer=2, n_head=2, n_embd=32, head_dim=16, vocab_size=29, block_size=32,
                                    pos=pos, attn_backend=backend), **config}))
    idx = torch.randint(0, 29, (2, 18), generator=torch.Generator().manual_seed(2))
    cache = model.new_cache(2, max_len=18)
    with torch.no_grad():
        pieces = [model(idx[:, :9], cache=cache)[0], model(idx[:, 9:13], cache=cache)[0]]
        pieces += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(13, 18)]
    return torch.cat(pieces, dim=1)


def autocast_logits(pos, backend):
    """fp16-autocast logits of a 2-layer model (the GPU runs bf16; the interpreter's bf16 dot is wrong)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, head_dim=16, vocab_size=29, block_size=64, pos=pos,
                          attn_backend=backend))
    idx = torch.randint(0, 29, (2, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16, enabled=backend != "dense"):
        return model(idx)[0].float()


AUTOCAST_CASES = ["fox", "grape_a_qk"]


def run_cases(path):
    """Child process (TRITON_INTERPRET=1): kernel cases, models on the tile backend, decoding, and one
    compiled model, saved to path."""
    results = {"kernel": [kernel(case) for case in KERNEL_CASES + [LONG_FP16_CASE, BF16_CASE]],
               "model": [tiny_model_logits_and_grads(pos, kv, "tile") for pos, kv in MODEL_CASES],
               "decode": [decode_logits(pos, "tile") for pos in SEPARABLE],
               "grouped_window": [tiny_model_logits_and_grads(pos, True, "tile", **config)
                                  for pos, config in GROUPED_WINDOW_CASES],
               "decode_grouped_window": decode_logits("grape_a_qk", "tile", **DECODE_GROUPED_WINDOW),
               "autocast": [autocast_logits(pos, "tile") for pos in AUTOCAST_CASES]}
    compiled = lambda m: torch.compile(m, fullgraph=True, backend="aot_eager")  # noqa: E731
    results["compiled"] = tiny_model_logits_and_grads("rope+grape_a_qk", True, "tile", wrap=compiled)
    torch.save(results, path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return run_under_triton_interpreter(__file__, tmp_path_factory.mktemp("separable") / "results.pt")


def assert_close_to_reference(out, grads, ref_out, ref_grads, tol):
    torch.testing.assert_close(out.double(), ref_out, **tol, msg=lambda m: f"output: {m}")
    for name, g, ref in zip(["q", "k", "v", "q features", "k features"], grads, ref_grads):
        if "features" in name:  # positions take no gradient; the rest is compared
            assert torch.all(g[..., 0] == 0)
            g, ref = g[..., 1:], ref[..., 1:]
        torch.testing.assert_close(g.double(), ref, **tol, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("index", range(len(KERNEL_CASES)), ids=[
    f"B{c[0]}H{c[1]}Tq{c[2]}Tk{c[3]}D{c[4]}-rate{c[5]}sum{c[6]}-{c[7]}" for c in KERNEL_CASES])
def test_kernel_matches_dense_reference(interpreted, index):
    case = KERNEL_CASES[index]
    out, grads = interpreted["kernel"][index]
    ref_out, ref_grads = reference(case)
    # fp16: inputs are exact in fp16, so the error is the kernel's rounding of P, dS and O (unit roundoff 4.9e-4)
    tol = dict(atol=2e-5, rtol=1e-4) if case[7] == "float32" else dict(atol=1e-2, rtol=1e-2)
    assert_close_to_reference(out, grads, ref_out, ref_grads, tol)
    for g, x in zip(grads, kernel_case_inputs(case)):
        assert g.dtype == x.dtype


def test_long_fp16_bias_keeps_fp32_accuracy(interpreted):
    # Running log-gate sums reach ~-1000 here; an fp16 bias would be off by whole logits (fp16 spacing at
    # 1000 is 0.5). Every relative error must stay at fp16's own level for q, k, v, and the gate-sum
    # gradients (sums of dS over rows/columns) within a few times that.
    out, grads = interpreted["kernel"][len(KERNEL_CASES)]
    ref_out, ref_grads = reference(LONG_FP16_CASE)
    assert ref_grads[4][..., 2].abs().max() > 0 and kernel_case_inputs(LONG_FP16_CASE)[4][..., 2].min() < -500
    rel = lambda a, b: ((a.double() - b).abs().max() / b.abs().max()).item()  # noqa: E731
    assert rel(out, ref_out) < 2e-3
    attention_worst = max(rel(g, r) for g, r in zip(grads[:3], ref_grads[:3]))
    assert attention_worst < 2e-3
    assert rel(grads[4][..., 2], ref_grads[4][..., 2]) <= 4 * attention_worst


def test_bf16_as_accurate_as_flash_attention_in_bf16(interpreted):
    # bf16 with the GPU's rounding: output, dq, dk, dv within 1.25x the error of FlashAttention's own bf16
    # arithmetic (emulated on the same inputs and the exact bias), errors as ‖kernel - fp64‖ / ‖fp64‖ (measured
    # 0.80-1.00x); the feature gradients within 2x the attention gradients' relative error, relative to the
    # larger feature gradient (the query side's running-sum gradient is a row sum of dS: zero up to rounding).
    out, grads = interpreted["kernel"][len(KERNEL_CASES) + 1]
    ref_out, ref_grads = reference(BF16_CASE)
    inputs = [x.double() for x in kernel_case_inputs(BF16_CASE)]
    qf, kf = inputs[3], inputs[4]
    Tq, Tk = BF16_CASE[2], BF16_CASE[3]
    bias = -(qf[..., 0, None] - kf[..., None, :, 0]) * (qf[..., 1, None] + kf[..., None, :, 1])
    bias = bias + qf[..., 2, None] - kf[..., None, :, 2]
    bias = bias.masked_fill(torch.arange(Tk)[None, :] > torch.arange(Tq)[:, None] + Tk - Tq, float("-inf"))
    floor = flash_attention_bf16(*kernel_case_inputs(BF16_CASE)[:3], bias, 1 / math.sqrt(BF16_CASE[4]),
                                 kernel_grad_out(BF16_CASE))
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    for name, got, emulated, ref in zip(["out", "dq", "dk", "dv"], [out] + grads[:3], floor, [ref_out] + ref_grads[:3]):
        assert rel(got, ref) <= 1.25 * rel(emulated, ref), (name, rel(got, ref), rel(emulated, ref))
    attention_worst = max(rel(g, r) for g, r in zip(grads[:3], ref_grads[:3]))
    size = max(ref_grads[3][..., 1:].norm(), ref_grads[4][..., 1:].norm())
    for name, g, r in (("q features", grads[3], ref_grads[3]), ("k features", grads[4], ref_grads[4])):
        error = ((g[..., 1:].double() - r[..., 1:]).norm() / size).item()
        assert error <= 2 * attention_worst, (name, error, attention_worst)


@pytest.mark.parametrize("index", range(len(MODEL_CASES)), ids=[f"{p}{'+kv_shift' if kv else ''}" for p, kv in MODEL_CASES])
def test_tile_backend_in_the_model_matches_dense_backend(interpreted, index):
    pos, kv_shift = MODEL_CASES[index]
    logits, grads = interpreted["model"][index]
    ref_logits, ref_grads = tiny_model_logits_and_grads(pos, kv_shift, "dense")
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    for name, ref in ref_grads.items():
        torch.testing.assert_close(grads[name], ref, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    # the positional parameters learn through the kernel's feature gradients
    assert all(grads[name].abs().sum() > 0 for name in grads if ".bias." in name)


@pytest.mark.parametrize("index", range(len(GROUPED_WINDOW_CASES)),
                         ids=[f"{pos}-{c['n_kv_head']}kv-window{c['window']}" for pos, c in GROUPED_WINDOW_CASES])
def test_tile_backend_with_grouped_keys_and_a_window_matches_dense_backend(interpreted, index):
    pos, config = GROUPED_WINDOW_CASES[index]
    logits, grads = interpreted["grouped_window"][index]
    ref_logits, ref_grads = tiny_model_logits_and_grads(pos, True, "dense", **config)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    for name, ref in ref_grads.items():
        torch.testing.assert_close(grads[name], ref, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


def test_tile_backend_decoding_with_grouped_keys_and_a_window_matches_dense_full_forward(interpreted):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_embd=32, head_dim=16, vocab_size=29, block_size=32, pos="grape_a_qk",
                          attn_backend="dense", **DECODE_GROUPED_WINDOW))
    idx = torch.randint(0, 29, (2, 18), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)[0]
    torch.testing.assert_close(interpreted["decode_grouped_window"], full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("index", range(len(SEPARABLE)), ids=SEPARABLE)
def test_tile_backend_kv_cache_decoding_matches_dense_full_forward(interpreted, index):
    pos = SEPARABLE[index]
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, head_dim=16, vocab_size=29, block_size=32, pos=pos,
                          attn_backend="dense"))
    idx = torch.randint(0, 29, (2, 18), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)[0]
    torch.testing.assert_close(interpreted["decode"][index], full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("index", range(len(AUTOCAST_CASES)), ids=AUTOCAST_CASES)
def test_tile_backend_under_half_precision_autocast(interpreted, index):
    # Under autocast q, k, v reach the kernel in half precision (the positional features stay fp32): the
    # logits must match the fp32 dense model to half-precision accuracy, not be off by the bias's rounding.
    # Measured: 1.6e-3 (fox) and 2.0e-3 (grape_a_qk) of the largest logit; FoX's running sums rounded to
    # fp16 inside the kernel give 1.2e-2.
    logits = interpreted["autocast"][index]
    reference = autocast_logits(AUTOCAST_CASES[index], "dense")
    assert (logits - reference).abs().max() < 5e-3 * reference.abs().max()


def test_compiled_tile_model_is_one_graph_and_equals_dense(interpreted):
    logits, grads = interpreted["compiled"]
    ref_logits, ref_grads = tiny_model_logits_and_grads("rope+grape_a_qk", True, "dense")
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    for name, ref in ref_grads.items():
        torch.testing.assert_close(grads[name], ref, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


def test_backend_choice_by_device_and_dtype(monkeypatch):
    import attention
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(attention, "TRITON_AVAILABLE", True)
    builds = {"separable": True}  # what the installed Triton could build (probed on a GPU on first use)
    monkeypatch.setattr(attention, "triton_builds", lambda family, dtype_name, head_dim: builds[family])
    bias = build_bias("fox", n_head=2, head_dim=8, n_embd=8, grape_a_omega_init=1.0, fox_gate_bias_init=0.0,
                      p_head_dim=8)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # (only the device type is read)
    assert resolve_backend("auto", bias, cpu, torch.bfloat16) == "lifted"
    assert resolve_backend("auto", bias, cuda, torch.bfloat16) == "tile"
    assert resolve_backend("auto", bias, cuda, torch.float16) == "tile"
    assert resolve_backend("auto", bias, cuda, torch.float32) == "lifted"  # the kernel is built for half precision
    assert resolve_backend("lifted", bias, cuda, torch.bfloat16) == "lifted"
    assert resolve_backend("auto", None, cuda, torch.bfloat16) == "sdpa"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_backend("tile", bias, cpu, torch.float32)
    builds["separable"] = False  # a Triton that cannot build the kernel: auto lifts
    assert resolve_backend("auto", bias, cuda, torch.bfloat16) == "lifted"
    monkeypatch.setattr(attention, "TRITON_AVAILABLE", False)
    assert resolve_backend("auto", bias, cuda, torch.bfloat16) == "lifted"
    with pytest.raises(ValueError, match="triton is not installed"):
        resolve_backend("tile", bias, cuda, torch.bfloat16)
    with pytest.raises(ValueError, match="unknown attn_backend 'flash'.*auto, lifted, tile, dense"):
        GPTConfig(attn_backend="flash")


def test_a_layer_asks_about_its_own_head_dim(monkeypatch):
    # a kernel that builds at head dim 64 says nothing about a model whose heads are 32 or 128 wide
    import attention
    from model import GPT
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(attention, "TRITON_AVAILABLE", True)
    asked = []
    monkeypatch.setattr(attention, "triton_builds",
                        lambda family, dtype_name, head_dim: asked.append(head_dim) or head_dim == 64)
    for head_dim, backend in ((32, "lifted"), (64, "tile"), (128, "lifted")):
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=64, head_dim=head_dim, vocab_size=64, block_size=16,
                              pos="alibi"))
        assert model.blocks[0].attn.backend(torch.device("cuda"), torch.bfloat16) == backend
    assert asked == [32, 64, 128]


if __name__ == "__main__":
    run_cases(sys.argv[1])
