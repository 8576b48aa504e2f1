"""eval/extrapolation.py: losses by position against direct computations, passkey bookkeeping, the CLI."""
import json
import os
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data.tokenizer import get_tokenizer
from eval import extrapolation as ex
from eval.tiny import save_run, tiny_model
from test_eval_progress import check_work_clock_lines, progress_lines
from helpers import full_disk, refused_out_message, unwritable

L = 16


@pytest.fixture(scope="module")
def model():
    return tiny_model(pos="alibi", block_size=L, seed=5)


@pytest.fixture(scope="module")
def tokens():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=4 * 2 * L + 1).astype(np.uint16)


def last_token_loss(model, inputs, target):
    """CE of one target from a separate forward pass over exactly `inputs` (a causal prefix)."""
    with torch.no_grad():
        logits, _ = model(torch.tensor([list(map(int, inputs))]))
    return -F.log_softmax(logits[0, -1].double(), -1)[int(target)].item()


def test_nonoverlapping_per_position_loss_matches_prefix_passes_and_model_loss(model, tokens):
    context = 2 * L
    per_position, n_windows = ex.nonoverlapping_loss(model, tokens, context, batch_tokens=3 * context)
    assert n_windows == (len(tokens) - 1) // context and per_position.shape == (context,)
    for p in (0, L - 1, L, context - 1):  # position p of every window, from its own prefix
        direct = np.mean([last_token_loss(model, tokens[w * context:w * context + p + 1], tokens[w * context + p + 1])
                          for w in range(n_windows)])
        assert per_position[p] == pytest.approx(direct, abs=1e-4)
    # the model's own mean cross-entropy (its targets= path) over the same windows
    windows = torch.tensor(tokens[:n_windows * context + 1][:-1].astype(np.int64)).view(n_windows, context)
    targets = torch.tensor(tokens[1:n_windows * context + 1].astype(np.int64)).view(n_windows, context)
    with torch.no_grad():
        _, loss = model(windows, targets=targets)
    assert per_position.mean() == pytest.approx(loss.item(), abs=1e-4)


def test_sliding_window_loss_stride_one_is_full_window_for_every_token(model, tokens):
    short = tokens[:3 * L]
    got, scored = ex.sliding_window_loss(model, short, L, stride=1, batch_tokens=4 * L)
    direct = [last_token_loss(model, short[max(0, t - L):t], short[t]) for t in range(1, len(short))]
    assert scored == len(short) - 1
    assert got == pytest.approx(np.mean(direct), abs=1e-4)


def test_sliding_window_with_stride_equal_to_window_is_nonoverlapping(model, tokens):
    per_position, _ = ex.nonoverlapping_loss(model, tokens, L)
    got, scored = ex.sliding_window_loss(model, tokens, L, stride=L)
    assert scored == len(tokens) - 1
    assert got == pytest.approx(per_position.mean(), abs=1e-5)


def test_passkey_prompt_length_and_depth():
    tok = get_tokenizer("byte")
    for n in (300, 700):
        ids, answer = ex.build_passkey_prompt(tok, n, 0.0, 12345)
        text = tok.decode(ids)
        filler = len(ex.PASSKEY_FILLER.encode())
        assert abs(len(ids) - n) <= filler / 2 + 1 and answer == " 12345"
        assert text.startswith(ex.PASSKEY_INTRO + "The pass key is 12345.")
        assert text.endswith(ex.PASSKEY_QUESTION)
        end = tok.decode(ex.build_passkey_prompt(tok, n, 1.0, 12345)[0])
        assert end.endswith(ex.PASSKEY_NEEDLE.format(key=12345) + ex.PASSKEY_QUESTION)


def oracle(visible_fraction, tok):
    """A fake generator that answers with the key only if the needle lies in the last
    `visible_fraction` of the prompt's bytes (a stand-in for a model with limited reach)."""
    def generate(prompts, max_new_tokens):
        outputs = []
        for ids in prompts:
            text = tok.decode(ids)
            match = re.search(r"The pass key is (\d+)", text)
            seen = match.start() >= (1 - visible_fraction) * len(text)
            outputs.append(f" {match.group(1)}.\n" if seen else " 00000")
        return outputs
    return generate


