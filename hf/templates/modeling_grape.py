"""A Hugging Face causal LM around this directory's copy of the GRAPE model code.

The files beside this one are the training repository's own model modules (model.py, positional.py,
attention.py, attention_kernels_*.py), copied by its export; this file only adapts them to transformers:
from_pretrained, generate() and the loss of a forward with labels. The Triton kernels run where Triton
and a GPU are present; everywhere else the portable PyTorch path runs (torch is the only requirement).

Positions: the model has no padding mask. Pass unpadded sequences (a batch of one length), or right
padding without a cache; left padding would shift every position, and is refused.
"""
import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_grape import GrapeConfig
from .model import GPT, GPTConfig, KVCache

# The output field that carries the cache: `cache` in recent transformers, `past_key_values` before.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class GrapeCache:
    """The model's own KV cache (model.KVCache: rotated keys, values, the key features and each encoding's
    running state) as generate() carries it from step to step. Its buffers grow on demand."""

    is_compileable = False
    is_linear = (False,)  # (generate() asks whether every layer is linear attention, which keeps no tokens)

    def __init__(self, windows: list, start_pos: int):
        self.kv = KVCache(len(windows), max_len=0, start_pos=start_pos, windows=windows)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv.pos - self.kv.start_pos

    def reserve(self, new_tokens: int) -> None:
        needed = self.get_seq_length() + new_tokens
        for layer in self.kv.layers:
            if layer.max_len < needed and not layer.is_ring:  # (a ring never grows)
                layer.max_len = max(needed, 2 * layer.max_len)
                for name, buffer in layer.buffers.items():
                    grown = buffer.new_zeros(*buffer.shape[:2], layer.capacity, *buffer.shape[3:])
                    grown[:, :, :layer.length] = buffer[:, :, :layer.length]
                    layer.buffers[name] = grown

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i continues from row beam_idx[i]. (Tensors with one row are shared by all.)"""
        for layer in self.kv.layers:
            for store in (layer.buffers, layer.state):
                for name, tensor in store.items():
                    if tensor.shape[0] > 1:
                        store[name] = tensor.index_select(0, beam_idx.to(tensor.device))


class GrapeForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = GrapeConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"model.lm_head.weight": "model.wte.weight"}
    # Loaded in bf16/fp16, the positional parameters stay fp32: the model computes its positional features
    # in fp32 from fp32 copies of its inputs (in training they are fp32 master weights under autocast).
    _keep_in_fp32_modules_strict = ["rotation", "bias"]

    def __init__(self, config: GrapeConfig):
        super().__init__(config)
        self.model = GPT(GPTConfig.from_dict(config.model_config))
        # Constant buffers (ALiBi slopes, RoPE frequencies) are saved with the weights: transformers builds
        # the model on the meta device, and a buffer that is not in the file would stay uninitialised.
        for module in self.model.modules():
            module._non_persistent_buffers_set.clear()
        self.post_init()

    def _init_weights(self, module):
        pass  # GPT's constructor initialises every weight as the training code does

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the forward makes its own cache (GrapeCache)

    def get_input_embeddings(self):
        return self.model.wte

    def get_output_embeddings(self):
        return self.model.lm_head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, past_key_values=None,
                use_cache=None, labels=None, inputs_embeds=None, return_dict=None, **unused):
        """Logits of every position (fp32), the next-token loss when labels are given (-100 ignored), and with
        use_cache=True the cache to pass back with the next tokens (generate() does this)."""
        if input_ids is None or inputs_embeds is not None:
            raise ValueError("this model takes input_ids, not inputs_embeds")
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, GrapeCache):
            if cache.get_seq_length():
                raise ValueError("this model keeps its own cache: pass the cache it returned, or none")
            cache = None  # an empty Hugging Face cache: ours takes its place
        T = input_ids.shape[1]
        start = cache.kv.pos if cache is not None else 0
        if position_ids is not None:
            if cache is None:
                start = int(position_ids.reshape(-1)[0])
            expected = torch.arange(start, start + T, device=position_ids.device)
            if position_ids.shape[-1] != T or not bool((position_ids == expected).all()):
                raise ValueError(f"position_ids must be {start}..{start + T - 1} in every row: the model reads "
                                 "consecutive positions after the cached ones")
        if attention_mask is not None and not bool(attention_mask.all()):
            right_padding = attention_mask.dim() == 2 and bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
            if not right_padding or cache is not None or use_cache:
                raise ValueError("this model has no padding mask: pass sequences of one length, or right padding "
                                 "without a cache (left padding would shift every position)")
        if use_cache and cache is None:
            cache = GrapeCache([block.attn.window for block in self.model.blocks], start)
        if cache is not None:
            cache.reserve(T)
            logits, _ = self.model(input_ids, cache=cache.kv)
        else:
            logits, _ = self.model(input_ids, start_pos=start)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        output = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache})
        return output.to_tuple() if return_dict is False else output
