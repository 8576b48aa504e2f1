"""Behaviour that generated mutants (tools/mutants.py, docs/testing.md) showed no test pinned down: each test
here fails under at least one surviving mutant of the run on the final commit."""
import ast
import errno
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import types

import pytest
import torch

import config
from data import prepare, verify
from data.shards import DataError
from helpers import write_position_shards
from model import GPT, GPTConfig


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
    from config import UserError
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
    from config import UserError
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
    """No ckpt.pt (killed before the first commit, or lost): no shard directory counts as unreferenced, since nothing
    says they are this run's (they may be all that is left of a run, which --resume recovers). A ckpt.pt that cannot
    be read: none is either, so nothing is removed before its own load reports the damage. A readable one: every
    directory it does not name."""
    import checkpoints
    for name in ("step_000004", "step_000008"):
        (tmp_path / checkpoints.SHARDS_DIR / name).mkdir(parents=True)
    assert checkpoints.unreferenced_shard_directories(str(tmp_path)) == []
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert checkpoints.unreferenced_shard_directories(str(tmp_path)) == []
    checkpoints.save(str(tmp_path / "ckpt.pt"), {"shards": {"dir": os.path.join(checkpoints.SHARDS_DIR, "step_000008")}})
    assert checkpoints.unreferenced_shard_directories(str(tmp_path)) == [str(tmp_path / checkpoints.SHARDS_DIR /
                                                                            "step_000004")]


# ----------------------------------------------------------------------------- the fifth session's survivors

def test_a_badly_typed_model_key_in_the_file_is_named_with_its_section(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nn_layer = "two"\n[train]\ndata_dir = "d"\nout_dir = "o"\n')
    with pytest.raises(config.ConfigError) as caught:
        config.resolve(str(path), [], GPTConfig)
    assert "model.n_layer" in str(caught.value)


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


def test_the_verified_shards_record_lives_under_the_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv(verify.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert verify.record_path(tmp_path / "data").startswith(str(tmp_path / "xdg" / "grape" / "verified") + os.sep)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert verify.record_path(tmp_path / "data").startswith(str(tmp_path / "home" / ".cache" / "grape") + os.sep)


def test_the_code_version_is_the_commit_and_dirty_only_for_changed_tracked_files(tmp_path, monkeypatch):
    from training.metrics import code_version

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "tracked.py").write_text("a = 1\n")
    git("add", "tracked.py")
    git("commit", "-q", "-m", "first")
    commit = git("rev-parse", "HEAD")
    # code_version asks git about the repository it lives in; these point git at the one made here instead
    monkeypatch.setenv("GIT_DIR", str(tmp_path / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(tmp_path))
    (tmp_path / "untracked.txt").write_text("an output file\n")
    assert code_version() == commit
    (tmp_path / "tracked.py").write_text("a = 2\n")
    assert code_version() == commit + "-dirty"
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "not-a-repository"))
    assert code_version() == "unknown"


def test_wandb_gets_each_numeric_value_under_its_record_type_at_the_records_iteration(tmp_path, capsys):
    from training.metrics import Metrics
    logged = []
    run = types.SimpleNamespace(log=lambda values, step: logged.append((values, step)))
    metrics = Metrics(str(tmp_path / "metrics.jsonl"), run)
    record = {"type": "train", "iter": 7, "loss": 2.5, "tokens": 1024, "lr": None, "note": "text"}
    metrics.write(record, "step 7")
    assert logged == [({"train/loss": 2.5, "train/tokens": 1024}, 7)]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == record
    assert capsys.readouterr().out == "step 7\n"


def test_a_process_outside_torchrun_makes_no_process_group_and_one_inside_joins_it(monkeypatch):
    import torch.distributed as dist
    from training.distributed import Distributed
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    alone = Distributed("cpu")
    assert (alone.enabled, alone.world_size, dist.is_initialized()) == (False, 1, False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(port))):
        monkeypatch.setenv(name, value)
    launched = Distributed("cpu", timeout_s=60)
    try:
        assert (launched.enabled, launched.is_main, dist.is_initialized(), dist.get_world_size()) == \
            (True, True, True, 1)
    finally:
        launched.close()
    assert not dist.is_initialized()


