"""The lm-eval adapter against independent computations from the model's own logits."""
import math
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from data.tokenizer import get_tokenizer
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from eval.lm_adapter import GrapeLM
from eval.windows import plan_windows
from eval.tiny import tiny_model
from test_eval_progress import check_work_clock_lines, progress_lines

WINDOW = 24


def request(*args):
    return SimpleNamespace(args=args)


@pytest.fixture(scope="module")
def lm():
    model = tiny_model(pos="rope", block_size=WINDOW, seed=1)
    return GrapeLM(model=model, tokenizer=get_tokenizer("byte"), batch_size=3)


def direct_logprobs(model, inputs, targets):
    """Per-token log-probabilities of `targets`, each predicted from the last len(targets) inputs."""
    with torch.no_grad():
        logits, _ = model(torch.tensor([inputs]))
    logprobs = F.log_softmax(logits[0, len(inputs) - len(targets):].double(), dim=-1)
    return logprobs.gather(-1, torch.tensor(targets)[:, None])[:, 0]


def per_token_reference(model, context_ids, continuation_ids, window):
    """Sum of log p(continuation token | the `window` tokens before it), one forward pass per
    token: what any windowing must give when every token gets a full window (stride 1)."""
    sequence = context_ids + continuation_ids
    total = 0.0
    for t in range(len(context_ids), len(sequence)):
        inputs = sequence[max(0, t - window):t]
        total += direct_logprobs(model, inputs, [sequence[t]]).item()
    return total


def single_window_reference(model, context_ids, continuation_ids, window):
    """One pass over the last `window` inputs of context + continuation (left truncation)."""
    sequence = context_ids + continuation_ids
    inputs = sequence[max(0, len(sequence) - 1 - window):-1]
    return direct_logprobs(model, inputs, continuation_ids).sum().item()


def test_loglikelihood_equals_direct_computation_short_and_truncated(lm):
    tok = lm.tok
    cases = [
        ("Question: what is 2+2?\nAnswer:", " four"),  # continuation starting with a space
        ("The cat sat on the", " mat"),
        ("x" * 60 + " long context that must be cut from the left", " end"),  # truncation
        ("", "no context at all"),  # lm-eval puts the end-of-text token in front
    ]
    results = lm.loglikelihood([request(c, x) for c, x in cases])
    for (context, continuation), (logprob, _) in zip(cases, results):
        context_ids = tok.encode(context) if context else [tok.eot_token]
        expected = single_window_reference(lm.model, context_ids, tok.encode(continuation), WINDOW)
        assert logprob == pytest.approx(expected, abs=1e-3), (context, continuation)
    assert len(tok.encode(cases[2][0] + cases[2][1])) > WINDOW + 1  # the truncation case truncates


def test_continuation_longer_than_window_is_scored_in_full(lm):
    context, continuation = "short", " a continuation longer than the whole model window"
    lm.rolling_stride, saved = 1, lm.rolling_stride
    try:
        got = lm.loglikelihood([request(context, continuation)])[0][0]
    finally:
        lm.rolling_stride = saved
    expected = per_token_reference(lm.model, lm.tok.encode(context), lm.tok.encode(continuation), WINDOW)
    assert got == pytest.approx(expected, abs=1e-3)


def test_single_window_request_matches_one_forward_pass(lm):
    # The usual zero-shot case: context + continuation fits, scored with one pass over seq[:-1].
    context, continuation = "Answer:", " yes"
    ids = lm.tok.encode(context + continuation)
    expected = direct_logprobs(lm.model, ids[:-1], ids[len(lm.tok.encode(context)):]).sum().item()
    assert lm.loglikelihood([request(context, continuation)])[0][0] == pytest.approx(expected, abs=1e-4)


def test_trailing_space_in_context_moves_to_continuation(lm):
    # lm-eval moves the context's trailing space into the continuation: same tokens, same score.
    a, b = lm.loglikelihood([request("Hello", " world"), request("Hello ", "world")])
    assert a[0] == pytest.approx(b[0], abs=1e-5)


