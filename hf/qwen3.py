"""Our `rope` architecture is Hugging Face's Qwen3ForCausalLM: the weight and config mapping, both ways.

Qwen3: pre-norm RMSNorm blocks (x·w gains), per-head q/k RMSNorm *before* rotate-half RoPE, SwiGLU, no
biases. Our fused qkv rows are q (n_head heads), k and v (n_kv_head heads each) in order (no permutation);
query head h reads key head h // (n_head / n_kv_head) in both (Qwen3's repeat_kv). Qwen3's sliding window of w lets
a query at t see keys t - w + 1 ... t (transformers' masking_utils: kv_idx > q_idx - w), exactly our `window`, and
its layer_types name each layer's kind, so our window with any global_every is written as it is. Qwen3's defaults
differ from ours (rms_norm_eps 1e-6, untied embeddings, ...), so every value is written explicitly.
"""
from __future__ import annotations

import math

import torch

ARCHITECTURE = "Qwen3ForCausalLM"


def native_problems(cfg: dict) -> list[str]:
    """Why Qwen3 cannot express the model config `cfg` (our GPTConfig as a dict); empty when it can."""
    problems = []
    if cfg["pos"] != "rope":
        problems.append(f"pos={cfg['pos']!r} (Qwen3 applies RoPE and nothing else)")
    if cfg["kv_shift"]:
        problems.append("kv_shift=True (Qwen3 has no KV-shift)")
    if cfg["qk_norm"] != "before":
        problems.append("qk_norm='after' (Qwen3 normalises q and k before RoPE; with unequal gains in a rotated "
                        "pair the order matters)")
    return problems


def intermediate_size(n_embd: int) -> int:
    return math.floor(8 * n_embd / 3)  # our SwiGLU hidden size


def layer_types(cfg: dict) -> list[str]:
    """Qwen3's kind of each layer under our window and global_every (layers global_every, 2·global_every, ...
    counting from 1 are full)."""
    every = cfg.get("global_every")
    return ["full_attention" if cfg.get("window") is None or (every and (i + 1) % every == 0) else "sliding_attention"
            for i in range(cfg["n_layer"])]


def qwen3_config(cfg: dict, eot: int) -> dict:
    """The complete config.json of a native export of model config `cfg`."""
    L = cfg["n_layer"]
    windowed = cfg.get("window") is not None
    return {
        "architectures": [ARCHITECTURE], "model_type": "qwen3", "dtype": "float32",
        "vocab_size": cfg["vocab_size"], "hidden_size": cfg["n_embd"],
        "intermediate_size": intermediate_size(cfg["n_embd"]), "num_hidden_layers": L,
        "num_attention_heads": cfg["n_head"], "num_key_value_heads": cfg.get("n_kv_head") or cfg["n_head"],
        "head_dim": cfg["head_dim"],
        "hidden_act": "silu", "max_position_embeddings": cfg["block_size"], "rms_norm_eps": cfg["norm_eps"],
        "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
        # both spellings of the RoPE base: recent transformers read rope_parameters, older loaders rope_theta
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_base"]}, "rope_theta": cfg["rope_base"],
        # layer_types decides; max_window_layers only fills layer_types in when it is absent
        "use_sliding_window": windowed, "sliding_window": cfg.get("window"), "max_window_layers": 0 if windowed else L,
        "layer_types": layer_types(cfg), "initializer_range": 0.02, "use_cache": True,
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": None,
    }


def _layer_names(i: int) -> dict[str, str]:
    """Our per-block parameter names -> Qwen3's (qkv is split separately)."""
    ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
    return {ours + "attn_norm.weight": theirs + "input_layernorm.weight",
            ours + "attn.q_norm.weight": theirs + "self_attn.q_norm.weight",
            ours + "attn.k_norm.weight": theirs + "self_attn.k_norm.weight",
            ours + "attn.proj.weight": theirs + "self_attn.o_proj.weight",
            ours + "mlp_norm.weight": theirs + "post_attention_layernorm.weight",
            ours + "mlp.gate.weight": theirs + "mlp.gate_proj.weight",
            ours + "mlp.up.weight": theirs + "mlp.up_proj.weight",
            ours + "mlp.proj.weight": theirs + "mlp.down_proj.weight"}


