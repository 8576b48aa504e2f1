"""The one exception training raises for the user to act on, and the line a Ctrl-C ends with."""
import os
import sys

from config import STUDY_COMMAND, how_to_continue, study_command  # noqa: F401  (re-exported)


def interrupted_line() -> str:
    return f"interrupted: the last checkpoint written (if any) is intact; {how_to_continue()}."


class TrainError(Exception):
    """A problem the user must act on (bad checkpoint, diverged run, ...); the message says what to do."""


class LostProcess(TrainError):
    """Another process died or froze: every process says so (the main one may be the one that died), and none closes
    the process group (that would wait on the dead process)."""


def launched_by_torchrun() -> bool:
    """Whether torchrun (or a launcher like it) started this process: it sets RANK and WORLD_SIZE together."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def process_rank() -> int:
    """This process's rank in its job: torchrun's RANK, or 0 for a process started alone, also where a RANK was
    left in the environment without WORLD_SIZE (exported in a shell, say), which no launcher set: one process is
    the main one, takes the run directory's lock and reports its errors. Every place that asks uses this."""
    return int(os.environ["RANK"]) if launched_by_torchrun() else 0


def exit_interrupted(signum=None, frame=None) -> None:
    """Ctrl-C outside the training loop (which saves a checkpoint first): one line, on the main process only, and
    exit status 130. Also a SIGINT handler, for the seconds in which train.py imports torch."""
    if process_rank() == 0:
        print(interrupted_line(), file=sys.stderr, flush=True)
    sys.exit(130)
