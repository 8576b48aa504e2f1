"""study.py features beyond tests/test_study.py: the seed-major run order, diverged runs, the finding rule
(in the report too), the rise of the loss past L, --publish, the report of a stopped study, and cpu_jobs (threads
per job, jobs side by side). Each expectation is computed here independently of study.py (the
t quantile from scipy.stats.t, the markdown from the study's own report.md, the thread count from the core count).
"""
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

import train
import study
from studies import launch as study_launch, report as study_report, spec as study_spec
from studies import summary as study_summary
from config import ConfigError, resolve
from model import GPTConfig
from test_study import records, study_file, workspace  # noqa: F401  (workspace: the module-scoped fixture)

ENCODINGS, SEEDS = ["rope", "alibi"], [1, 2]
# Extrapolation only (no zero-shot): a second plot, loss_vs_position.png, for --publish to copy.
EXTRAPOLATION = """
[eval.extrapolation]
factors = [1, 2]
windows = 2
passkey_factors = [1]
depths = [0]
passkey_trials = 1
"""


@pytest.fixture(scope="module", autouse=True)
def single_threaded():
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ordered(workspace, tmp_path_factory):  # noqa: F811
    """The tiny study (rope, alibi x seeds 1, 2, in_process) run once with train.run recording its arguments and
    then training for real: (its directory, the recorded argument lists, the report)."""
    root = tmp_path_factory.mktemp("ordered")
    shutil.copy(workspace / "base.toml", root / "base.toml")
    path = study_file(root, encodings=ENCODINGS, seeds=SEEDS, evals=EXTRAPOLATION)
    calls, real_run = [], train.run

    def recording(argv):
        calls.append(list(argv))
        return real_run(argv)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setattr(train, "run", recording)
        report = study.main([path])
    return root, calls, report


def flag(argv, name):
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert len(values) == 1, argv
    return values[0]


# ----------------------------------------------------------------------------- 1. run order

def test_runs_go_seed_by_seed_every_encoding_for_each(ordered):
    root, calls, report = ordered
    order = [(flag(a, "pos"), int(flag(a, "seed"))) for a in calls]
    assert order == [("rope", 1), ("alibi", 1), ("rope", 2), ("alibi", 2)]
    assert [flag(a, "out_dir") for a in calls] == [os.path.join("out", e, f"seed{s}") for e, s in order]
    assert not any("--resume" in a for a in calls)  # every run started afresh
    assert [(r["encoding"], r["seed"]) for r in report["runs"]] == order  # the report lists them in that order
    for row in report["runs"]:  # and each really finished
        assert row["status"] == "done"
        assert row["final_val_loss"] == records(root / row["run_dir"], "val")[-1]["val_loss"]


# ----------------------------------------------------------------------------- 2. diverged runs

DIVERGED = "training diverged: loss is nan at iteration 3; resume from the last good checkpoint with a lower lr"


def loss_table(markdown):
    """The rows of the report's final-validation-loss table: encoding -> {column: cell}."""
    lines = markdown.split("## Final validation loss\n\n", 1)[1].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_a_diverged_run_is_reported_as_diverged_and_not_trained_again(workspace, tmp_path, monkeypatch, capsys):  # noqa: F811
    from eval import extrapolation
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=ENCODINGS, seeds=SEEDS, evals=EXTRAPOLATION)
    monkeypatch.chdir(tmp_path)
    real_run, real_extrapolation = train.run, extrapolation.main
    trained, evaluated = [], []

    def alibi_seed1_diverges(argv):
        trained.append((flag(argv, "pos"), int(flag(argv, "seed"))))
        if trained[-1] == ("alibi", 1):
            raise train.TrainError(DIVERGED)
        return real_run(argv)

    def counted_extrapolation(argv):
        evaluated.append(argv[argv.index("--ckpt") + 1])
        return real_extrapolation(argv)
    monkeypatch.setattr(train, "run", alibi_seed1_diverges)
    monkeypatch.setattr(extrapolation, "main", counted_extrapolation)
    run_dir = Path("out") / "alibi" / "seed1"

    for attempt in range(2):
        report = study.main([path])  # returns: a diverged run is not a failure, so no exit status 1 (nor any)
        out = capsys.readouterr().out
        if attempt == 0:
            assert trained == [("rope", 1), ("alibi", 1), ("rope", 2), ("alibi", 2)]
            assert str(run_dir) not in evaluated and len(evaluated) == 3  # nothing evaluates the diverged run
            assert "[study] DIVERGED alibi seed 1: " + DIVERGED in out
        else:  # the rerun trains and evaluates nothing: the marker says it diverged
            assert trained == [] and evaluated == []
            assert f"[study] DIVERGED alibi seed 1 (earlier): {DIVERGED}" in out
        assert "[study] FAILED" not in out
        assert (f"[study] wrote {os.path.join('out', 'report.md')} and report.json; 1 run(s) diverged, see the "
                "report's last section") in out.splitlines()
        trained.clear(), evaluated.clear()
        assert json.loads((run_dir / "study_diverged.json").read_text()) == {"error": DIVERGED}
        assert json.loads(Path("out/report.json").read_text()) == json.loads(json.dumps(report))
        rows = {(r["encoding"], r["seed"]): r for r in report["runs"]}
        row = rows["alibi", 1]
        assert row["status"] == "diverged" and row["errors"] == [f"training: {DIVERGED}"]
        assert row["final_val_loss"] is None and not row["finished"]
        assert all(rows[key]["status"] == "done" for key in rows if key != ("alibi", 1))

        alibi, rope = report["encodings"]["alibi"], report["encodings"]["rope"]
        assert alibi["diverged_seeds"] == [1] and rope["diverged_seeds"] == []
        # Left out of the means and the paired difference: only seed 2 remains for alibi.
        assert alibi["final_val_loss"]["seeds"] == [2] and alibi["final_val_loss"]["n"] == 1
        assert alibi["final_val_loss"]["values"] == [records("out/alibi/seed2", "val")[-1]["val_loss"]]
        assert alibi["difference_to_reference"]["seeds"] == [2]
        assert alibi["extrapolation"]["seeds"] == [2]
        assert alibi["verdict"].endswith(" Diverged (no final loss, left out above): seed(s) 1.")

        markdown = Path("out/report.md").read_text()
        table = loss_table(markdown)
        assert table["alibi"]["diverged"] == "1" and table["rope"]["diverged"] == "0"
        assert table["alibi"]["seeds"] == "1" and table["rope"]["seeds"] == "2"
        assert "| alibi | 1 | diverged | 0 | 0 | – |" in markdown  # the Runs table
        assert f"- alibi seed 1: training: {DIVERGED}" in markdown.split("## Failed or diverged runs", 1)[1]


# ----------------------------------------------------------------------------- 3. the finding rule

def t_interval(values):
    """mean ± t(0.975, n - 1) · sd / √n, sd the sample standard deviation, written out here."""
    from scipy.stats import t
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean, sd, (mean - half, mean + half)


@pytest.mark.parametrize("sign,word", [(+1, "higher"), (-1, "lower")])
def test_a_difference_is_a_finding_only_over_three_seeds_whose_interval_excludes_0(sign, word):
    reference = {1: 3.0, 2: 3.2, 3: 2.9, 4: 3.1}  # seed 4: the encoding lacks it, so it is not paired
    deltas = {1: 0.100, 2: 0.101, 3: 0.103}
    mine = {s: reference[s] + sign * d for s, d in deltas.items()}
    expected = [mine[s] - reference[s] for s in (1, 2, 3)]

    diff = study_summary.paired_difference(mine, reference)
    mean, sd, (lo, hi) = t_interval(expected)
    assert diff["seeds"] == [1, 2, 3] and diff["n"] == 3 and diff["values"] == pytest.approx(expected, abs=1e-15)
    assert diff["mean"] == pytest.approx(mean, rel=1e-12) and diff["std"] == pytest.approx(sd, rel=1e-9)
    assert diff["interval"] == pytest.approx([lo, hi], rel=1e-9)
    assert (lo > 0 or hi < 0) and diff["exceeds_seed_spread"] is True and diff["finding"] is True
    assert study_summary.finding_word(diff) == word
    sentence = study_summary.verdict("alibi", "rope", diff)
    assert "excludes 0:" in sentence and "not resolved" not in sentence
    assert f"[{lo:+.4f}, {hi:+.4f}]" in sentence and f"= {mean:+.4f} ± {sd:.4f}" in sentence
    assert sentence.endswith(f"alibi is {word} than rope at this budget.") and "over 3 paired seed(s)" in sentence
    assert study_report.interval_cell(diff).endswith("*")

    # The same first two seeds: the interval still excludes 0 (t(0.975, 1) = 12.7 against a tiny spread), but two
    # seeds never make a finding.
    two = study_summary.paired_difference({s: mine[s] for s in (1, 2)}, reference)
    mean2, sd2, (lo2, hi2) = t_interval(expected[:2])
    assert two["n"] == 2 and two["interval"] == pytest.approx([lo2, hi2], rel=1e-9)
    assert (lo2 > 0 or hi2 < 0) and two["exceeds_seed_spread"] is True and two["finding"] is False
    assert study_summary.finding_word(two) == "not resolved"
    sentence = study_summary.verdict("alibi", "rope", two)
    assert "not resolved at this budget" in sentence and "excludes 0:" not in sentence
    assert "over 2 paired seed(s)" in sentence and f"= {mean2:+.4f} ± {sd2:.4f}" in sentence
    assert not study_report.interval_cell(two).endswith("*")


