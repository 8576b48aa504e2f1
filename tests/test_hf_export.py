"""scripts/export_hf.py: every encoding leaves as a Hugging Face model that computes what ours computes.

The references are independent of the export: our own GPT (logits, and a greedy loop over the tokenizer's
ids written here), transformers' own Qwen3 implementation for the native export, tiktoken for the
tokenizer files, and a fresh process that cannot import this repository or Triton for the remote code.
"""
import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from eval.tiny import save_run
from hf.export import ExportError, export
from model import GPT, GPTConfig
from positional import BIASES, ROTATIONS

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
BYTE_VOCAB, EOT = 257, 256  # the byte tokenizer: ids past 256 are the embedding's padding rows (vocab 320)
TEXTS = ["  the\tmodels' tokens\n\nrotate  ", "Ünïcödé 1234567 ok? — yes", "reads reads reads", "it's 'll've"]
CASES = ([(pos, kv) for pos in ROTATIONS + BIASES for kv in (False, True)]
         + [("rope+grape_ap", False), ("grape_m+alibi", True), ("grape_m_ctx+fox", False)])


def perturbed_model(pos="rope", kv_shift=False, seed=0, **config):
    """A 2-layer byte model whose norm gains and positional parameters are moved off their init values
    (a wrong mapping of any of them shows in the logits)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**dict(n_layer=2, n_head=2, n_embd=32, head_dim=16, vocab_size=320, block_size=64,
                                    pos=pos, kv_shift=kv_shift), **config}))
    noise = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or any(part in name for part in ("rotation.", "bias.", "kv_shift.")):
                p.add_(0.2 * torch.randn(p.shape, generator=noise))
    return model.eval()


def exported(tmp_path, model, fmt="auto"):
    run_dir = save_run(model, str(tmp_path / "run"))
    out = str(tmp_path / "export")
    summary = export(run_dir, out, fmt)
    return out, summary


def greedy_reference(model, prompt, new_tokens):
    """Our model, full forward each step, argmax over the tokenizer's ids; rows that emitted end-of-text
    continue with it (the pad id), and generation ends when every row has (as transformers does)."""
    tokens = prompt
    with torch.no_grad():
        for _ in range(new_tokens):
            logits, _ = model(tokens)
            nxt = logits[:, -1, :BYTE_VOCAB].argmax(-1)
            nxt = torch.where((tokens[:, prompt.shape[1]:] == EOT).any(1), EOT, nxt)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            if bool((tokens[:, prompt.shape[1]:] == EOT).any(1).all()):
                break
    return tokens


def relative_error(ours, theirs):
    return ((ours.double() - theirs.double()).abs().max() / ours.double().abs().max()).item()


@pytest.mark.parametrize("pos,kv_shift", CASES, ids=[f"{p}{'+kv_shift' if kv else ''}" for p, kv in CASES])
def test_export_computes_our_logits_and_greedy_tokens(tmp_path, pos, kv_shift):
    model = perturbed_model(pos, kv_shift)
    out, summary = exported(tmp_path, model)
    native = pos == "rope" and not kv_shift
    assert summary["format"] == ("native Qwen3" if native else "remote code")
    if native:  # loads without remote code, as transformers' own Qwen3
        hf = AutoModelForCausalLM.from_pretrained(out)
        assert type(hf).__name__ == "Qwen3ForCausalLM"
        assert not any(name.endswith(".py") for name in os.listdir(out))
    else:
        hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    ids = torch.randint(0, BYTE_VOCAB, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = model(ids)[0]
        assert relative_error(ours, hf(ids).logits) <= 1e-5
        if not native:  # transformers' Qwen3 computes RoPE in fp32 whatever the dtype; our code runs in fp64
            assert relative_error(model.double()(ids)[0], hf.double()(ids).logits) <= 1e-12
            model.float(), hf.float()
    prompt = ids[:, :8]
    cached = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32)
    uncached = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, use_cache=False)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, greedy_reference(model, prompt, 32))


GROUPED_WINDOW_CASES = [("rope", dict(n_head=4, n_kv_head=2)),
                        ("rope", dict(n_head=4, n_kv_head=1, window=5, global_every=2)),
                        ("rope", dict(n_layer=3, window=7, global_every=3)),
                        ("grape_ap", dict(n_head=4, n_kv_head=2, window=5, global_every=2)),
                        ("fox", dict(n_head=4, n_kv_head=1, window=6))]


@pytest.mark.parametrize("pos,config", GROUPED_WINDOW_CASES,
                         ids=[pos + "-" + "-".join(f"{k}{v}" for k, v in c.items()) for pos, c in GROUPED_WINDOW_CASES])
def test_grouped_and_windowed_exports_compute_our_logits_and_greedy_tokens(tmp_path, pos, config):
    """Qwen3 expresses RoPE with grouped key/value heads and sliding-window layers (its window of w: keys
    t - w + 1 ... t, ours); other encodings go as remote code. 24 tokens and 40 generated: wider than the windows,
    so a window off by one key changes the logits."""
    model = perturbed_model(pos, **config)
    out, summary = exported(tmp_path, model)
    native = pos == "rope"
    assert summary["format"] == ("native Qwen3" if native else "remote code")
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=not native)
    if native:
        assert type(hf).__name__ == "Qwen3ForCausalLM"
        every, window, n_layer = config.get("global_every"), config.get("window"), config.get("n_layer", 2)
        kinds = ["full_attention" if window is None or every and i % every == every - 1 else "sliding_attention"
                 for i in range(n_layer)]
        assert (hf.config.num_key_value_heads, hf.config.layer_types) == (config.get("n_kv_head", 2), kinds)
        assert hf.config.sliding_window == window
        # and back into a training run's weights and config, exactly (train.py's init_from)
        from hf.init_from import initial_state
        state = initial_state(out, dataclasses.asdict(model.config))
        assert all(torch.equal(state[name], tensor) for name, tensor in model.state_dict().items())
    ids = torch.randint(0, BYTE_VOCAB, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert relative_error(model(ids)[0], hf(ids).logits) <= 1e-5
    prompt = ids[:, :8]
    cached = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32)
    assert torch.equal(cached, hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32,
                                           use_cache=False))
    assert torch.equal(cached, greedy_reference(model, prompt, 32))


def test_native_config_sets_every_value_qwen3_would_default_differently(tmp_path):
    out, _ = exported(tmp_path, perturbed_model("rope", norm_eps=1e-5, rope_base=5000.0))
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 5000.0} and config["rope_theta"] == 5000.0
    expected = {"rms_norm_eps": 1e-5, "tie_word_embeddings": True, "num_key_value_heads": 2, "head_dim": 16,
                "intermediate_size": 85, "max_position_embeddings": 64, "vocab_size": 320}
    assert {key: config[key] for key in expected} == expected
    loaded = transformers.AutoConfig.from_pretrained(out)
    assert loaded.rope_parameters["rope_theta"] == 5000.0 and loaded.rms_norm_eps == 1e-5
    with open(os.path.join(out, "generation_config.json")) as f:
        generation = json.load(f)
    assert generation["suppress_tokens"] == list(range(BYTE_VOCAB, 320)) and generation["eos_token_id"] == EOT


@pytest.mark.parametrize("pos", ["grape_m_ctx", "rope"])
def test_round_trip_through_transformers_save_pretrained(tmp_path, pos):
    from hf.init_from import initial_state

    model = perturbed_model(pos, kv_shift=pos != "rope")
    out, _ = exported(tmp_path, model)
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    again_dir = str(tmp_path / "saved_again")
    hf.save_pretrained(again_dir)
    tokenizer.save_pretrained(again_dir)
    again = AutoModelForCausalLM.from_pretrained(again_dir, trust_remote_code=True)
    text = "Positions, rotations and gates. Ünïcödé too."
    ids = torch.tensor([AutoTokenizer.from_pretrained(again_dir, trust_remote_code=True).encode(text)])
    assert ids[0].tolist() == list(text.encode())
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, again(ids).logits)
    # and back into a training run's weights, bit for bit (train.py's init_from)
    state = initial_state(again_dir, {k: getattr(model.config, k) for k in model.config.__dataclass_fields__})
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[name], tensor) for name, tensor in model.state_dict().items())


def test_remote_model_takes_what_transformers_passes(tmp_path):
    """labels, position_ids, padding masks, beam search, and generation continued from a returned cache."""
    model = perturbed_model("rope+grape_ap", kv_shift=True)  # GRAPE-AP's R_ℓ is absolute: positions matter
    out, _ = exported(tmp_path, model)
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    ids = torch.randint(0, BYTE_VOCAB, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        labels = ids.masked_fill(torch.arange(16) < 4, -100)
        _, loss = model(ids[:, :-1], targets=labels[:, 1:].masked_fill(labels[:, 1:] == -100, -1))
        assert hf(ids, labels=labels).loss.item() == pytest.approx(loss.item(), rel=1e-6)
        at_five = hf(ids, position_ids=torch.arange(5, 21).expand(2, -1)).logits
        assert relative_error(model(ids, start_pos=5)[0], at_five) <= 1e-6
        right_padded = torch.ones_like(ids).masked_fill(torch.arange(16) >= 13, 0)
        assert torch.equal(hf(ids, attention_mask=right_padded).logits, hf(ids).logits)
        with pytest.raises(ValueError, match="left padding would shift every position") as error:
            hf(ids, attention_mask=right_padded.flip(1))
        assert "\n" not in str(error.value)
    prompt, ones = ids[:, :6], torch.ones_like(ids[:, :6])
    beams = [hf.generate(prompt, attention_mask=ones, num_beams=3, max_new_tokens=10, use_cache=use_cache)
             for use_cache in (True, False)]
    assert torch.equal(*beams)  # beam search reorders the cache's rows
    first = hf.generate(prompt, attention_mask=ones, max_new_tokens=5, return_dict_in_generate=True)
    cache = {name: value for name, value in first.items() if name != "sequences"}  # (its name varies in 5.x)
    more = hf.generate(first.sequences, max_new_tokens=5, **cache)
    assert torch.equal(more, hf.generate(prompt, attention_mask=ones, max_new_tokens=10))


@pytest.mark.fault
def test_each_loaded_copy_of_the_remote_code_runs_its_own_operators(tmp_path, monkeypatch):
    """An export and its save_pretrained copy in one process (transformers also keeps the copies earlier tests
    loaded): every copy registered the same operator names, the last replacing the others, so the first model's
    GRAPE-AP attention called through a destroyed registration into another copy's code. It passed by luck, and
    failed once with std::bad_alloc under memory pressure (in the test above, whose copy an earlier test had
    loaded). Each model must run its own copy's kernels, and compute our logits."""
    model = perturbed_model("rope+grape_ap", kv_shift=True)
    out, _ = exported(tmp_path, model)
    first = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    first.save_pretrained(str(tmp_path / "copy"))
    second = AutoModelForCausalLM.from_pretrained(str(tmp_path / "copy"), trust_remote_code=True)
    ran = []
    for hf in (first, second):
        kernels = sys.modules[type(hf).__module__.rpartition(".")[0] + ".attention_kernels_grape_ap"]
        monkeypatch.setattr(kernels, "chunked_forward",
                            lambda *args, _real=kernels.chunked_forward, _hf=hf: ran.append(_hf) or _real(*args))
    ids = torch.randint(0, BYTE_VOCAB, (2, 16), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        for hf in (first, second):
            ran.clear()
            assert relative_error(model(ids)[0], hf(ids).logits) <= 1e-5
            assert ran and all(owner is hf for owner in ran)  # one call per layer, each into this model's copy


def test_remote_model_loads_in_bf16_with_fp32_positional_parameters(tmp_path):
    model = perturbed_model("grape_m_ctx+fox", kv_shift=True)
    out, _ = exported(tmp_path, model)
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.bfloat16)
    attn = hf.model.blocks[0].attn
    assert attn.rotation.phase_increment.weight.dtype == attn.bias.gate.weight.dtype == torch.float32
    assert attn.qkv.weight.dtype == attn.kv_shift.gate.weight.dtype == torch.bfloat16
    ids = torch.randint(0, BYTE_VOCAB, (2, 16), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert relative_error(model(ids)[0], hf(ids).logits) <= 0.05  # bf16 weights: about 2% here
    assert hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4).shape == (2, 20)


