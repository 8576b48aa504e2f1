"""Resume under every mix of the recipe keys (hypothesis; profiles in conftest.py).

A run's recipe keys are each left to the recipe, or set to the official or the clean value, in the config file
or on the command line. Whatever the mix, the resolved settings are the ones asked for (the values below are
written from docs/recipe.md, not read from config.RECIPES), and a resume from the config file, from
`train.py --resume RUN_DIR` or from RUN_DIR/config.json resolves exactly the saved settings and is accepted; each
single key changed on the resume is refused, unless --allow_changes names it (then recorded as a change), and
model keys and the keys fixed for a run are never allowed. The last test trains, stops and resumes two mixed
runs with train.py itself.
"""
import dataclasses
import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

import checkpoints
import train
from config import ConfigError, resolve
from model import GPTConfig
from training.errors import TrainError

# (section, key): (official value, clean value); spectrum_scale's official value depends on the encoding.
RECIPE_VALUES = {
    ("model", "qk_norm"): ("after", "before"),
    ("model", "spectrum_scale"): (None, 1.0),
    ("model", "p_norm_eps"): (0.0, 1e-5),
    ("train", "decay_params"): ("all_but_norm_gains", "matrices"),
    ("train", "lr_schedule"): ("official", "clean"),
    ("train", "grad_scale"): ("official", "mean"),
    ("train", "sampler"): ("random_offsets", "windows"),
    ("train", "seed"): (42, 1337),
}
POSITIONS = ["grape_m", "grape_m_ctx", "fox", "rope"]
MODEL = dict(n_layer=1, n_head=2, n_embd=16, head_dim=8, vocab_size=64, block_size=8)
TRAIN = dict(data_dir="DATA", batch_size=2, global_batch_size=8, max_iters=20, warmup_iters=2, reference_layout="2x2",
             device="cpu")


def wanted(choice, pos):
    if choice[1] == "official" and choice[0] == ("model", "spectrum_scale"):
        return 1.0 if pos == "grape_m_ctx" else 16.0  # the authors learn 16·log θ, log θ itself when contextual
    return RECIPE_VALUES[choice[0]][choice[1] == "clean"]


def toml_value(value):
    return json.dumps(value)


def write_config(path, recipe, pos, choices, where):
    """A config file with the recipe and the chosen keys; those marked "cli" are returned as overrides."""
    model, train_section, cli = dict(MODEL, pos=pos), dict(TRAIN, recipe=recipe), []
    for (section, key), kind in choices.items():
        if kind == "unset":
            continue
        value = wanted(((section, key), kind), pos)
        if where[(section, key)] == "cli":
            cli.append(f"--{section}.{key}={value}")
        else:
            (model if section == "model" else train_section)[key] = value
    text = "\n".join(["[model]"] + [f"{k} = {toml_value(v)}" for k, v in model.items()] +
                     ["[train]"] + [f"{k} = {toml_value(v)}" for k, v in train_section.items()]) + "\n"
    path.write_text(text)
    return cli


class OneProcess:
    world_size, rank, is_main = 1, 0, True


def start_run(run_dir, config_file, cli):
    """What train.py leaves in RUN_DIR after its first checkpoint (config.json and ckpt.pt, weights omitted)."""
    args = train.parse_args([str(config_file), *cli, f"--out_dir={run_dir}"])
    model_cfg, cfg = resolve(args.config_path, args.overrides, GPTConfig)
    code_version, train.code_version = train.code_version, lambda: "test"  # (two git calls each)
    try:
        resolved = train.resolved_config(args, model_cfg, cfg, None, [], OneProcess(), 1, "DATA", "byte")
    finally:
        train.code_version = code_version
    os.makedirs(run_dir)
    (run_dir / "config.json").write_text(json.dumps(resolved, indent=2))
    checkpoints.save(str(run_dir / "ckpt.pt"), {
        "model": {}, "model_config": resolved["model"], "tokenizer": "byte", "train_config": resolved["train"],
        "step": 3, "optimizer": {}, "rng": {}})
    return model_cfg, cfg


