"""One Llama-style GPT whose positional encoding is chosen by config (see positional.py).

Pre-norm RMSNorm blocks, SwiGLU MLP (hidden floor(8/3·n_embd)), learnable QK RMSNorm applied
*before* any rotation by default (so the relative law is exact; ``qk_norm="after"`` is the official
code's order), no biases, tied embeddings. The same forward serves training (no cache), prefill (empty
cache) and decoding (one token per step).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from lm_loss import DEFAULT_CHUNK_TOKENS, compute_dtype, lm_loss
from attention import attend, describe_backend, resolve_backend
from positional import BIASES, SKEW_EXP_MAX_NORM, KVShift, Rotation, build_bias, parse_pos


@dataclass(kw_only=True)
class GPTConfig:
    n_layer: int = 12  # transformer blocks
    n_head: int = 8  # attention heads per block
    n_kv_head: int | None = None  # key/value heads (grouped-query attention): a divisor of n_head, query head h reads
                                  # key/value head h // (n_head / n_kv_head); 1 = multi-query; none = n_head
    n_embd: int = 512  # width of the residual stream (the MLP is floor(8/3 n_embd) wide)
    head_dim: int = 64  # independent of n_embd / n_head (128 in the paper)
    vocab_size: int = 50304  # embedding rows: the tokenizer's ids padded up (GPT-2: 50257 -> 50304)
    block_size: int = 1024  # training context; the model itself runs at any length
    pos: str = "rope"  # a rotation: nope, rope, grape_m, grape_m_basis, grape_m_ctx; an additive bias: alibi,
                       # grape_a_q, grape_a_k, grape_a_qk, fox, grape_ap; or one of each joined by +, e.g.
                       # rope+grape_ap (positional.ROTATIONS, BIASES; the README's table says what each computes)
    window: int | None = None  # sliding window: a query at t sees keys t - window + 1 ... t; none = every key up to t
    global_every: int | None = None  # with a window: layers global_every, 2·global_every, ... (counting from 1) attend
                                     # to every key, the others are local (4: 3 local : 1 global; Gemma 3's 5 : 1 is 6);
                                     # none = every layer local
    kv_shift: bool = False  # KV-shift: each key and value mixed with the previous token's by a learned gate
    attn_backend: str = "auto"  # separable biases: "auto" (tile on CUDA in bf16/fp16, else lifted), "lifted", "tile"; or "dense"
    norm_eps: float = 1e-5  # epsilon of every RMSNorm
    qk_norm: str = "before"  # QK RMSNorm "before" the rotation (exact relative law) or "after" it (official code)
    # multiplicative encodings
    rope_base: float = 10000.0  # rope, grape_m*: θ_i = rope_base^(-2i/head_dim) (the initial spectrum)
    learn_spectrum: bool = True  # grape_m*: learn log θ (False freezes it: grape_m == rope)
    spectrum_per_head: bool = False  # grape_m*: one spectrum per head instead of one shared
    spectrum_scale: float = 1.0  # grape_m*: learn spectrum_scale·log θ (official: 16, so log θ learns 16x slower)
    ctx_temperature: float = 16.0  # grape_m_ctx: ω = sigmoid((W x + b) / ctx_temperature)
    ctx_init_increment: float = 1e-3  # grape_m_ctx: b = softplus⁻¹(this), W = 0 at init
    # additive encodings
    grape_a_omega_init: float = 1.0  # grape_a_*: ω_h = softplus(w_h) × ALiBi slope, softplus(w_h) = this at init
    fox_gate_bias_init: float = 0.0  # fox: forget-gate bias b_h at init
    p_head_dim: int = 8  # grape_ap: path-vector dimension per head
    p_norm_eps: float = 1e-5  # grape_ap: epsilon of p̂'s RMS norm; 0 = the dtype's machine epsilon (official)

    def __post_init__(self):
        rotation, bias = parse_pos(self.pos)
        if rotation != "nope" and self.head_dim % 2:
            raise ValueError(f"pos={self.pos!r} rotates coordinate pairs, so head_dim must be even (got {self.head_dim})")
        if bias == "grape_ap" and self.p_head_dim % 2:
            raise ValueError(f"grape_ap rotates its path vectors, so p_head_dim must be even (got {self.p_head_dim})")
        resolve_backend(self.attn_backend, None)  # validates the name
        if self.qk_norm not in ("before", "after"):
            raise ValueError(f"qk_norm must be 'before' or 'after' (the rotation), not {self.qk_norm!r}")
        for name, value in ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self)):
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"GPTConfig.{name} must be a finite number (got {value})")
        positive = ("norm_eps", "rope_base", "spectrum_scale", "ctx_temperature", "ctx_init_increment",
                    "grape_a_omega_init")  # divisors, logarithms, inverse softplus: 0 or less has no meaning
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be positive (got {getattr(self, name)})")
        if self.p_norm_eps < 0:
            raise ValueError(f"GPTConfig.p_norm_eps must be at least 0 (got {self.p_norm_eps}; 0 = the dtype's epsilon)")
        for name in ("n_layer", "n_head", "n_embd", "head_dim", "vocab_size", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be positive (got {getattr(self, name)})")
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        for name in ("n_kv_head", "window", "global_every"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"GPTConfig.{name} must be a positive integer (got {value!r})")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head}): each key/value head "
                             f"serves the same number of query heads")
        if self.global_every is not None and self.window is None:
            raise ValueError(f"global_every ({self.global_every}) picks the layers that ignore the window, so it needs "
                             "a window; set window or drop global_every")

    def layer_window(self, layer: int) -> int | None:
        """The window of block `layer` (0-based): None where it attends to every earlier key."""
        if self.global_every is not None and (layer + 1) % self.global_every == 0:
            return None
        return self.window

    @classmethod
    def from_dict(cls, values: dict) -> "GPTConfig":
        fields = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in fields:
                close = difflib.get_close_matches(key, fields, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(fields)}"
                raise ValueError(f"unknown model config key {key!r}{hint}")
        return cls(**values)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        work = torch.promote_types(x.dtype, torch.float32)  # bf16 normalised in fp32; fp64 stays fp64
        return F.rms_norm(x.to(work), (x.shape[-1],), self.weight.to(work), self.eps).to(x.dtype)


class LayerCache:
    """One layer's KV cache: preallocated buffers with the time axis at dim 2 (keys as attention consumes them,
    i.e. rotated, with n_kv_head heads; values; the bias's key features), plus the running state of the encodings
    (FoX's log-gate sum, the contextual phase, KV-shift's previous k and v), which covers every earlier token
    whatever the window.

    A layer with a window keeps min(window - 1, max_len) slots, a ring buffer (slot = token index mod (window - 1))
    once it is full: a query at t needs keys t - window + 1 ... t only, the new tokens and the window - 1 before
    them, and every encoding's key side is per token (rotated keys, gates, running sums taken from position 0,
    GRAPE-AP's r, whose path sums lie inside the window), so the ring and the running state reproduce the full
    forward exactly. A ring never fills."""

    def __init__(self, max_len: int, start_pos: int, window: int | None):
        self.max_len = max_len
        self.window = window
        self.start_pos = start_pos  # absolute position of the first token
        self.length = 0  # tokens appended so far
        self.buffers: dict[str, torch.Tensor] = {}
        self.state: dict[str, torch.Tensor] = {}

    @property
    def capacity(self) -> int:
        return self.max_len if self.window is None else min(self.window - 1, self.max_len)

    @property
    def is_ring(self) -> bool:
        """Whether the buffers hold all the window needs (they wrap around and never fill)."""
        return self.window is not None and self.capacity == self.window - 1

    def append(self, tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Store the new tokens' tensors; return the keys attention reads, in position order and ending with the new
        ones (every cached token, or a ring's last window - 1 before the new ones), and their absolute positions."""
        new = next(iter(tensors.values())).shape[2]
        end, capacity = self.length + new, self.capacity
        if end > capacity and not self.is_ring:
            raise ValueError(f"KV cache is full: {end} positions needed, {self.max_len} allocated; "
                             f"create it with model.new_cache(batch_size, max_len={end}) or larger")
        for name, t in tensors.items():
            if name not in self.buffers:
                self.buffers[name] = t.new_zeros(*t.shape[:2], capacity, *t.shape[3:])
        device = next(iter(tensors.values())).device
        if end <= capacity:  # nothing has wrapped: the buffers hold every token in order
            first, views = 0, {}
            for name, t in tensors.items():
                self.buffers[name][:, :, self.length:end] = t
                views[name] = self.buffers[name][:, :, :end]
        else:  # a ring of window - 1 slots: the last window - 1 tokens in order, then the new ones
            first = max(0, self.length - capacity)
            held = torch.arange(first, self.length, device=device) % max(capacity, 1)  # (window 1: none held)
            views = {name: torch.cat((self.buffers[name].index_select(2, held), t), dim=2)
                     for name, t in tensors.items()}
            kept = min(new, capacity)  # a chunk longer than the ring leaves only its last tokens
            slots = torch.arange(end - kept, end, device=device) % max(capacity, 1)
            for name, t in tensors.items():
                self.buffers[name].index_copy_(2, slots, t[:, :, new - kept:])
        self.length = end
        return views, torch.arange(self.start_pos + first, self.start_pos + end, device=device)

    def nbytes(self) -> int:
        """Bytes of the cached tensors: the buffers and the running state."""
        return sum(t.numel() * t.element_size() for t in (*self.buffers.values(), *self.state.values()))