def test_three_seeds_whose_interval_contains_0_are_not_resolved():
    values = [0.05, -0.02, 0.04]
    got = study_summary.mean_interval(values)
    mean, sd, (lo, hi) = t_interval(values)
    assert lo < 0 < hi and got["interval"] == pytest.approx([lo, hi], rel=1e-9)
    assert got["exceeds_seed_spread"] is False and got["finding"] is False
    diff = got | {"seeds": [1, 2, 3]}
    assert study_summary.finding_word(diff) == "not resolved"
    sentence = study_summary.verdict("fox", "rope", diff)
    assert f"[{lo:+.4f}, {hi:+.4f}] contains 0: not resolved at this budget." in sentence
    # one seed: no interval at all, and no finding
    one = study_summary.mean_interval([0.3])
    assert one["interval"] is None and one["std"] is None and one["finding"] is False


# ----------------------------------------------------------------------------- 3b. the rise, and the rule in the report

# Per (encoding, seed): the final validation loss, the loss at L, and the rise at 2L and 4L the fake extrapolation
# files hold. alibi is lower than rope over 3 seeds (a finding); fox is higher over 2 seeds (its seed 3 diverges):
# its interval excludes 0 too, but two seeds are never a finding.
RISE_SEEDS = [1, 2, 3]
FAKE = {
    "rope": {1: (3.000, 3.20, 0.50, 1.00), 2: (3.100, 3.30, 0.55, 1.20), 3: (2.950, 3.15, 0.60, 0.90)},
    "alibi": {1: (2.900, 3.22, 0.05, 0.10), 2: (2.999, 3.28, 0.07, 0.12), 3: (2.847, 3.17, 0.06, 0.11)},
    "fox": {1: (3.200, 3.25, 0.30, 0.60), 2: (3.301, 3.31, 0.31, 0.62)},
}
RISE_EVAL = "\n[eval.extrapolation]\nfactors = [1, 2, 4]\nwindows = 1\npasskey_trials = 0\n"


