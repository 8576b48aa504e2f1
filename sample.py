"""Generate text from a checkpoint with the KV cache and report the decoding speed.

    python sample.py --ckpt runs/quickstart --prompt "The meaning of life is" --max-new-tokens 100
    python sample.py --ckpt runs/quickstart --temperature 0          # greedy

One prefill pass over the prompt, then one token per step through the cache (any encoding:
the model's cache carries each encoding's running state). Prints each sample, then the prefill
time and the decoding speed in tokens/s.
"""
import math
import sys
import time

import torch

from config import MAX_SEED
from checkpoints import load_model
from config import UserError
from eval.runtime import autocast_context, pick_device
from eval.cli import make_parser
from model import sample_next


@torch.no_grad()
def generate(model, tokenizer, prompt_ids, max_new_tokens, temperature=0.8, top_k=None, generator=None,
             device="cpu", on_token=None):
    """Returns (generated ids, prefill seconds, decode seconds). Stops at the end-of-text token.
    Ids past the tokenizer's vocabulary (embedding padding) are never sampled."""
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    cache = model.new_cache(1, len(prompt_ids) + max_new_tokens)
    synchronize(device)
    t0 = time.perf_counter()
    with autocast_context(device):
        logits, _ = model(idx, cache=cache)
        synchronize(device)
        t1 = time.perf_counter()
        out = []
        for step in range(max_new_tokens):
            token = sample_next(logits[:, -1, :tokenizer.n_vocab].float(), temperature, top_k, generator)
            if int(token) == tokenizer.eot_token:
                break
            out.append(int(token))
            if on_token:
                on_token(out)
            if step + 1 < max_new_tokens:
                logits, _ = model(token[:, None], cache=cache)
    synchronize(device)
    return out, t1 - t0, time.perf_counter() - t1


def synchronize(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


class StreamPrinter:
    """Prints the decoded text as it grows (holding back an incomplete multi-byte character)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.printed = tokenizer, ""

    def __call__(self, ids):
        text = self.tokenizer.decode(ids)
        if text.endswith("\ufffd"):
            return
        print(text[len(self.printed):], end="", flush=True)
        self.printed = text

    def finish(self, ids):
        text = self.tokenizer.decode(ids)
        print(text[len(self.printed):], flush=True)


def build_parser():
    p = make_parser(__doc__)
    p.add_argument("--ckpt", required=True, help="run directory holding ckpt.pt (or a checkpoint file)")
    p.add_argument("--prompt", default="", help="prompt text (default: start from the end-of-text token)")
    p.add_argument("--prompt-file", help="read the prompt from this file instead (default: use --prompt)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate per sample")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=200, help="sample among the k most likely tokens (0 = all)")
    p.add_argument("--num-samples", type=int, default=1, help="samples to generate from the prompt")
    p.add_argument("--seed", type=int, default=1337, help="seed of the sampling")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if not 0 <= args.seed <= MAX_SEED:
        p.error(f"--seed must be between 0 and {MAX_SEED} (2**64 - 1, what the random generators take), not "
                f"{args.seed}; e.g. --seed=1337 (the default)")
    if not math.isfinite(args.temperature):  # nan passes the comparisons below and fails inside the sampler
        p.error(f"--temperature must be a finite number (0 = greedy), not {args.temperature}")
    if args.max_new_tokens < 1 or args.num_samples < 1 or args.temperature < 0 or args.top_k < 0:
        p.error(f"--max-new-tokens and --num-samples must be positive (got {args.max_new_tokens} and "
                f"{args.num_samples}), --temperature and --top-k non-negative "
                f"(got {args.temperature} and {args.top_k})")
    return args


def main(argv=None):
    args = parse_args(argv)
    device = pick_device(args.device)
    try:
        model, tokenizer, ckpt = load_model(args.ckpt, device)
        prompt = args.prompt
        if args.prompt_file:
            try:
                with open(args.prompt_file, encoding="utf-8") as f:
                    prompt = f.read()
            except OSError as error:
                raise UserError(f"cannot read --prompt-file {args.prompt_file}: {error.strerror}") from None
            except UnicodeDecodeError:  # e.g. saved as Latin-1 by an editor
                raise UserError(f"--prompt-file {args.prompt_file} is not UTF-8 text; save it as UTF-8") from None
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    prompt_ids = tokenizer.encode(prompt) if prompt else [tokenizer.eot_token]
    generator = torch.Generator(device=device).manual_seed(args.seed)
    print(f"{ckpt['model_config'].get('pos')} model, step {ckpt.get('step')}, {model.num_params() / 1e6:.2f}M "
          f"parameters, {device}; prompt {len(prompt_ids)} tokens", file=sys.stderr)
    block_size = model.config.block_size
    if len(prompt_ids) + args.max_new_tokens > block_size:
        print(f"note: prompt + new tokens ({len(prompt_ids)} + {args.max_new_tokens}) exceed the {block_size} "
              f"positions the model was trained on; positions beyond {block_size} are extrapolation, which only "
              "some encodings handle (see the README's length extrapolation study)", file=sys.stderr)
    samples, total_tokens, total_decode, total_prefill = [], 0, 0.0, 0.0
    for n in range(args.num_samples):
        if args.num_samples > 1:
            print(f"--- sample {n + 1}")
        print(prompt, end="", flush=True)
        printer = StreamPrinter(tokenizer)
        try:
            ids, prefill_s, decode_s = generate(model, tokenizer, prompt_ids, args.max_new_tokens, args.temperature,
                                                args.top_k or None, generator, device, on_token=printer)
        except (torch.OutOfMemoryError, RuntimeError) as error:  # the KV cache is allocated for the whole length
            if not isinstance(error, torch.OutOfMemoryError) and "allocate" not in str(error):
                raise
            print(f"\nerror: the KV cache for {len(prompt_ids)} + {args.max_new_tokens} tokens does not fit in "
                  f"{device} memory; use a smaller --max-new-tokens", file=sys.stderr)
            sys.exit(2)
        printer.finish(ids)
        samples.append(tokenizer.decode(ids))
        total_tokens += len(ids)
        total_decode += decode_s
        total_prefill += prefill_s
    speed = total_tokens / total_decode if total_decode > 0 else float("nan")
    print(f"prefill {1000 * total_prefill / args.num_samples:.1f} ms per sample; decoded {total_tokens} tokens "
          f"in {total_decode:.2f} s: {speed:.1f} tokens/s", file=sys.stderr)
    return samples


if __name__ == "__main__":
    main()
