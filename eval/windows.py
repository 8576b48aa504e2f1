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


def document_windows(tokens, eot, length, count=None):
    """(start, document) of windows of length + 1 tokens that lie inside one document each (a document begins after
    an eot token, or at the start), consecutive and non-overlapping within it, in the order of the text; at most
    `count` (None: all). The token stream of a prepared split is eot, document, eot, document, ..."""
    import numpy as np

    tokens = np.asarray(tokens)
    bounds = [-1] + np.flatnonzero(tokens == eot).tolist() + [len(tokens)]
    found = []
    for document, (a, b) in enumerate(zip(bounds, bounds[1:])):  # a document is tokens[a + 1 : b]
        for start in range(a + 1, b - length, length + 1):
            found.append((start, document))
            if count is not None and len(found) == count:
                return found
    return found
