"""Load a checkpoint written by train.py (checkpoint contract) for evaluation or sampling."""
import os
import sys

import torch


class UserError(Exception):
    """A mistake in the command line or inputs: printed as one sentence, without a traceback."""


def pick_device(device=None):
    """The device asked for; CUDA when available if none; the CPU, with a note, when CUDA is asked for but
    absent (lm-eval's command line asks for cuda:0 unless --device is given)."""
    if not device:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        print(f"note: device {device} requested but CUDA is not available; running on the CPU.", file=sys.stderr)
        return "cpu"
    return device


def load_model(ckpt, device="cpu", argument="--ckpt"):
    """Returns (model in eval mode on `device`, tokenizer, checkpoint dict) for a run dir or a ckpt file.
    `argument`: how the command line names `ckpt`, for the messages."""
    from config import existing_runs
    from data.shards import DataError
    from data.tokenizer import get_tokenizer
    from model import GPT

    if not os.path.exists(ckpt):
        raise UserError(f"no checkpoint at {ckpt}: it does not exist, and {argument} takes a run directory that "
                        f"holds ckpt.pt (written by train.py) or a checkpoint file; {existing_runs(ckpt)}")
    path = os.path.join(ckpt, "ckpt.pt") if os.path.isdir(ckpt) else ckpt
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: {argument} takes a run directory that holds ckpt.pt "
                        f"(written by train.py) or the path of a .pt file")
    not_a_checkpoint(path, argument)
    try:
        model, ckpt_dict = GPT.from_checkpoint(path, map_location="cpu")
    except (OSError, ValueError) as error:  # damaged or refused file (one sentence already), unknown config key
        raise UserError(str(error)) from None
    except RuntimeError as error:  # load_state_dict: weights that do not fit the saved config
        detail = " ".join(str(error).split())
        detail = detail if len(detail) <= 160 else detail[:160] + "…"
        raise UserError(f"{path}: the weights do not match its model_config ({detail})") from None
    if "tokenizer" not in ckpt_dict:
        raise UserError(f"{path} has no 'tokenizer' entry; re-save it with the tokenizer name "
                        f"(e.g. 'gpt2' or 'byte') as the checkpoint contract requires")
    try:
        tokenizer = get_tokenizer(ckpt_dict["tokenizer"])
    except DataError as error:  # unknown name, or the GPT-2 ranks are not available offline
        raise UserError(str(error)) from None
    model.to(device).eval()
    return model, tokenizer, ckpt_dict


# What a torch.save file starts with: a zip archive (torch >= 1.6), or a pickle (the legacy format).
TORCH_SAVE_MAGIC = (b"PK", b"\x80")
RUN_FILES = {"config.json": "train.py's record of the run's settings",
             "metrics.jsonl": "train.py's log of the run's losses"}


def not_a_checkpoint(path, argument="--ckpt"):
    """One sentence when `path` is some other file (a run's config.json, a text file): torch.load would call it
    corrupt or truncated. A damaged checkpoint keeps its first bytes and is left to the loader's own message."""
    with open(path, "rb") as f:
        head = f.read(64)
    if not head or head.startswith(TORCH_SAVE_MAGIC):
        return
    name = os.path.basename(path)
    json_like = head.lstrip()[:1] in (b"{", b"[")
    what = RUN_FILES.get(name) or ("a JSON file" if json_like else "a file that torch.save did not write")
    run_dir = os.path.dirname(os.path.abspath(path))
    given = os.path.dirname(path) or "."
    instead = ((f"pass {argument} {given}" if argument.startswith("-") else f"give {given} as {argument}")
               + " (its run directory, which holds ckpt.pt)"
               if os.path.isfile(os.path.join(run_dir, "ckpt.pt"))
               else f"{argument} takes a run directory that holds ckpt.pt (written by train.py), or the path of that "
                    "file")
    raise UserError(f"{path} is {what}, not a checkpoint: {instead}")


def describe_encoding(model_config):
    """The paper_results.json row name for a model config, e.g. 'rope', 'grape_ap+kv_shift'."""
    name = model_config.get("pos", "?")
    return name + "+kv_shift" if model_config.get("kv_shift") else name


def autocast_context(device):
    """bf16 autocast on CUDA (logits come back fp32 per the model contract); a no-op on the CPU."""
    if str(device).startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)
