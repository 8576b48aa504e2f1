"""Run a whole positional-encoding study (encodings x seeds, then the same evaluations for each) and write its report.

    python study.py configs/studies/smoke.toml           # CPU, offline, tiny settings
    python study.py configs/studies/table1_medium.toml   # the paper's Table 1 rows, torchrun on 8 GPUs

Each run trains with train.py into OUT/<encoding>/seed<seed>, then its evaluations write
OUT/<encoding>/seed<seed>/eval/. OUT/report.md, report.json and the plots are built only from those files.
Run the same command again to continue: finished runs and evaluations are skipped, an interrupted run resumes
from its checkpoint, an evaluation of a checkpoint that has since been replaced is redone, and a failed run
(or one whose records are lost) is reported while the others go on. The console shows each job, its time, and
the study's progress with an ETA. docs/study.md has the details.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from training.errors import STUDY_COMMAND
from eval.cli import make_parser
from studies.launch import Runner, run_trained
from studies.slurm import SlurmStudy, run_key, summary_line, table
from studies.report import REPORT_BEGIN, REPORT_END, check_publish_target, publish, write_report
from studies.spec import STUDY_FILE_EXAMPLE, StudyError, StudyInterrupted, load_study

REPO = Path(__file__).resolve().parent


def rerun_command(script: Path, args: list[str]) -> str:
    """The command line that runs `script` with `args` again, from the directory it runs in (a study's out_dir may be
    relative to it): the script's path relative to it when below it, else absolute."""
    shown = os.path.relpath(script) if script.is_relative_to(Path.cwd().resolve()) else str(script)
    return shlex.join(["python", shown, *args])


@contextlib.contextmanager
def advice_names(command: str):
    """While the study runs, train.py's advice after a stop names `command`: a study's run is continued by rerunning
    the study, not by train.py --resume. Set in the environment, so its subprocesses (and torchrun's) see it too."""
    previous = os.environ.get(STUDY_COMMAND)
    os.environ[STUDY_COMMAND] = command
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(STUDY_COMMAND, None)
        else:
            os.environ[STUDY_COMMAND] = previous


def run_study(path: str, publish_to: str | None = None, command: str | None = None, status_only: bool = False,
              wait: bool = False) -> dict | None:
    """`command`: what reruns it, for train.py's advice after a stop (default: study.py with these
    arguments). Under mode = "slurm" the report once every run has ended, else None (the jobs go on)."""
    study = load_study(path)
    if publish_to:
        check_publish_target(publish_to)
    rerun = [path] + (["--publish", publish_to] if publish_to else [])
    if study.mode == "slurm":
        with advice_names(command or rerun_command(REPO / "study.py", rerun)):  # the jobs inherit it
            return slurm_study(study, status_only, wait, publish_to)
    if status_only or wait:
        raise StudyError(f"--status and --wait are for a study on a cluster; {path} has [launch] mode = "
                         f"\"{study.mode}\", which runs its jobs here, now.")
    seeds = f"seeds {study.seeds}" + (" (the default; set seeds = [...] for a seed spread)"
                                      if study.seeds_defaulted else "")
    print(f"[study] {study.name}: {len(study.encodings)} encodings x {len(study.seeds)} seeds = "
          f"{len(study.runs)} runs, {seeds}, launch {study.mode}, output {study.out_dir}", flush=True)
    runner = Runner(study)
    try:
        with advice_names(command or rerun_command(REPO / "study.py", rerun)):
            runner.run_all()
    except (StudyInterrupted, KeyboardInterrupt):
        # What finished is reported (a time-limited study, gpu_study.sh, ends this way); the rest continues later.
        report = write_report(study, runner.status)
        print(f"[study] wrote {os.path.join(study.out_dir, 'report.md')} with the runs finished so far", flush=True)
        if publish_to:
            publish(study, report, publish_to)
        raise
    return finish(study, runner.status, publish_to)


def finish(study, statuses: dict, publish_to: str | None) -> dict:
    """Write the report (and publish it); the report."""
    report = write_report(study, statuses)
    failed = sum(r["status"] == "failed" for r in report["runs"])
    diverged = sum(r["status"] == "diverged" for r in report["runs"])
    trouble = [f"{n} run(s) {word}" for n, word in ((failed, "failed"), (diverged, "diverged")) if n]
    print(f"[study] wrote {os.path.join(study.out_dir, 'report.md')} and report.json"
          + (f"; {' and '.join(trouble)}, see the report's last section" if trouble else ""), flush=True)
    if publish_to:
        publish(study, report, publish_to)
    return report


