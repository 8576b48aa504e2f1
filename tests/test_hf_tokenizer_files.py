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


TEXTS = ["Hello world", "  two  spaces, don't stop: 12345 tokens!\n\nnew\tline", "naïve café — 東京 🙂", "a" * 40]


@pytest.mark.parametrize("name", ["gpt2", "byte"])
def test_the_written_tokenizer_encodes_and_decodes_as_the_training_tokenizer_does(name):
    from data.tokenizer import get_tokenizer
    from hf.tokenizer_files import tokenizer_for
    ours = get_tokenizer(name)
    written, eot = tokenizer_for(name)
    assert eot == ours.eot_token
    for text in TEXTS:
        ids = written.encode(text, add_special_tokens=False).ids
        assert ids == ours.encode(text), text
        assert written.decode(ids) == text
    assert written.encode("<|endoftext|>", add_special_tokens=False).ids == [eot]  # the special token, whole
