"""eval/long_context.py: RULER and BABILong through lm-eval's own task definitions and metrics, inputs longer than
the training context through the adapter, position rescaling, local data and the offline messages.

lm-eval's RULER module builds a 10-million-entry word list when it is imported (about 20 s of CPU); the tests that
need it share one import.
"""
import dataclasses
import json
import os
import re
import shutil
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from data.tokenizer import get_tokenizer
from eval import long_context
from eval.lm_adapter import GrapeLM
from eval.long_context_tasks import (BABILONG_TASKS, ESSAY_TASKS, LONG_CONTEXT_TASKS, RULER_TASKS, export_data,
                                     local_sources, missing_files)
from eval.tiny import save_run, tiny_model
from model import GPT, GPTConfig
from positional import ENCODINGS

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "long_context"


def request(*args):
    return SimpleNamespace(args=args)


# ----------------------------------------------------------------------------- inputs longer than block_size

def cached_forward_logprobs(model, tokens, first_target):
    """log p(tokens[t] | tokens[:t]) for t >= first_target from one call of the model's own cached forward."""
    cache = model.new_cache(1, len(tokens))
    with torch.no_grad():
        logits, _ = model(torch.tensor([tokens[:-1]]), cache=cache)
    logprobs = F.log_softmax(logits[0, first_target - 1:].double(), dim=-1)
    targets = torch.tensor(tokens[first_target:])
    return logprobs.gather(-1, targets[:, None])[:, 0], (logits[0, first_target - 1:].argmax(-1) == targets).all()


def cached_greedy(model, prompt, max_new, n_vocab, eot):
    """Greedy continuation through the model's own KV cache (one prefill, then one token per step)."""
    cache = model.new_cache(1, len(prompt) + max_new)
    out = []
    with torch.no_grad():
        logits, _ = model(torch.tensor([prompt]), cache=cache)
        for _ in range(max_new):
            token = int(logits[0, -1, :n_vocab].argmax())
            if token == eot:
                break
            out.append(token)
            logits, _ = model(torch.tensor([[token]]), cache=cache)
    return out


@pytest.mark.parametrize("pos,kv_shift", [(pos, False) for pos in ENCODINGS] + [("rope+grape_ap", True),
                                                                                 ("grape_m_ctx+fox", True)])
def test_inputs_longer_than_block_size_match_the_models_cached_forward(pos, kv_shift, one_thread):
    """Log-likelihoods and greedy tokens of inputs 4-6x the training context, through the adapter (in chunks of the
    training context, batched and right-padded), equal the model's own cached forward; and no forward pass reads
    more than a chunk (the old adapter read each input whole)."""
    block = 16
    model = tiny_model(pos=pos, block_size=block, seed=5, n_layer=2, n_embd=32, n_head=2, kv_shift=kv_shift)
    tok = get_tokenizer("byte")
    lm = GrapeLM(model=model, tokenizer=tok, batch_size=2, max_length=8 * block)
    widths = []
    hook = model.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    try:
        pairs = [("In the long run the ship came home to port after", " many days"),
                 ("A shorter context, still past the window", " ends here"),
                 ("Weights and measures of the old town hall were kept in the cellar by", " the clerk")]
        scored = lm.loglikelihood([request(c, x) for c, x in pairs])
        prompts = [pairs[0][0], pairs[0][0][::-1], pairs[2][0]]
        texts = lm.generate_until([request(p, {"until": [], "max_gen_toks": 12}) for p in prompts])
    finally:
        hook.remove()
    assert widths and max(widths) <= block, f"a forward pass read {max(widths)} tokens"
    for (context, continuation), (logprob, greedy) in zip(pairs, scored):
        tokens = tok.encode(context) + tok.encode(continuation)
        assert len(tokens) > 2 * block
        reference, reference_greedy = cached_forward_logprobs(model, tokens, len(tok.encode(context)))
        assert logprob == pytest.approx(reference.sum().item(), abs=1e-4, rel=1e-5)
        assert greedy == bool(reference_greedy)
    for prompt, text in zip(prompts, texts):
        expected = cached_greedy(model, tok.encode(prompt), 12, tok.n_vocab, tok.eot_token)
        assert text == tok.decode(expected)


def test_loglikelihood_of_long_inputs_equals_the_full_forward_for_a_continuation_across_chunks(one_thread):
    """A continuation that starts in one chunk and ends in another is scored whole (the kept logits span chunks)."""
    model = tiny_model(pos="alibi", block_size=8, seed=2, n_layer=1, n_embd=32, n_head=2)
    tok = get_tokenizer("byte")
    lm = GrapeLM(model=model, tokenizer=tok, batch_size=1, max_length=64)
    context, continuation = "abcdefghijklmn", "opqrstuvwxyz0123"
    tokens = tok.encode(context + continuation)
    with torch.no_grad():
        logits, _ = model(torch.tensor([tokens[:-1]]))
    logprobs = F.log_softmax(logits[0, len(context) - 1:].double(), dim=-1)
    expected = logprobs.gather(-1, torch.tensor(tokens[len(context):])[:, None]).sum().item()
    assert lm.loglikelihood([request(context, continuation)])[0][0] == pytest.approx(expected, abs=1e-4)