def test_is_greedy_flag_matches_argmax(lm):
    tok = lm.tok
    context = "abcabcabc"
    with torch.no_grad():
        logits, _ = lm.model(torch.tensor([tok.encode(context)]))
    greedy_token = int(logits[0, -1].argmax())
    other_token = (greedy_token + 1) % 256
    (_, greedy), (_, not_greedy) = lm._loglikelihood_tokens(
        [(None, tok.encode(context), [greedy_token]), (None, tok.encode(context), [other_token])])
    assert greedy and not not_greedy


def test_batching_and_padding_do_not_change_scores(lm):
    cases = [request("a" * n, " b" * (1 + n % 4)) for n in range(1, 12)]
    batched = [r[0] for r in lm.loglikelihood(cases)]
    lm.batch_size, saved = 1, lm.batch_size
    try:
        single = [r[0] for r in lm.loglikelihood(cases)]
    finally:
        lm.batch_size = saved
    assert batched == pytest.approx(single, abs=1e-4)


def test_rolling_loglikelihood_short_document_is_full_sequence_logprob(lm):
    text = "a short document"
    ids = [lm.tok.eot_token] + lm.tok.encode(text)
    expected = direct_logprobs(lm.model, ids[:-1], ids[1:]).sum().item()
    assert lm.loglikelihood_rolling([request(text)])[0] == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("stride", [1, WINDOW])
def test_rolling_loglikelihood_long_document(lm, stride):
    # stride 1: every token is predicted from a full window (reference: token by token).
    # stride = window: lm-eval's own disjoint rolling windows (reference: lm_eval.utils).
    text = "the quick brown fox jumps over the lazy dog. " * 2
    ids = lm.tok.encode(text)
    lm.rolling_stride, saved = stride, lm.rolling_stride
    try:
        got = lm.loglikelihood_rolling([request(text)])[0]
    finally:
        lm.rolling_stride = saved
    if stride == 1:
        expected = per_token_reference(lm.model, [lm.tok.eot_token], ids, WINDOW)
    else:
        expected = 0.0
        for window in get_rolling_token_windows(ids, lm.tok.eot_token, WINDOW, 1):
            context, predicted = make_disjoint_window(window)
            expected += direct_logprobs(lm.model, (context + predicted)[:-1], predicted).sum().item()
    assert got == pytest.approx(expected, abs=1e-3)


def test_plan_windows_scores_every_target_once_with_enough_context():
    rng = random.Random(0)
    for _ in range(300):
        window = rng.randint(1, 20)
        stride = rng.randint(1, window)
        n = rng.randint(1, 80)
        first = rng.randint(1, max(1, n))
        scored = []
        windows = plan_windows(n, first, window, stride)
        if windows and n > window and first <= window:  # the first window is filled: all window tokens read
            assert windows[0][1] - windows[0][0] == window, (n, first, window, stride, windows[0])
        for start, end, k in windows:
            assert 0 <= start < end and end - start <= window and 1 <= k <= end - start
            assert end - start == min(window, end)  # every window as full as the tokens before it allow
            targets = list(range(end - k + 1, end + 1))
            for t in targets:
                context = t - start  # tokens seq[start:t] precede target t in this window
                assert context == t or context >= window - stride + 1, (n, first, window, stride)
            scored += targets
        assert scored == list(range(first, n))


def test_generate_until_matches_greedy_decoding_without_cache(lm):
    tok = lm.tok
    prompts = ["Once upon", "Twice upo", "x"]
    out = lm.generate_until([request(p, {"max_gen_toks": 6, "until": []}) for p in prompts])
    for prompt, text in zip(prompts, out):
        ids = tok.encode(prompt)
        generated = []
        for _ in range(6):  # reference: recompute the whole prefix every step, no cache
            with torch.no_grad():
                logits, _ = lm.model(torch.tensor([ids + generated]))
            token = int(logits[0, -1, :tok.n_vocab].argmax())
            if token == tok.eot_token:
                break
            generated.append(token)
        assert text == tok.decode(generated)


