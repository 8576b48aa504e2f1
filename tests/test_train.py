"""train.py and config.py: learning, exact resume, DDP equivalence, SIGTERM, divergence, bad checkpoints, configs.

Everything runs a 2-layer model on byte-tokenised synthetic text prepared in a temp dir through the data
package, for a few dozen steps, so the whole file stays fast on 2 CPU cores.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import train
from config import ConfigError, resolve
from model import GPT, GPTConfig
from checkpoints import load_gpt
from tests.helpers import synthetic_corpus, tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return synthetic_corpus(tmp_path_factory.mktemp("train_data"), 40, 800)


@pytest.fixture
def config_file(tmp_path, data_dir):
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_config(data_dir, model={"pos": "rope"}, max_iters=40, warmup_iters=4))
    return str(path)


def read_metrics(run_dir, kind="train"):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if r["type"] == kind]


# ----------------------------------------------------------------------------- resume and checkpoints

def test_resume_gives_identical_losses(config_file, tmp_path):
    common = [config_file, "--pos=grape_m_ctx", "--kv_shift=true", "--max_iters=12", "--eval_interval=4"]
    straight = train.run(common + [f"--out_dir={tmp_path / 'a'}"])
    first = train.run(common + [f"--out_dir={tmp_path / 'b'}", "--stop_iter=5"])
    assert first["step"] == 5 and first["stopped"] == "stop_iter"
    second = train.run(common + [f"--out_dir={tmp_path / 'b'}", "--resume"])
    assert first["losses"] + second["losses"] == straight["losses"]  # bit for bit
    assert first["val_losses"] + second["val_losses"] == straight["val_losses"]
    # metrics.jsonl of the resumed run has each iteration once, as the uninterrupted run's has
    assert [r["iter"] for r in read_metrics(tmp_path / "b")] == list(range(1, 13))
    assert [r["loss"] for r in read_metrics(tmp_path / "b")] == [r["loss"] for r in read_metrics(tmp_path / "a")]
    saved = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)
    assert saved["step"] == 12 and saved["tokenizer"] == "byte"
    trained = read_metrics(tmp_path / "b")[-1]["tokens"]  # what the log counted, over both halves of the run
    assert saved["tokens_seen"] == trained and saved["windows_seen"] * saved["model_config"]["block_size"] == trained
    model, _ = load_gpt(str(tmp_path / "b"))  # the evaluation side reads it too
    reference, _ = load_gpt(str(tmp_path / "a"))
    for (name, p), (_, q) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(p, q), name
    # a setting that changes the loss sequence is refused on resume
    with pytest.raises(train.TrainError, match="train.lr"):
        train.run(common + [f"--out_dir={tmp_path / 'b'}", "--lr=0.02", "--resume"])
    # and a new run never overwrites an existing checkpoint
    with pytest.raises(ConfigError, match="--resume"):
        train.run(common + [f"--out_dir={tmp_path / 'b'}"])


def test_validation_loss_does_not_depend_on_the_batch_size(config_file, tmp_path):
    # 10 windows are not a multiple of 4 or 3: the last batch is smaller and weighted by its windows.
    common = [config_file, "--max_iters=1", "--warmup_iters=0", "--global_batch_size=12", "--eval_interval=1",
              "--eval_windows=10"]
    four = train.run(common + ["--batch_size=4", f"--out_dir={tmp_path / 'four'}"])
    three = train.run(common + ["--batch_size=3", f"--out_dir={tmp_path / 'three'}"])
    assert [i for i, _ in four["val_losses"]] == [0, 1]
    assert [v for _, v in four["val_losses"]] == pytest.approx([v for _, v in three["val_losses"]], rel=1e-5)


def test_corrupt_or_partial_checkpoint_is_rejected(config_file, tmp_path):
    run_dir = tmp_path / "run"
    args = [config_file, "--max_iters=2", "--warmup_iters=1", f"--out_dir={run_dir}"]
    train.run(args)
    ckpt = run_dir / "ckpt.pt"
    good = ckpt.read_bytes()
    for damaged in (good[: len(good) // 2], b"not a checkpoint at all", b""):
        ckpt.write_bytes(damaged)
        with pytest.raises(train.TrainError, match="corrupt or truncated"):
            train.run(args + ["--resume"])
        assert ckpt.read_bytes() == damaged  # nothing is deleted or overwritten
    torch.save({"model": {}, "step": 3}, ckpt)  # loadable, but not a training checkpoint
    with pytest.raises(train.TrainError, match="incomplete"):
        train.run(args + ["--resume"])
    with pytest.raises(train.TrainError, match="no checkpoint"):
        train.run([config_file, f"--out_dir={tmp_path / 'empty'}", "--resume"])


def test_nan_loss_stops_and_keeps_last_good_checkpoint(config_file, tmp_path, monkeypatch):
    calls = {"n": 0}
    forward = GPT.forward

    def forward_that_breaks_on_call_7(self, idx, targets=None, **kwargs):
        logits, loss = forward(self, idx, targets, **kwargs)
        calls["n"] += torch.is_grad_enabled()  # training forwards only (not the check before each save)
        if calls["n"] == 7 and torch.is_grad_enabled():
            loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward_that_breaks_on_call_7)
    run_dir = tmp_path / "run"
    with pytest.raises(train.TrainError, match=r"iteration 6: the loss is nan"):
        train.run([config_file, f"--out_dir={run_dir}", "--ckpt_interval=4"])
    saved = torch.load(run_dir / "ckpt.pt", weights_only=True)
    assert saved["step"] == 4
    assert all(torch.isfinite(t).all() for t in saved["model"].values())
    # Diverged before its first checkpoint, then started again (no checkpoint, so no --resume): the new run's
    # metrics.jsonl starts afresh and the old one is kept aside.
    calls["n"] = 0
    with pytest.raises(train.TrainError, match="iteration 6"):
        train.run([config_file, f"--out_dir={tmp_path / 'early'}", "--ckpt_interval=0"])
    monkeypatch.setattr(GPT, "forward", forward)
    fresh = train.run([config_file, f"--out_dir={tmp_path / 'early'}", "--max_iters=3", "--warmup_iters=1"])
    assert [r["iter"] for r in read_metrics(tmp_path / "early")] == [1, 2, 3]
    assert [r["loss"] for r in read_metrics(tmp_path / "early")] == fresh["losses"]
    with open(tmp_path / "early" / "metrics.jsonl.prev") as f:
        assert [json.loads(line)["iter"] for line in f] == [1, 2, 3, 4, 5, 6]


def test_a_new_run_is_refused_a_run_directory_made_from_another_config_file(tmp_path, data_dir, monkeypatch):
    """Two config files of one name outside configs/ share the default run directory runs/<name>: a new run from the
    second is refused with both files named (not told to --resume the first), with or without a checkpoint there,
    and the earlier run's files are left as they were; the same config file gets the usual advice."""
    monkeypatch.chdir(tmp_path)
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "fox.toml").write_text(tiny_config(data_dir, model={"pos": "fox"}, max_iters=2,
                                                                warmup_iters=1, eval_interval=2))
    train.run(["a/fox.toml"])
    run_dir = tmp_path / "runs" / "fox"
    saved = {name: (run_dir / name).read_bytes() for name in ("ckpt.pt", "config.json", "metrics.jsonl")}
    for without_checkpoint in (False, True):
        if without_checkpoint:  # a run stopped before its first checkpoint: config.json still says where it came from
            (run_dir / "ckpt.pt").rename(tmp_path / "ckpt.pt")
        with pytest.raises(ConfigError) as refused:
            train.run(["b/fox.toml"])
        assert str(refused.value) == (f"{os.path.join('runs', 'fox')} holds a run made from {tmp_path / 'a' / 'fox.toml'}, "
                                      "not from b/fox.toml; give this run its own directory with --out_dir=DIR, or "
                                      "add --start_over to move the earlier run aside.")
    (tmp_path / "ckpt.pt").rename(run_dir / "ckpt.pt")
    assert {name: (run_dir / name).read_bytes() for name in saved} == saved
    with pytest.raises(ConfigError, match="already holds a checkpoint; add --resume to continue it"):
        train.run(["a/fox.toml"])
    assert train.run(["b/fox.toml", f"--out_dir={tmp_path / 'fox_b'}"])["step"] == 2
    # a directory chosen with --out_dir is the user's (a study's, or a copy of one): no config-file check there
    (tmp_path / "fox_b" / "ckpt.pt").unlink()
    assert train.run(["a/fox.toml", f"--out_dir={tmp_path / 'fox_b'}"])["step"] == 2
    (run_dir / "ckpt.pt").unlink()
    # the earlier config file gone (its checkout moved): nothing to tell apart, the run starts
    (tmp_path / "a" / "fox.toml").unlink()
    assert train.run(["b/fox.toml"])["step"] == 2


