"""Retrieval accuracy by distance: can the model still find a fact that lies d tokens back?

    python eval/retrieval.py --ckpt runs/cpu/fox runs/cpu/rope --out out/retrieval

The task is data/retrieval.py's associative recall (a fact "\\x02key:value\\x03" and later the same key again,
whose value only the fact tells). A test sequence of a gap bucket (lo, hi] is hi tokens of validation text with
--pairs facts written over it and their queries, in a random order, at its end; each query's gap (from the fact's
first value token to the query's) is drawn uniformly in the bucket, so a sequence of a bucket up to L never leaves
the training context. A query counts as retrieved when the model's most likely next token is right at every one of
its value tokens (what greedy decoding would write). Buckets are given as multiples of the training context L:
the default edges 0, 1/4, 1/2, 1, 2, 4, 8 give (0, L/4], (L/4, L/2], (L/2, L], (L, 2L], (2L, 4L], (4L, 8L].

Writes OUT/retrieval.json and OUT/retrieval.md, and accuracy_vs_gap.png (one line per checkpoint); progress lines
go to stderr.
"""
import os
import sys
from fractions import Fraction
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import from the repo root, not from eval/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np  # noqa: E402
import torch  # noqa: E402

from config import UserError  # noqa: E402
from data.retrieval import Facts  # noqa: E402
from eval import progress as timing  # noqa: E402
from eval.cli import check_context, default_out, make_parser  # noqa: E402
from eval.outputs import evaluate_and_write, save_figure  # noqa: E402
from eval.runtime import autocast_context, describe_encoding, pick_device  # noqa: E402

DEFAULT_EDGES = "0,1/4,1/2,1,2,4,8"
MAX_FACTOR = 8  # buckets past 8 L: the extrapolation study reads no further, and a CPU would take hours


def bucket_name(lo: Fraction, hi: Fraction) -> str:
    def factor(f):
        return "L" if f == 1 else f"{f.numerator}L" if f.denominator == 1 else f"L/{f.denominator}" \
            if f.numerator == 1 else f"{f.numerator}L/{f.denominator}"
    return f"({'0' if lo == 0 else factor(lo)}, {factor(hi)}]"


def parse_edges(text: str) -> list[Fraction]:
    """Bucket edges as multiples of L ("0,1/4,1/2,1,2,4,8"): increasing, from 0 or more, at most MAX_FACTOR. A
    ValueError says what is wrong."""
    try:
        edges = [Fraction(part.strip()) for part in str(text).split(",") if part.strip()]
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"bucket edges {text!r} are not numbers; write multiples of the training context L, "
                         f"comma-separated, e.g. {DEFAULT_EDGES}") from None
    if len(edges) < 2 or edges[0] < 0 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"bucket edges {text!r} must be at least two increasing multiples of L from 0 up, e.g. "
                         f"{DEFAULT_EDGES}")
    if edges[-1] > MAX_FACTOR:
        raise ValueError(f"bucket edges {text!r} reach {float(edges[-1]):g} L, past the {MAX_FACTOR} L that "
                         f"retrieval is scored to; end them at {MAX_FACTOR} or less")
    return edges


def bucket_bounds(edges: list[Fraction], context: int) -> list[tuple[int, int]]:
    """(lo, hi] in tokens for each bucket; a ValueError where a bucket holds no whole gap."""
    bounds = [(int(a * context), int(b * context)) for a, b in zip(edges, edges[1:])]
    for (lo, hi), a, b in zip(bounds, edges, edges[1:]):
        if hi <= lo:
            raise ValueError(f"bucket {bucket_name(a, b)} holds no gap at L = {context} tokens; use wider buckets")
    return bounds


def longest_fact(facts: Facts) -> int:
    """The most tokens one fact (or query) takes in this tokenizer."""
    from data.retrieval import KEY_LETTERS, KEY_LENGTH, VALUE_LENGTH
    return max(len(facts.encode(k, v)[0]) for k in (0, len(KEY_LETTERS) ** KEY_LENGTH - 1)
               for v in (0, 10 ** VALUE_LENGTH - 1))


def bucket_problem(edges: list[Fraction], context: int, pairs: int, facts: Facts) -> str | None:
    """Why some gap bucket cannot hold `pairs` facts and their queries at training context `context`, or None: a
    sequence of a bucket (lo, hi] is hi tokens, its queries take the last `pairs` fact lengths, the facts must fit
    before them, and the first query's gap must be able to exceed lo."""
    block = pairs * longest_fact(facts)
    for lo, hi in bucket_bounds(edges, context):
        if hi < 2 * block or hi - lo <= block:
            return (f"gap bucket ({lo}, {hi}] tokens (at L = {context}) cannot hold {pairs} facts and their queries "
                    f"({2 * block} tokens, and a bucket at least {block + 1} wide); use fewer pairs or wider or "
                    "longer buckets")
    return None


