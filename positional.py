"""The positional encodings of the GRAPE paper behind one small interface.

Every encoding contributes up to two parts, mirroring the paper's families, and attention composes
whatever it gets:

* a ``Rotation`` (multiplicative GRAPE, SO(d)): rotates q and k at given positions (or contextual
  phases) before the dot product: ``nope``, ``rope``, ``grape_m``, ``grape_m_basis``, ``grape_m_ctx``;
* an ``AdditiveBias`` (additive GRAPE, the GL(d+2) unipotent lift): a logit bias b(t, j) built from
  per-token query features and key features. Separable biases (``alibi``, ``grape_a_*``, ``fox``) can
  also be written as a few *lifted columns* appended to q and k whose dot product equals the bias up to
  a per-query constant (softmax ignores it), so they run through fused causal attention. ``grape_ap``
  is not separable and needs its own kernel.

Key features are what the KV cache stores beside the keys, so training, prefill and decoding are the
same code: features are computed per token from explicit absolute positions and a running state
(FoX's cumulative log-gate, the contextual phase, the previous key and value for KV-shift).
Everything positional is computed in fp32.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ROTATIONS = ("nope", "rope", "grape_m", "grape_m_basis", "grape_m_ctx")
BIASES = ("alibi", "grape_a_q", "grape_a_k", "grape_a_qk", "fox", "grape_ap")
ENCODINGS = ROTATIONS + BIASES


def parse_pos(name: str) -> tuple[str, str | None]:
    """Split a config value such as ``rope``, ``fox`` or ``rope+grape_ap`` into (rotation, bias)."""
    parts = [p.strip() for p in name.split("+")] if isinstance(name, str) else [name]
    unknown = [p for p in parts if p not in ENCODINGS]
    if unknown or not 1 <= len(parts) <= 2:
        raise ValueError(
            f"unknown positional encoding {name!r}: use one of {', '.join(ENCODINGS)}, or one rotation "
            f"and one additive encoding joined by '+' (e.g. 'rope+grape_ap', 'grape_m+alibi')")
    rotations = [p for p in parts if p in ROTATIONS]
    biases = [p for p in parts if p in BIASES]
    if len(rotations) > 1 or len(biases) > 1:
        raise ValueError(f"positional encoding {name!r} combines two encodings of the same family; "
                         f"combine at most one of {ROTATIONS} with one of {BIASES}")
    return (rotations[0] if rotations else "nope"), (biases[0] if biases else None)


def per_query_head(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """A key-side tensor (B|1, H_kv, T, ..) repeated for each query head of its group, (B|1, n_head, T, ..): query
    head h reads key head h // (n_head / H_kv). Tensors with one head (or all n_head of them) are returned as they
    are."""
    if x.dim() < 3 or x.shape[1] in (1, n_head):
        return x
    return x.repeat_interleave(n_head // x.shape[1], dim=1)


def alibi_slopes(n_head: int) -> torch.Tensor:
    """The standard ALiBi slopes 2^(-8h/H); for H not a power of two, the slopes of the next lower
    power of two followed by every other slope of the next higher one (Press et al.)."""
    def power_of_two_slopes(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    if n_head & (n_head - 1) == 0:
        slopes = power_of_two_slopes(n_head)
    else:
        lower = 2 ** math.floor(math.log2(n_head))
        slopes = power_of_two_slopes(lower) + power_of_two_slopes(2 * lower)[0::2][: n_head - lower]
    return torch.tensor(slopes)


def inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


def rank2_exp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """exp(L) for the rank-2 skew generator L = a bᵀ - b aᵀ in closed form (Rodrigues):
    exp(L) = I + (sin s / s) L + ((1 - cos s) / s²) L², with s² = |a|²|b|² - (a·b)².
    Near s = 0 the two coefficients use their Taylor series, so the formula is exact to fp precision."""
    L = torch.outer(a, b) - torch.outer(b, a)
    s2 = (a @ a) * (b @ b) - (a @ b) ** 2
    s2 = s2.clamp_min(0.0)
    s = s2.sqrt()
    small = s < 1e-3
    safe_s = torch.where(small, torch.ones_like(s), s)
    sin_coeff = torch.where(small, 1 - s2 / 6 + s2 * s2 / 120, torch.sin(safe_s) / safe_s)
    cos_coeff = torch.where(small, 0.5 - s2 / 24 + s2 * s2 / 720, (1 - torch.cos(safe_s)) / safe_s**2)
    eye = torch.eye(a.numel(), dtype=a.dtype, device=a.device)
    return eye + sin_coeff * L + cos_coeff * (L @ L)


# exp by scaling and squaring: a degree-8 Taylor polynomial of X/2^s with ‖X/2^s‖₁ <= radius leaves a
# remainder below radius⁹/9!: 5e-9 at 1/2 (fp32's unit roundoff is 6e-8), 8e-20 at 1/32 (fp64: 1.1e-16).
_TAYLOR = [1.0 / math.factorial(k) for k in range(9)]
SKEW_EXP_MAX_NORM = 2048.0  # ‖X‖₁ up to here (an average |entry| of 16 at d = 128); beyond it, NaN


def skew_exp(x: torch.Tensor) -> torch.Tensor:
    """exp(X) of a square matrix (or a batch) by scaling and squaring, with no host synchronisation.

    torch.linalg.matrix_exp picks its approximation on the host from ‖X‖: on CUDA each call (and its
    backward, a matrix_exp of a 2d x 2d block matrix) copies the norm to the CPU and waits for the GPU,
    once per layer per step. Here everything stays on the device: s = ⌈log2(‖X‖₁ / radius)⌉ squarings,
    each applied or skipped by ``torch.where`` (a fixed graph that compiles), after a degree-8 Taylor
    polynomial of X/2^s by Paterson-Stockmeyer (4 products); autograd differentiates through it all.
    Beyond ‖X‖₁ = SKEW_EXP_MAX_NORM the result is NaN rather than silently inaccurate."""
    radius = 2.0 ** -5 if x.dtype == torch.float64 else 0.5
    max_steps = math.ceil(math.log2(SKEW_EXP_MAX_NORM / radius))
    norm = x.abs().sum(dim=-2).amax(dim=-1)  # the 1-norm: the largest column sum
    steps = torch.ceil(torch.log2(norm.clamp_min(1e-30) / radius)).clamp(0, max_steps)
    scaled = x / torch.exp2(steps)[..., None, None]
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
    x2 = scaled @ scaled
    x3 = x2 @ scaled
    x4 = x2 @ x2
    c = _TAYLOR
    result = c[0] * eye + c[1] * scaled + c[2] * x2 + c[3] * x3 + x4 @ (
        c[4] * eye + c[5] * scaled + c[6] * x2 + c[7] * x3 + c[8] * x4)
    for i in range(max_steps):
        result = torch.where((steps > i)[..., None, None], result @ result, result)
    too_large = (norm > SKEW_EXP_MAX_NORM)[..., None, None]
    return torch.where(too_large, torch.full_like(result, float("nan")), result)


def fp32(x: torch.Tensor) -> torch.Tensor:
    """x in fp32, or in fp64 if it already is (the exactness tests run in fp64)."""
    return x if x.dtype == torch.float64 else x.float()


def rotate_planes(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate each coordinate pair (i, i + d/2) of x by angles[..., i], in fp32.

    This is exp(Σ_i angle_i L_i) with L_i = e_{i+d/2} e_iᵀ - e_i e_{i+d/2}ᵀ: commuting planes, so
    rotate(x, a)·rotate(y, b) depends only on a - b (the relative law)."""
    x1, x2 = fp32(x).chunk(2, dim=-1)
    angles = angles.to(x1.dtype)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