def test_generate_until_cuts_at_stop_string(lm):
    full = lm.generate_until([request("Once upon", {"max_gen_toks": 8, "until": []})])[0]
    # a printable ASCII character of the output, not at its start, as the stop string
    stops = [c for i, c in enumerate(full) if i > 0 and c.isascii() and c.isprintable() and c not in full[:i]]
    if not stops:
        pytest.skip("the random model's output has no usable stop string")
    cut = lm.generate_until([request("Once upon", {"max_gen_toks": 8, "until": [stops[0]]})])[0]
    assert cut == full[:full.index(stops[0])]


@pytest.mark.parametrize("pos,kv_shift", [("fox", False), ("grape_ap", True), ("grape_m_ctx", True)])
def test_right_padding_is_exact_for_stateful_encodings(pos, kv_shift):
    # Encodings with running state along the sequence (forget gates, path integrals, contextual
    # phases, KV-shift) must still ignore padding that comes after the scored tokens.
    model = tiny_model(pos=pos, block_size=WINDOW, seed=2, kv_shift=kv_shift)
    tok = get_tokenizer("byte")
    cases = [request("a" * n, " b" * (1 + n % 3)) for n in range(1, 8)]
    batched = GrapeLM(model=model, tokenizer=tok, batch_size=7).loglikelihood(cases, disable_tqdm=True)
    for (context, continuation), (logprob, _) in zip((c.args for c in cases), batched):
        expected = single_window_reference(model, tok.encode(context), tok.encode(continuation), WINDOW)
        assert logprob == pytest.approx(expected, abs=1e-4)


def test_scoring_progress_counts_the_padded_tokens_of_each_forward_pass(lm, work_clock, monkeypatch, capsys):
    """The clock moves one second per token the model reads (padding included), so elapsed = done and
    ETA = what is left on every line (zero-shot's progress: lm-eval hands all its requests to one call)."""
    model = lm.model

    def timed(idx, **kwargs):
        work_clock[0] += idx.numel()
        return model(idx, **kwargs)
    monkeypatch.setattr(lm, "model", timed)
    cases = [("The cat sat on the", " mat"), ("Q: 2+2?\nA:", " four"), ("x" * 40, " long"), ("a", " b"),
             ("", "no context")]
    lm.loglikelihood([request(c, x) for c, x in cases])
    total = check_work_clock_lines(progress_lines(capsys.readouterr().err, "lm-eval: scoring 5 windows"))
    assert total == work_clock[0]


def test_generate_until_counts_the_prompts_it_cut_and_keeps_each_requests_settings(lm):
    """Prompts longer than max_length - max_gen_toks are cut from the left and counted (the long-context report
    states the count); requests of the same prompt length but other settings are generated with their own."""
    assert lm.max_length == WINDOW
    long_text, short_text = "x" * (WINDOW + 5), "Once upon"
    lm.generate_until([request(long_text, {"max_gen_toks": 4, "until": []}),
                       request(long_text[1:], {"max_gen_toks": 4, "until": []}),
                       request(short_text, {"max_gen_toks": 4, "until": []})])
    assert lm.prompts_cut == 2  # the last request was not cut: the count is of the whole call
    lm.generate_until([request(short_text, {"max_gen_toks": 4, "until": []})])
    assert lm.prompts_cut == 0
    alone = {n: lm.generate_until([request(short_text, {"max_gen_toks": n, "until": []})])[0] for n in (2, 6)}
    assert alone[2] != alone[6]
    together = lm.generate_until([request(short_text, {"max_gen_toks": 2, "until": []}),
                                  request(short_text, {"max_gen_toks": 6, "until": []})])
    assert together == [alone[2], alone[6]]


def test_sampling_settings_follow_do_sample(lm):
    """lm-eval asks for sampling with do_sample; without it a temperature is ignored (greedy decoding)."""
    assert lm._generation_settings({"do_sample": True, "temperature": 0.7, "top_k": 5}) == {
        "until": [], "max_gen_toks": WINDOW - 1, "temperature": 0.7, "top_k": 5}
    assert lm._generation_settings({"temperature": 0.7, "until": "\n", "max_gen_toks": 3}) == {
        "until": ["\n"], "max_gen_toks": 3, "temperature": 0.0, "top_k": None}


