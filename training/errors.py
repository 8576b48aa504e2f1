"""The one exception training raises for the user to act on."""


class TrainError(Exception):
    """A problem the user must act on (bad checkpoint, diverged run, ...); the message says what to do."""
