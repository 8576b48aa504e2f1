"""eval/reach.py: each head's attention mass by distance and positional penalty, against the definitions computed
here by hand from the model's own weights."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from eval import reach
from model import GPT, GPTConfig
from positional import alibi_slopes

pytestmark = pytest.mark.usefixtures("one_thread")
EOT = 0


def tiny(pos, **config):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**dict(n_layer=2, n_head=2, n_embd=32, head_dim=16, vocab_size=40, block_size=16,
                                    pos=pos), **config})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias." in name:  # the positional parameters off their init, so that each one matters
                p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    return model


def text(n, seed=0):
    """n tokens of 'documents': ids 1..39, an eot (0) every 100 tokens."""
    tokens = torch.randint(1, 40, (n,), generator=torch.Generator().manual_seed(seed)).numpy()
    tokens[::100] = EOT
    return tokens


def layer_inputs(model, x):
    """Each layer's normalised input x (what its attention reads), by a forward pass with hooks."""
    inputs = []
    hooks = [block.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0].detach()))
             for block in model.blocks]
    with torch.no_grad():
        model(x)
    for hook in hooks:
        hook.remove()
    return inputs


def attention_weights_by_hand(model, x):
    """Per layer, (H, T, T) attention weights of the rope / nope model, from its weights: q, k by the qkv
    projection, the QK RMSNorm, then RoPE's rotation of planes (i, i + d/2), then softmax of q.k/sqrt(d)."""
    out = []
    T = x.shape[1]
    for block, h in zip(model.blocks, layer_inputs(model, x)):
        attn = block.attn
        heads = attn.qkv(h).view(1, T, 3 * attn.n_head, attn.head_dim).transpose(1, 2)
        q, k, _ = heads.split(attn.n_head, dim=1)
        q, k = attn.q_norm(q), attn.k_norm(k)
        if model.config.pos == "rope":
            d = attn.head_dim
            theta = model.config.rope_base ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2 / d)
            angle = torch.arange(T, dtype=torch.float64)[:, None] * theta[None]
            cos, sin = angle.cos().float(), angle.sin().float()

            def rotate(v):
                a, b = v[..., :d // 2], v[..., d // 2:]
                return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
            q, k = rotate(q), rotate(k)
        logits = (q @ k.transpose(-1, -2))[0] / math.sqrt(attn.head_dim)
        logits = logits.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        out.append(torch.softmax(logits.double(), -1).detach())
    return out


@pytest.mark.parametrize("pos", ["rope", "nope"])
def test_the_mass_by_distance_is_the_mean_attention_weight_at_that_distance(pos):
    model = tiny(pos)
    tokens = text(2000)
    layers = reach.head_reach(model, tokens, EOT, context=16, factor=2, windows=3, device="cpu")
    starts = reach.reading_windows(tokens, EOT, 16, 3)
    expected = [np.zeros((2, 9)) for _ in model.blocks]
    for start in starts:
        x = torch.from_numpy(np.asarray(tokens[start:start + 16], dtype=np.int64))[None]
        for layer, weights in enumerate(attention_weights_by_hand(model, x)):
            for t in range(8, 16):
                for d in range(9):
                    expected[layer][:, d] += weights[:, t, t - d].numpy() / (8 * len(starts))
    for layer, values in enumerate(layers):
        np.testing.assert_allclose(values["mass"], expected[layer], atol=1e-5)
        for head in range(2):  # the smallest d whose cumulative mass reaches 90%
            cumulative = np.cumsum(expected[layer][head])
            want = int(np.argmax(cumulative >= 0.9)) if cumulative[-1] >= 0.9 else None
            assert values["reach_mass"][head] == want
        assert "penalty" not in values  # a rotation has no additive penalty


def test_alibis_penalty_is_its_slope_times_the_distance_and_its_reach_where_that_meets_the_margin():
    model = tiny("alibi")
    layers = reach.head_reach(model, text(3000), EOT, context=16, factor=4, windows=2, device="cpu")
    slopes = alibi_slopes(2).double().numpy()
    distances = np.arange(33)
    for values in layers:
        np.testing.assert_allclose(values["penalty"], slopes[:, None] * distances[None], rtol=1e-6, atol=1e-6)
        for head in range(2):
            over = np.flatnonzero(slopes[head] * distances >= values["margin"][head])
            assert values["reach_penalty"][head] == (int(over[0]) if len(over) else None)


def test_foxs_penalty_is_the_sum_of_its_log_forget_gates_over_the_distance():
    """penalty(d) = mean over queries t of -(log f_{t-d+1} + ... + log f_t), f = sigmoid(w.x + b) of each layer's
    input; the margin is the median over queries of the best minus the median content logit q.k/sqrt(d)."""
    model = tiny("fox")
    tokens = text(3000, seed=1)
    layers = reach.head_reach(model, tokens, EOT, context=16, factor=4, windows=2, device="cpu")
    [start_a, start_b] = reach.reading_windows(tokens, EOT, 64, 2)
    for layer in range(2):
        penalty, margins = np.zeros((2, 33)), []
        for start in (start_a, start_b):
            x = torch.from_numpy(np.asarray(tokens[start:start + 64], dtype=np.int64))[None]
            h = layer_inputs(model, x)[layer]
            attn = model.blocks[layer].attn
            log_f = F.logsigmoid(attn.bias.gate(h))[0].detach().double().T.numpy()  # (H, T)
            heads = attn.qkv(h).view(1, 64, 6, 16).transpose(1, 2)
            q, k = attn.q_norm(heads[:, :2]), attn.k_norm(heads[:, 2:4])
            content = ((q @ k.transpose(-1, -2))[0] / 4).detach().double().numpy()
            for t in range(32, 64):
                for d in range(33):
                    penalty[:, d] += -log_f[:, t - d + 1:t + 1].sum(1) / 64
                margins.append(content[:, t, :t + 1].max(1) - np.median(content[:, t, :t + 1], axis=1))
        np.testing.assert_allclose(layers[layer]["penalty"], penalty, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(layers[layer]["margin"], np.median(np.stack(margins, 1), axis=1), rtol=1e-4)


def test_windows_lie_inside_documents_first_and_the_report_names_each_head(tmp_path):
    tokens = np.array([0] + [5] * 30 + [0] + [6] * 8 + [0] + [7] * 25)
    # each start .. start + 10 inside one document (tokens 1-30, 32-39, 41-65); then across documents
    assert reach.reading_windows(tokens, 0, 10, 3) == [1, 12, 41]
    assert reach.reading_windows(tokens, 0, 10, 6) == [1, 12, 41, 52, 0, 11]
    result = {"name": "r", "encoding": "alibi", "train_context": 16, "additive": True, "largest_distance": 32,
              "heads": [{"layer": 0, "head": 0, "reach_mass": 3, "reach_penalty": None, "margin": 2.0},
                        {"layer": 0, "head": 1, "reach_mass": 5, "reach_penalty": 7, "margin": 1.5}]}
    assert reach.encoding_reach(result) == 32  # a head that reaches past what was read reaches at least that far
    assert "| r | alibi | 0 | 0 | 3 | > 32 | 2.00 |" in reach.markdown_report([result])
    assert reach.encoding_reach({**result, "additive": False}) is None


def test_the_summary_line_names_the_mass_range_the_heads_beyond_it_and_the_longest_reach():
    head = {"layer": 0, "head": 0, "reach_mass": 3, "reach_penalty": None, "margin": 2.0}
    result = {"name": "r", "encoding": "alibi", "train_context": 16, "additive": True, "largest_distance": 32,
              "reach": 32, "heads": [head, {**head, "head": 1, "reach_mass": 5, "reach_penalty": 7},
                                     {**head, "head": 2, "reach_mass": None, "reach_penalty": 9}]}
    assert reach.summary_line(result) == (
        "90% of the attention mass within 3-5 tokens (heads' range; 1 head(s) not within L/2, at L = 16); positional "
        "penalty reaches the content margin at 32 tokens in the longest-reaching head (1 head(s) not within 32)")
    none_held = {**result, "additive": False, "heads": [{**h, "reach_mass": None} for h in result["heads"]]}
    assert reach.summary_line(none_held) == "no head holds 90% of its attention mass within L/2 (at L = 16)"
    all_held = {**result, "heads": result["heads"][:2], "reach": 7}
    assert reach.summary_line({**all_held, "heads": [{**h, "reach_penalty": 7} for h in all_held["heads"]]}) == (
        "90% of the attention mass within 3-5 tokens (heads' range, at L = 16); positional penalty reaches the "
        "content margin at 7 tokens in the longest-reaching head")


@pytest.mark.fault
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_one_sentence_and_no_results(tmp_path, capsys, value):
    """A NaN weight made every score NaN (or 0.000) and was reported as a model's result."""
    from helpers import run_with_non_finite_weight
    named = run_with_non_finite_weight(tmp_path / "run", value)
    with pytest.raises(SystemExit) as exit_info:
        reach.main(["--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: checkpoint {tmp_path / 'run' / 'ckpt.pt'} {named}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("pos", ["fox", "grape_ap"])
def test_reach_read_in_blocks_of_rows_equals_reach_read_all_at_once(pos, monkeypatch):
    """Every query's logits are its own (the features' query axis sliced): 3 rows at a time, 11 blocks of the
    penalty pass's 32 queries, gives what all the queries at once give, holding 3 rows of logits at most."""
    model, tokens = tiny(pos), text(3000, seed=2)
    whole = reach.head_reach(model, tokens, EOT, context=16, factor=4, windows=2, device="cpu", rows_per_block=10**6)
    held, real = [], reach.logits_of
    monkeypatch.setattr(reach, "logits_of",
                        lambda q, k, kwargs, rows: held.append(len(rows)) or real(q, k, kwargs, rows))
    blocked = reach.head_reach(model, tokens, EOT, context=16, factor=4, windows=2, device="cpu", rows_per_block=3)
    # each pass's last block holds 2 of its queries (8 = 3 + 3 + 2, 32 = 10 x 3 + 2), in each of 2 layers x 2 windows
    assert max(held) == 3 and held.count(2) == 2 * (2 * 2)
    for a, b in zip(whole, blocked):
        np.testing.assert_allclose(a["mass"], b["mass"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(a["penalty"], b["penalty"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a["margin"], b["margin"], rtol=1e-5, atol=1e-6)
        assert a["reach_mass"] == b["reach_mass"] and a["reach_penalty"] == b["reach_penalty"]
    assert any(r is not None for layer in whole for r in layer["reach_penalty"])  # (the reaches were compared)


@pytest.mark.fault
def test_validation_text_just_long_enough_reads_one_window_at_each_length():
    """Text without documents, one token more than a window: the mass pass at factor 1 was a KeyError, and FoX's
    penalty pass read no window and the report called FoX an encoding without a positional penalty."""
    model = tiny("fox")
    no_documents = torch.randint(1, 40, (4 * 16 + 1,), generator=torch.Generator().manual_seed(5)).numpy()
    assert reach.reading_windows(no_documents, EOT, 64, 4) == [0]
    layers = reach.head_reach(model, no_documents, EOT, context=16, factor=4, windows=4, device="cpu")
    assert all(len(layer["penalty"][0]) == 33 and len(layer["mass"][0]) == 9 for layer in layers)
    layers = reach.head_reach(model, no_documents[:17], EOT, context=16, factor=1, windows=4, device="cpu")
    assert all("penalty" in layer for layer in layers)
    with pytest.raises(ValueError, match="has 16 tokens, too few for one window of 1 x 16"):
        reach.head_reach(model, no_documents[:16], EOT, context=16, factor=1, windows=4, device="cpu")


@pytest.mark.fault
@pytest.mark.parametrize("option, value", [("--factor", "0"), ("--windows", "-1")])
def test_a_factor_or_window_count_below_1_names_that_option_and_its_value_alone(capsys, option, value):
    with pytest.raises(SystemExit):
        reach.parse_args(["--ckpt", "RUN", "--out", "OUT", option, value])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: {option} must be at least 1 (got {value})")


@pytest.mark.fault
def test_several_checkpoints_are_all_checked_before_any_is_evaluated(tmp_path, capsys, monkeypatch):
    """The second checkpoint's longer context needs more validation text than there is: refused before the first
    one's work, which was otherwise done and thrown away."""
    from eval.tiny import save_run, tiny_model
    from helpers import prepare_byte_corpus
    data_dir = prepare_byte_corpus(tmp_path, ["a fact, then another one. " * 40], val_tokens=300)
    save_run(tiny_model("alibi", block_size=16), tmp_path / "short")
    save_run(tiny_model("alibi", block_size=64), tmp_path / "long")
    monkeypatch.setattr(reach, "head_reach", lambda *a, **k: pytest.fail("no checkpoint may be evaluated"))
    with pytest.raises(SystemExit) as exit_info:
        reach.main(["--ckpt", str(tmp_path / "short"), str(tmp_path / "long"), "--data-dir", data_dir, "--out",
                    str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"error: the validation split of {data_dir} has 300 tokens, too few for one "
                                       "window of 8 x 64; lower --factor (or --context)\n")


def test_reach_mass_and_reach_penalty_at_and_around_their_thresholds(monkeypatch):
    """reach_mass is the first distance whose cumulative mass reaches the share (reaching it exactly counts), None
    where the whole band holds less; reach_penalty the first distance whose penalty reaches the margin. A share
    away from its default, exactly representable, so 'reaches' is tested at equality."""
    monkeypatch.setattr(reach, "MASS_SHARE", 0.75)
    mass = reach.MassByDistance(n_layer=1, context=6)
    mass.count = 2  # totals over two queries: per query the masses below
    mass.total[0] = 2 * torch.tensor([[0.5, 0.25, 0.25, 0.0],      # 0.75 exactly at distance 1
                                      [0.5, 0.2499, 0.2, 0.0501],  # just below at 1, past it at 2
                                      [0.25, 0.25, 0.2499, 0.0],   # 0.7499 over the whole band: beyond it
                                      [0.25, 0.25, 0.0, 0.25]],    # 0.75 exactly at the last distance read
                                     dtype=torch.float64)
    assert mass.result()[0]["reach_mass"] == [1, 2, None, 3]

    penalty = reach.PenaltyByDistance(n_layer=1, context=6)
    penalty.count = 1
    penalty.total[0] = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 3, dtype=torch.float64)
    penalty.margins[0] = [torch.tensor([[2.0, 2.0, 2.0], [2.0001, 1.0, 3.0], [3.0001, 3.0001, 9.0]],
                                       dtype=torch.float64)]  # medians over the rows: 2.0, 2.0001, 3.0001
    got = penalty.result()[0]
    np.testing.assert_allclose(got["margin"], [2.0, 2.0001, 3.0001])
    assert got["reach_penalty"] == [2, 3, None]