def test_passkey_accuracy_grid_orientation_and_averaging():
    tok = get_tokenizer("byte")
    lengths, depths = [800, 1600, 3200], [0.0, 0.25, 0.5, 0.75, 1.0]
    everything, _ = ex.passkey_accuracy(oracle(1.0, tok), tok, lengths, depths, trials=3)
    assert everything.shape == (3, 5) and (everything == 1).all()
    half, actual = ex.passkey_accuracy(oracle(0.45, tok), tok, lengths, depths, trials=3)
    assert (half[:, :3] == 0).all() and (half[:, 3:] == 1).all()  # only the deep needles are "seen"
    assert [abs(actual[n] - n) < 100 for n in lengths] == [True] * 3


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from data.prepare import files_source, prepare

    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(1)
    words = "alpha beta gamma delta river stone cloud seven quiet numbers".split()
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choice(words, 80))}) + "\n" for _ in range(60)))
    prepare(files_source(str(corpus)), str(root / "data"), tokenizer="byte", val_tokens=3000, workers=1,
            progress_bar=False)
    return root / "data"


def test_cli_on_tiny_model_writes_sane_outputs(tmp_path, data_dir):
    run = tmp_path / "run"
    model = tiny_model(pos="rope", block_size=64, seed=2)
    save_run(model, run, step=3)
    out = tmp_path / "out"
    results = ex.main(["--ckpt", str(run), "--data-dir", str(data_dir), "--out", str(out), "--factors", "1,2",
                       "--windows", "4", "--passkey-factors", "3,6", "--depths", "0,1", "--passkey-trials", "2"])
    (r,) = results
    assert set(r["contexts"]) == {"64", "128"} and r["train_context"] == 64 and r["val_tokens"] == 4 * 128 + 1
    assert (r["run"], r["step"], r["data_dir"]) == (str(run), 3, os.path.abspath(data_dir))  # what it evaluated
    # reference: the mean cross-entropy over consecutive windows of the first val_tokens validation tokens
    from data.loader import load_split_tokens
    val = torch.from_numpy(load_split_tokens(str(data_dir), "val")[:r["val_tokens"]].astype(np.int64))
    for context in (64, 128):
        windows = val[:(len(val) - 1) // context * context + 1]
        inputs, targets = windows[:-1].view(-1, context), windows[1:].view(-1, context)
        with torch.no_grad():
            logits, _ = model(inputs)
        expected = F.cross_entropy(logits.flatten(0, 1).double(), targets.flatten()).item()
        assert r["contexts"][str(context)]["nonoverlapping"]["mean"] == pytest.approx(expected, rel=1e-5)
    acc = np.array(r["passkey"]["accuracy"])
    assert acc.shape == (2, 2) and ((acc >= 0) & (acc <= 1)).all()
    assert json.loads((out / "extrapolation.json").read_text()) == results
    assert "| run | rope | 64 | 128 | 2 |" in (out / "extrapolation.md").read_text().replace(r["name"], "run")
    for png in ("loss_vs_position.png", f"passkey_{r['name']}.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_data_of_another_tokenizer(tmp_path, capsys):
    run = tmp_path / "run"
    save_run(tiny_model(block_size=16), run)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({"tokenizer": "gpt2", "shards": []}))
    with pytest.raises(SystemExit):
        ex.main(["--ckpt", str(run), "--data-dir", str(tmp_path / "data"), "--passkey-trials", "0"])
    assert "tokenized with 'gpt2'" in capsys.readouterr().err


def test_progress_lines_count_the_tokens_the_model_reads(tmp_path, data_dir, work_clock, monkeypatch, capsys,
                                                         one_thread):
    """The clock moves one second per token the model reads (forward passes, passkey prompts), so every line's
    elapsed time must be the work done, its ETA the work left, and the JSON's times the phases' token counts."""
    real_losses, real_generate = ex._token_losses, ex.cached_greedy_generate

    def timed_losses(model, inputs, targets, device):
        work_clock[0] += inputs.numel()
        return real_losses(model, inputs, targets, device)

    def timed_generate(*args):
        generate = real_generate(*args)

        def run(prompts, max_new_tokens):
            work_clock[0] += sum(map(len, prompts))
            return generate(prompts, max_new_tokens)
        return run
    monkeypatch.setattr(ex, "_token_losses", timed_losses)
    monkeypatch.setattr(ex, "cached_greedy_generate", timed_generate)
    save_run(tiny_model(pos="alibi", block_size=16, seed=2), tmp_path / "run")
    args = ex.parse_args(["--ckpt", str(tmp_path / "run"), "--data-dir", str(data_dir), "--factors", "1,2",
                          "--windows", "3", "--passkey-factors", "8", "--depths", "0,1", "--passkey-trials", "2",
                          "--batch-tokens", "40"])
    result = ex.evaluate_checkpoint(args.ckpt[0], args, "cpu")  # what main writes to extrapolation.json
    err = capsys.readouterr().err
    loss = check_work_clock_lines(progress_lines(err, "extrapolation run, loss at 2 contexts"))
    passkey = check_work_clock_lines(progress_lines(err, "extrapolation run, passkey"))
    # A total above or below the tokens really read would leave done short of it or elapsed off done.
    assert result["elapsed_s"] == {"loss": loss, "passkey": passkey}
    assert passkey == 2 * 2 * sum(result["passkey"]["actual_lengths"])  # 2 depths x 2 trials per length


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_extrapolation_reads_the_runs_resolved_data_directory(tmp_path):
    from eval import extrapolation
    run, data = tmp_path / "run", tmp_path / "data"
    run.mkdir()
    data.mkdir()
    (run / "config.json").write_text(json.dumps({"data_dir_resolved": str(data)}))
    assert extrapolation.resolve_data_dir(str(run), {"train_config": {"data_dir": "elsewhere"}}, None) == str(data)
    assert extrapolation.resolve_data_dir(str(run), {}, "given") == "given"


def test_the_runs_own_data_folder_is_read_only_while_it_holds_the_data_the_checkpoint_was_trained_on(tmp_path):
    """Whether the run's folder comes from its config.json or, without one, from the checkpoint's settings, it is
    refused once it holds other data than the checkpoint recorded (or cannot be read), naming --data-dir, which
    accepts it as it is."""
    from config import UserError
    from data.prepared import PreparedData
    from helpers import prepare_byte_corpus
    data = prepare_byte_corpus(tmp_path, ["some text " * 50, "other text " * 30], val_tokens=100)
    identity, other = PreparedData(data).identity, "f" * 64
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"data_dir_resolved": data}))
    for run_dir, settings in ((run, {"data_dir": "elsewhere"}), (tmp_path / "run-moved", {"data_dir": data})):
        ckpt = {"tokenizer": "byte", "train_config": settings, "data_identity": identity}
        assert ex.resolve_data_dir(str(run_dir), ckpt, None) == data
        with pytest.raises(UserError) as info:
            ex.resolve_data_dir(str(run_dir), {**ckpt, "data_identity": other}, None)
        assert str(info.value) == (
            f"{data} now holds other data (manifest sha256 {identity[:12]}...) than the run was trained on (manifest "
            f"sha256 ffffffffffff... in the checkpoint): it was prepared again since, so {run_dir} would be evaluated "
            f"on data it was not trained on; pass --data-dir {data} to evaluate on it as it is now, or put back the "
            "data the run was trained on")
        assert ex.resolve_data_dir(str(run_dir), {**ckpt, "data_identity": other}, data) == data
    with open(os.path.join(data, "manifest.json"), "w") as f:
        f.write("{damaged")
    with pytest.raises(UserError, match=f"^the data folder of {re.escape(str(run))}: .*manifest.json"):
        ex.resolve_data_dir(str(run), {"tokenizer": "byte", "data_identity": identity}, None)


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


