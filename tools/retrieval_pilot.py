"""The retrieval pilot of docs/results_cpu.md: train the CPU model with facts mixed into its text, one variant of the
mixture at a time, and measure whether it learned to retrieve and whether it formed induction heads at all.

    python tools/retrieval_pilot.py --variant facts --pos rope --iters 600 --out runs/pilot/facts_rope
    python tools/retrieval_pilot.py --probe-only runs/pilot/facts_rope      # measure a finished (or running) pilot

Variants (each trains configs/base/cpu.toml with train.retrieval_fraction = --fraction):
  facts       the task as data/retrieval.py writes it: 8 facts \\x02key:value\\x03 and their queries per window
  geometric   the same facts, each query a geometric number of items after its fact (many short gaps)
  single      one-token keys (16 reserved control bytes) and one-letter values, geometric gaps: the easiest recall
  repeat      facts, plus one 64-token span of the window copied later in it (repetition drives induction heads)
  heavy       facts, plus four 48-token spans copied later (about a third of the tokens repeated)
The variants other than facts patch the mixing function of data/retrieval.py for this process only.

Two measurements, printed as one line: the query accuracy on 32 windows made as the training ones are (every gap
within L; a query counts when each value token is the most likely next token) beside the same for the facts'
first copies (chance), and the induction probe: next-token accuracy on a 128-token span of validation text and on
its exact repetition right after it. A model with induction heads predicts the repetition far better than the first
copy; without them both are the same.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import data.retrieval as retrieval  # noqa: E402

VARIANTS = ("facts", "geometric", "single", "repeat", "heavy")
_plain_mix = retrieval.mix_window


def mix_geometric(tokens, facts, rng, pairs=retrieval.RETRIEVAL_PAIRS):
    """Facts in a random order, each query inserted a geometric(1/2) number of items after its fact."""
    keys, values = facts.draw(rng, pairs)
    items = [facts.encode(int(k), int(v))[0] for k, v in zip(keys, values)]
    order = [int(i) for i in rng.permutation(pairs)]
    sequence = list(order)
    for key in order:
        sequence.insert(min(sequence.index(key) + int(rng.geometric(0.5)), len(sequence)), key)
    budget = len(tokens) - 2 * sum(len(item) for item in items)
    cuts = np.sort(rng.integers(0, budget + 1, size=len(sequence)))
    pieces, previous = [], 0
    for cut, item in zip(cuts.tolist(), sequence):
        pieces += [tokens[previous:cut], np.asarray(items[item], dtype=tokens.dtype)]
        previous = cut
    pieces.append(tokens[previous:budget])
    return np.concatenate(pieces)


class SingleTokenFacts(retrieval.Facts):
    """\\x02 K V \\x03: K one of 16 control bytes (0x10-0x1f, which text does not hold), V one letter."""

    def encode(self, key, value):
        return [2, 0x10 + key % 16, ord("a") + value % 26, 3], [2]

    @staticmethod
    def draw(rng, pairs):
        return rng.choice(16, size=pairs, replace=False), rng.integers(0, 26, size=pairs)


def with_repeats(spans: int, length: int):
    def mix(tokens, facts, rng, pairs=retrieval.RETRIEVAL_PAIRS):
        out = _plain_mix(tokens, facts, rng, pairs).copy()
        for _ in range(spans):  # a span copied later in the window (it may cover a fact: rare, and only noise)
            source = int(rng.integers(0, len(out) - 2 * length))
            target = int(rng.integers(source + length, len(out) - length + 1))
            out[target:target + length] = out[source:source + length]
        return out
    return mix


def use_variant(variant: str) -> None:
    """Patch data/retrieval.py's mixing for this process (train.py reads it from there)."""
    if variant in ("geometric", "single"):
        retrieval.mix_window = mix_geometric
    if variant == "single":
        retrieval.Facts = SingleTokenFacts
    if variant == "repeat":
        retrieval.mix_window = with_repeats(1, 64)
    if variant == "heavy":
        retrieval.mix_window = with_repeats(4, 48)


def probe(run_dir: str, variant: str) -> str:
    """The two measurements of the module docstring, as one line."""
    import torch

    from checkpoints import load_model
    from data.loader import load_split_tokens
    from data.prepare import ensure_default_corpus

    use_variant(variant)
    model, tokenizer, ckpt = load_model(run_dir, "cpu")
    facts = retrieval.Facts(tokenizer)
    text = load_split_tokens(ensure_default_corpus(tokenizer="byte", progress_bar=False), "val")
    rng = np.random.default_rng(5)
    windows = []
    for _ in range(32):
        start = int(rng.integers(0, len(text) - 600))
        windows.append(retrieval.mix_window(np.asarray(text[start:start + 513], dtype=np.int64), facts, rng, 8))
    x = torch.tensor(np.stack(windows))
    with torch.no_grad():
        predicted = model(x[:, :-1])[0].argmax(-1)
    length, value_at = len(facts.encode(0, 0)[0]), facts.encode(0, 0)[1]
    queries, firsts = [], []
    for row in range(len(x)):
        seen = set()
        for at in np.flatnonzero(x[row].numpy() == 2):
            if at + length > x.shape[1]:
                continue
            item = tuple(x[row, at:at + length].tolist())
            right = all(predicted[row, at + v - 1] == x[row, at + v] for v in value_at)
            (queries if item in seen else firsts).append(right)
            seen.add(item)
    spans = []
    for _ in range(8):
        start = int(rng.integers(0, len(text) - 300))
        span = np.asarray(text[start:start + 128], dtype=np.int64)
        spans.append(np.concatenate([span, span]))
    x = torch.tensor(np.stack(spans))
    with torch.no_grad():
        predicted = model(x[:, :-1])[0].argmax(-1)
    first = (predicted[:, 10:127] == x[:, 11:128]).float().mean().item()
    again = (predicted[:, 138:255] == x[:, 139:256]).float().mean().item()
    return (f"{run_dir} (iteration {ckpt['step']}): queries retrieved {np.mean(queries):.3f} of {len(queries)} "
            f"(first copies, chance: {np.mean(firsts):.3f}); induction probe: next token right {first:.3f} in a span, "
            f"{again:.3f} in its repetition")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=VARIANTS, default="facts")
    parser.add_argument("--pos", default="rope", help="the encoding (default rope)")
    parser.add_argument("--iters", type=int, default=600, help="training iterations (the study's: 600)")
    parser.add_argument("--fraction", type=float, default=1.0, help="train.retrieval_fraction (default 1)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="the run directory (default runs/pilot/<variant>_<pos>_<iters>)")
    parser.add_argument("--probe-only", metavar="RUN_DIR", help="measure RUN_DIR (trained with --variant) only")
    args = parser.parse_args(argv)
    if args.probe_only:
        print(probe(args.probe_only, args.variant))
        return 0
    out = args.out or os.path.join("runs", "pilot", f"{args.variant}_{args.pos}_{args.iters}")
    use_variant(args.variant)
    import train
    train.run([os.path.join(REPO, "configs", "base", "cpu.toml"), f"--pos={args.pos}", f"--max_iters={args.iters}",
               f"--retrieval_fraction={args.fraction}", f"--seed={args.seed}", f"--out_dir={out}",
               f"--ckpt_interval={max(1, args.iters // 6)}", "--eval_interval=0"])
    print(probe(out, args.variant))
    return 0


if __name__ == "__main__":
    sys.exit(main())
