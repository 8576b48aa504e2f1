"""eval/zero_shot.py end to end on hand-written hub-schema fixtures of all seven tasks (one run).

The reference re-derives every prompt from the fixture rows by hand (the stock lm-eval task
formats), scores each choice directly with the model, and recomputes acc / acc_norm / the average.
"""
import json
import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from data.tokenizer import get_tokenizer
from eval import zero_shot
from eval.tasks import ZERO_SHOT_TASKS
from eval.tiny import save_run, tiny_model
from helpers import full_disk, refused_out_message, unwritable

FIXTURES = Path(__file__).parent / "fixtures" / "zero_shot"


def _hellaswag_clean(text):
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def reference_requests(task, row):
    """(contexts per choice, continuation per choice, gold index), written from the task formats."""
    if task in ("arc_easy", "arc_challenge"):
        choices = row["choices"]["text"]
        return ([f"Question: {row['question']}\nAnswer:"] * len(choices), [" " + c for c in choices],
                row["choices"]["label"].index(row["answerKey"]))
    if task == "openbookqa":
        choices = row["choices"]["text"]
        return ([row["question_stem"]] * len(choices), [" " + c for c in choices],
                row["choices"]["label"].index(row["answerKey"].strip()))
    if task == "hellaswag":
        context = _hellaswag_clean(row["activity_label"] + ": " + row["ctx_a"] + " " + row["ctx_b"].capitalize())
        return [context] * 4, [" " + _hellaswag_clean(e) for e in row["endings"]], int(row["label"])
    if task == "piqa":
        return [f"Question: {row['goal']}\nAnswer:"] * 2, [" " + row["sol1"], " " + row["sol2"]], row["label"]
    if task == "winogrande":
        blank = row["sentence"].index("_")
        rest = " " + row["sentence"][blank + 1:].strip()
        return ([row["sentence"][:blank] + row["option1"], row["sentence"][:blank] + row["option2"]],
                [rest, rest], int(row["answer"]) - 1)
    if task == "sciq":
        choices = [row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"]]
        return ([f"{row['support'].lstrip()}\nQuestion: {row['question']}\nAnswer:"] * 4,
                [" " + c for c in choices], 3)
    raise KeyError(task)


def direct_loglikelihood(model, tok, context, continuation):
    ids = tok.encode(context) + tok.encode(continuation)
    n = len(tok.encode(continuation))
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids[:-1]]))
    logprobs = F.log_softmax(logits[0, -n:].double(), dim=-1)
    return logprobs.gather(-1, torch.tensor(ids[-n:])[:, None]).sum().item()


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    model = tiny_model(pos="rope", block_size=256, seed=3)  # fixtures fit: no truncation
    save_run(model, run_dir, step=7)
    out = run_dir / "out"
    report = zero_shot.main(["--ckpt", str(run_dir), "--data-dir", str(FIXTURES), "--out", str(out),
                             "--log-samples", "--batch-size", "5"])
    return model, report, out


@pytest.mark.parametrize("task", ZERO_SHOT_TASKS)
def test_task_loglikelihoods_and_accuracy_match_direct_scoring(evaluated, task):
    model, report, out = evaluated
    tok = get_tokenizer("byte")
    rows = [json.loads(line) for line in open(FIXTURES / f"{task}.jsonl")]
    samples = {s["doc_id"]: s for s in map(json.loads, open(out / f"samples_{task}.jsonl"))}
    assert sorted(samples) == list(range(len(rows)))
    acc, acc_norm = [], []
    for doc_id, row in enumerate(rows):
        contexts, continuations, gold = reference_requests(task, row)
        expected = [direct_loglikelihood(model, tok, c, x) for c, x in zip(contexts, continuations)]
        assert samples[doc_id]["loglikelihoods"] == pytest.approx(expected, abs=1e-3), (task, doc_id)
        acc.append(max(range(len(expected)), key=lambda i: expected[i]) == gold)
        normalized = [ll / len(x.lstrip(" ")) for ll, x in zip(expected, continuations)]
        acc_norm.append(max(range(len(expected)), key=lambda i: normalized[i]) == gold)
    got = report["tasks"][task]
    assert got["n"] == len(rows)
    assert got["acc"] == pytest.approx(100 * sum(acc) / len(acc))
    if task == "winogrande":  # lm-eval defines only acc for WinoGrande
        assert "acc_norm" not in got
    else:
        assert got["acc_norm"] == pytest.approx(100 * sum(acc_norm) / len(acc_norm))
    # the field's convention by default: acc_norm for ARC-C, HellaSwag and OBQA, acc for the others
    normalized_tasks = ("arc_challenge", "hellaswag", "openbookqa")
    assert got["score"] == got["acc_norm" if task in normalized_tasks else "acc"]


