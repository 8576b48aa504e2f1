"""The paper's algebraic claims, checked against matrices built from the definitions."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from model import GPT, GPTConfig
from positional import (ALiBi, ForgetGate, GatedSlope, PathIntegral, Rotation, alibi_slopes, build_bias, parse_pos,
                        path_sum, rank2_exp, rms_normalize, rotate_planes, skew_exp)

@pytest.fixture(autouse=True, scope="module")
def _fp64_default():
    """The identities are exact: check them at fp64 precision."""
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def plane_generator(theta: torch.Tensor) -> torch.Tensor:
    """Σ_i θ_i (e_{i+d/2} e_iᵀ - e_i e_{i+d/2}ᵀ): the commuting-plane generator that RoPE exponentiates."""
    half = theta.numel()
    L = torch.zeros(2 * half, 2 * half)
    idx = torch.arange(half)
    theta = theta.to(L.dtype)
    L[idx + half, idx] = theta
    L[idx, idx + half] = -theta
    return L


# ---------------------------------------------------------------- multiplicative GRAPE


@pytest.mark.parametrize("dtype,rel_tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_skew_exp_matches_matrix_exp_over_many_scales(dtype, rel_tol):
    # grape_m_basis's B = exp(A - Aᵀ) without torch.linalg.matrix_exp's host synchronisation: same values
    # (fp64 reference) from generators near zero to ‖X‖₁ ~ 1000 (10 squarings), and an orthogonal result.
    g = torch.Generator().manual_seed(0)
    for scale in (0.0, 1e-4, 0.3, 1.0, 7.0, 60.0, 1000.0):
        A = torch.randn(3, 32, 32, generator=g) * scale / 32
        X = A - A.transpose(-1, -2)
        ref = torch.linalg.matrix_exp(X)
        B = skew_exp(X.to(dtype)).double()
        assert (B - ref).abs().max() <= rel_tol * max(1.0, X.abs().sum(-2).max().item() ** 0.5), scale
        torch.testing.assert_close(B @ B.transpose(-1, -2), torch.eye(32).expand(3, 32, 32),
                                   atol=10 * rel_tol, rtol=0)


def test_skew_exp_gradient_matches_matrix_exp_and_refuses_huge_norms():
    g = torch.Generator().manual_seed(1)
    A = (torch.randn(8, 8, generator=g) * 0.7).requires_grad_(True)
    weights = torch.randn(8, 8, generator=g)
    ours, = torch.autograd.grad((skew_exp(A - A.T) * weights).sum(), A)
    ref, = torch.autograd.grad((torch.linalg.matrix_exp(A - A.T) * weights).sum(), A)
    torch.testing.assert_close(ours, ref, atol=1e-11, rtol=1e-10)
    assert torch.autograd.gradcheck(lambda a: skew_exp(a - a.T), (A.detach()[:4, :4].clone().requires_grad_(True),))
    huge = torch.zeros(4, 4)
    huge[0, 1], huge[1, 0] = 3000.0, -3000.0
    assert torch.isnan(skew_exp(huge)).all()  # past SKEW_EXP_MAX_NORM: NaN, not a wrong rotation


@pytest.mark.parametrize("scale", [1.0, 1e-2, 1e-5, 0.0])
def test_rodrigues_matches_matrix_exp(scale):
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        a = torch.randn(6, generator=g) * scale
        b = torch.randn(6, generator=g)
        L = torch.outer(a, b) - torch.outer(b, a)
        torch.testing.assert_close(rank2_exp(a, b), torch.linalg.matrix_exp(L), atol=1e-11, rtol=1e-9)
    # nearly parallel vectors: s -> 0 through the angle rather than the norm
    a = torch.randn(6, generator=g)
    b = a * 2 + 1e-7 * torch.randn(6, generator=g)
    L = torch.outer(a, b) - torch.outer(b, a)
    torch.testing.assert_close(rank2_exp(a, b), torch.linalg.matrix_exp(L), atol=1e-11, rtol=1e-9)


def test_group_law_orthogonality_and_rotate_planes():
    theta = torch.exp(-torch.arange(4) * 0.7)
    L = plane_generator(theta)
    G = lambda n: torch.linalg.matrix_exp(n * L)
    for n, m in [(3.0, 5.0), (-2.0, 7.5), (100.0, -40.0)]:
        torch.testing.assert_close(G(n + m), G(n) @ G(m), atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(G(n).T @ G(n), torch.eye(8), atol=1e-10, rtol=1e-10)
        # the fast plane rotation is this matrix exponential, and also a product of Rodrigues factors
        x = torch.randn(8)
        torch.testing.assert_close(rotate_planes(x, n * theta), G(n) @ x, atol=1e-10, rtol=1e-10)
        product = torch.eye(8)
        for i in range(4):
            e_i, e_j = torch.eye(8)[i], torch.eye(8)[i + 4]
            product = product @ rank2_exp(math.sqrt(abs(n * theta[i])) * e_j * math.copysign(1, n),
                                          math.sqrt(abs(n * theta[i])) * e_i)
        torch.testing.assert_close(product, G(n), atol=1e-10, rtol=1e-10)


def test_relative_law_of_rotation():
    theta = torch.exp(-torch.arange(4) * 0.5)
    q, k = torch.randn(8), torch.randn(8)
    dot = lambda i, j: rotate_planes(q, i * theta) @ rotate_planes(k, j * theta)
    torch.testing.assert_close(dot(10.0, 3.0), dot(107.0, 100.0), atol=1e-10, rtol=1e-10)


def tiny(pos, **kw):
    cfg = dict(n_layer=2, n_head=4, n_embd=32, head_dim=8, vocab_size=61, block_size=32, pos=pos)
    cfg.update(kw)
    return GPTConfig(**cfg)


def test_frozen_grape_m_equals_rope_exactly():
    torch.manual_seed(0)
    rope = GPT(tiny("rope"))
    grape = GPT(tiny("grape_m", learn_spectrum=False))
    missing, unexpected = grape.load_state_dict(rope.state_dict(), strict=False)
    assert unexpected == [] and all("log_theta" in name for name in missing)
    idx = torch.randint(0, 61, (2, 16))
    assert torch.equal(rope(idx)[0], grape(idx)[0])


@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rope_frequencies_are_the_formula_in_fp64_rounded_once(base):
    """θ_i = base^(-2i/d) (Python's float pow: fp64) rounded to fp32 once, bit for bit; fp64 models keep the
    fp64 value, also through the rotation at a far position."""
    for d in (16, 32, 64, 128):
        rotation = GPT(tiny("rope", head_dim=d, rope_base=base)).blocks[0].attn.rotation
        exact = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
        assert torch.equal(rotation.frequencies(), exact.float())
        # exp of an fp64 log θ: a few fp64 ulps (|log θ| < 14 here), where fp32 rounding is 6e-8
        torch.testing.assert_close(rotation.frequencies(torch.float64), exact, atol=0, rtol=4e-15)
    q = torch.randn(1, 1, 1, d, dtype=torch.float64)
    rotated, _ = rotation(q, q, None, torch.tensor([4095]), {})
    angle = 4095 * exact
    x1, x2 = q[..., :d // 2], q[..., d // 2:]
    expected = torch.cat((x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()), dim=-1)
    # angle 4095·θ to about 4095·4e-15 rad (an fp32-rounded θ would be off by up to 2.4e-4 rad here)
    torch.testing.assert_close(rotated, expected, atol=1e-10, rtol=0)


def test_grape_m_basis_identity_equals_grape_m_and_general_basis_matches_definition():
    torch.manual_seed(0)
    plain = GPT(tiny("grape_m"))
    basis = GPT(tiny("grape_m_basis"))
    basis.load_state_dict(plain.state_dict(), strict=False)
    idx = torch.randint(0, 61, (2, 16))
    torch.testing.assert_close(basis(idx)[0], plain(idx)[0], atol=1e-12, rtol=1e-12)
    # with a random basis: q̃ = B R(n) Bᵀ q, built from explicit matrices
    rot = Rotation("grape_m_basis", n_head=2, head_dim=8, n_embd=16, base=100.0, learn_spectrum=True,
                   spectrum_per_head=False, ctx_temperature=16.0, ctx_init_increment=1e-3)
    with torch.no_grad():
        rot.basis_generator.normal_()
    B = rot.basis().detach()
    torch.testing.assert_close(B @ B.T, torch.eye(8), atol=1e-10, rtol=1e-10)
    assert torch.linalg.det(B) == pytest.approx(1.0)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    positions = torch.arange(3, 8)
    q_rot, k_rot = rot(q, k, None, positions, {})
    theta = rot.log_theta.detach().exp()
    G = [B @ torch.linalg.matrix_exp(n * plane_generator(theta)) @ B.T for n in positions]
    for t in range(5):
        for s in range(5):  # Bᵀ cancels in q̃·k̃, so rotating Bᵀq and Bᵀk gives the same logits
            expected = (G[t] @ q[0, 1, t]) @ (G[s] @ k[0, 1, s])
            assert (q_rot[0, 1, t] @ k_rot[0, 1, s]).item() == pytest.approx(expected.item(), abs=1e-10)


def test_contextual_phase_is_exclusive_cumsum_of_increments():
    rot = Rotation("grape_m_ctx", n_head=2, head_dim=8, n_embd=16, base=100.0, learn_spectrum=True,
                   spectrum_per_head=True, ctx_temperature=16.0, ctx_init_increment=1e-3)
    x = torch.randn(2, 6, 16)
    # official init: W = 0, b = softplus⁻¹(1e-3), so every ω_t = sigmoid(b / 16) ≈ 0.394
    omega0 = torch.sigmoid(torch.tensor(math.log(math.expm1(1e-3))) / 16)
    angles = rot.angles(x, None, {})
    theta = rot.log_theta.exp()
    expected_phase = torch.arange(6) * omega0
    torch.testing.assert_close(angles[0, 1, :, 2], expected_phase * theta[1, 2], atol=1e-10, rtol=1e-10)
    with torch.no_grad():
        rot.phase_increment.weight.normal_()
    omega = torch.sigmoid(rot.phase_increment(x).squeeze(-1) / 16)
    state = {}
    first, second = rot.angles(x[:, :4], None, state), rot.angles(x[:, 4:], None, state)
    phase = torch.cat((first, second), dim=2)[:, 0, :, 0] / theta[0, 0]
    expected = torch.stack([omega[:, :t].sum(1) for t in range(6)], dim=1)
    torch.testing.assert_close(phase, expected, atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------- additive GRAPE: the GL(d+2) lift


def unipotent_logits(q, k, rate):
    """q̂ᵀ G(j-i)^{-ᵀ} k̂ with q̂ = [q; 1; 0], k̂ = [k; 0; 1], G(m) = I + m A, A = -rate(i, j) e_{d+2}e_{d+1}ᵀ,
    built as explicit (d+2)×(d+2) matrices and inverted numerically."""
    T, d = q.shape
    out = torch.empty(T, T)
    E = torch.zeros(d + 2, d + 2)
    E[d + 1, d] = 1.0
    for i in range(T):
        for j in range(T):
            q_hat = torch.cat((q[i], torch.tensor([1.0, 0.0])))
            k_hat = torch.cat((k[j], torch.tensor([0.0, 1.0])))
            G = torch.eye(d + 2) + (j - i) * (-rate(i, j) * E)
            out[i, j] = q_hat @ torch.linalg.inv(G).T @ k_hat
    return out


def biased_logits_both_ways(bias, q, k, positions):
    """(dense bias + q·k, lifted q̃·k̃) for one head-batch, and the causal mask."""
    qf, kf = bias.features(None, q, k, positions, {})
    dense = q @ k.transpose(-1, -2) + bias.dense(qf, kf)
    q_cols, k_cols = (cols.to(q.dtype) for cols in bias.lift(qf, kf))
    B, H = q.shape[:2]
    lifted = q @ k.transpose(-1, -2) + q_cols.expand(B, H, *q_cols.shape[2:]) @ k_cols.expand(
        B, H, *k_cols.shape[2:]).transpose(-1, -2)
    return dense, lifted


def assert_equal_up_to_row_constant(a, b, mask):
    """Causal rows of a and b differ by a constant per row (which softmax ignores)."""
    diff = (a - b).masked_fill(~mask, 0.0)
    row = (a - b)[..., :, :1]  # key 0 is visible to every query
    torch.testing.assert_close(diff, row.expand_as(diff).masked_fill(~mask, 0.0), atol=1e-9, rtol=1e-9)


def test_alibi_is_the_unipotent_action():
    H, d, T = 4, 8, 7
    bias = ALiBi(H)
    q, k = torch.randn(1, H, T, d), torch.randn(1, H, T, d)
    positions = torch.arange(T)
    dense, lifted = biased_logits_both_ways(bias, q, k, positions)
    slopes = alibi_slopes(H)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for h in range(H):
        explicit = unipotent_logits(q[0, h], k[0, h], lambda i, j: slopes[h])
        torch.testing.assert_close(dense[0, h][mask], explicit[mask], atol=1e-10, rtol=1e-10)
    assert_equal_up_to_row_constant(dense, lifted, mask)


def test_alibi_slopes_rule():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 12 heads: the 8 slopes of H=8, then every other slope of H=16
    expected = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(0.5 * (2 * i + 1)) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))


@pytest.mark.parametrize("gates", ["q", "k", "qk"])
def test_grape_a_gated_is_the_unipotent_action(gates):
    H, d, T = 2, 8, 6
    bias = GatedSlope(H, d, gates, omega_init=1.3)
    with torch.no_grad():
        bias.rate.add_(torch.randn(H))
    q, k = torch.randn(1, H, T, d), torch.randn(1, H, T, d)
    positions = torch.arange(5, 5 + T)
    dense, lifted = biased_logits_both_ways(bias, q, k, positions)
    omega = F.softplus(bias.rate) * alibi_slopes(H)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for h in range(H):
        def rate(i, j):  # ω_h [λ_q(q_i) + λ_k(k_j)], gates from the definition
            r = 0.0
            if "q" in gates:
                v = bias.query_gate[h] / bias.query_gate[h].norm()
                r += F.softplus(v @ q[0, h, i] / math.sqrt(d))
            if "k" in gates:
                u = bias.key_gate[h] / bias.key_gate[h].norm()
                r += F.softplus(u @ k[0, h, j] / math.sqrt(d))
            return omega[h] * r
        explicit = unipotent_logits(q[0, h], k[0, h], rate)
        torch.testing.assert_close(dense[0, h][mask], explicit[mask], atol=1e-10, rtol=1e-10)
    assert_equal_up_to_row_constant(dense, lifted, mask)


def test_fox_is_path_integral_with_endpoint_independent_edges():
    H, C, T = 3, 16, 9
    fox = ForgetGate(H, C, bias_init=0.5)
    x = torch.randn(2, T, C)
    qf, kf = fox.features(x, None, None, torch.arange(T), {})
    log_f = F.logsigmoid(fox.gate(x)).transpose(1, 2)  # (B, H, T)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    psi = log_f[..., None, :].expand(-1, -1, T, -1).masked_fill(~mask, 0.0)  # ψ(t, ℓ) = log f_ℓ
    torch.testing.assert_close(fox.dense(qf, kf)[..., mask], path_sum(psi)[..., mask], atol=1e-10, rtol=1e-10)
    # and directly from the definition Σ_{ℓ=j+1}^{t} log f_ℓ
    explicit = torch.zeros(2, H, T, T)
    for t in range(T):
        for j in range(t + 1):
            explicit[..., t, j] = log_f[..., j + 1: t + 1].sum(-1)
    torch.testing.assert_close(fox.dense(qf, kf)[..., mask], explicit[..., mask], atol=1e-10, rtol=1e-10)


def test_fox_lift_and_state_across_chunks():
    H, C, T = 3, 16, 9
    fox = ForgetGate(H, C, bias_init=0.5)
    x = torch.randn(2, T, C)
    full_q, full_k = fox.features(x, None, None, None, {})
    state = {}
    parts = [fox.features(x[:, s:e], None, None, None, state) for s, e in ((0, 4), (4, 5), (5, 9))]
    torch.testing.assert_close(torch.cat([p[1]["c"] for p in parts], dim=-1), full_k["c"], atol=1e-10, rtol=1e-10)
    q_cols, k_cols = fox.lift(full_q, full_k)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    assert_equal_up_to_row_constant(fox.dense(full_q, full_k), q_cols @ k_cols.transpose(-1, -2), mask)


def test_path_integral_with_t_independent_psi_is_a_phase_difference():
    psi_l = torch.randn(2, 3, 8)
    T = 8
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    psi = psi_l[..., None, :].expand(-1, -1, T, -1).masked_fill(~mask, 0.0)
    c = torch.cumsum(psi_l, dim=-1)
    torch.testing.assert_close(path_sum(psi)[..., mask], (c[..., :, None] - c[..., None, :])[..., mask],
                               atol=1e-10, rtol=1e-10)


def test_grape_ap_dense_matches_the_double_sum_definition():
    H, C, dp, T = 2, 16, 4, 7
    ap = PathIntegral(H, C, dp)
    x = torch.randn(1, T, C)
    positions = torch.arange(3, 3 + T)
    with torch.no_grad():
        qf, kf = ap.features(x, None, None, positions, {})
        bias = ap.dense(qf, kf)
    p = ap.path(x).detach().view(1, T, H, dp).transpose(1, 2)
    slopes = alibi_slopes(H)
    for h in range(H):
        for t in range(T):
            for j in range(t + 1):
                total = 0.0
                for l in range(j + 1, t + 1):
                    angle = float(positions[l])
                    R = torch.linalg.matrix_exp(angle * plane_generator(torch.ones(dp // 2)))
                    r = R @ rms_normalize(p[0, h, l])
                    total += slopes[h] * F.logsigmoid(p[0, h, t] @ r / dp)
                assert bias[0, h, t, j].item() == pytest.approx(float(total), abs=1e-10)
                assert bias[0, h, t, j] <= 0


# ---------------------------------------------------------------- names and errors


def test_parse_pos_and_errors():
    assert parse_pos("rope") == ("rope", None)
    assert parse_pos("fox") == ("nope", "fox")
    assert parse_pos("rope+grape_ap") == ("rope", "grape_ap")
    assert parse_pos("alibi+grape_m") == ("grape_m", "alibi")
    with pytest.raises(ValueError, match="unknown positional encoding 'ropee'.*grape_ap"):
        parse_pos("ropee")
    with pytest.raises(ValueError, match="same family"):
        parse_pos("rope+grape_m")
    with pytest.raises(ValueError, match="head_dim must be even"):
        GPTConfig(pos="rope", head_dim=7)
    GPTConfig(pos="alibi", head_dim=7)  # nothing rotates: odd is fine
    with pytest.raises(ValueError, match="p_head_dim must be even"):
        GPTConfig(pos="grape_ap", p_head_dim=5)
    with pytest.raises(ValueError, match="did you mean 'n_head'"):
        GPTConfig.from_dict({"n_heads": 4})
    with pytest.raises(ValueError, match="attn_backend"):
        GPTConfig(attn_backend="flash")


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_rotated_planes_keep_the_inputs_dtype_and_round_the_fp32_rotation():
    from positional import rotate_planes
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    angles = torch.linspace(0, 3, 20).view(5, 4)
    rotated = rotate_planes(x, angles)
    x1, x2 = x.float().chunk(2, dim=-1)
    reference = torch.cat((x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()), -1)
    assert rotated.dtype == torch.bfloat16
    assert torch.equal(rotated, reference.to(torch.bfloat16))


# ------------------------------------------------------ properties: positional.py's closed forms over their whole range
# Rodrigues' exp of a rank-2 skew generator against torch.linalg.matrix_exp in fp64 at any angle, on both sides of its
# small-angle series (s < 1e-3) and at the switch, to 1e-15; and in the dtype it was given.


angles = st.one_of(st.floats(min_value=1e-9, max_value=3.0), st.sampled_from([9.99e-4, 1e-3, 1.001e-3, 5e-4]))


@given(s=angles, d=st.integers(2, 6), seed=st.integers(0, 10**6))
def test_rank2_exp_is_the_matrix_exponential_at_any_angle(s, d, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    b = b - (a @ b) / (a @ a) * a  # orthogonal, so s = |a| |b|
    b = b / b.norm() * s / a.norm()
    L = torch.outer(a, b) - torch.outer(b, a)
    torch.testing.assert_close(rank2_exp(a, b), torch.linalg.matrix_exp(L), atol=1e-15, rtol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("s", [1e-4, 0.7])
def test_rank2_exp_keeps_its_inputs_dtype(dtype, s):
    a = torch.tensor([1.0, 0.0, 0.0], dtype=dtype)
    b = torch.tensor([0.0, s, 0.0], dtype=dtype)
    out = rank2_exp(a, b)
    assert out.dtype == dtype
    expected = torch.linalg.matrix_exp((torch.outer(a, b) - torch.outer(b, a)).double())
    torch.testing.assert_close(out.double(), expected, atol=1e-2 if dtype in (torch.float16, torch.bfloat16)
                               else 1e-6, rtol=0)


@pytest.mark.parametrize("pos", ["alibi", "grape_a_q", "grape_a_k", "grape_a_qk", "fox"])
def test_tile_features_give_the_paper_bias(pos):
    # The kernel's form -(t - j)(a_t + b_j) + (c_t - c_j), evaluated densely from tile_features, equals
    # the bias as the paper writes it (positional.*.dense) for queries at the end of a longer cache.
    torch.manual_seed(0)
    bias = build_bias(pos, n_head=3, head_dim=8, n_embd=12, grape_a_omega_init=1.0, fox_gate_bias_init=0.0,
                      p_head_dim=8).double()
    with torch.no_grad():
        for p in bias.parameters():
            p.add_(0.3 * torch.randn(p.shape, dtype=p.dtype))
        x, q, k = torch.randn(2, 11, 12).double(), torch.randn(2, 3, 11, 8).double(), torch.randn(2, 3, 11, 8).double()
        qf, kf = bias.features(x, q, k, torch.arange(11) + 5, {})
        qf = {n: f[..., 7:] for n, f in qf.items()}  # the last 4 tokens query all 11
        qt, kt = bias.tile_features(qf, kf)
        form = torch.zeros(2, 3, 4, 11, dtype=torch.float64)
        if bias.has_rate:
            form = form - (qt[..., 0, None] - kt[..., None, :, 0]) * (qt[..., 1, None] + kt[..., None, :, 1])
        if bias.has_sum:
            form = form + qt[..., 2, None] - kt[..., None, :, 2]
        torch.testing.assert_close(form, bias.dense(qf, kf).expand_as(form), atol=1e-5, rtol=1e-5)
