"""Running a study's jobs: which runs and evaluations are done (from the files they wrote), the command of each
job (in this process, under torchrun, one per GPU or as CPU jobs), and the runner that goes through them with
progress, an ETA and a clean stop on Ctrl-C or SIGTERM."""
from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import train
from checkpoints import latest_complete_shards
from training.metrics import atomic_write_text
from config import ConfigError
from data.shards import DataError
from eval import progress as timing
from studies.spec import Run, Study, StudyInterrupted, evaluation

REPO = Path(__file__).resolve().parents[1]


def read_json(path: str, kind: type | None = None):
    """The JSON in `path`, or None where it is missing, unreadable, not JSON or not UTF-8, or (given `kind`) not of
    that kind (a run's config.json that is not an object): a damaged file is reported as absent, not a traceback."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
        return None
    return value if kind is None or isinstance(value, kind) else None


_parsed_metrics: dict[str, tuple[tuple, list[dict], list[int]]] = {}  # path -> (its stat, records, damaged lines)


def read_metrics(run_dir: str) -> tuple[list[dict], list[int]]:
    """(the records of RUN_DIR/metrics.jsonl, the numbers of its lines that are not a record: binary garbage, or a
    line cut short inside the file). A last line cut short without its newline is a kill's unfinished write, which
    train.py's resume removes: it is skipped, not counted as damage. A file unchanged since the last read (its size,
    modification time and inode) is not parsed again: a study on a cluster looks at 39 runs of thousands of lines
    several times per call."""
    path = os.path.join(run_dir, "metrics.jsonl")
    try:
        with open(path, "rb") as f:
            stat = os.fstat(f.fileno())
            identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if path in _parsed_metrics and _parsed_metrics[path][0] == identity:
                return list(_parsed_metrics[path][1]), list(_parsed_metrics[path][2])
            pieces = f.read().split(b"\n")
    except OSError:  # none yet (or unreadable: then nothing is on record either)
        return [], []
    lines = [piece + b"\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    records, damaged = [], []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif number < len(lines) or line.endswith(b"\n"):
            damaged.append(number)
    _parsed_metrics[path] = (identity, records, damaged)
    return list(records), list(damaged)


def read_records(run_dir: str) -> list[dict]:
    return read_metrics(run_dir)[0]


def damaged_records(run: Run) -> str | None:
    """Why the run's metrics.jsonl has lost records (lines that are not records), or None. Neither resuming nor
    reporting can bring them back, so the run is a failure until the file is restored or the lines deleted."""
    damaged = read_metrics(run.run_dir)[1]
    if not damaged:
        return None
    metrics, one = os.path.join(run.run_dir, "metrics.jsonl"), len(damaged) == 1
    listed = ", ".join(map(str, damaged[:5])) + (f" and {len(damaged) - 5} more" if len(damaged) > 5 else "")
    return (f"{metrics} {'line' if one else 'lines'} {listed} {'is not a record' if one else 'are not records'} "
            f"(binary garbage or a line cut short), so {'its record is' if one else 'their records are'} lost; "
            f"restore {metrics} from a backup, or delete {'that line' if one else 'those lines'} to go on without "
            f"{'it' if one else 'them'}, then run the study again")


def run_trained(run: Run) -> bool:
    """train.py wrote its end-of-run summary at the final iteration (a resumed run drops older summaries) and the
    checkpoint: nothing is left to train."""
    summaries = [r for r in read_records(run.run_dir) if r.get("type") == "summary"]
    return (os.path.isfile(os.path.join(run.run_dir, "ckpt.pt")) and bool(summaries)
            and summaries[-1].get("stopped") == "done" and summaries[-1].get("iter") == run.final_iter)


def final_val_loss(run: Run) -> float | None:
    """The validation loss train.py logged at the final iteration, None if metrics.jsonl lacks it."""
    vals = [r for r in read_records(run.run_dir) if r.get("type") == "val" and r.get("iter") == run.final_iter]
    return vals[-1]["val_loss"] if vals else None


def run_finished(run: Run) -> bool:
    """Trained, with its final validation loss on record and no record lost: only such runs enter the report's
    tables, all of them."""
    return run_trained(run) and final_val_loss(run) is not None and damaged_records(run) is None


def lost_records(run: Run) -> str | None:
    """Why a trained run cannot be reported (its metrics.jsonl deleted or cut), or None. Resuming cannot repair it:
    train.py finds its checkpoint at the final iteration and has nothing to do."""
    if not run_trained(run) or final_val_loss(run) is not None:
        return None
    metrics = os.path.join(run.run_dir, "metrics.jsonl")
    return (f"{run.run_dir}/ckpt.pt is at the final iteration {run.final_iter} but {metrics} has no validation loss "
            f"at that iteration (the file was deleted or cut short), so the run's final loss is unknown and resuming "
            f"cannot log it again; restore {metrics}, or move {run.run_dir} aside and run the study again to train "
            "the run anew")


def checkpoint_identity(run: Run) -> dict | None:
    """What tells the checkpoint an evaluation read from a retrained one, without reading it: its size and
    modification time (rewriting ckpt.pt changes them; a copy that keeps times, cp -p or shutil.copy2, does not)."""
    try:
        stat = os.stat(os.path.join(run.run_dir, "ckpt.pt"))
    except OSError:
        return None
    return {"step": run.final_iter, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def eval_marker(run: Run, name: str) -> str:
    return os.path.join(run.run_dir, "eval", f"{name}.study.json")


def diverged_marker(run: Run) -> str:
    """Written when the run's training diverged: later invocations report it instead of diverging again."""
    return os.path.join(run.run_dir, "study_diverged.json")


