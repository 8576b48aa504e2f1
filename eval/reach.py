"""Each head's reach, read from a trained model: how far back its attention goes, and how far its positional
penalty lets it go.

    python eval/reach.py --ckpt runs/cpu/fox runs/cpu/rope --out out/reach

For every layer and head, on validation windows (inside documents where they are long enough, else across them):
- attention mass by distance at the training context L: mass(d), the mean over the queries t in [L/2, L) of the
  attention weight on the key at t - d. reach_mass is the distance that holds 90% of that mass (the smallest d with
  mass(0) + ... + mass(d) >= 0.9): the span the head uses where it was trained. Every encoding has it.
- for an additive encoding, over windows of --factor x L: penalty(d), the mean over the queries t in the windows'
  second half of b(t, t) - b(t, t - d), the positional part of the logit as a function of distance (ALiBi's fixed
  slope, GRAPE-A's gated slopes, FoX's and GRAPE-AP's learned decay on this text), and margin, the median over the
  same queries of the content logits' best minus their median over the keys (how far the best-matching key stands
  above a typical one). reach_penalty is the first distance at which penalty(d) >= margin: past it, even the best-
  matching key weighs less than a typical key next to the query, so a fact that far back is out of the head's
  reach. None where the penalty stays below the margin up to the largest distance read (factor x L / 2): the
  head reaches at least that far. Rotations (rope, grape_m_ctx) and nope have no additive penalty.

Writes OUT/reach.json, OUT/reach.md and OUT/reach.png (penalty against distance, one line per head, the margin
dashed).
"""
import contextlib
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import from the repo root, not from eval/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np  # noqa: E402
import torch  # noqa: E402

import model as model_module  # noqa: E402
from attention import causal_mask  # noqa: E402
from config import UserError  # noqa: E402
from eval import progress as timing  # noqa: E402
from eval.cli import check_context, default_out, make_parser  # noqa: E402
from eval.outputs import evaluate_and_write, save_figure  # noqa: E402
from eval.runtime import describe_encoding, pick_device  # noqa: E402
from eval.windows import document_windows  # noqa: E402

MASS_SHARE = 0.9
# Queries whose logits are held at once: H x rows x (factor x L) floats a matrix (the medium model's 16 heads at
# 8 x 1024 keys: 128 MiB), where all factor x L / 2 queries at once took about 34 GiB.
ROWS_PER_BLOCK = 256


@contextlib.contextmanager
def recorded_attention(record):
    """While open, every attention call of the model (model.attend) also hands its inputs to record(layer, inputs):
    q and k after the rotation, the bias and its features, the scale and the positions; the model's output is
    unchanged. Layers are numbered in call order within each forward pass."""
    real = model_module.attend
    calls = [0]

    def recording(q, k, v, **kwargs):
        record(calls[0] % record.n_layer, q, k, kwargs)
        calls[0] += 1
        return real(q, k, v, **kwargs)
    model_module.attend = recording
    try:
        yield
    finally:
        model_module.attend = real


def logits_of(q, k, kwargs, rows: range):
    """For the queries `rows` (indices among the T queries): (content logits s·q·k, positional bias b or None), each
    (H, len(rows), Tk) in fp32, and the causal mask (len(rows), Tk). Every row is computed from its own query alone
    (the features' query axis is their third, (B, H, T, ...)), so a block of rows costs H x rows x Tk floats where
    all T rows would cost H x T x Tk."""
    H = q.shape[1]
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    content = kwargs["scale"] * (q[0, :, rows.start:rows.stop].float() @ k[0].float().transpose(-1, -2))
    bias = kwargs.get("bias")
    positional = None
    if bias is not None:
        query_features = {name: feature[:, :, rows.start:rows.stop] for name, feature in kwargs["qf"].items()}
        positional = bias.dense(query_features, kwargs["kf"])[0].float()
    mask = causal_mask(kwargs["q_pos"][rows.start:rows.stop], kwargs["k_pos"], kwargs.get("window"))
    return content, positional, mask


