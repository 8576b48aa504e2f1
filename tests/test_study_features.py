"""scripts/study.py features beyond tests/test_study.py: the seed-major run order, diverged runs, the finding rule,
--publish, and the cpu_jobs threads per job. Each expectation is computed here independently of study.py (the
t quantile from scipy.stats.t, the markdown from the study's own report.md, the thread count from the core count).
"""
import json
import math
import os
import shutil
from pathlib import Path

import pytest

import train
from scripts import study
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
