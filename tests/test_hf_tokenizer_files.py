"""hf/tokenizer_files.py: the tokenizer files written from a ranks table."""
import pytest


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_a_ranks_table_with_a_token_that_is_no_merge_names_it():
    from hf.tokenizer_files import merges_from_ranks
    ranks = {bytes([b]): b for b in range(256)}
    ranks[b"ab"] = 256
    assert merges_from_ranks(ranks) == [(b"a", b"b")]
    ranks[b"xyz"] = 257  # neither xy nor yz is a token
    with pytest.raises(ValueError, match=r"^token b'xyz' \(rank 257\) is not one merge of two lower-ranked tokens$"):
        merges_from_ranks(ranks)
