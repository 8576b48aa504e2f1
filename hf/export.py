"""Export a training run as a Hugging Face model directory (scripts/export_hf.py is its command line).

A `rope` model (QK-norm before the rotation, no KV-shift) is exactly Qwen3ForCausalLM and is written as
one, loadable without remote code. Every other encoding is written with the repository's own model code
beside its weights (hf/remote_code.py) and loads with trust_remote_code=True. Either way the directory
holds config.json, model.safetensors, generation_config.json, the tokenizer files and a README.md.

The directory is assembled under a temporary name beside OUT_DIR and renamed at the end, so a failure
leaves nothing behind, and an existing OUT_DIR is never touched.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile

from hf import qwen3
from hf.remote_code import generate
from hf.tokenizer_files import write_tokenizer

FORMATS = ("auto", "native", "remote")
REMOTE_ARCHITECTURE = "GrapeForCausalLM"


class ExportError(Exception):
    """A problem with the inputs of an export; the message is one sentence that says what to do."""


def export(run_dir: str, out_dir: str, fmt: str = "auto", argument: str = "RUN_DIR") -> dict:
    """Write the model of RUN_DIR/ckpt.pt (or a .pt file) to the new directory out_dir, making its missing parent
    directories (and removing them again if the export fails). fmt: "auto" (native Qwen3 when it can express the
    model, else remote code), "native" or "remote". `argument`: how the caller names run_dir in its messages.
    Returns a summary."""
    from data.shards import DataError
    from checkpoints import load_model, not_a_folder
    from config import UserError

    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    if os.path.lexists(out_dir):
        raise ExportError(f"{out_dir} already exists; the export only writes a new directory, so choose "
                          "another path or remove that one")
    blocked = not_a_folder(out_dir, "the export", "output path")  # a file as its parent, or further up (mkdir: "Not a directory")
    if blocked:
        raise ExportError(blocked)
    try:
        model, tokenizer, ckpt = load_model(run_dir, "cpu", argument)
    except UserError as error:
        raise ExportError(str(error)) from None
    cfg = dataclasses.asdict(model.config)
    # how attention is computed is the loading machine's choice (e.g. "tile" needs a GPU), not the model's
    model.config.attn_backend = cfg["attn_backend"] = "auto"
    problems = qwen3.native_problems(cfg)
    if fmt == "native" and problems:
        raise ExportError(f"native Qwen3 cannot express this model ({'; '.join(problems)}); export it as remote "
                          "code with --format remote (or auto, which picks it)")
    native = fmt != "remote" and not problems
    if tokenizer.n_vocab > cfg["vocab_size"]:
        raise ExportError(f"the checkpoint's tokenizer has {tokenizer.n_vocab} tokens but the model only "
                          f"{cfg['vocab_size']}; it does not belong to this model")

    made = make_parents(parent)
    try:
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.", suffix=".partial", dir=parent)
    except OSError as error:
        remove_empty(made)
        raise ExportError(f"cannot write the export beside {out_dir} ({error.strerror or error}); "
                          "check the free space and permissions there") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the export is an ordinary directory
        try:
            eot = write_tokenizer(ckpt["tokenizer"], tmp, cfg["block_size"])
        except (DataError, ValueError) as error:
            raise ExportError(f"cannot write the tokenizer files: {error}") from None
        files = write_weights_and_config(model, tmp, native, eot)
        write_json(tmp, "generation_config.json", generation_config(eot, tokenizer.n_vocab, cfg["vocab_size"]))
        summary = {"format": "native Qwen3" if native else "remote code", "pos": cfg["pos"],
                   "kv_shift": cfg["kv_shift"], "step": ckpt.get("step"), "tokenizer": ckpt["tokenizer"],
                   "code": files}
        with open(os.path.join(tmp, "README.md"), "w") as f:
            f.write(model_card(cfg, ckpt, native))
        for name in os.listdir(tmp):  # (safetensors writes its file private too)
            os.chmod(os.path.join(tmp, name), 0o666 & ~umask)
        if os.path.lexists(out_dir):
            raise ExportError(f"{out_dir} appeared while exporting; nothing was written there")
        os.rename(tmp, out_dir)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(made)
        raise ExportError(f"cannot write the export beside {out_dir} ({error.strerror or error}); "
                          "check the free space and permissions there") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(made)
        raise
    return summary


def make_parents(directory: str) -> list[str]:
    """Make `directory` and its missing parents (as mkdir -p); returns those it made, deepest first."""
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    made = []  # deepest first, as they are made (a failure leaves the deeper ones never made)
    try:
        for path in reversed(missing):
            os.mkdir(path)
            made.insert(0, path)
    except OSError as error:
        remove_empty(made)
        raise ExportError(f"cannot make the output's parent directory {path} ({error.strerror or error}); check "
                          "the permissions there or choose another output path") from None
    return made


def remove_empty(made: list[str]) -> None:
    """Remove the directories an export made (deepest first), each only if it is empty: one that something else
    was put in meanwhile stays, and so do the ones above it, which then hold it. One already gone is skipped."""
    for path in made:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            continue
        except OSError:
            return


def write_json(directory: str, name: str, value: dict) -> None:
    with open(os.path.join(directory, name), "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def generation_config(eot: int, n_vocab: int, vocab_size: int) -> dict:
    """Greedy by default, stopping at end-of-text; the embedding's padding rows past the tokenizer's
    vocabulary are never sampled (unconstrained, a random padding logit can win)."""
    config = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot, "do_sample": False}
    if vocab_size > n_vocab:
        config["suppress_tokens"] = list(range(n_vocab, vocab_size))
    return config


def write_weights_and_config(model, out_dir: str, native: bool, eot: int) -> list[str]:
    """model.safetensors and config.json (plus the model code when not native); returns the code files."""
    from safetensors.torch import save_file

    cfg = dataclasses.asdict(model.config)
    if native:
        tensors = qwen3.to_qwen3(model.state_dict(), cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"])
        config, code = qwen3.qwen3_config(cfg, eot), []
    else:
        for module in model.modules():  # constant buffers too: the remote model loads them (modeling_grape.py)
            module._non_persistent_buffers_set.clear()
        # the output layer is the input embedding (tied), stored once
        tensors = {f"model.{name}": t.contiguous() for name, t in model.state_dict().items()
                   if name != "lm_head.weight"}
        config = remote_config(cfg, eot)
        code = generate(out_dir)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    write_json(out_dir, "config.json", config)
    return code


def remote_config(cfg: dict, eot: int) -> dict:
    """config.json of a remote-code export: our model config, and the Hugging Face names of its sizes (which
    configuration_grape.py derives again when it loads)."""
    return {
        "architectures": [REMOTE_ARCHITECTURE], "model_type": "grape", "dtype": "float32",
        "auto_map": {"AutoConfig": "configuration_grape.GrapeConfig",
                     "AutoModelForCausalLM": f"modeling_grape.{REMOTE_ARCHITECTURE}"},
        "model_config": cfg,
        "vocab_size": cfg["vocab_size"], "hidden_size": cfg["n_embd"], "num_hidden_layers": cfg["n_layer"],
        "num_attention_heads": cfg["n_head"], "num_key_value_heads": cfg["n_kv_head"], "head_dim": cfg["head_dim"],
        "max_position_embeddings": cfg["block_size"], "rms_norm_eps": cfg["norm_eps"],
        "tie_word_embeddings": True, "bos_token_id": eot, "eos_token_id": eot,
    }


def model_card(cfg: dict, ckpt: dict, native: bool) -> str:
    encoding = cfg["pos"] + (" + KV-shift" if cfg["kv_shift"] else "")
    trust = "" if native else ", trust_remote_code=True"
    load = "AutoModelForCausalLM.from_pretrained(path)" if native else \
        "AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)"
    kind = ("Hugging Face's Qwen3ForCausalLM, which is exactly this architecture" if native else
            "the training repository's own model code, copied beside the weights (needs only torch; Triton "
            "kernels are used on a GPU when Triton is installed)")
    padding = "" if native else (" The model has no padding mask: batch sequences of one length (or right-pad "
                                 "them without a cache).")
    rows = "\n".join(f"| {key} | {value} |" for key, value in cfg.items())
    trained = f"{ckpt.get('step', '?')} optimizer steps" + (
        f", {ckpt['tokens_seen']:,} tokens" if isinstance(ckpt.get("tokens_seen"), int) else "")
    return f"""# GRAPE language model: {encoding}

A Llama-style decoder trained with the positional encoding `{encoding}` (GRAPE, Zhang et al., ICLR 2026), for
{trained}, tokenizer `{ckpt['tokenizer']}`. It loads as {kind}:

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = {load}
tokenizer = AutoTokenizer.from_pretrained(path{trust})
```

Generation is greedy by default and never emits the embedding's padding ids past the tokenizer's
vocabulary.{padding}

| model setting | value |
|---|---|
{rows}
"""