def test_the_default_run_directory_is_recognised_however_it_is_spelled(tmp_path, monkeypatch):
    """config_of_default_directory: the refusal of another config's run applies to the default directory whether
    --out_dir spells it relatively, with ./, or absolutely; another directory or a config that is not a TOML file
    (a run directory's own settings) gets none."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fox.toml").write_text("[model]\n")
    for out_dir in ("runs/fox", "./runs/fox", str(tmp_path / "runs" / "fox"), "runs/other/../fox"):
        assert train.config_of_default_directory("fox.toml", out_dir) == "fox.toml", out_dir
    assert train.config_of_default_directory("fox.toml", "runs/fox2") is None
    assert train.config_of_default_directory("missing.toml", "runs/missing") is None
    assert train.config_of_default_directory(None, "runs/fox") is None


def test_a_run_directory_whose_config_json_is_not_an_object_names_no_config_file(tmp_path):
    from training.checkpointing import config_file_of_run, refuse_earlier_checkpoint

    for text in ("[1, 2]", "null", '"configs/cpu/fox.toml"', "{not json", '{"config_file": 3}'):
        (tmp_path / "config.json").write_text(text)
        assert config_file_of_run(str(tmp_path)) is None
        refuse_earlier_checkpoint(str(tmp_path), str(tmp_path / "fox.toml"))  # nothing to refuse: no error
    (tmp_path / "config.json").write_text(json.dumps({"config_file": "/x/fox.toml"}))
    assert config_file_of_run(str(tmp_path)) == "/x/fox.toml"


# ----------------------------------------------------------------------------- processes

def torchrun(args, env_extra=None, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           os.path.join(REPO, "train.py"), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_two_processes_equal_one_with_double_accumulation_and_resume_across_world_sizes(config_file, tmp_path):
    common = [config_file, "--batch_size=2", "--global_batch_size=4", "--max_iters=8", "--pos=fox",
              "--eval_interval=4"]
    reference = train.run(common + [f"--out_dir={tmp_path / 'one'}"])
    assert reference["grad_accum"] == 2
    # 2 processes x 1 micro-batch, stopped half way ...
    result = torchrun(common + [f"--out_dir={tmp_path / 'two'}", "--stop_iter=4"])
    assert result.returncode == 0, result.stderr[-3000:]
    two = [r["loss"] for r in read_metrics(tmp_path / "two")]
    assert two == pytest.approx(reference["losses"][:4], rel=1e-5)
    assert torch.load(tmp_path / "two" / "ckpt.pt", weights_only=True)["world_size"] == 2
    # validation, its batches shared out over the 2 ranks, gives the 1-process values
    two_val = [(r["iter"], r["val_loss"]) for r in read_metrics(tmp_path / "two", "val")]
    assert [i for i, _ in two_val] == [0, 4]
    assert [v for _, v in two_val] == pytest.approx([v for _, v in reference["val_losses"][:2]], rel=1e-5)
    # ... then resumed by 1 process with 2 accumulation steps: the same windows, the same losses.
    resumed = train.run(common + [f"--out_dir={tmp_path / 'two'}", "--resume"])
    assert resumed["losses"] == pytest.approx(reference["losses"][4:], rel=1e-5)


def test_the_quickstart_as_it_is_under_torchrun_on_two_processes_gives_one_process_losses(tmp_path):
    """configs/quickstart.toml (batch_size = global_batch_size = 8) under torchrun --nproc_per_node=2 was refused
    (8 is not a multiple of 8 x 2); each process now takes micro-batches of 4, of the same windows, and the losses
    are one process's to fp32 rounding (the README's quickstart figures hold on any of 1, 2, 4 processes)"""
    from data.prepare import ensure_default_corpus
    from data.shards import DataError
    try:
        ensure_default_corpus(progress_bar=False)  # (a no-op once prepared; needs the GPT-2 ranks before)
    except DataError as error:
        pytest.skip(f"the quickstart's corpus cannot be prepared here: {error}")
    quick = [os.path.join(REPO, "configs", "quickstart.toml"), "--max_iters=3", "--warmup_iters=1",
             "--log_interval=1", "--eval_interval=3", "--eval_windows=16", "--ckpt_interval=0"]
    one = train.run(quick + [f"--out_dir={tmp_path / 'one'}"])
    assert (one["micro_batch_size"], one["grad_accum"]) == (8, 1)
    result = torchrun(quick + [f"--out_dir={tmp_path / 'two'}"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "batch 8 x 128 tokens = 4 x 1 accum x 2" in result.stdout
    assert [r["loss"] for r in read_metrics(tmp_path / "two")] == pytest.approx(one["losses"], rel=1e-5)
    assert [r["val_loss"] for r in read_metrics(tmp_path / "two", "val")] == \
        pytest.approx([v for _, v in one["val_losses"]], rel=1e-5)
    assert json.loads((tmp_path / "two" / "config.json").read_text())["train"]["batch_size"] == 8  # as configured


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_sigterm_saves_a_checkpoint_and_resume_continues(config_file, tmp_path, stop_signal):
    run_dir = tmp_path / "run"
    args = [config_file, "--max_iters=100000", "--warmup_iters=4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("GRAPE_STUDY_COMMAND", None)
    if stop_signal == signal.SIGINT:  # (and as a job of a study, which sets this: the advice is to rerun it)
        env["GRAPE_STUDY_COMMAND"] = "python study.py my_study.toml"
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *args, f"--out_dir={run_dir}"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and '"train"' in metrics.read_text()):
        time.sleep(0.05)
    proc.send_signal(stop_signal)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output[-3000:]
    name, reason = ("SIGTERM", "sigterm") if stop_signal == signal.SIGTERM else ("Ctrl-C", "interrupted")
    assert f"stop requested ({name}): saved" in output
    advice = ("rerun the study command (python study.py my_study.toml) to continue."
              if stop_signal == signal.SIGINT else "continue with --resume.")
    assert f"at iteration" in output and output.split(f"stop requested ({name}): saved", 1)[1].split("\n")[0] \
        .endswith(advice), output[-2000:]
    assert read_metrics(run_dir, "summary")[-1]["stopped"] == reason  # says which one it was
    stopped_at = torch.load(run_dir / "ckpt.pt", weights_only=True)["step"]
    assert 1 <= stopped_at < 100000
    resumed = train.run(args + [f"--out_dir={run_dir}", "--resume", f"--stop_iter={stopped_at + 3}"])
    reference = train.run(args + [f"--out_dir={tmp_path / 'ref'}", f"--stop_iter={stopped_at + 3}"])
    before = [r["loss"] for r in read_metrics(run_dir)][:stopped_at]
    assert before == pytest.approx(reference["losses"][:stopped_at], rel=1e-6)
    assert resumed["losses"] == pytest.approx(reference["losses"][stopped_at:], rel=1e-6)


# ----------------------------------------------------------------------------- configs and pieces

def test_the_quickstart_and_every_cpu_config_split_over_one_two_and_four_processes_as_they_are():
    """Under torchrun --nproc_per_node=2 the quickstart was refused (global_batch_size 8 is not a multiple of
    batch_size 8 x 2), and so was every CPU config; each process now takes an equal share of the same global
    batch, without a note"""
    import glob
    from types import SimpleNamespace
    paths = [os.path.join(REPO, "configs", "quickstart.toml"), os.path.join(REPO, "configs", "base", "cpu.toml"),
             *sorted(glob.glob(os.path.join(REPO, "configs", "cpu", "*.toml")))]
    assert len(paths) >= 12
    for path in paths:
        _, cfg = resolve(path, [], GPTConfig)
        for processes in (1, 2, 4):
            notes = []
            ddp = SimpleNamespace(world_size=processes, device=torch.device("cpu"), say=notes.append)
            micro, accumulation = train.batch_split(cfg, ddp, resumed=False)
            assert (micro * processes, accumulation, notes) == (cfg.global_batch_size, 1, []), (path, processes)


def test_misspelled_keys_name_the_closest_valid_key(config_file, tmp_path):
    cases = [("[model]\nn_layr = 2\n", "'n_layer'"), ("[train]\nwarmup_iter = 2\n", "'warmup_iters'"),
             ("[trian]\nlr = 1.0\n", "'train'")]
    for body, expected in cases:
        path = tmp_path / "bad.toml"
        path.write_text(f'include = "{config_file}"\n{body}')
        with pytest.raises(ConfigError, match=expected):
            resolve(str(path), [], GPTConfig)
    with pytest.raises(ConfigError, match="'lr'"):
        train.run([config_file, "--lrr=0.1"])
    with pytest.raises(ConfigError, match="'kv_shift'"):
        train.run([config_file, "--kvshift=true"])
    with pytest.raises(ConfigError, match="integer"):
        resolve(config_file, ["--max_iters=2.5"], GPTConfig)
    # a key in the wrong section, and a non-bool key without a value, say what to write instead
    wrong_section = tmp_path / "wrong.toml"
    wrong_section.write_text(f'include = "{config_file}"\n[model]\nlr = 0.1\n')
    with pytest.raises(ConfigError, match="'lr' is a train key.*under \\[train\\]"):
        resolve(str(wrong_section), [], GPTConfig)
    with pytest.raises(ConfigError, match="it is a train key: --train.lr="):
        resolve(config_file, ["--model.lr=0.1"], GPTConfig)
    with pytest.raises(ConfigError, match="--lr needs a value"):
        resolve(config_file, ["--lr"], GPTConfig)
    assert resolve(config_file, ["--compile"], GPTConfig)[1].compile is True
    cycle = tmp_path / "cycle.toml"
    cycle.write_text('include = "cycle.toml"\n')
    with pytest.raises(ConfigError, match="cycle"):
        resolve(str(cycle), [], GPTConfig)


def test_overrides_are_typed_and_layered(config_file, tmp_path):
    child = tmp_path / "child.toml"
    child.write_text(f'include = "{config_file}"\n[model]\npos = "fox"\n[train]\nlr = 0.5\n')
    model_cfg, cfg = resolve(str(child), ["--lr=2e-3", "--max_iters=1e3", "--kv_shift", "--model.n_layer=3"],
                             GPTConfig)
    assert (model_cfg.pos, model_cfg.kv_shift, model_cfg.n_layer, model_cfg.n_embd) == ("fox", True, 3, 32)
    assert (cfg.lr, cfg.max_iters, cfg.batch_size) == (2e-3, 1000, 4)
    assert isinstance(cfg.max_iters, int)


def test_paper_configs_have_the_paper_sizes():
    """Every row of the paper's Tables 1-2 is a config; sizes are the paper's 353M and 770M."""
    rows = {"medium": ["rope", "grape_m_ctx", "grape_m", "alibi", "fox", "grape_a_q", "grape_a_k", "grape_a_qk",
                       "grape_ap", "rope+kv_shift", "alibi+kv_shift", "fox+kv_shift", "grape_ap+kv_shift"],
            "large": ["rope", "grape_m_ctx", "grape_m", "alibi", "fox", "grape_ap", "rope+kv_shift",
                      "alibi+kv_shift", "fox+kv_shift", "grape_ap+kv_shift"]}
    for size, names in rows.items():
        for name in names:
            model_cfg, cfg = resolve(os.path.join(REPO, "configs", size, f"{name}.toml"), [], GPTConfig)
            encoding, _, shift = name.partition("+")
            assert (model_cfg.pos, model_cfg.kv_shift) == (encoding, bool(shift))
            assert (model_cfg.block_size, model_cfg.head_dim, model_cfg.vocab_size) == (4096, 128, 50304)
            assert (cfg.global_batch_size, cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.max_iters) == \
                (480, 1e-3, 3e-5, 2000, 25000)
            assert cfg.out_dir == os.path.join("runs", size, name)
        with torch.device("meta"):
            n = GPT(resolve(os.path.join(REPO, "configs", size, "rope.toml"), [], GPTConfig)[0]).num_params()
        assert n == pytest.approx({"medium": 353e6, "large": 770e6}[size], rel=0.01)


def test_configs_beyond_the_paper_have_the_gpt3_shapes_with_the_papers_recipe():
    """1.3B and 2.7B: GPT-3 XL / 2.7B widths and depths with head_dim 128, every encoding of the medium table, and
    the paper's batch, schedule and tokens (49.2B, as for both of the paper's sizes)."""
    medium = sorted(os.listdir(os.path.join(REPO, "configs", "medium")))
    _, paper = resolve(os.path.join(REPO, "configs", "medium", "rope.toml"), [], GPTConfig)
    shapes = {"1.3b": (24, 16, 2048, 1.31e9, "ddp"), "2.7b": (32, 20, 2560, 2.65e9, "fsdp")}
    for size, (layers, heads, width, params, parallel) in shapes.items():
        assert sorted(os.listdir(os.path.join(REPO, "configs", size))) == medium
        for name in medium:
            model_cfg, cfg = resolve(os.path.join(REPO, "configs", size, name), [], GPTConfig)
            encoding, _, shift = name.removesuffix(".toml").partition("+")
            assert (model_cfg.pos, model_cfg.kv_shift) == (encoding, bool(shift))
            assert (model_cfg.n_layer, model_cfg.n_head, model_cfg.n_embd, model_cfg.head_dim) == \
                (layers, heads, width, 128)
            assert (model_cfg.block_size, model_cfg.vocab_size) == (4096, 50304)
            recipe = ("global_batch_size", "lr", "min_lr", "warmup_iters", "max_iters", "weight_decay", "beta1",
                      "beta2", "grad_clip", "recipe", "lr_schedule", "grad_scale", "sampler", "data_dir")
            assert [getattr(cfg, k) for k in recipe] == [getattr(paper, k) for k in recipe]
            assert cfg.reference_layout == "8x4" and cfg.parallel == parallel
            assert cfg.global_batch_size % (cfg.batch_size * 8) == 0  # whole accumulation steps on 8 GPUs
            tokens = cfg.num_steps * cfg.global_batch_size * model_cfg.block_size
            assert tokens == pytest.approx(49.2e9, rel=1e-3)
        with torch.device("meta"):
            n = GPT(resolve(os.path.join(REPO, "configs", size, "rope.toml"), [], GPTConfig)[0]).num_params()
        assert n == pytest.approx(params, rel=0.01)


def test_plot_runs_draws_train_and_validation_curves(tmp_path):
    from studies import curves as plot_runs  # the code of scripts/plot_runs.py
    for name, shift in (("rope", 0.0), ("fox", -0.1)):
        (tmp_path / name).mkdir()
        lines = [{"type": "val", "iter": 0, "tokens": 0, "val_loss": 5.0 + shift}]
        lines += [{"type": "train", "iter": i, "tokens": 1000 * i, "loss": 4.0 - i / 10 + shift} for i in (2, 1)]
        lines += [{"type": "summary", "iter": 2, "stopped": "done"}]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"type": "tra')
    curves = plot_runs.read_curves(str(tmp_path / "fox"))
    assert curves == {"train": [(1000, pytest.approx(3.8)), (2000, pytest.approx(3.7))], "val": [(0, 4.9)]}
    out = tmp_path / "plots" / "loss.png"
    assert plot_runs.main([str(tmp_path / "rope"), str(tmp_path / "fox"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_runs.main([str(tmp_path / "rope"), str(tmp_path / "missing"), "--out", str(out)]) == 2


def test_resume_from_the_run_directory_alone_continues_with_the_runs_own_settings(config_file, tmp_path):
    """A run started with overrides is continued by `train.py --resume RUN_DIR` (or RUN_DIR/config.json) with
    exactly its settings: the same losses as an uninterrupted run. With the config file instead, the refusal names
    both values of every key that differs."""
    overrides = ["--n_layer=1", "--lr=5e-3", "--max_iters=8", "--warmup_iters=2"]
    whole = train.run([config_file, *overrides, f"--out_dir={tmp_path / 'whole'}"])
    run_dir = tmp_path / "run"
    train.run([config_file, *overrides, "--stop_iter=3", f"--out_dir={run_dir}"])
    with pytest.raises(train.TrainError, match="model.n_layer is 2 here but 1 in the checkpoint.*--n_layer=1"):
        train.run([config_file, f"--out_dir={run_dir}", "--resume"])
    middle = train.run(["--resume", str(run_dir), "--stop_iter=5"])
    rest = train.run([str(run_dir / "config.json"), "--resume"])
    assert middle["losses"] + rest["losses"] == pytest.approx(whole["losses"][3:], rel=1e-6)
    assert rest["step"] == 8
    with pytest.raises(ConfigError, match="holds no config.json, so it is not a run directory"):
        train.run(["--resume", str(tmp_path)])


def test_every_log_line_says_the_time_elapsed_and_left(config_file, tmp_path, capsys, monkeypatch):
    import training.step
    monkeypatch.setattr(training.step, "PROGRESS_EVERY_S", 0.0)  # every validation batch reports
    out = train.run([config_file, "--max_iters=6", "--warmup_iters=2", "--eval_interval=3", "--eval_windows=12",
                     f"--out_dir={tmp_path / 'run'}"])
    records = read_metrics(tmp_path / "run")
    elapsed = [r["elapsed_s"] for r in records]
    assert [r["iter"] for r in records] == list(range(1, 7)) and out["step"] == 6
    assert all(b > a for a, b in zip(elapsed, elapsed[1:]))  # monotone
    for r in records:  # time left: the average time per step so far, times the steps left
        assert r["eta_s"] == pytest.approx(r["elapsed_s"] / r["iter"] * (6 - r["iter"]))
    assert records[-1]["eta_s"] == 0
    console = capsys.readouterr().out
    assert "elapsed, 0s left" in console.splitlines()[[i for i, line in enumerate(console.splitlines())
                                                      if line.startswith("iter      6/6")][0]]
    assert "validation: 4/12 windows" in console and "left" in console.split("validation: 4/12 windows")[1]


def test_help_lists_every_key_with_its_default_and_meaning():
    import dataclasses
    from config import TrainConfig, field_help
    text = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "--help"], capture_output=True, text=True,
                          timeout=60).stdout
    for cls in (TrainConfig, GPTConfig):
        meanings = field_help(cls)
        for field in dataclasses.fields(cls):
            default = str(field.default).lower() if isinstance(field.default, bool) else field.default
            line = f"  --{field.name}={default if default != '' else chr(34) * 2} ("
            assert line in text, field.name
            assert meanings[field.name] and meanings[field.name] in text, field.name  # every key has a meaning
    assert "--resume" in text and "--allow_changes=K1,K2" in text and "python train.py --resume RUN_DIR" in text
    # a continuation comment line is part of the meaning, a section comment is not
    assert field_help(TrainConfig)["spike_factor"].endswith("always stop the run)")
    assert "multiplicative encodings" not in field_help(GPTConfig)["qk_norm"]


# ----------------------------------------------------------------------------- the command line's small mistakes

def test_an_empty_out_dir_is_refused_and_a_checkpoint_file_stands_for_its_run(config_file, tmp_path, monkeypatch):
    """--out_dir= trained into the config's default directory; --resume RUN/ckpt.pt said the config file was not
    UTF-8."""
    monkeypatch.chdir(tmp_path)
    for empty in ("--out_dir=", "--out-dir= "):
        with pytest.raises(ConfigError, match=r"^--out_dir= is empty, which would train into the config's default "):
            train.run([config_file, empty])
    assert not (tmp_path / "runs").exists()
    run_dir = tmp_path / "D"
    train.run([config_file, f"--out_dir={run_dir}", "--stop_iter=3"])
    resumed = train.run(["--resume", str(run_dir / "ckpt.pt"), "--stop_iter=5"])
    assert resumed["step"] == 5 and len(resumed["losses"]) == 2 and resumed["out_dir"] == str(run_dir)
    with pytest.raises(ConfigError) as refused:  # a new run from a checkpoint: what to do instead
        train.run([str(run_dir / "ckpt.pt")])
    assert str(refused.value) == (f"{run_dir / 'ckpt.pt'} is a checkpoint, not a config file; continue its run with "
                                  f"python train.py --resume {run_dir}, or give a TOML config file to start a new one.")


def test_an_override_of_the_encoding_gets_its_own_run_directory(data_dir, tmp_path, monkeypatch, capsys):
    """configs/cpu/rope.toml --pos=grape_a_qk wrote a grape_a_qk run into runs/cpu/rope without a word."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs" / "cpu").mkdir(parents=True)
    config = tmp_path / "configs" / "cpu" / "rope.toml"
    config.write_text(tiny_config(data_dir, model={"pos": "rope"}, max_iters=2, warmup_iters=1))
    same = train.run([str(config), "--pos=rope", "--kv_shift=false"])  # the config's own encoding: its directory
    assert same["out_dir"] == os.path.join("runs", "cpu", "rope")
    changed = train.run([str(config), "--pos=alibi"])
    assert changed["out_dir"] == os.path.join("runs", "cpu", "rope_as_alibi")
    assert f"so this run's directory is {os.path.join('runs', 'cpu', 'rope_as_alibi')}, not " in capsys.readouterr().out
    shifted = train.run([str(config), "--kv_shift=true"])
    assert shifted["out_dir"] == os.path.join("runs", "cpu", "rope_as_rope+kv_shift")
    saved = torch.load(os.path.join(changed["out_dir"], "ckpt.pt"), weights_only=True)["model_config"]
    assert (saved["pos"], saved["kv_shift"]) == ("alibi", False)
    assert torch.load(os.path.join("runs", "cpu", "rope", "ckpt.pt"), weights_only=True)["model_config"]["pos"] == "rope"
    resumed = train.run([str(config), "--pos=alibi", "--resume"])  # the same command finds it (and its end)
    assert resumed["out_dir"] == changed["out_dir"] and resumed["step"] == 2 and resumed["losses"] == []
    given = train.run([str(config), "--pos=alibi", "--out_dir=mine"])  # --out_dir is the user's choice
    assert given["out_dir"] == "mine"
    partial = tmp_path / "configs" / "cpu" / "partial.toml"  # valid only with its overrides: still read
    partial.write_text(tiny_config(data_dir, model={"pos": "rope"}, max_iters=2, warmup_iters=5))
    assert train.run([str(partial), "--warmup_iters=1", "--pos=fox"])["out_dir"] == \
        os.path.join("runs", "cpu", "partial_as_fox")