def portable(argv: list[str], run: Run) -> list[str]:
    """An evaluation's arguments with the run directory (wherever the study lies: ENCODING/seedN at the end of its
    path) written as {run}: a copy of a finished study in another place (cp -a) holds the same evaluations."""
    tail = os.path.join(run.encoding, f"seed{run.seed}")
    out = []
    for arg in argv:
        normal = os.path.normpath(arg) if isinstance(arg, str) else arg
        if isinstance(normal, str) and (normal == tail or normal.endswith(os.sep + tail)
                                        or f"{os.sep}{tail}{os.sep}" in normal or normal.startswith(tail + os.sep)):
            at = normal.rfind(tail)
            normal = "{run}" + normal[at + len(tail):]
            out.append(normal)
        else:
            out.append(arg)
    return out


def eval_finished(run: Run, name: str) -> bool:
    """Its output exists and the marker written after it says: same arguments, same checkpoint file."""
    output = os.path.join(run.run_dir, "eval", f"{name}.json")
    try:
        marker = json.loads(Path(eval_marker(run, name)).read_text())
        json.loads(Path(output).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    identity = checkpoint_identity(run)
    if identity is None:
        return False
    if isinstance(marker, dict) and isinstance(marker.get("argv"), list):
        marker = {**marker, "argv": portable(marker["argv"], run)}
    argv = portable(run.evals[name], run)
    if marker == {"argv": argv, "step": run.final_iter}:
        # Written by an older study.py, which recorded no checkpoint: it holds if the checkpoint is older than the
        # marker, so upgrading does not redo finished evaluations (hours on the GPU) while a retrained one is redone.
        return identity["mtime_ns"] < os.stat(eval_marker(run, name)).st_mtime_ns
    return marker == {"argv": argv, "checkpoint": identity}


def run_done(run: Run) -> bool:
    return run_finished(run) and all(eval_finished(run, name) for name in run.evals)


def add_wall_clock(run: Run, key: str, seconds: float) -> None:
    """Accumulate over invocations (an interrupted run's earlier time counts) in RUN_DIR/study_time.json."""
    path = os.path.join(run.run_dir, "study_time.json")
    # a damaged file (cut short, binary, another shape) loses only the earlier time, never the job's own result
    times = {name: value for name, value in (read_json(path, dict) or {}).items() if isinstance(value, (int, float))}
    times[key] = times.get(key, 0.0) + seconds
    os.makedirs(run.run_dir, exist_ok=True)
    atomic_write_text(path, json.dumps(times) + "\n")


# ----------------------------------------------------------------------------- launching

def train_argv(run: Run) -> list[str]:
    """A run with a checkpoint resumes: ckpt.pt, or a complete sharded checkpoint whose ckpt.pt is gone (train.py
    --resume recovers it; a new run there is refused, and its advice would name train.py's flags, not the study)."""
    resume = os.path.isfile(os.path.join(run.run_dir, "ckpt.pt")) or latest_complete_shards(run.run_dir) is not None
    return run.train_args + (["--resume"] if resume else [])


def gpu_slots(study: Study) -> list[list[str]]:
    """Disjoint groups of gpus_per_run GPUs; each runs one job at a time, the groups side by side. Under cpu_jobs,
    `jobs` slots of no GPU."""
    if study.mode == "cpu_jobs":
        return [[] for _ in range(study.jobs)]
    k = study.gpus_per_run
    return [study.gpus[i:i + k] for i in range(0, len(study.gpus) - k + 1, k)]


def job_command(study: Study, job: str, argv: list[str], slot: list[str]) -> tuple[list[str], dict[str, str]]:
    """(command line, extra environment) of a train or evaluation job in a subprocess on the GPUs `slot`."""
    env = {"CUDA_VISIBLE_DEVICES": ",".join(slot)}
    if study.mode == "cpu_jobs":
        # Each job its share of the cores: a job with more threads than its cores stalls at every parallel region
        # while one of them waits for a core (seen here: 13,000 tokens/s alone, 700-2,400 beside other work).
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // study.jobs))
    if job != "train":
        return [sys.executable, str(REPO / "eval" / f"{job}.py"), *argv], env
    if study.mode == "torchrun":
        # --standalone picks a free rendezvous port, so several torchrun jobs can run side by side.
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={len(slot)}",
                str(REPO / "train.py"), *argv], env
    return [sys.executable, str(REPO / "train.py"), *argv], env


