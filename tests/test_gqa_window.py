"""Grouped-query attention (n_kv_head) and sliding windows (window, global_every) in the whole model, for every
encoding, composition and KV-shift:

* a grouped model equals the multi-head model whose key-side weights are tied within each group (logits, and
  gradients summed over each group), built here by copying weights between the two layouts;
* the model's logits equal the written-out definitions of tests/test_references.py (the keys of each query head's
  group, the window's mask on the formula's logits) on the dense and the default backends;
* a window as wide as the sequence or wider is full attention, one key narrower is not;
* KV-cache decoding (one token at a time, and chunks wider than the window) equals the full forward with windows
  narrower and wider than the prompt, grouped keys and a local/global pattern;
* the cache holds n_kv_head heads and a local layer min(window - 1, max_len) slots: its bytes against hand counts.
"""
import pytest
import torch

from model import GPT, GPTConfig
from positional import ENCODINGS
from test_references import perturbed_model, reference_logits

VOCAB = 41
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits on a busy machine
ALL_POS = list(ENCODINGS) + ["rope+grape_ap", "grape_m+alibi", "grape_m_ctx+fox", "grape_m_basis+grape_a_qk"]
CASES = [(pos, kv_shift) for pos in ALL_POS for kv_shift in (False, True)]
IDS = [f"{pos}{'+kv_shift' if kv else ''}" for pos, kv in CASES]


def tokens(B=2, T=12, seed=1):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def model_with(pos, kv_shift=False, **overrides):
    """perturbed_model (gains and positional parameters off their init), with a per-head spectrum so that the
    spectrum's grouping is exercised too."""
    overrides.setdefault("spectrum_per_head", True)
    return perturbed_model(pos, kv_shift, **overrides)


# ------------------------------------------------------------------ grouped = multi-head with tied key heads

def key_side_rows(name, shape, cfg):
    """For a multi-head parameter, how its rows split into query-side and key-side heads: None when the parameter
    is not per head on the key side, else (number of leading query-side rows, rows per head) of a tensor whose
    key-side part is n_head heads stacked (a fused k/v layout is handled by the caller)."""
    H, d = cfg.n_head, cfg.head_dim
    if name.endswith("attn.qkv.weight"):
        return "qkv"
    if name.endswith("kv_shift.gate.weight"):
        return "kv_shift"
    if name.endswith("bias.key_gate") or name.endswith("rotation.log_theta") and len(shape) == 2:
        return "per_head"
    if name.endswith("bias.path.weight"):
        return "path"
    return None


def heads(t, n):
    return t.reshape(n, -1, *t.shape[1:])


