"""The model against an independent reference: every README formula written out again here, in fp64, with
loops and explicit 2x2 rotations instead of the module's vectorised code, and with every parameter moved off the
values that hide bugs (norm gains != 1, rope_base != 10000, non-default init settings, temperature != 1, top-k > 1).

The reference reads the model's weights but none of its positional code: RoPE's θ_i = base^(-2i/d), the ALiBi
slopes 2^(-8h/H), the KV-shift gates and the GRAPE-AP double sum are computed from their definitions.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from model import sample_next
from model import GPT, GPTConfig
from positional import parse_pos

VOCAB = 41


def rms(x, gain, eps=1e-5):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gain


def rotate_pair_by_pair(x, angles):
    """x (.., d) with coordinate i paired with i + d/2, each pair rotated by angles[.., i] as the 2x2 matrix
    [[cos, -sin], [sin, cos]] acting on (x_i, x_{i+d/2})."""
    half = x.shape[-1] // 2
    out = x.clone()
    for i in range(half):
        c, s = torch.cos(angles[..., i]), torch.sin(angles[..., i])
        out[..., i] = c * x[..., i] - s * x[..., i + half]
        out[..., i + half] = s * x[..., i] + c * x[..., i + half]
    return out


def power_of_two_alibi_slopes(H):
    assert H & (H - 1) == 0
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float64)


def reference_attention(attn, h, positions, cfg, window=None):
    """One attention sublayer from the README's definitions: h (B, T, C) fp64 is the normed layer input. Grouped
    query attention: the projection's rows are H query heads, then H_kv key and H_kv value heads, query head h
    reads key head h // (H / H_kv); every key-side quantity (KV-shift gates, the rotation's per-head spectrum,
    GRAPE-A's key gate, GRAPE-AP's r from the mean of the group's path vectors) is the key head's. window: keys
    at distance >= window are hidden."""
    W = lambda module: module.weight.detach().double()
    B, T, _ = h.shape
    H, Hkv, d = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    group = [head // (H // Hkv) for head in range(H)]  # the key head of each query head
    qkv = h @ W(attn.qkv).T
    q = qkv[..., :H * d].view(B, T, H, d)
    k, v = (qkv[..., (H + i * Hkv) * d:(H + (i + 1) * Hkv) * d].view(B, T, Hkv, d) for i in range(2))
    if cfg.kv_shift:  # k'_t = a_t k_{t-1} + (1 - a_t) k_t with k_{-1} = 0; v with its own gate (the second H_kv rows)
        gates = torch.sigmoid(h @ W(attn.kv_shift.gate).T)
        shifted = []
        for x, a in ((k, gates[..., :Hkv]), (v, gates[..., Hkv:])):
            previous = torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), dim=1)
            shifted.append(a[..., None] * previous + (1 - a[..., None]) * x)
        k, v = shifted
    # QK RMSNorm with its learnable gain, before any rotation
    q, k = rms(q, W(attn.q_norm), cfg.norm_eps), rms(k, W(attn.k_norm), cfg.norm_eps)
    normed_q, normed_k = q, k
    rotation, bias_kind = parse_pos(cfg.pos)
    pos = positions.double()
    if rotation != "nope":
        if rotation == "rope":
            theta = torch.tensor([cfg.rope_base ** (-2.0 * i / d) for i in range(d // 2)], dtype=torch.float64)
        else:
            theta = attn.rotation.log_theta.detach().double().exp()
        theta = theta if theta.dim() == 2 else theta.expand(Hkv, -1)  # (H_kv, d/2): the key heads'
        q_theta = theta[group]  # each query head turns by its key head's spectrum
        if rotation == "grape_m_ctx":  # Φ_t = Σ_{τ<t} ω_τ, ω = sigmoid((W x + b) / temperature)
            omega = torch.sigmoid((h @ W(attn.rotation.phase_increment).T
                                   + attn.rotation.phase_increment.bias.detach().double()) / cfg.ctx_temperature)[..., 0]
            phase = torch.stack([omega[:, :t].sum(1) for t in range(T)], dim=1)  # (B, T)
        else:
            phase = pos.expand(B, T)
        angles, q_angles = phase[:, :, None, None] * theta, phase[:, :, None, None] * q_theta  # (B, T, heads, d/2)
        if rotation == "grape_m_basis":  # B R_t Bᵀ q with B = exp(A - Aᵀ)
            A = attn.rotation.basis_generator.detach().double()
            basis = torch.linalg.matrix_exp(A - A.T)
            q = rotate_pair_by_pair(q @ basis, q_angles) @ basis.T
            k = rotate_pair_by_pair(k @ basis, angles) @ basis.T
        else:
            q, k = rotate_pair_by_pair(q, q_angles), rotate_pair_by_pair(k, angles)
    k, v, normed_k = k[:, :, group], v[:, :, group], normed_k[:, :, group]  # each query head's key head
    logits = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d)
    distance = pos[:, None] - pos[None, :]  # t - j
    slopes = power_of_two_alibi_slopes(H)[:, None, None]
    if bias_kind == "alibi":
        logits = logits - slopes * distance
    elif bias_kind and bias_kind.startswith("grape_a_"):
        bias = attn.bias
        omega = F.softplus(bias.rate.detach().double())[:, None, None] * slopes
        rate = torch.zeros(B, H, T, T, dtype=torch.float64)
        if "q" in bias_kind.removeprefix("grape_a_"):
            unit = F.normalize(bias.query_gate.detach().double(), dim=-1)
            rate = rate + F.softplus(torch.einsum("bthd,hd->bht", normed_q, unit) / math.sqrt(d))[..., :, None]
        if "k" in bias_kind.removeprefix("grape_a_"):
            unit = F.normalize(bias.key_gate.detach().double(), dim=-1)[group]  # one gate per key head
            rate = rate + F.softplus(torch.einsum("bthd,hd->bht", normed_k, unit) / math.sqrt(d))[..., None, :]
        logits = logits - distance * omega * rate
    elif bias_kind == "fox":  # Σ_{ℓ=j+1}^{t} log f_ℓ
        log_f = F.logsigmoid(h @ W(attn.bias.gate).T + attn.bias.gate.bias.detach().double())  # (B, T, H)
        for t in range(T):
            for j in range(t + 1):
                logits[:, :, t, j] += log_f[:, j + 1:t + 1].sum(1)
    elif bias_kind == "grape_ap":  # Σ_{ℓ=j+1}^{t} α_h logsigmoid(<p_t, R_ℓ p̂_ℓ> / d_p), R_ℓ: angle ℓ in every plane
        dp = cfg.p_head_dim
        p = (h @ W(attn.bias.path).T).view(B, T, H, dp)
        key_p = p.view(B, T, Hkv, H // Hkv, dp).mean(3)  # a key head's: the mean of its group's path vectors
        p_hat = key_p / torch.sqrt((key_p * key_p).mean(-1, keepdim=True) + 1e-5)
        r = rotate_pair_by_pair(p_hat, pos[None, :, None, None].expand(B, T, Hkv, dp // 2))[:, :, group]
        psi = slopes[None] * F.logsigmoid(torch.einsum("bthd,blhd->bhtl", p, r) / dp)  # ψ(t, ℓ)
        for t in range(T):
            for j in range(t + 1):
                logits[:, :, t, j] += psi[:, :, t, j + 1:t + 1].sum(-1)
    hidden = distance < 0 if window is None else (distance < 0) | (distance >= window)
    logits = logits.masked_fill(hidden, float("-inf"))
    y = torch.einsum("bhts,bshd->bthd", torch.softmax(logits, dim=-1), v).reshape(B, T, H * d)
    return y @ W(attn.proj).T


def reference_logits(model, idx, start_pos=0):
    cfg = model.config
    W = lambda module: module.weight.detach().double()
    positions = torch.arange(start_pos, start_pos + idx.shape[1])
    x = W(model.wte)[idx]
    for layer, block in enumerate(model.blocks):
        # the README's pattern: layers global_every, 2·global_every, ... (from 1) full, the others windowed
        is_global = cfg.global_every is not None and (layer + 1) % cfg.global_every == 0
        window = None if is_global else cfg.window
        x = x + reference_attention(block.attn, rms(x, W(block.attn_norm), cfg.norm_eps), positions, cfg, window)
        m = rms(x, W(block.mlp_norm), cfg.norm_eps)
        x = x + (F.silu(m @ W(block.mlp.gate).T) * (m @ W(block.mlp.up).T)) @ W(block.mlp.proj).T
    return rms(x, W(model.norm), cfg.norm_eps) @ W(model.wte).T  # tied output embedding


def perturbed_model(pos, kv_shift=False, seed=0, **overrides):
    """A small model with every gain and positional parameter moved off its init (gains at 1 hide the
    order of normalisation and rotation; a zero ctx weight or basis generator hides those paths)."""
    torch.manual_seed(seed)
    cfg = dict(n_layer=2, n_head=4, n_embd=32, head_dim=8, vocab_size=VOCAB, block_size=64, pos=pos,
               kv_shift=kv_shift, rope_base=500.0)
    cfg.update(overrides)
    model = GPT(GPTConfig(**cfg))
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) * 1.5 + 0.5)  # gains in [0.5, 2]
            elif any(part in name for part in ("rotation", "bias.", "kv_shift")):
                p.add_(0.5 * torch.randn(p.shape, generator=g))
            elif "wte" in name:
                p.mul_(20)  # logits of order 1, so that a wrong attention shows in them
    return model


def tokens(B=2, T=12, seed=1):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


REFERENCE_CASES = [("rope", False), ("rope", True), ("grape_m", False), ("grape_m_basis", False),
                   ("grape_m_ctx", True), ("alibi", True), ("fox", False), ("grape_a_qk", False),
                   ("grape_a_q", True), ("grape_ap", False), ("rope+grape_ap", True), ("grape_m+alibi", False)]


@pytest.mark.parametrize("pos,kv_shift", REFERENCE_CASES,
                         ids=[p + ("+kv_shift" if kv else "") for p, kv in REFERENCE_CASES])
@pytest.mark.parametrize("backend", ["auto", "dense"])
def test_logits_equal_the_written_out_definitions(pos, kv_shift, backend):
    """Norm before rotation with perturbed gains, θ_i = base^(-2i/d) at rope_base=500, the KV-shift gates, each
    bias from its formula; at start position 7 (not 0, where a position offset bug hides)."""
    model = perturbed_model(pos, kv_shift, attn_backend=backend)
    idx = tokens()
    with torch.no_grad():
        got = model(idx, start_pos=7)[0].double()
    expected = reference_logits(model, idx, start_pos=7)
    assert expected.abs().max() > 1.0  # the check below is meaningful at this scale
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("pos,kv_shift", REFERENCE_CASES,
                         ids=[p + ("+kv_shift" if kv else "") for p, kv in REFERENCE_CASES])
@pytest.mark.fault
def test_dense_backend_in_float64_equals_the_definitions_to_float64_precision(pos, kv_shift):
    """The dense backend is the reference a careful user checks numerics with: in float64 it must run for every
    encoding (the additive ones once mixed fp32 and fp64) and stay in float64 throughout, so it meets the fp64
    definitions at 1e-9, five orders tighter than any fp32 step allows."""
    model = perturbed_model(pos, kv_shift, attn_backend="dense").double()
    idx = tokens()
    with torch.no_grad():
        got = model(idx, start_pos=7)[0]
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, reference_logits(model, idx, start_pos=7), atol=1e-9, rtol=1e-9)


def test_grape_ap_at_a_far_start_position_equals_its_definition():
    """GRAPE-AP's R_ℓ is absolute: at start position 1000 the logits are those of the definition at ℓ = 1000.."""
    model = perturbed_model("grape_ap", True)
    idx = tokens(T=9)
    with torch.no_grad():
        got = model(idx, start_pos=1000)[0].double()
    torch.testing.assert_close(got, reference_logits(model, idx, start_pos=1000), atol=2e-4, rtol=1e-4)


