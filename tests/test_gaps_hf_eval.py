"""Where generated mutants (tools/mutants.py) found no test in hf/, eval/, training/metrics.py and attention.py:
which Qwen3 configs load (every accepted spelling, every refusal with its reason), which errors count as an
unreachable hub, lm-eval's model argument string, the wandb run a resume continues, and a description of every
attention backend a layer can resolve to."""
import re
import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention import describe_backend
from helpers import examples
from hf.qwen3 import model_config_from_qwen3

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


@pytest.mark.parametrize("name", ["ConnectionError", "OfflineModeIsEnabled", "LocalEntryNotFoundError",
                                  "ConnectTimeout", "ReadTimeout", "MaxRetryError", "NameResolutionError"])
def test_an_unreachable_hub_is_recognised_anywhere_in_the_error_chain(name):
    from eval.zero_shot import is_connection_error
    cause = type(name, (Exception,), {})("no network")
    assert is_connection_error(cause)
    wrapped = RuntimeError("loading the task failed")
    wrapped.__cause__ = cause
    outer = ValueError("outer")
    outer.__context__ = wrapped
    assert is_connection_error(outer)
    assert not is_connection_error(RuntimeError("a bug")) and not is_connection_error(KeyError(name))


def test_lm_eval_model_arguments_keep_equals_signs_in_values_and_take_batch_size_and_device():
    from eval.lm_adapter import GrapeLM

    class Captured(GrapeLM):
        def __init__(self, **kwargs):
            self.kwargs = kwargs
    made = Captured.create_from_arg_string("ckpt=/runs/a=b/ckpt.pt,max_length=64,,batch_size=2",
                                           {"batch_size": 8, "device": "cpu", "max_batch_size": 9, "other": None})
    assert made.kwargs == {"ckpt": "/runs/a=b/ckpt.pt", "max_length": "64", "batch_size": 8, "device": "cpu"}
    kept = Captured.create_from_arg_string("ckpt=x.pt,batch_size=2", {"batch_size": None})
    assert kept.kwargs == {"ckpt": "x.pt", "batch_size": "2"}


@pytest.mark.parametrize("run_id", [None, "abc123"])
def test_wandb_continues_the_saved_run_on_resume(monkeypatch, tmp_path, run_id):
    from config import TrainConfig
    from training.metrics import start_wandb
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: calls.append(kw) or "run"))
    cfg = TrainConfig(data_dir="d", out_dir=str(tmp_path), wandb=True, wandb_project="p", wandb_mode="offline")
    assert start_wandb(cfg, "fox", {"model": {}}, run_id) == "run"
    assert calls == [{"project": "p", "name": "fox", "config": {"model": {}}, "mode": "offline", "dir": str(tmp_path),
                      "id": run_id, "resume": "allow" if run_id else None}]
    named = TrainConfig(data_dir="d", out_dir=str(tmp_path), wandb_run_name="mine")
    start_wandb(named, "fox", {}, None)
    assert calls[-1]["name"] == "mine"


@pytest.mark.parametrize("backend", ["sdpa", "lifted", "tile", "path_integral", "dense"])
def test_every_resolved_backend_is_described(backend):
    assert describe_backend(backend)