def fake_training_and_extrapolation(monkeypatch, final_iter, tokens):
    """train.run writes what train.py leaves after a finished run (ckpt.pt, metrics.jsonl with the final validation
    loss and the summary), with FAKE's loss (fox seed 3 diverges); extrapolation.main writes an
    eval/extrapolation.json with FAKE's losses at L, 2L and 4L (L = 32). The outputs that train nothing."""
    from eval import extrapolation
    trained, evaluated = [], []

    def fake_run(argv):
        pos, seed, out_dir = flag(argv, "pos"), int(flag(argv, "seed")), flag(argv, "out_dir")
        trained.append((pos, seed))
        if (pos, seed) == ("fox", 3):
            raise train.TrainError(DIVERGED)
        loss = FAKE[pos][seed][0]
        os.makedirs(out_dir, exist_ok=True)
        Path(out_dir, "ckpt.pt").write_bytes(b"a checkpoint")
        lines = [{"type": "train", "iter": final_iter, "tokens": tokens, "loss": loss + 0.05},
                 {"type": "val", "iter": final_iter, "tokens": tokens, "val_loss": loss},
                 {"type": "summary", "iter": final_iter, "stopped": "done"}]
        Path(out_dir, "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        return {"stopped": "done", "step": final_iter}

    def fake_extrapolation(argv):
        run_dir, out = argv[argv.index("--ckpt") + 1], argv[argv.index("--out") + 1]
        pos, seed = Path(run_dir).parent.name, int(Path(run_dir).name.removeprefix("seed"))
        evaluated.append((pos, seed))
        _, at_l, rise2, rise4 = FAKE[pos][seed]
        contexts = {}
        for factor, beyond in ((1, None), (2, at_l + rise2), (4, at_l + rise4)):
            curve = [at_l] * 2 + [beyond if beyond is not None else at_l] * 2
            contexts[str(32 * factor)] = {
                "nonoverlapping": {"mean": at_l if beyond is None else (at_l + beyond) / 2, "windows": 4 // factor,
                                   "mean_beyond_train_context": beyond, "binned_positions": [4, 12, 20, 28],
                                   "binned_loss": curve},
                "sliding": {"mean": at_l - 0.01, "stride": 16, "min_context": 17, "tokens_scored": 100}}
        result = {"run": run_dir, "name": f"seed{seed}", "encoding": pos, "train_context": 32, "step": final_iter,
                  "val_tokens": 129, "contexts": contexts, "elapsed_s": {}}
        os.makedirs(out, exist_ok=True)
        Path(out, "extrapolation.json").write_text(json.dumps([result]))
        return [result]
    monkeypatch.setattr(train, "run", fake_run)
    monkeypatch.setattr(extrapolation, "main", fake_extrapolation)
    return trained, evaluated


def cell(values, digits=3):
    """The report's cell for a mean over seeds, written out here: mean [lo, hi] with * where it is a finding."""
    mean, _, (lo, hi) = t_interval(values)
    finding = (lo > 0 or hi < 0) and len(values) >= 3
    return f"{mean:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]" + ("*" if finding else "")


def table_row(markdown, first_cell, after):
    """The cells of the first table row after the text `after` whose first cell is first_cell."""
    for line in markdown.split(after, 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells[1:]
    raise AssertionError(f"no row {first_cell!r} after {after!r}")


def test_the_rise_past_L_and_the_finding_rule_in_the_report(workspace, tmp_path, monkeypatch, capsys):  # noqa: F811
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=list(FAKE), seeds=RISE_SEEDS, evals=RISE_EVAL)
    monkeypatch.chdir(tmp_path)
    plan = study_spec.load_study(path)
    trained, evaluated = fake_training_and_extrapolation(monkeypatch, plan.runs[0].final_iter, plan.runs[0].tokens)
    report = study.main([path])  # returns: fox's diverged seed 3 does not make the study exit 1
    assert [(r.encoding, r.seed) for r in plan.runs] == trained  # every run was tried, none really trained
    assert sorted(evaluated) == sorted((e, s) for e in FAKE for s in FAKE[e])
    assert json.loads(Path("out/report.json").read_text()) == json.loads(json.dumps(report))
    markdown = Path("out/report.md").read_text()
    files = {e: {s: json.loads(Path("out", e, f"seed{s}", "eval", "extrapolation.json").read_text())[0]
                 for s in FAKE[e]} for e in FAKE}

    def loss_at(encoding, seed, factor):
        loss = files[encoding][seed]["contexts"][str(32 * factor)]["nonoverlapping"]
        return loss["mean"] if factor == 1 else loss["mean_beyond_train_context"]

    after_rise = "the rise of the loss beyond L over the loss at L"
    after_difference = "The loss beyond L minus rope's (paired by seed):"
    for encoding, seeds in FAKE.items():
        seeds = sorted(seeds)
        by_seed = report["encodings"][encoding]["extrapolation"]["by_seed"]
        assert by_seed["seeds"] == seeds
        at_l = [loss_at(encoding, s, 1) for s in seeds]
        mean, sd, (lo, hi) = t_interval(at_l)
        assert by_seed["at_L"]["values"] == at_l and by_seed["at_L"]["mean"] == pytest.approx(mean, rel=1e-12)
        cells = table_row(markdown, encoding, after_rise)
        assert cells[0] == f"{mean:.3f} ± {sd:.3f}"
        for i, factor in enumerate((2, 4)):
            rise = [loss_at(encoding, s, factor) - loss_at(encoding, s, 1) for s in seeds]
            assert rise == pytest.approx([FAKE[encoding][s][1 + factor // 2] for s in seeds], abs=1e-12)
            got = by_seed["rise"][str(factor)]
            mean, sd, (lo, hi) = t_interval(rise)
            assert got["values"] == pytest.approx(rise, abs=1e-15) and got["n"] == len(seeds)
            assert got["mean"] == pytest.approx(mean, rel=1e-12) and got["std"] == pytest.approx(sd, rel=1e-9)
            assert got["interval"] == pytest.approx([lo, hi], rel=1e-9)
            assert lo > 0  # every rise here is clearly positive: a finding only over 3 seeds
            assert got["exceeds_seed_spread"] is True and got["finding"] is (len(seeds) >= 3)
            assert cells[1 + i] == cell(rise) and cells[1 + i].endswith("*") is (len(seeds) >= 3)

            paired = [loss_at(encoding, s, factor) - loss_at("rope", s, factor) for s in seeds]
            got = by_seed["beyond_minus_reference"][str(factor)]
            assert got["seeds"] == seeds and got["values"] == pytest.approx(paired, abs=1e-15)
            if encoding != "rope":
                mean, sd, (lo, hi) = t_interval(paired)
                assert got["mean"] == pytest.approx(mean, rel=1e-12) and got["std"] == pytest.approx(sd, rel=1e-9)
                assert got["interval"] == pytest.approx([lo, hi], rel=1e-9)
                assert table_row(markdown, f"{encoding} − rope", after_difference)[i] == cell(paired)
    differences = {e: report["encodings"][e]["extrapolation"]["by_seed"]["beyond_minus_reference"] for e in FAKE}
    assert differences["alibi"]["2"]["finding"] is True and differences["alibi"]["2"]["interval"][1] < 0
    assert differences["fox"]["2"]["finding"] is False  # 2 seeds

    # The final-loss table and sentences: alibi's interval over 3 seeds excludes 0 (a finding, "lower"); fox's
    # over 2 seeds does too, but it is "not resolved".
    table = loss_table(markdown)
    sentences = {line.split(" ", 2)[1]: line for line in markdown.splitlines() if line.startswith("- ")
                 and " − rope = " in line}
    for encoding, word, n in (("alibi", "lower", 3), ("fox", "not resolved", 2)):
        seeds = sorted(FAKE[encoding])
        diff = [FAKE[encoding][s][0] - FAKE["rope"][s][0] for s in seeds]
        mean, sd, (lo, hi) = t_interval(diff)
        assert lo > 0 or hi < 0  # both intervals exclude 0
        got = report["encodings"][encoding]["difference_to_reference"]
        assert got["seeds"] == seeds and got["interval"] == pytest.approx([lo, hi], rel=1e-9)
        assert got["exceeds_seed_spread"] is True and got["finding"] is (n >= 3)
        row = table[encoding]
        assert row["seeds"] == str(n) and row["finding"] == word
        assert row["95% t-interval"] == f"[{lo:+.4f}, {hi:+.4f}]"
        assert row["− rope (paired)"] == f"{mean:.4f} ± {sd:.4f}"
        sentence = sentences[encoding]
        assert f"= {mean:+.4f} ± {sd:.4f} (mean ± sample std) over {n} paired seed(s)" in sentence
        if n >= 3:
            assert (f"the 95% t-interval [{lo:+.4f}, {hi:+.4f}] excludes 0: alibi is lower than rope at this "
                    "budget.") in sentence and "not resolved" not in sentence
        else:
            assert "not resolved at this budget" in sentence and "excludes 0:" not in sentence
    assert table["fox"]["diverged"] == "1" and table["alibi"]["diverged"] == table["rope"]["diverged"] == "0"
    assert report["encodings"]["fox"]["diverged_seeds"] == [3]
    assert "[study] FAILED" not in capsys.readouterr().out
    assert Path("out/loss_vs_position.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- 3c. the evaluations' paired differences

# alibi beats rope on retrieval by a known amount in the far bucket only (+0.20, +0.25, +0.30 over seeds 1-3) and
# loses on RULER at the longer length only (-10, -12, -11 points); the near bucket and the shorter length are equal,
# so a difference read from the wrong bucket, length or family, or with its sign turned, is seen.
ACCURACY = {"rope": {1: (0.90, 0.10), 2: (0.80, 0.20), 3: (0.85, 0.15)},
            "alibi": {1: (0.90, 0.30), 2: (0.80, 0.45), 3: (0.85, 0.45)}}
RULER = {"rope": {1: (60.0, 40.0), 2: (50.0, 42.0), 3: (55.0, 41.0)},
         "alibi": {1: (60.0, 30.0), 2: (50.0, 30.0), 3: (55.0, 30.0)}}
BABILONG = {"rope": {1: 20.0, 2: 22.0, 3: 21.0}, "alibi": {1: 25.0, 2: 22.0, 3: 21.0}}  # alibi's seed 1 only


def fake_outputs(monkeypatch):
    """eval_outputs_by_seed reads the outputs above (what finished runs' eval files would hold)."""
    def outputs(study, encoding, name):
        if name == "retrieval":
            return {s: {"buckets": [{"accuracy": a} for a in accuracy]} for s, accuracy in ACCURACY[encoding].items()}
        return {s: {"lengths": [64, 128], "ruler_average": {"64": r[0], "128": r[1]},
                    "babilong_average": {"64": BABILONG[encoding][s]}} for s, r in RULER[encoding].items()}
    monkeypatch.setattr(study_summary, "eval_outputs_by_seed", outputs)
    return type("FakeStudy", (), {"reference": "rope"})()


def test_retrieval_and_long_context_differences_are_the_encoding_minus_the_reference(monkeypatch):
    plan = fake_outputs(monkeypatch)
    near, far = study_summary.retrieval_differences(plan, "alibi")
    assert near["values"] == [0.0, 0.0, 0.0] and near["mean"] == 0.0 and near["finding"] is False
    expected = [ACCURACY["alibi"][s][1] - ACCURACY["rope"][s][1] for s in (1, 2, 3)]
    mean, sd, (lo, hi) = t_interval(expected)
    assert far["seeds"] == [1, 2, 3] and far["values"] == pytest.approx([0.20, 0.25, 0.30], abs=1e-12)
    assert far["mean"] == pytest.approx(0.25, abs=1e-12) and far["interval"] == pytest.approx([lo, hi], rel=1e-9)
    assert lo > 0 and far["finding"] is True and study_summary.finding_word(far) == "higher"

    lc = study_summary.long_context_differences(plan, "alibi")
    assert lc["ruler"]["64"]["values"] == [0.0, 0.0, 0.0]
    assert lc["ruler"]["128"]["values"] == [-10.0, -12.0, -11.0] and lc["ruler"]["128"]["mean"] == -11.0
    assert lc["ruler"]["128"]["finding"] is True and study_summary.finding_word(lc["ruler"]["128"]) == "lower"
    assert lc["babilong"]["64"]["values"] == [5.0, 0.0, 0.0] and lc["babilong"]["128"]["n"] == 0

    # the report's cells: the far bucket's +0.250 with its interval and *, RULER's -11.00 at 128 tokens
    report = {"reference": "rope", "encodings": {"alibi": {
        "retrieval": {"train_context": 64, "buckets": [{"bucket": "(0, L]", "accuracy": {"mean": 0.5, "std": 0.1}},
                                                       {"bucket": "(L, 2L]", "accuracy": {"mean": 0.4, "std": 0.1}}],
                      "difference_to_reference": [near, far]},
        "long_context": {"lengths": [64, 128], "train_context": 64, "tasks": {},
                         "ruler_average": {}, "ruler_average_tasks": {"64": 0, "128": 0},
                         "babilong_average": {}, "babilong_average_tasks": {"64": 0, "128": 0},
                         "difference_to_reference": lc}}}}
    lines = study_report.retrieval_lines(report, {})
    assert f"| alibi − rope | +0.000 [+0.000, +0.000] | +0.250 [{lo:+.3f}, {hi:+.3f}]* |" in lines
    ruler = next(line for line in study_report.long_context_lines(report, {})
                 if line.startswith("| alibi − rope | RULER"))
    assert ruler.split(" | ")[3].startswith("-11.00 [")


# ----------------------------------------------------------------------------- 4. --publish

BEFORE = "# CPU results\n\nWhat was found, in words: kept as it is.\n\n"
AFTER = "\n\n## Discussion\n\nAlso kept, byte for byte.   \n"
PLOTS = ("loss_curves.png", "loss_vs_position.png")


def expected_body(report_md: str, stem: str) -> str:
    """The study's own report.md one heading level down, its plots named <stem>_<plot>.png."""
    lines = []
    for line in report_md.rstrip("\n").split("\n"):
        for plot in PLOTS:
            line = line.replace(f"]({plot})", f"]({stem}_{plot})")
        lines.append("#" + line if line.startswith("#") else line)
    return "\n".join(lines)


@pytest.fixture
def finished_copy(ordered, tmp_path, monkeypatch):
    """A copy of the finished study (file times kept, so its evaluations stay finished), as the working directory;
    train.run and the evaluation must not be called."""
    from eval import extrapolation
    root, _, _ = ordered
    shutil.copytree(root, tmp_path / "copy")
    monkeypatch.chdir(tmp_path / "copy")
    monkeypatch.setattr(train, "run", lambda argv: pytest.fail(f"train.run called: {argv}"))
    monkeypatch.setattr(extrapolation, "main", lambda argv: pytest.fail(f"extrapolation called: {argv}"))
    return tmp_path / "copy"


def test_publish_writes_the_report_between_the_markers_and_keeps_the_rest(finished_copy):
    target = Path("results.md")
    target.write_bytes((BEFORE + study_report.REPORT_BEGIN + "\nan older report\n## with a heading\n" + study_report.REPORT_END
                        + AFTER).encode())
    study.main(["study.toml", "--publish", str(target)])
    text = target.read_bytes().decode()
    body = expected_body(Path("out/report.md").read_text(), "results")
    assert text == f"{BEFORE}{study_report.REPORT_BEGIN}\n{body}\n{study_report.REPORT_END}{AFTER}"
    assert "an older report" not in text
    assert "\n## Study `study`\n" in text and "\n### Final validation loss\n" in text  # one level down
    assert "\n# Study" not in text.split(study_report.REPORT_BEGIN)[1]
    for plot in PLOTS:  # each plot copied beside the file, the same bytes as the study's own
        assert f"](results_{plot})" in text
        assert Path(f"results_{plot}").read_bytes() == Path("out", plot).read_bytes()
        assert Path(f"results_{plot}").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in Path(".").glob("results*")) == ["results.md"] + [f"results_{p}" for p in PLOTS]

    first = target.read_bytes()
    study.main(["study.toml", "--publish", str(target)])  # publishing again changes nothing
    assert target.read_bytes() == first
    for plot in PLOTS:
        assert Path(f"results_{plot}").read_bytes() == Path("out", plot).read_bytes()


def test_a_page_published_before_the_study_runner_moved_is_updated_in_place(finished_copy):
    """docs/results_cpu.md was published by scripts/study.py, whose begin marker named that path: study.py --publish
    finds it, writes the report in its place under the current marker, and keeps the text around it."""
    old_begin = "<!-- study report: begin (scripts/study.py --publish writes this part) -->"
    assert study_report.REPORT_BEGIN == old_begin.replace("scripts/study.py", "study.py")
    target = Path("results.md")
    target.write_text(BEFORE + old_begin + "\nan older report\n" + study_report.REPORT_END + AFTER)
    study.main(["study.toml", "--publish", str(target)])
    body = expected_body(Path("out/report.md").read_text(), "results")
    assert target.read_text() == f"{BEFORE}{study_report.REPORT_BEGIN}\n{body}\n{study_report.REPORT_END}{AFTER}"


def test_publish_to_a_missing_file_makes_it_with_the_markers(finished_copy):
    assert not Path("new.md").exists()
    study.main(["study.toml", "--publish", "new.md"])
    body = expected_body(Path("out/report.md").read_text(), "new")
    assert Path("new.md").read_text() == f"{study_report.REPORT_BEGIN}\n{body}\n{study_report.REPORT_END}\n"
    for plot in PLOTS:
        assert Path(f"new_{plot}").read_bytes() == Path("out", plot).read_bytes()


@pytest.mark.parametrize("text", [
    BEFORE + AFTER,                                                                  # no markers
    BEFORE + study_report.REPORT_BEGIN + "\n" + AFTER,                                      # no end marker
    BEFORE + study_report.REPORT_END + "\n" + study_report.REPORT_BEGIN + "\n" + AFTER,            # in the wrong order
    BEFORE + (study_report.REPORT_BEGIN + "\n" + study_report.REPORT_END + "\n") * 2 + AFTER,      # twice
])
def test_a_publish_target_without_its_markers_is_refused_before_any_run(workspace, tmp_path, monkeypatch, capsys,  # noqa: F811
                                                                        text):
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=ENCODINGS, seeds=SEEDS, evals="")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "run", lambda argv: pytest.fail("train.run called before the target was checked"))
    target = tmp_path / "doc.md"
    target.write_text(text)
    with pytest.raises(study_spec.StudyError, match="must hold the lines"):
        study_report.check_publish_target(str(target))
    with pytest.raises(SystemExit) as exit_info:  # main turns the StudyError into one sentence and status 2
        study.main([path, "--publish", str(target)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {target} must hold the lines {study_report.REPORT_BEGIN} and {study_report.REPORT_END}")
    assert len(err.splitlines()) == 1
    assert target.read_text() == text and not (tmp_path / "out").exists()
    with pytest.raises(study_spec.StudyError, match="does not exist or cannot be written"):  # a folder that is not there
        study_report.check_publish_target(str(tmp_path / "no_such_folder" / "doc.md"))


def test_every_plot_the_published_report_links_is_beside_it(finished_copy):
    """A study with a long-context evaluation: its plot too must be linked under the name publish copies it to."""
    plan = study_spec.load_study("study.toml")
    report = json.loads(Path("out/report.json").read_text())
    output = {"lengths": [32, 64], "train_context": 32, "rope_scaling": "none", "limit": 1,
              "tasks": ["niah_single_1"], "ruler_average": {"32": 50.0, "64": 25.0},
              "ruler_average_tasks": {"32": 1, "64": 1}, "babilong_average": {}, "babilong_average_tasks": {},
              "scores": {"niah_single_1": {"32": {"score": 50.0}, "64": {"score": 25.0}}}}
    report["encodings"]["rope"]["long_context"] = study_summary.long_context_summary([output]) | {"seeds": [1]}
    shutil.copy("out/loss_curves.png", "out/long_context.png")  # any PNG: publish copies it, whatever it shows
    report["plots"]["long_context"] = "long_context.png"
    study_report.publish(plan, report, "doc.md")
    text = Path("doc.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == 3 and "doc_long_context.png" in links
    assert all(Path(link).is_file() for link in links), links


# ----------------------------------------------------------------------------- 4b. a stopped study's report

def test_a_stopped_study_reports_and_publishes_what_finished(workspace, tmp_path, monkeypatch, capsys):  # noqa: F811
    """train.py returns {"stopped": "sigterm"} (it saved a checkpoint on SIGTERM) for the second run: the study
    stops with status 130, and report.json, report.md and the published file hold the first run as done, the
    second as interrupted and the two never started as not run."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=ENCODINGS, seeds=SEEDS, evals="")
    monkeypatch.chdir(tmp_path)
    real_run, started = train.run, []

    def second_run_stopped(argv):
        started.append((flag(argv, "pos"), int(flag(argv, "seed"))))
        if len(started) == 2:
            return {"stopped": "sigterm", "step": 2}
        return real_run(argv)
    monkeypatch.setattr(train, "run", second_run_stopped)
    target = Path("doc.md")
    target.write_text(BEFORE + study_report.REPORT_BEGIN + "\n" + study_report.REPORT_END + AFTER)
    with pytest.raises(SystemExit) as exit_info:
        study.main([path, "--publish", str(target)])
    assert exit_info.value.code == 130
    assert started == [("rope", 1), ("alibi", 1)]  # nothing starts after the stop
    out, err = capsys.readouterr()
    assert err.strip().startswith("stopped:") and "run the same command again" in err
    assert f"[study] wrote {os.path.join('out', 'report.md')} with the runs finished so far" in out

    report = json.loads(Path("out/report.json").read_text())
    statuses = {(r["encoding"], r["seed"]): r["status"] for r in report["runs"]}
    assert statuses == {("rope", 1): "done", ("alibi", 1): "interrupted", ("rope", 2): "not run",
                        ("alibi", 2): "not run"}
    rows = {(r["encoding"], r["seed"]): r for r in report["runs"]}
    loss = records("out/rope/seed1", "val")[-1]["val_loss"]
    assert rows["rope", 1]["final_val_loss"] == loss and rows["rope", 1]["finished"]
    assert all(rows[key]["final_val_loss"] is None for key in rows if key != ("rope", 1))
    rope, alibi = report["encodings"]["rope"], report["encodings"]["alibi"]
    assert rope["final_val_loss"]["values"] == [loss] and rope["final_val_loss"]["seeds"] == [1]
    assert alibi["final_val_loss"]["n"] == 0 and alibi["difference_to_reference"]["n"] == 0
    markdown = Path("out/report.md").read_text()
    assert f"| rope | 1 | done | 6 | 768 | {loss:.4f} |" in markdown
    assert "| alibi | 1 | interrupted | 0 | 0 | – |" in markdown
    assert "| alibi | 2 | not run | 0 | 0 | – |" in markdown and "| rope | 2 | not run | 0 | 0 | – |" in markdown
    assert report["plots"] == {"loss_curves": "loss_curves.png"}

    # The published file: that same partial report, between the markers, the text around them kept.
    assert target.read_text() == f"{BEFORE}{study_report.REPORT_BEGIN}\n{expected_body(markdown, 'doc')}\n" \
                                 f"{study_report.REPORT_END}{AFTER}"
    assert Path("doc_loss_curves.png").read_bytes() == Path("out/loss_curves.png").read_bytes()


# ----------------------------------------------------------------------------- 5. cpu_jobs: threads per job

@pytest.mark.parametrize("jobs,encodings", [(2, ["rope", "alibi"]), (3, ["rope", "alibi", "fox"])])
def test_cpu_jobs_run_at_most_jobs_runs_at_once(workspace, tmp_path, monkeypatch, jobs, encodings):  # noqa: F811
    """A study of 2 x jobs runs whose training subprocess is faked: each waits until `jobs` of them are running
    (a barrier: it breaks, and the study fails, if fewer ever run side by side), then half a second more, and counts
    how many run at once (never more than jobs). Each fake job writes what train.py leaves, so every run ends done."""
    import subprocess
    import threading
    import time
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=encodings, seeds=SEEDS, evals="",
                      extra=f'[launch]\nmode = "cpu_jobs"\njobs = {jobs}\n')
    monkeypatch.chdir(tmp_path)
    plan = study_spec.load_study(path)
    final_iter, tokens = plan.runs[0].final_iter, plan.runs[0].tokens
    lock, running, most, started = threading.Lock(), [0], [0], []
    together = threading.Barrier(jobs, timeout=20)

    class FakeTrainPopen:
        def __init__(self, command, env=None, **kwargs):
            self.out_dir = next(a for a in command if a.startswith("--out_dir=")).split("=", 1)[1]
            with lock:
                started.append((self.out_dir, env["OMP_NUM_THREADS"], env["CUDA_VISIBLE_DEVICES"]))

        def wait(self):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            try:
                together.wait()
                time.sleep(0.5)  # time for a run beyond `jobs`, if the study started one, to be counted
                loss = 3.0 + len(self.out_dir) / 100
                lines = [{"type": "train", "iter": final_iter, "tokens": tokens, "loss": loss},
                         {"type": "val", "iter": final_iter, "tokens": tokens, "val_loss": loss},
                         {"type": "summary", "iter": final_iter, "stopped": "done"}]
                Path(self.out_dir, "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
                Path(self.out_dir, "ckpt.pt").write_bytes(b"a checkpoint")
            finally:
                with lock:
                    running[0] -= 1
            return 0
    monkeypatch.setattr(subprocess, "Popen", FakeTrainPopen)
    report = study.main([path])
    assert most[0] == jobs
    assert sorted(started) == sorted((run.run_dir, str(8 // jobs), "") for run in plan.runs)
    assert all(r["status"] == "done" for r in report["runs"]) and len(report["runs"]) == 2 * jobs



@pytest.mark.parametrize("cores,jobs,threads", [(16, 2, 8), (16, 3, 5), (8, 1, 8), (2, 2, 1), (2, 4, 1),
                                                (7, None, 1), (None, 1, 1)])
def test_cpu_jobs_give_each_job_its_share_of_the_cores(workspace, tmp_path, monkeypatch, cores, jobs,  # noqa: F811
                                                       threads):
    """OMP_NUM_THREADS = max(1, cores // jobs) in the environment each subprocess job starts with (jobs left out:
    one job per core), no GPU visible, the rest of the study's environment passed on."""
    import subprocess
    import sys
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    launch = '[launch]\nmode = "cpu_jobs"\n' + (f"jobs = {jobs}\n" if jobs is not None else "")
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals=EXTRAPOLATION, extra=launch)
    monkeypatch.chdir(tmp_path)
    s = study_spec.load_study(path)
    n_jobs = jobs if jobs is not None else (cores or 1)
    assert threads == max(1, (cores or 1) // n_jobs)  # the documented rule, for the values listed above
    assert s.jobs == n_jobs and study_launch.gpu_slots(s) == [[] for _ in range(n_jobs)]

    started = []

    class FakePopen:  # records what the study would start, and "succeeds" at once
        def __init__(self, command, env=None, **kwargs):
            started.append((command, env))

        def wait(self):
            return 0
    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setenv("OMP_NUM_THREADS", "99")  # the study's value replaces one already set
    monkeypatch.setenv("STUDY_TEST_MARK", "kept")
    runner, run = study_launch.Runner(s), s.runs[0]
    assert runner.subprocess_job("train", study_launch.train_argv(run), run.run_dir, []) is None
    assert runner.subprocess_job("extrapolation", run.evals["extrapolation"], run.run_dir, []) is None
    (train_command, train_env), (eval_command, eval_env) = started
    assert train_command == [sys.executable, str(study_launch.REPO / "train.py"), *run.train_args]
    assert eval_command == [sys.executable, str(study_launch.REPO / "eval" / "extrapolation.py"), *run.evals["extrapolation"]]
    for env in (train_env, eval_env):
        assert env["OMP_NUM_THREADS"] == str(threads)
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["STUDY_TEST_MARK"] == "kept"
        assert {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")} == \
            {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")}
    command, extra = study_launch.job_command(s, "train", run.train_args, [])
    assert extra == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads)}
    assert Path(run.run_dir, "study_train.log").read_text() == f"$ CUDA_VISIBLE_DEVICES= {' '.join(train_command)}\n"



def test_dotted_keys_and_sub_tables_of_overrides_are_train_and_model_keys(workspace, tmp_path, monkeypatch):  # noqa: F811
    """TOML reads `train.max_iters = 4` and an [overrides.model] table as tables inside [overrides]: they are
    train.py's --train.max_iters=4 and --model.n_layer=1, and a misspelled one is named with its section."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    monkeypatch.chdir(tmp_path)
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals="",
                      extra="[overrides]\ntrain.max_iters = 4\nwarmup_iters = 1\n[overrides.model]\nn_layer = 1\n")
    run = study_spec.load_study(path).runs[0]
    assert {"--train.max_iters=4", "--warmup_iters=1", "--model.n_layer=1"} <= set(run.train_args)
    assert run.final_iter == 4
    Path(path).write_text(Path(path).read_text().replace("n_layer = 1", "n_layr = 1"))
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    assert f"{path} [overrides] model.n_layr: unknown model key 'n_layr'" in str(error.value)
    assert "did you mean 'n_layer'?" in str(error.value)


@pytest.mark.parametrize("in_the_way", ["out", "out/sub", "out/sub/study"])
def test_an_out_dir_that_a_file_stands_in_is_refused_before_any_run(workspace, tmp_path, monkeypatch, in_the_way):  # noqa: F811
    """The report folder (or a folder above it) is a file: said before any run, with the file named; it used to end
    the study, after every run had failed to make its directory, in a traceback."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "run", lambda argv: pytest.fail("a study with mistakes must train nothing"))
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals="")
    Path(path).write_text(Path(path).read_text().replace('out_dir = "out"', 'out_dir = "out/sub/study"'))
    Path(in_the_way).parent.mkdir(parents=True, exist_ok=True)
    Path(in_the_way).write_text("notes\n")
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    assert f"out_dir: 'out/sub/study' cannot be made: {in_the_way!r} is a file, not a folder" in str(error.value)
    assert Path(in_the_way).read_text() == "notes\n"


def test_a_settings_mistake_in_a_study_file_names_keys_not_train_py_flags(workspace, tmp_path, monkeypatch):  # noqa: F811
    """train.py's remedies name its flags (--warmup_iters); a study file sets keys, so inside it the same check
    says `warmup_iters` and `lr = 0.001`, and train.py's own wording is unchanged."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    monkeypatch.chdir(tmp_path)
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals="",
                      extra="[overrides]\nmax_iters = 5\nwarmup_iters = 10\n")
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    assert (f"{path} [overrides] warmup_iters: warmup_iters (10) must be between 0 and max_iters - 1 (4); lower "
            "warmup_iters or raise max_iters.") in str(error.value).splitlines()
    Path(path).write_text(Path(path).read_text().replace("max_iters = 5\nwarmup_iters = 10", "lr = 0.0"))
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    assert "lr must be a positive number, not 0.0; set it in [overrides], e.g. lr = 0.001 (the default)." \
        in str(error.value) and "--" not in str(error.value)
    Path(path).write_text(Path(path).read_text().replace("lr = 0.0", 'loss = "bogus"'))
    with pytest.raises(study_spec.StudyError) as error:  # a string's default in TOML's quotes: the line can be pasted
        study_spec.load_study(path)
    assert 'set it in [overrides], e.g. loss = "auto" (the default).' in str(error.value)
    with pytest.raises(ConfigError, match=r"lower --warmup_iters or raise --max_iters\.$"):
        resolve("base.toml", ["--max_iters=5", "--warmup_iters=10"], GPTConfig)


def test_a_run_whose_only_checkpoint_is_its_shards_is_resumed_not_started_again(workspace, tmp_path, monkeypatch):  # noqa: F811
    """ckpt.pt gone but a complete sharded checkpoint left (an FSDP run killed while ckpt.pt was replaced): the
    study resumes it (train.py --resume recovers the shards) instead of starting a new run that train.py refuses
    with advice naming its own flags. Which shards are complete is training.checkpointing's to say."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    monkeypatch.chdir(tmp_path)
    run = study_spec.load_study(study_file(tmp_path, encodings=["rope"], seeds=[1], evals="")).runs[0]
    asked = []
    monkeypatch.setattr(study_launch, "latest_complete_shards",
                        lambda run_dir: asked.append(run_dir) or (("ckpt.shards/5-ab", 5) if shards else None))
    shards = False
    assert study_launch.train_argv(run) == run.train_args and asked == [run.run_dir]
    shards = True
    assert study_launch.train_argv(run) == run.train_args + ["--resume"]
    shards = False
    Path(run.run_dir).mkdir(parents=True)
    Path(run.run_dir, "ckpt.pt").write_bytes(b"")
    assert study_launch.train_argv(run) == run.train_args + ["--resume"]


def test_a_last_line_cut_short_is_a_kills_unfinished_write_not_damage(tmp_path):
    """read_metrics: a last line without its newline that is not a record is skipped (train.py's resume removes it);
    the same line inside the file, or ended by its newline, is damage, counted by its line number."""
    path = tmp_path / "metrics.jsonl"
    for text, damaged in (('{"type": "train"}\n{"type": "tr', []), ('{"type": "train"}\n{"type": "tr\n', [2]),
                          ('{"type": "tr\n{"type": "train"}\n', [1]), ('{"type": "train"}\n', [])):
        path.write_text(text)
        records, lines = study_launch.read_metrics(str(tmp_path))
        assert (records, lines) == ([{"type": "train"}], damaged), text


def test_metrics_read_again_are_parsed_again_when_the_file_changed_once(tmp_path):
    """read_metrics keeps the parse of an unchanged file; a file changed once between two reads is parsed again
    however it changed: the same size with a new time (a record overwritten in place by garbage), the same size and
    time under a new inode (replaced by rename), a longer file with its time kept. What a caller does to the lists
    it gets does not reach the kept parse."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iter": 1}\n{"iter": 2}\n')
    for _ in range(3):  # a fresh parse, then the kept one twice
        records, damaged = study_launch.read_metrics(str(tmp_path))
        assert (records, damaged) == ([{"iter": 1}, {"iter": 2}], [])
        records.append({"iter": 99}), damaged.append(7)

    before = os.stat(path)
    with open(path, "r+b") as f:  # the same inode and size, line 2 now garbage, the time one second on
        f.seek(len('{"iter": 1}\n'))
        f.write(b'{"iter"\xff 2}\n')
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_ino == before.st_ino
    assert study_launch.read_metrics(str(tmp_path)) == ([{"iter": 1}], [2])

    before = os.stat(path)
    replacement = tmp_path / "metrics.new"
    replacement.write_text('{"iter": 3}\n{"iter": 4}\n')  # the same size again
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(replacement, path)
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert study_launch.read_metrics(str(tmp_path)) == ([{"iter": 3}, {"iter": 4}], [])

    before = os.stat(path)
    with open(path, "ab") as f:
        f.write(b'{"iter": 5}\n')
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert study_launch.read_metrics(str(tmp_path)) == ([{"iter": 3}, {"iter": 4}, {"iter": 5}], [])
    path.unlink()
    assert study_launch.read_metrics(str(tmp_path)) == ([], [])


def test_an_evaluation_is_finished_until_its_checkpoint_or_output_changes_once(tmp_path):
    """eval_finished re-reads the marker, the output and ckpt.pt's identity on every call: true for the files as
    the evaluation left them; false once ckpt.pt is rewritten at the same size (a new time) or grows with its time
    kept, once the output is cut short, once the arguments differ in one value. An older marker (argv and step)
    holds only while ckpt.pt is strictly older than it."""
    run_dir = tmp_path / "rope" / "seed3"
    argv = ["--ckpt", str(run_dir), "--out", str(run_dir / "eval"), "--windows", "4"]
    run = study_spec.Run("rope", 3, str(run_dir), [], 7, {"extrapolation": argv}, {}, 0)
    (run_dir / "eval").mkdir(parents=True)
    ckpt, output = run_dir / "ckpt.pt", run_dir / "eval" / "extrapolation.json"
    marker = Path(study_launch.eval_marker(run, "extrapolation"))
    ckpt.write_bytes(b"a checkpoint")
    output.write_text('{"loss": 3.25}')

    def mark():
        record = {"argv": study_launch.portable(argv, run), "checkpoint": study_launch.checkpoint_identity(run)}
        marker.write_text(json.dumps(record))
    mark()
    assert study_launch.eval_finished(run, "extrapolation")
    before = ckpt.stat()
    ckpt.write_bytes(b"A checkpoint")  # retrained: the same size, a second later
    os.utime(ckpt, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert not study_launch.eval_finished(run, "extrapolation")
    mark()
    before = ckpt.stat()
    with open(ckpt, "ab") as f:
        f.write(b"!")
    os.utime(ckpt, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert not study_launch.eval_finished(run, "extrapolation")
    mark()
    assert study_launch.eval_finished(run, "extrapolation")
    output.write_text('{"loss": 3.')
    assert not study_launch.eval_finished(run, "extrapolation")
    output.write_text('{"loss": 3.25}')
    run.evals["extrapolation"] = argv[:-1] + ["5"]
    assert not study_launch.eval_finished(run, "extrapolation")
    run.evals["extrapolation"] = argv

    marker.write_text(json.dumps({"argv": study_launch.portable(argv, run), "step": 7}))
    at = ckpt.stat().st_mtime_ns
    os.utime(marker, ns=(at + 1, at + 1))
    assert study_launch.eval_finished(run, "extrapolation")
    os.utime(marker, ns=(at, at))  # written in the same instant as the checkpoint: not known to be after it
    assert not study_launch.eval_finished(run, "extrapolation")
    os.utime(marker, ns=(at + 1, at + 1))
    run.final_iter = 8
    assert not study_launch.eval_finished(run, "extrapolation")


def test_seed_0_and_the_largest_seed_are_study_seeds(workspace, tmp_path, monkeypatch):  # noqa: F811
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    monkeypatch.chdir(tmp_path)
    plan = study_spec.load_study(study_file(tmp_path, encodings=["rope"], seeds=[0, 2**64 - 1], evals=""))
    assert plan.seeds == [0, 2**64 - 1] and [run.seed for run in plan.runs] == [0, 2**64 - 1]
    with pytest.raises(study_spec.StudyError, match="seeds"):
        study_spec.load_study(study_file(tmp_path, encodings=["rope"], seeds=[-1], evals=""))


# ----------------------------------------------------------------------------- study mistakes that passed silently

@pytest.mark.fault
@pytest.mark.parametrize("extra,key,message", [
    ("[overrides]\nmax_iters = 4\ntrain.max_iters = 5\n", "[overrides]",
     "sets max_iters twice (max_iters and train.max_iters); keep one."),
    ("[overrides]\npos = \"fox\"\n", "[overrides] pos",
     "is set for each run by the study's encodings, which would override it silently; remove it and set encodings."),
    ("[overrides]\ntrain.seed = 7\n", "[overrides] train.seed",
     "is set for each run by the study's seeds, which would override it silently; remove it and set seeds."),
    ("[overrides]\nout_dir = \"elsewhere\"\n", "[overrides] out_dir",
     "is set for each run by the study's out_dir, which would override it silently; remove it and set out_dir."),
    ("[overrides]\nkv_shift = true\n", "[overrides] kv_shift",
     "is set for each run by the study's encodings, which would override it silently; remove it and set encodings."),
])
def test_overrides_the_study_would_drop_are_refused(workspace, tmp_path, monkeypatch, extra, key, message):  # noqa: F811
    """Both spellings of one key trained with the first and dropped the second; pos, seed and out_dir in [overrides]
    lost to the study's own encodings, seeds and out_dir without a word."""
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    monkeypatch.chdir(tmp_path)
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals="", extra=extra)
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    assert f"{path} {key}: {message}" in str(error.value).splitlines()


