"""training/divergence.py: each rule on loss sequences built by hand around ln(vocab_size)."""
import math

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
