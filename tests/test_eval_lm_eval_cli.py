"""`python -m eval.lm_eval_cli`: lm-eval's own command line with our model, on the hand-written fixtures.

The reference scores each fixture's choices directly with the model (test_eval_zero_shot's helpers) and
recomputes acc and acc_norm; lm-eval's flags (--limit, --batch_size, --output_path) pass through.
"""
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from data.tokenizer import get_tokenizer
from eval import lm_eval_cli
from eval.tiny import save_run, tiny_model
from test_eval_zero_shot import FIXTURES, direct_loglikelihood, reference_requests

TASKS = ("arc_challenge", "piqa", "winogrande")
LIMIT = 2


def test_lm_eval_cli_scores_our_checkpoint_on_local_task_files(tmp_path, monkeypatch, capsys):
    model = tiny_model(pos="grape_m", block_size=256, seed=5)
    save_run(model, tmp_path / "run")
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() hands its arguments to lm-eval through sys.argv
    # Without --output_path the results land in the run's own eval/ folder (lm-eval alone saves nothing).
    lm_eval_cli.main(["--model", "grape", "--model_args", f"ckpt={tmp_path / 'run'}", "--tasks", ",".join(TASKS),
                      "--data-dir", str(FIXTURES), "--limit", str(LIMIT), "--batch_size", "3"])
    (results_file,) = (tmp_path / "run" / "eval").glob("lm_eval_*.json")
    results = json.loads(results_file.read_text())
    err = capsys.readouterr().err
    assert f"results go to {tmp_path / 'run' / 'eval' / 'lm_eval.json'}" in err
    assert f"results written to {results_file}" in err  # the dated name lm-eval chose, said after the run
    assert re.search(r"^lm-eval: scoring [\d,]+ windows: [\d,]+/[\d,]+ tokens \(100%\), elapsed .*, ETA 0:00$", err,
                     re.MULTILINE)  # lm-eval's requests reach the adapter with progress on
    if not torch.cuda.is_available():  # lm-eval asked for cuda:0 (no --device): the adapter fell back
        assert results["config"]["device"] == "cuda:0"
        assert "CUDA is not available; running on the CPU" in err
    tok = get_tokenizer("byte")
    for task in TASKS:
        rows = [json.loads(line) for line in open(FIXTURES / f"{task}.jsonl")][:LIMIT]
        acc, acc_norm = [], []
        for row in rows:
            contexts, continuations, gold = reference_requests(task, row)
            scores = [direct_loglikelihood(model, tok, c, x) for c, x in zip(contexts, continuations)]
            normalized = [s / len(x.lstrip(" ")) for s, x in zip(scores, continuations)]
            acc.append(max(range(len(scores)), key=scores.__getitem__) == gold)
            acc_norm.append(max(range(len(scores)), key=normalized.__getitem__) == gold)
        got = results["results"][task]
        assert results["n-samples"][task]["effective"] == LIMIT
        assert got["acc,none"] == pytest.approx(sum(acc) / LIMIT)
        if task != "winogrande":
            assert got["acc_norm,none"] == pytest.approx(sum(acc_norm) / LIMIT)


def test_lm_eval_cli_with_a_bad_data_dir_is_one_sentence(tmp_path, capsys):
    (tmp_path / "piqa.jsonl").write_text(json.dumps({"goal": "g"}) + "\n")
    with pytest.raises(SystemExit) as exit_info:
        lm_eval_cli.main(["--model", "grape", "--model_args", "ckpt=none", "--tasks", "piqa,sciq",
                          f"--data-dir={tmp_path}"])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert message.startswith("error: ") and "lacks the fields ['sol1', 'sol2', 'label']" in message
    assert str(Path(tmp_path) / "sciq.jsonl") in message and "Traceback" not in message


@pytest.mark.parametrize("extra,expected", [
    ([], "RUN/eval/lm_eval.json"),
    (["--output_path", "mine"], "mine"), (["-o", "mine"], "mine"),
    (["--output", "mine"], "mine"),  # lm-eval's parser takes abbreviations
    (["--model", "hf"], None),       # another model: lm-eval's own behaviour
])
def test_lm_eval_output_path_defaults_to_the_runs_eval_folder_unless_given(tmp_path, monkeypatch, extra, expected):
    from lm_eval._cli import HarnessCLI
    (tmp_path / "RUN").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["lm-eval", "--model", "grape", "--model_args", "ckpt=RUN", "--tasks", "piqa",
                                      *extra])
    args = HarnessCLI().parse_args()
    assert lm_eval_cli.default_output_path(args) == (expected and str(Path(expected)))


def test_an_output_folder_gets_a_subfolder_named_after_the_run_and_the_results_file_is_printed(
        tmp_path, monkeypatch, capsys):
    """lm-eval names the subfolder of --output_path FOLDER after pretrained=/path=, so `ckpt=` got a random name
    (FOLDER/i82qcls7/); ours is the run's path, sanitised as lm-eval does, and the file written is printed."""
    from lm_eval.utils import sanitize_model_name
    save_run(tiny_model(pos="alibi", block_size=256, seed=2), tmp_path / "run")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    out = tmp_path / "results"
    out.mkdir()
    lm_eval_cli.main(["--model", "grape", "--model_args", f"ckpt={tmp_path / 'run'}", "--tasks", TASKS[0],
                      "--data-dir", str(FIXTURES), "--limit", "1", "--output_path", str(out), "--log_samples"])
    (written,) = [line.split("results written to ", 1)[1] for line in capsys.readouterr().err.splitlines()
                  if line.startswith("results written to ")]
    (on_disk,) = [str(p) for p in out.rglob("results*.json")]
    assert written == on_disk and TASKS[0] in json.loads(Path(on_disk).read_text())["results"]
    folder = out / sanitize_model_name(str(tmp_path / "run"))
    assert Path(written).parent == folder and re.fullmatch(r"results_.*\.json", Path(written).name)
    assert [p.parent for p in out.rglob("*.json*")] == [folder] * 2  # the samples beside it


@pytest.mark.parametrize("model_args,expected", [
    ("ckp=RUN", "--model_args for --model grape has no ckp=; it takes ckpt=, tokenizer=, max_length=, "
                "rolling_stride=, prefill_chunk=, batch_size=, device= (ckpt=RUN_DIR is required)"),
    ("ckpt=RUN,max_lenght=64,stride=8", "--model_args for --model grape has no max_lenght=, stride=; it takes ckpt=, "
                                        "tokenizer=, max_length=, rolling_stride=, prefill_chunk=, batch_size=, "
                                        "device= (ckpt=RUN_DIR is required)"),  # was silently ignored
    (None, "--model grape needs --model_args ckpt=RUN_DIR (a run directory holding ckpt.pt, or a checkpoint file)"),
    ("ckpt=", "--model grape needs --model_args ckpt=RUN_DIR (a run directory holding ckpt.pt, or a checkpoint file)"),
])
@pytest.mark.fault
def test_model_args_grape_cannot_take_are_one_sentence_before_lm_eval_runs(model_args, expected, tmp_path,
                                                                           monkeypatch, capsys):
    """A misspelt key (ckp=) ended in GrapeLM's ValueError traceback after lm-eval's start; beside ckpt= it was
    swallowed by **unused. Nothing is written (the output folder stays empty)."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    out = tmp_path / "results"
    out.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        lm_eval_cli.main(["--model", "grape", *(["--model_args", model_args] if model_args else []), "--tasks",
                          "piqa", "--output_path", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(f"error: {expected}\n") and "Traceback" not in err
    assert list(out.iterdir()) == []
