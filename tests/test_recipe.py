"""The "official" recipe trains as the authors' code does and "clean" as this project prefers
(docs/recipe.md): each difference checked against a formula or a second code path written here."""
import dataclasses
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

import positional
import train
from training.checkpointing import check_resume_compatible
from training.optimizer import lr_at, param_groups
from config import RECIPES, ConfigError, TrainConfig, resolve
from model import GPT, GPTConfig
from checkpoints import load_gpt
from test_model import make, perturb_positional_parameters, tokens

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def official_model(pos="grape_m") -> dict:
    """The model keys the official recipe sets for this encoding."""
    return {k: v({"pos": pos}) if callable(v) else v for k, v in RECIPES["official"]["model"].items()}


OFFICIAL_MODEL = official_model()


def tiny_config(**kw):
    values = dict(n_layer=1, n_head=2, n_embd=32, head_dim=8, vocab_size=53, block_size=32, pos="grape_m")
    return GPTConfig(**{**values, **kw})


def perturb_norm_gains(model, seed=7):
    """Unequal q/k gains within a rotated pair: where normalising before or after the rotation differs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))


# ----------------------------------------------------------------------------- config plumbing

def test_paper_configs_use_the_official_recipe_and_clean_or_a_key_overrides_it():
    path = os.path.join(REPO, "configs", "medium", "grape_m.toml")
    model_cfg, cfg = resolve(path, [], GPTConfig)
    assert cfg.recipe == "official" and (cfg.decay_params, cfg.lr_schedule) == ("all_but_norm_gains", "official")
    assert (model_cfg.qk_norm, model_cfg.spectrum_scale, model_cfg.p_norm_eps) == ("after", 16.0, 0.0)
    assert cfg.num_steps == cfg.max_iters + 1 == 25001
    model_cfg, cfg = resolve(path, ["--recipe=clean"], GPTConfig)
    defaults = GPTConfig()
    assert (model_cfg.qk_norm, model_cfg.spectrum_scale, model_cfg.p_norm_eps) == \
        (defaults.qk_norm, defaults.spectrum_scale, defaults.p_norm_eps)
    assert (cfg.decay_params, cfg.lr_schedule, cfg.num_steps) == \
        (TrainConfig().decay_params, TrainConfig().lr_schedule, 25000)
    model_cfg, cfg = resolve(path, ["--qk_norm=before", "--lr_schedule=clean"], GPTConfig)  # a set key wins
    assert (model_cfg.qk_norm, model_cfg.spectrum_scale, cfg.lr_schedule, cfg.decay_params) == \
        ("before", 16.0, "clean", "all_but_norm_gains")
    for large in ("rope", "grape_ap+kv_shift"):
        assert resolve(os.path.join(REPO, "configs", "large", f"{large}.toml"), [], GPTConfig)[1].recipe == "official"


def test_official_gradient_scale_sampler_seed_and_spectrum_follow_the_authors_configs():
    """Their medium runs are 8 GPUs x 3 micro-batches of 20, the large ones 8 x 4 of 15 (gradient 3x / 4x the
    mean); their contextual GRAPE-M learns log θ itself, the non-contextual one 16·log θ."""
    for size, pos, layout, scale, spectrum in (("medium", "grape_m", (8, 3), 3, 16.0), ("medium", "grape_m_ctx", (8, 3), 3, 1.0),
                                                ("large", "grape_m_ctx", (8, 4), 4, 1.0), ("large", "rope", (8, 4), 4, 16.0)):
        model_cfg, cfg = resolve(os.path.join(REPO, "configs", size, f"{pos}.toml"), [], GPTConfig)
        assert cfg.reference_processes_and_micro_steps() == layout and cfg.global_batch_size == 480
        assert (cfg.loss_scale, cfg.sampler, cfg.seed, model_cfg.spectrum_scale) == (scale, "random_offsets", 42, spectrum)
        _, on_one_gpu = resolve(os.path.join(REPO, "configs", size, f"{pos}.toml"), ["--batch_size=1"], GPTConfig)
        assert on_one_gpu.loss_scale == scale  # the run's own split does not change it
        clean_model, clean = resolve(os.path.join(REPO, "configs", size, f"{pos}.toml"), ["--recipe=clean"], GPTConfig)
        assert (clean.loss_scale, clean.sampler, clean.seed, clean_model.spectrum_scale) == (1, "windows", 1337, 1.0)
    model_cfg, _ = resolve(os.path.join(REPO, "configs", "medium", "grape_m_ctx.toml"), ["--pos=grape_m_ctx+alibi"],
                           GPTConfig)
    assert model_cfg.spectrum_scale == 1.0
    path = os.path.join(REPO, "configs", "medium", "rope.toml")
    with pytest.raises(ConfigError, match="grad_scale = official needs the authors' launch as PROCESSESxMICRO_BATCHES"):
        resolve(path, ["--reference_layout="], GPTConfig)
    with pytest.raises(ConfigError, match="'8x7' does not divide global_batch_size 480"):
        resolve(path, ["--reference_layout=8x7"], GPTConfig)
    assert resolve(path, ["--reference_layout=", "--grad_scale=mean", "--sampler=windows"], GPTConfig)[1].loss_scale == 1
    with pytest.raises(ConfigError, match="recipe = 'paper' is not valid; it must be official or clean"):
        resolve(path, ["--recipe=paper"], GPTConfig)


# ----------------------------------------------------------------------------- learning-rate schedule

def test_warmup_first_learning_rates_and_step_count():
    official = TrainConfig(lr=2.0, min_lr=0.2, warmup_iters=4, max_iters=24, lr_schedule="official")
    clean = dataclasses.replace(official, lr_schedule="clean")
    # official (nanoGPT's get_lr): lr·it/warmup from it = 0, iterations 0..max_iters
    assert [lr_at(s, official) for s in range(5)] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])
    assert [lr_at(s, clean) for s in range(5)] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0])
    for cfg in (official, clean):  # the same cosine afterwards, min_lr at iteration max_iters
        assert lr_at(14, cfg) == pytest.approx(0.2 + 0.5 * (1 + math.cos(math.pi * 10 / 20)) * 1.8)
        assert lr_at(24, cfg) == pytest.approx(0.2)
    assert (official.num_steps, clean.num_steps) == (25, 24)


def test_official_run_takes_max_iters_plus_one_steps_with_the_official_rates(tmp_path):
    from data.prepare import files_source, prepare
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the model reads every token and learns the next one. " * 400)
    prepare(files_source(str(corpus)), str(tmp_path / "data"), tokenizer="byte", val_tokens=1024,
            shard_tokens=50_000, workers=1, progress_bar=False)
    config = tmp_path / "tiny.toml"
    config.write_text(f"""
