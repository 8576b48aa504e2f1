"""KV-cache memory under grouped-query attention and sliding windows, measured from the cache tensors themselves.

    python bench/bench_kv_cache.py                  # writes docs/kv_cache.md (about 3 minutes on a busy 2-core CPU)
    python bench/bench_kv_cache.py --tokens 512 --out /tmp/kv_cache.md

For each encoding a model of the given shape reads a prompt of --tokens tokens into a fresh cache, then decodes
--decode more tokens one at a time; the table holds the bytes of every cached tensor (model.KVCache.nbytes: keys,
values, each encoding's key features and running state) for four variants of the same model, and their ratios to
multi-head full attention measured in the same run:

    MHA          n_kv_head = n_head, every layer full
    GQA          n_kv_head = n_head / 4 (4 query heads per key head), every layer full     (expected 0.25)
    MHA 3:1      a window of --window keys in layers 1-3 of every 4 (global_every = 4)
    GQA 3:1      both

and, as a check that the smaller cache computes the same thing, the largest difference between the logits of the
cached decoding and of one full forward pass.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from model import GPT, GPTConfig  # noqa: E402

ENCODINGS = ["rope", "alibi", "fox", "grape_a_qk", "grape_ap", "grape_m_ctx", "rope+kv_shift"]
VARIANTS = {"MHA": {}, "GQA": {"group": 4}, "MHA 3:1": {"local": True}, "GQA 3:1": {"group": 4, "local": True}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encodings", default=",".join(ENCODINGS), help="comma-separated model.pos values "
                        "(+kv_shift for KV-shift); default: %(default)s")
    parser.add_argument("--tokens", type=int, default=1024, help="prompt length (default %(default)s)")
    parser.add_argument("--decode", type=int, default=16, help="tokens decoded after the prompt (default %(default)s)")
    parser.add_argument("--window", type=int, default=256, help="window of the local layers (default %(default)s)")
    parser.add_argument("--n_layer", type=int, default=8, help="layers (a multiple of 4; default %(default)s)")
    parser.add_argument("--n_head", type=int, default=8, help="query heads (a multiple of 4; default %(default)s)")
    parser.add_argument("--head_dim", type=int, default=64, help="default %(default)s")
    parser.add_argument("--n_embd", type=int, default=256, help="default %(default)s")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "kv_cache.md"), help="default: docs/kv_cache.md")
    args = parser.parse_args(argv)
    if args.n_head % 4 or args.n_layer % 4:
        parser.error(f"--n_head ({args.n_head}) and --n_layer ({args.n_layer}) must be multiples of 4: the grouped "
                     "variant has 4 query heads per key head and the local one 3 local layers per global one")
    if min(args.tokens, args.window, args.decode + 1) < 1:
        parser.error("--tokens and --window must be positive and --decode at least 0")
    return args


def measure(args, encoding: str, group: int = 1, local: bool = False) -> tuple[int, float]:
    """(bytes of the cache after the prompt and the decoded tokens, max |cached - full| logit difference)."""
    pos, kv_shift = (encoding.removesuffix("+kv_shift"), encoding.endswith("+kv_shift"))
    torch.manual_seed(0)
    config = GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_kv_head=args.n_head // group, n_embd=args.n_embd,
                       head_dim=args.head_dim, vocab_size=512, block_size=args.tokens, pos=pos, kv_shift=kv_shift,
                       window=args.window if local else None, global_every=4 if local else None)
    model = GPT(config).eval()
    total = args.tokens + args.decode
    idx = torch.randint(0, 512, (1, total), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model.new_cache(1, total)
        steps = [model(idx[:, :args.tokens], cache=cache)[0]]
        steps += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(args.tokens, total)]
        difference = (torch.cat(steps, dim=1) - model(idx)[0]).abs().max().item()
    return cache.nbytes(), difference


def main(argv=None):
    args = parse_args(argv)
    encodings = [e.strip() for e in args.encodings.split(",") if e.strip()]
    rows, start = [], time.perf_counter()
    for i, encoding in enumerate(encodings):
        sizes, worst = {}, 0.0
        for name, variant in VARIANTS.items():
            sizes[name], difference = measure(args, encoding, **variant)
            worst = max(worst, difference)
        rows.append((encoding, sizes, worst))
        print(f"[{i + 1}/{len(encodings)}] {encoding}: " + ", ".join(
            f"{name} {size / 2**20:.2f} MiB ({size / sizes['MHA']:.4f})" for name, size in sizes.items())
            + f"; cached vs full logits {worst:.1e} ({time.perf_counter() - start:.0f} s)", flush=True)
    header = ("| encoding | MHA (MiB) | GQA ÷ MHA | MHA 3:1 ÷ MHA | GQA 3:1 ÷ MHA | max \\|cached − full\\| logit |\n"
              "|---|---|---|---|---|---|")
    lines = [f"| {e} | {s['MHA'] / 2**20:.3f} | {s['GQA'] / s['MHA']:.4f} | {s['MHA 3:1'] / s['MHA']:.4f} | "
             f"{s['GQA 3:1'] / s['MHA']:.4f} | {w:.1e} |" for e, s, w in rows]
    command = "python bench/bench_kv_cache.py" + ("" if argv is None and len(sys.argv) == 1 else
                                                    " " + " ".join(sys.argv[1:] if argv is None else argv))
    text = f"""# KV-cache memory with grouped-query attention and sliding windows

Measured by `{command}` (CPU, fp32): a model of {args.n_layer} layers, {args.n_head} query heads of {args.head_dim},
width {args.n_embd}, reads a prompt of {args.tokens} tokens into a fresh cache and decodes {args.decode} more one at a
time; the bytes are those of every tensor the cache holds then (`model.KVCache.nbytes`: keys, values, each encoding's
key features and running state), each variant's divided by multi-head full attention's in the same run. GQA has
{args.n_head // 4} key/value heads (4 query heads per key head); 3:1 is a window of {args.window} keys in layers 1-3 of
every 4 (`global_every = 4`), whose local layers keep window - 1 = {args.window - 1} slots. The last column compares
the cached decoding's logits with one full forward pass over all {args.tokens + args.decode} tokens (largest of the
four variants).

{header}
{chr(10).join(lines)}

What sets the ratios: keys and values shrink by the group factor, so GQA ÷ MHA is 0.25 wherever nothing else is
cached per head. FoX caches its running log-gate sum c per query head (one number per token and head beside
2·{args.head_dim} for k and v per key head: docs/derivations.md §7), so its ratio sits slightly above 0.25; GRAPE-A's
key gate λ_k and GRAPE-AP's path vector r belong to the key head and shrink with it; the positions ALiBi, GRAPE-A
and GRAPE-AP cache (one number per token, shared by all heads) do not shrink (0.2507). A local layer holds
{args.window - 1} of the {args.tokens + args.decode} tokens, so 3:1 keeps
(3·{args.window - 1} + {args.tokens + args.decode}) / (4·{args.tokens + args.decode}) of the full cache.
The windowed kernels' static cost (work ∝ T·window) is in [kernel_resources.md](kernel_resources.md).
"""
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
