"""training/optimizer.py: the learning-rate schedule, AdamW's parameter groups, and the settings a resume applies."""
import math

import pytest
import torch

from config import TrainConfig
from model import GPT, GPTConfig
from training.optimizer import (load_optimizer_state, lr_at, make_optimizer, param_groups, set_lr,
                                set_optimizer_settings)


def test_lr_schedule_matches_warmup_and_cosine_formula():
    cfg = TrainConfig(lr=1.0, min_lr=0.1, warmup_iters=10, max_iters=110)
    assert lr_at(0, cfg) == pytest.approx(0.1)            # linear warm-up: (step+1)/warmup
    assert lr_at(4, cfg) == pytest.approx(0.5)
    assert lr_at(10, cfg) == pytest.approx(1.0)           # peak right after warm-up
    assert lr_at(60, cfg) == pytest.approx(0.55)          # half way down the cosine: (lr+min_lr)/2
    assert lr_at(35, cfg) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2)
    assert lr_at(110, cfg) == pytest.approx(0.1)


@pytest.mark.parametrize("pos", ["grape_m_ctx+grape_a_qk", "grape_m_basis+fox"])
def test_weight_decay_skips_norm_gains_and_positional_parameters(pos):
    # spectrum_per_head makes log θ a matrix (H, d/2): it must still get no decay (decay would pull θ to 1 rad).
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, head_dim=16, vocab_size=64, block_size=16,
                          pos=pos, kv_shift=True, spectrum_per_head=True))
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    by_id = {id(p): name for name, p in model.named_parameters()}
    no_decay_names = {by_id[id(p)] for p in no_decay["params"]}
    decay_names = {by_id[id(p)] for p in decay["params"]}
    assert decay_names | no_decay_names == set(by_id.values()) and not decay_names & no_decay_names
    assert len(decay["params"]) + len(no_decay["params"]) == len(by_id)  # the tied embedding counted once
    projections = {"wte.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight", "blocks.0.mlp.gate.weight",
                   "blocks.0.mlp.up.weight", "blocks.0.mlp.proj.weight", "blocks.0.attn.kv_shift.gate.weight"}
    assert decay_names >= projections
    positional = {n for n in by_id.values() if n.startswith(("blocks.0.attn.rotation.", "blocks.0.attn.bias."))
                  and not n.endswith(("phase_increment.weight", "gate.weight"))}
    assert {"blocks.0.attn.rotation.log_theta"} <= positional  # a (2, 8) matrix here
    assert dict(model.named_parameters())["blocks.0.attn.rotation.log_theta"].ndim == 2
    assert positional | {n for n in by_id.values() if "norm" in n} <= no_decay_names


def test_the_official_warm_up_starts_at_zero_and_peaks_one_step_later():
    cfg = TrainConfig(lr=1.0, min_lr=0.1, warmup_iters=10, max_iters=110, lr_schedule="official")
    assert [lr_at(step, cfg) for step in (0, 4, 9)] == pytest.approx([0.0, 0.4, 0.9])  # lr·step/warmup
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55) and lr_at(500, cfg) == pytest.approx(0.1)  # held at min_lr after


def test_without_warm_up_the_schedule_is_the_cosine_from_the_first_step():
    cfg = TrainConfig(lr=2.0, min_lr=0.0, warmup_iters=0, max_iters=4)
    assert [lr_at(step, cfg) for step in range(5)] == pytest.approx(
        [1.0 + math.cos(math.pi * step / 4) for step in range(5)])


def test_all_but_norm_gains_decays_every_parameter_except_the_rmsnorm_gains():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, head_dim=16, vocab_size=64, block_size=16,
                          pos="grape_m_ctx+grape_a_qk"))
    decay, no_decay = param_groups(model, 0.1, "all_but_norm_gains")
    names = {id(p): name for name, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} == {n for n in names.values() if "norm" in n}
    assert "blocks.0.attn.rotation.log_theta" in {names[id(p)] for p in decay["params"]}
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)


def test_frozen_parameters_are_in_no_group():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, head_dim=16, vocab_size=64, block_size=16, pos="rope"))
    model.blocks[0].mlp.up.weight.requires_grad_(False)
    grouped = [p for group in param_groups(model, 0.1) for p in group["params"]]
    assert all(p is not model.blocks[0].mlp.up.weight for p in grouped)
    assert len(grouped) == sum(p.requires_grad for p in model.parameters())


def test_loaded_moments_keep_this_runs_weight_decay_and_betas_and_set_lr_sets_every_group():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, head_dim=16, vocab_size=64, block_size=16, pos="rope"))
    saved_cfg = TrainConfig(weight_decay=0.1, beta1=0.9, beta2=0.95)
    optimizer = make_optimizer(model, saved_cfg, torch.device("cpu"))
    x = torch.randint(0, 64, (2, 16))
    model(x, targets=x)[1].backward()
    optimizer.step()
    state = optimizer.state_dict()
    resumed = make_optimizer(model, saved_cfg, torch.device("cpu"))
    load_optimizer_state(resumed, state, TrainConfig(weight_decay=0.3, beta1=0.8, beta2=0.9))
    assert [(g["weight_decay"], g["betas"]) for g in resumed.param_groups] == [(0.3, (0.8, 0.9)), (0.0, (0.8, 0.9))]
    for p in model.parameters():
        assert torch.equal(resumed.state[p]["exp_avg"], optimizer.state[p]["exp_avg"])
    set_optimizer_settings(resumed, saved_cfg)
    assert [(g["weight_decay"], g["betas"]) for g in resumed.param_groups] == [(0.1, (0.9, 0.95)), (0.0, (0.9, 0.95))]
    set_lr(resumed, 0.125)
    assert [g["lr"] for g in resumed.param_groups] == [0.125, 0.125]
