"""config.py: the config file's keys and messages, the train config's ranges at their limits, and resolving and
resuming under every mix of the recipe keys."""
import dataclasses
import json
import math
import os

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import checkpoints
import config
import train
from config import ConfigError, TrainConfig, resolve
from helpers import down, up
from model import GPTConfig
from training.errors import TrainError


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_an_unknown_key_with_no_close_match_lists_every_valid_key():
    assert config.closest_hint("zzzz", ["beta", "alpha"]) == "valid keys: alpha, beta"
    assert config.closest_hint("alpah", ["beta", "alpha"]) == "did you mean 'alpha'?"


def test_a_missing_config_file_names_its_closest_sibling(tmp_path):
    (tmp_path / "tiny.toml").write_text("")
    (tmp_path / "other.toml").write_text("")
    error = config.missing_config(str(tmp_path / "tinny.toml"), resume=False)
    assert str(error) == f"config file {tmp_path / 'tinny.toml'} does not exist; did you mean {tmp_path / 'tiny.toml'}?"
    far = config.missing_config(str(tmp_path / "zzzzzz.toml"), resume=False)
    assert str(far).endswith("does not exist; pick one of the files under configs/.")
    (tmp_path / "a.toml").write_text("")  # named without .toml: the file itself, though "a" is not close to "a.toml"
    bare = config.missing_config(str(tmp_path / "a"), resume=False)
    assert str(bare) == f"config file {tmp_path / 'a'} does not exist; did you mean {tmp_path / 'a'}.toml?"


def test_a_missing_config_named_without_a_folder_is_looked_for_in_the_current_one(tmp_path, monkeypatch):
    (tmp_path / "tiny.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    assert str(config.missing_config("tinny.toml", resume=False)) == \
        "config file tinny.toml does not exist; did you mean tiny.toml?"


@pytest.mark.parametrize("pos, scale", [("grape_m_ctx", 1.0), ("rope + grape_m_ctx", 1.0), ("grape_m_ctx+kv_shift", 1.0),
                                        ("grape_m", 16.0), ("grape_m + kv_shift", 16.0)])
def test_the_official_spectrum_scale_reads_a_composition_with_or_without_spaces(pos, scale):
    assert config.official_spectrum_scale({"pos": pos}) == scale


def test_run_directories_looks_max_depth_levels_down_and_past_unreadable_folders(tmp_path, monkeypatch):
    for run in ("a/b/c", "a/b/c2/d", "z/run"):  # 3 levels, 4 levels, and one after an unreadable folder
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "ckpt.pt").write_bytes(b"")
    (tmp_path / "m").mkdir()  # visited before z
    assert config.run_directories(str(tmp_path), max_depth=3) == [str(tmp_path / "a/b/c"), str(tmp_path / "z/run")]
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: (_ for _ in ()).throw(PermissionError(path))
                        if os.path.basename(path) == "m" else real(path))
    assert config.run_directories(str(tmp_path), max_depth=3) == [str(tmp_path / "a/b/c"), str(tmp_path / "z/run")]


