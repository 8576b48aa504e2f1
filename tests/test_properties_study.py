"""The study report's numbers for any runs' files, GPU runs included (hypothesis; profiles in conftest.py).

The test machine trains on the CPU, so the other study tests see only GPUs = 0; here a run's files are written
as a GPU run leaves them (metrics.jsonl's summary with memory_kind "cuda max allocated", config.json's world size,
study_time.json) and the row and the Runs table are checked against them: GPUs = the run's processes, GPU-hours =
the wall-clock hours of its jobs x GPUs. The seed statistics are checked against formulas written here (mean,
sample standard deviation, the two-sided 95% Student-t interval).
"""
import json
import math
import statistics

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from scipy.stats import t as student_t

from studies import launch as study_launch, report as study_report, spec as study_spec
from studies import summary as study_summary

finite = st.floats(min_value=-50, max_value=50, allow_nan=False)


def write_run(run_dir, *, on_gpu, world_size, times, final_iter, val_loss, trained=True):
    run_dir.mkdir(parents=True, exist_ok=True)
    records = [{"type": "train", "iter": final_iter, "tokens": final_iter * 64, "loss": 3.0},
               {"type": "val", "iter": final_iter, "tokens": final_iter * 64, "val_loss": val_loss},
               {"type": "summary", "iter": final_iter, "stopped": "done",
                "memory_kind": "cuda max allocated" if on_gpu else "process max RSS", "peak_memory_gb": 12.5}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "config.json").write_text(json.dumps({"world_size": world_size}))
    (run_dir / "study_time.json").write_text(json.dumps(times))
    if trained:
        (run_dir / "ckpt.pt").write_bytes(b"x")
    return study_spec.Run(encoding="rope", seed=1, run_dir=str(run_dir), train_args=[], final_iter=final_iter, evals={},
                     model={}, tokens=final_iter * 64)


@given(on_gpu=st.booleans(), world_size=st.integers(1, 1024),
       times=st.dictionaries(st.sampled_from(["train", "extrapolation", "zero_shot"]),
                             st.floats(min_value=0, max_value=1e7), min_size=1),
       final_iter=st.integers(1, 10**6), val_loss=st.floats(min_value=0.1, max_value=20))
def test_a_runs_row_and_gpu_hours_for_any_run(tmp_path_factory, on_gpu, world_size, times, final_iter, val_loss):
    run = write_run(tmp_path_factory.mktemp("run"), on_gpu=on_gpu, world_size=world_size, times=times,
                    final_iter=final_iter, val_loss=val_loss)
    row = study_summary.run_row(run, {})
    gpus = world_size if on_gpu else 0
    assert row["gpus"] == gpus
    assert row["gpu_hours"] == pytest.approx(sum(times.values()) / 3600 * gpus, rel=1e-12, abs=1e-12)
    assert row["finished"] and row["status"] == "done" and row["final_val_loss"] == val_loss
    assert row["iter"] == final_iter and row["tokens"] == final_iter * 64 and row["peak_memory_gb"] == 12.5
    report = {"study": "s", "base": "b.toml", "overrides": [], "seeds": [1], "reference": "rope",
              "launch": {"mode": "each"}, "rule": "r", "encodings": {},
              "setup": {"model": {"n_layer": 1, "n_embd": 8, "n_head": 1, "head_dim": 8, "block_size": 8,
                                  "vocab_size": 9}, "parameters": {"rope": 1}, "tokens_per_run": 64,
                        "iterations": 1, "sequences_per_iteration": 8},
              "runs": [row]}
    runs_table = study_report.markdown(report, {}).split("## Runs")[1]
    cells = [c.strip() for c in runs_table.splitlines()[4].split("|")]
    assert cells[7] == f"{sum(times.values()) / 3600:.3f}" and cells[8] == f"{sum(times.values()) / 3600 * gpus:.2f}"


