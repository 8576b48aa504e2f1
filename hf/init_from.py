"""The weights that start a new training run from an existing model (train.py's `init_from` key).

`init_from` names one of:
* a run directory holding ckpt.pt, or a checkpoint file, of this repository (weights only: the new run has
  its own optimizer, schedule and data position);
* a Hugging Face directory of a Qwen3ForCausalLM of our architecture (any Qwen3 checkpoint with tied
  embeddings, SwiGLU of width floor(8/3 · hidden), default RoPE; grouped key/value heads become n_kv_head, a
  sliding window whose full layers are every k-th becomes window and global_every), e.g. a native export of
  this repository;
* a remote-code export of this repository (any encoding).

The run's model config must describe the same model: every key the source defines must be equal, except
block_size (the context length) and attn_backend (how attention is computed), which a new run may change.
"""
from __future__ import annotations

import dataclasses
import json
import os

import torch

from config import ConfigError
from hf import qwen3

MAY_DIFFER = ("block_size", "attn_backend")
LFS_POINTER = b"version https://git-lfs.github.com/spec/"  # how a git-lfs pointer file starts


def initial_state(path: str, model_cfg: dict) -> dict:
    """The state dict for a model of config `model_cfg` (a GPTConfig as a dict) taken from `path`; a
    ConfigError (one sentence) when it does not exist, cannot be read, or describes another model."""
    source_cfg, state = _read(path)
    differ = [k for k in source_cfg if k not in MAY_DIFFER and source_cfg[k] != model_cfg.get(k)]
    if differ:
        fix = " ".join(f"--{k}={source_cfg[k]}" for k in differ)
        raise ConfigError(f"init_from {path} is a model with {', '.join(f'{k}={source_cfg[k]!r}' for k in differ)}, "
                          f"but this run's model config has {', '.join(f'{k}={model_cfg.get(k)!r}' for k in differ)}; "
                          f"set the same values ({fix}) in the config or on the command line")
    return state


def _read(path: str) -> tuple[dict, dict]:
    """(model config values, state dict) of whatever `path` holds: our complete config (older checkpoints'
    missing keys filled with the defaults they were trained with), or the values a Qwen3 config sets."""
    import checkpoints

    if not os.path.exists(path):
        raise ConfigError(f"init_from {path} does not exist; give a run directory, a checkpoint file or a Hugging "
                          "Face model directory")
    ckpt_file = os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path
    if os.path.isfile(ckpt_file):
        try:
            ckpt = checkpoints.load(ckpt_file, map_location="cpu")
        except (OSError, ValueError) as error:  # damaged file, wrong checksum: already one sentence
            raise ConfigError(f"init_from: {error}") from None
        if "model" not in ckpt or "model_config" not in ckpt:
            raise ConfigError(f"init_from {ckpt_file} has no 'model' and 'model_config' entries; it is not a "
                              "checkpoint written by train.py")
        return _our_config(ckpt["model_config"], path), ckpt["model"]
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ConfigError(f"init_from {path} holds neither ckpt.pt nor a Hugging Face config.json; give a run "
                          "directory, a checkpoint file or a Hugging Face model directory")
    try:
        with open(config_file) as f:
            hf_config = json.load(f)
        tensors = _safetensors(path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"init_from {path}: cannot read it ({error})") from None
    if hf_config.get("model_type") == "grape":  # a remote-code export of this repository
        cfg = _our_config(hf_config.get("model_config", {}), path)
        state = {name.removeprefix("model."): t for name, t in tensors.items()}
        state["lm_head.weight"] = state["wte.weight"]
        return cfg, _persistent_only(cfg, state)
    try:
        cfg = qwen3.model_config_from_qwen3(hf_config)
        tied = tensors.get("lm_head.weight")
        if tied is not None and not torch.equal(tied, tensors["model.embed_tokens.weight"]):
            raise ValueError("cannot load it as this project's model: its lm_head differs from its embedding")
        return cfg, qwen3.from_qwen3(tensors, cfg["n_layer"])
    except ValueError as error:
        raise ConfigError(f"init_from {path}: {error}") from None
    except KeyError as error:
        raise ConfigError(f"init_from {path}: its weights lack the tensor {error}; it is not a complete "
                          "Qwen3 checkpoint") from None


def _our_config(values: dict, path: str) -> dict:
    from model import GPTConfig
    try:
        return dataclasses.asdict(GPTConfig.from_dict(dict(values)))
    except (ValueError, TypeError) as error:
        raise ConfigError(f"init_from {path}: its model config is not valid here ({error})") from None


def _safetensors(path: str) -> dict:
    """Every tensor of model.safetensors, or of the shards that model.safetensors.index.json lists."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise OSError(f"{file} is missing; only safetensors weights are read")
        try:
            tensors.update(load_file(file))
        except SafetensorError as error:  # not an OSError: a cut-off download or a git-lfs pointer left in place
            with open(file, "rb") as f:
                if f.read(len(LFS_POINTER)) == LFS_POINTER:  # a clone without git-lfs holds this text, not weights
                    raise ConfigError(f"init_from {path}: {file} is a git-lfs pointer, not the weights; fetch them "
                                      "with `git lfs pull` in that clone (or download the model again)") from None
            raise ConfigError(f"init_from {path}: {file} is not a complete safetensors file ({error}); download or "
                              "export the model again") from None
    return tensors


def _persistent_only(cfg: dict, state: dict) -> dict:
    """Drop the constant buffers a remote-code export stores but our checkpoints do not (they are rebuilt)."""
    from model import GPT, GPTConfig

    with torch.device("meta"):
        expected = GPT(GPTConfig.from_dict(cfg)).state_dict().keys()
    return {name: t for name, t in state.items() if name in expected}