def test_a_badly_typed_model_key_in_the_file_is_named_with_its_section(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nn_layer = "two"\n[train]\ndata_dir = "d"\nout_dir = "o"\n')
    with pytest.raises(config.ConfigError) as caught:
        config.resolve(str(path), [], GPTConfig)
    assert "model.n_layer" in str(caught.value)


@pytest.mark.parametrize("content, message", [
    # a Latin-1 comment: UnicodeDecodeError from tomllib, with a traceback, before
    ("[train]\nmax_iters = 2\n# r\u00e9sum\u00e9\n".encode("latin-1"), "is not UTF-8 text; save it as UTF-8."),
    # TypeError tracebacks before: an int is not iterable; os.path.join refuses an int
    (b"include = 5\n", "include = 5 is not valid; include must be a file path or a list of file paths"),
    (b'include = ["base.toml", 3]\n', "include = ['base.toml', 3] is not valid; include must be a file path or a list"),
    # a section's own name with a plain value was answered "unknown top-level entry 'model'; did you mean 'model'?"
    (b"model = 3\n", "model = 3 is not valid; model must be a table: write [model] on a line of its own"),
    (b'train = "x"\n', "train = 'x' is not valid; train must be a table: write [train] on a line of its own"),
])
@pytest.mark.fault
def test_a_config_file_of_the_wrong_form_is_one_config_error_naming_it(tmp_path, content, message):
    (tmp_path / "base.toml").write_text("[train]\nmax_iters = 3\n")
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        config.read_toml(str(path))
    assert str(caught.value).startswith(("config file " + str(path), str(path) + ":"))
    assert message in str(caught.value) and "did you mean" not in str(caught.value)


@pytest.mark.fault
def test_train_py_says_a_config_file_is_not_utf8_in_one_line_with_exit_code_2(tmp_path, monkeypatch, capsys):
    path = tmp_path / "latin1.toml"
    path.write_bytes("# caf\u00e9\n[train]\nmax_iters = 2\n".encode("latin-1"))
    monkeypatch.setattr("sys.argv", ["train.py", str(path), f"--out_dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as exit_info:
        train.main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: config file {path} is not UTF-8 text; save it as UTF-8."
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- properties: resume under every mix of the recipe keys
# A run's recipe keys are each left to the recipe, or set to the official or the clean value, in the config file or on
# the command line. Whatever the mix, the resolved settings are the ones asked for (the values below are written from
# docs/recipe.md, not read from config.RECIPES), and a resume from the config file, from `train.py --resume RUN_DIR`
# or from RUN_DIR/config.json resolves exactly the saved settings and is accepted; each single key changed on the
# resume is refused, unless --allow_changes names it (then recorded as a change), and model keys and the keys fixed
# for a run are never allowed. The last test trains, stops and resumes two mixed runs with train.py itself.


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


# -------------------------------------------------- properties: every threshold at, just below and just above its limit
# Each limit is written here from its documented rule, not read from the code: the divergence rules
# (training/divergence.py's docstring), the config's ranges (TrainConfig's field comments), token ids against the
# vocabulary (a batch, a shard, an adopted GPT-2 folder) and the memory check before any work. "Just below" and "just
# above" are the neighbouring float (math.nextafter) or integer, so a comparison moved by one is caught.


# (key, the smallest allowed value, a step to the refused side): integer keys and their lower limits.
INTEGER_FLOORS = [("batch_size", 1), ("max_iters", 1), ("seed", 0), ("dist_timeout_s", 1), ("log_interval", 1),
                  ("eval_interval", 0), ("ckpt_interval", 0), ("stop_iter", 0), ("eval_windows", 1),
                  ("warmup_iters", 0)]


def valid(**changes):
    cfg = TrainConfig(data_dir="d", batch_size=2, global_batch_size=8, max_iters=100, warmup_iters=10, lr=1e-3,
                      min_lr=1e-4)
    return dataclasses.replace(cfg, **changes)


def refused(**changes):
    with pytest.raises(ConfigError) as error:
        valid(**changes).validate()
    return str(error.value)


@pytest.mark.parametrize("key,floor", INTEGER_FLOORS)
@given(above=st.integers(min_value=0, max_value=10**6))
def test_integer_keys_at_and_around_their_floor(key, floor, above):
    changes = {key: floor + above}
    if key == "max_iters":
        changes["warmup_iters"] = 0
    if key == "warmup_iters":
        changes["max_iters"] = floor + above + 1
    if key == "batch_size":
        changes["global_batch_size"] = floor + above
    valid(**changes).validate()
    assert key in refused(**{key: floor - 1 - above})


@given(max_iters=st.integers(min_value=1, max_value=10**6))
def test_warmup_must_end_before_the_last_step(max_iters):
    valid(max_iters=max_iters, warmup_iters=max_iters - 1).validate()
    assert "warmup_iters" in refused(max_iters=max_iters, warmup_iters=max_iters)


@given(batch=st.integers(min_value=1, max_value=4096))
def test_global_batch_at_least_the_micro_batch(batch):
    valid(batch_size=batch, global_batch_size=batch).validate()
    assert "global_batch_size" in refused(batch_size=batch, global_batch_size=batch - 1)


@given(lr=st.floats(min_value=1e-8, max_value=10.0))
def test_learning_rates_at_their_limits(lr):
    valid(lr=lr, min_lr=lr).validate()
    valid(lr=lr, min_lr=0.0).validate()
    assert "min_lr" in refused(lr=lr, min_lr=up(lr))
    assert "min_lr" in refused(lr=lr, min_lr=-5e-324)
    for bad in (0.0, -lr, math.inf, math.nan):
        assert "lr must be a positive number" in refused(lr=bad, min_lr=0.0)
    valid(lr=5e-324, min_lr=0.0).validate()


@pytest.mark.parametrize("key", ["beta1", "beta2"])
def test_betas_in_the_half_open_unit_interval(key):
    valid(**{key: 0.0}).validate()
    valid(**{key: down(1.0)}).validate()
    assert "beta1 and beta2" in refused(**{key: 1.0})
    assert "beta1 and beta2" in refused(**{key: -5e-324})


@pytest.mark.parametrize("key", ["weight_decay", "grad_clip"])
@given(value=st.floats(min_value=0.0, max_value=1e300))
def test_non_negative_finite_keys(key, value):
    valid(**{key: value}).validate()
    assert key in refused(**{key: -5e-324})
    assert key in refused(**{key: math.inf})


@given(factor=st.floats(min_value=1.0, max_value=1e300, exclude_min=True))
def test_spike_factor_is_off_or_above_one(factor):
    valid(spike_factor=factor).validate()
    valid(spike_factor=0.0).validate()
    for bad in (1.0, down(1.0), 0.5, 5e-324, -1.0, math.inf):
        assert "spike_factor" in refused(spike_factor=bad)


@given(processes=st.integers(1, 16), micro=st.integers(1, 16), rows=st.integers(1, 8), extra=st.integers(1, 7))
def test_reference_layout_divides_the_global_batch(processes, micro, rows, extra):
    fits = valid(batch_size=1, global_batch_size=processes * micro * rows, grad_scale="official",
                 reference_layout=f"{processes}x{micro}")
    fits.validate()
    assert fits.reference_processes_and_micro_steps() == (processes, micro)
    assert fits.loss_scale == micro
    assume(extra % (processes * micro))
    assert "does not divide" in refused(batch_size=1, global_batch_size=processes * micro * rows + extra,
                                        grad_scale="official",
                                        reference_layout=f"{processes}x{micro}")


OUT_OF_RANGE = {"batch_size": 0, "max_iters": 0, "seed": -1, "lr": float("nan"), "weight_decay": -0.1,
                "grad_clip": -1.0, "spike_factor": 0.5, "dist_timeout_s": 0, "log_interval": 0, "eval_windows": 0,
                "activation_checkpointing_every": 0, "loss_chunk_tokens": 0,
                **{key: "nonsense" for key in ("device", "dtype", "wandb_mode", "recipe", "decay_params",
                                               "lr_schedule", "sampler", "grad_scale", "parallel", "fsdp_bf16",
                                               "activation_checkpointing", "loss")}}


@pytest.mark.parametrize("key", sorted(OUT_OF_RANGE))
def test_a_setting_out_of_its_range_names_the_key_and_its_default_both_ways(key):
    """Each setting that the remedy names by its key: the key's own default, as a flag and as a study file's key."""
    default = getattr(TrainConfig, key)
    cfg = dataclasses.replace(TrainConfig(), **{key: OUT_OF_RANGE[key]})
    with pytest.raises(ConfigError) as flags:
        cfg.validate()
    assert str(flags.value).startswith(f"{key} must be ") and f"not {OUT_OF_RANGE[key]!r}".replace("'", "") in \
        str(flags.value).replace("'", "")
    assert str(flags.value).endswith(f"; set it in [train] or with --{key}=..., e.g. --{key}={default} (the default).")
    with pytest.raises(ConfigError) as study_file:
        cfg.validate(in_study_file=True)
    assert str(study_file.value).endswith(f"; set it in [overrides], e.g. {key} = {json.dumps(default)} (the default).")
