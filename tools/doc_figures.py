"""The figures README.md and docs/setup.md give that the code measures, written from where they are measured, so
that the docs cannot drift from the code:

    python3 tools/doc_figures.py tests                        # the suite's test count, by collecting it
    python3 tools/doc_figures.py quickstart runs/quickstart   # the quickstart's validation losses and peak
                                                                # memory, from a finished run of the README's
                                                                # `python3 train.py configs/quickstart.toml`
    python3 tools/doc_figures.py suite                        # runs the README's test command and writes how
                                                                # long it took and what it printed last

Each figure sits between <!-- figure:NAME --> and <!-- /figure --> in the docs, and this script rewrites what is
between them (every file that holds the marker); markers that do not pair up (a begin without its end, an end
without a begin) are refused with the doc and line, before any doc is written. tests/test_setup_commands.py collects the suite and checks the
written test count, and checks that every copy of a figure is the same text.
"""
import contextlib
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", os.path.join("docs", "setup.md"))
QUICKSTART = os.path.join("configs", "quickstart.toml")
WIDTH = 120  # the longest line the docs' prose has


class FigureError(Exception):
    """A figure that cannot be written honestly; the message says why and what to do."""


def marker(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- figure:{re.escape(name)} -->)(.*?)(<!-- /figure -->)", re.S)


ANY_MARKER = re.compile(r"<!-- figure:([^ ]*) -->|<!-- /figure -->")


def read_doc(doc: str, repo: str = REPO) -> str:
    """The text of `doc`, refused with its line where its figure markers do not pair up: a begin marker whose end
    marker is missing would make the figure run on to the next figure's end (the prose between replaced), or, with
    no end after it, leave the figure unwritten without a word."""
    with open(os.path.join(repo, doc), encoding="utf-8") as f:
        text = f.read()
    open_figure = None  # (name, line) of the begin marker not yet closed
    for found in ANY_MARKER.finditer(text):
        line = text.count("\n", 0, found.start()) + 1
        if found.group(1) is None and open_figure is None:
            raise FigureError(f"{doc} line {line}: <!-- /figure --> ends no figure (no <!-- figure:NAME --> before "
                              "it); remove it or add the figure's begin marker")
        if found.group(1) is not None and open_figure is not None:
            raise FigureError(f"{doc} line {open_figure[1]}: figure {open_figure[0]!r} has no <!-- /figure --> before "
                              f"the next figure's marker on line {line}; add it where the figure ends")
        open_figure = (found.group(1), line) if found.group(1) is not None else None
    if open_figure is not None:
        raise FigureError(f"{doc} line {open_figure[1]}: figure {open_figure[0]!r} has no <!-- /figure --> after it; "
                          "add it where the figure ends")
    return text


def written(name: str, repo: str = REPO) -> dict[str, str]:
    """{doc path: the text of figure `name` in it, its line breaks read as spaces} for every doc that holds it."""
    found = {}
    for doc in DOCS:
        for match in marker(name).finditer(read_doc(doc, repo)):
            found[doc] = " ".join(match.group(2).split())
    return found


def fitted(text: str, before: str, after: str) -> str:
    """`text` broken at spaces so that no line is longer than WIDTH, the first one after `before` (what precedes
    it on its line) and the last one followed by `after` (what follows it on its line); Markdown reads the breaks
    as spaces."""
    lines, line, room = [], "", WIDTH - len(before)
    for word in text.split():
        if line and len(line) + 1 + len(word) > room:
            lines.append(line)
            line, room = word, WIDTH
        else:
            line = f"{line} {word}" if line else word
    if len(line) + len(after) > room and " " in line:  # the last line's last word goes on, with what follows it
        line, last = line.rsplit(" ", 1)
        lines, line = lines + [line], last
    return "\n".join(lines + [line])


