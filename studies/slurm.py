"""A study on a SLURM cluster ([launch] mode = "slurm"): each run's training is one sbatch job of
scripts/slurm/train.sbatch, its evaluations one more job that starts when training succeeded
(--dependency=afterok). study.py submits what has work left and returns; run again (or with --wait) it asks SLURM
what each recorded job is doing, never submits a second job for a run whose job is queued or running, resubmits
what failed up to max_tries, and writes the report once every run has ended. docs/study.md, "On a cluster"."""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from studies.launch import (REPO, damaged_records, diverged_marker, eval_finished, last_error_line, lost_records,
                            read_json, run_trained, train_argv)
from studies.spec import Run, Study, StudyError
from training.metrics import atomic_write_text, duration

JOB_SCRIPT = REPO / "scripts" / "slurm" / "train.sbatch"
RECORDS = "slurm_jobs.json"  # in the study's out_dir: every job the study submitted, per run
# SLURM's job states (squeue %T) in which a job still holds its place: no second job is submitted beside it.
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
          "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
ANSWER_TIMEOUT_S = 60


def run_key(run: Run) -> str:
    """The run's folder below out_dir, ENCODING/seedN: its name in the records, the table and --evaluate."""
    return f"{run.encoding}/seed{run.seed}"


# ----------------------------------------------------------------------------- talking to SLURM

def slurm_command(argv: list[str]) -> subprocess.CompletedProcess:
    """Run a SLURM client command; a missing one or one that hangs is a StudyError (nothing submitted)."""
    if shutil.which(argv[0]) is None:
        raise StudyError(f"{argv[0]} is not on PATH, so no job can be submitted or asked about; run study.py on a "
                         "login node of the cluster (or load its slurm module), or choose another [launch] mode.")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=ANSWER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StudyError(f"{argv[0]} did not answer within {ANSWER_TIMEOUT_S} s (is slurmctld up?); nothing more "
                         "was submitted: run the study again later.") from None


def first_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[-1] if lines else "no message")


def sbatch(argv: list[str], env: dict[str, str]) -> str:
    """sbatch --parsable ARGV; the job id, or a StudyError quoting sbatch's own reason (a partition or account it
    refuses)."""
    command = ["sbatch", "--parsable", *argv]
    if shutil.which("sbatch") is None:
        slurm_command(command)  # raises its sentence
    result = subprocess.run(command, capture_output=True, text=True, env=os.environ | env, timeout=ANSWER_TIMEOUT_S)
    job = result.stdout.strip().split(";")[0]  # "id" or "id;cluster"
    if result.returncode != 0 or not job.isdigit():
        raise StudyError(f"sbatch refused the job ({first_error_line(result.stderr + result.stdout)}); check "
                         "[launch.slurm] partition, account, qos and sbatch_options against `sinfo` and `sacctmgr "
                         "show assoc user=$USER`.")
    return job


def job_states(jobs: list[str]) -> dict[str, tuple[str, str]]:
    """{job id: (state, reason)} for the jobs SLURM still knows of (squeue lists ended jobs for MinJobAge after they
    end, 300 s by default); a job it has forgotten is absent, and judged from its run's files."""
    if not jobs:
        return {}
    states = {}
    for start in range(0, len(jobs), 500):  # (a command line has its limits)
        result = slurm_command(["squeue", "--noheader", "--states=all", f"--jobs={','.join(jobs[start:start + 500])}",
                                "--format=%i|%T|%r"])
        if result.returncode != 0 and "Invalid job id" not in result.stderr:
            raise StudyError(f"squeue failed ({first_error_line(result.stderr)}); nothing was submitted: run the "
                             "study again once SLURM answers.")
        if result.returncode != 0:  # none of them known any more (or, in older SLURMs, one of them): ask each
            states.update({job: state for job in jobs[start:start + 500] if (state := job_state(job))})
        for line in result.stdout.splitlines():
            job, state, reason = (line.split("|") + ["", ""])[:3]
            states[job.strip()] = (state.strip(), reason.strip())
    return states


