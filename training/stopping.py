"""Stopping on request: SIGTERM (a scheduler's preemption) or Ctrl-C, as one object.

The first request asks for a stop with a checkpoint at the next safe point (after the current micro-batch);
a second Ctrl-C stops at once, except while a checkpoint is being written: then right after it, so the file on
disk is always the old or the new checkpoint, complete. With several processes every process must stop at the
same step, so the request is voted on (`any_process`): a request seen by one process stops all of them.
"""
from __future__ import annotations

import contextlib
import signal
import threading

import torch


class StopSignals:
    """Use as `with StopSignals(say) as stops:`; the handlers are installed for the block (main thread only,
    where Python delivers signals) and the previous ones put back after it."""

    def __init__(self, say=print):
        self.say = say
        self.requested = False       # a stop was asked for on this process
        self.reason = ""             # "sigterm" or "interrupted" (Ctrl-C): how the run's summary says it stopped
        self.writing = False         # a checkpoint is being written: a second Ctrl-C waits for it
        self.interrupt_after_write = False
        self._previous = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.requested:
            if self.writing:
                self.say("Ctrl-C: stopping as soon as the checkpoint being written is complete.")
                self.interrupt_after_write = True
                return
            raise KeyboardInterrupt
        self.say(("Ctrl-C" if signum == signal.SIGINT else "SIGTERM") + ": stopping with a checkpoint after the "
                 "current micro-batch" + (" (Ctrl-C again to stop at once)." if signum == signal.SIGINT else "."))
        self.requested = True
        self.reason = self.reason or ("interrupted" if signum == signal.SIGINT else "sigterm")

    @contextlib.contextmanager
    def writing_checkpoint(self):
        """Around a checkpoint write: a second Ctrl-C during it stops right after it."""
        self.writing = True
        try:
            yield
        finally:
            self.writing = False
        if self.interrupt_after_write:
            raise KeyboardInterrupt

    def vote(self, device: torch.device) -> torch.Tensor:
        """1.0 if this process was asked to stop, as a tensor to all-reduce with others."""
        return torch.tensor(float(self.requested), device=device)

    def any_process(self, ddp) -> bool:
        """Whether any process was asked to stop. One process: the flag itself (no tensor, so no GPU sync)."""
        if not ddp.enabled:
            return self.requested
        return ddp.all_reduce_sum(self.vote(ddp.device)).item() > 0
