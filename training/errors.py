"""The one exception training raises for the user to act on, and the line a Ctrl-C ends with."""
import os
import sys

# scripts/study.py sets this to its own command line for the runs it starts, in its process and in subprocesses: a
# study's run is continued by rerunning the study (which adds --resume itself, with the study's settings), so the
# advice to continue with train.py --resume would send its user past the study.
STUDY_COMMAND = "GRAPE_STUDY_COMMAND"


def study_command() -> str | None:
    """The command line of the study this run belongs to, or None when train.py runs on its own."""
    return os.environ.get(STUDY_COMMAND) or None


def how_to_continue(alone: str = "continue with --resume") -> str:
    """The advice after a stop that left a checkpoint: `alone` for train.py on its own, or to rerun the study."""
    command = study_command()
    return f"rerun the study command ({command}) to continue" if command else alone


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