def test_report_average_json_and_markdown(evaluated):
    _, report, out = evaluated
    tasks = report["tasks"]
    convention = [tasks[t]["acc_norm" if t in ("arc_challenge", "hellaswag", "openbookqa") else "acc"]
                  for t in ZERO_SHOT_TASKS]
    assert report["metric"] == "convention" and report["average"] == pytest.approx(sum(convention) / 7)
    assert report["averages"]["acc"] == pytest.approx(sum(tasks[t]["acc"] for t in ZERO_SHOT_TASKS) / 7)
    assert report["averages"]["acc_norm"] == pytest.approx(
        sum(tasks[t].get("acc_norm", tasks[t]["acc"]) for t in ZERO_SHOT_TASKS) / 7)
    assert json.loads((out / "zero_shot.json").read_text())["average"] == pytest.approx(report["average"])
    assert report["step"] == 7 and report["encoding"] == "rope"
    paper = json.loads((Path(zero_shot.__file__).parent / "paper_results.json").read_text())
    rope = dict(zip(paper["columns"], paper["medium_353M"]["rope"]))
    table = (out / "zero_shot.md").read_text()
    assert f"| arc_easy | 3 |" in table and f"{rope['arc_easy']:.2f} |" in table
    assert f"**{report['average']:.2f}** | {rope['avg']:.2f} |" in table
    assert f"{report['averages']['acc']:.2f} with `--metric acc`" in table and "does not name its metric" in table


@pytest.mark.parametrize("metric", ["convention", "acc_norm", "acc"])
def test_metric_choice_picks_the_averaged_metric_per_task(metric):
    """Hand-made lm-eval results: acc = 10·i %, acc_norm = 10·i + 5 % for task i (WinoGrande: acc only)."""
    results = {"results": {}}
    for i, task in enumerate(ZERO_SHOT_TASKS):
        results["results"][task] = {"acc,none": 0.1 * i, "acc_stderr,none": 0.01}
        if task != "winogrande":
            results["results"][task] |= {"acc_norm,none": 0.1 * i + 0.05, "acc_norm_stderr,none": 0.01}
    rows, averages = zero_shot.summarize(results, ZERO_SHOT_TASKS, metric)
    normalized = {"convention": {"arc_challenge", "hellaswag", "openbookqa"}, "acc": set(),
                  "acc_norm": set(ZERO_SHOT_TASKS) - {"winogrande"}}[metric]
    expected = [10 * i + (5 if task in normalized else 0) for i, task in enumerate(ZERO_SHOT_TASKS)]
    assert [rows[t]["score"] for t in ZERO_SHOT_TASKS] == pytest.approx(expected)
    assert averages[metric] == pytest.approx(sum(expected) / 7)
    assert averages["acc"] == pytest.approx(30.0) and averages["convention"] == pytest.approx(30 + 15 / 7)


def test_paper_results_are_consistent_and_name_a_config_per_row():
    """eval/paper_results.json is the project's copy of the paper's Tables 1-2: each row's Avg is the mean of its
    7 task scores up to the table's rounding (a mistyped score moves it by more), its tasks are the columns,
    and every row is a config under configs/<size>/ (the medium table has 13 rows, the large one 10)."""
    paper = json.loads((Path(zero_shot.__file__).parent / "paper_results.json").read_text())
    assert paper["columns"] == paper["tasks"] + ["avg"] and paper["tasks"] == list(ZERO_SHOT_TASKS)
    configs = Path(zero_shot.__file__).resolve().parents[1] / "configs"
    for table, size, n_rows in (("medium_353M", "medium", 13), ("large_770M", "large", 10)):
        assert len(paper[table]) == n_rows
        for row, scores in paper[table].items():
            assert len(scores) == 8 and all(0 < s < 100 for s in scores), row
            assert abs(sum(scores[:7]) / 7 - scores[7]) <= 0.005 + 1e-9, (table, row)
            assert (configs / size / f"{row}.toml").is_file(), (table, row)