def resumed(argv):
    """(model config, train config, the deliberate changes) of a resume, as train.run resolves and checks them."""
    args = train.parse_args(argv)
    model_cfg, cfg = resolve(args.config_path, args.overrides, GPTConfig)
    _, changes, _ = train.open_checkpoint(args, cfg, dataclasses.asdict(model_cfg))
    return model_cfg, cfg, changes


kinds = st.sampled_from(["unset", "official", "clean"])
mixes = st.fixed_dictionaries({key: kinds for key in RECIPE_VALUES})
places = st.fixed_dictionaries({key: st.sampled_from(["file", "cli"]) for key in RECIPE_VALUES})


@given(recipe=st.sampled_from(["official", "clean"]), pos=st.sampled_from(POSITIONS), choices=mixes, where=places)
def test_any_mix_resolves_as_asked_and_resumes_with_its_own_settings(tmp_path_factory, recipe, pos, choices, where):
    root = tmp_path_factory.mktemp("mix")
    cli = write_config(root / "run.toml", recipe, pos, choices, where)
    run_dir = root / "run"
    model_cfg, cfg = start_run(run_dir, root / "run.toml", cli)
    for (section, key), kind in choices.items():
        value = getattr(model_cfg if section == "model" else cfg, key)
        assert value == wanted(((section, key), recipe if kind == "unset" else kind), pos), (key, kind)

    saved_model, saved_train = dataclasses.asdict(model_cfg), dataclasses.asdict(cfg)
    for argv in (["--resume", str(run_dir)], [str(run_dir / "config.json"), "--resume"],
                 [str(root / "run.toml"), *cli, f"--out_dir={run_dir}", "--resume"]):
        again_model, again_train, changes = resumed(argv)
        assert dataclasses.asdict(again_model) == saved_model, argv
        assert dataclasses.asdict(again_train) == saved_train, argv
        assert changes == []


def other_value(section, key, saved):
    if (section, key) in RECIPE_VALUES:
        official, clean = RECIPE_VALUES[section, key]
        return clean if saved != clean else (official if official is not None else 16.0)
    if key in ("dtype", "data_dir", "reference_layout", "global_batch_size"):
        return {"dtype": "bf16", "data_dir": "OTHER", "reference_layout": "4x2", "global_batch_size": 16}[key]
    changed = {"lr": 2, "min_lr": 0.5, "max_iters": 1.25, "warmup_iters": 1.5, "weight_decay": 2, "beta1": 0.9,
               "beta2": 0.9, "grad_clip": 0.5}[key] * saved
    return int(changed) if isinstance(saved, int) else changed


CHANGEABLE = [("train", k) for k in ("seed", "max_iters", "lr", "min_lr", "warmup_iters", "weight_decay", "beta1",
                                     "beta2", "grad_clip", "dtype", "data_dir", "lr_schedule", "grad_scale",
                                     "sampler")]
FIXED = [("train", "decay_params"), ("train", "global_batch_size")]
MODEL_KEYS = [("model", k) for k in ("qk_norm", "spectrum_scale", "p_norm_eps", "n_layer", "pos")]


@given(recipe=st.sampled_from(["official", "clean"]), pos=st.sampled_from(POSITIONS), choices=mixes,
       changed=st.sampled_from(CHANGEABLE + FIXED + MODEL_KEYS), from_file=st.booleans())