def last_error_line(text: str) -> str | None:
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    return lines[-1][len("error:"):].strip() if lines else None


class Tee(io.TextIOBase):
    """Writes to several streams: an evaluation's stderr is both kept (for its error line) and shown."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def in_process_job(job: str, argv: list[str], run_dir: str) -> str | None:
    """Run train.run or an evaluation's main here; returns None on success, else one sentence."""
    captured = io.StringIO()
    try:
        if job == "train":
            result = train.run(argv)
            if result["stopped"] in ("sigterm", "interrupted"):
                raise StudyInterrupted
            return None
        with contextlib.redirect_stderr(Tee(captured, sys.stderr)):  # its progress lines still reach the console
            evaluation(job).main(argv)
        return None
    except (ConfigError, train.TrainError, DataError) as e:
        return str(e)
    except SystemExit as e:  # the evaluation CLIs exit 2 on a usage or data error, after printing it
        if e.code in (0, None):
            return None
        return last_error_line(captured.getvalue()) or f"eval/{job}.py exited with code {e.code}"
    except (KeyboardInterrupt, StudyInterrupted):
        raise
    except Exception as e:  # an unforeseen failure of one run must not stop the others: keep its traceback
        log = os.path.join(run_dir, f"study_{job}_error.log")
        os.makedirs(run_dir, exist_ok=True)
        Path(log).write_text(traceback.format_exc())
        return f"{type(e).__name__}: {e} (traceback in {log})"


def raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