# -------------------------------------------------------------------------------- user-facing errors


@pytest.mark.fault
@pytest.mark.parametrize("below", [False, True])
def test_an_unwritable_out_is_one_sentence_before_any_evaluation(below, tmp_path, monkeypatch, capsys):
    """An --out folder that cannot be written was a PermissionError traceback after the whole evaluation (the scores
    lost), one still to be made a traceback from os.makedirs; the run named here does not exist, so only a check
    made first can answer, and a folder still to be made is not made by it."""
    locked = tmp_path / "locked"
    locked.mkdir()
    unwritable(monkeypatch, locked)
    out = locked / "sub" if below else locked
    with pytest.raises(SystemExit) as info:
        ex.main(["--ckpt", str(tmp_path / "no_run"), "--out", str(out), "--device", "cpu"])
    assert info.value.code == 2
    assert capsys.readouterr().err == f"error: {refused_out_message(out, locked, below)}\n"
    assert list(locked.iterdir()) == []


def fake_result(name="run"):
    """What evaluate_checkpoint returns, for one context, without a model."""
    return {"run": name, "name": name, "encoding": "rope", "train_context": 4, "step": 1, "val_tokens": 9,
            "contexts": {"4": {"nonoverlapping": {"mean": 3.25, "windows": 2, "mean_beyond_train_context": None,
                                                  "binned_positions": [0.5, 2.5], "binned_loss": [3.5, 3.0]},
                               "sliding": {"mean": 3.125, "stride": 1, "min_context": 4, "tokens_scored": 8}}},
            "elapsed_s": {"loss": 1.0}}