def test_rotated_planes_keep_the_inputs_dtype_and_round_the_fp32_rotation():
    from positional import rotate_planes
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    angles = torch.linspace(0, 3, 20).view(5, 4)
    rotated = rotate_planes(x, angles)
    x1, x2 = x.float().chunk(2, dim=-1)
    reference = torch.cat((x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()), -1)
    assert rotated.dtype == torch.bfloat16
    assert torch.equal(rotated, reference.to(torch.bfloat16))


def test_a_model_switched_to_the_chunked_loss_computes_the_plain_loss_in_chunks_of_the_default_size(monkeypatch):
    import lm_loss
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, head_dim=8, vocab_size=64, block_size=16))
    tokens, targets = torch.randint(0, 64, (20, 16)), torch.randint(0, 64, (20, 16))  # 320 tokens: two chunks
    _, plain = model(tokens, targets)
    chunk_sizes = []
    real = lm_loss.chunked_cross_entropy
    monkeypatch.setattr(lm_loss, "chunked_cross_entropy",
                        lambda hidden, weight, targets, chunk_tokens: chunk_sizes.append(chunk_tokens)
                        or real(hidden, weight, targets, chunk_tokens))
    model.loss_impl = "chunked"
    _, chunked = model(tokens, targets)
    assert chunk_sizes == [lm_loss.DEFAULT_CHUNK_TOKENS] and lm_loss.DEFAULT_CHUNK_TOKENS < 320
    assert chunked.item() == pytest.approx(plain.item(), rel=1e-6)


@pytest.mark.parametrize("name", ["liger", "cce"])
def test_the_fused_losses_get_the_hidden_states_the_head_and_the_targets(monkeypatch, name):
    """The packages are CUDA-only; stand-ins with their signatures compute the loss from what they are given."""
    import torch.nn.functional as F

    from lm_loss import lm_loss, plain_loss

    def fused(hidden, weight, targets, ignore_index):
        return F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=ignore_index)
    if name == "liger":
        for module in ("liger_kernel", "liger_kernel.transformers"):
            monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
        monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional",
                            types.SimpleNamespace(liger_fused_linear_cross_entropy=fused))
    else:
        monkeypatch.setitem(sys.modules, "cut_cross_entropy", types.SimpleNamespace(linear_cross_entropy=fused))
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, 6, 8, generator=g), torch.randn(40, 8, generator=g)
    targets = torch.randint(0, 40, (2, 6), generator=g)
    targets[0, 0] = -1
    expected = plain_loss(hidden.view(-1, 8), weight, targets.view(-1))
    assert lm_loss(name, hidden, weight, targets).item() == pytest.approx(expected.item(), rel=1e-6)


def test_an_unknown_loss_lists_the_valid_ones():
    from lm_loss import resolve_loss
    with pytest.raises(ValueError, match=r"^unknown loss 'fused'; valid: auto, chunked, plain, liger, cce$"):
        resolve_loss("fused", torch.device("cpu"))


def test_a_ranks_table_with_a_token_that_is_no_merge_names_it():
    from hf.tokenizer_files import merges_from_ranks
    ranks = {bytes([b]): b for b in range(256)}
    ranks[b"ab"] = 256
    assert merges_from_ranks(ranks) == [(b"a", b"b")]
    ranks[b"xyz"] = 257  # neither xy nor yz is a token
    with pytest.raises(ValueError, match=r"^token b'xyz' \(rank 257\) is not one merge of two lower-ranked tokens$"):
        merges_from_ranks(ranks)