def test_last_logits_are_the_full_forwards_last_positions():
    model = tiny_model(pos="fox", block_size=16, seed=4, kv_shift=True)
    idx = torch.randint(0, 257, (2, 20), generator=torch.Generator().manual_seed(0))
    full = model(idx)[0]
    for n in (0, 1, 7, 20):
        torch.testing.assert_close(model(idx, last_logits=n)[0], full[:, 20 - n:], atol=1e-6, rtol=1e-5)
    cache = model.new_cache(2, 20)
    first = model(idx[:, :12], cache=cache, last_logits=0)[0]
    rest = model(idx[:, 12:], cache=cache, last_logits=3)[0]
    assert first.shape == (2, 0, 320)
    torch.testing.assert_close(rest, full[:, 17:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cannot be combined"):
        model(idx, idx, last_logits=1)


# ----------------------------------------------------------------------------- positions beyond the training context

def test_rope_scaling_ntk_is_a_larger_base_and_linear_divides_every_frequency():
    torch.manual_seed(0)
    idx = torch.randint(0, 257, (1, 40))
    model = tiny_model(pos="rope", block_size=16, seed=3)
    before = model(idx)[0]
    s, d = 4.0, model.config.head_dim
    wider = GPT(GPTConfig(**dataclasses.asdict(model.config) | {"rope_base": model.config.rope_base * s ** (d / (d - 2))}))
    wider.load_state_dict(model.state_dict())
    with long_context.rescaled_rotations(model, s, "ntk"):
        torch.testing.assert_close(model(idx)[0], wider(idx)[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(idx)[0], before, atol=0, rtol=0)  # restored exactly
    positions = torch.arange(40)
    for config in (dict(pos="grape_m"), dict(pos="grape_m", spectrum_scale=16.0), dict(pos="rope")):
        m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, head_dim=16, vocab_size=320, block_size=16, **config))
        rotation = m.blocks[0].attn.rotation
        plain = rotation.angles(None, positions, {})
        with long_context.rescaled_rotations(m, s, "linear"):
            torch.testing.assert_close(rotation.angles(None, positions, {}), plain / s, atol=1e-5, rtol=1e-5)
        with long_context.rescaled_rotations(m, 1.0, "linear"), long_context.rescaled_rotations(m, s, "none"):
            torch.testing.assert_close(rotation.angles(None, positions, {}), plain, atol=0, rtol=0)
    alibi = tiny_model(pos="alibi", block_size=16, seed=3)
    reference = alibi(idx)[0]
    with long_context.rescaled_rotations(alibi, s, "linear"):  # nothing to rescale
        torch.testing.assert_close(alibi(idx)[0], reference, atol=0, rtol=0)


# ----------------------------------------------------------------------------- offline

def test_offline_without_the_data_names_the_missing_files_in_one_sentence(tmp_path, monkeypatch, capsys):
    import lm_eval.tasks
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda *a, **k: pytest.fail("lm-eval was started"))
    run = save_run(tiny_model(block_size=256), str(tmp_path / "run"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit) as exit_info:
        long_context.main(["--ckpt", run, "--lengths", "1x,8x"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
    expected = ["DIR/ruler/paul_graham_essays.jsonl", "DIR/nltk_data/tokenizers/punkt_tab", "DIR/ruler/dev-v2.0.json",
                "DIR/ruler/hotpot_dev_distractor_v1.json"]
    expected += [f"DIR/babilong/{split}/qa{k}.jsonl" for split in ("0k", "2k") for k in range(1, 6)]  # 256 and 2048
    for path in expected:
        assert path in err, path
    assert "HF_HUB_OFFLINE" in err and "--export-data DIR" in err and "--skip-missing" in err
    assert "niah_single_1,niah_multikey_2,niah_multikey_3,ruler_vt,ruler_cwe,ruler_fwe" in err
    # a local folder with part of the data: the rest is named with its path
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / "babilong", data / "babilong")
    with pytest.raises(SystemExit):
        long_context.main(["--ckpt", run, "--lengths", "1x,4x", "--tasks", "babilong,niah_single_1",
                           "--data-dir", str(data)])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{data}/babilong/1k/qa2.jsonl" in err and "qa1" not in err.replace("qa1,", "")
    assert "5 task(s)" not in err and "4 task(s) (babilong_qa2, babilong_qa3, babilong_qa4, babilong_qa5)" in err


def test_lm_eval_cli_hands_ruler_the_runs_tokenizer_and_refuses_what_cannot_run(tmp_path, monkeypatch):
    from config import UserError
    from eval.lm_eval_cli import prepare_long_context
    from eval.long_context_tasks import PROBE_TEXT
    from transformers import AutoTokenizer

    run = save_run(tiny_model(block_size=64), str(tmp_path / "run"))
    args = SimpleNamespace(model="grape", model_args={"ckpt": run}, tasks=["niah_single_1,ruler_vt"],
                           metadata={"max_seq_lengths": [512, 1024]})
    prepare_long_context(args, None, str(tmp_path))
    assert args.model_args["max_length"] == 1024
    hf = AutoTokenizer.from_pretrained(args.model_args["tokenizer"])
    assert hf(PROBE_TEXT, add_special_tokens=False).input_ids == get_tokenizer("byte").encode(PROBE_TEXT)
    babilong = SimpleNamespace(model="grape", model_args={"ckpt": run}, tasks="babilong_longctx",
                               metadata={"max_seq_lengths": "4k"})
    with monkeypatch.context() as online:  # (lm-eval would download the data)
        online.setattr(long_context, "hub_offline_reason", lambda: None)
        prepare_long_context(babilong, None, str(tmp_path))
    assert babilong.model_args == {"ckpt": run, "max_length": 8192}  # twice the split: its prompts are not cut
    both = SimpleNamespace(model="grape", model_args={"ckpt": run}, tasks="niah_single_1,babilong_qa1",
                           metadata={"max_seq_lengths": [512]})
    with pytest.raises(UserError, match="BABILong reads one split"):
        prepare_long_context(both, None, str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = SimpleNamespace(model="grape", model_args={"ckpt": run}, tasks="ruler_qa_squad", metadata={})
    with pytest.raises(UserError, match=r"offline .*DIR/ruler/dev-v2\.0\.json.*--export-data DIR") as error:
        prepare_long_context(offline, None, str(tmp_path))
    assert "--skip-missing" not in str(error.value)  # not an option of that command


# ----------------------------------------------------------------------------- local data (made by --export-data)

SQUAD = {"data": [{"title": "t", "paragraphs": [
    {"context": "The river Elm flows north past the mill.",
     "qas": [{"question": "Which way does the Elm flow?", "is_impossible": False, "answers": [{"text": "north"}]}]},
    {"context": "The mill was built of grey stone in 1820.",
     "qas": [{"question": "When was the mill built?", "is_impossible": False, "answers": [{"text": "1820"}]}]}]}]}
HOTPOT = [{"question": "Who built the mill?", "answer": "Ada", "context": [["Mill", ["Ada built the mill."]],
                                                                             ["Elm", ["The Elm is a river."]]]}]
ESSAYS = [{"text": "First essay. It has two   sentences."}, {"text": "Second essay,\nwith a line break."}]


def fake_downloads(monkeypatch):
    """The network the export reads, answered from the constants above (and the BABILong fixtures)."""
    import datasets
    import nltk
    import requests

    def load_dataset(path, name=None, split=None, **kwargs):
        if path == "baber/paul_graham_essays":
            return list(ESSAYS)
        if path == "RMT-team/babilong-1k-samples":
            return [json.loads(line) for line in (FIXTURES / "babilong" / "0k" / "qa1.jsonl").open()]
        raise AssertionError(path)

    def get(url, timeout=None):
        body = json.dumps(SQUAD if "squad" in url.lower() or "SQuAD" in url else HOTPOT).encode()
        return SimpleNamespace(content=body, raise_for_status=lambda: None)

    def download(name, download_dir=None, quiet=False):
        os.makedirs(os.path.join(download_dir, "tokenizers", name), exist_ok=True)
        return True

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(requests, "get", get)
    monkeypatch.setattr(nltk, "download", download)


def test_exported_data_is_what_lm_evals_own_readers_get(tmp_path, monkeypatch):
    """--export-data writes every file the tasks read; then lm-eval's own readers (RULER's essay haystack and QA
    documents, BABILong's loader) return exactly that data, and only while the local sources are open."""
    import importlib

    data = tmp_path / "data"
    with monkeypatch.context() as mp:
        fake_downloads(mp)
        written = export_data(str(data), ["0k", "1k"])
    assert len(written) == 4 + 2 * len(BABILONG_TASKS)
    assert missing_files(list(LONG_CONTEXT_TASKS), ["0k", "1k"], str(data)) == {}
    assert set(missing_files(list(LONG_CONTEXT_TASKS), ["2k"], str(data))) == set(BABILONG_TASKS)

    import datasets

    niah_utils = importlib.import_module("lm_eval.tasks.ruler.niah_utils")
    qa_utils = importlib.import_module("lm_eval.tasks.ruler.qa_utils")
    babilong = importlib.import_module("lm_eval.tasks.babilong.common_utils")
    download_json = qa_utils.download_json
    with local_sources(niah_utils.niah_single_2, str(data)):
        words = niah_utils.get_haystack("essay")
    assert words == " ".join(e["text"] for e in ESSAYS).split()  # the essays, whitespace collapsed as lm-eval does
    with local_sources(qa_utils.get_squad, str(data)):
        qas, docs = qa_utils.read_squad()
        hotpot_qas, hotpot_docs = qa_utils.read_hotpotqa()
    assert sorted(docs) == sorted(p["context"] for p in SQUAD["data"][0]["paragraphs"])
    assert [(q["query"], q["outputs"]) for q in qas] == [("Which way does the Elm flow?", ["north"]),
                                                         ("When was the mill built?", ["1820"])]
    assert [(q["query"], q["outputs"]) for q in hotpot_qas] == [("Who built the mill?", ["Ada"])]
    assert sorted(hotpot_docs) == ["Elm\nThe Elm is a river.", "Mill\nAda built the mill."]
    with local_sources(babilong.load_dataset, str(data)):
        rows = babilong.load_dataset(max_seq_lengths="1k", qa_split="qa3")["qa3"]
    assert [dict(r) for r in rows] == [json.loads(line) for line in (FIXTURES / "babilong/0k/qa1.jsonl").open()]
    # afterwards the readers are lm-eval's again, and nothing local stays cached for a later run
    assert qa_utils.download_json is download_json and babilong.datasets is datasets
    assert niah_utils.get_haystack.__wrapped__.__globals__["datasets"] is datasets
    assert niah_utils.get_haystack.cache_info().currsize == 0 and qa_utils.read_squad.cache_info().currsize == 0


# ----------------------------------------------------------------------------- lm-eval's tasks end to end

def gpt2_tokenizer_or_skip():
    from data.shards import DataError
    try:
        return get_tokenizer("gpt2")
    except DataError:
        pytest.skip("no GPT-2 ranks on this machine (CI installs them)")


def right_answer(prompt, babilong_rows):
    """The reference answers of a RULER or BABILong prompt, read from the prompt itself (and the fixture)."""
    query = re.search(r"The special magic number for (\S+) mentioned in the provided text is$", prompt)
    if query:
        needles = dict(re.findall(r"One of the special magic numbers for (\S+) is: (\d+)\.", prompt))
        return [needles[query.group(1)]]
    value = re.findall(r"are assgined the value (\d+), they are:$", prompt)
    if value:
        assigned = re.findall(r"VAR (\w+) = (VAR \w+|\d+)", prompt)
        names, frontier = [], {value[0]}
        while frontier:
            new = [name for name, source in assigned if source.removeprefix("VAR ") in frontier and name not in names]
            names += new
            frontier = set(new)
        return names
    row = next(r for r in babilong_rows if r["input"].strip() in prompt and prompt.rstrip().endswith(r["question"]))
    return [row["target"]]


def string_match(answer, references):
    """RULER's and BABILong's rule, from their papers: the share of the references found in the answer."""
    return sum(r.lower() in answer.lower() for r in references) / len(references)


def test_ruler_and_babilong_through_lm_eval_are_scored_by_its_metrics_and_tabled_as_it_reports(
        tmp_path, monkeypatch, one_thread):
    """niah_single_1 and variable tracking (RULER) and BABILong qa1, from local files, on a tiny GPT-2-tokenized
    model trained at 256 tokens, at 512 and 1024: an oracle that answers some prompts fully, some partly and leaves
    the rest to the model gives scores strictly between 0 and 100; each equals the string-match rule recomputed
    from lm-eval's samples, lm-eval's own result, and the markdown table; the prompts are longer than block_size
    and nothing is cut."""
    import lm_eval

    tok = gpt2_tokenizer_or_skip()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, head_dim=16, vocab_size=50304, block_size=256))
    run = tmp_path / "run"
    run.mkdir()
    import checkpoints
    checkpoints.save(str(run / "ckpt.pt"), {"model": model.state_dict(), "model_config": dataclasses.asdict(model.config),
                                            "tokenizer": "gpt2", "step": 7, "train_config": {}})
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / "babilong", data / "babilong")
    babilong_rows = [json.loads(line) for split in ("0k", "1k") for line in (data / "babilong" / split / "qa1.jsonl").open()]

    original = GrapeLM.generate_batch

    def oracle(self, prompts, **settings):
        texts, counts = original(self, prompts, **{**settings, "return_counts": True})  # the model runs as usual
        answers = []
        for ids, text in zip(prompts, texts):
            prompt = self.tok_decode(ids)
            references, kind = right_answer(prompt, babilong_rows), zlib.crc32(prompt.encode()) % 3
            answers.append(" " + ", ".join(references) if kind == 0 else
                           " " + ", ".join(references[:2]) if kind == 1 and len(references) > 2 else text)
        return (answers, counts) if settings.get("return_counts") else answers

    returned = {}  # (task, length) -> what lm_eval.simple_evaluate returned
    real_evaluate = lm_eval.simple_evaluate

    def recording_evaluate(*args, **kwargs):
        task, length = Path(kwargs["tasks"][0]).stem.rsplit("_", 1)  # long_context writes TASK_LENGTH.yaml
        returned[task, int(length)] = real_evaluate(*args, **kwargs)
        return returned[task, int(length)]

    monkeypatch.setattr(GrapeLM, "generate_batch", oracle)
    monkeypatch.setattr(lm_eval, "simple_evaluate", recording_evaluate)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reports = long_context.main(["--ckpt", str(run), "--lengths", "2x,4x", "--tasks", "niah_single_1,ruler_vt,babilong_qa1",
                                 "--limit", "6", "--data-dir", str(data), "--log-samples", "--batch-size", "2"])
    report = reports[0]
    saved = json.loads((run / "eval" / "long_context.json").read_text())
    markdown = (run / "eval" / "long_context.md").read_text()
    assert (run / "eval" / "long_context.png").stat().st_size > 0
    assert saved["lengths"] == [512, 1024] and saved["train_context"] == 256 and saved["step"] == 7

    # variable tracking cannot be built at 512 with GPT-2 (lm-eval's in-context example alone takes ~500)
    assert saved["scores"]["ruler_vt"]["512"]["score"] is None and "not run: needs at least" in \
        saved["scores"]["ruler_vt"]["512"]["status"]
    assert sorted(returned) == [("babilong_qa1", 512), ("babilong_qa1", 1024), ("niah_single_1", 512),
                                ("niah_single_1", 1024), ("ruler_vt", 1024)]
    mixed = 0
    for task, length in [("niah_single_1", 512), ("niah_single_1", 1024), ("ruler_vt", 1024), ("babilong_qa1", 512),
                         ("babilong_qa1", 1024)]:
        samples = [json.loads(line) for line in (run / "eval" / "long_context_samples" / f"{task}_{length}.jsonl").open()]
        assert len(samples) == (6 if task != "babilong_qa1" else 5)
        references = [s["target"] if isinstance(s["target"], list) else [s["target"]] for s in samples]
        expected = 100 * sum(string_match(s["answer"].strip(), r) for s, r in zip(samples, references)) / len(samples)
        cell = saved["scores"][task][str(length)]
        assert cell["score"] == pytest.approx(expected, abs=1e-9) and cell["n"] == len(samples)
        mixed += 0 < expected < 100
        metric = str(length) if task in RULER_TASKS else "acc"
        entry = returned[task, length]["results"][task]
        assert cell["score"] == pytest.approx(100 * entry[f"{metric},none"], abs=1e-9)  # lm-eval's own number
        row = next(line for line in markdown.splitlines() if line.startswith(f"| {task} |"))
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert cells[saved["lengths"].index(length)].split(" ")[0] == f"{100 * entry[f'{metric},none']:.1f}"
        if task in RULER_TASKS:
            for s in samples:  # longer than the training context, and not cut: prompt + answer fit the length
                n = len(tok.encode(s["prompt"]))
                assert 256 < n <= length
    assert mixed >= 3
    ruler_row = next(line for line in markdown.splitlines() if line.startswith("| **RULER average"))
    assert "(1 of 13)" in ruler_row and "(2 of 13)" in ruler_row
    assert saved["ruler_average"]["1024"] == pytest.approx(
        (saved["scores"]["niah_single_1"]["1024"]["score"] + saved["scores"]["ruler_vt"]["1024"]["score"]) / 2)
    assert saved["scores"]["babilong_qa1"]["512"]["split"] == "0k" and saved["scores"]["babilong_qa1"]["1024"]["split"] == "1k"
    # the model read every prompt token: the counted tokens are the samples' prompts, encoded
    for length in (512, 1024):
        tasks = ["niah_single_1", "babilong_qa1"] + (["ruler_vt"] if length == 1024 else [])
        prompts = [json.loads(line)["prompt"] for t in tasks
                   for line in (run / "eval" / "long_context_samples" / f"{t}_{length}.jsonl").open()]
        assert saved["speed"][str(length)]["prompt_tokens"] == sum(len(tok.encode(p)) for p in prompts)
        assert saved["speed"][str(length)]["requests"] == len(prompts)
    assert report["scores"] == saved["scores"]


