"""eval/retrieval.py: test sequences whose gaps are what their bucket says, scored against models whose answers are
known (an oracle, and one that copies from a fixed distance)."""
from fractions import Fraction

import numpy as np
import pytest
import torch

from data.retrieval import Facts
from data.tokenizer import byte_tokenizer
from eval import retrieval

FACTS = Facts(byte_tokenizer())
FILLER = (np.arange(20000) % 90 + 32).astype(np.uint16)  # printable bytes, no 0x02 / 0x03


def test_each_query_repeats_its_fact_at_a_gap_inside_the_bucket_and_the_sequence_is_hi_tokens():
    rng = np.random.default_rng(0)
    for lo, hi in ((0, 128), (128, 256), (512, 1024)):
        tokens, queries = retrieval.build_sequences(FILLER, FACTS, lo, hi, 6, 4, rng)
        assert tokens.shape == (6, hi) and len(queries) == 24
        for row, positions, gap in queries:
            assert lo < gap <= hi
            assert positions[0] >= hi - 4 * 9  # the queries fill the sequence's end
            fact = [p - gap for p in positions]
            assert tokens[row, fact].tolist() == tokens[row, positions].tolist()  # the same value, gap tokens back
            assert tokens[row, fact[0] - 5:fact[0] + 4].tolist() == tokens[row, positions[0] - 5:positions[0] + 4].tolist()
        per_row = [sorted(p[0] - gap for r, p, gap in queries if r == row) for row in range(6)]
        assert all(b - a >= 9 for starts in per_row for a, b in zip(starts, starts[1:]))  # facts do not overlap


class Oracle(torch.nn.Module):
    """A 'model' whose most likely next token is the true one, except at the positions listed as wrong."""

    def __init__(self, tokens, wrong=()):
        super().__init__()
        self.tokens, self.wrong = tokens, set(wrong)

    def forward(self, idx, **kwargs):
        logits = torch.zeros(*idx.shape, 257)
        for b in range(idx.shape[0]):
            row = next(i for i in range(len(self.tokens)) if torch.equal(self.tokens[i], idx[b]))
            for p in range(idx.shape[1] - 1):
                target = int(self.tokens[row, p + 1])
                logits[b, p, (target + 1) % 257 if (row, p + 1) in self.wrong else target] = 1.0
        return logits, None


def test_a_query_counts_only_when_every_value_token_is_the_most_likely_next_token():
    tokens, queries = retrieval.build_sequences(FILLER, FACTS, 0, 128, 3, 2, np.random.default_rng(1))
    assert retrieval.score_queries(Oracle(tokens), tokens, queries, "cpu", batch_tokens=128) == [True] * 6
    row, positions, _ = queries[3]
    wrong = retrieval.score_queries(Oracle(tokens, wrong=[(row, positions[-1])]), tokens, queries, "cpu")
    assert wrong == [True, True, True, False, True, True]  # one wrong digit of one value: that query alone fails


class Induction(torch.nn.Module):
    """Predicts the token that followed the latest earlier occurrence of the last 5 tokens, if it lies at most
    `reach` tokens back (else token 0): an induction head of limited reach, which finds exactly the facts whose gap
    is at most `reach`."""

    def __init__(self, reach):
        super().__init__()
        self.reach = reach

    def forward(self, idx, **kwargs):
        logits = torch.zeros(*idx.shape, 257)
        for b, row in enumerate(idx.tolist()):
            for p in range(4, len(row)):
                context = row[p - 4:p + 1]
                match = next((q for q in range(p - 1, max(3, p - self.reach) - 1, -1) if row[q - 4:q + 1] == context),
                             None)
                logits[b, p, row[match + 1] if match is not None else 0] = 1.0
        return logits, None


def test_accuracy_by_bucket_is_the_share_of_queries_at_the_gaps_a_model_reaches():
    edges = retrieval.parse_edges("0,1/4,1/2,1")
    filler = np.random.default_rng(9).integers(32, 122, 20000).astype(np.uint16)
    buckets, _ = retrieval.retrieval_accuracy(Induction(100), filler, FACTS, 256, edges, 12, 2, seed=0, device="cpu")
    assert [b["bucket"] for b in buckets] == ["(0, L/4]", "(L/4, L/2]", "(L/2, L]"]
    assert [(b["lo"], b["hi"], b["queries"]) for b in buckets] == [(0, 64, 24), (64, 128, 24), (128, 256, 24)]
    sequences = [retrieval.build_sequences(filler, FACTS, lo, hi, 12, 2, np.random.default_rng([0, i]))
                 for i, (lo, hi) in enumerate([(0, 64), (64, 128), (128, 256)])]
    expected = [np.mean([gap <= 100 for _, _, gap in queries]) for _, queries in sequences]
    assert [b["accuracy"] for b in buckets] == pytest.approx(expected)
    assert expected[0] == 1 and 0 < expected[1] < 1 and expected[2] == 0