RELATIVE = ["nope", "rope", "grape_m", "grape_m_basis", "grape_m_ctx", "alibi", "grape_a_q", "grape_a_k",
            "grape_a_qk", "fox", "grape_m+alibi", "grape_m_ctx+fox"]


@pytest.mark.parametrize("pos", RELATIVE)
@pytest.mark.parametrize("kv_shift", [False, True], ids=["", "kv_shift"])
def test_relative_law_holds_with_perturbed_norm_gains(pos, kv_shift):
    """With the QK RMSNorm before the rotation the logits do not depend on the start position whatever the
    gains; normalising after rotating breaks this by ~0.1 with gains in [0.5, 2]."""
    model = perturbed_model(pos, kv_shift)
    idx = tokens(T=10)
    with torch.no_grad():
        at_zero, shifted = model(idx, start_pos=0)[0], model(idx, start_pos=333)[0]
    torch.testing.assert_close(at_zero, shifted, atol=2e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- spectra and init settings

@pytest.mark.parametrize("pos,per_head,learn", [("rope", False, True), ("grape_m", False, True),
                                                ("grape_m", True, True), ("grape_m", False, False),
                                                ("grape_m_ctx", True, True), ("grape_m_basis", False, True)])
def test_spectrum_at_init_is_rope_base_power(pos, per_head, learn):
    """θ_i = rope_base^(-2i/d) for i < d/2, at a base and head dim off the defaults (every head alike)."""
    base, d, H = 300.0, 12, 3
    model = GPT(GPTConfig(n_layer=1, n_head=H, n_embd=24, head_dim=d, vocab_size=VOCAB, pos=pos, rope_base=base,
                          spectrum_per_head=per_head, learn_spectrum=learn))
    theta = model.blocks[0].attn.rotation.log_theta.detach().double().exp()
    expected = torch.tensor([base ** (-2.0 * i / d) for i in range(d // 2)], dtype=torch.float64)
    assert theta.shape == ((H, d // 2) if per_head else (d // 2,))
    torch.testing.assert_close(theta, expected.expand_as(theta), atol=0, rtol=1e-6)


def test_positional_init_settings_reach_every_layer():
    """fox_gate_bias_init, grape_a_omega_init and the grape_m_ctx settings, at values off their defaults."""
    H = 4
    slopes = power_of_two_alibi_slopes(H)
    fox = GPT(GPTConfig(n_layer=2, n_head=H, n_embd=32, head_dim=8, vocab_size=VOCAB, pos="fox",
                        fox_gate_bias_init=-1.7))
    gated = GPT(GPTConfig(n_layer=2, n_head=H, n_embd=32, head_dim=8, vocab_size=VOCAB, pos="grape_a_qk",
                          grape_a_omega_init=0.37))
    ctx = GPT(GPTConfig(n_layer=2, n_head=H, n_embd=32, head_dim=8, vocab_size=VOCAB, pos="grape_m_ctx",
                        ctx_temperature=4.0, ctx_init_increment=0.2))
    x = torch.randn(1, 5, 32)
    for layer in range(2):
        # at x = 0 the forget gate is f = sigmoid(b): log f = logsigmoid(-1.7)
        gate = fox.blocks[layer].attn.bias.gate
        torch.testing.assert_close(F.logsigmoid(gate(torch.zeros(1, 32))),
                                   torch.full((1, H), F.logsigmoid(torch.tensor(-1.7)).item()))
        # ω_h = softplus(w_h) × slope_h with softplus(w_h) = 0.37 at init
        torch.testing.assert_close(gated.blocks[layer].attn.bias.omega().double(), 0.37 * slopes, atol=1e-7, rtol=1e-6)
        # W = 0 and b = softplus⁻¹(0.2): every increment is sigmoid(softplus⁻¹(0.2) / 4)
        rotation = ctx.blocks[layer].attn.rotation
        theta = rotation.log_theta.detach().exp()
        phase = rotation.angles(x, None, {})[0, 0, :, 0].detach() / theta[0]
        omega = 1 / (1 + math.exp(-math.log(math.exp(0.2) - 1) / 4.0))
        torch.testing.assert_close(phase.double(), omega * torch.arange(5, dtype=torch.float64), atol=1e-6, rtol=1e-6)


# ----------------------------------------------------------------------------- KV-shift

def test_kv_shift_module_matches_its_definition_across_cache_chunks():
    """k'_t = a_t k_{t-1} + (1 - a_t) k_t with k_{-1} = 0, v with its own gate; chunks carry the previous k, v."""
    torch.manual_seed(0)
    model = perturbed_model("nope", True)
    shift = model.blocks[0].attn.kv_shift
    B, H, T, d, C = 2, 4, 7, 8, 32
    x, k, v = torch.randn(B, T, C), torch.randn(B, H, T, d), torch.randn(B, H, T, d)
    a = torch.sigmoid(x @ shift.gate.weight.detach().T)  # (B, T, 2H): k's gates, then v's
    expected_k, expected_v = torch.empty_like(k), torch.empty_like(v)
    for t in range(T):
        for head in range(H):
            a_k, a_v = a[:, t, head, None], a[:, t, H + head, None]
            prev_k = k[:, head, t - 1] if t else torch.zeros(B, d)
            prev_v = v[:, head, t - 1] if t else torch.zeros(B, d)
            expected_k[:, head, t] = a_k * prev_k + (1 - a_k) * k[:, head, t]
            expected_v[:, head, t] = a_v * prev_v + (1 - a_v) * v[:, head, t]
    state = {}
    with torch.no_grad():
        parts = [shift(x[:, s:e], k[:, :, s:e], v[:, :, s:e], state) for s, e in ((0, 3), (3, 4), (4, 7))]
    torch.testing.assert_close(torch.cat([p[0] for p in parts], dim=2), expected_k)
    torch.testing.assert_close(torch.cat([p[1] for p in parts], dim=2), expected_v)


# ----------------------------------------------------------------------------- sampling

def empirical_distribution(samples, vocab):
    return torch.bincount(samples.flatten(), minlength=vocab).double() / samples.numel()


def truncated_tempered_softmax(logits, temperature, top_k):
    """softmax(logits / T) renormalised over the top_k largest logits (computed by sorting, not torch.topk)."""
    order = sorted(range(len(logits)), key=lambda i: -float(logits[i]))
    kept = order[:top_k]
    weights = torch.zeros(len(logits), dtype=torch.float64)
    for i in kept:
        weights[i] = math.exp(float(logits[i]) / temperature)
    return weights / weights.sum()


@pytest.mark.parametrize("temperature,top_k", [(0.5, 3), (2.0, None), (0.7, 5)])
def test_sample_next_draws_from_the_tempered_top_k_distribution(temperature, top_k):
    logits = torch.tensor([2.0, 1.2, 0.9, 0.3, 0.0, -0.4, -1.0, 1.5])
    n = 40_000
    samples = sample_next(logits.expand(n, -1), temperature, top_k, torch.Generator().manual_seed(0))
    expected = truncated_tempered_softmax(logits, temperature, top_k or len(logits))
    tolerance = 5 * torch.sqrt(expected * (1 - expected) / n) + 1e-9  # 5 standard errors of a frequency
    wrong = [truncated_tempered_softmax(logits, 1.0, top_k or len(logits))]  # temperature ignored
    if top_k:
        wrong += [truncated_tempered_softmax(logits, temperature, k) for k in (top_k - 1, top_k + 1)]
    assert all(((w - expected).abs() > 2 * tolerance).any() for w in wrong)  # each would be detected
    got = empirical_distribution(samples, len(logits))
    assert ((got - expected).abs() <= tolerance).all(), (got, expected)


@pytest.mark.parametrize("temperature,top_k", [(0.5, 3), (1.6, None)])
def test_generate_draws_from_the_tempered_top_k_distribution(temperature, top_k):
    """GPT.generate's first sampled token, over many rows of one prompt, against softmax(logits / T) on the top k."""
    model = perturbed_model("alibi")
    prompt = tokens(B=1, T=4)
    with torch.no_grad():  # the top 3 logits within 1 of each other: neither T nor the top-k cut is negligible
        top = model(prompt)[0][0, -1].topk(3).values
        model.norm.weight.mul_(1.0 / (top[0] - top[2]))
        logits = model(prompt)[0][0, -1].double()
    n = 20_000
    expected = truncated_tempered_softmax(logits, temperature, top_k or VOCAB)
    tolerance = 5 * torch.sqrt(expected * (1 - expected) / n) + 1e-9
    wrong = [truncated_tempered_softmax(logits, 1.0, top_k or VOCAB)]  # temperature ignored
    if top_k:
        wrong.append(truncated_tempered_softmax(logits, temperature, top_k - 1))  # one token too few kept
    assert all(((w - expected).abs() > 2 * tolerance).any() for w in wrong)  # each would be detected
    out = model.generate(prompt.expand(n, -1), max_new_tokens=1, temperature=temperature, top_k=top_k,
                         generator=torch.Generator().manual_seed(3))
    got = empirical_distribution(out[:, -1], VOCAB)
    assert ((got - expected).abs() <= tolerance).all(), (got, expected)


# ----------------------------------------------------------------------------- FLOPs

@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_flops_per_token_matches_counted_matmul_flops(pos):
    """MFU's numerator: flops_per_token(T) against the FLOPs torch counts in a dense forward + backward (every
    matmul, the (T x T) attention ones included: the PaLM convention counts attention unmasked)."""
    B, T = 2, 96
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=48, head_dim=16, vocab_size=VOCAB, block_size=T, pos=pos,
                          attn_backend="dense"))
    idx = tokens(B=B, T=T)
    with FlopCounterMode(display=False) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    counted = counter.get_total_flops() / (B * T)
    # Parameters outside any matmul (norm gains) are counted in 6N but do no matmul work.
    non_matmul = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert model.flops_per_token(T) - 6 * non_matmul == pytest.approx(counted, rel=0.01)