# ----------------------------------------------------------------------------- the study runner

def test_a_study_reports_long_context_with_seeds_and_paired_intervals(tmp_path, monkeypatch, one_thread):
    """A study of two encodings x two seeds with [eval.long_context] (niah_single_1 and BABILong qa1 at 512 tokens,
    16x the tiny model's context): report.json's means, sample stds and paired t-intervals equal those computed here
    from each run's eval/long_context.json, and report.md shows them. An oracle answers some prompts right, chosen
    by the run's weights, so the runs differ."""
    import math

    import study
    from tests.helpers import synthetic_corpus, tiny_config

    data = synthetic_corpus(tmp_path, 20, 600)
    (tmp_path / "base.toml").write_text(tiny_config(data, eval_interval=3, eval_windows=4))
    local = tmp_path / "long_context_data"
    shutil.copytree(FIXTURES / "babilong", local / "babilong")
    (tmp_path / "study.toml").write_text(f'''base = "base.toml"
encodings = ["rope", "alibi"]
seeds = [1, 2]
out_dir = "out"

[eval.long_context]
lengths = [512]
tasks = ["niah_single_1", "babilong_qa1"]
data_dir = "{local}"
limit = 4
''')
    babilong_rows = [json.loads(line) for line in (local / "babilong" / "0k" / "qa1.jsonl").open()]
    original = GrapeLM.generate_batch

    runs_seen = {}  # each run's model, numbered in the order the study evaluates them

    def oracle(self, prompts, **settings):
        texts, counts = original(self, prompts, **{**settings, "return_counts": True})
        run = runs_seen.setdefault(self.model.config.pos + repr(self.model.wte.weight[0, 0].item()), len(runs_seen))
        # run k answers the first k² prompts of each call right: the runs' scores differ whatever their weights
        # (a hash of the prompt and the weights made them differ or not by chance)
        answers = [" " + right_answer(self.tok_decode(ids), babilong_rows)[0] if i < run * run else text
                   for i, (ids, text) in enumerate(zip(prompts, texts))]
        return (answers, counts) if settings.get("return_counts") else answers

    monkeypatch.setattr(GrapeLM, "generate_batch", oracle)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    report = study.main(["study.toml"])

    runs = {(e, s): json.loads((tmp_path / "out" / e / f"seed{s}" / "eval" / "long_context.json").read_text())
            for e in ("rope", "alibi") for s in (1, 2)}
    for encoding in ("rope", "alibi"):
        lc = report["encodings"][encoding]["long_context"]
        for family, task in (("ruler", "niah_single_1"), ("babilong", "babilong_qa1")):
            values = [runs[encoding, s]["scores"][task]["512"]["score"] for s in (1, 2)]
            assert lc[f"{family}_average"]["512"]["values"] == values  # one task: the average is its score
            assert lc[f"{family}_average"]["512"]["mean"] == pytest.approx(sum(values) / 2)
            assert lc[f"{family}_average"]["512"]["std"] == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2))
            assert lc["tasks"][task]["512"]["values"] == values
    spread = 0
    for family, task in (("ruler", "niah_single_1"), ("babilong", "babilong_qa1")):
        d = [runs["alibi", s]["scores"][task]["512"]["score"] - runs["rope", s]["scores"][task]["512"]["score"]
             for s in (1, 2)]
        diff = report["encodings"]["alibi"]["long_context"]["difference_to_reference"][family]["512"]
        half_width = math.tan(math.pi * 0.475) * abs(d[0] - d[1]) / math.sqrt(2) / math.sqrt(2)  # t with 1 dof
        assert diff["values"] == pytest.approx(d) and diff["seeds"] == [1, 2]
        assert diff["interval"] == pytest.approx([sum(d) / 2 - half_width, sum(d) / 2 + half_width], abs=1e-9)
        spread += d[0] != d[1]
        markdown = (tmp_path / "out" / "report.md").read_text()
        label = "RULER" if family == "ruler" else "BABILong"
        row = next(line for line in markdown.splitlines() if line.startswith(f"| alibi − rope | {label} |"))
        assert f"{sum(d) / 2:+.2f} [{sum(d) / 2 - half_width:+.2f}, {sum(d) / 2 + half_width:+.2f}]" in row
    assert spread >= 1  # the oracle made the seeds differ somewhere
    assert "- Long context: RULER and BABILong through lm-eval at 512 (16×) tokens; 2 tasks, the first 4 documents" \
        in markdown
    assert "| rope | RULER | " in markdown and "(1 of 13)" in markdown
    assert (tmp_path / "out" / "long_context.png").read_bytes()[:4] == b"\x89PNG"


