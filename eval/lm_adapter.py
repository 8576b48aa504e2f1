"""lm-evaluation-harness adapter for our checkpoints, registered under the model name "grape".

    from eval.lm_adapter import GrapeLM
    lm = GrapeLM(ckpt="runs/medium_rope", batch_size=16)
    lm_eval.simple_evaluate(model=lm, tasks=[...])

All three request types are exact for a causal model:
- loglikelihood: every continuation token is scored. Context + continuation that do not fit the
  model window are cut from the left and scored in one pass over the last `max_length` tokens (as
  lm-eval's own causal models do); only a continuation longer than the window itself is scored in
  rolling windows (below). Sequences are right-padded inside a batch, which cannot change the
  scored logits of a causal model.
- loglikelihood_rolling: the document is scored in windows of `max_length` tokens that advance by
  `rolling_stride` tokens, so after the first window every token sees at least
  max_length - rolling_stride + 1 tokens of context (stride = max_length gives lm-eval's usual
  disjoint windows).
- generate_until: prefill + token-by-token decoding through the model's KV cache, with stop strings,
  the end-of-text token and max_gen_toks. Requests are batched only with others of the same prompt
  length and generation settings, so no padding ever enters the cache.

Inputs longer than the training context (block_size) work for every encoding: pass max_length (the longest
input kept; default block_size). A window or prompt longer than `prefill_chunk` tokens (default block_size) runs
through the model's KV cache in chunks of that many tokens, sized to the input (plus the tokens to generate), so
attention never sees more queries than a chunk; logits are computed only for the positions scored (for
generation, the prompt's last). Positions are used as they are: nothing is rescaled here.
"""
import json
import time

import lm_eval.models  # noqa: F401  (lm-eval adds its own models, e.g. hf, only to a registry still empty of ours)
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from checkpoints import load_model
from eval.runtime import autocast_context, pick_device
from eval.windows import plan_windows
from eval import progress as timing
from eval.progress import Progress
from model import sample_next


# What `--model_args` takes for `--model grape`: GrapeLM's keyword arguments that a command line can give (lm-eval
# adds batch_size, device and max_batch_size from its own flags). Its **unused would swallow a misspelt one.
MODEL_ARGS = ("ckpt", "tokenizer", "max_length", "rolling_stride", "prefill_chunk", "batch_size", "device")


def model_args_problem(model_args) -> str | None:
    """The sentence for `--model_args` (a dict) that GrapeLM cannot take, else None: a misspelt key (ckp=) ended in
    GrapeLM's ValueError traceback, or, beside ckpt=, was silently ignored (max_lenght=)."""
    given = dict(model_args or {})
    unknown = [key for key in given if key not in MODEL_ARGS]
    if unknown:
        return (f"--model_args for --model grape has no {', '.join(f'{key}=' for key in unknown)}; it takes "
                f"{', '.join(f'{key}=' for key in MODEL_ARGS)} (ckpt=RUN_DIR is required)")
    if not given.get("ckpt"):
        return "--model grape needs --model_args ckpt=RUN_DIR (a run directory holding ckpt.pt, or a checkpoint file)"
    return None


