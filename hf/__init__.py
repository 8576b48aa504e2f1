"""Hugging Face interoperability: export a checkpoint as a transformers model (export.py), and start a
training run from a Hugging Face model (init_from.py). docs/hf_export.md describes both."""