def job_state(job: str) -> tuple[str, str] | None:
    """(state, reason) of one job from `scontrol show job -o`, None once SLURM has forgotten it."""
    result = slurm_command(["scontrol", "--oneliner", "show", "job", job])
    if result.returncode != 0:
        return None
    fields = dict(item.split("=", 1) for item in result.stdout.split() if "=" in item)
    return fields.get("JobState", "UNKNOWN"), fields.get("Reason", "")


def cancel(job: str) -> None:
    slurm_command(["scancel", job])


# ----------------------------------------------------------------------------- the jobs' command lines

def job_environment(study: Study, run: Run) -> dict[str, str]:
    """What train.sbatch (its header lists these) and the evaluation jobs are told: the Python and the code that
    run this study (unless the setup line is to choose the Python: then its python3), the setup line, the run's
    folder (the job stops with one line when its node cannot see it) and its processes per node. The rendezvous port
    is train.sbatch's own, from the job id: two runs of two studies (or two users) may share a node."""
    settings = study.slurm
    env = {"REPO": str(REPO), "RUN_DIR": run.run_dir, "PROCS_PER_NODE": str(processes_per_node(study))}
    if settings.setup:
        env["JOB_SETUP"] = settings.setup
    else:
        env["PYTHON"] = sys.executable
    return env


def processes_per_node(study: Study) -> int:
    per_node = study.slurm.gpus_per_node
    return 1 if per_node == 0 else min(per_node, study.gpus_per_run)


def sbatch_options(study: Study, run: Run, job: str) -> list[str]:
    """sbatch's options for a run's `job` ("train" or "eval"): the site's settings, the run's nodes and GPUs, its
    name and its log in the run's folder (SLURM_JOB_ID in the name: each try keeps its own)."""
    settings = study.slurm
    nodes = settings.nodes(study.gpus_per_run) if job == "train" else 1
    gpus = processes_per_node(study) if job == "train" else 1
    options = [f"--job-name={study.name}:{run_key(run)}:{job}", f"--nodes={nodes}", "--ntasks-per-node=1",
               f"--output={job_log(run, job, '%j')}"]
    if settings.gpus_per_node:
        options.append(f"--gpus-per-node={gpus}")
    for key in ("partition", "account", "qos", "time"):
        if getattr(settings, key):
            options.append(f"--{key}={getattr(settings, key)}")
    if settings.cpus_per_task:
        options.append(f"--cpus-per-task={settings.cpus_per_task}")
    return options + settings.sbatch_options


def train_job(study: Study, run: Run) -> list[str]:
    """sbatch's arguments for a run's training: train.sbatch with the run's train.py arguments (the study's own
    command for the run, --resume included when it has a checkpoint)."""
    return [*sbatch_options(study, run, "train"), str(JOB_SCRIPT), *train_argv(run)]


def eval_job(study: Study, run: Run, after: str | None) -> list[str]:
    """sbatch's arguments for a run's evaluations: study.py --evaluate on this study and run (the evaluations'
    own main functions in-process, each marked done as the in_process mode marks it), after the training job
    `after` has succeeded."""
    python = sys.executable if not study.slurm.setup else "python3"
    command = shlex.join([python, str(REPO / "study.py"), study.path, "--evaluate", run_key(run)])
    setup = f"{study.slurm.setup} && " if study.slurm.setup else ""
    dependency = [f"--dependency=afterok:{after}", "--kill-on-invalid-dep=no"] if after else []
    return [*sbatch_options(study, run, "eval"), *dependency, f"--wrap={setup}exec {command}"]


# ----------------------------------------------------------------------------- the study's record of its jobs

def records_path(study: Study) -> str:
    return os.path.join(study.out_dir, RECORDS)


def read_records(study: Study) -> dict:
    """{run key: {"train": [job ids, oldest first], "eval": [{"job": id, "after": train job id or None}]}}."""
    records = read_json(records_path(study))
    return records if isinstance(records, dict) else {}


def write_records(study: Study, records: dict) -> None:
    atomic_write_text(records_path(study), json.dumps(records, indent=1) + "\n")