def slurm_study(study, status_only: bool, wait: bool, publish_to: str | None) -> dict | None:
    """Submit what has work left (not with --status), print the table, and write the report once every run has
    ended; with --wait, again every poll_s seconds until then."""
    jobs = SlurmStudy(study)
    while True:
        rows = jobs.advance(submit=not status_only)
        print(table(rows), flush=True)
        if all(row.ended for row in rows):
            return finish(study, {(row.run.encoding, row.run.seed): {"status": row.status,
                                                                      "errors": [row.error] if row.error else []}
                                  for row in rows}, publish_to)
        if not wait:
            what = "its state" if status_only else "the jobs' state, to resubmit what failed"
            print(f"[study] {summary_line(rows)}; run the same command for {what} (--status: the table alone, "
                  "--wait: until every job has ended, then the report)", flush=True)
            return None
        print(f"[study] {summary_line(rows)}; asking SLURM again in {study.slurm.poll_s:g} s",
              flush=True)
        time.sleep(study.slurm.poll_s)


def evaluate_run(path: str, key: str) -> int:
    """The evaluations of one trained run of the study, in this process, each marked done as the in_process mode
    marks it: what a study's evaluation job on a cluster runs. The exit status: 0, 1 (an evaluation failed) or 2."""
    study = load_study(path)
    run = next((run for run in study.runs if run_key(run) == key), None)
    if run is None:
        raise StudyError(f"--evaluate {key}: the study has no such run; its runs are "
                         f"{', '.join(run_key(run) for run in study.runs[:4])}, ...")
    if not os.path.isdir(run.run_dir):
        raise StudyError(f"run directory {os.path.abspath(run.run_dir)} does not exist on {socket.gethostname()}: "
                         "the compute nodes must see the study's out_dir at the same path as the node that ran "
                         "study.py (a shared filesystem); docs/study.md, \"On a cluster\".")
    if not run_trained(run):
        raise StudyError(f"run {key} is not trained to iteration {run.final_iter} in {run.run_dir}, so there is "
                         "nothing to evaluate yet; run the study again to train it.")
    runner = Runner(dataclasses.replace(study, mode="in_process"))
    runner.process(run)
    status = runner.status[(run.encoding, run.seed)]
    for error in status["errors"]:
        print(f"error: {error}", file=sys.stderr, flush=True)
    return 0 if status["status"] == "done" else 1


def build_parser():
    parser = make_parser(__doc__, epilog="The study file (TOML), every key with its default:\n\n"
                         + STUDY_FILE_EXAMPLE)
    parser.add_argument("study", help="the study file, e.g. configs/studies/smoke.toml")
    parser.add_argument("--publish", metavar="FILE.md",
                        help="also write the report into FILE.md between the lines "
                             f"'{REPORT_BEGIN}' and '{REPORT_END}' (the rest of the file is kept; a missing file is "
                             "made), its plots beside it as FILE_<plot>.png (docs/results_cpu.md is made this way)")
    parser.add_argument("--status", action="store_true",
                        help='mode = "slurm": print each run\'s job, state, iteration, loss and ETA; submit nothing')
    parser.add_argument("--wait", action="store_true",
                        help='mode = "slurm": submit, then ask SLURM every [launch.slurm] poll_s seconds until '
                             "every job has ended, and write the report")
    parser.add_argument("--evaluate", metavar="ENCODING/seedN", help=argparse.SUPPRESS)  # a study's evaluation job
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    try:
        if args.evaluate:
            sys.exit(evaluate_run(args.study, args.evaluate))
        report = run_study(args.study, args.publish, status_only=args.status, wait=args.wait)
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (StudyInterrupted, KeyboardInterrupt):
        print("stopped: finished runs and evaluations are kept and an interrupted run has its last checkpoint; "
              "run the same command again to continue.", file=sys.stderr, flush=True)
        sys.exit(130)
    if report is not None and any(r["status"] == "failed" for r in report["runs"]):
        sys.exit(1)
    return report


if __name__ == "__main__":
    main()
