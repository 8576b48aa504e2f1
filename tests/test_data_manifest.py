"""data/manifest.py: the command a manifest records parses back to its settings."""
import json
import shlex

import pytest

from data import prepare


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


@pytest.mark.parametrize("source,words", [
    ({"kind": "hub", "dataset": "HuggingFaceFW/fineweb-edu", "config": "sample-100BT"},
     {"dataset": "fineweb-edu", "version": "100B", "files": None}),
    ({"kind": "files", "pattern": "/corpus/*.txt", "txt_sample_by": "line"},
     {"dataset": None, "files": "/corpus/*.txt", "txt_sample_by": "line"}),
])
def test_the_prepare_command_of_a_manifest_parses_back_to_its_settings(tmp_path, source, words):
    from data.manifest import prepare_command
    settings = {"source": source, "tokenizer": "gpt2", "val_tokens": 1000, "shard_tokens": 4096, "max_tokens": 9000}
    (tmp_path / "manifest.json").write_text(json.dumps({"config": settings}))
    command = prepare_command(tmp_path).split(" ", 3)
    assert command[:3] == ["python", "-m", "data.prepare"]
    args = prepare.parse_args(shlex.split(command[3]))
    assert (args.out, args.tokenizer, args.val_tokens, args.shard_tokens, args.max_tokens) == \
        (str(tmp_path), "gpt2", 1000, 4096, 9000)
    assert {key: getattr(args, key) for key in words} == words


# ------------------------------------------------------------------- a folder that is not what data.prepare wrote

@pytest.mark.parametrize("manifest,problem", [
    ([], "it holds a JSON list, not an object"),
    ({"version": 1, "files": ["train_000001.bin"]}, "it has no 'tokenizer' name"),  # another tool's manifest.json
    ({"tokenizer": "gpt2", "shards": {"train": "train_000001.bin"}}, "it has no 'shards' list whose entries"),
    ({"tokenizer": "gpt2", "shards": [{"name": "train_000001.bin"}]}, "it has no 'shards' list whose entries"),
    ({"tokenizer": "gpt2", "shards": [], "vocab_size": "50257"}, "its 'vocab_size' is not a whole number"),
    ({"tokenizer": "gpt2", "shards": [], "n_vocab": True}, "its 'n_vocab' is not a whole number"),  # JSON true is
    # an int to Python: a vocabulary of 1 token
])
@pytest.mark.fault
def test_a_manifest_not_written_by_prepare_is_one_sentence_where_it_is_read(tmp_path, manifest, problem):
    from data.loader import data_description
    from data.manifest import data_vocab_size, read_manifest, split_files
    from data.shards import DataError
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    for read in (read_manifest, data_description, data_vocab_size, lambda d: split_files(d, "train")):
        with pytest.raises(DataError) as error:  # (was a KeyError or TypeError in train.py or data/verify.py)
            read(str(tmp_path))
        message = str(error.value)
        assert message.startswith(f"{tmp_path / 'manifest.json'} was not written by data.prepare ({problem}")
        assert "prepare the data again with `python -m data.prepare`" in message and "--adopt" in message
        assert "\n" not in message
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest  # left as it was


@pytest.mark.fault
def test_a_data_directory_that_is_a_file_is_named_a_file(tmp_path):
    from data.manifest import read_manifest, split_files
    from data.shards import DataError
    (tmp_path / "manifest.json").write_text("{}")
    for given in (tmp_path / "manifest.json", tmp_path / "manifest.json" / "below"):
        expected = "is a file, not a folder" if given.name == "manifest.json" else "does not exist"
        for read in (read_manifest, lambda d: split_files(d, "val")):
            with pytest.raises(DataError, match=f"^data directory {given} {expected}; "):
                read(str(given))
