"""sample.py: cached generation equals generation without a cache; seeds, top-k and the speed line."""
import pytest
import torch

import sample
from data.tokenizer import get_tokenizer
from eval.tiny import save_run, tiny_model


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    model = tiny_model(pos="grape_a_qk", block_size=32, seed=4)
    save_run(model, run_dir, step=11)
    return model, run_dir


def greedy_without_cache(model, tok, prompt_ids, n):
    ids = list(prompt_ids)
    for _ in range(n):
        with torch.no_grad():
            logits, _ = model(torch.tensor([ids]))
        token = int(logits[0, -1, :tok.n_vocab].argmax())
        if token == tok.eot_token:
            break
        ids.append(token)
    return ids[len(prompt_ids):]


@pytest.mark.parametrize("extra", [["--temperature", "0"], ["--temperature", "1.5", "--top-k", "1"]])
def test_greedy_and_top1_equal_uncached_greedy(run, capsys, extra):
    model, run_dir = run
    tok = get_tokenizer("byte")
    (text,) = sample.main(["--ckpt", str(run_dir), "--prompt", "Hello there", "--max-new-tokens", "12", *extra])
    expected = tok.decode(greedy_without_cache(model, tok, tok.encode("Hello there"), 12))
    assert text == expected
    captured = capsys.readouterr()
    assert captured.out.strip().endswith(expected.strip()) or not expected.strip()
    assert "tokens/s" in captured.err and "step 11" in captured.err


def test_seed_fixes_samples_and_different_seeds_differ(run):
    _, run_dir = run
    args = ["--ckpt", str(run_dir), "--max-new-tokens", "8", "--temperature", "1.0", "--top-k", "0"]
    a = sample.main(args + ["--seed", "1", "--num-samples", "2"])
    b = sample.main(args + ["--seed", "1", "--num-samples", "2"])
    c = sample.main(args + ["--seed", "2", "--num-samples", "2"])
    assert a == b and a != c and a[0] != a[1]


def test_missing_checkpoint_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--ckpt", str(tmp_path / "nope")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no checkpoint at") and "Traceback" not in err


def test_damaged_checkpoints_are_one_clear_error(run, tmp_path, capsys):
    # a truncated file, weights that do not fit the saved config, an unknown tokenizer name
    _, run_dir = run
    good = torch.load(run_dir / "ckpt.pt", weights_only=True)
    good.pop("checksum", None)  # the hand-edited copies below carry none (a stale one would be reported as damage)
    (tmp_path / "truncated.pt").write_bytes((run_dir / "ckpt.pt").read_bytes()[:5000])
    torch.save({**good, "model_config": {**good["model_config"], "n_layer": 3}}, tmp_path / "mismatch.pt")
    torch.save({**good, "tokenizer": "nonsense"}, tmp_path / "tokenizer.pt")
    expected = {"truncated.pt": "is corrupt or truncated", "mismatch.pt": "weights do not match",
                "tokenizer.pt": "unknown tokenizer 'nonsense'"}
    for name, message in expected.items():
        with pytest.raises(SystemExit) as exit_info:
            sample.main(["--ckpt", str(tmp_path / name)])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and "Traceback" not in err, (name, err)
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name,what", [("config.json", "train.py's record of the run's settings"),
                                       ("notes.json", "a JSON file"), ("notes.txt", "a file that torch.save did not write")])
def test_a_file_that_is_not_a_checkpoint_is_named_with_what_to_pass(run, capsys, name, what):
    # A run's config.json passed as --ckpt used to be reported as a corrupt or truncated checkpoint.
    _, run_dir = run
    (run_dir / name).write_text('{"model": {"n_layer": 2}}\n' if name.endswith(".json") else "hello\n")
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--ckpt", str(run_dir / name)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert err == (f"error: {run_dir / name} is {what}, not a checkpoint: pass --ckpt {run_dir} "
                   "(its run directory, which holds ckpt.pt)")


@pytest.mark.parametrize("seed, accepted", [(-1, False), (0, True), (2**64 - 1, True), (2**64, False)])
def test_seed_bounds_are_the_generators(run, capsys, seed, accepted):
    # torch.Generator.manual_seed takes exactly 0 .. 2**64 - 1: both ends sample, one past either is refused
    _, run_dir = run
    args = ["--ckpt", str(run_dir), "--max-new-tokens", "4", "--temperature", "1.0", "--seed", str(seed)]
    if accepted:
        assert sample.main(args) == sample.main(args)
    else:
        with pytest.raises(SystemExit) as exit_info:
            sample.main(args)
        assert exit_info.value.code == 2 and "--seed must be between 0 and" in capsys.readouterr().err


@pytest.mark.fault
@pytest.mark.parametrize("temperature", ["nan", "inf"])
def test_a_temperature_that_is_not_finite_is_refused_before_sampling(run, capsys, temperature):
    # nan passed the `< 0` check and failed in sample_next ("probability tensor contains either inf, nan ...")
    _, run_dir = run
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--ckpt", str(run_dir), "--max-new-tokens", "3", "--temperature", temperature])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(f"error: --temperature must be a finite number (0 = greedy), not {temperature}")
    assert "Traceback" not in err


@pytest.mark.fault
def test_a_prompt_file_not_in_utf8_is_one_sentence(run, tmp_path, capsys):
    # a Latin-1 file used to end in a UnicodeDecodeError traceback
    _, run_dir = run
    (tmp_path / "prompt.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--ckpt", str(run_dir), "--prompt-file", str(tmp_path / "prompt.txt")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (f"error: --prompt-file {tmp_path / 'prompt.txt'} is not UTF-8 text; "
                                               "save it as UTF-8")


@pytest.mark.fault
def test_a_device_name_torch_does_not_know_is_one_sentence(run, capsys):
    # --device gpu used to end in model.to's RuntimeError ("Expected one of cpu, cuda, ... device type")
    _, run_dir = run
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--ckpt", str(run_dir), "--device", "gpu"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == ("error: device 'gpu' is not a device name; use cpu, cuda, cuda:N (N "
                                               "counts the GPUs from 0) or mps")


@pytest.mark.fault
def test_a_run_whose_ckpt_pt_is_a_text_file_is_not_told_to_pass_its_own_directory(tmp_path, capsys):
    # the advice was "pass --ckpt RUN_DIR (its run directory, which holds ckpt.pt)": the directory just passed
    (tmp_path / "ckpt.pt").write_text("hello\n")
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--ckpt", str(tmp_path), "--max-new-tokens", "3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: checkpoint {tmp_path / 'ckpt.pt'} is corrupt or was not written by torch.save (it does "
                   "not begin as a torch.save file does); restore it from a backup, or pass another run directory "
                   "or checkpoint file as --ckpt")


@pytest.mark.fault
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_one_sentence_not_a_sampler_traceback(tmp_path, capsys, value):
    from helpers import run_with_non_finite_weight
    named = run_with_non_finite_weight(tmp_path, value)
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--ckpt", str(tmp_path), "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: checkpoint {tmp_path / 'ckpt.pt'} {named}") and "restore it from a backup" in err
