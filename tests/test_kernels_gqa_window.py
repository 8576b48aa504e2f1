"""Grouped-query attention and a sliding window in the attention kernels (attention_kernels/grape_ap*.py,
attention_kernels/separable*.py) against dense fp64 references written here from the definitions:

    GRAPE-AP:  logit_h(i, j) = scale·q_h,i·k_j + Σ_{ℓ=j+1}^{t_i} α_h·logsigmoid(p_h,i·r_ℓ)
    separable: logit_h(i, j) = scale·q_h,i·k_j - (t_i - s_j)(a_h,i + b_j) + (c_h,i - c_j)

with the keys (k, v, r, and the key features where they belong to the key head) repeated for each query head of
their group (query head h reads key head h // G, G = H / H_kv) and the logits of keys outside t_i - window + 1 ...
t_i set to -inf. The GRAPE-AP reference builds the double sum with explicit 0/1 matrices and is itself checked
against a Python loop over (i, j, ℓ). Values and the gradients of every input are compared: the chunked path and
the decode row in fp64 here, the Triton kernels under TRITON_INTERPRET=1 in a child process in fp32 and fp16 with
every scratch and output buffer filled with NaN first (a kernel that reads memory no program wrote fails)."""
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from attention_kernels.grape_ap import decode_attention, grape_ap_attention, grape_ap_chunked
from tests.helpers import poisoned_allocations, run_under_triton_interpreter


def hidden_keys(Tq, Tk, window):
    """(Tq, Tk) True where query i (at key position t_i = Tk - Tq + i) may not attend key j."""
    t = torch.arange(Tq)[:, None] + (Tk - Tq)
    j = torch.arange(Tk)[None, :]
    hidden = j > t
    return hidden if window is None else hidden | (j < t - window + 1)