def test_lengths_are_factors_of_the_training_context_rounded_to_the_nearest_token_or_token_counts():
    from eval.long_context import parse_lengths, resolve_lengths
    assert parse_lengths(" 0.7x, 1x,2x ,8192,") == [(0.7, None), (1.0, None), (2.0, None), (None, 8192)]
    # 0.7 x 1024 = 716.8: 717 tokens, not 716; a factor and a count naming the same length are one length
    assert resolve_lengths(parse_lengths("0.7x,1x,2x,8192,1024"), 1024) == [717, 1024, 2048, 8192]
    assert resolve_lengths(parse_lengths("1.5x,0.3x"), 1000) == [300, 1500]
    assert resolve_lengths(parse_lengths("0.26x"), 100) == [26]  # 26.000000000000004
    assert resolve_lengths(parse_lengths("0.999x"), 1000) == [999]
    for bad in ("", " , ", "0x", "-1x", "0", "-4096"):
        with pytest.raises(ValueError, match="not positive"):
            parse_lengths(bad)


def test_length_probes_leave_every_random_generator_as_they_found_it():
    # too_short builds a sample to measure it; lm-eval's documents drawn after it must be those drawn without it
    import random

    import numpy as np
    from lm_eval.tasks.ruler import cwe_utils

    from eval.long_context_tasks import too_short

    def words(text, add_special_tokens=False):
        return SimpleNamespace(input_ids=text.split())
    random.seed(3), np.random.seed(3), cwe_utils.RNG.seed(3)
    states = random.getstate(), np.random.get_state()[1].copy(), cwe_utils.RNG.getstate()
    for task in ("ruler_vt", "ruler_cwe", "ruler_fwe", "niah_single_1"):
        too_short(task, 4096, words)
        assert random.getstate() == states[0], task
        assert np.array_equal(np.random.get_state()[1], states[1]), task
        assert cwe_utils.RNG.getstate() == states[2], task