def test_offline_without_data_dir_says_how_to_supply_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit) as exit_info:
        zero_shot.main(["--ckpt", str(tmp_path)])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert "--data-dir" in message and "hellaswag.jsonl" in message and "ctx_a" in message


@pytest.mark.parametrize("endpoint,address", [(None, "huggingface.co:443"), ("http://mirror.lan:8080", "mirror.lan:8080")])
def test_an_unreachable_hub_is_one_message_before_any_work(tmp_path, monkeypatch, capsys, endpoint, address):
    """Without HF_HUB_OFFLINE and without a network, the datasets library retried for ~23 s before the message;
    now one connection attempt to the hub (or HF_ENDPOINT) decides, before the model or lm-eval is touched."""
    import socket

    import lm_eval
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy",
                 "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    if endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    else:
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
    tried = []

    def no_network(address, timeout=None):
        tried.append((address, timeout))
        raise OSError(101, "Network is unreachable")
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda *a, **k: pytest.fail("evaluation started offline"))
    with pytest.raises(SystemExit) as exit_info:
        zero_shot.main(["--ckpt", str(tmp_path / "no_run_needed")])
    assert exit_info.value.code == 2
    host, port = address.split(":")
    assert tried == [((host, int(port)), 3.0)]
    first_line = capsys.readouterr().err.splitlines()[0]
    assert first_line == (f"error: the Hugging Face hub cannot be reached ({address}: Network is unreachable), so "
                          "the task data must come from local files: pass --data-dir DIR (or set "
                          "HF_DATASETS_OFFLINE=1 to use tasks already in the Hugging Face cache).")


def test_incomplete_data_dir_names_the_missing_files(tmp_path, capsys):
    (tmp_path / "piqa.jsonl").write_text(json.dumps({"goal": "g", "sol1": "a"}) + "\n")
    with pytest.raises(SystemExit):
        zero_shot.main(["--ckpt", str(tmp_path), "--data-dir", str(tmp_path), "--tasks", "piqa,sciq"])
    message = capsys.readouterr().err
    assert "lacks the fields ['sol2', 'label']" in message and os.path.join(str(tmp_path), "sciq.jsonl") in message


def test_the_table_is_printed_as_well_as_written(tmp_path, capsys):
    """Its own run (one task): a module-scoped fixture's run would be recorded as reached by the first test that
    set it up only, so generated mutants of the printing would never meet an assertion about it."""
    save_run(tiny_model(pos="rope", block_size=256, seed=3), tmp_path / "run", step=7)
    zero_shot.main(["--ckpt", str(tmp_path / "run"), "--data-dir", str(FIXTURES), "--out", str(tmp_path / "out"),
                    "--tasks", "arc_easy"])
    table = (tmp_path / "out" / "zero_shot.md").read_text()
    assert "| arc_easy |" in table and table in capsys.readouterr().out


def test_limit_scores_the_first_documents_of_each_task_only(tmp_path, evaluated):
    """--limit 2: two of the fixture's three documents per task are scored."""
    model, full, _ = evaluated
    save_run(model, tmp_path / "run", step=7)
    report = zero_shot.main(["--ckpt", str(tmp_path / "run"), "--data-dir", str(FIXTURES), "--out",
                             str(tmp_path / "out"), "--tasks", "arc_easy,winogrande", "--limit", "2"])
    assert full["tasks"]["arc_easy"]["n"] == 3
    assert {t: r["n"] for t, r in report["tasks"].items()} == {"arc_easy": 2, "winogrande": 2}


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


@pytest.mark.parametrize("name", ["ConnectionError", "OfflineModeIsEnabled", "LocalEntryNotFoundError",
                                  "ConnectTimeout", "ReadTimeout", "MaxRetryError", "NameResolutionError"])
def test_an_unreachable_hub_is_recognised_anywhere_in_the_error_chain(name):
    from eval.zero_shot import is_connection_error
    cause = type(name, (Exception,), {})("no network")
    assert is_connection_error(cause)
    wrapped = RuntimeError("loading the task failed")
    wrapped.__cause__ = cause
    outer = ValueError("outer")
    outer.__context__ = wrapped
    assert is_connection_error(outer)
    assert not is_connection_error(RuntimeError("a bug")) and not is_connection_error(KeyError(name))


