"""training/divergence.py: each rule on loss sequences built by hand around ln(vocab_size)."""
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import down, up
from training.divergence import DivergenceMonitor

V = 320
UNIFORM = math.log(V)  # 5.768


def fed(losses, spike_factor=2.0, state=None):
    monitor = DivergenceMonitor(V, spike_factor, state)
    for loss in losses:
        assert monitor.problem(loss, grad_norm=1.0) is None, loss
        monitor.record(loss)
    return monitor


def test_non_finite_values_and_a_zero_gradient_are_divergence():
    monitor = fed([5.8, 5.5])
    assert "nan" in monitor.problem(float("nan"), 1.0)
    assert "inf" in monitor.problem(5.0, float("inf"))
    assert "weights are no longer finite" in monitor.problem(5.0, 1.0, param_norm=float("nan"))
    assert "basis generator" in monitor.problem(5.0, 1.0, overflow=1.5)
    assert monitor.problem(5.0, 1.0, overflow=0.99) is None
    assert "gradient is exactly zero" in monitor.problem(5.0, 0.0)
    assert monitor.problem(5.0, None) is None  # a forward pass alone has no gradient to judge


def test_the_uniform_level_counts_only_after_the_loss_had_fallen():
    at_init = fed([UNIFORM + 0.05, UNIFORM + 0.02])  # a fresh model sits at (or just above) ln V: fine
    assert at_init.problem(UNIFORM + 0.01, 1.0) is None
    fallen = fed([5.8, 5.0, 4.2, UNIFORM - 1.2])
    assert "back at the uniform-prediction level" in fallen.problem(UNIFORM, 1.0)
    assert "back at the uniform-prediction level" in fallen.problem(UNIFORM + 0.3, 1.0)
    assert fallen.problem(UNIFORM - 0.2, 1.0) is None  # worse, but not collapsed


def test_a_spike_is_measured_against_the_recent_average():
    steady = fed([1.5] * 20 + [1.4] * 20)  # (twice this stays below the uniform level)
    average = (20 * 1.5 + 20 * 1.4) / 40
    assert steady.problem(2 * average - 0.01, 1.0) is None
    assert "jumped to" in steady.problem(2 * average + 0.01, 1.0)
    assert fed([1.0] * 20, spike_factor=0).problem(5.0, 1.0) is None  # off (5.0: still below the uniform level)
    # before 10 losses the uniform level is the floor of the reference: early noise is not a spike ...
    early = fed([5.8, 5.7])
    assert early.problem(2 * UNIFORM - 0.01, 1.0) is None
    # ... but an explosion is
    assert "jumped to" in early.problem(1e5, 1.0)


def test_the_state_survives_a_checkpoint():
    monitor = fed([5.8, 4.0, 3.0] + [2.5] * 60)
    state = monitor.state_dict()
    assert len(state["recent"]) == 50 and state["min_loss"] == 2.5
    resumed = DivergenceMonitor(V, 2.0, state)
    assert "jumped to" in resumed.problem(5.2, 1.0)  # checked from the first step after a resume
    assert "back at the uniform" in DivergenceMonitor(V, 0, state).problem(UNIFORM, 1.0)  # min_loss kept too
    assert DivergenceMonitor(V, 2.0, None).problem(5.2, 1.0) is None  # no history: nothing to compare with


# -------------------------------------------------- properties: every threshold at, just below and just above its limit
# Each limit is written here from its documented rule, not read from the code: the divergence rules
# (training/divergence.py's docstring), the config's ranges (TrainConfig's field comments), token ids against the
# vocabulary (a batch, a shard, an adopted GPT-2 folder) and the memory check before any work. "Just below" and "just
# above" are the neighbouring float (math.nextafter) or integer, so a comparison moved by one is caught.


losses = st.floats(min_value=0.5, max_value=4.0, allow_nan=False)


def monitor_with(recent, spike_factor=2.0, min_loss=None):
    state = {"recent": list(recent), "min_loss": min(recent) if min_loss is None else min_loss} if recent else None
    return DivergenceMonitor(V, spike_factor, state)