BLOCK_REPOSITORY = """
import sys
for name in ("model", "positional", "attention", "attention_kernels", "checkpoints", "hf"):
    sys.modules[name] = None  # `import name` fails, find_spec(name) is None: as on a machine without them
"""


def run_fresh(tmp_path, script, **env):
    """Run a Python script in a new process that cannot import this repository, from an empty directory."""
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_HUB_OFFLINE": "1",
           "HF_MODULES_CACHE": str(tmp_path / "modules"), "OMP_NUM_THREADS": "1", **env}
    (tmp_path / "empty").mkdir()
    child = subprocess.run([sys.executable, "-c", BLOCK_REPOSITORY + script], cwd=tmp_path / "empty", env=env,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]


def test_remote_code_runs_without_this_repository_or_triton(tmp_path):
    """Two exports load in a fresh process where neither our modules nor triton import, and decode with the
    cache: our logits and tokens."""
    expected = {}
    for pos, kv_shift in (("grape_ap", True), ("fox", False)):
        model = perturbed_model(pos, kv_shift, seed=3)
        out, _ = exported(tmp_path / pos, model)
        ids = torch.randint(0, BYTE_VOCAB, (1, 12), generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            expected[out] = (ids, model(ids)[0], greedy_reference(model, ids, 16))
    torch.save(expected, tmp_path / "expected.pt")
    run_fresh(tmp_path, f"""
sys.modules["triton"] = None
import torch
from transformers import AutoModelForCausalLM
results = {{}}
for out, (ids, _, _) in torch.load({str(tmp_path / "expected.pt")!r}).items():
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    with torch.no_grad():
        logits = model(ids).logits
    results[out] = (logits, model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16))
    assert model.model.attention_backend in ("sdpa", "lifted", "path_integral"), model.model.attention_backend
torch.save(results, {str(tmp_path / "results.pt")!r})
""")
    results = torch.load(tmp_path / "results.pt")
    for out, (_, logits, tokens) in expected.items():
        assert relative_error(logits, results[out][0]) <= 1e-5
        assert torch.equal(results[out][1], tokens)


def test_remote_code_runs_its_triton_kernel_where_triton_runs(tmp_path):
    """The copied Triton kernel (FoX's bias added inside the tile; run by Triton's CPU interpreter here) in a
    fresh process without this repository: our logits and tokens."""
    pytest.importorskip("triton")
    model = perturbed_model("fox", kv_shift=True, seed=5)
    out, _ = exported(tmp_path, model)
    ids = torch.randint(0, BYTE_VOCAB, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        logits = model(ids)[0]
    torch.save(ids, tmp_path / "ids.pt")
    run_fresh(tmp_path, f"""
import torch
from transformers import AutoModelForCausalLM
ids = torch.load({str(tmp_path / "ids.pt")!r})
config = AutoModelForCausalLM.from_pretrained({out!r}, trust_remote_code=True).config.model_config
model = AutoModelForCausalLM.from_pretrained({out!r}, trust_remote_code=True,
                                             model_config=dict(config, attn_backend="tile"))
assert model.model.attention_backend == "tile", model.model.attention_backend
with torch.no_grad():
    logits = model(ids).logits
tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8)
assert any(name.endswith(".attention_kernels_separable_triton") for name in sys.modules)
torch.save((logits, tokens), {str(tmp_path / "results.pt")!r})
""", TRITON_INTERPRET="1")
    tile_logits, tokens = torch.load(tmp_path / "results.pt")
    assert relative_error(logits, tile_logits) <= 1e-5
    assert torch.equal(tokens, greedy_reference(model, ids, 8))


def test_tokenizer_files_encode_as_tiktoken_does():
    """A small BPE trained here, against tiktoken's Encoding of the same ranks (GPT-2's: the next test)."""
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str

    from hf.tokenizer_files import build_tokenizer

    corpus = ("the model reads every token and learns which word comes next; positions rotate, gates forget. "
              "Ünïcödé bytes and 12345 digits too. ") * 4
    ranks = {bytes([b]): b for b in range(256)}
    words = [list(w.encode()) for w in corpus.split(" ")]
    words = [[bytes([b]) for b in w] for w in words]
    for _ in range(60):  # byte-pair merges: the most frequent adjacent pair becomes the next token
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[a + b] = counts.get(a + b, 0) + 1
        if not counts:
            break
        best = max(counts, key=counts.get)
        ranks[best] = len(ranks)
        merged = []
        for w in words:
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] + w[i + 1] == best:
                    out.append(best)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged.append(out)
        words = merged
    specials = {"<|endoftext|>": len(ranks)}
    reference = tiktoken.Encoding("tiny", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens=specials)
    ours = build_tokenizer(ranks, r50k_pat_str, specials)
    for text in [corpus, *TEXTS]:
        assert ours.encode(text).ids == reference.encode_ordinary(text)
        assert ours.decode(ours.encode(text).ids) == text


def test_a_gpt2_run_exports_the_gpt2_tokenizer(tmp_path):
    import checkpoints
    from data.shards import DataError
    from data.tokenizer import gpt2_encoding
    try:
        gpt2 = gpt2_encoding()
    except DataError:
        pytest.skip("no GPT-2 ranks on this machine (CI installs them)")
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, head_dim=8, vocab_size=50304, block_size=32))
    os.makedirs(tmp_path / "run")
    checkpoints.save(str(tmp_path / "run" / "ckpt.pt"), {"model": model.state_dict(), "tokenizer": "gpt2",
                                                         "model_config": dataclasses.asdict(model.config)})
    export(str(tmp_path / "run"), str(tmp_path / "export"))
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    assert tokenizer.encode("Hello world") == [15496, 995] and tokenizer.eos_token_id == 50256
    for text in TEXTS:
        assert tokenizer.encode(text) == gpt2.encode_ordinary(text) and tokenizer.decode(tokenizer.encode(text)) == text
    generation = transformers.GenerationConfig.from_pretrained(str(tmp_path / "export"))
    assert generation.suppress_tokens == list(range(50257, 50304)) and generation.eos_token_id == 50256