class NamedTokens:
    """The byte tokenizer, decoding every id to its own text ("<id>"): a lone byte >= 128 would decode to the same
    replacement character as any other, and each drawn token must be told apart from its text."""

    def __init__(self):
        self.inner = get_tokenizer("byte")
        self.n_vocab, self.eot_token, self.name = self.inner.n_vocab, self.inner.eot_token, self.inner.name

    def encode(self, text):
        return self.inner.encode(text)

    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


def chi_square(counts, probs, min_expected=5.0):
    """Pearson's statistic of the counts against probs, over the tokens expected at least min_expected times and
    the rest (if any) pooled in one cell; returns (statistic, degrees of freedom)."""
    n = counts.sum()
    expected = n * probs
    big = expected >= min_expected
    observed, expected = counts[big], expected[big]
    if not big.all():
        observed = torch.cat([observed, counts[~big].sum()[None]])
        expected = torch.cat([expected, n * probs[~big].sum()[None]])
    return float(((observed - expected) ** 2 / expected).sum()), len(observed) - 1


def test_sampled_decoding_draws_from_the_tempered_softmax_of_the_models_logits(one_thread):
    """generate_until with do_sample and temperature 0.6: 20,000 seeded draws of one token after the same prompt
    follow softmax(logits / 0.6) of the model's own next-token logits (Pearson's chi-square far below its 1e-6 tail),
    and the same draws reject the softmax without the temperature and with it applied twice; with top_k = 5 only
    the five most likely tokens are drawn, in the proportions of the tempered softmax renormalised over them."""
    model = tiny_model(pos="rope", block_size=WINDOW, seed=1)
    with torch.no_grad():
        model.norm.weight.mul_(15.0)  # sharper logits (std about 2): the temperature changes the draws a lot
    tok = NamedTokens()
    lm = GrapeLM(model=model, tokenizer=tok, batch_size=5000)
    prompt = "O"  # one token: 20,000 prompts are one cheap forward pass
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode(prompt)]))[0][0, -1, :tok.n_vocab].double()
    temperature, n = 0.6, 20_000

    def draw(**settings):
        torch.manual_seed(0)
        texts = lm.generate_until([request(prompt, {"do_sample": True, "temperature": temperature, "max_gen_toks": 1,
                                                    "until": [], **settings}) for _ in range(n)])
        ids = [tok.eot_token if text == "" else int(text[1:-1]) for text in texts]  # "" : the end-of-text token
        return torch.bincount(torch.tensor(ids), minlength=tok.n_vocab).double()

    counts = draw()
    tempered = torch.softmax(logits / temperature, -1)
    statistic, dof = chi_square(counts, tempered)
    bound = dof + 7 * math.sqrt(2 * dof)  # about the 1e-6 tail of chi-square at these degrees of freedom
    assert dof >= 20 and statistic < bound, (statistic, dof)
    for wrong in (torch.softmax(logits, -1), torch.softmax(logits / temperature ** 2, -1)):  # ignored, twice
        assert chi_square(counts, wrong)[0] > 10 * bound
    counts = draw(top_k=5)
    top = torch.topk(logits, 5).indices
    assert counts[top].sum() == n
    statistic, dof = chi_square(counts[top], tempered[top] / tempered[top].sum())
    assert dof == 4 and statistic < dof + 7 * math.sqrt(2 * dof), statistic


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_lm_eval_model_arguments_keep_equals_signs_in_values_and_take_batch_size_and_device():
    from eval.lm_adapter import GrapeLM

    class Captured(GrapeLM):
        def __init__(self, **kwargs):
            self.kwargs = kwargs
    made = Captured.create_from_arg_string("ckpt=/runs/a=b/ckpt.pt,max_length=64,,batch_size=2",
                                           {"batch_size": 8, "device": "cpu", "max_batch_size": 9, "other": None})
    assert made.kwargs == {"ckpt": "/runs/a=b/ckpt.pt", "max_length": "64", "batch_size": 8, "device": "cpu"}
    kept = Captured.create_from_arg_string("ckpt=x.pt,batch_size=2", {"batch_size": None})
    assert kept.kwargs == {"ckpt": "x.pt", "batch_size": "2"}
