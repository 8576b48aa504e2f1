"""hf/qwen3.py: which Qwen3 configs load as ours (every accepted spelling, grouped and windowed heads, every
refusal with its reason), and the native export's config fields."""
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import examples
from hf.qwen3 import model_config_from_qwen3


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 48, "head_dim": 16,
         "intermediate_size": 128, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": True,
         "rope_theta": 10000.0, "use_sliding_window": False, "layer_types": ["full_attention"] * 2,
         "attention_dropout": 0.0, "vocab_size": 97, "rms_norm_eps": 1e-6}


OURS = {"n_layer": 2, "n_head": 4, "n_embd": 48, "head_dim": 16, "vocab_size": 97, "norm_eps": 1e-6,
        "rope_base": 10000.0, "pos": "rope", "kv_shift": False, "qk_norm": "before", "n_kv_head": 4, "window": None,
        "global_every": None}


# Spellings transformers versions use for the same config: each must load as OURS.
ACCEPTED = {
    "identity": [{}, {"model_type": "other"}, {"architectures": None}],  # either names it Qwen3
    "rope": [{}, {"rope_theta": None, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}},
             {"rope_theta": None, "rope_scaling": {"rope_theta": 10000.0, "type": "default"}},
             {"rope_scaling": {"type": "default"}}, {"rope_parameters": {"rope_theta": 10000.0}}],
    "optional": [{}, {"num_key_value_heads": None}, {"hidden_act": None}, {"attention_bias": None},
                 {"use_sliding_window": None}, {"layer_types": None}, {"attention_dropout": None}],
}


# One change each, and the reason the refusal names.
REFUSED = [({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "not a Qwen3 model"),
           ({"num_key_value_heads": 3}, "its num_key_value_heads (3) does not divide num_attention_heads (4)"),
           ({"hidden_act": "gelu"}, "its MLP activation is 'gelu', not silu"),
           ({"attention_bias": True}, "biases"),
           ({"tie_word_embeddings": False}, "not tied"),
           ({"intermediate_size": 129}, "its intermediate_size 129 is not floor"),
           ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0, "rope_theta": 1e4}},
            "its RoPE is 'linear' scaled"),
           ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "its RoPE is 'yarn' scaled"),
           ({"rope_theta": None, "rope_parameters": None, "rope_scaling": None}, "has no rope_theta"),
           ({"use_sliding_window": True, "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]},
            "do not follow one pattern of every k-th layer full"),
           ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding-window"),
           ({"attention_dropout": 0.1}, "attention dropout"),
           ({"head_dim": None}, "does not set head_dim")]


def spelled(*changes):
    config = dict(QWEN3)
    for change in changes:
        for key, value in change.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
    return config


@given(identity=st.sampled_from(ACCEPTED["identity"]), rope=st.sampled_from(ACCEPTED["rope"]),
       optional=st.sampled_from(ACCEPTED["optional"]))
def test_qwen3_configs_load_in_every_spelling(identity, rope, optional):
    assert model_config_from_qwen3(spelled(identity, rope, optional)) == OURS


# Grouped heads and sliding windows Qwen3 writes, and ours: (change, n_kv_head, window, global_every)
GROUPED_OR_WINDOWED = [({"num_key_value_heads": 1}, 1, None, None),
                       ({"use_sliding_window": True, "sliding_window": 8, "num_key_value_heads": 2,
                         "layer_types": ["sliding_attention", "full_attention"]}, 2, 8, 2),
                       ({"use_sliding_window": True, "sliding_window": 8, "layer_types": None, "max_window_layers": 0},
                        4, 8, None),
                       ({"use_sliding_window": True, "sliding_window": 8}, 4, None, None)]  # every layer full


@pytest.mark.parametrize("change,n_kv_head,window,global_every", GROUPED_OR_WINDOWED)
def test_grouped_and_windowed_qwen3_configs_load_as_ours(change, n_kv_head, window, global_every):
    expected = {**OURS, "n_kv_head": n_kv_head, "window": window, "global_every": global_every}
    assert model_config_from_qwen3(spelled(change)) == expected