# ----------------------------------------------------------------------------- lengths and outputs that cannot work

def no_lm_eval(monkeypatch):
    """Make any start of lm-eval's task machinery fail the test: the checks must come before it."""
    import lm_eval.tasks
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda *a, **k: pytest.fail("lm-eval was started"))


def error_line(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.fault
@pytest.mark.parametrize("lengths,why", [("infx", "infx is not a finite factor"),
                                         ("1x,nanx", "nanx is not a finite factor"),
                                         ("-infx", "-infx is not a finite factor"),
                                         ("1e9", "1e9 is neither a factor such as 2x nor a whole number of tokens"),
                                         ("2k", "2k is neither a factor such as 2x nor a whole number of tokens")])
def test_lengths_that_are_not_finite_numbers_are_one_usage_error(lengths, why, capsys):
    """--lengths with an inf or nan factor, or a token count that is not a whole number (each was a traceback or
    a length nobody meant): one usage error naming the item."""
    with pytest.raises(SystemExit) as info:
        long_context.main(["--ckpt", "runs/any", f"--lengths={lengths}"])
    assert info.value.code == 2
    assert error_line(capsys).split(": error: ", 1)[1] == (  # (after the program's name, which argv[0] gives)
        f"--lengths takes multiples of the training context such as 1x,2x,4x,8x or token counts such as 4096,8192 "
        f"({why})")


def test_the_kv_cache_bytes_of_a_length_are_those_of_a_filled_cache(one_thread):
    """The bound is measured on the model, not assumed: for multi-head RoPE it is keys + values in fp32 (2 x heads x
    head_dim x 4 bytes a token and layer), and for every kind of cached state (FoX's gate sums, GRAPE-AP's path
    vectors, KV-shift, a sliding window's ring) it equals what a real cache holds after reading that many tokens."""
    rope = tiny_model(block_size=256)
    assert long_context.kv_cache_bytes_of(rope, "cpu")(1000) == 1000 * 2 * (2 * 4 * 16 * 4)
    for model in (tiny_model("fox", block_size=64), tiny_model("grape_ap", block_size=64, kv_shift=True),
                  GPT(GPTConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, head_dim=16, vocab_size=320,
                                block_size=64, pos="rope", window=8, global_every=2)).eval()):
        kv_bytes = long_context.kv_cache_bytes_of(model, "cpu")
        for n in (5, 40):
            cache = model.new_cache(1, n)
            with torch.no_grad():
                model(torch.randint(0, 256, (1, n)), cache=cache)
            assert kv_bytes(n) == cache.nbytes(), (model.config.pos, n)