@given(recent=st.lists(losses, min_size=1, max_size=60), factor=st.floats(min_value=1.01, max_value=8.0))
def test_spike_rule_at_and_around_its_limit(recent, factor):
    """A spike is a loss above factor x the average of the last 50 losses, that average raised to ln(V) while
    fewer than 10 are known; a loss exactly at the limit is not a spike."""
    window = recent[-50:]
    average = sum(window) / len(window)
    reference = average if len(window) >= 10 else max(average, UNIFORM)
    limit = factor * reference
    monitor = monitor_with(recent, factor, min_loss=UNIFORM)  # the return-to-uniform rule cannot fire
    assert "jumped" in monitor.problem(up(limit), 1.0)
    assert monitor.problem(limit, 1.0) is None
    assert monitor.problem(down(limit), 1.0) is None
    assert monitor_with(recent, 0.0, min_loss=UNIFORM).problem(up(limit), 1.0) is None  # spike_factor 0: off


@pytest.mark.parametrize("known", [8, 9, 10, 11, 49, 50, 51])
def test_spike_reference_switches_from_the_uniform_level_at_ten_losses(known):
    """Low recent losses (1.0): with fewer than 10 the reference is ln(V), from 10 on their average; the
    window holds the last 50, so older losses (here 3.0) stop counting."""
    recent = [3.0] * max(0, known - 50) + [1.0] * min(known, 50)
    reference = 1.0 if known >= 10 else UNIFORM
    monitor = monitor_with(recent, 2.0, min_loss=UNIFORM)
    assert monitor.problem(2 * reference, 1.0) is None
    assert "jumped" in monitor.problem(up(2 * reference), 1.0)
    if known >= 10:
        assert "jumped" in monitor.problem(2 * UNIFORM, 1.0)


@given(min_loss=st.floats(min_value=0.0, max_value=UNIFORM - 1.0), gap=st.floats(min_value=0.0, max_value=2.0))
def test_return_to_the_uniform_level_at_and_around_its_limits(min_loss, gap):
    """After the loss has reached ln(V) - 1 nat or lower, a loss at ln(V) - 0.01 or higher is a collapse."""
    fallen = DivergenceMonitor(V, 0.0, {"recent": [], "min_loss": min_loss})
    level = UNIFORM - 0.01
    assert "back at the uniform" in fallen.problem(level + gap, 1.0)
    assert "back at the uniform" in fallen.problem(level, 1.0)
    assert fallen.problem(down(level), 1.0) is None
    barely = DivergenceMonitor(V, 0.0, {"recent": [], "min_loss": up(UNIFORM - 1.0)})
    assert barely.problem(level + gap, 1.0) is None  # it never fell a whole nat: a fresh model sits at ln(V)


def test_the_fallen_limit_is_exactly_one_nat():
    at_limit = DivergenceMonitor(V, 0.0, {"recent": [], "min_loss": UNIFORM - 1.0})
    assert "back at the uniform" in at_limit.problem(UNIFORM, 1.0)


@given(loss=losses)
def test_basis_overflow_and_zero_gradient_at_their_limits(loss):
    monitor = monitor_with([2.0] * 12)
    assert monitor.problem(loss, 1.0, overflow=1.0) is None
    assert "basis generator" in monitor.problem(loss, 1.0, overflow=up(1.0))
    assert monitor.problem(loss, 1.0, overflow=down(1.0)) is None
    assert "exactly zero" in monitor.problem(loss, 0.0)
    assert monitor.problem(loss, 5e-324) is None
    assert monitor.problem(loss, None) is None


def test_monitor_state_round_trips_and_keeps_the_last_fifty():
    monitor = DivergenceMonitor(V, 2.0)
    for i in range(70):
        monitor.record(3.0 + i / 100)
    state = monitor.state_dict()
    assert state["recent"] == [3.0 + i / 100 for i in range(20, 70)] and state["min_loss"] == 3.0
    again = DivergenceMonitor(V, 2.0, json.loads(json.dumps(state)))
    assert again.state_dict() == state