@pytest.mark.parametrize("change,reason", REFUSED)
@examples(5)
@given(identity=st.sampled_from(ACCEPTED["identity"]), rope=st.sampled_from(ACCEPTED["rope"]),
       optional=st.sampled_from(ACCEPTED["optional"]))
def test_each_deviation_from_qwen3_is_refused_with_its_reason(change, reason, identity, rope, optional):
    with pytest.raises(ValueError, match="cannot load it as this project's model: .*" + re.escape(reason)):
        model_config_from_qwen3(spelled(identity, rope, optional, change))


def test_the_native_export_sets_every_qwen3_field_under_its_own_name():
    """A renamed or dropped key of config.json falls back to Qwen3's default silently (attention_bias: False
    today, but a loader's default is not ours to rely on): every Qwen3 field is written, and nothing else but
    rope_theta (older loaders' spelling of rope_parameters' base)."""
    import transformers

    from hf.qwen3 import qwen3_config
    cfg = dict(n_layer=2, vocab_size=100, n_embd=64, n_head=4, head_dim=16, block_size=64, norm_eps=1e-5,
               rope_base=10000.0)
    ours = qwen3_config(cfg, eot=0)
    qwen3_fields = set(transformers.Qwen3Config().to_dict()) - set(transformers.PretrainedConfig().to_dict())
    assert qwen3_fields - set(ours) == set() and ours["model_type"] == "qwen3"
    assert set(ours) - qwen3_fields - {"architectures", "model_type", "dtype", "bos_token_id", "eos_token_id",
                                        "pad_token_id", "tie_word_embeddings"} == {"rope_theta"}
    assert ours["attention_bias"] is False and ours["attention_dropout"] == 0.0


@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_the_weights_map_onto_qwen3s_parameter_names_and_back(n_kv_head):
    """Every tensor of our model lands on the Qwen3 parameter of the same role and shape (transformers' own model
    of the exported config is the reference for the names and shapes), the fused qkv rows split as q, k, v; and
    from_qwen3 gives our state dict back exactly."""
    import torch
    import transformers

    from hf.qwen3 import from_qwen3, qwen3_config, to_qwen3
    from model import GPT, GPTConfig
    cfg = dict(n_layer=2, vocab_size=100, n_embd=64, n_head=4, head_dim=16, block_size=64, norm_eps=1e-5,
               rope_base=10000.0, pos="rope", n_kv_head=n_kv_head)
    torch.manual_seed(0)
    ours = {name: tensor + torch.rand_like(tensor) for name, tensor in GPT(GPTConfig(**cfg)).state_dict().items()}
    ours["lm_head.weight"] = ours["wte.weight"]  # tied
    theirs = to_qwen3(ours, 2, n_head=4, n_kv_head=n_kv_head)
    config = {k: v for k, v in qwen3_config(cfg, eot=0).items() if k not in ("architectures", "model_type")}
    reference = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config)).state_dict()
    assert set(theirs) == set(reference) - {"lm_head.weight"}
    for name, tensor in theirs.items():
        assert tensor.shape == reference[name].shape, name
    for i in range(2):
        q, k, v = ours[f"blocks.{i}.attn.qkv.weight"].split([64, 16 * n_kv_head, 16 * n_kv_head])
        for part, tensor in zip("qkv", (q, k, v)):
            assert torch.equal(theirs[f"model.layers.{i}.self_attn.{part}_proj.weight"], tensor)
        assert torch.equal(theirs[f"model.layers.{i}.self_attn.o_proj.weight"], ours[f"blocks.{i}.attn.proj.weight"])
        assert torch.equal(theirs[f"model.layers.{i}.mlp.down_proj.weight"], ours[f"blocks.{i}.mlp.proj.weight"])
        assert torch.equal(theirs[f"model.layers.{i}.post_attention_layernorm.weight"],
                           ours[f"blocks.{i}.mlp_norm.weight"])
    back = from_qwen3(theirs, 2)
    assert set(back) == set(ours)
    for name, tensor in ours.items():
        assert torch.equal(back[name], tensor), name