def rms_normalize(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps); eps = 0 means the machine epsilon of x's dtype (F.rms_norm's default)."""
    eps = eps or torch.finfo(x.dtype).eps
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


# --------------------------------------------------------------------------------------------------
# Multiplicative GRAPE: rotations of q and k


class Rotation(nn.Module):
    """SO(d) action on q and k. ``forward(q, k, x, positions, state)`` returns rotated q, k.

    Angles are (B|1, H|1, T, d/2) fp32: position (or contextual phase) times the plane frequencies
    θ_i. ``rope`` fixes θ_i = base^(-2i/d); ``grape_m*`` learn log θ (initialised to the same values,
    so with learning frozen they equal ``rope`` bit for bit); ``grape_m_basis`` rotates in a learned
    orthogonal basis B = exp(A - Aᵀ) (B = I at init), which is enough because Bᵀ cancels in q̃·k̃;
    ``grape_m_ctx`` replaces the position by the phase Φ_t = Σ_{τ<t} ω_τ with ω_τ ≥ 0 from the layer
    input (one Φ shared by all heads).

    Under grouped-query attention the rotation acts on the shared key head, so ``n_head`` here is the number of key
    heads: a per-head spectrum is one per key head, and each query head turns by its group's (the relative law
    q_t·k_j needs the same angles on both sides).

    ``spectrum_scale`` s ≠ 1 stores the learned spectrum as the parameter ``scaled_log_theta`` = s·log θ
    (the official code's ``log_freq`` with s = 16): AdamW moves a parameter by about lr per step whatever
    its scale, so log θ then moves s times more slowly. The parameter is named differently from the
    unscaled ``log_theta`` so that weights saved under one parametrisation cannot load under the other."""

    def __init__(self, kind: str, *, n_head: int, head_dim: int, n_embd: int, base: float,
                 learn_spectrum: bool, spectrum_per_head: bool, ctx_temperature: float,
                 ctx_init_increment: float, spectrum_scale: float = 1.0):
        super().__init__()
        self.kind = kind
        if kind == "nope":
            return
        if head_dim % 2:
            raise ValueError(f"pos={kind!r} rotates coordinate pairs, so head_dim must be even (got {head_dim})")
        # log θ_i = -(2i/d) ln base in fp64: a fixed spectrum (rope, or grape_m with learning frozen) stays fp64
        # and θ is rounded to fp32 once, at use (the most accurate fp32 θ; fp64 models keep it exact). A learned
        # spectrum is a parameter of the default dtype holding the rounded log θ.
        log_theta = -(torch.arange(head_dim // 2, dtype=torch.float64) * 2 / head_dim) * math.log(base)
        if kind == "rope":
            self.register_buffer("log_theta", log_theta, persistent=False)
        else:
            if spectrum_per_head:
                log_theta = log_theta.expand(n_head, -1).clone()
            if learn_spectrum and spectrum_scale != 1:
                self.spectrum_scale = spectrum_scale
                self.scaled_log_theta = nn.Parameter((log_theta * spectrum_scale).to(torch.get_default_dtype()))
            elif learn_spectrum:
                self.log_theta = nn.Parameter(log_theta.to(torch.get_default_dtype()))
            else:
                self.register_buffer("log_theta", log_theta)
        if kind == "grape_m_basis":
            self.basis_generator = nn.Parameter(torch.zeros(head_dim, head_dim))
        if kind == "grape_m_ctx":
            self.ctx_temperature = ctx_temperature
            self.phase_increment = nn.Linear(n_embd, 1)
            nn.init.zeros_(self.phase_increment.weight)
            nn.init.constant_(self.phase_increment.bias, inverse_softplus(ctx_init_increment))

    def extra_repr(self):
        return f"kind={self.kind}"

    def spectrum(self) -> torch.Tensor:
        """log θ in fp32 (fp64 stays fp64): (d/2,) or per head (H, d/2)."""
        if hasattr(self, "scaled_log_theta"):
            return fp32(self.scaled_log_theta) / self.spectrum_scale
        return fp32(self.log_theta)

    def basis(self) -> torch.Tensor:
        return skew_exp(fp32(self.basis_generator - self.basis_generator.T))

    def frequencies(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """θ = exp(log θ) in the spectrum's own precision, then in fp32 (or fp64 for an fp64 model)."""
        theta = self.spectrum().exp()
        return theta if dtype == torch.float64 else theta.float()

    def angles(self, x: torch.Tensor, positions: torch.Tensor, state: dict,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        """Position (or phase) times θ, fp32; fp64 when `dtype` (by default x's) is."""
        theta = self.frequencies(dtype or (x.dtype if x is not None else torch.float32))
        if theta.dim() == 2:  # per head: (H, d/2) -> (1, H, 1, d/2)
            theta = theta[None, :, None, :]
        if self.kind == "grape_m_ctx":
            increments = torch.sigmoid(self.phase_increment(fp32(x)).squeeze(-1) / self.ctx_temperature)
            previous = state.get("phase", torch.zeros(x.shape[0], device=x.device))
            inclusive = previous[:, None] + torch.cumsum(increments, dim=1)
            phase = inclusive - increments  # exclusive: Φ_t = Σ_{τ<t} ω_τ
            state["phase"] = inclusive[:, -1]
            return phase[:, None, :, None] * theta
        return fp32(positions)[:, None] * theta

    def forward(self, q, k, x, positions, state):
        if self.kind == "nope":
            return q, k
        if self.kind == "grape_m_basis":
            basis = self.basis().to(q.dtype)
            q, k = q @ basis, k @ basis  # row vectors: (Bᵀ q)ᵀ = qᵀ B
        angles = self.angles(x, positions, state, q.dtype)
        q_angles = per_query_head(angles, q.shape[1]) if angles.dim() == 4 else angles
        return rotate_planes(q, q_angles), rotate_planes(k, angles)


# --------------------------------------------------------------------------------------------------
# Additive GRAPE: logit biases b(t, j)


class AdditiveBias(nn.Module):
    """A logit bias b(t, j) for query t and key j <= t.

    ``features`` returns per-token query and key features (fp32 tensors with the time axis at dim 2;
    the KV cache stores the key features). ``dense`` is the formula as the paper writes it,
    (B, H, Tq, Tk). ``lift`` returns (q_cols, k_cols) with q_cols·k_cols = b(t, j) + c(t); ``None``
    when the bias is not separable (GRAPE-AP)."""

    separable = True

    def features(self, x, q, k, positions, state) -> tuple[dict, dict]:
        raise NotImplementedError

    def dense(self, qf: dict, kf: dict) -> torch.Tensor:
        raise NotImplementedError

    def lift(self, qf: dict, kf: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None

    def exact_query_columns(self) -> tuple[bool, ...]:
        """For each lifted query column: is it exact in bf16 whatever the input (a constant 1)? The
        bf16 lift (attention_kernels/lift.py) splits only the inexact ones into several parts."""
        return (True,)

    # The in-tile kernel's form (attention_kernels/separable.py): b(t, j) = -(t - j)(a_t + b_j) + (c_t - c_j),
    # with the terms an encoding has (rate: a or b, sum: c).
    has_rate = False
    has_sum = False

    def tile_features(self, qf: dict, kf: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-query (t, a_t, c_t) and per-key (j, b_j, c_j), fp32, (.., T, 3) each."""
        raise NotImplementedError


def _tile_columns(pos, rate, total) -> torch.Tensor:
    """Stack one side's (position, rate, running sum) into (.., T, 3); a 0 stands for an absent term."""
    columns = [torch.as_tensor(c, dtype=torch.float32, device=pos.device) for c in (pos, rate, total)]
    shape = torch.broadcast_shapes(*(c.shape for c in columns))
    return torch.stack([c.expand(shape) for c in columns], dim=-1)


def _positions_feature(positions: torch.Tensor) -> torch.Tensor:
    return fp32(positions)[None, None, :]  # (1, 1, T)


def _distance(qf, kf) -> torch.Tensor:
    return qf["pos"][..., :, None] - kf["pos"][..., None, :]  # t - j, (.., Tq, Tk)


class ALiBi(AdditiveBias):
    """b(t, j) = -β_h (t - j) with the standard slopes. Lift: -β(t - j) ≡ β j (drop -β t)."""

    def __init__(self, n_head: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_head), persistent=False)

    def features(self, x, q, k, positions, state):
        pos = _positions_feature(positions)
        return {"pos": pos}, {"pos": pos}

    def dense(self, qf, kf):
        return -self.slopes[:, None, None] * _distance(qf, kf)

    def lift(self, qf, kf):
        q_cols = torch.ones_like(qf["pos"])[..., None]
        k_cols = (self.slopes[:, None] * kf["pos"])[..., None]  # (1, H, Tk, 1)
        return q_cols, k_cols

    has_rate = True

    def tile_features(self, qf, kf):
        return (_tile_columns(qf["pos"], self.slopes[:, None].float(), 0.0),
                _tile_columns(kf["pos"], 0.0, 0.0))


class GatedSlope(AdditiveBias):
    """GRAPE-A with content-gated slopes: b(t, j) = -(t - j) ω_h [λ_q(q_t) + λ_k(k_j)],
    λ_q = softplus(v̂_h·q_t/√d), λ_k = softplus(û_h·k_j/√d) (û, v̂ unit vectors), ω_h = softplus(w_h) ×
    ALiBi slope. ``gates`` picks "q", "k" or "qk". The gates read the QK-normalised, unrotated q and k.
    Under grouped-query attention λ_k reads the shared key k_j, so û is one per key head (λ_k is then a property
    of the key, cached with it); v̂ and ω stay per query head, so the key side ω_h·λ_k,j carries a query head's
    factor (its lifted and tiled key features are per query head).

    Lift (drop the row constant -ω t λ_q,t): ω(j λ_q,t - t λ_k,j + j λ_k,j), i.e.
    q-side [λ_q,t, t, 1] against k-side [ω j, -ω λ_k,j, ω j λ_k,j] (the columns of the absent gate
    are left out)."""

    def __init__(self, n_head: int, head_dim: int, gates: str, omega_init: float, n_kv_head: int | None = None):
        super().__init__()
        self.gates = gates
        self.head_dim = head_dim
        self.register_buffer("slopes", alibi_slopes(n_head), persistent=False)
        self.rate = nn.Parameter(torch.full((n_head,), inverse_softplus(omega_init)))
        if "q" in gates:
            self.query_gate = nn.Parameter(torch.randn(n_head, head_dim) / math.sqrt(head_dim))
        if "k" in gates:
            self.key_gate = nn.Parameter(torch.randn(n_kv_head or n_head, head_dim) / math.sqrt(head_dim))

    def extra_repr(self):
        return f"gates={self.gates}"

    def omega(self):
        return F.softplus(fp32(self.rate)) * self.slopes  # (H,)

    def _gate(self, weight, x):
        unit = F.normalize(fp32(weight), dim=-1)
        # (B, H, T, d) @ (H, d, 1): a contiguous (B, H, T) result. (An einsum returned it head-major, whose
        # strides the compiled backward then predicted wrongly: a failed view in aot_eager, torch 2.13.)
        return F.softplus((fp32(x) @ unit[:, :, None]).squeeze(-1) / math.sqrt(self.head_dim))

    def features(self, x, q, k, positions, state):
        pos = _positions_feature(positions)
        qf, kf = {"pos": pos}, {"pos": pos}
        if "q" in self.gates:
            qf["lam"] = self._gate(self.query_gate, q)
        if "k" in self.gates:
            kf["lam"] = self._gate(self.key_gate, k)
        return qf, kf

    def dense(self, qf, kf):
        rate = 0.0
        if "q" in self.gates:
            rate = rate + qf["lam"][..., :, None]
        if "k" in self.gates:
            rate = rate + self._key_gate(kf)[..., None, :]
        return -_distance(qf, kf) * self.omega()[:, None, None] * rate

    def exact_query_columns(self):
        return ((False,) if "q" in self.gates else ()) + ((False, True) if "k" in self.gates else ())

    def _key_gate(self, kf) -> torch.Tensor:
        """λ_k of each key for each query head: (B, H, Tk)."""
        return per_query_head(kf["lam"], len(self.slopes))

    def lift(self, qf, kf):
        omega = self.omega()[:, None]  # (H, 1) against (.., H, T)
        j = kf["pos"]
        q_cols, k_cols = [], []
        if "q" in self.gates:
            q_cols.append(qf["lam"])
            k_cols.append(omega * j)
        if "k" in self.gates:
            t = qf["pos"]
            q_cols += [t, torch.ones_like(t)]
            lam = self._key_gate(kf)
            k_cols += [-omega * lam, omega * j * lam]
        shape_q = torch.broadcast_shapes(*(c.shape for c in q_cols))
        shape_k = torch.broadcast_shapes(*(c.shape for c in k_cols))
        return (torch.stack([c.expand(shape_q) for c in q_cols], dim=-1),
                torch.stack([c.expand(shape_k) for c in k_cols], dim=-1))

    has_rate = True

    def tile_features(self, qf, kf):
        omega = self.omega()[:, None]
        q_rate = omega * qf["lam"] if "q" in self.gates else 0.0
        k_rate = omega * self._key_gate(kf) if "k" in self.gates else 0.0
        return _tile_columns(qf["pos"], q_rate, 0.0), _tile_columns(kf["pos"], k_rate, 0.0)


class ForgetGate(AdditiveBias):
    """FoX: f_t = sigmoid(w_h·x_t + b_h), b(t, j) = Σ_{ℓ=j+1}^{t} log f_ℓ = c_t - c_j with the running
    sum c_u = Σ_{ℓ<=u} log f_ℓ (carried across cache steps). Lift: c_t - c_j ≡ -c_j.
    Under grouped-query attention the gates stay per query head: the bias is a path sum of head h's own gates
    (one gate per group would give the group one decay), so the cached key feature c has H heads (one number per
    token and query head, beside H_kv heads of k and v)."""

    def __init__(self, n_head: int, n_embd: int, bias_init: float):
        super().__init__()
        self.gate = nn.Linear(n_embd, n_head)
        nn.init.normal_(self.gate.weight, std=0.5 / math.sqrt(n_embd))
        nn.init.constant_(self.gate.bias, bias_init)

    def features(self, x, q, k, positions, state):
        log_f = F.logsigmoid(self.gate(fp32(x))).transpose(1, 2)  # (B, H, T)
        previous = state.get("log_gate_sum", torch.zeros_like(log_f[..., 0]))
        c = previous[..., None] + torch.cumsum(log_f, dim=-1)
        state["log_gate_sum"] = c[..., -1]
        return {"c": c}, {"c": c}

    def dense(self, qf, kf):
        return qf["c"][..., :, None] - kf["c"][..., None, :]

    def lift(self, qf, kf):
        return torch.ones_like(qf["c"])[..., None], -kf["c"][..., None]

    has_sum = True

    def tile_features(self, qf, kf):
        # no distance term, so the position column stays 0
        return (_tile_columns(torch.zeros_like(qf["c"]), 0.0, qf["c"]),
                _tile_columns(torch.zeros_like(kf["c"]), 0.0, kf["c"]))


class PathIntegral(AdditiveBias):
    """GRAPE-AP: ψ(t, ℓ) = α_h logsigmoid(⟨p_t, R_ℓ p̂_ℓ⟩ / d_p) <= 0, b(t, j) = Σ_{ℓ=j+1}^{t} ψ(t, ℓ).

    p = a per-head linear projection of the layer input (d_p each); the query side uses p_t as is, the
    key side its parameter-free RMS norm rotated by R_ℓ (angle ℓ in every plane: RoPE with base 1),
    so ψ depends on absolute ℓ. Query features: p_t / d_p; key features: r_ℓ = R_ℓ p̂_ℓ (cached).
    ``norm_eps`` is the epsilon of that RMS norm (0: the dtype's machine epsilon, as the official code).

    Grouped-query attention: p_t and α_h belong to the query head, r_ℓ (from token ℓ alone, cached with k_ℓ)
    to the shared key head. A key head's path vector before the norm is the mean of its group's p: the
    mean-pooling by which grouped-query attention builds a key head from multi-head weights (Ainslie et al.,
    2023), with no new parameters; with one query head per key head it is the paper's r_ℓ = R_ℓ p̂_ℓ."""

    separable = False

    def __init__(self, n_head: int, n_embd: int, p_head_dim: int, norm_eps: float = 1e-5, n_kv_head: int | None = None):
        super().__init__()
        if p_head_dim % 2:
            raise ValueError(f"grape_ap rotates its path vectors in planes, so p_head_dim must be even "
                             f"(got {p_head_dim})")
        self.n_head, self.p_head_dim, self.norm_eps = n_head, p_head_dim, norm_eps
        self.n_kv_head = n_kv_head or n_head
        self.path = nn.Linear(n_embd, n_head * p_head_dim, bias=False)
        nn.init.normal_(self.path.weight, std=0.5 / math.sqrt(n_embd))
        self.register_buffer("slopes", alibi_slopes(n_head), persistent=False)

    def features(self, x, q, k, positions, state):
        B, T, _ = x.shape
        p = self.path(fp32(x)).view(B, T, self.n_head, self.p_head_dim).transpose(1, 2)
        angles = fp32(positions)[:, None].expand(T, self.p_head_dim // 2)
        key_p = p.unflatten(1, (self.n_kv_head, -1)).mean(2) if self.n_kv_head != self.n_head else p
        r = rotate_planes(rms_normalize(key_p, self.norm_eps), angles)
        return {"p": p / self.p_head_dim, "pos": _positions_feature(positions)}, \
               {"r": r, "pos": _positions_feature(positions)}

    def edge_potentials(self, qf, kf) -> torch.Tensor:
        """ψ(t, ℓ) for every query t and key ℓ, zero where ℓ > t: (B, H, Tq, Tk)."""
        r = per_query_head(kf["r"], self.n_head)
        psi = self.slopes[:, None, None] * F.logsigmoid(qf["p"] @ r.transpose(-1, -2))
        return psi.masked_fill(_distance(qf, kf) < 0, 0.0)

    def dense(self, qf, kf):
        return path_sum(self.edge_potentials(qf, kf))


def path_sum(psi: torch.Tensor) -> torch.Tensor:
    """b(t, j) = Σ_{j<ℓ<=t} ψ(t, ℓ) from edge potentials ψ (.., Tq, Tk) that are zero for ℓ > t."""
    left_sums = torch.cumsum(psi, dim=-1)  # Σ_{ℓ<=j} ψ(t, ℓ)
    return left_sums[..., -1:] - left_sums


class KVShift(nn.Module):
    """KV-shift: k'_t = a_t k_{t-1} + (1 - a_t) k_t, and the same for v with its own gate,
    a_t = sigmoid(W x_t) per head, k_{-1} = 0. The previous raw k and v are carried in the cache. Under
    grouped-query attention it mixes the shared key and value heads: n_head is the number of key heads."""

    def __init__(self, n_head: int, n_embd: int):
        super().__init__()
        self.gate = nn.Linear(n_embd, 2 * n_head, bias=False)
        nn.init.normal_(self.gate.weight, std=0.5 / math.sqrt(n_embd))

    def forward(self, x, k, v, state):
        a_k, a_v = torch.sigmoid(self.gate(x)).transpose(1, 2)[..., None].to(k.dtype).chunk(2, dim=1)
        shifted = []
        for name, t, a in (("prev_k", k, a_k), ("prev_v", v, a_v)):
            previous = state.get(name, torch.zeros_like(t[:, :, :1]))
            state[name] = t[:, :, -1:]
            shifted.append(a * torch.cat((previous, t[:, :, :-1]), dim=2) + (1 - a) * t)
        return shifted


def build_bias(kind: str | None, *, n_head: int, head_dim: int, n_embd: int, grape_a_omega_init: float,
               fox_gate_bias_init: float, p_head_dim: int, p_norm_eps: float = 1e-5,
               n_kv_head: int | None = None) -> AdditiveBias | None:
    if kind is None:
        return None
    if kind == "alibi":
        return ALiBi(n_head)
    if kind.startswith("grape_a_"):
        return GatedSlope(n_head, head_dim, kind.removeprefix("grape_a_"), grape_a_omega_init, n_kv_head)
    if kind == "fox":
        return ForgetGate(n_head, n_embd, fox_gate_bias_init)
    if kind == "grape_ap":
        return PathIntegral(n_head, n_embd, p_head_dim, p_norm_eps, n_kv_head)
    raise ValueError(f"unknown additive encoding {kind!r}; valid: {', '.join(BIASES)}")