def build_sequences(filler: np.ndarray, facts: Facts, lo: int, hi: int, sequences: int, pairs: int,
                    rng: np.random.Generator):
    """`sequences` test sequences of hi tokens for the gap bucket (lo, hi]: (tokens (S, hi) int64, queries), each
    query (row, positions of its value tokens, gap). Raises ValueError where the bucket cannot hold `pairs`
    queries (hi too small) or the filler is shorter than a sequence."""
    if len(filler) < hi:
        raise ValueError(f"the validation text has {len(filler):,} tokens, fewer than a test sequence of {hi}")
    rows, queries = [], []
    for row in range(sequences):
        keys, values = facts.draw(rng, pairs)
        items = [facts.encode(int(k), int(v)) for k, v in zip(keys, values)]
        block = sum(len(tokens) for tokens, _ in items)
        region = hi - block  # facts go in [0, region), the queries fill [region, hi)
        start = int(rng.integers(0, len(filler) - hi + 1))
        seq = np.asarray(filler[start:start + hi], dtype=np.int64).copy()
        offset, placed = region, []
        for tokens, value_at in items:  # the queries, in the order drawn (keys are random: a random order)
            seq[offset:offset + len(tokens)] = tokens
            placed.append((offset, tokens, value_at))
            offset += len(tokens)
        for attempt in range(1000):
            starts, gaps = [], []
            for query_at, tokens, value_at in placed:
                # fact start = query start - gap: inside [0, region - len] keeps it before the queries
                least, most = max(lo + 1, query_at - region + len(tokens)), min(hi, query_at)
                if least > most:
                    raise ValueError(f"gap bucket ({lo}, {hi}] tokens is too short for {pairs} queries of "
                                     f"{block} tokens; use fewer pairs or a wider bucket")
                gap = int(rng.integers(least, most + 1))
                gaps.append(gap)
                starts.append(query_at - gap)
            spans = sorted((s, s + len(tokens)) for s, (_, tokens, _) in zip(starts, placed))
            if all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])):
                break
        else:
            raise ValueError(f"cannot place {pairs} facts without overlap in gap bucket ({lo}, {hi}]; use fewer "
                             "pairs or a wider bucket")
        for fact_at, gap, (query_at, tokens, value_at) in zip(starts, gaps, placed):
            seq[fact_at:fact_at + len(tokens)] = tokens
            queries.append((row, [query_at + v for v in value_at], gap))
        rows.append(seq)
    return torch.from_numpy(np.stack(rows)), queries