class Runner:
    """Takes every run through training and its evaluations, skipping what is finished."""

    def __init__(self, study: Study):
        self.study = study
        self.stop = threading.Event()
        self.status: dict[tuple[str, int], dict] = {}
        self.children: set[subprocess.Popen] = set()

    def job(self, run: Run, job: str, argv: list[str], slot) -> str | None:
        if self.study.mode == "in_process":
            return in_process_job(job, argv, run.run_dir)
        return self.subprocess_job(job, argv, run.run_dir, slot)

    def subprocess_job(self, job: str, argv: list[str], run_dir: str, slot: list[str]) -> str | None:
        command, env = job_command(self.study, job, argv, slot)
        log = os.path.join(run_dir, f"study_{job}.log")
        os.makedirs(run_dir, exist_ok=True)
        with open(log, "a") as out:
            out.write(f"$ CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} {' '.join(command)}\n")
            out.flush()
            child = subprocess.Popen(command, env=os.environ | env, stdout=out, stderr=subprocess.STDOUT)
            self.children.add(child)
            try:
                code = child.wait()
            finally:
                self.children.discard(child)
        if code == 0:
            return None
        if code in (130, -2, -15) or self.stop.is_set():  # Ctrl-C or SIGTERM reached the child too
            raise StudyInterrupted
        return last_error_line(Path(log).read_text()) or f"exit code {code}; see {log}"

    def timed_job(self, run: Run, job: str, argv: list[str], slot, label: str) -> str | None:
        """A job with its time: on the console when it ends, and added to RUN_DIR/study_time.json."""
        start = timing.clock()
        try:
            error = self.job(run, job, argv, slot)
        finally:
            seconds = timing.clock() - start
            add_wall_clock(run, f"{job}_s", seconds)
        if error is None:
            print(f"[study] {job} {label} took {timing.duration(seconds)}", flush=True)
        return error

    def process(self, run: Run, slot=None) -> None:
        label = f"{run.encoding} seed {run.seed}"
        status = {"status": "done", "errors": []}
        self.status[(run.encoding, run.seed)] = status
        try:
            if self.stop.is_set():
                raise StudyInterrupted
            diverged = read_json(diverged_marker(run), dict)
            if diverged and not run_trained(run):  # it would diverge again from the same checkpoint
                status.update(status="diverged", errors=[f"training: {diverged['error']}"])
                print(f"[study] DIVERGED {label} (earlier): {diverged['error']} (delete {diverged_marker(run)} to "
                      "train it again)", flush=True)
                return
            damaged = damaged_records(run)  # before training: a resume would drop those lines
            if damaged:
                status.update(status="failed", errors=[f"records: {damaged}"])
                print(f"[study] FAILED {label}: records: {damaged}", flush=True)
                return
            if not run_trained(run):
                argv = train_argv(run)
                print(f"[study] {'resume' if '--resume' in argv else 'train'} {label} -> {run.run_dir}", flush=True)
                error = self.timed_job(run, "train", argv, slot, label)
                if error is None and not run_trained(run):
                    summary = next((r for r in reversed(read_records(run.run_dir)) if r.get("type") == "summary"), {})
                    if self.stop.is_set() or summary.get("stopped") in ("sigterm", "interrupted"):
                        raise StudyInterrupted
                    error = (f"training stopped at iteration {summary.get('iter')} of {run.final_iter} "
                             f"({summary.get('stopped')})")
                if error is not None and error.startswith("training diverged"):
                    atomic_write_text(diverged_marker(run), json.dumps({"error": error}) + "\n")
                    status.update(status="diverged", errors=[f"training: {error}"])
                    print(f"[study] DIVERGED {label}: {error}", flush=True)
                    return
                if error is not None:
                    status.update(status="failed", errors=[f"training: {error}"])
                    print(f"[study] FAILED {label}: training: {error}", flush=True)
                    return
            lost = lost_records(run)
            if lost:
                status.update(status="failed", errors=[f"records: {lost}"])
                print(f"[study] FAILED {label}: records: {lost}", flush=True)
                return
            for name, argv in run.evals.items():
                if eval_finished(run, name):
                    continue
                if self.stop.is_set():
                    raise StudyInterrupted
                print(f"[study] {name} {label}", flush=True)
                checkpoint = checkpoint_identity(run)  # before the job: the file it is about to read
                error = self.timed_job(run, name, argv, slot, label)
                if error is not None:
                    status.update(status="failed")
                    status["errors"].append(f"{name}: {error}")
                    print(f"[study] FAILED {label}: {name}: {error}", flush=True)
                    continue
                atomic_write_text(eval_marker(run, name), json.dumps({"argv": argv, "checkpoint": checkpoint}) + "\n")
        except (StudyInterrupted, KeyboardInterrupt):
            status.update(status="interrupted")
            self.stop.set()

    def run_all(self) -> None:
        """SIGTERM is handled like Ctrl-C (train.py replaces the handler while it trains in-process)."""
        in_main_thread = threading.current_thread() is threading.main_thread()  # only there may handlers be set
        previous = signal.signal(signal.SIGTERM, raise_keyboard_interrupt) if in_main_thread else None
        try:
            self.run_each()
        finally:
            if in_main_thread:
                signal.signal(signal.SIGTERM, previous)

    def run_each(self) -> None:
        runs = self.study.runs
        # The ETA counts only runs with work left: finished ones are skipped in no time.
        pending = {id(run) for run in runs if not run_done(run)}
        progress = timing.Progress("[study] progress", len(pending), "runs", every_s=0, stream="stdout")

        def process_and_count(run, slot=None):
            self.process(run, slot)
            if id(run) in pending and not self.stop.is_set():
                progress.advance(1)

        if self.study.mode == "in_process":
            for run in runs:  # in the main thread, so train.py's Ctrl-C handler (checkpoint, then stop) works
                process_and_count(run)
                if self.stop.is_set():
                    raise StudyInterrupted
            return
        slots: queue.Queue = queue.Queue()
        for slot in gpu_slots(self.study):
            slots.put(slot)

        def on_free_slot(run):
            slot = slots.get()
            try:
                process_and_count(run, slot)
            finally:
                slots.put(slot)

        pool = ThreadPoolExecutor(max_workers=slots.qsize())
        try:
            futures = [pool.submit(on_free_slot, run) for run in runs]
            for future in futures:
                future.result()
        except KeyboardInterrupt:
            self.stop.set()
            for child in list(self.children):  # a Ctrl-C reached them already, a SIGTERM to the study did not
                child.send_signal(signal.SIGTERM)  # train.py then saves a checkpoint and exits
            print("[study] stopping: waiting for the running jobs to save their checkpoints...", flush=True)
        pool.shutdown(wait=True, cancel_futures=True)
        if self.stop.is_set():
            raise StudyInterrupted


# ----------------------------------------------------------------------------- statistics
