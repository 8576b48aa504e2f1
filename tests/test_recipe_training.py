"""train.py under recipe = "official" against a training loop written from the authors' script's semantics
(docs/recipe.md): the same initial weights (seed 42), the same batches (their random-offset sampler, written
out here from its rule: a generator per (process, micro-batch) seeded by SplitMix64, a random shard, random
offsets past the 512-uint16 header of the raw file), the sum of each process's micro-batch mean losses, the
mean over processes, clip_grad_norm_, AdamW(0.9, 0.95, eps 1e-8) with weight decay on all but the RMSNorm
gains, warm-up lr·it/W then cosine, iterations 0..max_iters.

train.py runs a different split from the reference's (1 process x 4 micro-batches of 3, or 2 processes x 2,
against the authors' 2 processes x 3 micro-batches of 2): the official gradient must not depend on it.
"""
import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import checkpoints
import train
from model import GPT, GPTConfig, RMSNorm
from tests.helpers import prepare_byte_corpus, synthetic_text, tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("one_thread")
PROCESSES, MICRO_STEPS, ROWS = 2, 3, 2  # the authors' layout in these tests: 2 x 3 micro-batches of 2
# grad_clip 3: the official gradient (norm about 4.7 here) is clipped and the mean one (about 1.6) is not, so the
# weights depend on the gradient's scale (at 1.0 both would be clipped to the same vector)
TRAIN = dict(recipe="official", reference_layout=f"{PROCESSES}x{MICRO_STEPS}", global_batch_size=12, batch_size=3,
             max_iters=5, warmup_iters=2, lr=1e-2, min_lr=1e-3, grad_clip=3.0)
TOLERANCE = 2e-6  # on weights after 6 AdamW steps of about lr = 1e-2: fp32 rounding of sums in another order


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    # several small train shards, so the shard draw matters
    return prepare_byte_corpus(tmp_path_factory.mktemp("official_data"),
                               [synthetic_text(seed, 700) for seed in range(8)], shard_tokens=4_000)


def config_file(tmp_path, data_dir, pos, kv_shift=False, **overrides):
    path = tmp_path / f"{pos}.toml"
    path.write_text(tiny_config(data_dir, model={"pos": pos, "kv_shift": kv_shift}, **{**TRAIN, **overrides}))
    return str(path)


def splitmix_seed(base, *values):
    """The authors' fold_in_seed, from its definition (SplitMix64 of the running sum)."""
    x = base % 2**64
    for v in values:
        x = (x + v + 0x9E3779B97F4A7C15) % 2**64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
        x = x ^ (x >> 31)
    return x % 2**63