@pytest.mark.fault
def test_a_length_whose_kv_cache_cannot_fit_is_refused_with_the_longest_that_fits(tmp_path, monkeypatch, capsys):
    """--lengths 1000000000 (and 1e9x), which spun for minutes before anything was checked: refused before lm-eval
    starts, with the KV cache's size against the memory available and the longest length whose cache fits (here
    with 100,000 bytes beside the weights: 97 tokens of 1,024 bytes)."""
    no_lm_eval(monkeypatch)
    model = tiny_model(block_size=256)
    run = save_run(model, str(tmp_path / "run"))
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    monkeypatch.setattr(long_context, "available_memory_bytes", lambda device: weights + 100_000)
    for lengths, named in (("1000000000", "1,000,000,000 tokens (3.90625e+06x"),
                           ("1e9x", "256,000,000,000 tokens (1e+09x")):
        with pytest.raises(SystemExit) as info:
            long_context.main(["--ckpt", run, "--lengths", lengths, "--tasks", "niah_single_1"])
        assert info.value.code == 2
        cache_gb = 1024 * int(named.split(" ")[0].replace(",", "")) / 1e9
        assert error_line(capsys) == (
            f"error: --lengths asks for {named} the training context of 256), and the KV cache of one prompt that "
            f"long takes {cache_gb:,.1f} GB, more than the 0.0 GB of cpu memory available beside the model's weights; "
            "the longest that fits is 97 tokens (0.378906x the training context of 256), so ask for at most that")
    assert not (tmp_path / "run" / "eval").exists()