@pytest.mark.fault
def test_a_base_that_is_a_folder_is_named_as_one(workspace, tmp_path, monkeypatch):  # noqa: F811
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    monkeypatch.chdir(tmp_path)
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals="")
    Path(path).write_text(Path(path).read_text().replace('base = "base.toml"', 'base = ".."'))
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    assert f"{path} base: {tmp_path.parent} is a folder, not a config file; name a .toml file" in str(error.value)


@pytest.mark.fault
def test_an_out_dir_that_cannot_be_written_is_refused_before_any_run(workspace, tmp_path, monkeypatch):  # noqa: F811
    """A study on a read-only mount: each run failed in turn (a 29-line traceback, or two chained ones)."""
    from helpers import refused_out_message, unwritable
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "run", lambda argv: pytest.fail("a study with mistakes must train nothing"))
    path = study_file(tmp_path, encodings=["rope"], seeds=[1], evals="")
    Path("locked").mkdir()
    Path(path).write_text(Path(path).read_text().replace('out_dir = "out"', 'out_dir = "locked/study"'))
    unwritable(monkeypatch, "locked")
    with pytest.raises(study_spec.StudyError) as error:
        study_spec.load_study(path)
    assert f"{path} out_dir: " + refused_out_message("locked/study", str(tmp_path / "locked"), below=True,
                                                     what="the study's runs", option="out_dir") + "." \
        in str(error.value).splitlines()