@register_model("grape")
class GrapeLM(TemplateLM):
    """lm-eval model for a GRAPE checkpoint (`ckpt=RUN_DIR`) or an in-memory model + tokenizer."""

    def __init__(self, ckpt=None, model=None, tokenizer=None, batch_size=16, device=None,
                 max_length=None, rolling_stride=None, prefill_chunk=None, **unused):
        super().__init__()
        self._device = pick_device(device)
        self.step = None  # training step of the checkpoint, when loaded from one
        if model is None:
            if ckpt is None:
                raise ValueError("GrapeLM needs ckpt=RUN_DIR (or model= and tokenizer=)")
            # tokenizer=PATH (lm-eval's model_args) names Hugging Face tokenizer files for tasks that size their
            # data with one (RULER); the model itself uses the checkpoint's tokenizer, which must encode the same.
            hf_tokenizer = tokenizer if isinstance(tokenizer, str) else None
            model, tokenizer, ckpt_dict = load_model(ckpt, self._device)
            self.step = ckpt_dict.get("step")
            if hf_tokenizer:
                from eval.long_context_tasks import check_hf_tokenizer
                check_hf_tokenizer(hf_tokenizer, tokenizer)
        elif tokenizer is None:
            raise ValueError("GrapeLM(model=...) also needs tokenizer=")
        self.model = model.to(self._device).eval()
        self.tok = tokenizer
        # lm-eval passes command-line values as strings; batch_size may be "auto" (we use our default)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16
        self.max_length = int(max_length or model.config.block_size)
        self.rolling_stride = int(rolling_stride or max(1, self.max_length // 2))
        self.prefill_chunk = int(prefill_chunk or model.config.block_size)
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1 (got {prefill_chunk})")
        # Called after each generated batch with [(prompt tokens, generated tokens)] per request; when set, it
        # replaces the adapter's own progress lines (eval/long_context.py counts progress over all its tasks).
        self.on_generated = None
        self.generation_s = 0.0  # seconds spent in generate_until, over all calls
        self.generation_cpu_s = 0.0  # CPU seconds of this process (all its threads) in generate_until
        self.prompts_cut = 0  # prompts of the last generate_until call cut from the left to fit max_length

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        args = dict(kv.split("=", 1) for kv in arg_string.split(",") if kv)
        for key, value in (additional_config or {}).items():
            if value is not None and key in ("batch_size", "device"):
                args[key] = value
        return cls(**args)

    # ------------------------------------------------------------------ tokenizer interface
    @property
    def eot_token_id(self):
        return self.tok.eot_token

    @property
    def device(self):
        return self._device

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.tok.encode(string)

    def tok_decode(self, tokens, **kwargs):
        return self.tok.decode(list(tokens))

    # ------------------------------------------------------------------ forward passes
    def _logits_from(self, idx, first):
        """fp32 logits at positions first.. of idx (B, T), computed for those positions only. Inputs longer than
        prefill_chunk run through a KV cache chunk by chunk (the model's own cached forward)."""
        T = idx.shape[1]
        if T <= self.prefill_chunk:
            return self.model(idx, last_logits=T - first)[0]
        cache = self.model.new_cache(idx.shape[0], T)
        kept = []
        for start in range(0, T, self.prefill_chunk):
            end = min(T, start + self.prefill_chunk)
            kept.append(self.model(idx[:, start:end], cache=cache, last_logits=max(0, end - max(first, start)))[0])
        return torch.cat(kept, dim=1)

    def _prefill(self, idx, cache):
        """Runs prompts idx (B, T) into `cache` in chunks of prefill_chunk; returns the last position's logits
        (the only ones computed)."""
        T = idx.shape[1]
        for start in range(0, T, self.prefill_chunk):
            end = min(T, start + self.prefill_chunk)
            logits, _ = self.model(idx[:, start:end], cache=cache, last_logits=1 if end == T else 0)
        return logits[:, -1]

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def _score_windows(self, items, disable_tqdm=False):
        """items: (tokens, targets) pairs, len(targets) <= len(tokens); the targets are the
        next tokens after the last len(targets) inputs. Returns [(sum logprob, all greedy)]."""
        order = sorted(range(len(items)), key=lambda i: -len(items[i][0]))  # long first: less padding
        results = [None] * len(items)
        batches = [order[b0:b0 + self.batch_size] for b0 in range(0, len(order), self.batch_size)]
        widths = [max(len(items[i][0]) for i in batch) for batch in batches]
        # Counted in padded tokens, what each forward pass costs (the longest windows come first).
        progress = None if disable_tqdm else Progress(
            f"lm-eval: scoring {len(items):,} windows", sum(w * len(b) for w, b in zip(widths, batches)), "tokens")
        for batch, width in zip(batches, widths):
            idx = torch.zeros(len(batch), width, dtype=torch.long)
            for row, i in enumerate(batch):
                tokens = items[i][0]
                idx[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            first = min(len(items[i][0]) - len(items[i][1]) for i in batch)  # the earliest scored position
            with autocast_context(self._device):
                logits = self._logits_from(idx.to(self._device), first)
            for row, i in enumerate(batch):
                tokens, targets = items[i]
                k = len(targets)
                if k == 0:
                    results[i] = (0.0, True)
                    continue
                scored = logits[row, len(tokens) - k - first:len(tokens) - first].float()
                logprobs = F.log_softmax(scored, dim=-1)
                target = torch.tensor(targets, dtype=torch.long, device=logprobs.device)
                total = logprobs.gather(-1, target[:, None]).sum().item()
                greedy = bool((scored.argmax(-1) == target).all())
                results[i] = (total, greedy)
            if progress:
                progress.advance(width * len(batch))
        return results

    def _score_sequences(self, sequences, disable_tqdm=False):
        """sequences: (tokens, first_target, stride). Scores tokens[first_target:] of each one,
        splitting sequences longer than the window. Returns [(sum logprob, all greedy)]."""
        items, owner = [], []
        for n, (tokens, first_target, stride) in enumerate(sequences):
            for start, end, k in plan_windows(len(tokens), first_target, self.max_length, stride):
                items.append((tokens[start:end], tokens[end - k + 1:end + 1]))
                owner.append(n)
        window_results = self._score_windows(items, disable_tqdm)
        totals = [[0.0, True] for _ in sequences]
        for n, (logprob, greedy) in zip(owner, window_results):
            totals[n][0] += logprob
            totals[n][1] = totals[n][1] and greedy
        return [tuple(t) for t in totals]

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        sequences = []
        for _, context_enc, continuation_enc in requests:
            # stride = window: one pass when the continuation fits (the standard case)
            stride = self.max_length if len(continuation_enc) <= self.max_length else self.rolling_stride
            sequences.append((list(context_enc) + list(continuation_enc), len(context_enc), stride))
        results = self._score_sequences(sequences, disable_tqdm)
        for (cache_key, _, _), answer in zip(requests, results):
            if cache_key is not None:
                self.cache_hook.add_partial("loglikelihood", cache_key, answer)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        sequences = []
        for request in requests:
            (text,) = request.args
            tokens = [self.prefix_token_id] + self.tok_encode(text)
            sequences.append((tokens, 1, self.rolling_stride))
        results = [logprob for logprob, _ in self._score_sequences(sequences, disable_tqdm)]
        for request, logprob in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, logprob)
        return results

    # ------------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm=False):
        start, cpu_start = timing.clock(), time.process_time()
        try:
            return self._generate_until(requests, disable_tqdm)
        finally:
            self.generation_s += timing.clock() - start
            self.generation_cpu_s += time.process_time() - cpu_start

    def _generate_until(self, requests, disable_tqdm):
        groups = {}  # (settings, prompt length) -> request indices
        prepared = []
        self.prompts_cut = 0
        for i, request in enumerate(requests):
            context, gen_kwargs = request.args
            settings = self._generation_settings(gen_kwargs)
            max_new = settings["max_gen_toks"]
            tokens = self.tok_encode(context)
            prompt = tokens[-(self.max_length - max_new):] or [self.prefix_token_id]
            self.prompts_cut += len(prompt) < len(tokens)
            prepared.append((prompt, settings))
            key = (json.dumps(settings, sort_keys=True), len(prompt))
            groups.setdefault(key, []).append(i)
        outputs = [None] * len(requests)
        progress = None if disable_tqdm or self.on_generated else Progress(
            f"lm-eval: generating for {len(requests):,} requests", len(requests), "requests")
        # Shortest prompts first: results come early, and the largest KV caches at the end.
        for key in sorted(groups, key=lambda key: key[1]):
            indices = groups[key]
            for b0 in range(0, len(indices), self.batch_size):
                batch = indices[b0:b0 + self.batch_size]
                settings = prepared[batch[0]][1]
                texts, n_generated = self.generate_batch([prepared[i][0] for i in batch], **settings,
                                                         return_counts=True)
                for i, text in zip(batch, texts):
                    outputs[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                if self.on_generated:
                    self.on_generated([(len(prepared[i][0]), n) for i, n in zip(batch, n_generated)])
                if progress:
                    progress.advance(len(batch))
        return outputs

    def _generation_settings(self, gen_kwargs):
        gen_kwargs = dict(gen_kwargs or {})
        until = gen_kwargs.pop("until", None) or []
        if isinstance(until, str):
            until = [until]
        max_gen_toks = int(gen_kwargs.pop("max_gen_toks", 256))
        max_gen_toks = max(1, min(max_gen_toks, self.max_length - 1))  # leave room for a prompt token
        temperature = float(gen_kwargs.pop("temperature", 0.0))
        if not gen_kwargs.pop("do_sample", False):
            temperature = 0.0
        top_k = gen_kwargs.pop("top_k", None)
        return {"until": list(until), "max_gen_toks": max_gen_toks, "temperature": temperature,
                "top_k": int(top_k) if top_k else None}

    @torch.no_grad()
    def generate_batch(self, prompts, until=(), max_gen_toks=256, temperature=0.0, top_k=None, return_counts=False):
        """Continues equal-length token prompts with the KV cache; returns the generated texts,
        each cut before the first stop string (and, with return_counts, the tokens generated for each).
        Stops at the end-of-text token too."""
        assert len({len(p) for p in prompts}) == 1, "generate_batch needs equal-length prompts"
        idx = torch.tensor(prompts, dtype=torch.long, device=self._device)
        cache = self.model.new_cache(len(prompts), idx.shape[1] + max_gen_toks)
        generated = [[] for _ in prompts]
        done = [False] * len(prompts)
        with autocast_context(self._device):
            logits = self._prefill(idx, cache)[:, None]
            for step in range(max_gen_toks):
                # ids past the tokenizer's vocabulary are padding rows of the embedding: never emit them
                next_logits = logits[:, -1, :self.tok.n_vocab].float()
                next_tokens = sample_next(next_logits, temperature, top_k)
                for row, token in enumerate(next_tokens.tolist()):
                    if done[row]:
                        continue
                    if token == self.eot_token_id:
                        done[row] = True
                        continue
                    generated[row].append(token)
                    if until and any(s in self.tok_decode(generated[row]) for s in until):
                        done[row] = True
                if all(done) or step == max_gen_toks - 1:
                    break
                logits, _ = self.model(next_tokens[:, None], cache=cache)
        texts = []
        for tokens in generated:
            text = self.tok_decode(tokens)
            for stop in until:
                text = text.split(stop)[0]
            texts.append(text)
        return (texts, [len(tokens) for tokens in generated]) if return_counts else texts