def per_query_head(x, n_heads):
    """Key-side (B, H_kv, T, d) repeated for each query head of its group: (B, H, T, d)."""
    return x.repeat_interleave(n_heads // x.shape[1], dim=1)


def dense_grape_ap(q, k, v, p, r, slopes, scale, window=None):
    H, Tq, Tk = q.shape[1], q.shape[2], k.shape[2]
    k, v, r = (per_query_head(x, H) for x in (k, v, r))
    t = torch.arange(Tq)[:, None] + (Tk - Tq)
    ell = torch.arange(Tk)
    psi = slopes[:, None, None] * F.logsigmoid(p @ r.transpose(-1, -2))  # (B, H, Tq, Tk ℓ): ψ(i, ℓ)
    psi = psi * (ell[None, :] <= t).to(psi.dtype)  # only ℓ <= t_i enters a bias
    edge_after_key = (ell[None, :] < ell[:, None]).to(psi.dtype)  # (Tk ℓ, Tk j): [j < ℓ]
    logits = scale * q @ k.transpose(-1, -2) + psi @ edge_after_key
    return torch.softmax(logits.masked_fill(hidden_keys(Tq, Tk, window), float("-inf")), -1) @ v


def dense_separable(q, k, v, qf, kf, scale, window=None):
    H = q.shape[1]
    k, v, kf = (per_query_head(x, H) for x in (k, v, kf))
    dist = qf[..., 0, None] - kf[..., None, :, 0]
    logits = scale * q @ k.transpose(-1, -2) - dist * (qf[..., 1, None] + kf[..., None, :, 1])
    logits = logits + qf[..., 2, None] - kf[..., None, :, 2]
    return torch.softmax(logits.masked_fill(hidden_keys(q.shape[2], k.shape[2], window), float("-inf")), -1) @ v


def grape_ap_inputs(B, H, Hkv, Tq, Tk, D, dp=8, *, dtype=torch.float64, seed=0):
    """Like the model's: p divided by d_p at a scale where logsigmoid spans its linear and saturated parts, r
    RMS-normalised, slopes 4x ALiBi's so the bias matters."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64) for _ in range(2))
    p = 3 * torch.randn(B, H, Tq, dp, generator=g, dtype=torch.float64)
    r = torch.randn(B, Hkv, Tk, dp, generator=g, dtype=torch.float64)
    r = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True))
    slopes = torch.tensor([4 * 2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float64)
    return [x.to(dtype) for x in (q, k, v)] + [p.to(dtype), r.to(dtype)], slopes


def separable_inputs(B, H, Hkv, Hf, Tq, Tk, D, *, dtype=torch.float64, seed=0, decay=1.0):
    """q, k, v and the (position, rate, running sum) features: positions from 3, running sums of log-gates
    (FoX-like, reaching about -1.5·Tk, times decay), key features with Hf heads (H_kv: the shared key head's; H:
    each query head's)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64) for _ in range(2))
    pos = torch.arange(Tk, dtype=torch.float64) + 3
    sums = decay * torch.log(torch.rand(B, Hf, Tk, generator=g, dtype=torch.float64) * 0.5 + 0.3).cumsum(-1)
    rates = decay * 0.2 * torch.rand(B, Hf, Tk, generator=g, dtype=torch.float64)
    kf = torch.stack((pos.expand(B, Hf, Tk), rates, sums), -1)
    qf = torch.stack((pos[Tk - Tq:].expand(B, H, Tq), 0.2 * torch.rand(B, H, Tq, generator=g, dtype=torch.float64),
                      torch.randn(B, H, Tq, generator=g, dtype=torch.float64)), -1)
    return [x.to(dtype) for x in (q, k, v)] + [qf.float(), kf.float()]


def values_and_grads(fn, inputs, grad_out):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    return out.detach(), [g.detach() for g in torch.autograd.grad(out, leaves, grad_out.to(out.dtype))]


def grad_out_for(B, H, Tq, D, seed=1):
    return torch.randn(B, H, Tq, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def assert_matches(got, ref, names, tol):
    (out, grads), (ref_out, ref_grads) = got, ref
    torch.testing.assert_close(out.double(), ref_out, **tol, msg=lambda m: f"output: {m}")
    for name, g, r in zip(names, grads, ref_grads):
        torch.testing.assert_close(g.double(), r, **tol, msg=lambda m, name=name: f"d{name}: {m}")


def test_reference_is_the_double_sum_with_groups_and_a_window():
    # The GRAPE-AP reference against the definition entry by entry: query head h of 3 reads key head 0 (multi-query),
    # keys t - 2 ... t, the path sum from key j + 1 to t.
    (q, k, v, p, r), slopes = grape_ap_inputs(1, 3, 1, 4, 7, 4, 2)
    window, scale = 3, 0.5
    out = dense_grape_ap(q, k, v, p, r, slopes, scale, window)
    for h in range(3):
        for i in range(4):
            t = 3 + i
            keys = range(max(0, t - window + 1), t + 1)
            logits = torch.stack([scale * q[0, h, i] @ k[0, 0, j] + sum(
                slopes[h] * F.logsigmoid(p[0, h, i] @ r[0, 0, ell]) for ell in range(j + 1, t + 1)) for j in keys])
            torch.testing.assert_close(out[0, h, i], torch.softmax(logits, 0) @ v[0, 0, list(keys)])


# (B, H, H_kv, Tq, Tk, window, block): grouped alone (2 per group; multi-query), a window alone (narrower than a
# block, one key, as wide as the keys, wider), both, queries at the end of a longer cache (prefill)
CHUNKED_CASES = [(2, 4, 2, 19, 19, None, 8), (1, 3, 1, 11, 23, None, 4), (1, 2, 2, 29, 29, 5, 8),
                 (1, 2, 2, 13, 13, 1, 4), (1, 2, 2, 17, 17, 17, 8), (1, 2, 2, 17, 17, 40, 8),
                 (2, 4, 2, 21, 30, 9, 8), (1, 4, 1, 16, 16, 6, 16)]


@pytest.mark.parametrize("B,H,Hkv,Tq,Tk,window,block", CHUNKED_CASES)
def test_chunked_matches_dense_reference_fp64(B, H, Hkv, Tq, Tk, window, block):
    inputs, slopes = grape_ap_inputs(B, H, Hkv, Tq, Tk, 8)
    grad_out = grad_out_for(B, H, Tq, 8)
    got = values_and_grads(lambda *a: grape_ap_chunked(*a, slopes, 0.3, block_size=block, window=window), inputs,
                           grad_out)
    ref = values_and_grads(lambda *a: dense_grape_ap(*a, slopes, 0.3, window), inputs, grad_out)
    assert_matches(got, ref, "qkvpr", dict(atol=1e-10, rtol=1e-8))


def test_chunked_window_at_least_the_keys_equals_full_attention():
    inputs, slopes = grape_ap_inputs(1, 4, 2, 20, 26, 8)
    grad_out = grad_out_for(1, 4, 20, 8)
    full = values_and_grads(lambda *a: grape_ap_chunked(*a, slopes, 0.3, block_size=8), inputs, grad_out)
    for window in (26, 1000):
        assert_matches(values_and_grads(lambda *a: grape_ap_chunked(*a, slopes, 0.3, block_size=8, window=window),
                                        inputs, grad_out), full, "qkvpr", dict(atol=1e-12, rtol=1e-12))


def test_grouped_equals_heads_with_copied_keys_and_sums_their_key_gradients():
    # A second code path: the multi-head kernel on k, v, r copied per query head gives the same output, and the
    # grouped kernel's dk, dv, dr are the sums of the copies' gradients over each group.
    inputs, slopes = grape_ap_inputs(2, 6, 2, 15, 15, 8)
    grad_out = grad_out_for(2, 6, 15, 8)
    out, grads = values_and_grads(lambda *a: grape_ap_chunked(*a, slopes, 0.3, block_size=4, window=7), inputs,
                                  grad_out)
    copied = inputs[:1] + [per_query_head(x, 6) for x in inputs[1:3]] + [inputs[3], per_query_head(inputs[4], 6)]
    mha_out, mha_grads = values_and_grads(lambda *a: grape_ap_chunked(*a, slopes, 0.3, block_size=4, window=7),
                                          copied, grad_out)
    torch.testing.assert_close(out, mha_out, atol=1e-12, rtol=1e-12)
    for name, g, mha in zip("qkvpr", grads, mha_grads):
        if name in "kvr":
            mha = mha.view(2, 2, 3, *mha.shape[2:]).sum(2)
        torch.testing.assert_close(g, mha, atol=1e-12, rtol=1e-10, msg=lambda m, name=name: f"d{name}: {m}")


def test_one_key_window_takes_no_path_gradient():
    # window = 1: each query sees its own key, whose bias is an empty path sum: out = v of that key, and no ψ is in
    # any bias, so p and r get exactly zero gradient.
    inputs, slopes = grape_ap_inputs(1, 4, 2, 12, 12, 8)
    out, grads = values_and_grads(lambda *a: grape_ap_chunked(*a, slopes, 0.3, block_size=4, window=1), inputs,
                                  grad_out_for(1, 4, 12, 8))
    torch.testing.assert_close(out, per_query_head(inputs[2], 4), atol=1e-12, rtol=0)
    assert torch.all(grads[3] == 0) and torch.all(grads[4] == 0)


@pytest.mark.parametrize("window", [None, 1, 6, 100])
def test_decode_row_with_groups_and_a_window(window):
    # One new token against the cache (the last query of the full forward), multi-query and grouped.
    for H, Hkv in ((4, 1), (6, 3)):
        (q, k, v, p, r), slopes = grape_ap_inputs(2, H, Hkv, 1, 25, 8)
        row = decode_attention(q, k, v, p, r, slopes, 0.3, window=window)
        torch.testing.assert_close(row, dense_grape_ap(q, k, v, p, r, slopes, 0.3, window), atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(grape_ap_attention(q, k, v, p, r, slopes, 0.3, window=window), row)  # "auto"


def test_custom_ops_pass_opcheck_with_groups_and_a_window():
    # The fake (shape-only) implementations give the grouped shapes (dk, dv, dr with the key heads) and the window
    # travels as an int argument: what torch.compile traces.
    from attention_kernels.grape_ap import _path_attention_backward_op, _path_attention_op
    (q, k, v, p, r), slopes = grape_ap_inputs(1, 4, 2, 9, 13, 8, dtype=torch.float32)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, p, r)]
    results = torch.library.opcheck(_path_attention_op, (*leaves, slopes, 0.3, "chunked", [4], 5),
                                    raise_exception=False)
    assert results and all(outcome == "SUCCESS" for outcome in results.values()), results
    out = grape_ap_chunked(q, k, v, p, r, slopes, 0.3, block_size=4, window=5)
    args = (torch.randn(out.shape), q, k, v, p, r, slopes, out, torch.empty(0), 0.3, "chunked", [4], 5)
    results = torch.library.opcheck(_path_attention_backward_op, args, raise_exception=False)
    assert results and all(outcome == "SUCCESS" for outcome in results.values()), results


def test_bad_groups_and_windows_get_one_clear_error():
    (q, k, v, p, r), slopes = grape_ap_inputs(1, 4, 3, 5, 5, 8)
    with pytest.raises(ValueError, match="3 heads, which must divide q's 4"):
        grape_ap_attention(q, k, v, p, r, slopes, 0.3)
    (q, k, v, p, r), slopes = grape_ap_inputs(1, 4, 2, 5, 5, 8)
    with pytest.raises(ValueError, match=r"r\(1, 4, 5, 8\) must be \(B, H_kv, Tk, dp\)"):
        grape_ap_attention(q, k, v, p, per_query_head(r, 4), slopes, 0.3)
    for window in (0, -3, 2.5):
        with pytest.raises(ValueError, match="window .* must be a positive number of keys"):
            grape_ap_attention(q, k, v, p, r, slopes, 0.3, window=window)
    from attention_kernels.separable import separable_attention
    q, k, v, qf, kf = separable_inputs(1, 4, 2, 3, 5, 5, 16)
    with pytest.raises(ValueError, match="must have 1, 2 \\(the key heads\\) or 4 \\(the query heads\\) heads"):
        separable_attention(q, k, v, qf, kf, 0.3, has_rate=True, has_sum=True)



def test_every_shape_mistake_is_named_with_the_shapes_it_was_checked_against():
    """One ValueError lists each wrong tensor with its shape and the shape it must agree with."""
    from attention_kernels.grape_ap import check_inputs
    (q, k, v, p, r), slopes = grape_ap_inputs(1, 4, 2, 5, 7, 8)
    check_inputs(q, k, v, p, r, slopes)  # the right shapes pass
    with pytest.raises(ValueError) as error:
        check_inputs(q, k, v[:, :, :6], p[:, :3], r, slopes[:3], window=3)
    assert str(error.value) == (
        "grape_ap_attention: v(1, 2, 6, 8) must be (B, H_kv, Tk, Dv) with the B, H_kv, Tk of k(1, 2, 7, 8); "
        "p(1, 3, 5, 8) must be (B, H, Tq, dp) with the B, H, Tq of q(1, 4, 5, 8); "
        "slopes(3,) must hold one slope per head (4, one per query head).")
    with pytest.raises(ValueError, match=r"k\(2, 2, 7, 8\) must be \(B, H_kv, Tk, 8\) with the B of q\(1, 4, 5, 8\); "
                                         r"v\(2, 2, 7, 8\) must be"):
        check_inputs(q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), p, r, slopes)
    with pytest.raises(ValueError, match=r"so Tq \(5\) must be <= Tk \(4\)"):
        check_inputs(q, k[:, :, :4], v[:, :, :4], p, r[:, :, :4], slopes)


def test_auto_takes_the_decode_path_for_one_query_and_the_chunked_one_for_more(monkeypatch):
    """backend="auto" on a CPU: a single decoding query is the O(Tk) decode path, anything longer the chunked one
    (auto_backend is given the number of queries, then the head dims)."""
    from attention_kernels import grape_ap
    taken = []
    monkeypatch.setattr(grape_ap, "decode_attention", lambda *args, **kwargs: taken.append("decode"))
    monkeypatch.setattr(grape_ap, "grape_ap_chunked", lambda *args, **kwargs: taken.append("chunked"))
    for n_queries in (1, 5):
        (q, k, v, p, r), slopes = grape_ap_inputs(1, 4, 2, n_queries, 7, 8)
        grape_ap.grape_ap_attention(q, k, v, p, r, slopes, 0.3)
    assert taken == ["decode", "chunked"]

# ---------------------------------------------------------------------------------------------------
# The Triton kernels under the interpreter (a child process: TRITON_INTERPRET must be set before triton is
# imported). Tiny shapes and 16-wide tiles: lengths not multiples of the tiles, windows narrower than a tile and
# spanning several, backward passes of a few rows (the key-major kernel's carries from an earlier pass's scratch).

def grape_ap_config(tiles, pass_rows):
    (fm, fn), (qm, qn), (km, kn) = tiles
    return (fm, fn, 1, 1, qm, qn, 1, 1, km, kn, 1, 1, pass_rows)


SQUARE, TALL_KEY_MAJOR = ((16, 16),) * 3, ((16, 16), (16, 16), (32, 32))
# (B, H, H_kv, Tq, Tk, window, tiles of the forward, query-major and key-major kernels, dtype, pass rows)
GRAPE_AP_CASES = [(1, 4, 2, 29, 29, None, SQUARE, "float32", 2048),  # 2 query heads per key head
                  (1, 3, 1, 21, 30, None, ((16, 16), (16, 16), (16, 32)), "float32", 2048),  # multi-query, Tq < Tk
                  (1, 2, 2, 45, 45, 11, TALL_KEY_MAJOR, "float32", 32),  # a window, two backward passes
                  (1, 2, 2, 40, 40, 23, ((32, 16), (32, 16), (16, 32)), "float16", 2048),
                  (1, 2, 2, 27, 27, 27, SQUARE, "float32", 2048),  # as wide as the keys
                  (2, 4, 2, 37, 50, 20, ((16, 32), (16, 16), (16, 32)), "float16", 16),  # both, Tq < Tk, 3 passes
                  (1, 4, 1, 40, 40, 17, ((32, 16), (16, 16), (32, 32)), "float32", 2048)]  # multi-query + window
# fp16 (the path gradients' hi + lo parts), key-major query tiles taller than the query-major ones: half of their
# rows' windows miss the key tile, and those rows' query-major tiles never stored a carry for it
ONE_KEY_CASE = (1, 4, 2, 33, 33, 1, ((16, 16), (16, 16), (32, 16)), "float16", 2048)
# (B, H, H_kv, key-feature heads, Tq, Tk, window, (fwd BLOCK_M, BLOCK_N, bwd short, long), dtype)
SEPARABLE_CASES = [(1, 4, 2, 2, 37, 37, None, (16, 16, 16, 32), "float32"),  # key features of the key head
                   (1, 4, 1, 4, 9, 40, None, (16, 16, 16, 32), "float32"),  # multi-query, features per query head
                   (1, 2, 2, 2, 45, 45, 13, (32, 16, 16, 32), "float32"),
                   (1, 2, 2, 2, 33, 33, 1, (16, 16, 16, 16), "float16"),
                   (2, 4, 2, 2, 30, 41, 20, (16, 32, 16, 32), "float16"),  # both, Tq < Tk
                   (1, 4, 2, 4, 30, 30, 64, (16, 16, 16, 32), "float32"),  # wider than the keys: full attention
                   # a window wider than a key tile and narrower than T: each key tile's last query tile wholly
                   # inside the window is counted from the tile's first key, not its last
                   (1, 2, 1, 1, 64, 64, 24, (16, 16, 16, 32), "float32")]


def triton_grape_ap_case(case):
    B, H, Hkv, Tq, Tk, window, tiles, dtype, pass_rows = case
    inputs, slopes = grape_ap_inputs(B, H, Hkv, Tq, Tk, 16, dtype=torch.float32, seed=Tq)
    low = getattr(torch, dtype)
    return [x.to(low) for x in inputs[:3]] + inputs[3:], slopes.float(), grad_out_for(B, H, Tq, 16)


def triton_separable_case(case):
    B, H, Hkv, Hf, Tq, Tk, window, tiles, dtype = case
    # weak decay where there is a window: at FoX strength a key 13 positions back already weighs about e^-15,
    # and keys wrongly let in past the window's edge would change nothing the comparison can see
    inputs = separable_inputs(B, H, Hkv, Hf, Tq, Tk, 16, dtype=getattr(torch, dtype), seed=Tq,
                              decay=1.0 if window is None else 0.02)
    return inputs, grad_out_for(B, H, Tq, 16)


def separable_config(tiles):
    fm, fn, short, long = tiles
    return (fm, fn, 1, 1, short, long, 1, 1)


def run_cases(path):
    """Child process (TRITON_INTERPRET=1): every case's output and gradients, scratch and outputs full of NaN."""
    from attention_kernels.grape_ap import grape_ap_triton
    from attention_kernels.separable import separable_attention
    results = {"grape_ap": [], "separable": []}
    with poisoned_allocations(float("nan")):
        for case in GRAPE_AP_CASES + [ONE_KEY_CASE]:
            inputs, slopes, grad_out = triton_grape_ap_case(case)
            config = grape_ap_config(case[6], case[8])
            results["grape_ap"].append(values_and_grads(
                lambda *a, config=config, window=case[5]: grape_ap_triton(*a, slopes, 0.25, config=config,
                                                                          window=window), inputs, grad_out))
        inputs, slopes, grad_out = triton_grape_ap_case(GRAPE_AP_CASES[4])  # the same without a window
        results["grape_ap_full"] = values_and_grads(
            lambda *a: grape_ap_triton(*a, slopes, 0.25, config=grape_ap_config(SQUARE, 2048)), inputs, grad_out)
        for case in SEPARABLE_CASES:
            inputs, grad_out = triton_separable_case(case)
            results["separable"].append(values_and_grads(
                lambda *a, case=case: separable_attention(*a, 0.25, has_rate=True, has_sum=True,
                                                          config=separable_config(case[7]), window=case[6]),
                inputs, grad_out))
    torch.save(results, path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return run_under_triton_interpreter(__file__, tmp_path_factory.mktemp("gqa_window") / "results.pt")


def tolerance(dtype):
    # fp16: the inputs are exact in fp16, the error is the kernels' rounding of P, dS and O (unit roundoff 4.9e-4)
    return dict(atol=2e-5, rtol=1e-4) if dtype == "float32" else dict(atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("index", range(len(GRAPE_AP_CASES)), ids=[
    f"B{c[0]}H{c[1]}kv{c[2]}Tq{c[3]}Tk{c[4]}w{c[5]}-{c[7]}-pass{c[8]}" for c in GRAPE_AP_CASES])
def test_triton_grape_ap_matches_dense_reference(interpreted, index):
    case = GRAPE_AP_CASES[index]
    inputs, slopes, grad_out = triton_grape_ap_case(case)
    ref = values_and_grads(lambda *a: dense_grape_ap(*a, slopes.double(), 0.25, case[5]),
                           [x.double() for x in inputs], grad_out)
    got = interpreted["grape_ap"][index]
    assert all(g.shape == x.shape and g.dtype == x.dtype for g, x in zip(got[1], inputs))
    assert_matches(got, ref, "qkvpr", tolerance(case[7]))


def test_triton_grape_ap_window_as_wide_as_the_keys_equals_full(interpreted):
    full_out, full_grads = interpreted["grape_ap_full"]
    assert_matches(interpreted["grape_ap"][4], (full_out.double(), [g.double() for g in full_grads]), "qkvpr",
                   dict(atol=1e-6, rtol=1e-6))


def test_triton_grape_ap_one_key_window(interpreted):
    # fp16, window = 1: out = the own key's v, and exactly zero path gradients (no ψ is in any bias); with NaN
    # scratch, half of the key-major kernel's rows have no carry stored for their key tile and must read none
    inputs, slopes, grad_out = triton_grape_ap_case(ONE_KEY_CASE)
    out, grads = interpreted["grape_ap"][len(GRAPE_AP_CASES)]
    torch.testing.assert_close(out, per_query_head(inputs[2], 4), atol=0, rtol=0)
    assert torch.all(grads[3] == 0) and torch.all(grads[4] == 0)
    ref = values_and_grads(lambda *a: dense_grape_ap(*a, slopes.double(), 0.25, 1), [x.double() for x in inputs],
                           grad_out)
    assert_matches((out, grads), ref, "qkvpr", tolerance("float16"))


@pytest.mark.parametrize("index", range(len(SEPARABLE_CASES)), ids=[
    f"B{c[0]}H{c[1]}kv{c[2]}f{c[3]}Tq{c[4]}Tk{c[5]}w{c[6]}-{c[8]}" for c in SEPARABLE_CASES])
def test_triton_separable_matches_dense_reference(interpreted, index):
    case = SEPARABLE_CASES[index]
    inputs, grad_out = triton_separable_case(case)
    ref_out, ref_grads = values_and_grads(lambda *a: dense_separable(*a, 0.25, case[6]), [x.double() for x in inputs],
                                          grad_out)
    out, grads = interpreted["separable"][index]
    assert all(g.shape == x.shape and g.dtype == x.dtype for g, x in zip(grads, inputs))
    for features in (3, 4):  # positions take no gradient; the rate and running-sum gradients are compared
        assert torch.all(grads[features][..., 0] == 0)
        grads[features], ref_grads[features] = grads[features][..., 1:], ref_grads[features][..., 1:]
    assert_matches((out, grads), (ref_out, ref_grads), ["q", "k", "v", " q features", " k features"],
                   tolerance(case[8]))


if __name__ == "__main__":
    run_cases(sys.argv[1])