@pytest.mark.fault
def test_publish_targets_that_cannot_take_the_report_are_refused_before_any_run(tmp_path):
    """--publish onto a folder or a Latin-1 file was a traceback; onto a read-only or immutable file the report
    replaced it (mode 444 became 644) or ended in a traceback after every run, leaving F.tmp and pictures."""
    import errno
    with pytest.raises(study_spec.StudyError, match=f"^--publish {tmp_path} is a folder; give the Markdown file"):
        study_report.check_publish_target(str(tmp_path))
    latin = tmp_path / "latin.md"
    latin.write_bytes(("caf\xe9\n" + study_report.REPORT_BEGIN + "\n" + study_report.REPORT_END + "\n").encode("latin-1"))
    with pytest.raises(study_spec.StudyError, match="latin.md is not UTF-8 text; save it as UTF-8"):
        study_report.check_publish_target(str(latin))
    target = tmp_path / "doc.md"
    target.write_text(study_report.REPORT_BEGIN + "\n" + study_report.REPORT_END + "\n")
    real_open = open

    def read_only_open(file, mode="r", *args, **kwargs):  # as the file's owner sees a 444 file (root does not)
        if str(file) == str(target) and any(m in mode for m in "wa+"):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, mode, *args, **kwargs)
    import builtins
    builtins.open = read_only_open
    try:
        with pytest.raises(study_spec.StudyError) as refused:
            study_report.check_publish_target(str(target))
    finally:
        builtins.open = real_open
    assert str(refused.value) == (f"--publish {target} cannot be written (Permission denied); make it writable "
                                  "(chmod u+w, or chattr -i for an immutable file) or choose another file.")