@pytest.mark.fault
def test_a_length_too_short_for_every_tasks_answer_is_refused_before_lm_eval_starts(tmp_path, monkeypatch, capsys):
    """--lengths 0.01x (3 tokens of a 256-token context), where lm-eval skipped every sample and the run reported
    success without a score: refused up front, naming each task's answer length and the shortest length any of
    them can run at."""
    no_lm_eval(monkeypatch)
    run = save_run(tiny_model(block_size=256), str(tmp_path / "run"))
    with pytest.raises(SystemExit) as info:
        long_context.main(["--ckpt", run, "--lengths", "0.01x,1x"])
    assert info.value.code == 2
    assert error_line(capsys) == (
        "error: --lengths asks for 3 tokens (0.0117188x the training context of 256), too short for every chosen "
        "task: a document is a prompt plus the answer lm-eval generates within the length (niah_single_1 128, "
        "niah_single_2 128, niah_single_3 128, niah_multikey_1 128, ... tokens), so none can run below 17 tokens; "
        "ask for longer --lengths")
    assert not (tmp_path / "run" / "eval").exists()


def test_the_answer_lengths_are_lm_evals_own():
    """ANSWER_TOKENS is each task's generation_kwargs.max_gen_toks in lm-eval's own YAML (includes followed)."""
    import lm_eval
    import yaml

    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    stock = Path(lm_eval.__file__).parent / "tasks"

    def merged(path):
        config = yaml.load(path.read_text(), Loader=Loader)
        if "include" in config:
            base = merged(path.parent / config["include"])
            config = {**base, **config, "generation_kwargs": {**base.get("generation_kwargs", {}),
                                                              **config.get("generation_kwargs", {})}}
        return config
    found = {}
    for path in list((stock / "ruler").glob("*.yaml")) + list((stock / "babilong").glob("babilong_qa*.yaml")):
        config = merged(path)
        if isinstance(config.get("task"), str) and config["task"] in LONG_CONTEXT_TASKS:
            found[config["task"]] = config["generation_kwargs"]["max_gen_toks"]
    assert found == long_context.ANSWER_TOKENS


