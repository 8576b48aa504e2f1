"""Behaviour that generated mutants (scripts/mutants.py, docs/testing.md) showed no test pinned down: each test
here fails under at least one surviving mutant of the run on the final commit."""
import errno
import json
import os
import socket

import pytest
import torch

import config
from data import prepare, verify
from data.shards import DataError
from helpers import write_position_shards


def test_an_unknown_key_with_no_close_match_lists_every_valid_key():
    assert config.closest_hint("zzzz", ["beta", "alpha"]) == "valid keys: alpha, beta"
    assert config.closest_hint("alpah", ["beta", "alpha"]) == "did you mean 'alpha'?"


def test_a_missing_config_file_names_its_closest_sibling(tmp_path):
    (tmp_path / "tiny.toml").write_text("")
    (tmp_path / "other.toml").write_text("")
    error = config.missing_config(str(tmp_path / "tinny.toml"), resume=False)
    assert str(error) == f"config file {tmp_path / 'tinny.toml'} does not exist; did you mean {tmp_path / 'tiny.toml'}?"
    far = config.missing_config(str(tmp_path / "zzzzzz.toml"), resume=False)
    assert str(far).endswith("does not exist; pick one of the files under configs/.")
    (tmp_path / "a.toml").write_text("")  # named without .toml: the file itself, though "a" is not close to "a.toml"
    bare = config.missing_config(str(tmp_path / "a"), resume=False)
    assert str(bare) == f"config file {tmp_path / 'a'} does not exist; did you mean {tmp_path / 'a'}.toml?"