def test_optional_packages_are_imported_in_try_blocks_that_re_raise():
    from hf.remote_code import rewrite
    source = "import os\nimport triton\nimport triton.language as tl\n\n\ndef f():\n    import triton\n"
    tree = ast.parse(rewrite(source, set(), "ns"))
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import)]
    assert [ast.unparse(node) for node in imports] == ["import os", "import triton", "import triton.language as tl",
                                                       "import triton"]
    wrapped = [node for node in tree.body if isinstance(node, ast.Try)]
    assert [ast.unparse(node.body[0]) for node in wrapped] == ["import triton", "import triton.language as tl"]
    for node in wrapped:
        (handler,) = node.handlers
        assert ast.unparse(handler.type) == "ImportError" and [type(s) for s in handler.body] == [ast.Raise]
        assert handler.body[0].exc is None  # the ImportError itself, re-raised
    assert isinstance(tree.body[0], ast.Import) and isinstance(tree.body[-1], ast.FunctionDef)


def tiny_export(tmp_path, pos, out="export"):
    """A 1-layer byte model with grouped heads (4 query heads, 2 key/value heads) exported to tmp_path / out."""
    from eval.tiny import save_run
    from hf.export import export
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=4, n_kv_head=2, n_embd=16, head_dim=8, vocab_size=320, block_size=16,
                          pos=pos))
    out = tmp_path / out
    return out, export(save_run(model, str(tmp_path / "run")), str(out), "auto")


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_an_export_is_an_ordinary_directory_with_a_card_that_loads_it(tmp_path, pos):
    out, summary = tiny_export(tmp_path, pos)
    native = pos == "rope"
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(out).st_mode & 0o7777 == 0o777 & ~umask
    assert {name: os.stat(out / name).st_mode & 0o7777 for name in os.listdir(out)} == \
        {name: 0o666 & ~umask for name in os.listdir(out)}
    code = sorted(name for name in os.listdir(out) if name.endswith(".py"))
    assert sorted(summary["code"]) == code and bool(code) == (not native)
    card = (out / "README.md").read_text()
    trust = "" if native else ", trust_remote_code=True"
    assert f"model = AutoModelForCausalLM.from_pretrained(path{trust})\n" in card
    assert f"tokenizer = AutoTokenizer.from_pretrained(path{trust})\n" in card
    no_padding = "The model has no padding mask: batch sequences of one length (or right-pad them without a cache)."
    assert (no_padding in card) == (not native)
    settings = json.loads((out / "config.json").read_text())
    eot = 256  # the byte tokenizer's end-of-text
    assert (settings["bos_token_id"], settings["eos_token_id"]) == (eot, eot)
    sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "head_dim", "max_position_embeddings")
    assert {key: settings[key] for key in sizes} == dict(zip(sizes, (320, 16, 1, 4, 2, 8, 16)))


def test_an_export_whose_tokenizer_cannot_be_written_says_so_and_leaves_nothing(tmp_path, monkeypatch):
    import hf.export

    def unwritable(name, directory, length):
        raise ValueError("the ranks file is damaged")
    monkeypatch.setattr(hf.export, "write_tokenizer", unwritable)
    with pytest.raises(hf.export.ExportError, match=r"^cannot write the tokenizer files: the ranks file is damaged$"):
        tiny_export(tmp_path, "alibi", out="new/parents/export")
    assert sorted(os.listdir(tmp_path)) == ["run"]  # the parents it made too

    def vanished(name, directory, length):  # the partial directory removed by someone else, then a failure
        shutil.rmtree(directory)
        raise ValueError("the ranks file is damaged")
    monkeypatch.setattr(hf.export, "write_tokenizer", vanished)
    with pytest.raises(hf.export.ExportError, match="the ranks file is damaged"):
        tiny_export(tmp_path, "alibi")
    assert sorted(os.listdir(tmp_path)) == ["run"]

    def vanished_disk_full(name, directory, length):  # the same, then an OSError
        shutil.rmtree(directory)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(hf.export, "write_tokenizer", vanished_disk_full)
    with pytest.raises(hf.export.ExportError, match=r"cannot write the export beside .*export \(No space left on "
                                                    r"device\); check the free space and permissions there"):
        tiny_export(tmp_path, "alibi")
    assert sorted(os.listdir(tmp_path)) == ["run"]