def to_qwen3(state: dict, n_layer: int, n_head: int | None = None, n_kv_head: int | None = None) -> dict:
    """Our state dict -> Qwen3's tensors (the tied lm_head is not stored: tie_word_embeddings). n_head, n_kv_head:
    the heads of the fused qkv rows (None: equal, the rows in thirds)."""
    out = {"model.embed_tokens.weight": state["wte.weight"], "model.norm.weight": state["norm.weight"]}
    for i in range(n_layer):
        out.update({theirs: state[ours] for ours, theirs in _layer_names(i).items()})
        qkv = state[f"blocks.{i}.attn.qkv.weight"]
        head_rows = qkv.shape[0] // (n_head + 2 * n_kv_head) if n_head else qkv.shape[0] // 3
        q, k, v = qkv.split([head_rows * n for n in ((n_head, n_kv_head, n_kv_head) if n_head else (1, 1, 1))])
        out.update({f"model.layers.{i}.self_attn.{n}_proj.weight": w for n, w in zip("qkv", (q, k, v))})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def model_config_from_qwen3(hf: dict) -> dict:
    """Our model config values for a Qwen3 config.json; ValueError (one sentence) when ours cannot express it."""
    def get(key, default=None):
        return hf.get(key, default)

    rope = get("rope_parameters") or get("rope_scaling") or {}
    theta = rope.get("rope_theta", get("rope_theta"))
    heads, hidden = get("num_attention_heads"), get("hidden_size")
    kv_heads = get("num_key_value_heads") or heads
    L = get("num_hidden_layers")
    window = get("sliding_window") if get("use_sliding_window", False) else None
    kinds = get("layer_types") or ["sliding_attention" if window is not None and i >= get("max_window_layers", L)
                                   else "full_attention" for i in range(L or 0)]
    global_every = _global_every(kinds)
    checks = [
        (get("model_type") == "qwen3" or ARCHITECTURE in (get("architectures") or []), "it is not a Qwen3 model"),
        (isinstance(kv_heads, int) and kv_heads >= 1 and heads % kv_heads == 0,
         f"its num_key_value_heads ({kv_heads}) does not divide num_attention_heads ({heads})"),
        (get("hidden_act", "silu") == "silu", f"its MLP activation is {get('hidden_act')!r}, not silu"),
        (not get("attention_bias", False), "its attention projections have biases"),
        (get("tie_word_embeddings") is True, "its output layer is not tied to the input embedding"),
        (hidden is not None and get("intermediate_size") == intermediate_size(hidden),
         f"its intermediate_size {get('intermediate_size')} is not floor(8/3 · hidden_size)"),
        (rope.get("rope_type", rope.get("type", "default")) == "default" and theta is not None,
         f"its RoPE is {rope.get('rope_type', rope.get('type'))!r} scaled or has no rope_theta"),
        (window is not None or all(t == "full_attention" for t in kinds),
         "its layer_types name sliding-window layers but it sets no sliding window (use_sliding_window false)"),
        (window is None or global_every is not False,
         "its sliding-window layers do not follow one pattern of every k-th layer full (global_every)"),
        (not get("attention_dropout", 0.0), "it uses attention dropout"),
        (get("head_dim") is not None, "its config does not set head_dim"),
    ]
    for ok, reason in checks:
        if not ok:
            raise ValueError(f"cannot load it as this project's model: {reason}")
    windowed = window is not None and "sliding_attention" in kinds
    return {"n_layer": L, "n_head": heads, "n_kv_head": kv_heads, "n_embd": hidden, "head_dim": get("head_dim"),
            "vocab_size": get("vocab_size"), "norm_eps": get("rms_norm_eps"), "rope_base": float(theta),
            "pos": "rope", "kv_shift": False, "qk_norm": "before", "window": window if windowed else None,
            "global_every": global_every if windowed else None}


def _global_every(kinds: list[str]):
    """k when exactly the layers k, 2k, ... (counting from 1) of `kinds` are full attention, None when none is,
    False when no such k exists."""
    full = [i + 1 for i, kind in enumerate(kinds) if kind == "full_attention"]
    if not full:
        return None
    every = full[0]
    return every if full == list(range(every, len(kinds) + 1, every)) else False


def from_qwen3(tensors: dict, n_layer: int) -> dict:
    """Qwen3's tensors -> our state dict (lm_head tied to the embedding); KeyError names a missing tensor."""
    state = {"wte.weight": tensors["model.embed_tokens.weight"], "norm.weight": tensors["model.norm.weight"]}
    for i in range(n_layer):  # (grouped k and v simply have fewer rows)
        state.update({ours: tensors[theirs] for ours, theirs in _layer_names(i).items()})
        state[f"blocks.{i}.attn.qkv.weight"] = torch.cat(
            [tensors[f"model.layers.{i}.self_attn.{n}_proj.weight"] for n in "qkv"], dim=0)
    state["lm_head.weight"] = state["wte.weight"]
    return state