def test_busy_cores_are_named_with_the_thread_count(monkeypatch):
    """The quickstart took 8 minutes instead of 2 on shared cores without a word about threads."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cpu = torch.device("cpu")
    assert train.busy_cores_hint(cpu, load=1.9) is None  # below the cores: free enough
    hint = train.busy_cores_hint(cpu, load=2.0)
    assert hint.startswith("note: the load average is 2.0 on the 2 core(s) this run may use, so other work keeps "
                           "them busy, and the run's 2 CPU thread(s) will wait")
    assert "OMP_NUM_THREADS=1" in hint
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert train.busy_cores_hint(cpu, load=5.0) is None  # one thread: nothing to lower
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two processes of one thread each on the same cores
    assert "the run's 2 CPU thread(s)" in train.busy_cores_hint(cpu, load=2.5)
    assert train.busy_cores_hint(torch.device("meta"), load=9.0) is None  # not the CPU


# ----------------------------------------------------------------------------- the README's commands, in order

def readme_block(heading: str) -> list[str]:
    """The commands of the first bash block after the README's heading, comments dropped."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        block = f.read().split(f"## {heading}\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


class Accepted(Exception):
    """Raised where a run would start its work: its arguments, run directory and checkpoint were accepted."""


def test_the_readmes_quickstart_commands_are_accepted_in_the_order_it_gives_them(tmp_path, monkeypatch):
    """A newcomer's first hour: right after the set-up (whose first command trains configs/quickstart.toml into
    runs/quickstart), the Quickstart's first two commands were refused, since runs/quickstart held that run. Each
    train.py command of the set-up and the Quickstart, in order, through its argument handling, run directory lock
    and checkpoint refusal; each accepted one then leaves what a finished run leaves (ckpt.pt, config.json), which
    the next ones see. The commands that read a run (sample.py, eval/) must name one made before them."""
    import dataclasses
    import shlex
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(os.path.join(REPO, "configs"))
    made = []

    def opening(args, cfg, model_cfg):
        if args.resume and not os.path.isfile(os.path.join(cfg.out_dir, "ckpt.pt")):
            raise train.TrainError(f"no checkpoint at {cfg.out_dir}")
        if not args.resume:
            train.refuse_earlier_checkpoint(cfg.out_dir, train.config_of_default_directory(args.config_path,
                                                                                          cfg.out_dir))
        os.makedirs(cfg.out_dir, exist_ok=True)
        with open(os.path.join(cfg.out_dir, "config.json"), "w") as f:  # what a finished run leaves
            json.dump({"config_file": os.path.abspath(args.config_path), "model": model_cfg,
                       "train": dataclasses.asdict(cfg)}, f)
        (tmp_path / cfg.out_dir / "ckpt.pt").write_bytes(b"a finished run's checkpoint")
        made.append(os.path.normpath(cfg.out_dir))
        raise Accepted
    monkeypatch.setattr(train, "open_checkpoint", opening)
    setup = [c for command in readme_block("Set up") for c in command.split(" && ") if "train.py" in c]
    quickstart = readme_block("Quickstart")
    assert setup == ["python3 train.py configs/quickstart.toml"] and len(quickstart) >= 6
    for command in setup + quickstart:
        words = shlex.split(command)
        if "--ckpt" in words:  # a reader of runs: of those made above
            assert words[words.index("--ckpt") + 1] in made, command
        if words[:2] == ["python3", "train.py"] or words[0] == "torchrun":
            argv = words[words.index("train.py") + 1:]
            if argv == ["--help"]:
                continue
            with pytest.raises(Accepted):
                train.run(argv)
    assert made[:3] == ["runs/quickstart", "runs/quickstart", "runs/quickstart_2proc"]
    assert "runs/qs_fox" in made and "runs/cpu/fox" in made