def test_each_single_changed_key_is_refused_unless_allowed(tmp_path_factory, recipe, pos, choices, changed,
                                                           from_file):
    root = tmp_path_factory.mktemp("change")
    cli = write_config(root / "run.toml", recipe, pos, choices, {key: "file" for key in RECIPE_VALUES})
    run_dir = root / "run"
    model_cfg, cfg = start_run(run_dir, root / "run.toml", cli)
    section, key = changed
    saved = getattr(model_cfg if section == "model" else cfg, key)
    new = "alibi" if key == "pos" else 2 if key == "n_layer" else other_value(section, key, saved)
    if key == "pos" and saved == "alibi":
        new = "rope"
    base = [str(root / "run.toml"), f"--out_dir={run_dir}", "--resume"] if from_file else ["--resume", str(run_dir)]
    argv = base + [f"--{section}.{key}={new}"]
    if section == "model":
        with pytest.raises(TrainError, match=f"model config differs from the checkpoint's in [a-z_, ]*{key}"):
            resumed(argv)
        return
    with pytest.raises(TrainError, match=f"train.{key} is {new!r} here but {saved!r} in the checkpoint"):
        resumed(argv)
    if changed in FIXED:
        with pytest.raises(ConfigError, match=f"--allow_changes cannot change {key}"):
            resumed(argv + [f"--allow_changes={key}"])
        return
    _, again, changes = resumed(argv + [f"--allow_changes={key}"])
    assert changes == [{"key": key, "from": saved, "to": new}]
    assert getattr(again, key) == new


@pytest.mark.parametrize("key,value", [("sampler", "windows"), ("grad_scale", "mean")])
def test_leaving_the_official_sampler_or_scale_on_purpose_is_one_change(tmp_path, key, value):
    """An official run whose other key is clean (so reference_layout serves only `key`) may leave the official `key`
    with --allow_changes=key alone: the then unused reference_layout is no second change, and the refusal without
    it names `key`, not a reference_layout the user never changed."""
    other = {"sampler": "grad_scale", "grad_scale": "sampler"}[key]
    choices = {k: "unset" for k in RECIPE_VALUES}
    choices["train", other] = "clean"
    cli = write_config(tmp_path / "run.toml", "official", "rope", choices, {k: "file" for k in RECIPE_VALUES})
    start_run(tmp_path / "run", tmp_path / "run.toml", cli)
    argv = ["--resume", str(tmp_path / "run"), f"--{key}={value}"]
    with pytest.raises(TrainError, match=f"cannot resume [^:]*: train.{key} is [^;]*; the loss sequence depends on it,"):
        resumed(argv)
    _, cfg, changes = resumed(argv + [f"--allow_changes={key}"])
    assert changes == [{"key": key, "from": RECIPE_VALUES["train", key][0], "to": value}]
    assert getattr(cfg, key) == value and cfg.reference_layout == "2x2"


@pytest.mark.parametrize("mix", [
    {"recipe": "official", "qk_norm": "before", "sampler": "windows", "seed": 7},
    {"recipe": "clean", "grad_scale": "official", "sampler": "random_offsets", "p_norm_eps": 0.0},
])
def test_a_mixed_run_resumed_by_run_directory_trains_exactly_as_uninterrupted(tmp_path, one_thread, mix):
    """train.py end to end: a run with one official and one clean key (recipe keys on the command line), stopped
    after 2 steps and continued by `train.py --resume RUN_DIR`, keeps its config.json settings and loses exactly
    what the uninterrupted run loses."""
    from helpers import synthetic_corpus, tiny_config
    data_dir = synthetic_corpus(tmp_path, 6, 400, val_tokens=600)
    config_file = tmp_path / "tiny.toml"
    config_file.write_text(tiny_config(data_dir, model={"pos": "grape_ap", "n_layer": 1}, max_iters=5,
                                       reference_layout="2x2"))
    cli = [f"--{key}={value}" for key, value in mix.items()]
    whole = train.run([str(config_file), *cli, f"--out_dir={tmp_path / 'whole'}"])
    run_dir = tmp_path / "run"
    train.run([str(config_file), *cli, "--stop_iter=2", f"--out_dir={run_dir}"])
    before = json.loads((run_dir / "config.json").read_text())
    rest = train.run(["--resume", str(run_dir)])
    after = json.loads((run_dir / "config.json").read_text())
    assert after["model"] == before["model"]
    assert after["train"] == {**before["train"], "stop_iter": 0}
    for key, value in mix.items():
        assert {**after["model"], **after["train"]}[key] == value
    assert rest["losses"] == pytest.approx(whole["losses"][2:], rel=1e-6)
