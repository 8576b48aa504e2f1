"""training/layout.py (how the model runs in training: loss, activation checkpointing, FSDP, torch.compile) and
training/errors.py (the line and exit status of an interrupted start)."""
import dataclasses
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from config import ConfigError, TrainConfig
from model import GPT, GPTConfig
from training.errors import interrupted_line
from training.layout import bf16_parameters, describe_compile, lay_out, wrapped_for_training

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(n_layer=4):
    return GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=32, head_dim=16, vocab_size=64, block_size=16))


def test_lay_out_sets_the_loss_and_the_checkpointed_blocks_and_shards_only_under_fsdp():
    model = tiny()
    calls = []
    replica = SimpleNamespace(sharded=False, device=torch.device("cpu"), shard=lambda *a, **k: calls.append(k))
    cfg = TrainConfig(loss="chunked", loss_chunk_tokens=96, activation_checkpointing="every_k",
                      activation_checkpointing_every=2)
    lay_out(model, cfg, replica, use_bf16=False)
    assert (model.loss_impl, model.loss_chunk_tokens, calls) == ("chunked", 96, [])
    assert model.checkpointed_blocks == frozenset({1, 3})
    sharded = SimpleNamespace(sharded=True, device=torch.device("cpu"), shard=lambda *a, **k: calls.append(k))
    on = dataclasses.replace(cfg, parallel="fsdp", fsdp_bf16="params", compile=True, fsdp_reshard_after_forward=False)
    lay_out(model, on, sharded, use_bf16=True)
    assert calls == [{"bf16_params": True, "reshard_after_forward": False, "compile_blocks": True}]
    with pytest.raises(ConfigError, match="^train.unknown loss 'fused'"):
        lay_out(model, dataclasses.replace(cfg, loss="fused"), replica, use_bf16=False)


def test_bf16_parameters_only_under_fsdp_with_bf16_params_on_a_bf16_run():
    params = TrainConfig(parallel="fsdp", fsdp_bf16="params")
    assert bf16_parameters(params, True)
    assert not bf16_parameters(params, False)
    assert not bf16_parameters(dataclasses.replace(params, parallel="ddp"), True)
    assert not bf16_parameters(dataclasses.replace(params, fsdp_bf16="autocast"), True)


def test_the_training_module_is_compiled_whole_only_when_not_sharded():
    model = tiny(1)
    plain = SimpleNamespace(sharded=False, wrap=lambda m: ("wrapped", m))
    assert wrapped_for_training(model, TrainConfig(), plain) == ("wrapped", model)
    kind, compiled = wrapped_for_training(model, TrainConfig(compile=True), plain)
    assert compiled is not model and getattr(compiled, "_orig_mod", None) is model
    sharded = SimpleNamespace(sharded=True, wrap=lambda m: ("wrapped", m))
    assert wrapped_for_training(model, TrainConfig(compile=True, parallel="fsdp"), sharded) == ("wrapped", model)


def test_an_interrupted_start_says_so_on_the_main_process_only_and_exits_130():
    code = "from training.errors import exit_interrupted; exit_interrupted()"
    for rank, said in (("0", interrupted_line()), ("1", "")):
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "RANK": rank, "WORLD_SIZE": "2"})  # (torchrun sets both)
        assert (done.returncode, done.stderr.strip()) == (130, said)
    assert interrupted_line().startswith("interrupted: the last checkpoint written (if any) is intact; ")


def test_the_start_up_line_counts_the_compiled_blocks_on_the_model():
    """What the start-up line says for each case, the blocks counted on the model (here one compiled of two), not
    assumed from the config; with bf16 parameters the matrices' own FSDP units inside each block are named as
    where its graph breaks."""
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, head_dim=16, vocab_size=64, block_size=16))
    sharded, replica = SimpleNamespace(sharded=True), SimpleNamespace(sharded=False)
    on = TrainConfig(compile=True, parallel="fsdp")
    assert describe_compile(model, TrainConfig(parallel="fsdp"), sharded) == "compile: off"
    assert describe_compile(model, dataclasses.replace(on, parallel="ddp"), replica) == "compile: whole model"
    assert describe_compile(model, on, sharded).startswith("compile: 0 of 2 blocks (")
    model.blocks[1].compile()  # (nothing is traced before a call)
    assert describe_compile(model, on, sharded) == ("compile: 1 of 2 blocks (per block, before fully_shard; "
                                                    "embedding, final norm, LM head and loss eager)")
    assert describe_compile(model, on, sharded, use_bf16=True) == (
        "compile: 1 of 2 blocks (per block, before fully_shard; each block's graph broken at its bf16 qkv, proj and "
        "MLP units; embedding, final norm, LM head and loss eager)")