def test_a_run_whose_summary_is_not_at_its_final_iteration_is_not_finished(tmp_path):
    run = write_run(tmp_path / "a", on_gpu=True, world_size=8, times={"train": 7200.0}, final_iter=10, val_loss=3.0)
    assert study_launch.run_finished(run)
    early = study_spec.Run(**{**run.__dict__, "final_iter": 11})
    assert not study_launch.run_trained(early) and study_summary.run_row(early, {})["final_val_loss"] is None
    untrained = write_run(tmp_path / "b", on_gpu=True, world_size=8, times={}, final_iter=10, val_loss=3.0,
                          trained=False)
    assert not study_launch.run_finished(untrained) and study_summary.run_row(untrained, {})["status"] == "not run"


@given(values=st.lists(finite, min_size=0, max_size=12))
def test_describe_is_the_mean_and_the_sample_std(values):
    d = study_summary.describe(values)
    assert d["n"] == len(values) and d["values"] == values
    if not values:
        assert d["mean"] is None and d["std"] is None
        return
    assert d["mean"] == pytest.approx(sum(values) / len(values), abs=1e-9)
    if len(values) == 1:
        assert d["std"] is None
    else:
        m = sum(values) / len(values)
        assert d["std"] == pytest.approx(math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)), abs=1e-9)


@given(pairs=st.dictionaries(st.integers(0, 50), st.tuples(finite, finite), max_size=10),
       only_reference=st.sets(st.integers(51, 60), max_size=3))
@example(pairs={1: (1.0, 0.0), 2: (1.1, 0.0), 3: (1.2, 0.0)}, only_reference=set())  # a finding at exactly 3 seeds
@example(pairs={1: (-1.0, 0.0), 2: (-1.1, 0.0), 3: (-1.2, 0.0)}, only_reference=set())  # ... and a lower one
@example(pairs={1: (1.0, 0.0), 2: (1.001, 0.0)}, only_reference=set())  # 2 seeds whose interval excludes 0
def test_paired_difference_and_its_interval(pairs, only_reference):
    values = {s: a for s, (a, _) in pairs.items()}
    reference = {s: b for s, (_, b) in pairs.items()} | {s: 0.0 for s in only_reference}
    d = study_summary.paired_difference(values, reference)
    seeds = sorted(pairs)
    assert d["seeds"] == seeds and d["n"] == len(seeds)
    differences = [values[s] - reference[s] for s in seeds]
    if len(seeds) < 2:
        assert d["interval"] is None and d["exceeds_seed_spread"] is None and d["finding"] is False
        return
    mean, std = statistics.fmean(differences), statistics.stdev(differences)
    half = student_t.ppf(0.975, len(seeds) - 1) * std / math.sqrt(len(seeds))
    assert d["interval"] == pytest.approx([mean - half, mean + half], abs=1e-9)
    assert d["exceeds_seed_spread"] == (not mean - half <= 0 <= mean + half)
    assert d["finding"] == (d["exceeds_seed_spread"] and len(seeds) >= study_spec.MIN_SEEDS_FOR_A_FINDING)
    text = study_summary.verdict("fox", "rope", d)
    if d["finding"]:
        word = "lower" if mean < 0 else "higher"
        assert study_summary.finding_word(d) == word and f"fox is {word} than rope" in text
    else:
        assert study_summary.finding_word(d) == "not resolved"
    assert f"{mean:+.4f}" in text and f"over {len(seeds)} paired seed(s)" in text
    assert ("excludes 0:" in text) == d["finding"]
    assert ("not resolved at this budget" in text) == (not d["finding"])
    if len(seeds) < study_spec.MIN_SEEDS_FOR_A_FINDING:  # whatever the interval: the sentence names the seeds needed
        assert f"at least {study_spec.MIN_SEEDS_FOR_A_FINDING} seeds" in text and "contains 0" not in text
    else:
        assert ("contains 0" in text) == (not d["finding"])


@given(mean=st.one_of(st.none(), finite), std=st.one_of(st.none(), st.floats(0, 10)), digits=st.integers(0, 6))
def test_fmt_shows_mean_and_std_with_the_digits_asked(mean, std, digits):
    text = study_report.fmt({"mean": mean, "std": std}, digits)
    if mean is None:
        assert text == "–"
    elif std is None:
        assert text == f"{mean:.{digits}f}"
    else:
        assert text == f"{mean:.{digits}f} ± {std:.{digits}f}"
    assert study_report.fmt(None) == "–"