def write(name: str, text: str, repo: str = REPO) -> list[str]:
    """Put `text` as figure `name` in every doc that holds its marker, broken into lines of at most WIDTH
    characters; the docs changed. All or nothing: each doc is written to a temporary file beside it first and
    renamed over it only when every one is written, and a rename that fails puts back the docs renamed before it,
    so that a full disk or a file that cannot be replaced leaves every doc as it was (and its copies equal)."""
    updates = {}
    for doc in DOCS:
        path = os.path.join(repo, doc)
        before = read_doc(doc, repo)

        def replaced(m):
            line_start = before.rfind("\n", 0, m.start()) + 1
            line_end = before.find("\n", m.end())
            return m.group(1) + fitted(text, before[line_start:m.start(2)],
                                       m.group(3) + before[m.end():line_end if line_end >= 0 else None]) + m.group(3)
        after = marker(name).sub(replaced, before)
        if after != before:
            updates[doc] = (path, before, after)
    if not written(name, repo):
        raise FigureError(f"no doc holds the marker <!-- figure:{name} -->; put it in one of {', '.join(DOCS)}")
    staged = []
    try:
        for doc, (path, _, after) in updates.items():
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                staged.append(path + ".tmp")
                f.write(after)
        done = []
        for doc, (path, before, _) in updates.items():
            try:
                os.replace(path + ".tmp", path)
            except OSError:
                for earlier in done:  # (replaced moments ago, so they can be replaced again)
                    with open(updates[earlier][0] + ".tmp", "w", encoding="utf-8") as f:
                        f.write(updates[earlier][1])
                    os.replace(updates[earlier][0] + ".tmp", updates[earlier][0])
                raise
            done.append(doc)
    except OSError as error:
        for tmp in staged:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        where = error.filename or repo
        raise FigureError(f"cannot write figure {name!r} ({error.strerror or error}: {where}), so no doc was "
                          f"changed; free space or make {', '.join(updates)} writable, then run again") from None
    return list(updates)


def collected_tests(repo: str = REPO) -> int:
    """The number of tests in tests/, as pytest collects them (each parameter set counts)."""
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "tests"], cwd=repo, capture_output=True, text=True)
    last = (result.stdout.strip().splitlines() or [""])[-1]
    match = re.fullmatch(r"(\d+) tests? collected in .*", last)
    if result.returncode != 0 or not match:  # (collection errors end with "N errors" and a non-zero status)
        raise FigureError(f"collecting the suite failed (exit status {result.returncode}): {last!r}")
    return int(match.group(1))


def readme_test_command(repo: str = REPO) -> str:
    """The README's second set-up command, the one that runs the tests (tests/test_setup_commands.py checks that
    .ci/run runs it)."""
    with open(os.path.join(repo, "README.md"), encoding="utf-8") as f:
        block = re.search(r"## Set up\n\n```bash\n(.*?)```", f.read(), re.S)
    commands = [line for line in (block.group(1) if block else "").splitlines() if line and not line.startswith("#")]
    if len(commands) != 2:
        raise FigureError("README.md's '## Set up' block does not hold its two commands; restore it")
    return commands[1]


def code_version(repo: str = REPO) -> str:
    """The commit the working tree is at, with -dirty when it has changes ('' without git)."""
    return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=40"], cwd=repo, capture_output=True,
                          text=True).stdout.strip()


def suite_figure(repo: str = REPO, run=subprocess.run, clock=None, version=None) -> str:
    """Runs the README's test command in `repo` and says what it took: "1,600 passed in 9 min 12 s (2 cores, commit
    abc1234)". Refused when a test failed, or from uncommitted code, since the docs claim the suite's own time."""
    import time
    clock = clock or time.monotonic
    version = code_version(repo) if version is None else version
    if not version or version.endswith("-dirty"):
        raise FigureError(f"the working tree is not a clean commit ({version or 'no git'}); commit, then run again")
    start = clock()
    result = run(readme_test_command(repo), shell=True, cwd=repo, capture_output=True, text=True)
    seconds = clock() - start
    last = (result.stdout.strip().splitlines() or [""])[-1]
    passed = re.search(r"(\d+) passed", last)
    if result.returncode != 0 or not passed or re.search(r"\d+ (failed|error)", last):
        raise FigureError(f"the test command did not pass (exit status {result.returncode}): {last.strip('= ')!r}; "
                          "fix the failures, then run again")
    minutes, rest = divmod(round(seconds), 60)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{int(passed.group(1)):,} passed in {minutes} min {rest} s ({cores} cores, commit {version[:7]})")


def tests_figure(repo: str = REPO) -> str:
    return f"{collected_tests(repo):,}"