[model]
n_layer = 1
n_head = 2
n_embd = 16
head_dim = 8
vocab_size = 320
block_size = 16
pos = "grape_m"
[train]
recipe = "official"
reference_layout = "1x1"
data_dir = "{tmp_path / 'data'}"
batch_size = 2
global_batch_size = 2
max_iters = 6
warmup_iters = 3
lr = 3e-3
min_lr = 3e-4
log_interval = 1
eval_interval = 0
eval_windows = 2
ckpt_interval = 0
device = "cpu"
""")
    out = train.run([str(config), f"--out_dir={tmp_path / 'run'}"])
    assert out["step"] == 7 and len(out["losses"]) == 7
    lrs = [json.loads(line)["lr"] for line in open(tmp_path / "run" / "metrics.jsonl")
           if json.loads(line)["type"] == "train"]
    cosine = lambda s: 3e-4 + 0.5 * (1 + math.cos(math.pi * (s - 3) / 3)) * 2.7e-3  # noqa: E731
    assert lrs == pytest.approx([0.0, 1e-3, 2e-3, 3e-3, cosine(4), cosine(5), 3e-4])
    saved = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    assert saved["model_config"]["spectrum_scale"] == 16.0 and "blocks.0.attn.rotation.scaled_log_theta" in saved["model"]


# ----------------------------------------------------------------------------- weight decay and the spectrum

def test_official_decay_set_is_every_parameter_but_the_norm_gains():
    pos = "grape_m_ctx+grape_a_qk"
    model = GPT(tiny_config(pos=pos, kv_shift=True, spectrum_per_head=True, **official_model(pos)))
    decay, no_decay = param_groups(model, 0.01, "all_but_norm_gains")
    by_id = {id(p): name for name, p in model.named_parameters()}
    no_decay_names = {by_id[id(p)] for p in no_decay["params"]}
    assert no_decay_names == {"blocks.0.attn_norm.weight", "blocks.0.mlp_norm.weight", "norm.weight",
                              "blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.weight"}
    decay_names = {by_id[id(p)] for p in decay["params"]}
    assert decay_names == set(by_id.values()) - no_decay_names
    assert {"blocks.0.attn.rotation.log_theta", "blocks.0.attn.rotation.phase_increment.bias",
            "blocks.0.attn.bias.rate", "blocks.0.attn.bias.query_gate", "blocks.0.attn.bias.key_gate"} <= decay_names
    fox = GPT(tiny_config(pos="fox"))
    fox_decayed = {id(p) for p in param_groups(fox, 0.01, "all_but_norm_gains")[0]["params"]}
    assert id(fox.blocks[0].attn.bias.gate.bias) in fox_decayed


def test_one_adamw_step_moves_log_theta_as_the_official_parametrisation_does():
    """Adam's first step moves a parameter by lr·g/(|g| + eps) ≈ lr whatever the gradient's size, so log θ
    stored as 16·log θ moves 16x less: here log θ_new = log θ·(1 - lr·wd) - (lr/16)·g/(|g| + 16·eps) with
    g = dL/dlog θ taken from a second, unscaled model with the same weights."""
    lr, wd, eps = 1e-3, 0.01, 1e-8
    torch.manual_seed(0)
    official = GPT(tiny_config(**OFFICIAL_MODEL))
    perturb_norm_gains(official)
    unscaled = GPT(tiny_config(**{**OFFICIAL_MODEL, "spectrum_scale": 1.0}))
    state = dict(official.state_dict())
    name = "blocks.0.attn.rotation.scaled_log_theta"
    log_theta = state.pop(name) / 16
    state["blocks.0.attn.rotation.log_theta"] = log_theta
    unscaled.load_state_dict(state)
    idx, targets = tokens(B=2, T=12), tokens(B=2, T=12, seed=2)
    unscaled(idx, targets)[1].backward()
    g = unscaled.blocks[0].attn.rotation.log_theta.grad
    assert (g.abs() > 1e-6).all()

    optimizer = torch.optim.AdamW(param_groups(official, wd, "all_but_norm_gains"), lr=lr, eps=eps)
    official(idx, targets)[1].backward()
    optimizer.step()
    moved = official.blocks[0].attn.rotation.spectrum().detach()
    expected = log_theta * (1 - lr * wd) - (lr / 16) * g / (g.abs() + 16 * eps)
    torch.testing.assert_close(moved, expected, atol=1e-6, rtol=0)  # fp32 rounding of |log θ| < 7; steps are 6e-5
    steps = (moved - log_theta).abs()
    assert steps.max() < 1.1 * lr / 16 + lr * wd * log_theta.abs().max()  # vs about lr for the clean recipe

    clean_optimizer = torch.optim.AdamW(param_groups(unscaled, wd, "matrices"), lr=lr, eps=eps)
    clean_optimizer.step()  # log θ is not decayed under "matrices" and moves by about lr
    torch.testing.assert_close(unscaled.blocks[0].attn.rotation.log_theta.detach(),
                               log_theta - lr * g / (g.abs() + eps), atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- model options

def explicit_attention(attn, x, positions, gains_after_rotation):
    """One attention layer from its definition: q, k from the weights, rotated by matrices exp(n·Σθ_i L_i),
    RMS-normalised with the learned gains before or after the rotation, causal softmax."""
    B, T, _ = x.shape
    H, d = attn.n_head, attn.head_dim
    q, k, v = (x @ attn.qkv.weight.T).view(B, T, 3, H, d).permute(2, 0, 3, 1, 4)
    theta = attn.rotation.spectrum().exp()
    half = torch.arange(d // 2)
    rotations = []
    for n in positions.tolist():
        L = torch.zeros(d, d)
        L[half + d // 2, half], L[half, half + d // 2] = n * theta, -n * theta
        rotations.append(torch.linalg.matrix_exp(L))
    R = torch.stack(rotations)  # (T, d, d)

    def norm(u, gain):
        return gain * u / torch.sqrt(u.pow(2).mean(-1, keepdim=True) + attn.q_norm.eps)

    def rotate(u):
        return torch.einsum("tij,bhtj->bhti", R, u)

    if gains_after_rotation:
        q, k = norm(rotate(q), attn.q_norm.weight), norm(rotate(k), attn.k_norm.weight)
    else:
        q, k = rotate(norm(q, attn.q_norm.weight)), rotate(norm(k, attn.k_norm.weight))
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    logits = logits.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    y = torch.softmax(logits, -1) @ v
    return y.transpose(1, 2).reshape(B, T, H * d) @ attn.proj.weight.T


@pytest.mark.parametrize("order", ["after", "before"])
def test_qk_norm_after_is_rotate_then_normalise(order):
    torch.set_default_dtype(torch.float64)
    try:
        model = GPT(tiny_config(qk_norm=order))
        perturb_positional_parameters(model)
        perturb_norm_gains(model)
        attn = model.blocks[0].attn
        x = torch.randn(2, 9, 32)
        positions = torch.arange(5, 14)
        with torch.no_grad():
            got = attn(x, positions)
            expected = explicit_attention(attn, x, positions, gains_after_rotation=order == "after")
            other = explicit_attention(attn, x, positions, gains_after_rotation=order != "after")
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)  # RMSNorm computes in fp32
        assert (got - other).abs().max() > 1e-3  # unequal gains: the two orders differ
        with torch.no_grad():  # equal gains commute with the rotation: both orders agree
            attn.q_norm.weight.fill_(1.3)
            attn.k_norm.weight.fill_(0.8)
            torch.testing.assert_close(explicit_attention(attn, x, positions, True),
                                       explicit_attention(attn, x, positions, False), atol=1e-10, rtol=1e-10)
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("pos", ["rope+grape_ap", "grape_m_ctx+fox", "grape_m_basis+grape_a_qk"])
def test_official_model_options_keep_the_cache_and_fast_path_exact(pos):
    model = make(pos, kv_shift=True, **official_model(pos))
    perturb_norm_gains(model)
    idx = tokens(T=11)
    with torch.no_grad():
        full = model(idx)[0]
        cache = model.new_cache(2, 11)
        steps = torch.cat([model(idx[:, :6], cache=cache)[0]] + [model(idx[:, t:t + 1], cache=cache)[0]
                                                                 for t in range(6, 11)], dim=1)
        dense = make(pos, kv_shift=True, backend="dense", **official_model(pos))
        dense.load_state_dict(model.state_dict())
    torch.testing.assert_close(steps, full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dense(idx)[0], full, atol=1e-4, rtol=1e-4)


def test_official_path_norm_epsilon_is_rms_norms_default():
    bias = positional.PathIntegral(n_head=2, n_embd=16, p_head_dim=8, norm_eps=0.0)
    x = torch.randn(1, 5, 16) * 1e-3  # small p: the epsilon matters
    qf, kf = bias.features(x, None, None, torch.arange(5), {})
    p = bias.path(x).view(1, 5, 2, 8).transpose(1, 2)
    angles = torch.arange(5.0)[:, None].expand(5, 4)
    expected = positional.rotate_planes(F.rms_norm(p, (8,)), angles)  # torch's own default epsilon
    torch.testing.assert_close(kf["r"], expected, atol=1e-6, rtol=1e-5)
    clean = positional.rotate_planes(F.rms_norm(p, (8,), eps=1e-5), angles)
    assert (kf["r"] - clean).abs().max() > 1e-2


def test_rotation_direction_is_a_sign_flip_of_weight_rows(monkeypatch):
    """The official code rotates each pair by -angle. Flipping the sign of rows d/2..d-1 of W_q, W_k (per head)
    and of W_p (per path head) turns our model into that one exactly, so it is a relabelling of weights."""
    model = make("rope+grape_ap", kv_shift=False, **OFFICIAL_MODEL)
    perturb_norm_gains(model)
    flipped = make("rope+grape_ap", kv_shift=False, **OFFICIAL_MODEL)
    flipped.load_state_dict(model.state_dict())
    with torch.no_grad():
        for block in flipped.blocks:
            qkv = block.attn.qkv.weight.view(3, 4, 8, -1)  # (q/k/v, head, head_dim, n_embd)
            qkv[:2, :, 4:] *= -1
            path = block.attn.bias.path.weight.view(4, 8, -1)  # (head, p_head_dim, n_embd)
            path[:, 4:] *= -1
    idx = tokens(T=10)
    with torch.no_grad():
        ours, unflipped = flipped(idx)[0], model(idx)[0]
        rotate = positional.rotate_planes
        monkeypatch.setattr(positional, "rotate_planes", lambda x, angles: rotate(x, -angles))
        official_direction = model(idx)[0]
    torch.testing.assert_close(ours, official_direction, atol=1e-5, rtol=1e-5)
    assert (ours - unflipped).abs().max() > 1e-3  # without the flip the logits differ


# ----------------------------------------------------------------------------- checkpoints from before the recipes

def test_checkpoint_from_before_the_recipes_loads_with_its_own_spectrum(tmp_path):
    torch.manual_seed(0)
    model = GPT(tiny_config())  # written before: log θ learned unscaled, QK-norm before the rotation
    perturb_positional_parameters(model)
    perturb_norm_gains(model)
    old_config = {k: v for k, v in dataclasses.asdict(model.config).items()
                  if k not in ("qk_norm", "spectrum_scale", "p_norm_eps")}
    torch.save({"model": model.state_dict(), "model_config": old_config}, tmp_path / "ckpt.pt")
    loaded, _ = load_gpt(str(tmp_path))
    idx = tokens(T=8)
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    # its weights cannot be read as the official parametrisation: one clear error, no silent misreading
    from checkpoints import load_model
    from config import UserError
    torch.save({"model": model.state_dict(), "model_config": {**old_config, "spectrum_scale": 16.0},
                "tokenizer": "byte"}, tmp_path / "scaled.pt")
    with pytest.raises(UserError, match="the weights do not match its model_config"):
        load_model(str(tmp_path / "scaled.pt"))


def test_resuming_a_checkpoint_from_before_the_recipes_names_the_recipe_it_used():
    model_cfg, cfg = resolve(os.path.join(REPO, "configs", "medium", "grape_m.toml"), [], GPTConfig)
    new = dataclasses.asdict(model_cfg)
    old = {k: v for k, v in new.items() if k not in ("qk_norm", "spectrum_scale", "p_norm_eps")}
    old_train = {k: v for k, v in dataclasses.asdict(cfg).items()
                 if k not in ("recipe", "decay_params", "lr_schedule", "grad_scale", "sampler", "reference_layout")}
    old_train["seed"] = 1337  # the default then
    with pytest.raises(train.TrainError, match=r"differs from the checkpoint's in p_norm_eps, qk_norm, spectrum_scale "
                                               r"\(model.p_norm_eps is 0.0 here but 1e-05 in the checkpoint; .*\); "
                                               r"resume with --p_norm_eps=1e-05 --qk_norm=before --spectrum_scale=1.0 "
                                               r".*trained with --recipe=clean\."):
        check_resume_compatible({"model_config": old, "train_config": old_train}, new, cfg, "ckpt.pt")
    clean_model, clean = resolve(os.path.join(REPO, "configs", "medium", "grape_m.toml"), ["--recipe=clean"], GPTConfig)
    check_resume_compatible({"model_config": old, "train_config": old_train},
                                  dataclasses.asdict(clean_model), clean, "ckpt.pt")  # accepted
    with pytest.raises(train.TrainError, match="train.decay_params is 'all_but_norm_gains' here but 'matrices'"):
        check_resume_compatible({"model_config": old, "train_config": old_train},
                                      dataclasses.asdict(clean_model), cfg, "ckpt.pt")
