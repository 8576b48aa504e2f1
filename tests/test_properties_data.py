"""The data round trip and checkpoint damage, for any input (hypothesis; profiles in conftest.py).

Prepare then load gives, for any documents (empty ones, any Unicode but lone surrogates, which UTF-8 cannot
encode), split over any number of input files, with any validation size and shard size: <|endoftext|> (256)
then the document's UTF-8 bytes, document after document, the first val_tokens of that stream in the validation
shards and the rest in the train shards. A checkpoint with any single byte changed is refused or loads content
equal to the original.
"""
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import checkpoints
from data.loader import load_split_tokens
from data.prepare import files_source, prepare
from helpers import examples

EOT = 256
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@examples(6)
@given(files=st.lists(st.lists(texts, min_size=1, max_size=4), min_size=1, max_size=3), data=st.data())
def test_prepare_then_load_gives_the_utf8_bytes_of_every_document(tmp_path_factory, files, data):
    root = tmp_path_factory.mktemp("docs")
    for i, documents in enumerate(files):
        with open(root / f"part{i}.jsonl", "w", encoding="utf-8") as f:
            for text in documents:
                f.write(json.dumps({"text": text}, ensure_ascii=data.draw(st.booleans())) + "\n")
    stream = [token for documents in files for text in documents for token in [EOT, *text.encode("utf-8")]]
    val_tokens = data.draw(st.integers(1, len(stream) - 1)) if len(stream) > 1 else 0
    shard_tokens = data.draw(st.integers(1, max(1, len(stream))))
    if val_tokens == 0:
        return  # a single empty document: nothing to split
    out = root / "prepared"
    manifest = prepare(files_source(str(root / "*.jsonl")), str(out), tokenizer="byte", val_tokens=val_tokens,
                       shard_tokens=shard_tokens, workers=1, progress_bar=False)
    val, train = load_split_tokens(str(out), "val"), load_split_tokens(str(out), "train")
    assert val.tolist() == stream[:val_tokens]
    assert train.tolist() == stream[val_tokens:]
    assert manifest["tokens"]["val"] == val_tokens and manifest["tokens"]["train"] == len(stream) - val_tokens
    assert all(shard["tokens"] <= shard_tokens for shard in manifest["shards"])


@given(text=texts)
def test_the_byte_tokenizer_is_utf8_and_round_trips(text):
    from data.tokenizer import get_tokenizer
    tok = get_tokenizer("byte")
    assert tok.encode(text) == list(text.encode("utf-8"))
    assert tok.decode(tok.encode(text)) == text
    assert tok.eot_token == EOT and tok.n_vocab > EOT


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    """A small checkpoint of every kind of content train.py saves: tensors of several dtypes and shapes (one
    empty), an optimizer state with int keys, nested lists and dicts, strings, None and floats."""
    torch.manual_seed(0)
    state = {"model": {"w": torch.randn(6, 5), "b": torch.arange(7, dtype=torch.int64), "h": torch.randn(3).half(),
                       "e": torch.zeros(0, 4)},
             "model_config": {"n_layer": 2, "pos": "grape_ap", "qk_norm": "after", "spectrum_scale": 16.0},
             "tokenizer": "byte", "train_config": {"lr": 1e-3, "seed": 42, "reference_layout": "8x3"},
             "step": 1234, "optimizer": {"state": {0: {"exp_avg": torch.randn(6, 5), "step": torch.tensor(3.0)}},
                                         "param_groups": [{"lr": 1e-3, "params": [0], "betas": (0.9, 0.95)}]},
             "rng": {"torch": torch.get_rng_state(), "cuda": None}, "divergence": {"recent": [3.5, 3.25],
                                                                                  "min_loss": 3.25}}
    path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
    checkpoints.save(str(path), state)
    return state, path.read_bytes()


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@examples(60)
@given(data=st.data())
def test_any_flipped_byte_is_refused_or_loads_the_same_content(saved_checkpoint, tmp_path_factory, data):
    state, raw = saved_checkpoint
    position = data.draw(st.integers(0, len(raw) - 1))
    mask = data.draw(st.sampled_from([1 << bit for bit in range(8)] + [0xFF]))
    damaged = bytearray(raw)
    damaged[position] ^= mask
    path = tmp_path_factory.mktemp("flip") / "ckpt.pt"
    path.write_bytes(bytes(damaged))
    try:
        loaded = checkpoints.load(str(path), required=("model", "model_config"))
    except checkpoints.CheckpointError as error:
        assert str(path) in str(error)
        return
    assert same(loaded, state), f"byte {position} ^ {mask:#x} loaded different content"


def test_a_flip_in_every_tensor_payload_is_refused(saved_checkpoint, tmp_path):
    """Deterministic complement: the first byte of every stored tensor's data (where torch.load itself never looks)."""
    state, raw = saved_checkpoint
    import io
    import zipfile
    payloads = [info for info in zipfile.ZipFile(io.BytesIO(raw)).infolist()
                if "/data/" in info.filename and info.file_size]
    assert len(payloads) >= 6
    for info in payloads:
        # the data follow the local header: 30 bytes, then the name and the extra field (lengths at 26 and 28)
        name_length, extra_length = (int.from_bytes(raw[info.header_offset + k:info.header_offset + k + 2], "little")
                                     for k in (26, 28))
        start = info.header_offset + 30 + name_length + extra_length
        damaged = bytearray(raw)
        damaged[start] ^= 0x01
        (tmp_path / "ckpt.pt").write_bytes(bytes(damaged))
        with pytest.raises(checkpoints.CheckpointError, match="do not match the checksum"):
            checkpoints.load(str(tmp_path / "ckpt.pt"))