class KVCache:
    def __init__(self, n_layer: int, max_len: int, start_pos: int = 0, windows: list[int | None] | None = None):
        windows = windows or [None] * n_layer
        self.layers = [LayerCache(max_len, start_pos, window) for window in windows]
        self.start_pos = start_pos  # absolute position of the first cached token
        self.pos = start_pos  # absolute position of the next token

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)


class CausalSelfAttention(nn.Module):
    """Grouped-query attention: the fused projection's rows are n_head query heads, then n_kv_head key heads and
    n_kv_head value heads (n_kv_head = n_head: multi-head, the layout of q, k, v thirds); query head h reads key
    head h // (n_head / n_kv_head). `window`: this layer's sliding window (None: every earlier key)."""

    def __init__(self, config: GPTConfig, window: int | None = None):
        super().__init__()
        H, Hkv, d, C = config.n_head, config.n_kv_head, config.head_dim, config.n_embd
        self.n_head, self.n_kv_head, self.head_dim, self.scale = H, Hkv, d, 1.0 / math.sqrt(d)
        self.window = window
        self.qkv = nn.Linear(C, (H + 2 * Hkv) * d, bias=False)
        self.proj = nn.Linear(H * d, C, bias=False)
        self.q_norm = RMSNorm(d, config.norm_eps)
        self.k_norm = RMSNorm(d, config.norm_eps)
        rotation, bias = parse_pos(config.pos)
        self.rotation = Rotation(rotation, n_head=Hkv, head_dim=d, n_embd=C, base=config.rope_base,
                                 learn_spectrum=config.learn_spectrum,
                                 spectrum_per_head=config.spectrum_per_head,
                                 ctx_temperature=config.ctx_temperature,
                                 ctx_init_increment=config.ctx_init_increment,
                                 spectrum_scale=config.spectrum_scale)
        self.bias = build_bias(bias, n_head=H, head_dim=d, n_embd=C,
                               grape_a_omega_init=config.grape_a_omega_init,
                               fox_gate_bias_init=config.fox_gate_bias_init, p_head_dim=config.p_head_dim,
                               p_norm_eps=config.p_norm_eps, n_kv_head=Hkv)
        self.norm_after_rotation = config.qk_norm == "after"
        self.kv_shift = KVShift(Hkv, C) if config.kv_shift else None
        self.requested_backend = config.attn_backend

    def backend(self, device: torch.device, dtype: torch.dtype | None) -> str:
        return resolve_backend(self.requested_backend, self.bias, device, dtype, self.head_dim)

    def forward(self, x, positions, cache: LayerCache | None = None):
        B, T, _ = x.shape
        state = cache.state if cache is not None else {}
        heads = self.qkv(x).view(B, T, self.n_head + 2 * self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k, v = heads.split((self.n_head, self.n_kv_head, self.n_kv_head), dim=1)
        if self.kv_shift is not None:
            k, v = self.kv_shift(x, k, v, state)
        # Positional features, gates, phases and cumulative sums in fp32 even under bf16 autocast. The bias
        # features (GRAPE-A's gates) read q and k normalised, as attention sees them.
        with torch.autocast(x.device.type, enabled=False):
            if self.norm_after_rotation:  # the official order: unequal gains of a rotated pair break the relative law
                q, k = self.rotation(q, k, x, positions, state)
            q, k = self.q_norm(q), self.k_norm(k)
            qf, kf = self.bias.features(x, q, k, positions, state) if self.bias is not None else ({}, {})
            if not self.norm_after_rotation:
                q, k = self.rotation(q, k, x, positions, state)
        backend = self.backend(x.device, v.dtype)  # v's dtype is the attention's (bf16 under autocast)
        k_positions = positions
        if cache is not None:
            stored, k_positions = cache.append({"k": k, "v": v, **{f"feature_{n}": f for n, f in kf.items()}})
            k, v = stored["k"], stored["v"]
            kf = {n: stored[f"feature_{n}"] for n in kf}
        y = attend(q, k, v, backend=backend, scale=self.scale, q_pos=positions, k_pos=k_positions, bias=self.bias,
                   qf=qf, kf=kf, window=self.window)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = math.floor(8 * config.n_embd / 3)
        self.gate = nn.Linear(config.n_embd, hidden, bias=False)
        self.up = nn.Linear(config.n_embd, hidden, bias=False)
        self.proj = nn.Linear(hidden, config.n_embd, bias=False)

    def forward(self, x):
        return self.proj(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, window: int | None = None):
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config, window)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, positions, cache=None):
        x = x + self.attn(self.attn_norm(x), positions, cache)
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, config.layer_window(i)) for i in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self._init_weights()
        # How training runs (set by train.py; the defaults are what every other caller expects): the loss from
        # targets (lm_loss.py: "plain" also returns the logits, the others return None for them and never
        # hold all of them), and the blocks whose activations are recomputed in the backward pass instead of
        # kept (activation checkpointing).
        self.loss_impl = "plain"
        self.loss_chunk_tokens = DEFAULT_CHUNK_TOKENS
        self.checkpointed_blocks: frozenset[int] = frozenset()

    def set_activation_checkpointing(self, mode: str, every: int = 2) -> None:
        """none: keep every block's activations; blocks: recompute every block's in the backward pass (only its
        input is kept); every_k: recompute blocks every-1, 2·every-1, ... (every `every`-th block)."""
        self.checkpointed_blocks = frozenset(checkpointed_blocks(mode, self.config.n_layer, every))

    def _init_weights(self):
        # The official init; positional modules (rotation, bias, kv_shift) keep their own.
        cfg = self.config
        nn.init.normal_(self.wte.weight, std=0.02)
        std = 0.5 / math.sqrt(cfg.n_embd)
        for block in self.blocks:
            for linear in (block.attn.qkv, block.mlp.gate, block.mlp.up):
                nn.init.normal_(linear.weight, std=std)
            for linear in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(linear.weight, std=std / math.sqrt(cfg.n_layer))

    def extra_repr(self):
        backend = self.attention_backend
        cfg = self.config
        windows = ", ".join("full" if w is None else str(w) for w in (cfg.layer_window(i) for i in range(cfg.n_layer)))
        return (f"pos={cfg.pos}, kv_shift={cfg.kv_shift}, n_head={cfg.n_head}, n_kv_head={cfg.n_kv_head}, "
                f"windows per layer=[{windows}], attention backend={backend} ({describe_backend(backend)})")

    @property
    def attention_backend(self) -> str:
        """The backend the attention layers run on the model's current device, under bf16 autocast on
        CUDA (as train.py runs) and in the weights' dtype elsewhere."""
        device = self.wte.weight.device
        dtype = torch.bfloat16 if device.type == "cuda" else self.wte.weight.dtype
        return self.blocks[0].attn.backend(device, dtype)

    def basis_overflow(self) -> torch.Tensor:
        """max over layers of ‖A − Aᵀ‖₁ / SKEW_EXP_MAX_NORM for grape_m_basis (past 1, exp(A − Aᵀ) is NaN), else 0:
        a device scalar, so a training step can check it without waiting for the GPU."""
        norms = [(r.basis_generator - r.basis_generator.T).detach().float().abs().sum(0).max()
                 for r in (block.attn.rotation for block in self.blocks) if hasattr(r, "basis_generator")]
        if not norms:
            return torch.zeros((), device=self.wte.weight.device)
        return torch.stack(norms).max() / SKEW_EXP_MAX_NORM

    def nonfinite_cause(self) -> str:
        """A clause naming a known cause of a NaN loss in the weights, or "" if none is found."""
        for i, block in enumerate(self.blocks):
            rotation = block.attn.rotation
            if hasattr(rotation, "basis_generator"):
                with torch.no_grad():
                    generator = rotation.basis_generator.float()
                    norm = (generator - generator.T).abs().sum(0).max().item()
                if norm > SKEW_EXP_MAX_NORM:  # (a NaN generator is a symptom, not this cause)
                    return (f" (layer {i}'s learned basis generator A - Aᵀ has 1-norm {norm:.3g}, beyond the "
                            f"{SKEW_EXP_MAX_NORM:g} up to which exp(A - Aᵀ) is computed)")
        return ""

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward), PaLM convention: 6N for the weights (the
        tied lm_head matmul included) plus 12·L·H·d·T for the attention scores and values (a layer with a
        window narrower than T counts the window instead of T)."""
        cfg = self.config
        keys = sum(min(seq_len, cfg.layer_window(i) or seq_len) for i in range(cfg.n_layer))
        return 6 * self.num_params() + 12 * cfg.n_head * cfg.head_dim * keys

    def new_cache(self, batch_size: int, max_len: int, start_pos: int = 0) -> KVCache:
        """A cache for up to max_len tokens (layers with a narrower window keep a ring of that many)."""
        del batch_size  # buffers take their batch size from the first tokens appended
        cfg = self.config
        return KVCache(cfg.n_layer, max_len, start_pos, [cfg.layer_window(i) for i in range(cfg.n_layer)])

    def forward(self, idx, targets=None, start_pos: int = 0, cache: KVCache | None = None,
                last_logits: int | None = None):
        """idx (B, T) token ids; start_pos is the absolute position of idx[:, 0] (taken from the cache
        when one is given). Returns fp32 logits (fp64 in a float64 model) (B, T, vocab) and the mean cross-entropy over targets
        that are not -1 (None without targets); with targets and a loss_impl other than "plain", the logits
        are None (they are never held in full). last_logits=n returns the logits of the last n positions only
        (B, n, vocab; 0 for none): a prefill that needs only its end skips the output layer elsewhere."""
        T = idx.shape[1]
        if cache is not None:
            start_pos = cache.pos
        positions = torch.arange(start_pos, start_pos + T, device=idx.device)
        x = self.wte(idx)
        recompute = cache is None and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if recompute and i in self.checkpointed_blocks:
                x = torch.utils.checkpoint.checkpoint(block, x, positions, None, use_reentrant=False)
            else:
                x = block(x, positions, cache.layers[i] if cache is not None else None)
        if cache is not None:
            cache.pos += T
        if last_logits is not None:
            if targets is not None:
                raise ValueError("last_logits and targets cannot be combined: the loss needs every position's logits")
            x = x[:, T - last_logits:]
        if targets is not None and self.loss_impl != "plain":
            return None, lm_loss(self.loss_impl, self.norm(x), self.lm_head.weight, targets, self.loss_chunk_tokens)
        # (the head's input in the weight's dtype: under FSDP's bf16 parameters there is no autocast to cast it)
        logits = self.lm_head(self.norm(x).to(compute_dtype(self.lm_head.weight)))
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32, or fp64 in a float64 model
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None):
        """Sample max_new_tokens after idx with the KV cache: one prefill, then one token per step.
        temperature 0 is greedy."""
        cache = self.new_cache(idx.shape[0], idx.shape[1] + max_new_tokens)
        logits, _ = self(idx, cache=cache)
        out = [idx]
        for step in range(max_new_tokens):
            next_token = sample_next(logits[:, -1].float(), temperature, top_k, generator)[:, None]
            out.append(next_token)
            if step + 1 < max_new_tokens:
                logits, _ = self(next_token, cache=cache)
        return torch.cat(out, dim=1)


def checkpointed_blocks(mode: str, n_layer: int, every: int = 2) -> list[int]:
    """The blocks whose activations train.activation_checkpointing = mode recomputes (see
    GPT.set_activation_checkpointing)."""
    if mode == "none":
        return []
    if mode == "blocks":
        return list(range(n_layer))
    if mode == "every_k":
        if every < 1:
            raise ValueError(f"activation_checkpointing_every must be at least 1, not {every}")
        return [i for i in range(n_layer) if (i + 1) % every == 0]
    raise ValueError(f"activation_checkpointing must be none, blocks or every_k, not {mode!r}")


def sample_next(logits, temperature=0.0, top_k=None, generator=None):
    """Next token per row from (B, vocab) fp32 logits: greedy at temperature 0, else softmax
    sampling at that temperature, restricted to the top_k most likely tokens when given."""
    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(int(top_k), logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


__all__ = ["GPT", "GPTConfig", "KVCache", "BIASES", "sample_next"]