@pytest.mark.fault
def test_publish_onto_a_symbolic_link_writes_the_document_it_points_to(finished_copy):
    """The link was replaced by a file, and the document it pointed to never got the report."""
    Path("docs").mkdir()
    document = Path("docs", "real.md")
    document.write_text(BEFORE + study_report.REPORT_BEGIN + "\nan older report\n" + study_report.REPORT_END + AFTER)
    os.symlink(os.path.join("docs", "real.md"), "results.md")
    study.main(["study.toml", "--publish", "results.md"])
    assert os.readlink("results.md") == os.path.join("docs", "real.md")  # still the link
    body = expected_body(Path("out/report.md").read_text(), "real")  # its plots beside the document, named after it
    assert document.read_text() == f"{BEFORE}{study_report.REPORT_BEGIN}\n{body}\n{study_report.REPORT_END}{AFTER}"
    for plot in PLOTS:
        assert Path("docs", f"real_{plot}").read_bytes() == Path("out", plot).read_bytes()
    assert not list(Path(".").glob("results_*"))


@pytest.mark.fault
def test_a_publish_target_that_is_not_a_regular_file_is_refused_before_it_is_read(workspace, tmp_path,  # noqa: F811
                                                                                 monkeypatch, capsys):
    """Onto a FIFO (or /dev/stdout, a pipe) the study hung before any run, reading a file no one writes."""
    import signal

    def hung(*_):
        raise TimeoutError("the check waited on the FIFO")
    shutil.copy(workspace / "base.toml", tmp_path / "base.toml")
    path = study_file(tmp_path, encodings=ENCODINGS, seeds=SEEDS, evals="")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "run", lambda argv: pytest.fail("train.run called before the target was checked"))
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        with pytest.raises(SystemExit) as exit_info:
            study.main([path, "--publish", str(fifo)])
        with pytest.raises(study_spec.StudyError) as device:
            study_report.check_publish_target(os.devnull)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"error: --publish {fifo} is a FIFO (named pipe), not a regular file; give the "
                                       "Markdown file to write the report into (the report is printed and in the "
                                       "study's report.md either way).\n")
    assert str(device.value).startswith(f"--publish {os.devnull} is a device, not a regular file")
    assert not (tmp_path / "out").exists()