# The fields of metrics.jsonl's records that the quickstart figure reads, with their kinds.
FIGURE_FIELDS = {"val": {"iter": int, "val_loss": (int, float)},
                 "summary": {"peak_memory_gb": (int, float), "memory_kind": str}}


def run_files(run_dir: str) -> tuple[dict, list[dict]]:
    """(config.json, the records of metrics.jsonl) of a run directory; a FigureError names the file (and line) that
    is not as train.py writes it."""
    again = f"train the quickstart again (python3 train.py {QUICKSTART})"
    try:
        with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError) as error:  # (ValueError: not JSON, or not UTF-8)
        raise FigureError(f"{run_dir} is not a readable run directory ({error}); run python3 train.py "
                          f"{QUICKSTART} first") from None
    if not isinstance(config, dict):
        raise FigureError(f"{os.path.join(run_dir, 'config.json')} holds a JSON {type(config).__name__}, not the "
                          f"run's settings that train.py writes; {again}")
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:
            record = "damaged"
        fields = FIGURE_FIELDS.get(record.get("type"), {}) if isinstance(record, dict) else {}
        if line.strip() and (not isinstance(record, dict) or any(
                not isinstance(record.get(key), kind) or isinstance(record.get(key), bool)
                for key, kind in fields.items())):
            raise FigureError(f"{os.path.join(run_dir, 'metrics.jsonl')} line {number} is not a record as train.py "
                              f"writes it ({line[:60]!r}); {again}")
        if record is not None:
            records.append(record)
    return config, records


def quickstart_figure(run_dir: str) -> str:
    """The validation losses and the peak memory of a finished, unresumed run of the quickstart as the README gives
    it (no override but --out_dir), from committed code; refused otherwise, since the docs claim those."""
    config, records = run_files(run_dir)
    extra = [o for o in config.get("overrides", []) if not o.startswith("--out_dir=")]
    if not config.get("config_file", "").endswith(QUICKSTART) or extra:
        raise FigureError(f"{run_dir} is not a run of `python3 train.py {QUICKSTART}` as the README gives it "
                          f"(config {config.get('config_file')!r}, overrides {extra})")
    if config.get("resumes"):
        raise FigureError(f"{run_dir} was resumed: its peak memory is that of the last start only; train it in one go")
    if str(config.get("code_version", "unknown")).endswith(("-dirty", "unknown")):
        raise FigureError(f"{run_dir} was trained from uncommitted or unknown code ({config.get('code_version')}); "
                          "commit, then train again")
    summary = [r for r in records if r.get("type") == "summary"]
    if not summary or summary[-1].get("stopped") != "done":
        raise FigureError(f"{run_dir} has not finished (no summary record that says done); if it is still "
                          "training, run this again when it is done, else train it again in one go (python3 train.py "
                          f"{QUICKSTART} --out_dir={run_dir} --start_over): a resumed run's peak memory would be its "
                          "last start's only")
    losses = [(r["iter"], r["val_loss"]) for r in records if r.get("type") == "val"]
    if not losses or losses[0][0] != 0:
        raise FigureError(f"{run_dir} has no validation at step 0; train the quickstart again as the README gives "
                          f"it (python3 train.py {QUICKSTART})")
    steps = [f"{loss:.2f}" if i == 0 else f"{loss:.2f} (step {step})" if i == 1 else f"{loss:.2f} ({step})"
             for i, (step, loss) in enumerate(losses)]
    memory = summary[-1]
    return (f"validation loss {' → '.join(steps)}; peak memory {memory['peak_memory_gb']:.2f} GiB "
            f"({memory['memory_kind']}, the run's last line); commit {config['code_version'][:7]}")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("tests", "quickstart", "suite") or len(argv) > 2 \
            or argv[0] in ("tests", "suite") and len(argv) > 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        name = argv[0]
        text = tests_figure() if name == "tests" else suite_figure() if name == "suite" else \
            quickstart_figure(argv[1] if len(argv) > 1 else os.path.join(REPO, "runs", "quickstart"))
        changed = write(name, text)
    except FigureError as error:
        print(f"error: {error}.", file=sys.stderr)
        return 1
    print(f"{name}: {text}" + (f" (written to {', '.join(changed)})" if changed else " (the docs had it already)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
