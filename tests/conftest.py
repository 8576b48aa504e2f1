"""Fixtures shared by several test files (shared helper functions are in tests/helpers.py)."""
import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from a second thread, and on a shared machine spinning threads slow them down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def shard_check_records(tmp_path_factory):
    """Records of verified shards (data/verify.py) go to a folder of this test session, not the user's cache."""
    import os
    os.environ["GRAPE_CACHE_DIR"] = str(tmp_path_factory.mktemp("grape_cache"))
    yield