def diagonal_band(matrix, queries, distances, first_row=0):
    """matrix[h, t - first_row, t - d] for t in queries, d in distances: (H, len(queries), len(distances)); matrix
    holds the rows of the queries from first_row on."""
    rows = torch.as_tensor(queries)[:, None]
    cols = rows - torch.as_tensor(distances)[None, :]
    return matrix[:, (rows - first_row).to(matrix.device), cols.to(matrix.device)]


def query_blocks(queries: range, rows_per_block: int):
    """`queries` in consecutive ranges of at most rows_per_block."""
    return [range(start, min(start + rows_per_block, queries.stop))
            for start in range(queries.start, queries.stop, rows_per_block)]


class MassByDistance:
    """Accumulates each head's attention mass by distance at context L (queries in [L/2, L)), rows_per_block queries
    at a time (the memory of H x rows_per_block x L floats, whatever L)."""

    def __init__(self, n_layer, context, rows_per_block=ROWS_PER_BLOCK):
        self.n_layer, self.context, self.rows_per_block = n_layer, context, rows_per_block
        self.queries = range(context // 2, context)
        self.distances = list(range(context // 2 + 1))
        self.total, self.count = {}, 0

    def __call__(self, layer, q, k, kwargs):
        for rows in query_blocks(self.queries, self.rows_per_block):
            content, positional, mask = logits_of(q, k, kwargs, rows)
            logits = content + (positional if positional is not None else 0)
            weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
            band = diagonal_band(weights, rows, self.distances, rows.start).sum(1).cpu()  # (H, D)
            self.total[layer] = self.total.get(layer, 0) + band
        if layer == 0:
            self.count += len(self.queries)

    def result(self):
        out = {}
        for layer, total in self.total.items():
            mass = (total / self.count).numpy()
            reach = [int(np.argmax(np.cumsum(m) >= MASS_SHARE)) if np.cumsum(m)[-1] >= MASS_SHARE else None
                     for m in mass]
            out[layer] = {"mass": mass, "reach_mass": reach}
        return out


class PenaltyByDistance:
    """Accumulates each head's mean positional penalty b(t, t) - b(t, t - d) and its content margins, rows_per_block
    queries at a time."""

    def __init__(self, n_layer, context, rows_per_block=ROWS_PER_BLOCK):
        self.n_layer, self.context, self.rows_per_block = n_layer, context, rows_per_block
        self.queries = range(context // 2, context)
        self.distances = list(range(context // 2 + 1))
        self.total, self.margins, self.count = {}, {}, 0

    def __call__(self, layer, q, k, kwargs):
        if kwargs.get("bias") is None:
            return
        for rows in query_blocks(self.queries, self.rows_per_block):
            content, positional, mask = logits_of(q, k, kwargs, rows)
            own = diagonal_band(positional, rows, [0], rows.start)  # b(t, t), (H, R, 1)
            band = own - diagonal_band(positional, rows, self.distances, rows.start)  # (H, R, D)
            self.total[layer] = self.total.get(layer, 0) + band.sum(1).cpu()
            visible = content.masked_fill(~mask, float("nan")).cpu().numpy()  # keys j <= t of each query
            best, median = np.nanmax(visible, axis=-1), np.nanmedian(visible, axis=-1)
            self.margins.setdefault(layer, []).append(torch.from_numpy(best - median))  # (H, R)
        if layer == 0:
            self.count += len(self.queries)

    def result(self):
        out = {}
        for layer, total in self.total.items():
            penalty = (total / self.count).numpy()
            margin = np.median(torch.cat(self.margins[layer], dim=1).numpy(), axis=1)
            reach = []
            for curve, m in zip(penalty, margin):
                over = np.flatnonzero(curve >= m)
                reach.append(int(over[0]) if len(over) else None)
            out[layer] = {"penalty": penalty, "margin": margin, "reach_penalty": reach}
        return out


def reading_windows(tokens, eot, length, count):
    """Starts of `count` windows of length + 1 tokens (the model reads the first `length`): inside documents first
    (eval/windows.document_windows), then, if too few documents are long enough, across them, every start whose
    window fits in the tokens (the last at len(tokens) - length - 1)."""
    starts = [start for start, _ in document_windows(tokens, eot, length, count)]
    starts += [s for s in range(0, len(tokens) - length, length + 1) if s not in starts]
    return starts[:count]


def additive(model) -> bool:
    """Whether the model's attention has an additive positional penalty (read from the model, not from what a pass
    happened to record)."""
    return model.blocks[0].attn.bias is not None


@torch.no_grad()
def head_reach(model, tokens, eot, context, factor, windows, device, rows_per_block=ROWS_PER_BLOCK):
    """Per layer: mass curve and reach_mass of every head at `context`; for an additive encoding, penalty curve,
    margin and reach_penalty over windows of factor x context. A ValueError where the tokens hold no window of a
    pass's length."""
    n_layer = model.config.n_layer
    mass = MassByDistance(n_layer, context, rows_per_block)
    penalty = PenaltyByDistance(n_layer, factor * context, rows_per_block)
    passes = [(mass, context)] + ([(penalty, factor * context)] if additive(model) else [])
    for recorder, length in passes:
        recorder.n_layer = n_layer
        starts = reading_windows(tokens, eot, length, windows)
        if not starts:
            raise ValueError(too_short(len(tokens), factor, context))
        for start in starts:
            x = torch.from_numpy(np.asarray(tokens[start:start + length], dtype=np.int64))[None].to(device)
            with recorded_attention(recorder):
                model(x, last_logits=0)
    layers = mass.result()
    for layer, values in (penalty.result() if len(passes) > 1 else {}).items():
        layers[layer].update(values)
    return [layers[i] for i in range(n_layer)]


def too_short(n_tokens: int, factor: int, context: int, data_dir: str = "the data") -> str:
    return (f"the validation split of {data_dir} has {n_tokens:,} tokens, too few for one window of {factor} x "
            f"{context}; lower --factor (or --context)")


def checked_inputs(run, args, device):
    """(model, tokenizer, checkpoint, context, validation tokens) of one --ckpt, or a UserError where they cannot
    give a result: checked for every checkpoint before any is evaluated."""
    from eval.extrapolation import model_and_validation_tokens

    model, tokenizer, ckpt, context, data_dir, tokens = model_and_validation_tokens(run, args, device)
    if len(tokens) <= args.factor * context:
        raise UserError(too_short(len(tokens), args.factor, context, data_dir))
    return model, tokenizer, ckpt, context, tokens


def evaluate_checkpoint(run, args, device):
    from eval.extrapolation import args_name

    model, tokenizer, ckpt, context, tokens = checked_inputs(run, args, device)
    name = args_name(run)
    progress = timing.Progress(f"reach {name}", 1, "checkpoint")
    try:
        layers = head_reach(model, tokens, tokenizer.eot_token, context, args.factor, args.windows, device)
    except ValueError as error:  # (checked_inputs makes sure of a window; the sentence, should one still lack)
        raise UserError(str(error)) from None
    progress.advance(1)
    heads = []
    for layer, values in enumerate(layers):
        for h in range(len(values["reach_mass"])):
            entry = {"layer": layer, "head": h, "reach_mass": values["reach_mass"][h],
                     "mass": [round(float(m), 6) for m in values["mass"][h]]}
            if "penalty" in values:
                entry.update(reach_penalty=values["reach_penalty"][h], margin=float(values["margin"][h]),
                             penalty=[round(float(p), 4) for p in values["penalty"][h]])
            heads.append(entry)
    result = {"run": run, "name": name, "encoding": describe_encoding(ckpt["model_config"]), "train_context": context,
              "factor": args.factor, "windows": args.windows, "step": ckpt.get("step"), "additive": additive(model),
              "largest_distance": args.factor * context // 2, "heads": heads}
    result["reach"] = encoding_reach(result)
    print(f"{name}: " + summary_line(result), flush=True)
    return result


def encoding_reach(result):
    """The model's longest reach: the largest reach_penalty over its heads (the largest distance read where some
    head's penalty never reaches its margin), or None for an encoding without a positional penalty."""
    if not result["additive"]:
        return None
    reaches = [h["reach_penalty"] if h["reach_penalty"] is not None else result["largest_distance"]
               for h in result["heads"]]
    return max(reaches)


def summary_line(result):
    masses = [h["reach_mass"] for h in result["heads"] if h["reach_mass"] is not None]
    beyond = len(result["heads"]) - len(masses)
    at = f"at L = {result['train_context']}"
    if masses:
        text = (f"90% of the attention mass within {min(masses)}-{max(masses)} tokens (heads' range"
                + (f"; {beyond} head(s) not within L/2" if beyond else "") + f", {at})")
    else:
        text = f"no head holds 90% of its attention mass within L/2 ({at})"
    if result["additive"]:
        beyond = sum(h["reach_penalty"] is None for h in result["heads"])
        text += (f"; positional penalty reaches the content margin at {result['reach']} tokens in the longest-"
                 f"reaching head" + (f" ({beyond} head(s) not within {result['largest_distance']})" if beyond else ""))
    return text


def markdown_report(results):
    lines = ["## Each head's reach", "",
             f"reach_mass: the distance that holds {MASS_SHARE:.0%} of the head's attention mass at L (queries in "
             "[L/2, L)); reach_penalty: the distance at which the mean positional penalty reaches the median "
             "content margin (best minus median content logit), '>' where it stays below it as far as was read.", "",
             "| run | encoding | layer | head | reach_mass | reach_penalty | margin |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        for h in r["heads"]:
            penalty = "–" if "reach_penalty" not in h else f"> {r['largest_distance']}" \
                if h["reach_penalty"] is None else str(h["reach_penalty"])
            margin = f"{h['margin']:.2f}" if "margin" in h else "–"
            lines.append(f"| {r['name']} | {r['encoding']} | {h['layer']} | {h['head']} | {h['reach_mass']} | "
                         f"{penalty} | {margin} |")
    return "\n".join(lines) + "\n"


def plot_reach(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    additive = [r for r in results if r["additive"]]
    shown = additive or results
    fig, axes = plt.subplots(1, len(shown), figsize=(4.5 * len(shown), 3.6), squeeze=False)
    for ax, r in zip(axes[0], shown):
        for h in r["heads"]:
            if r["additive"]:
                line, = ax.plot(np.arange(len(h["penalty"])) / r["train_context"], h["penalty"], linewidth=1)
                ax.axhline(h["margin"], color=line.get_color(), linestyle=":", linewidth=0.8)
            else:
                ax.plot(np.arange(len(h["mass"])) / r["train_context"], np.cumsum(h["mass"]), linewidth=1)
        ax.set_title(f"{r['name']} ({r['encoding']})", fontsize=9)
        ax.set_xlabel("distance / L")
        ax.set_ylabel("positional penalty (nats); dotted: margin" if r["additive"] else "cumulative attention mass")
    fig.tight_layout()
    save_figure(fig, path)


def build_parser():
    p = make_parser(__doc__)
    p.add_argument("--ckpt", nargs="+", required=True, help="run directories (or checkpoint files)")
    p.add_argument("--data-dir", help="prepared data directory whose validation text is read (default: the run's "
                                      "own, else the embedded corpus)")
    p.add_argument("--out", help="output directory (default: RUN_DIR/eval for one run; required for several)")
    p.add_argument("--context", type=int, help="training context L (default: the checkpoint's block_size)")
    p.add_argument("--factor", type=int, default=8, help="the penalty is read in windows of factor x L, to "
                                                          "distances up to factor x L / 2")
    p.add_argument("--windows", type=int, default=4, help="validation windows read at each length")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    for option, value in (("--factor", args.factor), ("--windows", args.windows)):
        if value < 1:
            p.error(f"{option} must be at least 1 (got {value})")
    check_context(p, args, least=2)
    default_out(p, args)
    return args


def main(argv=None):
    args = parse_args(argv)
    device = pick_device(args.device)
    return evaluate_and_write(args, lambda run: evaluate_checkpoint(run, args, device), markdown_report, "reach",
                              lambda results: [("reach.png", lambda path: plot_reach(results, path))],
                              check=lambda run: checked_inputs(run, args, "cpu"))


if __name__ == "__main__":
    main()