@pytest.mark.parametrize("pos", ["alibi", "grape_ap"])
def test_a_remote_code_exports_tokenizer_loads_without_remote_code_prompt_or_warning(tmp_path, pos):
    """PreTrainedTokenizerFast reads the tokenizer files alone: in a fresh process with stdin closed, nothing asks
    to run custom code, nothing warns, and it encodes as the run's own tokenizer does."""
    out, _ = exported(tmp_path, perturbed_model(pos))
    text = "Positions, rotations and gates. Ünïcödé too."
    script = ("import logging, warnings; warnings.simplefilter('error'); from transformers import "
              f"PreTrainedTokenizerFast; t = PreTrainedTokenizerFast.from_pretrained({out!r}); "
              f"print(t.encode({text!r}), t.eos_token_id)")
    result = subprocess.run([sys.executable, "-c", script], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "TRANSFORMERS_VERBOSITY": "warning"})
    assert result.returncode == 0, result.stderr
    assert "custom code" not in result.stdout + result.stderr and result.stderr.strip() == "", result.stderr
    assert result.stdout.split()[-1] == str(EOT)
    assert result.stdout.rsplit(" ", 1)[0].strip() == str(list(text.encode()))


# ----------------------------------------------------------------------------- bad input

def no_leftovers(directory):
    return not [name for name in os.listdir(directory) if name.endswith(".partial")]


