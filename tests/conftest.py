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
