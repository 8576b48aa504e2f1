"""Data: tokenizers (tokenizer.py), shard preparation (prepare.py: its command line; sources.py, pipeline.py,
scratch.py and assemble.py: its parts), the deterministic loader (loader.py)."""
