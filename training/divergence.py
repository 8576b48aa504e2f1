"""Recognising a diverged run, as practitioners do, from numbers every step already has.

A run has diverged when its loss or gradient norm is not finite, its weights are not finite, its gradient is
exactly zero (the output no longer depends on the weights: a collapsed model), its loss is back at the
uniform-prediction level ln(vocab_size) after it had fallen well below it, or its loss jumps far above its
recent average (a spike). None of these depends on how an attention kernel treats NaN (some CPUs' fused
attention returns zeros for NaN queries), and GRAPE-M-basis generators past the range of their matrix
exponential are checked directly.

The recent losses are saved in the checkpoint, so a resumed run is checked from its first step.
"""
from __future__ import annotations

import math
from collections import deque

from training.errors import TrainError, study_command

WINDOW = 50        # losses the spike rule averages
MIN_HISTORY = 10   # before this many, the spike is measured against the uniform level as well
FALLEN = 1.0       # nats below the uniform level the loss must have reached before a return to it counts


class DivergenceMonitor:
    def __init__(self, vocab_size: int, spike_factor: float, state: dict | None = None):
        self.uniform = math.log(vocab_size)
        self.spike_factor = spike_factor
        state = state or {}
        self.recent = deque(state.get("recent", []), maxlen=WINDOW)
        self.min_loss = state.get("min_loss", math.inf)

    def problem(self, loss: float, grad_norm: float | None = None, param_norm: float = 0.0,
                overflow: float = 0.0) -> str | None:
        """What says this loss (and gradient norm, weight norm, basis-generator overflow) has diverged, or None."""
        # the causes first, then the symptoms
        if overflow > 1:
            return "a learned basis generator is beyond the range of its matrix exponential"
        if not math.isfinite(param_norm):
            return f"the weights are no longer finite (their norm is {param_norm})"
        if not math.isfinite(loss) or (grad_norm is not None and not math.isfinite(grad_norm)):
            return f"the loss is {loss}" + ("" if grad_norm is None else f" and the gradient norm {grad_norm}")
        if grad_norm == 0.0:
            return (f"the gradient is exactly zero at loss {loss:.4f}: the output no longer depends on the weights "
                    "(a collapsed model)")
        if self.spike_factor > 0 and self.recent:
            average = sum(self.recent) / len(self.recent)
            reference = average if len(self.recent) >= MIN_HISTORY else max(average, self.uniform)
            if loss > self.spike_factor * reference:
                return (f"the loss jumped to {loss:.4g}, more than {self.spike_factor:g} x its recent level "
                        f"{reference:.4f} (train.spike_factor sets the factor)")
        if self.min_loss <= self.uniform - FALLEN and loss >= self.uniform - 0.01:
            return (f"the loss {loss:.4f} is back at the uniform-prediction level ln(vocab_size) = "
                    f"{self.uniform:.4f} after it had fallen to {self.min_loss:.4f} (a collapsed model)")
        return None

    def record(self, loss: float) -> None:
        self.recent.append(loss)
        self.min_loss = min(self.min_loss, loss)

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "min_loss": self.min_loss}


def divergence_error(problem: str, step: int, cause: str, ckpt_path: str, saved_step: int | None,
                     before_saving: bool = False) -> TrainError:
    """The sentence a diverged run stops with: what was seen, a known cause, and the advice that works (the last
    checkpoint on disk passed these checks, since none is written without them)."""
    remedy = "lower --lr or raise --warmup_iters (or check the data)"
    if study_command():
        # A study compares its encodings at the same settings and reports this run as diverged (a rerun would
        # diverge again from the same checkpoint), so the remedy is a study at other settings, not a resume.
        kept = ("no checkpoint was written before it" if saved_step is None else
                f"the last good checkpoint {ckpt_path} (iteration {saved_step}) is kept")
        remedy = (f"{kept}; the study reports the run as diverged; to train at other settings, lower lr or raise "
                  "warmup_iters in the study file's [overrides] and give the study another out_dir")
    elif saved_step is None:
        remedy = f"no checkpoint was written before it, so start again with the same command but {remedy}"
    else:
        remedy = (f"the last good checkpoint {ckpt_path} (iteration {saved_step}) is kept: {remedy} and continue "
                  "from it with --resume --allow_changes=lr,warmup_iters and the new values")
    if before_saving:
        return TrainError(f"training diverged: the weights after iteration {step} failed the check before saving "
                          f"({problem}{cause}) and were not saved; {remedy}.")
    return TrainError(f"training diverged at iteration {step}: {problem}{cause}; that step's update was not applied, "
                      f"and {remedy}.")