def leaders(t, G):
    """Rows of n heads -> the first head of each group of G: (n / G heads)."""
    n = t.shape[0]
    return t.reshape(n // G, G, *t.shape[1:])[:, 0]


def group_sums(t, G):
    n = t.shape[0]
    return t.reshape(n // G, G, *t.shape[1:]).sum(1)


def multi_head_to_grouped(name, t, cfg, G, reduce):
    """The grouped layout of multi-head tensor t (a weight or its gradient): key-side heads reduced over each group
    by `reduce` (leaders for weights, group sums for gradients); query-side rows as they are."""
    kind = key_side_rows(name, t.shape, cfg)
    H, d = cfg.n_head, cfg.head_dim
    if kind == "qkv":
        q, k, v = heads(t, 3 * H).split(H)
        return torch.cat([q, reduce(k, G), reduce(v, G)]).reshape(-1, t.shape[-1])
    if kind == "kv_shift":
        a_k, a_v = t.split(H)
        return torch.cat([reduce(a_k, G), reduce(a_v, G)])
    if kind == "per_head":
        return reduce(t, G)
    return t


def tie_key_heads(model, G):
    """Give every head of a group its leader's key-side weights (k and v rows, KV-shift gates, key gate, per-head
    spectrum, and GRAPE-AP's path projection, which is the key side too)."""
    cfg = model.config
    with torch.no_grad():
        for name, p in model.named_parameters():
            kind = key_side_rows(name, p.shape, cfg)
            if kind == "qkv":
                q, k, v = heads(p, 3 * cfg.n_head).split(cfg.n_head)
                for part in (k, v):
                    part.copy_(leaders(part, G).repeat_interleave(G, 0))
            elif kind == "kv_shift":
                for part in p.split(cfg.n_head):
                    part.copy_(leaders(part, G).repeat_interleave(G, 0))
            elif kind == "per_head":
                p.copy_(leaders(p, G).repeat_interleave(G, 0))
            elif kind == "path":
                rows = heads(p, cfg.n_head)
                rows.copy_(leaders(rows, G).repeat_interleave(G, 0))


@pytest.mark.parametrize("pos,kv_shift", CASES, ids=IDS)
def test_grouped_equals_multi_head_with_tied_key_heads(pos, kv_shift):
    G, idx, targets = 2, tokens(), tokens(seed=2)
    mha = model_with(pos, kv_shift, n_head=4, window=5, global_every=2)
    tie_key_heads(mha, G)
    gqa = GPT(GPTConfig(**{**vars(mha.config), "n_kv_head": 4 // G}))
    gqa.load_state_dict({name: multi_head_to_grouped(name, t, mha.config, G, leaders)
                         for name, t in mha.state_dict().items()})
    grads = []
    for model in (mha, gqa):
        logits, loss = model(idx, targets, start_pos=3)
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(gqa(idx, start_pos=3)[0], mha(idx, start_pos=3)[0], atol=1e-5, rtol=1e-5)
    for name, grad in grads[1].items():
        expected = multi_head_to_grouped(name, grads[0][name], mha.config, G, group_sums)
        if key_side_rows(name, grad.shape, mha.config) == "path":  # p feeds query and (averaged) key sides
            grad, expected = group_sums(heads(grad, 4), G), group_sums(heads(expected, 4), G)
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


# ------------------------------------------------------------------ against the written-out definitions

@pytest.mark.parametrize("pos,kv_shift", CASES, ids=IDS)
@pytest.mark.parametrize("backend", ["auto", "dense"])
def test_grouped_windowed_logits_equal_the_definitions(pos, kv_shift, backend):
    """2 query heads per key head, a window of 4 in layer 1 and full attention in layer 2 (global_every = 2: the
    last layer), at start position 7."""
    model = model_with(pos, kv_shift, n_head=4, n_kv_head=2, window=4, global_every=2, attn_backend=backend)
    idx = tokens()
    with torch.no_grad():
        got = model(idx, start_pos=7)[0].double()
    torch.testing.assert_close(got, reference_logits(model, idx, start_pos=7), atol=2e-4, rtol=1e-4)


BOUNDARY_POS = ["rope", "fox", "grape_ap", "grape_m_ctx+grape_a_qk"]


@pytest.mark.parametrize("pos", BOUNDARY_POS)
@pytest.mark.parametrize("n_kv_head,window,global_every,n_layer", [
    (1, 1, None, 2),    # multi-query, each query sees itself only
    (4, 11, 1, 2),      # window T - 1, but every layer global (the first among them)
    (1, 11, 3, 3),      # T - 1, the last of three layers global
    (2, 11, 2, 3),      # T - 1, the middle layer global
])
def test_boundary_windows_and_groups_equal_the_definitions(pos, n_kv_head, window, global_every, n_layer):
    model = model_with(pos, True, n_head=4, n_kv_head=n_kv_head, window=window, global_every=global_every,
                       n_layer=n_layer)
    idx = tokens(T=12)
    with torch.no_grad():
        got = model(idx, start_pos=2)[0].double()
    torch.testing.assert_close(got, reference_logits(model, idx, start_pos=2), atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("pos", ALL_POS)
def test_window_at_least_the_sequence_is_full_attention(pos):
    T = 12
    full = model_with(pos, True, n_kv_head=2)
    idx = tokens(T=T)
    with torch.no_grad():
        expected = full(idx, start_pos=5)[0]
        for window in (T, T + 1):
            windowed = GPT(GPTConfig(**{**vars(full.config), "window": window}))
            windowed.load_state_dict(full.state_dict())
            torch.testing.assert_close(windowed(idx, start_pos=5)[0], expected, atol=1e-5, rtol=1e-5)
        narrower = GPT(GPTConfig(**{**vars(full.config), "window": T - 1}))
        narrower.load_state_dict(full.state_dict())
        changed = narrower(idx, start_pos=5)[0]
    assert (changed[:, :T - 1] - expected[:, :T - 1]).abs().max() < 1e-5  # the last query alone loses a key
    # (FoX's gates leave the farthest key a weight near e^-10: a small but clear change)
    assert (changed[:, -1] - expected[:, -1]).abs().max() > 3e-6


# ------------------------------------------------------------------ KV cache

def cached_steps(model, idx, prefill, chunks=(), start_pos=3):
    """Logits of a prefill of `prefill` tokens, then chunks of the given sizes, then one token at a time."""
    cache = model.new_cache(idx.shape[0], idx.shape[1], start_pos=start_pos)
    out, at = [model(idx[:, :prefill], cache=cache)[0]], prefill
    for size in chunks:
        out.append(model(idx[:, at:at + size], cache=cache)[0])
        at += size
    out += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(at, idx.shape[1])]
    return torch.cat(out, dim=1), cache


@pytest.mark.parametrize("pos,kv_shift", CASES, ids=IDS)
@pytest.mark.parametrize("window", [3, 8], ids=["window<prompt", "window>prompt"])
def test_cache_decoding_equals_the_full_forward(pos, kv_shift, window):
    """2 query heads per key head; layers 1 and 3 local, layer 2 global; a prompt of 5, a chunk of 4 (wider than
    the window of 3: the ring keeps its last tokens), then single tokens."""
    model = model_with(pos, kv_shift, n_layer=3, n_kv_head=2, window=window, global_every=2)
    idx = tokens(T=16)
    with torch.no_grad():
        full = model(idx, start_pos=3)[0]
        got, cache = cached_steps(model, idx, 5, chunks=(4,))
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)
    assert cache.pos == 19


@pytest.mark.parametrize("pos", BOUNDARY_POS)
@pytest.mark.parametrize("window,prefill,chunks", [(1, 1, ()), (4, 4, (4, 5)), (4, 2, (9,)), (15, 14, ()),
                                                   (16, 5, ()), (17, 16, ())])
def test_cache_at_the_window_boundaries(pos, window, prefill, chunks):
    """Windows of one key, a prompt and chunks exactly the window wide, a chunk wider than two windows, T - 1, T,
    T + 1; multi-query, every layer local."""
    model = model_with(pos, True, n_kv_head=1, window=window)
    idx = tokens(T=16)
    with torch.no_grad():
        full = model(idx, start_pos=3)[0]
        got, _ = cached_steps(model, idx, prefill, chunks)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def test_cache_holds_n_kv_head_heads_and_window_slots():
    """Bytes of the cache tensors against hand counts: k and v of n_kv_head heads × head_dim, fp32; a local layer
    holds window - 1 slots (the keys before a new token that its window reaches), a global one max_len; ALiBi
    adds no per-head key feature (positions only, shared)."""
    B, T, d = 2, 20, 8
    idx = tokens(B=B, T=T)
    sizes = {}
    for n_kv_head in (4, 1):
        model = model_with("rope", False, n_layer=2, n_head=4, n_kv_head=n_kv_head, head_dim=d)
        cache = model.new_cache(B, T)
        with torch.no_grad():
            model(idx, cache=cache)
        sizes[n_kv_head] = cache.nbytes()
        assert sizes[n_kv_head] == 2 * 2 * B * n_kv_head * T * d * 4  # layers, k and v, fp32
    assert sizes[1] / sizes[4] == 0.25
    model = model_with("alibi", False, n_layer=2, n_head=4, n_kv_head=2, head_dim=d, window=6, global_every=2)
    cache = model.new_cache(B, T)
    with torch.no_grad():
        model(idx[:, :9], cache=cache)
        for t in range(9, T):
            model(idx[:, t:t + 1], cache=cache)
    local, full = (layer.nbytes() for layer in cache.layers)
    assert local == 2 * B * 2 * 5 * d * 4 + 5 * 4  # k, v of 5 slots, and 5 shared positions
    assert full == 2 * B * 2 * T * d * 4 + T * 4


def test_layer_windows_follow_global_every():
    """Layers global_every, 2·global_every, ... (counting from 1) are global; global_every = 1 makes every layer
    global, n_layer the last alone; no global_every: every layer local."""
    def windows(global_every, n_layer=4):
        cfg = GPTConfig(n_layer=n_layer, n_head=4, n_embd=32, head_dim=8, vocab_size=8, window=5,
                        global_every=global_every)
        return [block.attn.window for block in GPT(cfg).blocks]
    assert windows(4) == [5, 5, 5, None]
    assert windows(3) == [5, 5, None, 5]
    assert windows(1) == [None] * 4
    assert windows(None) == [5] * 4
    assert windows(2, n_layer=5) == [5, None, 5, None, 5]


@pytest.mark.parametrize("values,message", [
    ({"n_kv_head": 3}, "n_kv_head (3) must divide n_head (4)"),
    ({"n_kv_head": 0}, "n_kv_head must be a positive integer"),
    ({"window": 0}, "window must be a positive integer"),
    ({"window": 2.5}, "window must be a positive integer"),
    ({"window": True}, "window must be a positive integer"),
    ({"global_every": 4}, "global_every (4) picks the layers that ignore the window, so it needs a window"),
    ({"window": 8, "global_every": -1}, "global_every must be a positive integer"),
    ({"n_kv_heads": 2}, "did you mean 'n_kv_head'"),
])
def test_bad_grouping_or_window_is_one_sentence(values, message):
    with pytest.raises(ValueError) as error:
        GPTConfig.from_dict({"n_head": 4, **values})
    assert message in str(error.value)


RELATIVE = ["nope", "rope", "grape_m", "grape_m_basis", "grape_m_ctx", "alibi", "grape_a_q", "grape_a_k",
            "grape_a_qk", "fox", "grape_m+alibi", "grape_m_ctx+fox"]


@pytest.mark.parametrize("pos", RELATIVE)
def test_grouped_windowed_models_keep_start_position_invariance(pos):
    model = model_with(pos, True, n_kv_head=2, window=4, global_every=2)
    idx = tokens(T=10)
    with torch.no_grad():
        torch.testing.assert_close(model(idx, start_pos=0)[0], model(idx, start_pos=333)[0], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("window", [7, 8, 9])
def test_grape_ap_window_at_a_block_boundary_of_the_chunked_path(monkeypatch, window):
    """The chunked GRAPE-AP path in blocks of 8 query rows (the model's blocks are wider than these sequences
    otherwise): windows one key short of a block, a block, a block and a key; the definitions and cached decoding."""
    import attention_kernels.grape_ap
    monkeypatch.setattr(attention_kernels.grape_ap, "default_block_size", lambda batch_heads, key_len: 8)
    model = model_with("rope+grape_ap", True, n_kv_head=2, window=window)
    idx = tokens(T=30)
    with torch.no_grad():
        full = model(idx, start_pos=3)[0]
        torch.testing.assert_close(full.double(), reference_logits(model, idx, start_pos=3), atol=2e-4, rtol=1e-4)
        got, _ = cached_steps(model, idx, 16, chunks=(9,))
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def test_flops_per_token_counts_each_layers_visible_keys():
    """MFU's attention term: a layer attends to min(T, its window) keys per query, so a window at least T counts
    as full attention and each local layer of a narrower window saves 12·H·d·(T - window); grouping changes only
    the parameters (6N)."""
    T, H, d = 64, 4, 8
    base = dict(n_layer=4, n_head=H, n_embd=32, head_dim=d, vocab_size=64, block_size=T)
    full = GPT(GPTConfig(**base)).flops_per_token(T)
    for window in (T, T + 1, 4 * T):
        assert GPT(GPTConfig(**base, window=window)).flops_per_token(T) == full, window
    local_layers = 2  # global_every=2: layers 2 and 4 full
    assert GPT(GPTConfig(**base, window=16, global_every=2)).flops_per_token(T) == \
        full - 12 * H * d * (T - 16) * local_layers
    grouped = GPT(GPTConfig(**base, n_kv_head=1))
    assert full - grouped.flops_per_token(T) == 6 * (GPT(GPTConfig(**base)).num_params() - grouped.num_params())
