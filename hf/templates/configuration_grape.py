"""Configuration of a GRAPE model exported from its training repository (see modeling_grape.py).

``model_config`` is the model's own configuration (the keyword arguments of model.GPTConfig); the Hugging
Face names of its sizes (hidden_size, num_hidden_layers, ...) are derived from it for the tools that read
them (lm-eval reads max_position_embeddings as the context length)."""
import dataclasses

from transformers import PretrainedConfig

from .model import GPTConfig


class GrapeConfig(PretrainedConfig):
    model_type = "grape"

    def __init__(self, model_config=None, **kwargs):
        config = GPTConfig.from_dict(dict(model_config or {}))  # unknown keys and bad values: one sentence
        self.model_config = dataclasses.asdict(config)
        kwargs.update(vocab_size=config.vocab_size, hidden_size=config.n_embd, num_hidden_layers=config.n_layer,
                      num_attention_heads=config.n_head, num_key_value_heads=config.n_kv_head,
                      head_dim=config.head_dim, max_position_embeddings=config.block_size,
                      rms_norm_eps=config.norm_eps)
        kwargs["tie_word_embeddings"] = True  # the model's output layer is its input embedding
        super().__init__(**kwargs)
