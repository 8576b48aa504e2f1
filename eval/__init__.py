"""Evaluation of GRAPE checkpoints.

eval.lm_adapter   lm-evaluation-harness model adapter (registered as model name "grape")
eval.tasks        offline task YAMLs for the seven zero-shot tasks (local JSONL in the hub schema)
eval.zero_shot    CLI: the paper's seven zero-shot tasks, JSON + markdown table beside the paper's numbers
eval.extrapolation CLI: per-position loss at L..8L, loss-vs-position plot, passkey retrieval heat map
"""