@contextlib.contextmanager
def study_lock(study: Study):
    """One study.py at a time decides and submits for a study: two at once would both see a run without a job."""
    os.makedirs(study.out_dir, exist_ok=True)
    with open(os.path.join(study.out_dir, RECORDS + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def job_log(run: Run, job: str, job_id: str) -> str:
    return os.path.abspath(os.path.join(run.run_dir, f"slurm-{job}-{job_id}.out"))


def job_error(run: Run, job: str, job_id: str, state: str) -> str:
    """Why a job ended without its work done: the last error line of its log, or what SLURM said."""
    log = job_log(run, job, job_id)
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return (f"job {job_id} ended {state} without a log {log}: its node could not write into the run's folder; do "
            "the compute nodes see the study's out_dir at the same path? (docs/study.md, \"On a cluster\")")
    return last_error_line(text) or f"job {job_id} ended {state}; see {log}"


# ----------------------------------------------------------------------------- each run's state, and what to submit

@dataclasses.dataclass
class Row:
    """One run's line of the table, and its status for the report."""
    run: Run
    job: str = "-"                 # the job id that does (or did) the run's work now
    state: str = "not submitted"
    ended: bool = False            # nothing more will happen without a new study.py: done, failed or diverged
    status: str | None = None      # the report's status once ended: done, failed, diverged
    error: str | None = None

    def end(self, status: str, state: str | None = None, error: str | None = None) -> "Row":
        self.ended, self.status, self.state, self.error = True, status, state or status, error
        return self


def eval_tries(entry: dict, last_train: str | None) -> list[dict]:
    """The evaluation jobs that count as tries: those submitted after the run was trained, and the one chained to
    its last training job (one chained to a training job that failed never ran)."""
    return [e for e in entry.get("eval", []) if e.get("after") in (None, last_train)]


class SlurmStudy:
    """Decides, for each run, from its files and its recorded jobs' states, whether to submit something; `advance`
    does it and returns the table's rows."""

    def __init__(self, study: Study):
        self.study, self.settings = study, study.slurm

    def advance(self, submit: bool) -> list[Row]:
        with study_lock(self.study):
            records = read_records(self.study)
            before = json.dumps(records)  # (an entry made below without a job is not written)
            recorded = [job for entry in records.values() for job in entry.get("train", [])] + \
                       [e["job"] for entry in records.values() for e in entry.get("eval", [])]
            # Forgotten jobs are judged from the files; for a fresh study nothing needs asking.
            states = job_states(recorded) if recorded else {}
            rows = []
            for run in self.study.runs:
                entry = records.setdefault(run_key(run), {"train": [], "eval": []})
                try:
                    rows.append(self.advance_run(run, entry, states, submit))
                finally:  # after each run's submissions: a refusal later keeps what was submitted
                    submitted = {key: entry for key, entry in records.items() if entry["train"] or entry["eval"]}
                    if json.dumps(submitted) != before:
                        write_records(self.study, submitted)
            return rows

    def state_of(self, job: str, states: dict, done_by_files: bool) -> tuple[str, str]:
        return states.get(job) or (("COMPLETED" if done_by_files else "FAILED"), "forgotten by SLURM")

    def advance_run(self, run: Run, entry: dict, states: dict, submit: bool) -> Row:
        row = Row(run)
        diverged = read_json(diverged_marker(run))
        if diverged and not run_trained(run):
            return row.end("diverged", error=f"training: {diverged['error']}")
        damaged = damaged_records(run)
        if damaged:
            return row.end("failed", error=f"records: {damaged}")
        trains = entry["train"]
        if not run_trained(run):
            if trains:
                row.job = trains[-1]
                state, reason = self.state_of(trains[-1], states, False)
                if state in ACTIVE:
                    row.state = state.lower() + (f" ({reason})" if state == "PENDING" and reason not in
                                                 ("", "None", "Priority", "Resources") else "")
                    return row
                error = job_error(run, "train", trains[-1], state)
                if error.startswith("training diverged"):
                    atomic_write_text(diverged_marker(run), json.dumps({"error": error}) + "\n")
                    return row.end("diverged", error=f"training: {error}")
                row.error = f"training: {error}"
                if len(trains) >= self.settings.max_tries:
                    if submit:  # its evaluation job would wait in the queue for ever (DependencyNeverSatisfied)
                        self.cancel_waiting_evaluations(entry, states)
                    return row.end("failed", state=f"failed ({len(trains)} tries)", error=row.error)
                row.state = f"{state.lower()}, to resubmit"
            if submit:
                self.cancel_waiting_evaluations(entry, states)
                os.makedirs(run.run_dir, exist_ok=True)  # for the jobs' logs: SLURM does not make their folder
                row.job = sbatch(train_job(self.study, run), job_environment(self.study, run))
                trains.append(row.job)
                if run.evals:
                    entry["eval"].append({"job": sbatch(eval_job(self.study, run, row.job),
                                                        job_environment(self.study, run)), "after": row.job})
                row.state = "submitted" + (f" (try {len(trains)})" if len(trains) > 1 else "")
            return row
        return self.advance_evaluations(run, entry, states, submit, row)

    def advance_evaluations(self, run: Run, entry: dict, states: dict, submit: bool, row: Row) -> Row:
        lost = lost_records(run)
        if lost:
            return row.end("failed", error=f"records: {lost}")
        if entry["train"]:
            row.job = entry["train"][-1]
            state = states.get(row.job, ("",))[0]
            if state in ACTIVE:  # trained, and its job is ending: the run has ended once the job has
                row.state = state.lower()
                return row
        finished = all(eval_finished(run, name) for name in run.evals)
        tries = eval_tries(entry, entry["train"][-1] if entry["train"] else None)
        if tries:
            state, reason = self.state_of(tries[-1]["job"], states, finished)
            if state in ACTIVE:  # (a job that wrote its results is still one until it has ended)
                row.job, row.state = tries[-1]["job"], "evaluations " + state.lower()
                return row
        if finished:
            return row.end("done")
        if tries:
            row.job = tries[-1]["job"]
            row.error = f"evaluations: {job_error(run, 'eval', row.job, state)}"
            if len(tries) >= self.settings.max_tries:
                return row.end("failed", state=f"evaluations failed ({len(tries)} tries)", error=row.error)
            row.state = f"evaluations {state.lower()}, to resubmit"
        if submit:
            row.job = sbatch(eval_job(self.study, run, None), job_environment(self.study, run))
            entry["eval"].append({"job": row.job, "after": None})
            row.state = "evaluations submitted"
        return row

    def cancel_waiting_evaluations(self, entry: dict, states: dict) -> None:
        """An evaluation job still waiting for a training job that failed would wait for ever: it is cancelled
        (the study submitted it) before the training is resubmitted with a new one, or once the run has failed."""
        for e in entry["eval"]:
            if states.get(e["job"], ("",))[0] in ACTIVE:
                cancel(e["job"])


# ----------------------------------------------------------------------------- the table

def last_training_record(run_dir: str, tail_bytes: int = 16384) -> dict | None:
    """The last "train" record of RUN_DIR/metrics.jsonl, read from the file's end only: a run of 25,000 iterations
    has thousands of lines, and the table is drawn for every run on every call."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as f:
            start = max(0, f.seek(0, os.SEEK_END) - tail_bytes)
            f.seek(start)
            lines = f.read().split(b"\n")
    except OSError:
        return None
    for line in reversed(lines[1:] if start else lines):  # the first is cut where the read starts inside the file
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("type") == "train":
                return record
    return None


def table(rows: list[Row]) -> str:
    """run, job id, state, iteration / max_iters, last training loss, ETA (train.py's own estimate, while the run
    trains), then each failed run's last error line."""
    lines = [("run", "job", "state", "iter", "loss", "ETA")]
    for row in rows:
        record = last_training_record(row.run.run_dir) or {}
        iteration = record.get("iter", 0)
        running = row.state.startswith("running") and iteration < row.run.final_iter and "eta_s" in record
        loss = record.get("loss")
        lines.append((run_key(row.run), row.job, row.state, f"{iteration}/{row.run.final_iter}",
                      f"{loss:.4f}" if isinstance(loss, (int, float)) else "-",
                      duration(record["eta_s"]) if running else "-"))
    widths = [max(len(line[i]) for line in lines) for i in range(6)]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]
    text += [f"  {run_key(row.run)}: {row.error}" for row in rows if row.error]
    return "\n".join(text)


def summary_line(rows: list[Row]) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        word = row.status if row.ended else row.state.split(" (")[0].split(",")[0]
        counts[word] = counts.get(word, 0) + 1
    return ", ".join(f"{n} {word}" for word, n in sorted(counts.items()))
