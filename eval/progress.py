"""Progress lines for long evaluation jobs: work done, time elapsed and an estimate of the time left.

    extrapolation seed1, loss at 4 contexts: 12,288/49,152 tokens (25%), elapsed 0:12, ETA 0:36

Plain lines, not a redrawn bar, so they read the same in a terminal and in a log file (on stderr; the study's
own on stdout, beside its other lines). A line is written when the job starts, at most every EVERY_S seconds
while it runs, and when it ends. The ETA assumes the rest goes at the average rate so far, so the units should
be proportional to the work (tokens, not batches).
"""
import sys
import threading
import time

EVERY_S = 10.0


def clock() -> float:
    """Seconds on a monotonic clock (one place, so tests can replace it with a clock they control)."""
    return time.monotonic()


def duration(seconds: float) -> str:
    """h:mm:ss, or m:ss under an hour."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Counts `total` units of work; advance(n) after each piece. Costs one clock read per call."""

    def __init__(self, label: str, total: int, unit: str, every_s: float | None = None, stream: str = "stderr"):
        self.label, self.total, self.unit, self.stream = label, max(0, int(total)), unit, stream
        self.every_s = EVERY_S if every_s is None else every_s
        self.done = 0
        self.lock = threading.Lock()  # the study advances one Progress from several job threads
        self.start = self.last = clock()
        self._write(f"{label}: {self.total:,} {unit} to do")

    def elapsed(self) -> float:
        return clock() - self.start

    def advance(self, n: int = 1) -> None:
        with self.lock:
            self.done = min(self.total, self.done + n)
            now = clock()
            if self.done < self.total and now - self.last < self.every_s:
                return
            self.last = now
            elapsed = now - self.start
            eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
            percent = 100 * self.done / self.total if self.total else 100
            self._write(f"{self.label}: {self.done:,}/{self.total:,} {self.unit} ({percent:.0f}%), "
                        f"elapsed {duration(elapsed)}, ETA {duration(eta)}")

    def _write(self, line: str) -> None:
        print(line, file=getattr(sys, self.stream), flush=True)  # looked up now: the study may redirect it
