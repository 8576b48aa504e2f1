"""training/stopping.py: SIGTERM and Ctrl-C as one object, with real signals sent to this process."""
import os
import signal
import threading
from types import SimpleNamespace

import pytest
import torch

from training.stopping import StopSignals


def send(signum):
    os.kill(os.getpid(), signum)  # Python runs the handler in the main thread before the next line


def test_sigterm_asks_for_a_stop_and_the_handlers_are_put_back():
    said, before = [], (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    with StopSignals(said.append) as stops:
        assert not stops.requested and signal.getsignal(signal.SIGTERM) == stops.handle
        send(signal.SIGTERM)
        assert stops.requested
        send(signal.SIGTERM)  # a second SIGTERM is the same request, never an abrupt stop
        assert stops.requested
    assert said[0] == "SIGTERM: stopping with a checkpoint after the current micro-batch."
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_second_ctrl_c_stops_at_once():
    said = []
    with pytest.raises(KeyboardInterrupt):
        with StopSignals(said.append) as stops:
            send(signal.SIGINT)
            assert stops.requested and "Ctrl-C again to stop at once" in said[0]
            send(signal.SIGINT)
            pytest.fail("the second Ctrl-C did not stop")


def test_a_second_ctrl_c_during_a_checkpoint_write_waits_for_the_write():
    said, written = [], []
    with StopSignals(said.append) as stops:
        send(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            with stops.writing_checkpoint():
                send(signal.SIGINT)  # the write goes on
                written.append("checkpoint")
        assert written == ["checkpoint"]
        assert said[-1] == "Ctrl-C: stopping as soon as the checkpoint being written is complete."


def test_a_failed_write_is_reported_as_itself_not_as_the_interrupt():
    with StopSignals(lambda *a: None) as stops:
        send(signal.SIGINT)
        with pytest.raises(OSError, match="disk full"):
            with stops.writing_checkpoint():
                send(signal.SIGINT)
                raise OSError("disk full")
        assert not stops.writing


def test_the_vote_of_one_process_is_its_own_request():
    one_process = SimpleNamespace(enabled=False, device=torch.device("cpu"))
    with StopSignals(lambda *a: None) as stops:
        assert stops.any_process(one_process) is False and stops.vote(torch.device("cpu")).item() == 0.0
        send(signal.SIGTERM)
        assert stops.any_process(one_process) is True and stops.vote(torch.device("cpu")).item() == 1.0


def test_several_processes_vote_through_an_all_reduce():
    """Any process's request stops all: the vote is the sum of every process's flag."""
    sums = []

    def all_reduce_sum(tensor):
        sums.append(tensor.item())
        return tensor + 1.0  # another process was asked to stop
    others_asked = SimpleNamespace(enabled=True, device=torch.device("cpu"), all_reduce_sum=all_reduce_sum)
    with StopSignals(lambda *a: None) as stops:
        assert stops.any_process(others_asked) is True and sums == [0.0]
    nobody_asked = SimpleNamespace(enabled=True, device=torch.device("cpu"), all_reduce_sum=lambda tensor: tensor)
    with StopSignals(lambda *a: None) as stops:
        assert stops.any_process(nobody_asked) is False


def test_outside_the_main_thread_no_handler_is_installed():
    before, seen = signal.getsignal(signal.SIGTERM), []

    def enter():
        with StopSignals(lambda *a: None):
            seen.append(signal.getsignal(signal.SIGTERM))
    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert seen == [before]


def test_the_first_request_names_the_reason_and_one_request_lets_a_write_finish():
    """SIGTERM then Ctrl-C: the reason stays "sigterm", a checkpoint written after the one request is not cut, and
    the Ctrl-C that follows stops at once (a stop was already asked for). Ctrl-C then SIGTERM: "interrupted", and
    the SIGTERM is the same request again, never an abrupt stop."""
    written = []
    with StopSignals(lambda *a: None) as stops:
        send(signal.SIGTERM)
        assert stops.reason == "sigterm"
        try:
            with stops.writing_checkpoint():
                written.append("checkpoint")
        except KeyboardInterrupt:
            pytest.fail("a write after a single request was followed by an abrupt stop")
        assert written == ["checkpoint"] and not stops.interrupt_after_write
        with pytest.raises(KeyboardInterrupt):
            send(signal.SIGINT)
        assert stops.reason == "sigterm"
    with StopSignals(lambda *a: None) as stops:
        send(signal.SIGINT)
        send(signal.SIGTERM)
        assert stops.requested and stops.reason == "interrupted"