def authors_batch(files, rank, batch_id, block_size, seed=42):
    """Their get_batch('train') in stateless mode: the raw file as uint16 (header included), offset 512."""
    generator = torch.Generator().manual_seed(splitmix_seed(seed, rank, batch_id))
    data = files[torch.randint(len(files), (1,), generator=generator).item()]
    ix = torch.randint(len(data) - block_size - 512, (ROWS,), generator=generator)
    x = torch.stack([torch.from_numpy(data[512 + i:512 + i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[512 + i + 1:512 + i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


def authors_lr(it, lr, min_lr, warmup, decay_iters):
    if it < warmup:
        return lr * it / warmup
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def authors_loop(data_dir, model_config, sum_micro_batches=True):
    """(final state dict, pre-clip grad norms). With sum_micro_batches=False, the mean over all micro-batches."""
    files = [np.memmap(p, dtype=np.uint16, mode="r") for p in sorted(glob.glob(os.path.join(data_dir, "train_*.bin")))]
    torch.manual_seed(42)
    model = GPT(model_config)
    gains = {id(m.weight) for m in model.modules() if isinstance(m, RMSNorm)}
    groups = [{"params": [p for p in model.parameters() if id(p) not in gains], "weight_decay": 0.01},
              {"params": [p for p in model.parameters() if id(p) in gains], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=TRAIN["lr"], betas=(0.9, 0.95), eps=1e-8)
    norms = []
    for it in range(TRAIN["max_iters"] + 1):
        for group in optimizer.param_groups:
            group["lr"] = authors_lr(it, TRAIN["lr"], TRAIN["min_lr"], TRAIN["warmup_iters"], TRAIN["max_iters"])
        for rank in range(PROCESSES):  # DDP: the mean over processes of each process's summed gradient
            for micro in range(MICRO_STEPS):
                x, y = authors_batch(files, rank, it * MICRO_STEPS + micro, model_config.block_size)
                _, loss = model(x, y)
                (loss / PROCESSES / (1 if sum_micro_batches else MICRO_STEPS)).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["grad_clip"]).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model.state_dict(), norms


def run_train(args):
    out = train.run(args)
    run_dir = out["out_dir"]
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        norms = [r["grad_norm"] for r in map(json.loads, f) if r["type"] == "train"]
    saved = torch.load(os.path.join(run_dir, "ckpt.pt"), weights_only=True)
    return saved, norms


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.mark.parametrize("pos,kv_shift", [("rope", False), ("grape_m", False), ("grape_m_ctx", False),
                                          ("alibi", False), ("grape_a_qk", False), ("fox", False),
                                          ("grape_ap", False), ("rope", True)])
def test_official_recipe_trains_as_the_authors_loop(data_dir, tmp_path, pos, kv_shift):
    saved, norms = run_train([config_file(tmp_path, data_dir, pos, kv_shift), f"--out_dir={tmp_path / 'run'}"])
    assert saved["step"] == TRAIN["max_iters"] + 1 and saved["grad_accum"] == 4  # our split: 4 x 3, theirs 2 x 3 x 2
    if pos.startswith("grape_m"):  # their grape-m-nonctx learns 16·log θ, their grape-m-ctx log θ itself
        spectrum = "log_theta" if pos == "grape_m_ctx" else "scaled_log_theta"
        assert f"blocks.0.attn.rotation.{spectrum}" in saved["model"]
    model_config = GPTConfig.from_dict(saved["model_config"])
    reference, reference_norms = authors_loop(data_dir, model_config)
    assert min(reference_norms) > TRAIN["grad_clip"]  # clipping acts
    assert norms == pytest.approx(reference_norms, rel=2e-6)
    assert largest_difference(saved["model"], reference) < TOLERANCE


def test_mean_gradient_is_the_official_one_divided_by_the_micro_batches_per_process(data_dir, tmp_path):
    """grad_scale = mean (the clean recipe's): the gradient of the mean loss, 1/3 of the official one at the
    first step (the same weights and batches), and training then differs."""
    config = config_file(tmp_path, data_dir, "fox")
    official, official_norms = run_train([config, f"--out_dir={tmp_path / 'official'}"])
    mean, mean_norms = run_train([config, "--grad_scale=mean", f"--out_dir={tmp_path / 'mean'}"])
    reference, reference_norms = authors_loop(data_dir, GPTConfig.from_dict(mean["model_config"]),
                                              sum_micro_batches=False)
    assert mean_norms == pytest.approx(reference_norms, rel=2e-6)
    assert largest_difference(mean["model"], reference) < TOLERANCE
    assert official_norms[0] == pytest.approx(MICRO_STEPS * mean_norms[0], rel=1e-5)
    assert max(mean_norms) < TRAIN["grad_clip"] < min(official_norms)  # only the official gradient is clipped
    assert largest_difference(official["model"], mean["model"]) > 100 * TOLERANCE
    clean, clean_norms = run_train([config, "--recipe=clean", f"--out_dir={tmp_path / 'clean'}"])
    assert clean["train_config"]["grad_scale"] == "mean" and clean["step"] == TRAIN["max_iters"]


def test_official_gradient_scale_is_the_same_on_one_and_two_processes(data_dir, tmp_path):
    config = config_file(tmp_path, data_dir, "alibi")
    _, one = run_train([config, f"--out_dir={tmp_path / 'one'}"])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             os.path.join(REPO, "train.py"), config, "--batch_size=3", f"--out_dir={tmp_path / 'two'}"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "two" / "metrics.jsonl") as f:
        two = [r["grad_norm"] for r in map(json.loads, f) if r["type"] == "train"]
    saved = torch.load(tmp_path / "two" / "ckpt.pt", weights_only=True)
    assert saved["grad_accum"] == 2 and saved["world_size"] == 2
    assert min(one) > TRAIN["grad_clip"] and two == pytest.approx(one, rel=2e-5)


def test_a_checkpoint_from_before_the_gradient_scale_resumes_only_with_the_semantics_it_was_trained_with(
        data_dir, tmp_path):
    """Checkpoints written before grad_scale, sampler and reference_layout existed were trained with the mean
    gradient, the windows sampler and (unless set) seed 1337: a resume under today's official recipe is refused
    with the flags that restore them, and following that advice continues the run exactly."""
    config = config_file(tmp_path, data_dir, "fox")
    old_semantics = ["--grad_scale=mean", "--sampler=windows", "--reference_layout=", "--seed=1337"]
    whole, _ = run_train([config, *old_semantics, f"--out_dir={tmp_path / 'whole'}"])
    run_dir = tmp_path / "old"
    train.run([config, *old_semantics, "--stop_iter=3", f"--out_dir={run_dir}"])
    state = checkpoints.load(str(run_dir / "ckpt.pt"))
    for key in ("grad_scale", "sampler", "reference_layout"):
        del state["train_config"][key]
    checkpoints.save(str(run_dir / "ckpt.pt"), state)
    before = (run_dir / "ckpt.pt").read_bytes()
    with pytest.raises(train.TrainError) as refused:
        train.run([config, "--resume", f"--out_dir={run_dir}"])
    message = str(refused.value)
    assert "train.grad_scale is 'official' here but 'mean' in the checkpoint" in message
    assert (run_dir / "ckpt.pt").read_bytes() == before  # nothing written
    advice = message.split("resume with ")[1].split(" (the values it was trained with)")[0].split()
    # the layout is unused by the mean gradient and the windows sampler, so it is no part of the advice
    assert sorted(advice) == sorted(flag for flag in old_semantics if flag != "--reference_layout=")
    resumed, _ = run_train([config, "--resume", *advice, f"--out_dir={run_dir}"])
    assert resumed["step"] == whole["step"] and largest_difference(resumed["model"], whole["model"]) == 0