@torch.no_grad()
def score_queries(model, tokens, queries, device, batch_tokens=16384):
    """For each query, whether the argmax prediction is right at all of its value tokens (teacher-forced: the
    same as greedy decoding of the value)."""
    length = tokens.shape[1]
    batch = max(1, batch_tokens // length)
    predictions = []
    for b0 in range(0, len(tokens), batch):
        with autocast_context(device):
            logits, _ = model(tokens[b0:b0 + batch].to(device))
        predictions.append(logits.argmax(-1).cpu())
    predicted = torch.cat(predictions)  # predicted[r, p] is the model's guess for tokens[r, p + 1]
    return [bool(all(predicted[row, p - 1] == tokens[row, p] for p in positions)) for row, positions, _ in queries]


def retrieval_accuracy(model, filler, facts, context, edges, sequences, pairs, seed, device, batch_tokens=16384,
                       label="retrieval"):
    """Per bucket: its bounds, the queries scored, how many were retrieved, and the accuracy."""
    bounds = bucket_bounds(edges, context)
    problem = bucket_problem(edges, context, pairs, facts)
    if problem:
        raise ValueError(problem)
    progress = timing.Progress(label, sequences * sum(hi for _, hi in bounds), "tokens")
    buckets = []
    for index, ((lo, hi), a, b) in enumerate(zip(bounds, edges, edges[1:])):
        rng = np.random.default_rng([seed, index])  # the same sequences for every checkpoint of a tokenizer
        tokens, queries = build_sequences(filler, facts, lo, hi, sequences, pairs, rng)
        correct = score_queries(model, tokens, queries, device, batch_tokens)
        progress.advance(tokens.numel())
        buckets.append({"bucket": bucket_name(a, b), "lo_factor": float(a), "hi_factor": float(b), "lo": lo,
                        "hi": hi, "queries": len(correct), "retrieved": int(sum(correct)),
                        "accuracy": float(np.mean(correct)),
                        "mean_gap": float(np.mean([gap for _, _, gap in queries]))})
    return buckets, progress.elapsed()


def checked_inputs(run, args, device):
    """(model, tokenizer, checkpoint, context, data directory, validation text) of one --ckpt, or a UserError where
    they cannot give a result (its buckets cannot hold the facts, or the text is shorter than a test sequence):
    checked for every checkpoint before any is evaluated."""
    from eval.extrapolation import model_and_validation_tokens

    model, tokenizer, ckpt, context, data_dir, filler = model_and_validation_tokens(run, args, device)
    try:
        longest = bucket_bounds(args.edges, context)[-1][1]
        problem = bucket_problem(args.edges, context, args.pairs, Facts(tokenizer))
    except ValueError as error:
        raise UserError(f"{run}: {error}") from None
    if problem:
        raise UserError(f"{run}: {problem}")
    if len(filler) < longest:
        raise UserError(f"the validation split of {data_dir} has {len(filler):,} tokens, fewer than the longest test "
                        f"sequence of {run} ({longest:,} tokens at L = {context}); prepare more validation text or "
                        "end --edges lower")
    return model, tokenizer, ckpt, context, data_dir, filler


def evaluate_checkpoint(run, args, device):
    from eval.extrapolation import args_name

    model, tokenizer, ckpt, context, data_dir, filler = checked_inputs(run, args, device)
    name = args_name(run)
    try:
        buckets, elapsed = retrieval_accuracy(model, filler, Facts(tokenizer), context, args.edges, args.sequences,
                                              args.pairs, args.seed, device, args.batch_tokens,
                                              label=f"retrieval {name}")
    except ValueError as error:
        raise UserError(str(error)) from None
    for bucket in buckets:
        print(f"{name}: gap {bucket['bucket']}: {bucket['retrieved']}/{bucket['queries']} retrieved "
              f"({bucket['accuracy']:.3f})", flush=True)
    return {"run": run, "name": name, "encoding": describe_encoding(ckpt["model_config"]), "train_context": context,
            "step": ckpt.get("step"), "data_dir": os.path.abspath(data_dir), "pairs": args.pairs,
            "sequences": args.sequences, "seed": args.seed, "buckets": buckets, "elapsed_s": elapsed}


def markdown_report(results):
    lines = ["## Retrieval accuracy by gap", "",
             "A query is retrieved when every value token is the model's most likely next token; the gap runs from "
             "the fact's value to the query's, in tokens.", ""]
    names = [b["bucket"] for b in results[0]["buckets"]]
    lines += ["| run | encoding | L | " + " | ".join(f"gap {n}" for n in names) + " |",
              "|---|---|---:|" + "---:|" * len(names)]
    for r in results:
        lines.append(f"| {r['name']} | {r['encoding']} | {r['train_context']} | "
                     + " | ".join(f"{b['accuracy']:.3f} ({b['queries']})" for b in r["buckets"]) + " |")
    return "\n".join(lines) + "\n"


def plot_accuracy(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot([b["mean_gap"] / r["train_context"] for b in r["buckets"]], [b["accuracy"] for b in r["buckets"]],
                marker="o", label=f"{r['name']} ({r['encoding']})")
    ax.axvline(1, color="gray", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("gap / training context L (dashed: L)")
    ax.set_ylabel("retrieval accuracy")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    save_figure(fig, path)


def build_parser():
    p = make_parser(__doc__)
    p.add_argument("--ckpt", nargs="+", required=True, help="run directories (or checkpoint files) to compare")
    p.add_argument("--data-dir", help="prepared data directory whose validation text fills the sequences (default: "
                                      "the run's own, else the embedded corpus)")
    p.add_argument("--out", help="output directory (default: RUN_DIR/eval for one run; required for several)")
    p.add_argument("--context", type=int, help="training context L (default: the checkpoint's block_size)")
    p.add_argument("--edges", default=DEFAULT_EDGES, help="gap bucket edges as multiples of L (at most 8)")
    p.add_argument("--sequences", type=int, default=16, help="test sequences per bucket")
    p.add_argument("--pairs", type=int, default=4, help="facts (and queries) per test sequence")
    p.add_argument("--seed", type=int, default=0, help="seed of the facts, gaps and filler")
    p.add_argument("--batch-tokens", type=int, default=16384, help="tokens per forward pass (memory knob)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.edges = parse_edges(args.edges)
    except ValueError as error:
        p.error(f"--edges: {error}")
    if args.sequences < 1 or args.pairs < 1 or args.batch_tokens < 1:
        p.error(f"--sequences, --pairs and --batch-tokens must be at least 1 (got {args.sequences}, {args.pairs}, "
                f"{args.batch_tokens})")
    check_context(p, args)
    default_out(p, args)
    return args


def main(argv=None):
    args = parse_args(argv)
    device = pick_device(args.device)
    return evaluate_and_write(args, lambda run: evaluate_checkpoint(run, args, device), markdown_report, "retrieval",
                              lambda results: [("accuracy_vs_gap.png", lambda path: plot_accuracy(results, path))],
                              check=lambda run: checked_inputs(run, args, "cpu"))


if __name__ == "__main__":
    main()
