"""Where a program's results go: checked before the work that computes them, so that hours of evaluation never end
in a traceback that loses the scores; and the sentence for a write that still fails at the end (a full disk).

Light on purpose (no torch): scripts/plot_runs.py checks its --out with it too, eval/long_context.py its --out and
--plot.
"""
import contextlib
import os
import tempfile

from config import UserError


def check_writable(directory: str, what: str, option: str = "--out", folder: str | None = None) -> None:
    """UserError unless `directory` can be made (where missing) and written. A probe file is made and removed in it,
    or, while it is still to be made, in its nearest existing parent: the folder itself is made only when the results
    are written, so a command refused later (a mistyped --ckpt) leaves no empty folder behind. os.access would not
    do: it says yes to root on an immutable folder. `folder` names the folder where a file is in the way (default:
    "the folder for `what`")."""
    existing = os.path.abspath(directory)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        from checkpoints import not_a_folder  # (imports torch: only on this path)
        raise UserError(not_a_folder(directory, folder or f"the folder for {what}", option))
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write_probe_"):
            pass
    except OSError as error:
        reason = error.strerror or error
        if existing != os.path.abspath(directory):
            raise UserError(f"cannot make the folder {directory} for {what} ({reason} in {existing}); choose a "
                            f"writable {option} (or make {existing} writable)") from None
        raise UserError(f"cannot write {what} to {directory} ({reason}); choose a writable {option} (or make that "
                        "directory writable)") from None


def unwritten(what: str, directory: str, error: OSError, option: str = "--out") -> str:
    """The sentence for results that could not be written after all (checked writable before the work: the disk
    filled, or the folder changed since); the caller prints the results first, so that they are not lost."""
    return (f"cannot write {what} to {directory} ({error.strerror or error}), so they are printed above instead; "
            f"free space or choose another {option}, then run again")


def write_atomic(path: str, text: str) -> None:
    """`text` into `path` through `path`.tmp and a rename, so that a reader never sees half a report; a write that
    fails (a full disk) leaves no .tmp behind and raises."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def save_figure(fig, path: str, dpi: int = 120) -> None:
    """A matplotlib figure into `path` through `path`.tmp.png and a rename (a reader never sees half a picture),
    closed either way (pyplot keeps every open figure); a save that fails leaves no .tmp.png behind and raises."""
    import matplotlib.pyplot as plt

    tmp = f"{path}.tmp.png"
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    finally:
        plt.close(fig)


def evaluate_and_write(args, evaluate, report_of, name: str, pictures, check=None) -> list:
    """The body of an evaluation command: its --out checked before any work (whose results would be lost after it),
    with several --ckpt check(run) for each of them before any is evaluated (a later checkpoint that cannot be used
    would otherwise throw away the earlier ones' finished results), evaluate(run) for every --ckpt (a UserError or
    DataError is one sentence and exit status 2), then --out/name.json, name.md (the report) and the pictures:
    pictures(results) lists (file name, draw) pairs, draw(path) writing one. A write that fails after all prints the
    report and the results' JSON and says so (exit status 2)."""
    import json
    import sys

    from data.shards import DataError
    try:
        check_writable(args.out, "the results", folder="the results folder")
        for run in args.ckpt if check and len(args.ckpt) > 1 else []:  # (one is checked by its own evaluation)
            check(run)
        results = [evaluate(run) for run in args.ckpt]
    except (UserError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    report = report_of(results)
    files = [f"{name}.json", f"{name}.md"]
    try:
        os.makedirs(args.out, exist_ok=True)
        write_atomic(os.path.join(args.out, files[0]), json.dumps(results, indent=2) + "\n")
        write_atomic(os.path.join(args.out, files[1]), report)
        for picture, draw in pictures(results):
            draw(os.path.join(args.out, picture))
            files.append(picture)
    except OSError as error:  # (checked writable before): the disk filled; the JSON holds every number computed
        print(report)
        print(json.dumps(results, indent=2))
        print(f"error: {unwritten('the results', args.out, error)}", file=sys.stderr)
        sys.exit(2)
    print(report)
    print(f"wrote {args.out}/{', '.join(files[:-1])} and {files[-1]}")
    return results
