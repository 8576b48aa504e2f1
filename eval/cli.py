"""The argument parser every command-line program of eval/, sample.py and scripts/ builds."""
import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the module docstring's layout and appends each option's default to its help, unless the help says
    it in words already (options whose default is None explain what happens without them)."""

    def _get_help_string(self, action):
        text = action.help or ""
        stated = "default" in text or action.default is None or action.default is False  # (0 == False, but is not)
        if stated or not action.option_strings or action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)".lstrip()


def make_parser(description: str, **kwargs) -> argparse.ArgumentParser:
    """allow_abbrev=False: argparse would otherwise take --window for --windows, so a misspelled option in a
    study file's [eval.*] table or on the command line would pass silently."""
    return argparse.ArgumentParser(description=description, formatter_class=HelpFormatter, allow_abbrev=False,
                                   **kwargs)


def check_context(parser: argparse.ArgumentParser, args, least: int = 1) -> None:
    """--context, where given, is a usable training length (0 would silently mean the checkpoint's own block_size)."""
    if args.context is not None and args.context < least:
        parser.error(f"--context must be at least {least} token{'s' if least > 1 else ''} (got {args.context}); leave "
                     "it out to use the checkpoint's block_size")


def default_out(parser: argparse.ArgumentParser, args) -> None:
    """--out defaults to RUN_DIR/eval for one --ckpt; with several it must be given (their results go together)."""
    import os
    if args.out is None:
        if len(args.ckpt) > 1:
            parser.error("--out DIR is required when comparing several checkpoints")
        run = args.ckpt[0]
        args.out = os.path.join(run if os.path.isdir(run) else os.path.dirname(run), "eval")


def example_key(parser: argparse.ArgumentParser) -> str:
    """A study file's [eval.NAME] line that this evaluation's parser takes, e.g. "windows = 16": its first option with
    a whole-number default (a study's keys are the options with _ for -), for the hint after a misspelled key."""
    for action in parser._actions:
        if action.option_strings and type(action.default) is int:
            return f"{action.dest} = {action.default}"
    return "the option's name = its value"
