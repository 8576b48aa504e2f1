"""Where and how an evaluation or a sample runs: the device, bf16 autocast on CUDA, and an encoding's name in
reports. Loading the model is checkpoints.load_model."""
import sys

import torch


def pick_device(device=None):
    """The device asked for; CUDA when available if none; the CPU, with a note, when CUDA is asked for but
    absent (lm-eval's command line asks for cuda:0 unless --device is given)."""
    if not device:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        print(f"note: device {device} requested but CUDA is not available; running on the CPU.", file=sys.stderr)
        return "cpu"
    return device


def describe_encoding(model_config):
    """The paper_results.json row name for a model config, e.g. 'rope', 'grape_ap+kv_shift'."""
    name = model_config.get("pos", "?")
    return name + "+kv_shift" if model_config.get("kv_shift") else name


def autocast_context(device):
    """bf16 autocast on CUDA (logits come back fp32 per the model contract); a no-op on the CPU."""
    if str(device).startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)
