"""scripts/known_results.py judges each known result from the study report's own numbers."""
import pytest

from scripts import known_results


def report(rises: dict, losses: dict) -> dict:
    return {"encodings": {e: {"extrapolation": {"by_seed": {"rise": {"8": {"mean": r}}}}} for e, r in rises.items()},
            "runs": [{"encoding": e, "final_val_loss": loss} for e, loss in losses.items()]}


@pytest.mark.parametrize("rises, losses, expected", [
    ({"rope": 0.78, "alibi": -0.02, "fox": 0.01}, {"rope": 2.2, "alibi": 2.3, "fox": 2.0}, [True] * 6),
    # rope flat (a positional bug that removed RoPE's dependence on absolute angle would look like this)
    ({"rope": 0.05, "alibi": -0.02, "fox": 0.01}, {"rope": 2.2, "alibi": 2.3, "fox": 2.0}, [False] + [True] * 5),
    # alibi rising (a bias that stopped growing with distance), fox's run unfinished
    ({"rope": 0.78, "alibi": 0.2, "fox": 0.05}, {"rope": 2.2, "alibi": 2.3, "fox": None}, [True, False, True, True, True, False]),
    ({"rope": 0.78, "alibi": 0.0, "fox": 0.0}, {"rope": 2.6, "alibi": 2.59, "fox": 5.5}, [True, True, True, False, True, False]),
    # just past the flat bound, and just past the rise bound
    ({"rope": 0.11, "alibi": 0.08, "fox": 0.051}, {"rope": 2.2, "alibi": 2.3, "fox": 2.0}, [True, False, False] + [True] * 3),
])
def test_each_known_result_is_judged_by_its_bound(rises, losses, expected):
    results = known_results.checks(report(rises, losses))
    assert [holds for holds, _ in results] == expected
    sentences = [s for _, s in results]
    assert f"{rises['rope']:+.3f}" in sentences[0] and f"{rises['alibi']:+.3f}" in sentences[1]
    assert ("did not finish" in sentences[5]) == (losses["fox"] is None)
