"""scripts/known_results.py judges each known result from the study report's own numbers."""
import pytest

from scripts import known_results

REACH = {"alibi": 1100, "fox": 6}
RETRIEVED = {"rope": [0.0, 0.0, 0.0, 0.0], "alibi": [0.0, 0.0, 0.0, 0.0], "fox": [0.0, 0.0, 0.0, 0.0]}


def report(rises: dict, losses: dict, reach=REACH, retrieved=RETRIEVED) -> dict:
    """A study report with what checks() reads: the rise at 8L, each head's longest reach (alibi, fox), retrieval
    accuracy in the buckets (0, L/4], (L/4, L/2], (L/2, L] and (L, 2L] at L = 512, and the final losses."""
    bounds = [(0, 128), (128, 256), (256, 512), (512, 1024)]
    encodings = {}
    for e, r in rises.items():
        encodings[e] = {"extrapolation": {"by_seed": {"rise": {"8": {"mean": r}}}},
                        "retrieval": {"buckets": [{"lo": lo, "hi": hi, "accuracy": {"mean": a}}
                                                  for (lo, hi), a in zip(bounds, retrieved[e])]}}
        if e in reach:
            encodings[e]["reach"] = {"train_context": 512, "reach": {"mean": reach[e]}}
    return {"encodings": encodings, "runs": [{"encoding": e, "final_val_loss": loss} for e, loss in losses.items()]}


GOOD = ({"rope": 0.78, "alibi": -0.02, "fox": 0.01}, {"rope": 2.2, "alibi": 2.3, "fox": 2.0})


@pytest.mark.parametrize("rises, losses, expected", [
    (*GOOD, [True] * 9),
    # rope flat (a positional bug that removed RoPE's dependence on absolute angle would look like this)
    ({"rope": 0.05, "alibi": -0.02, "fox": 0.01}, GOOD[1], [False] + [True] * 8),
    # alibi rising (a bias that stopped growing with distance), fox's run unfinished
    ({"rope": 0.78, "alibi": 0.2, "fox": 0.05}, {"rope": 2.2, "alibi": 2.3, "fox": None},
     [True, False, True, True, True, True, True, True, False]),
    ({"rope": 0.78, "alibi": 0.0, "fox": 0.0}, {"rope": 2.6, "alibi": 2.59, "fox": 5.5}, [True] * 6 + [False, True, False]),
    # just past the flat bound, and just past the rise bound
    ({"rope": 0.11, "alibi": 0.08, "fox": 0.051}, GOOD[1], [True, False, False] + [True] * 6),
])
def test_each_known_result_is_judged_by_its_bound(rises, losses, expected):
    results = known_results.checks(report(rises, losses))
    assert [holds for holds, _ in results] == expected
    sentences = [s for _, s in results]
    assert f"{rises['rope']:+.3f}" in sentences[0] and f"{rises['alibi']:+.3f}" in sentences[1]
    assert ("did not finish" in sentences[8]) == (losses["fox"] is None)


@pytest.mark.parametrize("reach, retrieved, expected", [
    ({"alibi": 1100, "fox": 6}, RETRIEVED, [True, True, True]),
    ({"alibi": 1100, "fox": 64}, RETRIEVED, [False, True, True]),  # fox's reach at the bound: not local any more
    ({"alibi": 512, "fox": 6}, RETRIEVED, [True, False, True]),   # alibi reaching L, not past it
    ({"fox": 6}, RETRIEVED, [True, False, True]),                  # alibi's reach not measured
    # retrieval learned within L (0.06 at L/2) fails the negative result; past L (the 4th bucket) does not count
    (REACH, {**RETRIEVED, "fox": [0.0, 0.06, 0.0, 0.0]}, [True, True, False]),
    (REACH, {**RETRIEVED, "fox": [0.05, 0.0, 0.0, 0.9]}, [True, True, True]),
])
def test_the_reach_and_retrieval_results_are_judged_by_their_bounds(reach, retrieved, expected):
    results = known_results.checks(report(*GOOD, reach=reach, retrieved=retrieved))
    assert [holds for holds, _ in results[3:6]] == expected
    assert f"{reach['fox']:.0f} tokens" in results[3][1]
    assert f"the best accuracy at gaps up to L is {max(a for v in retrieved.values() for a in v[:3]):.3f}" in results[5][1]