def test_unknown_or_corrupt_checkpoint_is_one_sentence(tmp_path):
    with pytest.raises(ExportError, match="no checkpoint at") as error:
        export(str(tmp_path / "missing"), str(tmp_path / "out"))
    assert "\n" not in str(error.value)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "ckpt.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ExportError) as error:
        export(str(tmp_path / "bad"), str(tmp_path / "out"))
    assert "\n" not in str(error.value) and "ckpt.pt" in str(error.value)
    assert not (tmp_path / "out").exists() and no_leftovers(tmp_path)


def test_existing_output_directory_is_refused_and_left_alone(tmp_path):
    run_dir = save_run(perturbed_model(), str(tmp_path / "run"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    with pytest.raises(ExportError, match="already exists"):
        export(run_dir, str(tmp_path / "out"))
    assert os.listdir(tmp_path / "out") == ["mine.txt"] and no_leftovers(tmp_path)


@pytest.mark.parametrize("depth", [1, 3])
def test_a_file_above_the_output_directory_is_named(tmp_path, depth):
    """A file as the output's parent, or further up (which os.mkdir answered with only "Not a directory")."""
    run_dir = save_run(perturbed_model(), str(tmp_path / "run"))
    (tmp_path / "file").write_text("mine")
    out = os.path.join(tmp_path / "file", *["sub"] * (depth - 1), "out")
    with pytest.raises(ExportError) as error:
        export(run_dir, out)
    assert str(error.value) == (f"the export {out} cannot be made: {tmp_path / 'file'} is a file, not a folder; "
                                "choose another output path (or move the file)")
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("pos,config", [("fox", {}), ("rope", {"kv_shift": True}), ("rope", {"qk_norm": "after"}),
                                        ("nope", {})])
def test_native_export_of_what_qwen3_cannot_express_is_one_sentence(tmp_path, pos, config):
    run_dir = save_run(perturbed_model(pos, **config), str(tmp_path / "run"))
    with pytest.raises(ExportError, match="native Qwen3 cannot express") as error:
        export(run_dir, str(tmp_path / "out"), "native")
    assert "--format remote" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "out").exists() and no_leftovers(tmp_path)


def test_a_failure_while_writing_leaves_nothing_behind(tmp_path, monkeypatch):
    import hf.export

    run_dir = save_run(perturbed_model("fox"), str(tmp_path / "run"))

    def fail(out_dir):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(hf.export, "generate", fail)
    with pytest.raises(ExportError, match="No space left on device"):
        export(run_dir, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() and no_leftovers(tmp_path)


def test_command_line_prints_one_error_line(tmp_path, capsys):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    try:
        import export_hf
    finally:
        sys.path.pop(0)
    with pytest.raises(SystemExit) as exit_info:
        export_hf.main([str(tmp_path / "missing"), str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no checkpoint at") and err.count("\n") == 1


@pytest.mark.fault
def test_a_missing_run_directory_is_named_as_the_command_takes_it_and_the_output_parents_are_made(
        tmp_path, monkeypatch, capsys):
    """`export_hf.py runs/typo OUT` answered "pass --ckpt a run directory" (an option it does not have), and an
    output path whose parent did not exist was refused: now RUN_DIR and the runs that exist are named, and missing
    parents are made (and removed again when the export fails)"""
    import hf.export
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    try:
        import export_hf
    finally:
        sys.path.pop(0)
    monkeypatch.chdir(tmp_path)
    save_run(perturbed_model("fox"), "runs/fox")
    with pytest.raises(SystemExit) as exit_info:
        export_hf.main(["runs/fx", "exports/new/fox"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err == (
        "error: no checkpoint at runs/fx: it does not exist, and RUN_DIR takes a run directory that holds ckpt.pt "
        "(written by train.py) or a checkpoint file; did you mean runs/fox? the runs that exist under runs/: "
        "runs/fox\n")
    assert not (tmp_path / "exports").exists()
    real_generate = hf.export.generate

    def fail(out_dir):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(hf.export, "generate", fail)
    with pytest.raises(SystemExit):
        export_hf.main(["runs/fox", "exports/new/fox"])
    assert "No space left on device" in capsys.readouterr().err and not (tmp_path / "exports").exists()
    monkeypatch.setattr(hf.export, "generate", real_generate)
    export_hf.main(["runs/fox", "exports/new/fox"])
    assert json.loads((tmp_path / "exports/new/fox/config.json").read_text())["model_config"]["pos"] == "fox"


@pytest.mark.fault
def test_a_parent_that_cannot_be_made_leaves_none_of_the_parents_the_export_made(tmp_path, monkeypatch):
    """Making the third of four missing parent directories of the output fails (permission denied): the two this
    export made are removed again, deepest first, and the directory that existed before, with what it holds, stays;
    a made directory that someone else removed meanwhile does not stop the removal of those above it."""
    import hf.export
    run_dir = save_run(perturbed_model("fox"), str(tmp_path / "run"))
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "mine.txt").write_text("keep")
    blocked = str(tmp_path / "existing" / "a" / "b" / "c")
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if str(path) == blocked:
            raise PermissionError(13, "Permission denied")
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(hf.export.os, "mkdir", mkdir)
    with pytest.raises(ExportError) as error:
        export(run_dir, str(tmp_path / "existing" / "a" / "b" / "c" / "d" / "out"))
    assert str(error.value) == (f"cannot make the output's parent directory {blocked} (Permission denied); check the "
                                "permissions there or choose another output path")
    assert os.listdir(tmp_path / "existing") == ["mine.txt"] and no_leftovers(tmp_path / "existing")
    monkeypatch.setattr(hf.export.os, "mkdir", real_mkdir)

    made = hf.export.make_parents(str(tmp_path / "x" / "y" / "z"))
    assert made == [str(tmp_path / "x" / "y" / "z"), str(tmp_path / "x" / "y"), str(tmp_path / "x")]
    os.rmdir(made[0])  # someone else removed the deepest one
    hf.export.remove_empty(made)
    assert sorted(os.listdir(tmp_path)) == ["existing", "run"]


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


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


def test_format_remote_exports_even_a_native_model_as_remote_code_with_its_step(tmp_path):
    """--format remote on a model Qwen3 could express: remote code all the same (the user asked for it), computing
    our logits; the summary names the checkpoint's step."""
    model = perturbed_model("rope", False)
    run_dir = save_run(model, str(tmp_path / "run"), step=7)
    out = str(tmp_path / "export")
    summary = export(run_dir, out, "remote")
    assert summary["format"] == "remote code" and summary["step"] == 7
    assert any(name.endswith(".py") for name in os.listdir(out))
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert type(hf).__name__ != "Qwen3ForCausalLM"
    ids = torch.randint(0, BYTE_VOCAB, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert relative_error(model(ids)[0], hf(ids).logits) <= 1e-5


@pytest.mark.fault
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_not_exported(tmp_path, capsys, value):
    from helpers import run_with_non_finite_weight
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    try:
        import export_hf
    finally:
        sys.path.pop(0)
    named = run_with_non_finite_weight(tmp_path / "run", value)
    with pytest.raises(SystemExit) as exit_info:
        export_hf.main([str(tmp_path / "run"), str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: checkpoint {tmp_path / 'run' / 'ckpt.pt'} {named}")
    assert sorted(os.listdir(tmp_path)) == ["run"]  # nothing written beside it