@pytest.mark.fault
@pytest.mark.parametrize("how", ["read-only", "a file in the way"])
def test_an_output_directory_that_cannot_be_written_is_refused_before_any_evaluation(tmp_path, monkeypatch, capsys,
                                                                                      how):
    """A read-only --out (a read-only mount, or a file where the directory would go): one sentence before lm-eval
    starts, where before the traceback came after the first length was evaluated and its scores were lost."""
    import subprocess
    no_lm_eval(monkeypatch)
    run = save_run(tiny_model(block_size=256), str(tmp_path / "run"))
    if how == "read-only":
        out = tmp_path / "ro"
        out.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(out)],
                                               capture_output=True).returncode != 0:
            pytest.skip("needs root to mount a read-only tmpfs")
        cases = [(out, f"cannot write the report to {out} (Read-only file system); choose a writable --out (or make "
                       "that directory writable)")]
    else:  # the folder itself, or a parent of it, is a file: said so (os.makedirs says "Not a directory")
        (tmp_path / "file").write_text("mine")
        blocker = tmp_path / "file"
        cases = [(given, f"the folder for the report {given} cannot be made: {blocker} is a file, not a folder; "
                         "choose another --out (or move the file)") for given in (blocker, blocker / "out")]
    try:
        for given, message in cases:
            with pytest.raises(SystemExit) as info:
                long_context.main(["--ckpt", run, "--lengths", "1x", "--tasks", "niah_single_1", "--out", str(given)])
            assert info.value.code == 2
            assert error_line(capsys) == "error: " + message
    finally:
        if how == "read-only":
            subprocess.run(["umount", str(out)], check=True)
    assert (tmp_path / "file").read_text() == "mine" if how != "read-only" else not os.listdir(out)


@pytest.mark.fault
def test_a_length_at_which_no_task_gets_a_score_ends_with_an_error_line_and_a_failing_status(tmp_path, monkeypatch,
                                                                                             capsys):
    """Variable tracking alone at 100 tokens with the byte tokenizer, which lm-eval cannot build at any length (its
    in-context example alone is longer than it allows): the report is written with the cell's reason, and instead
    of a success without a score the last line is an error and the exit status 1. A disk that fills up when the
    report is written prints the scores instead of losing them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = save_run(tiny_model(block_size=256), str(tmp_path / "run"))
    args = ["--ckpt", run, "--lengths", "100", "--tasks", "ruler_vt", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as info:
        long_context.main(args)
    assert info.value.code == 1
    saved = json.loads((tmp_path / "out" / "long_context.json").read_text())
    status = saved["scores"]["ruler_vt"]["100"]["status"]
    assert saved["scores"]["ruler_vt"]["100"]["score"] is None and status.startswith(
        "not run: cannot be built with this tokenizer at any length")
    assert error_line(capsys) == (
        f"error: no task got a score at 100 tokens (0.390625x) of {run} (ruler_vt: {status}; each cell's reason is "
        f"in {tmp_path / 'out' / 'long_context.md'}); evaluate longer --lengths or other --tasks")

    def full(report, out_dir):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(long_context, "write_report", full)
    with pytest.raises(SystemExit) as info:
        long_context.main(args[:-1] + [str(tmp_path / "other")])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert "| ruler_vt | – |" in captured.out and f"- ruler_vt at every length: {status}" in captured.out
    assert captured.err.strip().splitlines()[-1] == (
        f"error: cannot write the report to {tmp_path / 'other'} (No space left on device), so the scores so far are "
        "printed above instead; free space or choose another --out, then run again")


def test_a_length_equal_to_a_tasks_answer_leaves_no_room_and_one_more_token_does():
    """The prompt needs at least one token beside the answer lm-eval generates."""
    for task, answer in long_context.ANSWER_TOKENS.items():
        assert long_context.shorter_than_answer(task, answer) is not None
        assert f"{answer} answer" in long_context.shorter_than_answer(task, answer)
        assert long_context.shorter_than_answer(task, answer + 1) is None


def test_a_length_too_short_for_some_chosen_tasks_but_not_all_runs_the_others():
    """check_lengths_fit refuses a length only when no chosen task can run at it: 100 tokens leave no room beside
    niah_single_1's 128 answer tokens but do beside babilong_qa1's 16, so that pair is allowed (the too-short task
    is scored as not run), while niah alone is refused with the shortest length that would work."""
    from config import UserError

    model = tiny_model(block_size=64)
    long_context.check_lengths_fit(model, [100], "cpu", ["niah_single_1", "babilong_qa1"])
    long_context.check_lengths_fit(model, [129], "cpu", ["niah_single_1"])
    with pytest.raises(UserError, match=r"too short for every chosen task.*none can run below 129 tokens") as error:
        long_context.check_lengths_fit(model, [200, 128], "cpu", ["niah_single_1", "niah_single_2"])
    assert "--lengths asks for 128 tokens (2x the training context of 64)" in str(error.value)
