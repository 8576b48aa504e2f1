"""What several test files share: a tiny byte-level model's config file and a corpus prepared for it
(the fixture `one_thread` is in conftest.py)."""
import json
import random

# A 2-layer, 32-wide model on byte tokens (vocabulary 256 + specials < 320) and a few steps of training.
TINY_MODEL = dict(n_layer=2, n_head=2, n_embd=32, head_dim=16, vocab_size=320, block_size=32)
TINY_TRAIN = dict(batch_size=4, global_batch_size=4, max_iters=6, lr=1e-2, min_lr=1e-3, warmup_iters=2,
                  log_interval=1, eval_interval=0, eval_windows=8, ckpt_interval=0, device="cpu")


def tiny_config(data_dir, model=None, **train) -> str:
    """The TOML text of the tiny model trained on data_dir: `model` overrides [model] keys, keyword
    arguments override [train] keys."""
    def section(values):
        return "\n".join(f"{key} = {json.dumps(value)}" for key, value in values.items())
    return (f"[model]\n{section({**TINY_MODEL, **(model or {})})}\n\n"
            f"[train]\n{section({'data_dir': str(data_dir), **TINY_TRAIN, **train})}\n")


def synthetic_text(seed: int, n_words: int) -> str:
    """English-like text from a small vocabulary: a byte model can learn its words quickly."""
    rng = random.Random(seed)
    words = ("the model reads every token and learns which word comes next in a sentence about "
             "positions rotations gates and biases of attention heads").split()
    sentences = []
    while n_words > 0:
        length = rng.randint(4, 12)
        sentences.append(" ".join(rng.choice(words) for _ in range(length)).capitalize() + ".")
        n_words -= length
    return " ".join(sentences)


def prepare_byte_corpus(root, texts, *, val_tokens=4096, shard_tokens=50_000) -> str:
    """Write texts as root/corpus.jsonl, prepare it with the byte tokenizer into root/prepared; its path."""
    from data.prepare import files_source, prepare
    with open(root / "corpus.jsonl", "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    out = root / "prepared"
    prepare(files_source(str(root / "corpus.jsonl")), str(out), tokenizer="byte", val_tokens=val_tokens,
            shard_tokens=shard_tokens, workers=1, progress_bar=False)
    return str(out)
