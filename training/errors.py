"""The one exception training raises for the user to act on, and the line a Ctrl-C ends with."""
import os
import sys

# Set by scripts/study.py to its own command line while it runs: inside a study a run is continued by running the
# study again (it resumes what is unfinished), not by train.py --resume by hand.
STUDY_COMMAND_VARIABLE = "GRAPE_STUDY_COMMAND"


def continue_advice() -> str:
    """How to continue a stopped run: `continue with --resume`, or inside a study, `run the study again`."""
    study_command = os.environ.get(STUDY_COMMAND_VARIABLE)
    return (f"continue by running the study again ({study_command})" if study_command
            else "continue with --resume")


INTERRUPTED = "interrupted: the last checkpoint written (if any) is intact; continue with --resume."


class TrainError(Exception):
    """A problem the user must act on (bad checkpoint, diverged run, ...); the message says what to do."""


class LostProcess(TrainError):
    """Another process died or froze: every process says so (the main one may be the one that died), and none closes
    the process group (that would wait on the dead process)."""


def exit_interrupted(signum=None, frame=None) -> None:
    """Ctrl-C outside the training loop (which saves a checkpoint first): one line, on the main process only, and
    exit status 130. Also a SIGINT handler, for the seconds in which train.py imports torch."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(INTERRUPTED.replace("continue with --resume", continue_advice()), file=sys.stderr, flush=True)
    sys.exit(130)
