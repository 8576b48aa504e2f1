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


def exit_interrupted(signum=None, frame=None) -> None:
    """Ctrl-C outside the training loop (which saves a checkpoint first): one line, on the main process only, and
    exit status 130. Also a SIGINT handler, for the seconds in which train.py imports torch."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(interrupted_line(), file=sys.stderr, flush=True)
    sys.exit(130)
