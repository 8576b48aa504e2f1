"""Fixtures shared by several test files (shared helper functions are in tests/helpers.py)."""
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from tests.slurm_cluster import slurm_cluster  # noqa: F401  (a real two-node SLURM: tests/slurm_cluster.py)

# Property-based tests (hypothesis's @given, in each module's own test file): CI runs the "ci" profile, derandomised
# (the same examples on every run, so a failure reproduces) and bounded; `--hypothesis-profile=long` (or
# HYPOTHESIS_PROFILE=long) searches 20x as many random examples and keeps what it finds in .hypothesis/ for the
# next run.
settings.register_profile("ci", max_examples=25, derandomize=True, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("long", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from a second thread, and on a shared machine spinning threads slow them down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def outside_torchrun(monkeypatch):
    """This process as one started without torchrun (a test run may itself be under a launcher): no rank, no world."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def work_clock(monkeypatch):
    """A clock for eval/progress.py that only the test moves (now[0] += seconds), and a progress line on every
    advance: the elapsed times and ETAs printed are then exact (tests/test_eval_progress.py reads them)."""
    from eval import progress
    now = [0.0]
    monkeypatch.setattr(progress, "clock", lambda: now[0])
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    return now


def pytest_configure(config):
    """Records of verified shards (data/verify.py) go to a folder of this test session, not the user's cache. Set
    before any test module is imported: several build their subprocesses' environment at import. And the marker
    of the fault-injection cases outside tests/test_faults.py."""
    import os
    import tempfile
    config.addinivalue_line("markers", "fault: a fault-injection case listed in docs/faults.md "
                                       "(tools/fault_report.py runs them all: pytest -m fault)")
    config.shard_check_records = tempfile.mkdtemp(prefix="grape_cache_")
    os.environ["GRAPE_CACHE_DIR"] = config.shard_check_records


def pytest_unconfigure(config):
    import shutil
    shutil.rmtree(getattr(config, "shard_check_records", ""), ignore_errors=True)