def test_a_missing_config_named_without_a_folder_is_looked_for_in_the_current_one(tmp_path, monkeypatch):
    (tmp_path / "tiny.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    assert str(config.missing_config("tinny.toml", resume=False)) == \
        "config file tinny.toml does not exist; did you mean tiny.toml?"


@pytest.mark.parametrize("pos, scale", [("grape_m_ctx", 1.0), ("rope + grape_m_ctx", 1.0), ("grape_m_ctx+kv_shift", 1.0),
                                        ("grape_m", 16.0), ("grape_m + kv_shift", 16.0)])
def test_the_official_spectrum_scale_reads_a_composition_with_or_without_spaces(pos, scale):
    assert config.official_spectrum_scale({"pos": pos}) == scale


@pytest.mark.parametrize("endpoint, address", [("https://hub.example", ("hub.example", 443)),
                                               ("http://mirror.example", ("mirror.example", 80)),
                                               ("http://mirror.example:8080", ("mirror.example", 8080))])
def test_the_hub_check_connects_to_the_endpoints_port(monkeypatch, endpoint, address):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    tried = []

    def refuse(target, timeout):
        tried.append(target)
        raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(DataError, match=f"cannot reach the Hugging Face hub at {address[0]}:{address[1]} "):
        prepare._check_hub()
    assert tried == [address]


def test_adopting_a_directory_that_has_a_manifest_points_to_verify(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_position_shards(folder, [40], val_first=100, val_tokens=16)
    with pytest.raises(DataError) as info:
        prepare.adopt(str(folder))
    assert str(info.value) == (f"{folder} already has a manifest.json; `python -m data.prepare --verify {folder}` "
                               "checks its shards against it")


def test_verify_all_reports_a_damaged_header_in_the_shards_own_words(tmp_path, monkeypatch):
    monkeypatch.setattr(verify, "_checked", {})
    folder = tmp_path / "data"
    folder.mkdir()
    write_position_shards(folder, [40, 30], val_first=100, val_tokens=16)
    damaged = folder / "train_000002.bin"
    damaged.write_bytes(damaged.read_bytes()[:100])  # shorter than the header
    count, _, problems = verify.verify_all(str(folder))
    assert count == 3
    assert problems == [f"{damaged}: file has 100 bytes, less than the 1024-byte shard header; it is truncated or "
                        "not a token shard: see the command below"]


def test_export_hub_data_writes_each_tasks_evaluation_split_as_json_lines(tmp_path, monkeypatch, capsys):
    """--export-data on a machine with internet: no test reached it (it downloads); with the hub replaced by rows
    in memory, each task's stock YAML decides the dataset, its name and the split, and every row is written."""
    import datasets

    from eval import tasks
    (tmp_path / "base.yaml").write_text("dataset_path: org/base\nvalidation_split: validation\n")
    (tmp_path / "task_a.yaml").write_text("include: base.yaml\ndataset_name: sub\ntest_split: test\n")
    (tmp_path / "task_b.yaml").write_text("dataset_path: org/b\nvalidation_split: dev\n")
    manager = type("Manager", (), {"task_index": {"a": {"yaml_path": str(tmp_path / "task_a.yaml")},
                                                  "b": {"yaml_path": str(tmp_path / "task_b.yaml")}}})()
    hub = {("org/base", "sub", "test"): [{"q": "é?", "label": 1}, {"q": "two", "label": 0}],
           ("org/b", None, "dev"): [{"text": "x"}]}
    monkeypatch.setattr(datasets, "load_dataset", lambda path, name, split: hub[(path, name, split)])
    out = tmp_path / "out"
    tasks.export_hub_data(manager, ["a", "b"], str(out))
    for task, key in (("a", ("org/base", "sub", "test")), ("b", ("org/b", None, "dev"))):
        lines = (out / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == hub[key]
    assert sorted(os.listdir(out)) == ["a.jsonl", "b.jsonl"]  # no .tmp left behind
    assert f"wrote 2 rows to {out / 'a.jsonl'}" in capsys.readouterr().out


def test_the_native_export_sets_every_qwen3_field_under_its_own_name():
    """A renamed or dropped key of config.json falls back to Qwen3's default silently (attention_bias: False
    today, but a loader's default is not ours to rely on): every Qwen3 field is written, and nothing else but
    rope_theta (older loaders' spelling of rope_parameters' base)."""
    import transformers

    from hf.qwen3 import qwen3_config
    cfg = dict(n_layer=2, vocab_size=100, n_embd=64, n_head=4, head_dim=16, block_size=64, norm_eps=1e-5,
               rope_base=10000.0)
    ours = qwen3_config(cfg, eot=0)
    qwen3_fields = set(transformers.Qwen3Config().to_dict()) - set(transformers.PretrainedConfig().to_dict())
    assert qwen3_fields - set(ours) == set() and ours["model_type"] == "qwen3"
    assert set(ours) - qwen3_fields - {"architectures", "model_type", "dtype", "bos_token_id", "eos_token_id",
                                        "pad_token_id", "tie_word_embeddings"} == {"rope_theta"}
    assert ours["attention_bias"] is False and ours["attention_dropout"] == 0.0


@pytest.mark.parametrize("pos", ["alibi", "grape_a_q", "grape_a_k", "grape_a_qk", "fox"])
def test_the_bf16_lift_splits_exactly_the_query_columns_bf16_cannot_hold(pos):
    """exact_query_columns marks the lifted query columns that need no bf16 split (a constant 1): one marked
    inexact costs the fused kernel extra columns of zeros, one marked exact loses digits. Checked against the
    columns themselves at positions bf16 cannot hold (1000 on)."""
    from model import CausalSelfAttention, GPTConfig
    torch.manual_seed(0)
    H, D, C, T = 2, 8, 16, 12
    attn = CausalSelfAttention(GPTConfig(n_layer=1, n_head=H, n_embd=C, head_dim=D, vocab_size=8, block_size=2048,
                                         pos=pos))
    with torch.no_grad():
        q, k = torch.randn(1, H, T, D), torch.randn(1, H, T, D)
        qf, kf = attn.bias.features(torch.randn(1, T, C), q, k, torch.arange(1000, 1000 + T), {})
        q_cols = attn.bias.lift(qf, kf)[0]
    held = [bool((q_cols[..., c] == q_cols[..., c].bfloat16().float()).all()) for c in range(q_cols.shape[-1])]
    assert tuple(held) == tuple(attn.bias.exact_query_columns())


def test_the_default_corpus_never_rebuilds_over_a_directory_it_did_not_make(tmp_path):
    """A directory whose manifest has no preparation config (an adopted llm.c copy) is someone's data: refused in
    one sentence and left as it was, not deleted as a stale cache of the embedded corpus."""
    folder = tmp_path / "adopted"
    folder.mkdir()
    write_position_shards(folder, [40], val_first=100, val_tokens=16)
    before = {name: (folder / name).read_bytes() for name in os.listdir(folder)}
    with pytest.raises(DataError, match="already holds data prepared with other arguments; use another --out"):
        prepare.ensure_default_corpus(str(folder), progress_bar=False)
    assert {name: (folder / name).read_bytes() for name in os.listdir(folder)} == before


def test_run_directories_looks_max_depth_levels_down_and_past_unreadable_folders(tmp_path, monkeypatch):
    for run in ("a/b/c", "a/b/c2/d", "z/run"):  # 3 levels, 4 levels, and one after an unreadable folder
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "ckpt.pt").write_bytes(b"")
    (tmp_path / "m").mkdir()  # visited before z
    assert config.run_directories(str(tmp_path), max_depth=3) == [str(tmp_path / "a/b/c"), str(tmp_path / "z/run")]
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: (_ for _ in ()).throw(PermissionError(path))
                        if os.path.basename(path) == "m" else real(path))
    assert config.run_directories(str(tmp_path), max_depth=3) == [str(tmp_path / "a/b/c"), str(tmp_path / "z/run")]


def test_prepare_offers_its_tokenizers_and_every_txt_unit_on_the_command_line(capsys):
    args = prepare.parse_args(["--default", "--txt-sample-by", "paragraph"])
    assert args.txt_sample_by == "paragraph"
    with pytest.raises(SystemExit):
        prepare.parse_args(["--default", "--tokenizer", "nope"])
    assert "argument --tokenizer: invalid choice: 'nope'" in capsys.readouterr().err


def test_zero_shot_names_a_missing_data_dir_and_the_files_it_needs(tmp_path):
    import types

    from eval import tasks, zero_shot
    from eval.checkpoint import UserError
    with pytest.raises(UserError) as info:
        zero_shot.run(types.SimpleNamespace(data_dir=str(tmp_path / "missing")))
    assert str(info.value) == f"--data-dir {tmp_path / 'missing'} is not a directory.\n" + \
        tasks.expected_files_message()


def test_the_chunked_loss_probe_extrapolates_linearly_past_two_chunks(monkeypatch):
    """Past two chunks the planner extrapolates the loss's memory from one and two chunks (a probe of every
    length would loop over all chunks): for a loss whose probed bytes grow linearly, the extrapolation is exact."""
    from training import memory
    monkeypatch.setattr(memory, "_probe_loss", lambda cfg, tokens, *rest: 1000 + 7 * tokens)
    chunk = 64
    for tokens in (2 * chunk + 1, 5 * chunk, 5 * chunk + 13):
        assert memory.probe_loss(None, tokens, "chunked", chunk, False) == 1000 + 7 * tokens
    assert memory.probe_loss(None, 100, "plain", chunk, False) == 1000 + 700


def test_extrapolation_reads_the_runs_resolved_data_directory(tmp_path):
    from eval import extrapolation
    run, data = tmp_path / "run", tmp_path / "data"
    run.mkdir()
    data.mkdir()
    (run / "config.json").write_text(json.dumps({"data_dir_resolved": str(data)}))
    assert extrapolation.resolve_data_dir(str(run), {"train_config": {"data_dir": "elsewhere"}}, None) == str(data)
    assert extrapolation.resolve_data_dir(str(run), {}, "given") == "given"


def test_the_extrapolation_report_has_a_passkey_table_for_each_run_that_has_one():
    from eval import extrapolation
    contexts = {"64": {"nonoverlapping": {"mean": 3.0, "mean_beyond_train_context": None},
                       "sliding": {"mean": 2.9, "stride": 16}}}
    with_keys = {"name": "a", "encoding": "rope", "train_context": 64, "contexts": contexts,
                 "passkey": {"trials": 4, "depths": [0.0, 1.0], "actual_lengths": [60], "accuracy": [[1.0, 0.5]]}}
    without = {"name": "b", "encoding": "alibi", "train_context": 64, "contexts": contexts}
    report = extrapolation.markdown_report([with_keys, without])
    assert "## Passkey retrieval accuracy: a (rope, L = 64, 4 keys per cell)" in report
    assert "| 60 | 1.00 | 0.50 |" in report and "accuracy: b" not in report


def test_a_negative_batch_index_is_one_sentence_for_both_samplers(tmp_path, monkeypatch):
    from data.loader import RandomOffsetBatches, TrainBatches
    monkeypatch.setattr(verify, "_checked", {})
    folder = tmp_path / "data"
    folder.mkdir()
    write_position_shards(folder, [40, 30], val_first=100, val_tokens=16)
    for sampler in (RandomOffsetBatches(str(folder), 2, 8, seed=1, global_batch_size=4, layout=(1, 2)),
                    TrainBatches(str(folder), 2, 8, seed=1)):
        with pytest.raises(DataError) as info:
            sampler.batch(-1)
        assert str(info.value) == "batch index must be >= 0 (got -1)", type(sampler).__name__


def test_the_loss_by_position_refuses_a_split_shorter_than_one_window():
    from eval import extrapolation
    from eval.checkpoint import UserError
    with pytest.raises(UserError, match="the validation split has 64 tokens, too few for one window of 64"):
        extrapolation.nonoverlapping_loss(None, torch.zeros(64, dtype=torch.long), 64)


def test_extrapolation_falls_back_to_the_embedded_corpus_of_the_checkpoints_tokenizer(tmp_path, monkeypatch):
    from data import prepare as prepare_module
    from eval import extrapolation
    asked = []
    monkeypatch.setattr(prepare_module, "ensure_default_corpus", lambda **kw: asked.append(kw) or "corpus")
    ckpt = {"tokenizer": "bytes", "train_config": {"data_dir": "default"}}
    assert extrapolation.resolve_data_dir(str(tmp_path / "no-run"), ckpt, None) == "corpus"
    assert asked == [{"tokenizer": "bytes", "progress_bar": False}]


def test_peak_memory_names_what_it_measured_on_each_device(monkeypatch):
    """metrics.jsonl's peak memory: CUDA's max allocated bytes on a GPU, the process's max RSS (KiB on Linux)
    elsewhere, each with the name of what was measured."""
    import resource
    from training import metrics
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**30)
    assert metrics.peak_memory(torch.device("cuda")) == {"peak_memory_gb": 3.0, "memory_kind": "cuda max allocated"}
    monkeypatch.setattr(resource, "getrusage", lambda who: type("Usage", (), {"ru_maxrss": 2**20 // 2})())
    assert metrics.peak_memory(torch.device("cpu")) == {"peak_memory_gb": 0.5, "memory_kind": "process max RSS"}


def test_shard_directories_without_a_readable_checkpoint(tmp_path):
    """No ckpt.pt yet (killed before the first commit): every shard directory is unreferenced. A ckpt.pt that cannot
    be read: none is, so nothing is removed before its own load reports the damage."""
    import checkpoints
    for name in ("step_000004", "step_000008"):
        (tmp_path / checkpoints.SHARDS_DIR / name).mkdir(parents=True)
    assert checkpoints.unreferenced_shard_directories(str(tmp_path)) == [
        str(tmp_path / checkpoints.SHARDS_DIR / "step_000004"), str(tmp_path / checkpoints.SHARDS_DIR / "step_000008")]
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert checkpoints.unreferenced_shard_directories(str(tmp_path)) == []