@pytest.mark.fault
def test_a_publish_that_fails_at_the_end_leaves_the_file_and_its_folder_as_they_were(finished_copy, monkeypatch):
    import errno
    target = Path("results.md")
    target.write_text(BEFORE + study_report.REPORT_BEGIN + "\nold\n" + study_report.REPORT_END + AFTER)
    os.chmod(target, 0o640)
    before = sorted(p.name for p in Path(".").iterdir())
    plan = study_spec.load_study("study.toml")
    report = json.loads(Path("out/report.json").read_text())
    real_replace = os.replace

    def refusing_replace(src, dst):  # (the file made immutable while the study ran)
        if str(dst) == str(target):
            raise PermissionError(errno.EPERM, "Operation not permitted", str(dst))
        return real_replace(src, dst)
    monkeypatch.setattr(os, "replace", refusing_replace)
    with pytest.raises(study_spec.StudyError) as error:
        study_report.publish(plan, report, str(target))
    assert str(error.value).startswith(f"cannot publish the report into {target} (Operation not permitted); it is in "
                                       f"{os.path.join('out', 'report.md')}")
    assert "\nold\n" in target.read_text()
    monkeypatch.setattr(os, "replace", real_replace)
    assert sorted(p.name for p in Path(".").iterdir()) == before  # no .tmp, no pictures
    study_report.publish(plan, report, str(target))
    assert "\nold\n" not in target.read_text() and os.stat(target).st_mode & 0o777 == 0o640  # its mode kept