def test_zero_shot_names_a_missing_data_dir_and_the_files_it_needs(tmp_path):
    import types

    from eval import tasks, zero_shot
    from config import UserError
    with pytest.raises(UserError) as info:
        zero_shot.run(types.SimpleNamespace(data_dir=str(tmp_path / "missing"), out=None, ckpt=str(tmp_path / "run")))
    assert str(info.value) == f"--data-dir {tmp_path / 'missing'} is not a directory.\n" + \
        tasks.expected_files_message()


def test_the_results_folder_defaults_to_the_eval_folder_beside_the_checkpoint(tmp_path):
    """--ckpt a run directory: RUN/eval; --ckpt a checkpoint file: eval beside it. A file named eval where that
    folder goes is refused naming it (before any evaluation); elsewhere the run goes on to the --data-dir check."""
    import types

    from config import UserError
    run, other = tmp_path / "run", tmp_path / "other"
    for folder in (run, other):
        folder.mkdir()
        (folder / "ckpt.pt").write_bytes(b"weights")
    (run / "eval").write_text("a file where the results folder goes")

    def failure(ckpt):
        with pytest.raises(UserError) as info:
            zero_shot.run(types.SimpleNamespace(data_dir=str(tmp_path / "missing"), out=None, ckpt=str(ckpt)))
        return str(info.value)
    for ckpt in (run, run / "ckpt.pt"):
        assert failure(ckpt).startswith(f"the results folder {run / 'eval'} cannot be made: {run / 'eval'} is a file")
    for ckpt in (other, other / "ckpt.pt"):
        assert failure(ckpt).startswith(f"--data-dir {tmp_path / 'missing'} is not a directory.")


# -------------------------------------------------------------------------------- user-facing errors


@pytest.mark.fault
@pytest.mark.parametrize("below", [False, True])
def test_an_unwritable_out_is_one_sentence_before_lm_eval_runs(below, tmp_path, monkeypatch, capsys):
    """The results folder was made only after lm-eval had scored every task, so an --out that cannot be written
    (or made) lost the scores with a PermissionError traceback. The run named here does not exist: only a check
    made before loading it can answer."""
    locked = tmp_path / "locked"
    locked.mkdir()
    unwritable(monkeypatch, locked)
    out = locked / "sub" if below else locked
    with pytest.raises(SystemExit) as info:
        zero_shot.main(["--ckpt", str(tmp_path / "no_run"), "--data-dir", str(FIXTURES), "--tasks", "piqa",
                        "--out", str(out), "--device", "cpu"])
    assert info.value.code == 2
    assert capsys.readouterr().err == f"error: {refused_out_message(out, locked, below)}\n"
    assert list(locked.iterdir()) == []


@pytest.mark.fault
def test_scores_that_cannot_be_written_after_all_are_printed_with_one_sentence(tmp_path, monkeypatch, capsys):
    """The disk fills while the results are written: the table and the whole JSON are printed, the error is one
    sentence with a non-zero exit, and no half-written file is left (lm-eval's scores stand in for a real run's)."""
    import lm_eval

    save_run(tiny_model(pos="rope", block_size=64, seed=3), tmp_path / "run", step=7)
    scores = {"results": {"piqa": {"acc,none": 0.5, "acc_stderr,none": 0.25, "acc_norm,none": 1.0}},
              "n-samples": {"piqa": {"effective": 2}}}
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **kwargs: scores)
    full_disk(monkeypatch, tmp_path / "out")
    with pytest.raises(SystemExit) as info:
        zero_shot.main(["--ckpt", str(tmp_path / "run"), "--data-dir", str(FIXTURES), "--tasks", "piqa",
                        "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.err == (f"error: cannot write the results to {tmp_path / 'out'} (No space left on device), so "
                            "they are printed above instead; free space or choose another --out, then run again\n")
    table, printed = captured.out.split("\n{", 1)
    assert "| piqa | 2 | 50.00 | 100.00 | 50.00 (acc) |" in table
    report = json.loads("{" + printed)
    assert report["tasks"]["piqa"]["acc_stderr"] == 25.0 and report["step"] == 7
    assert list((tmp_path / "out").iterdir()) == []  # no zero_shot.json.tmp left
