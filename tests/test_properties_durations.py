"""Durations, rates and progress at any magnitude, from a second to months (hypothesis; profiles in conftest.py).

Each printed duration is parsed back and compared with the seconds it stands for (rounded to the second, and to
the minute in training's hours form); the rates and times left are compared with their formulas on a clock the
test moves (train: the average time per step so far times the steps left; evaluation: the average time per unit
of work times the units left).
"""
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import training.metrics as metrics
from eval import progress
from training.metrics import Throughput, duration

seconds = st.one_of(st.floats(min_value=0, max_value=1e8, allow_nan=False),
                    st.integers(0, 10**8).map(float),
                    st.sampled_from([59.4, 59.5, 59.6, 60.0, 3599.4, 3599.5, 3600.0, 3660.0, 86399.5, 86400.0]))


def training_seconds(text):
    """What a training duration string says, in seconds: "3h05m", "4m10s" or "12s"."""
    hours = re.fullmatch(r"(\d+)h(\d\d)m", text)
    if hours:
        assert int(hours[2]) < 60
        return 3600 * int(hours[1]) + 60 * int(hours[2])
    minutes = re.fullmatch(r"([1-9]|[1-5]\d)m(\d\d)s", text)
    if minutes:
        assert int(minutes[2]) < 60
        return 60 * int(minutes[1]) + int(minutes[2])
    plain = re.fullmatch(r"(\d+)s", text)
    assert plain and int(plain[1]) < 60, text
    return int(plain[1])


@given(s=seconds)
def test_training_durations_read_back_at_any_magnitude(s):
    whole = int(round(s))
    text = duration(s)
    if whole >= 3600:
        assert training_seconds(text) == whole - whole % 60, text  # hours and minutes
    else:
        assert training_seconds(text) == whole, text


@pytest.mark.parametrize("s,text", [(0, "0s"), (59, "59s"), (60, "1m00s"), (61, "1m01s"), (3599, "59m59s"),
                                    (3600, "1h00m"), (3659, "1h00m"), (3660, "1h01m"), (11100, "3h05m"),
                                    (90061, "25h01m")])
def test_training_durations_at_the_unit_limits(s, text):
    assert duration(s) == text


@given(s=seconds)
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


@given(first=st.integers(0, 10**6), steps=st.lists(st.floats(min_value=1e-3, max_value=1e5), min_size=1, max_size=8),
       tokens=st.integers(1, 10**7), world=st.integers(1, 64), peak=st.sampled_from([None, 989e12]),
       extra=st.integers(0, 10**6))
def test_throughput_and_time_left_at_any_magnitude(monkeypatch, first, steps, tokens, world, peak, extra):
    """Step i (after `first`) ends at the sum of the first i step times; the rate is over the steps since the last
    reading, the time left the average time per step since the start times the steps left."""
    now = [1000.0]
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: now[0])
    flops_per_token = 6e9
    meter = Throughput(first, tokens, flops_per_token, peak, world)
    end = first + len(steps) + extra
    for i, seconds_of_step in enumerate(steps, start=1):
        before = now[0]
        now[0] += seconds_of_step
        seconds_of_step, elapsed = now[0] - before, now[0] - 1000.0  # as the clock holds them
        rate = meter.read(first + i, end)
        assert rate["elapsed_s"] == pytest.approx(elapsed, rel=1e-9)
        assert rate["eta_s"] == pytest.approx(elapsed / i * (end - first - i), rel=1e-9)
        assert rate["tokens_per_s"] == pytest.approx(tokens / seconds_of_step, rel=1e-9)
        assert rate["ms_per_iter"] == pytest.approx(1000 * seconds_of_step, rel=1e-9)
        if peak is None:
            assert rate["mfu"] is None
        else:
            assert rate["mfu"] == pytest.approx(flops_per_token * tokens / seconds_of_step / (peak * world), rel=1e-9)
        meter.restart(first + i)


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