@pytest.mark.fault
def test_results_that_cannot_be_written_after_all_are_printed_with_one_sentence(tmp_path, monkeypatch, capsys):
    """The folder was writable when checked, but the disk filled before the end: the scores are printed (the
    report and the whole JSON), the error is one sentence with a non-zero exit, and no half-written file is left."""
    full_disk(monkeypatch, tmp_path / "out")
    monkeypatch.setattr(ex, "evaluate_checkpoint", lambda run, args, device: fake_result())
    with pytest.raises(SystemExit) as info:
        ex.main(["--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.err == (f"error: cannot write the results to {tmp_path / 'out'} (No space left on device), so "
                            "they are printed above instead; free space or choose another --out, then run again\n")
    report = ex.markdown_report([fake_result()])
    assert captured.out.startswith(report)
    assert json.loads(captured.out[len(report):]) == [fake_result()]  # every number, not only the table's
    assert list((tmp_path / "out").iterdir()) == []  # no extrapolation.json.tmp left


@pytest.mark.fault
@pytest.mark.parametrize("context", ["0", "-5"])
def test_a_context_below_one_token_is_refused_in_one_sentence(context, tmp_path, capsys):
    """--context -5 ended in plan_windows' ValueError traceback; --context 0 was silently the checkpoint's
    block_size (its help says to leave the option out for that)."""
    with pytest.raises(SystemExit) as info:
        ex.main(["--ckpt", str(tmp_path / "no_run"), "--out", str(tmp_path / "out"), "--context", context])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(f"error: --context must be at least 1 token (got {context}); leave it out to use the "
                        "checkpoint's block_size\n") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_windows_inside_documents_are_consecutive_and_never_cross_an_eot():
    from eval.windows import document_windows
    eot = 256
    stream = [eot] + [1] * 40 + [eot] + [2] * 10 + [eot] + [3] * 33
    assert document_windows(stream, eot, 16) == [(1, 1), (18, 1), (53, 3)]  # (the stream opens with an empty one)
    assert document_windows(stream, eot, 16, count=2) == [(1, 1), (18, 1)]
    assert document_windows([5] * 20, eot, 16) == [(0, 0)]  # a stream without eot is one document
    assert document_windows([5] * 17, eot, 16) == [(0, 0)] and document_windows([5] * 16, eot, 16) == []
    assert document_windows([eot] + [5] * 17 + [eot], eot, 16) == [(1, 1)]  # exactly length + 1 tokens: one window
    for start, _ in document_windows(stream, eot, 16):
        assert eot not in stream[start:start + 17]


def test_losses_inside_documents_read_the_same_tokens_at_every_context_and_pair_each_windows_rise(model):
    """Each window of 4L + 1 tokens inside a document, cut into 4 windows of L + 1 and 2 of 2L + 1 for the shorter
    contexts: their losses are those of separate forward passes over exactly those tokens, the window's loss at L
    the mean of its four L-windows, and the rise by document a t-interval over the documents' mean rises."""
    from scipy import stats
    eot = 256
    rng = np.random.default_rng(4)
    documents = [rng.integers(0, 256, size=n).tolist() for n in (70, 140, 20, 66)]  # 1, 2, 0 and 1 windows of 4L
    stream = np.array([t for d in documents for t in [eot] + d], dtype=np.uint16)
    per_context, per_window = ex.document_losses(model, stream, eot, L, [L, 2 * L, 4 * L], None, batch_tokens=100)
    assert [w["document"] for w in per_window] == [1, 2, 2, 4] and per_context[L][1] == 16 and per_context[2 * L][1] == 8

    def losses(start, context):
        window = torch.tensor(stream[start:start + context + 1].astype(np.int64))[None]
        with torch.no_grad():
            logits, _ = model(window[:, :-1])
        return F.cross_entropy(logits[0].double(), window[0, 1:], reduction="none").numpy()
    starts = [1, 72, 137, 234]
    for start, window in zip(starts, per_window):
        at_l = np.mean([losses(start + i * L, L) for i in range(4)])
        assert window["at_L"] == pytest.approx(at_l, rel=1e-5)
        for context in (2 * L, 4 * L):
            beyond = np.mean([losses(start + i * context, context)[L:] for i in range(4 * L // context)])
            assert window["beyond"][str(context)] == pytest.approx(beyond, rel=1e-5)
    long_means = np.mean([losses(s, 4 * L) for s in starts], axis=0)
    np.testing.assert_allclose(per_context[4 * L][0], long_means, rtol=1e-5)
    rises = {}
    for window in per_window:
        rises.setdefault(window["document"], []).append(window["beyond"][str(4 * L)] - window["at_L"])
    means = [np.mean(v) for v in rises.values()]
    half = stats.t.ppf(0.975, 2) * np.std(means, ddof=1) / np.sqrt(3)
    interval = ex.data_interval(per_window, lambda w: w["beyond"][str(4 * L)] - w["at_L"])
    assert interval["documents"] == 3 and interval["mean"] == pytest.approx(np.mean(means))
    assert interval["interval"] == pytest.approx([np.mean(means) - half, np.mean(means) + half])
    with pytest.raises(ex.UserError, match="no document of the validation split is longer than 256 tokens"):
        ex.document_losses(model, stream, eot, L, [L, 16 * L], None)


def test_the_cli_inside_documents_writes_every_windows_losses_and_the_datas_error(tmp_path, data_dir):
    """--documents through the command: the windows of the longest context inside documents, each context's mean
    the cross-entropy of those windows' tokens cut to its length, and the record a study reads (documents, windows,
    rise_by_document, no sliding windows); --batch-tokens 1 is a valid knob (one window a pass)."""
    from data.loader import load_split_tokens
    from eval.windows import document_windows
    run = tmp_path / "run"
    model = tiny_model(pos="alibi", block_size=64, seed=3)
    save_run(model, run, step=5)
    out = tmp_path / "out"
    (r,) = ex.main(["--ckpt", str(run), "--data-dir", str(data_dir), "--out", str(out), "--factors", "1,2,4",
                    "--documents", "--windows", "0", "--passkey-trials", "0", "--batch-tokens", "1"])
    val = load_split_tokens(str(data_dir), "val")
    big = document_windows(val, 256, 256)
    assert len(big) >= 3 and r["documents"] == len({d for _, d in big}) and r["val_tokens"] == len(big) * 257
    assert [w["document"] for w in r["windows"]] == [d for _, d in big]
    for context, parts in ((64, 4), (128, 2), (256, 1)):
        cell = r["contexts"][str(context)]
        assert cell["sliding"] is None and cell["nonoverlapping"]["windows"] == parts * len(big)
        starts = [s + i * context for s, _ in big for i in range(parts)]
        windows = torch.stack([torch.from_numpy(val[s:s + context + 1].astype(np.int64)) for s in starts])
        with torch.no_grad():
            logits, _ = model(windows[:, :-1])
        losses = F.cross_entropy(logits.flatten(0, 1).double(), windows[:, 1:].flatten(), reduction="none")
        assert cell["nonoverlapping"]["mean"] == pytest.approx(losses.mean().item(), rel=1e-5)
        if context > 64:
            beyond = losses.view(len(starts), context)[:, 64:].mean().item()
            assert cell["nonoverlapping"]["mean_beyond_train_context"] == pytest.approx(beyond, rel=1e-5)
            rise = ex.data_interval(r["windows"], lambda w, c=str(context): w["beyond"][c] - w["at_L"])
            # one key at a time: pytest >= 9.2 refuses approx over a dict holding a list ('interval')
            assert cell["rise_by_document"].keys() == rise.keys()
            assert cell["rise_by_document"]["documents"] == rise["documents"]
            assert cell["rise_by_document"]["mean"] == pytest.approx(rise["mean"])
            assert cell["rise_by_document"]["interval"] == pytest.approx(rise["interval"])
        else:
            assert "rise_by_document" not in cell
    assert r["elapsed_s"]["loss"] > 0 and "passkey" not in r
    assert json.loads((out / "extrapolation.json").read_text()) == [r]
    assert f"| {r['name']} | alibi | 64 | 256 | 4 | {r['contexts']['256']['nonoverlapping']['mean']:.4f} | " \
           f"{r['contexts']['256']['nonoverlapping']['mean_beyond_train_context']:.4f} | – |" \
        in (out / "extrapolation.md").read_text()


@pytest.mark.fault
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_one_sentence_and_no_results(tmp_path, capsys, value):
    """A NaN weight made every score NaN (or 0.000) and was reported as a model's result."""
    from helpers import run_with_non_finite_weight
    named = run_with_non_finite_weight(tmp_path / "run", value)
    with pytest.raises(SystemExit) as exit_info:
        ex.main(["--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: checkpoint {tmp_path / 'run' / 'ckpt.pt'} {named}")
    assert not (tmp_path / "out").exists()


@pytest.mark.fault
@pytest.mark.parametrize("documents", [False, True])
def test_several_checkpoints_are_all_checked_before_any_is_evaluated(tmp_path, capsys, monkeypatch, documents):
    """The second checkpoint's longest context does not fit in the validation text (or in one of its documents):
    refused before the first one's work, which was otherwise done and thrown away."""
    from helpers import prepare_byte_corpus
    data_dir = prepare_byte_corpus(tmp_path, ["a fact, then another one. " * 6] * 2, val_tokens=300)
    save_run(tiny_model("alibi", block_size=16), tmp_path / "short")
    save_run(tiny_model("alibi", block_size=64), tmp_path / "long")
    for work in ("nonoverlapping_loss", "document_losses", "with_passkey"):
        monkeypatch.setattr(ex, work, lambda *a, **k: pytest.fail("no checkpoint may be evaluated"))
    argv = ["--data-dir", data_dir, "--out", str(tmp_path / "out"), "--factors", "1,8", "--passkey-trials", "0"]
    with pytest.raises(SystemExit) as exit_info:
        ex.main(["--ckpt", str(tmp_path / "short"), str(tmp_path / "long"), *argv] + ["--documents"] * documents)
    assert exit_info.value.code == 2
    long = tmp_path / "long"
    assert capsys.readouterr().err == (
        f"error: no document of the validation split of {data_dir} is longer than 512 tokens, the longest context of "
        f"{long} (--factors); evaluate shorter contexts, leave out --documents, or prepare longer documents\n"
        if documents else
        f"error: the validation split of {data_dir} has 300 tokens, too few for one window of 512, the longest "
        f"context of {long} (--factors); evaluate shorter contexts or prepare more validation text\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.fault
@pytest.mark.parametrize("text, said", [(b"\xff\xfe{", "'utf-8' codec can't decode"), (b"[1, 2]", "a JSON list"),
                                        (b'{"data_dir_resolved": ', "Expecting value")])
def test_a_run_whose_config_json_is_malformed_is_one_sentence(tmp_path, capsys, text, said):
    """The evaluations read the run's data directory from its config.json: garbage there was a traceback."""
    save_run(tiny_model("alibi", block_size=16), tmp_path / "run")
    (tmp_path / "run" / "config.json").write_bytes(text)
    with pytest.raises(SystemExit) as exit_info:
        ex.main(["--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--passkey-trials", "0"])
    err = capsys.readouterr().err
    config = tmp_path / "run" / "config.json"
    assert exit_info.value.code == 2 and err.count("\n") == 1 and said in err
    assert err.startswith(f"error: {config} is not the run's settings as train.py writes them (")
    assert err.endswith("); restore it from a backup, or pass --data-dir the prepared data to read\n")


def test_the_datas_interval_averages_each_documents_windows_first_and_needs_two_documents():
    """data_interval over hand-made windows: a document's windows count once (their mean), a window without the
    value is left out, two documents give a t-interval (one degree of freedom), one gives the mean alone."""
    from scipy import stats

    def window(document, at_l, beyond):
        return {"document": document, "at_L": at_l, "beyond": {"64": beyond}}

    def rise(w):
        return None if w["beyond"]["64"] is None else w["beyond"]["64"] - w["at_L"]
    windows = [window(3, 3.0, 3.5), window(3, 3.0, 3.25), window(3, 3.0, 3.75),  # rises 0.5, 0.25, 0.75: mean 0.5
               window(8, 2.5, 2.25), window(8, 2.5, None)]                      # rise -0.25 (and a window without)
    got = ex.data_interval(windows, rise)
    half = stats.t.ppf(0.975, 1) * np.std([0.5, -0.25], ddof=1) / np.sqrt(2)
    assert got["documents"] == 2 and got["mean"] == pytest.approx(0.125, abs=1e-12)  # not 0.3125, the windows' mean
    assert got["interval"] == pytest.approx([0.125 - half, 0.125 + half], rel=1e-9)
    assert ex.data_interval(windows[:3], rise) == {"mean": pytest.approx(0.5), "interval": None, "documents": 1}
    assert ex.data_interval(windows[4:], rise) == {"mean": None, "interval": None, "documents": 0}
