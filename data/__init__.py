"""Data: tokenizers (tokenizer.py), shard preparation (prepare.py), the deterministic loader (loader.py)."""
