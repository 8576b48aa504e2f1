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
