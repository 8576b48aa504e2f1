"""Our `rope` architecture is Hugging Face's Qwen3ForCausalLM: the weight and config mapping, both ways.

Qwen3: pre-norm RMSNorm blocks (x·w gains), per-head q/k RMSNorm *before* rotate-half RoPE, SwiGLU, no
biases. Our fused qkv rows are q, k, v in order (no permutation). Qwen3's defaults differ from ours
(rms_norm_eps 1e-6, untied embeddings, ...), so every value is written explicitly.
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


def qwen3_config(cfg: dict, eot: int) -> dict:
    """The complete config.json of a native export of model config `cfg`."""
    L = cfg["n_layer"]
    return {
        "architectures": [ARCHITECTURE], "model_type": "qwen3", "dtype": "float32",
        "vocab_size": cfg["vocab_size"], "hidden_size": cfg["n_embd"],
        "intermediate_size": intermediate_size(cfg["n_embd"]), "num_hidden_layers": L,
        "num_attention_heads": cfg["n_head"], "num_key_value_heads": cfg["n_head"], "head_dim": cfg["head_dim"],
        "hidden_act": "silu", "max_position_embeddings": cfg["block_size"], "rms_norm_eps": cfg["norm_eps"],
        "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
        # both spellings of the RoPE base: recent transformers read rope_parameters, older loaders rope_theta
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_base"]}, "rope_theta": cfg["rope_base"],
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": L,
        "layer_types": ["full_attention"] * L, "initializer_range": 0.02, "use_cache": True,
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


def to_qwen3(state: dict, n_layer: int) -> dict:
    """Our state dict -> Qwen3's tensors (the tied lm_head is not stored: tie_word_embeddings)."""
    out = {"model.embed_tokens.weight": state["wte.weight"], "model.norm.weight": state["norm.weight"]}
    for i in range(n_layer):
        out.update({theirs: state[ours] for ours, theirs in _layer_names(i).items()})
        q, k, v = state[f"blocks.{i}.attn.qkv.weight"].chunk(3, dim=0)
        out.update({f"model.layers.{i}.self_attn.{n}_proj.weight": w for n, w in zip("qkv", (q, k, v))})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def model_config_from_qwen3(hf: dict) -> dict:
    """Our model config values for a Qwen3 config.json; ValueError (one sentence) when ours cannot express it."""
    def get(key, default=None):
        return hf.get(key, default)

    rope = get("rope_parameters") or get("rope_scaling") or {}
    theta = rope.get("rope_theta", get("rope_theta"))
    heads, hidden = get("num_attention_heads"), get("hidden_size")
    checks = [
        (get("model_type") == "qwen3" or ARCHITECTURE in (get("architectures") or []), "it is not a Qwen3 model"),
        (get("num_key_value_heads", heads) == heads, "it shares key/value heads (num_key_value_heads != "
                                                      "num_attention_heads), which this model does not"),
        (get("hidden_act", "silu") == "silu", f"its MLP activation is {get('hidden_act')!r}, not silu"),
        (not get("attention_bias", False), "its attention projections have biases"),
        (get("tie_word_embeddings") is True, "its output layer is not tied to the input embedding"),
        (hidden is not None and get("intermediate_size") == intermediate_size(hidden),
         f"its intermediate_size {get('intermediate_size')} is not floor(8/3 · hidden_size)"),
        (rope.get("rope_type", rope.get("type", "default")) == "default" and theta is not None,
         f"its RoPE is {rope.get('rope_type', rope.get('type'))!r} scaled or has no rope_theta"),
        (not get("use_sliding_window", False) and all(t == "full_attention" for t in get("layer_types") or []),
         "it uses sliding-window attention"),
        (not get("attention_dropout", 0.0), "it uses attention dropout"),
        (get("head_dim") is not None, "its config does not set head_dim"),
    ]
    for ok, reason in checks:
        if not ok:
            raise ValueError(f"cannot load it as this project's model: {reason}")
    return {"n_layer": get("num_hidden_layers"), "n_head": heads, "n_embd": hidden, "head_dim": get("head_dim"),
            "vocab_size": get("vocab_size"), "norm_eps": get("rms_norm_eps"), "rope_base": float(theta),
            "pos": "rope", "kv_shift": False, "qk_norm": "before"}


def from_qwen3(tensors: dict, n_layer: int) -> dict:
    """Qwen3's tensors -> our state dict (lm_head tied to the embedding); KeyError names a missing tensor."""
    state = {"wte.weight": tensors["model.embed_tokens.weight"], "norm.weight": tensors["model.norm.weight"]}
    for i in range(n_layer):
        state.update({ours: tensors[theirs] for ours, theirs in _layer_names(i).items()})
        state[f"blocks.{i}.attn.qkv.weight"] = torch.cat(
            [tensors[f"model.layers.{i}.self_attn.{n}_proj.weight"] for n in "qkv"], dim=0)
    state["lm_head.weight"] = state["wte.weight"]
    return state
