"""training/distributed.py: a process group only under torchrun."""
import socket


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_a_process_outside_torchrun_makes_no_process_group_and_one_inside_joins_it(monkeypatch, outside_torchrun):
    import torch.distributed as dist
    from training.distributed import Distributed
    alone = Distributed("cpu")
    assert (alone.enabled, alone.world_size, dist.is_initialized()) == (False, 1, False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(port))):
        monkeypatch.setenv(name, value)
    launched = Distributed("cpu", timeout_s=60)
    try:
        assert (launched.enabled, launched.is_main, dist.is_initialized(), dist.get_world_size()) == \
            (True, True, True, 1)
    finally:
        launched.close()
    assert not dist.is_initialized()