@pytest.mark.parametrize("text,message", [
    ("0,1/4,x", "are not numbers"), ("1/2,1/4", "increasing"), ("0,1,16", "past the 8 L"), ("0", "at least two"),
    ("0,1/0", "are not numbers"),
])
def test_bad_bucket_edges_are_one_sentence(text, message):
    with pytest.raises(ValueError, match=message):
        retrieval.parse_edges(text)


def test_buckets_too_small_for_the_facts_are_named_before_any_work():
    edges = [Fraction(0), Fraction(1, 4), Fraction(1)]
    assert retrieval.bucket_problem(edges, 512, 4, FACTS) is None
    assert retrieval.bucket_problem(edges, 64, 4, FACTS) == (
        "gap bucket (0, 16] tokens (at L = 64) cannot hold 4 facts and their queries (72 tokens, and a bucket at least "
        "37 wide); use fewer pairs or wider or longer buckets")
    assert [retrieval.bucket_name(a, b) for a, b in [(Fraction(0), Fraction(1, 4)), (Fraction(1), Fraction(2)),
                                                      (Fraction(1, 2), Fraction(3, 4))]] == ["(0, L/4]", "(L, 2L]",
                                                                                             "(L/2, 3L/4]"]


def test_a_bucket_one_gap_wider_than_its_facts_is_accepted_and_one_exactly_as_wide_is_not():
    """bucket_problem at its width limit, with 3 pairs (not the usual 4) at a context of 1000 (L/1000 steps put each
    edge on a whole token), in agreement with build_sequences on both sides: a bucket block + 1 wide holds a first
    gap past its lower edge, one exactly block wide does not; a bucket ending one token short of 2 x block cannot
    hold the facts and their queries."""
    block = 3 * retrieval.longest_fact(FACTS)
    thousandth = Fraction(1, 1000)

    def problem(lo, hi):
        return retrieval.bucket_problem([lo * thousandth, hi * thousandth], 1000, 3, FACTS)

    def builds(lo, hi):
        try:
            retrieval.build_sequences(FILLER, FACTS, lo, hi, 20, 3, np.random.default_rng(1))
        except ValueError:
            return False
        return True
    assert problem(2 * block - 1, 3 * block) is None and builds(2 * block - 1, 3 * block)
    assert f"gap bucket ({2 * block}, {3 * block}] tokens" in problem(2 * block, 3 * block)
    assert not builds(2 * block, 3 * block)
    assert problem(0, 2 * block - 1) is not None and not builds(0, 2 * block - 1)


def test_the_command_refuses_edges_past_8L_before_loading_anything(capsys):
    with pytest.raises(SystemExit) as info:
        retrieval.parse_args(["--ckpt", "nowhere", "--edges", "0,1,16"])
    assert info.value.code == 2 and "past the 8 L that retrieval is scored to" in capsys.readouterr().err


def test_no_gap_is_the_buckets_lower_edge():
    """(lo, hi] excludes lo: in a bucket so narrow that a query can only sit at gaps lo + 1 (or lo, if the lower
    edge leaked in), every gap is lo + 1."""
    tokens, queries = retrieval.build_sequences(FILLER, FACTS, 10, 20, 40, 1, np.random.default_rng(2))
    assert {gap for _, _, gap in queries} == {11}


@pytest.mark.fault
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_one_sentence_and_no_results(tmp_path, capsys, value):
    """A NaN weight made every score NaN (or 0.000) and was reported as a model's result."""
    from helpers import run_with_non_finite_weight
    named = run_with_non_finite_weight(tmp_path / "run", value)
    with pytest.raises(SystemExit) as exit_info:
        retrieval.main(["--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: checkpoint {tmp_path / 'run' / 'ckpt.pt'} {named}")
    assert not (tmp_path / "out").exists()


@pytest.mark.fault
def test_several_checkpoints_are_all_checked_before_any_is_evaluated(tmp_path, capsys, monkeypatch):
    """The second checkpoint's longer context needs longer test sequences than the validation text holds: refused
    before the first one's work, which was otherwise done and thrown away."""
    from eval.tiny import save_run, tiny_model
    from helpers import prepare_byte_corpus
    data_dir = prepare_byte_corpus(tmp_path, ["a fact, then another one. " * 40], val_tokens=300)
    save_run(tiny_model("alibi", block_size=16), tmp_path / "short")
    save_run(tiny_model("alibi", block_size=64), tmp_path / "long")
    monkeypatch.setattr(retrieval, "retrieval_accuracy", lambda *a, **k: pytest.fail("no checkpoint may be evaluated"))
    argv = ["--data-dir", data_dir, "--out", str(tmp_path / "out"), "--edges", "0,4,8", "--pairs", "1"]
    with pytest.raises(SystemExit) as exit_info:
        retrieval.main(["--ckpt", str(tmp_path / "short"), str(tmp_path / "long"), *argv])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"error: the validation split of {data_dir} has 300 tokens, fewer than the longest test sequence of "
        f"{tmp_path / 'long'} (512 tokens at L = 64); prepare more validation text or end --edges lower\n")
    assert not (tmp_path / "out").exists()
