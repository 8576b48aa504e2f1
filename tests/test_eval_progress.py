"""Progress lines of long evaluation jobs (eval/progress.py), read back from stderr.

The jobs' tests (extrapolation, passkey, lm-eval scoring, the study) run against `work_clock` (conftest.py): a
clock that moves one second per unit of work the job really does (tokens through the model, a training job), so
the elapsed time of each line must equal the work done and its ETA the work left, exactly, and fall to 0.
"""
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eval import progress
from helpers import any_seconds

LINE = re.compile(r"^(?P<label>.+): (?P<done>[\d,]+)/(?P<total>[\d,]+) (?P<unit>[a-z ]+) \((?P<percent>\d+)%\), "
                  r"elapsed (?P<elapsed>[\d:]+), ETA (?P<eta>[\d:]+)$")


def seconds(text):
    return sum(int(part) * 60 ** i for i, part in enumerate(reversed(text.split(":"))))


def progress_lines(err, label):
    """[(done, total, elapsed s, ETA s)] of each progress line of `label` in the captured stderr."""
    lines = []
    for line in err.splitlines():
        match = LINE.match(line)
        if match and match["label"] == label:
            lines.append((int(match["done"].replace(",", "")), int(match["total"].replace(",", "")),
                          seconds(match["elapsed"]), seconds(match["eta"])))
    return lines


def check_work_clock_lines(lines):
    """Under work_clock: one total, done rising to it, elapsed = done and ETA = total - done. Returns the total."""
    assert lines, "no progress line"
    total = lines[0][1]
    dones = [done for done, *_ in lines]
    assert dones == sorted(set(dones)) and dones[-1] == total
    assert all(t == total and elapsed == done and eta == total - done for done, t, elapsed, eta in lines), lines
    return total


def test_lines_are_throttled_and_the_last_one_always_comes(monkeypatch, capsys):
    now = [100.0]
    monkeypatch.setattr(progress, "clock", lambda: now[0])
    job = progress.Progress("job", 40, "tokens", every_s=10)
    for _ in range(40):
        now[0] += 3  # 3 s per token: a line at most every 10 s
        job.advance(1)
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "job: 40 tokens to do"
    lines = progress_lines(err, "job")
    elapsed = [e for _, _, e, _ in lines]
    assert all(b - a >= 10 for a, b in zip(elapsed, elapsed[1:-1]))  # throttled (the last line may come sooner)
    assert lines[-1] == (40, 40, 120, 0) and len(lines) == 120 // 12
    for done, total, e, eta in lines:  # 3 s per token so far: the rest at the same rate
        assert eta == 3 * (total - done) and e == 3 * done


def test_many_quick_steps_print_two_lines(monkeypatch, capsys):
    """The cost of progress: one clock read per advance, and a line only every EVERY_S seconds."""
    monkeypatch.setattr(progress, "clock", lambda: 5.0)  # all 10,000 steps within one second
    job = progress.Progress("quick", 10_000, "tokens")
    for _ in range(10_000):
        job.advance(1)
    assert capsys.readouterr().err.splitlines() == ["quick: 10,000 tokens to do",
                                                    "quick: 10,000/10,000 tokens (100%), elapsed 0:00, ETA 0:00"]


@pytest.mark.parametrize("value,text", [(0, "0:00"), (59.6, "1:00"), (65, "1:05"), (3725, "1:02:05"),
                                        (90061, "25:01:01")])
def test_durations_read_as_clock_times(value, text):
    assert progress.duration(value) == text


# ---------------------------------- properties: durations, rates and progress at any magnitude, from a second to months
# Each printed duration is parsed back and compared with the seconds it stands for (rounded to the second, and to the
# minute in training's hours form); the rates and times left are compared with their formulas on a clock the test
# moves (train: the average time per step so far times the steps left; evaluation: the average time per unit of work
# times the units left).


@given(s=any_seconds)
def test_evaluation_durations_read_back_at_any_magnitude(s):
    text = progress.duration(s)
    long = re.fullmatch(r"([1-9]\d*):(\d\d):(\d\d)", text)
    short = re.fullmatch(r"(\d+):(\d\d)", text)
    assert long or short, text
    if long:
        assert int(long[2]) < 60 and int(long[3]) < 60
        assert 3600 * int(long[1]) + 60 * int(long[2]) + int(long[3]) == int(round(s))
    else:
        assert int(short[1]) < 60 and int(short[2]) < 60
        assert 60 * int(short[1]) + int(short[2]) == int(round(s))


@given(total=st.integers(1, 10**9), pieces=st.lists(st.integers(1, 10**8), min_size=1, max_size=6),
       per_unit=st.floats(min_value=1e-6, max_value=10.0))
def test_evaluation_progress_lines_at_any_magnitude(work_clock, capsys, total, pieces, per_unit):
    """Each line: done/total (percent), the time elapsed and the ETA = elapsed / done x (total - done), as
    durations; the work done never passes the total."""
    work_clock[0] = 0.0  # (the fixture's clock is shared by the examples)
    meter = progress.Progress("job", total, "tokens")
    assert capsys.readouterr().err.splitlines() == [f"job: {total:,} tokens to do"]
    done = 0
    for n in pieces:
        work_clock[0] += n * per_unit
        meter.advance(n)
        done = min(total, done + n)
        elapsed = work_clock[0]
        line = capsys.readouterr().err.strip()
        eta = elapsed / done * (total - done)
        assert line == (f"job: {done:,}/{total:,} tokens ({100 * done / total:.0f}%), "
                        f"elapsed {progress.duration(elapsed)}, ETA {progress.duration(eta)}")