@pytest.mark.fault
def test_a_finished_study_copied_to_a_new_path_keeps_its_evaluations(finished_copy):
    """A study with an absolute out_dir, copied with cp -a to another path and pointed there: its evaluation records
    held the old absolute path, so every evaluation was done again (finished_copy fails on any evaluation)."""
    for marker in Path("out").rglob("*.study.json"):
        record = json.loads(marker.read_text())
        record["argv"] = [arg.replace("out" + os.sep, "/old/place/out" + os.sep, 1) if arg.startswith("out") else arg
                          for arg in record["argv"]]
        stat = marker.stat()
        marker.write_text(json.dumps(record) + "\n")
        os.utime(marker, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    Path("study.toml").write_text(Path("study.toml").read_text().replace('out_dir = "out"',
                                                                          f'out_dir = "{Path("out").resolve()}"'))
    report = study.main(["study.toml"])
    assert report["runs"] and all(r["finished"] and not r["errors"] for r in report["runs"])
    run = study_spec.load_study("study.toml").runs[0]
    assert study_launch.portable(["--ckpt", "/x/y/" + os.path.join(run.encoding, f"seed{run.seed}"), "--out",
                                  os.path.join("z", run.encoding, f"seed{run.seed}", "eval"), "--windows", "4"], run) \
        == ["--ckpt", "{run}", "--out", os.path.join("{run}", "eval"), "--windows", "4"]
    twice = os.path.join("/x", run.encoding, f"seed{run.seed}", "study", run.encoding, f"seed{run.seed}", "eval")
    assert study_launch.portable(["--out", twice], run) == ["--out", os.path.join("{run}", "eval")]  # the run's own


def test_the_datas_own_error_is_the_mean_half_width_of_each_seeds_interval_over_documents():
    def seed(interval):
        return {"train_context": 4, "contexts": {
            "4": {"nonoverlapping": {"mean": 1.0, "mean_beyond_train_context": None}, "sliding": None},
            "8": {"nonoverlapping": {"mean": 1.1, "mean_beyond_train_context": 1.2}, "sliding": None,
                  "rise_by_document": {"mean": 0.1, "interval": interval, "documents": 26}}}}
    summary = study_summary.extrapolation_summary([seed([0.0, 0.2]), seed([0.0, 0.4])])
    assert summary["contexts"]["2"]["rise_by_document"] == {"documents": 26, "half_width": pytest.approx(0.15)}
    assert summary["contexts"]["1"]["sliding"] is None and "rise_by_document" not in summary["contexts"]["1"]
    one_without = study_summary.extrapolation_summary([seed([0.0, 0.2]), seed(None)])
    assert "rise_by_document" not in one_without["contexts"]["2"]  # an interval over one document: none to average


def test_the_reach_summary_over_seeds_from_hand_made_heads():
    """reach_summary over two seeds of two heads: the median head's reach_mass (a head beyond what was read counts
    as the number of distances read), the mean mass within each distance, the heads beyond the reach read, and the
    share of heads whose penalty is still below their margin (a penalty equal to the margin no longer reaches)."""
    def head(mass, reach_mass, penalty, margin):
        over = [d for d, p in enumerate(penalty) if p >= margin]
        return {"mass": mass, "reach_mass": reach_mass, "penalty": penalty, "margin": margin,
                "reach_penalty": over[0] if over else None}

    def seed(heads, reach):
        return {"train_context": 4, "additive": True, "largest_distance": 2, "heads": heads, "reach": reach}
    first = seed([head([0.5, 0.25, 0.25], 1, [0.0, 1.0, 2.0], 1.0),          # reaches its margin exactly at 1
                  head([0.25, 0.125, 0.125], None, [0.0, 0.5, 0.875], 1.0)], 2)  # never: beyond what was read
    second = seed([head([0.625, 0.375, 0.0], 0, [0.0, 2.0, 4.0], 2.0),
                   head([0.25, 0.25, 0.25], None, [0.0, 0.25, 0.5], 0.25)], 1)  # its mass beyond, not its reach
    got = study_summary.reach_summary([first, second])
    assert got["mass_read"] == 2 and got["heads"] == 2 and got["largest_distance"] == 2
    assert got["median_reach_mass"]["values"] == [2.0, 1.5]  # median of (1, 3) and of (0, 3)
    assert [d["values"] for d in got["mass_within"]] == [[0.375, 0.4375], [0.5625, 0.75], [0.75, 0.875]]
    assert got["reach"]["values"] == [2, 1] and got["beyond_read"]["values"] == [1, 0]
    assert [d["values"] for d in got["share_reaching"]] == [[1.0, 1.0], [0.5, 0.0], [0.5, 0.0]]
    assert got["share_reaching"][1]["mean"] == 0.25


def test_the_long_context_and_zero_shot_summaries_over_two_seeds_that_differ():
    """Two seeds whose scores differ by length, family, task and metric, one missing a length: each cell is the
    describe() of its own seeds' values, a missing one left out (not counted as 0)."""
    def long_context(ruler, babilong, niah):
        return {"lengths": [64, 128], "train_context": 64, "rope_scaling": None, "limit": 10, "tasks": ["niah"],
                "ruler_average": ruler, "ruler_average_tasks": {"64": 1, "128": 1}, "babilong_average": babilong,
                "babilong_average_tasks": {"64": 1}, "scores": {"niah": {n: {"score": v} for n, v in niah.items()}}}
    got = study_summary.long_context_summary([
        long_context({"64": 50.0, "128": 25.0}, {}, {"64": 60.0, "128": 20.0}),
        long_context({"64": 70.0, "128": None}, {"64": 10.0}, {"64": 80.0})])
    assert got["ruler_average"]["64"]["values"] == [50.0, 70.0] and got["ruler_average"]["64"]["mean"] == 60.0
    assert got["ruler_average"]["128"]["values"] == [25.0]
    assert got["babilong_average"]["64"]["values"] == [10.0] and got["babilong_average"]["128"]["n"] == 0
    assert got["babilong_average_tasks"] == {"64": 1, "128": 0} and got["ruler_average_tasks"] == {"64": 1, "128": 1}
    assert got["tasks"]["niah"]["64"]["values"] == [60.0, 80.0] and got["tasks"]["niah"]["128"]["values"] == [20.0]

    def zero_shot(acc, acc_norm, average):
        return {"tasks": {"hellaswag": {"average_metric": "acc_norm", "acc": acc, "acc_norm": acc_norm}},
                "average": average, "paper_size": "medium_353M", "paper": {}}
    got = study_summary.zero_shot_summary([zero_shot(30.0, 32.0, 40.0), zero_shot(31.0, 35.0, 42.0)])
    row = got["tasks"]["hellaswag"]
    assert row["average_metric"] == "acc_norm" and "score" not in row
    assert row["acc"]["values"] == [30.0, 31.0] and row["acc_norm"]["values"] == [32.0, 35.0]
    assert got["average"]["mean"] == 41.0


def test_the_reach_table_says_when_the_median_head_holds_its_mass_past_what_was_read():
    def stat(mean):
        return {"mean": mean, "std": 0.0, "n": 3}
    report = {"encodings": {
        "nope": {"reach": {"additive": False, "mass_read": 256, "median_reach_mass": stat(257)}},
        "fox": {"reach": {"additive": True, "mass_read": 256, "median_reach_mass": stat(2), "reach": stat(16),
                          "beyond_read": stat(0), "heads": 16}},
        "alibi": {"reach": {"additive": True, "mass_read": 256, "median_reach_mass": stat(91), "reach": stat(2048),
                            "beyond_read": stat(1), "heads": 16}}}}
    lines = study_report.reach_lines(report, {})
    assert "| nope | > 256 | – (no additive penalty) | – |" in lines
    assert "| fox | 2 ± 0 | 16 ± 0 | 0.0 ± 0.0 of 16 |" in lines
    assert "| alibi | 91 ± 0 | ≥ 2048 ± 0 | 1.0 ± 0.0 of 16 |" in lines


RETRIEVAL_AND_REACH = """
[eval.retrieval]
edges = "0,1,2"
pairs = 1
sequences = 2

[eval.reach]
windows = 1
factor = 2
"""


def test_retrieval_and_reach_added_to_a_finished_study_are_the_runs_own_outputs(ordered, tmp_path, monkeypatch):
    """Retrieval and reach sections added to a finished study: only they run (no training again), and the report
    holds each run's own eval/retrieval.json and eval/reach.json: accuracy per bucket over seeds, the paired
    difference to rope per seed, the setup's sizes, the reach of alibi's heads, each in report.md's tables; every
    table of report.md starts after a blank line (Markdown renders no table glued to a paragraph)."""
    from eval.reach import encoding_reach
    root, _, _ = ordered
    shutil.copytree(root, tmp_path / "copy")
    monkeypatch.chdir(tmp_path / "copy")
    monkeypatch.setattr(train, "run", lambda argv: pytest.fail(f"train.run called: {argv}"))
    study_path = Path("study.toml")
    study_path.write_text(study_path.read_text() + RETRIEVAL_AND_REACH)
    report = study.main([str(study_path)])
    outputs = {(e, s): {name: json.loads((Path("out") / e / f"seed{s}" / "eval" / f"{name}.json").read_text())
                        for name in ("retrieval", "reach")} for e in ENCODINGS for s in SEEDS}
    outputs = {key: {name: o[0] if isinstance(o, list) else o for name, o in value.items()}
               for key, value in outputs.items()}
    first = outputs["rope", 1]["retrieval"]
    assert [b["bucket"] for b in first["buckets"]] == ["(0, L]", "(L, 2L]"] and first["pairs"] == 1
    assert report["setup"]["retrieval"] == {"pairs": 1, "sequences": 2,
                                            "queries": [b["queries"] for b in first["buckets"]]}
    assert report["setup"]["reach"]["windows"] == 1 and report["setup"]["reach"]["factor"] == 2
    md = (Path("out") / "report.md").read_text()
    assert f"- Retrieval: 2 test sequences per gap bucket, 1 facts and their queries in each " \
           f"({first['buckets'][0]['queries']} queries per bucket and run)" in md
    for encoding in ENCODINGS:
        rt = report["encodings"][encoding]["retrieval"]
        for i, bucket in enumerate(rt["buckets"]):
            accuracies = [outputs[encoding, s]["retrieval"]["buckets"][i]["accuracy"] for s in SEEDS]
            assert bucket["accuracy"]["values"] == accuracies
            assert bucket["accuracy"]["mean"] == pytest.approx(sum(accuracies) / 2)
        row = f"| {encoding} | " + " | ".join(study_report.fmt(b["accuracy"], 3) for b in rt["buckets"]) + " |"
        assert row in md
    differences = report["encodings"]["alibi"]["retrieval"]["difference_to_reference"]
    assert "difference_to_reference" not in report["encodings"]["rope"]["retrieval"] and len(differences) == 2
    for i, d in enumerate(differences):
        per_seed = [outputs["alibi", s]["retrieval"]["buckets"][i]["accuracy"]
                    - outputs["rope", s]["retrieval"]["buckets"][i]["accuracy"] for s in SEEDS]
        assert d["seeds"] == SEEDS and d["mean"] == pytest.approx(sum(per_seed) / 2, abs=1e-12)
    assert "| alibi − rope | " in md
    reach = report["encodings"]["alibi"]["reach"]
    assert reach["additive"] and reach["reach"]["values"] == [encoding_reach(outputs["alibi", s]["reach"])
                                                              for s in SEEDS]
    assert not report["encodings"]["rope"]["reach"]["additive"] and "| rope | " in md.split("## Each head's reach")[1]
    lines = md.split("\n")
    assert lines[1] == ""  # after the title
    for before, line in zip(lines, lines[1:]):
        if line.startswith("|") and not before.startswith("|"):
            assert before == "", f"a table glued to the line before it: {before!r} / {line!r}"
    for encoding in ENCODINGS:  # the final validation loss column is the runs' own
        loss_table = md.split("## Final validation loss")[1].split("\n\n")[1].split("\n")
        row, = [x for x in loss_table if x.startswith(f"| {encoding} | {len(SEEDS)} | ")]
        assert row.split(" | ")[2] == study_report.fmt(report["encodings"][encoding]["final_val_loss"])
    # an encoding with no finished evaluation (all its runs diverged): the others' passkey rows stay
    alibi = {k: v for k, v in report["encodings"]["alibi"].items() if k not in ("extrapolation", "retrieval", "reach")}
    partial = study_report.markdown({**report, "encodings": {**report["encodings"], "alibi": alibi}}, {})
    passkey = partial.split("## Passkey retrieval accuracy")[1].split("\n\n")[1]
    assert "| rope | " in passkey and "| alibi | " not in passkey


@pytest.mark.fault
def test_a_run_file_that_is_not_json_or_not_an_object_reads_as_absent(tmp_path):
    """A run's config.json of binary garbage was a UnicodeDecodeError traceback in the study's report, and one that
    held a list an AttributeError: each is damaged, read as absent like one that is missing."""
    path = tmp_path / "config.json"
    for text, expected, kind in [(b"\xff\xfe{", None, None), (b"[1, 2]", [1, 2], None), (b"[1, 2]", None, dict),
                                 (b'{"world_size": 2}', {"world_size": 2}, dict), (b'{"cut', None, dict)]:
        path.write_bytes(text)
        assert study_launch.read_json(str(path), kind) == expected, text
    assert study_launch.read_json(str(tmp_path / "missing.json"), dict) is None
