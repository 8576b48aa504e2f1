"""The windows a long sequence is scored in: shared by lm-eval's rolling loglikelihood (eval/lm_adapter.py) and the
length-extrapolation losses (eval/extrapolation.py), which must import without lm-eval (a GPU image has torch alone)."""


def plan_windows(n_tokens, first_target, window, stride):
    """Windows that score tokens seq[first_target:n_tokens] of a sequence exactly once each.

    Returns a list of (start, end, n_scored): the model reads seq[start:end] (at most `window`
    tokens) and the last n_scored of its predictions are scored, i.e. targets
    seq[end - n_scored + 1 : end + 1]. The first window is filled with as much context as fits;
    each later window scores the next `stride` tokens with the window's full context before them.
    """
    if not 1 <= stride <= window:
        raise ValueError(f"stride must be in [1, window={window}], got {stride}")
    if first_target < 1:
        raise ValueError("the first scored token needs at least one token of context before it")
    windows = []
    next_target = first_target
    while next_target < n_tokens:
        if windows:
            end_target = min(n_tokens, next_target + stride)
        else:  # first window: score as many tokens as one full window can
            end_target = min(n_tokens, max(next_target + stride, window + 1))
        end = end_target - 1  # the input that predicts target t is seq[t - 1]
        start = max(0, end - window)
        windows.append((start, end, end_target - next_target))
        next_target = end_target
    return windows
