"""Length extrapolation: validation loss by position at L, 2L, 4L, 8L and passkey retrieval.

    python eval/extrapolation.py --ckpt runs/medium_rope runs/medium_grape_ap --out out/extrapolation

For a checkpoint trained at context L (its model_config.block_size):
- per-position validation loss at contexts C = L, 2L, 4L, 8L over the same validation tokens, both
  with non-overlapping windows of C tokens (position p has exactly p tokens of context) and with
  sliding windows of C tokens advancing by C/4 (every scored token has at least 3C/4 + 1 tokens of
  context, the usual sliding-window perplexity);
- loss_vs_position.png: loss against position at the longest context, one line per checkpoint;
- passkey retrieval: a random 5-digit key hidden at several depths inside repeated filler text of
  L/2 .. 8L tokens, followed by "What is the pass key? The pass key is"; a trial counts when the
  greedy continuation (KV cache) starts with the key. passkey_<run>.png is the accuracy heat map.
Writes OUT/extrapolation.json and OUT/extrapolation.md and prints the tables. While it runs, stderr gets
progress lines with the elapsed time and an ETA for each phase (tokens read by the model, prompt tokens of the
passkey trials); the JSON records each phase's seconds (elapsed_s).
"""
import json
import os
import random
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import from the repo root, not from eval/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from checkpoints import load_model  # noqa: E402
from config import UserError  # noqa: E402
from eval.runtime import autocast_context, describe_encoding, pick_device  # noqa: E402
from eval.cli import check_context, default_out, make_parser  # noqa: E402
from eval.outputs import evaluate_and_write, save_figure  # noqa: E402
from eval.windows import document_windows, plan_windows  # noqa: E402
from eval import progress as timing  # noqa: E402

PASSKEY_INTRO = "A pass key is hidden in the text below. Remember it.\n"
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key.\n"
PASSKEY_QUESTION = "What is the pass key? The pass key is"


# ---------------------------------------------------------------------------------------------- loss by position

@torch.no_grad()
def _token_losses(model, inputs, targets, device):
    """Cross-entropy (fp32) of each target: inputs/targets are (B, T) int64 tensors."""
    with autocast_context(device):
        logits, _ = model(inputs.to(device))
    losses = F.cross_entropy(logits.float().flatten(0, 1), targets.to(device).flatten(), reduction="none")
    return losses.view(targets.shape).cpu()


def window_losses(model, tokens, starts, context, device="cpu", batch_tokens=16384, progress=None):
    """The loss at each position 0..context-1 of the windows of context+1 tokens that begin at `starts`:
    a float64 array (len(starts), context)."""
    batch = max(1, batch_tokens // context)
    out = []
    for w0 in range(0, len(starts), batch):
        group = starts[w0:w0 + batch]
        windows = torch.stack([torch.from_numpy(np.asarray(tokens[s:s + context + 1], dtype=np.int64))
                               for s in group])
        out.append(_token_losses(model, windows[:, :-1], windows[:, 1:], device).double().numpy())
        if progress:
            progress.advance(len(group) * context)
    return np.concatenate(out)


def nonoverlapping_loss(model, tokens, context, device="cpu", batch_tokens=16384, progress=None):
    """Mean loss at each position 0..context-1 over consecutive windows of context+1 tokens.
    Returns (per-position mean losses as a float64 array, number of windows)."""
    n_windows = (len(tokens) - 1) // context
    if n_windows == 0:
        raise UserError(f"the validation split has {len(tokens)} tokens, too few for one window of {context}")
    losses = window_losses(model, tokens, list(range(0, n_windows * context, context)), context, device,
                           batch_tokens, progress)
    return losses.mean(0), n_windows


def document_losses(model, tokens, eot, train_context, contexts, count, device="cpu", batch_tokens=16384,
                    progress=None):
    """Loss by position inside documents: up to `count` windows of the longest context C (C + 1 tokens, each inside
    one document at least that long), and for every shorter context c the same tokens cut into C // c windows of
    c + 1. Returns (per context: per-position mean losses and the number of windows; per big window: its document,
    its mean loss at L, and per longer context its mean loss beyond L), so that every context reads the same tokens
    and each window's rise past L is paired with its own loss at L."""
    longest = max(contexts)
    big = document_windows(tokens, eot, longest, count)
    if not big:
        raise UserError(f"no document of the validation split is longer than {longest} tokens, the longest context "
                        "(--factors); evaluate shorter contexts, leave out --documents, or prepare longer documents")
    per_context, per_window = {}, [{"document": doc, "beyond": {}} for _, doc in big]
    for context in contexts:
        parts = longest // context
        starts = [s + i * context for s, _ in big for i in range(parts)]
        losses = window_losses(model, tokens, starts, context, device, batch_tokens, progress)
        per_context[context] = (losses.mean(0), len(starts))
        by_window = losses.reshape(len(big), parts, context)
        for w, window in enumerate(by_window):
            if context == train_context:
                per_window[w]["at_L"] = float(window.mean())
            elif context > train_context:
                per_window[w]["beyond"][str(context)] = float(window[:, train_context:].mean())
    return per_context, per_window


def data_interval(per_window, key):
    """Mean and 95% t-interval over documents of `key`(window) averaged within each document: the error of having
    read these documents and not others (windows of one document are not independent)."""
    from statistics import fmean, stdev

    from scipy import stats

    by_document = {}
    for window in per_window:
        value = key(window)
        if value is not None:
            by_document.setdefault(window["document"], []).append(value)
    means = [fmean(values) for values in by_document.values()]
    if len(means) < 2:
        return {"mean": means[0] if means else None, "interval": None, "documents": len(means)}
    half = stats.t.ppf(0.975, len(means) - 1) * stdev(means) / len(means) ** 0.5
    mean = fmean(means)
    return {"mean": mean, "interval": [mean - half, mean + half], "documents": len(means)}


def sliding_window_loss(model, tokens, context, stride, device="cpu", batch_tokens=16384, progress=None):
    """Mean loss over tokens[1:], each predicted inside a window of at most `context` tokens that
    advances by `stride` (the first window scores all its tokens). Returns (mean, tokens scored)."""
    windows = plan_windows(len(tokens), 1, context, stride)
    batch = max(1, batch_tokens // context)
    total, count = 0.0, 0
    for b0 in range(0, len(windows), batch):
        group = windows[b0:b0 + batch]
        for length in sorted({end - start for start, end, _ in group}):  # equal lengths share a batch
            same = [w for w in group if w[1] - w[0] == length]
            inputs = torch.stack([torch.from_numpy(np.asarray(tokens[s:e], dtype=np.int64)) for s, e, _ in same])
            targets = torch.stack([torch.from_numpy(np.asarray(tokens[s + 1:e + 1], dtype=np.int64))
                                   for s, e, _ in same])
            losses = _token_losses(model, inputs, targets, device).double()
            for row, (_, _, k) in enumerate(same):
                total += losses[row, -k:].sum().item()
                count += k
            if progress:
                progress.advance(inputs.numel())
    return total / count, count


def bin_positions(per_position, n_bins=64):
    """(bin centre positions, mean loss per bin) for plotting a long per-position curve."""
    edges = np.unique(np.linspace(0, len(per_position), n_bins + 1).astype(int))
    centres = [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:])]
    means = [float(np.mean(per_position[a:b])) for a, b in zip(edges[:-1], edges[1:])]
    return centres, means


# ---------------------------------------------------------------------------------------------- passkey

def build_passkey_prompt(tokenizer, n_tokens, depth, key):
    """Token ids of a passkey prompt about n_tokens long with the needle at `depth` (0 = right after
    the intro, 1 = right before the question), and the answer text the model should continue with."""
    intro, filler = tokenizer.encode(PASSKEY_INTRO), tokenizer.encode(PASSKEY_FILLER)
    needle, question = tokenizer.encode(PASSKEY_NEEDLE.format(key=key)), tokenizer.encode(PASSKEY_QUESTION)
    n_fillers = max(0, round((n_tokens - len(intro) - len(needle) - len(question)) / len(filler)))
    before = round(depth * n_fillers)
    ids = intro + filler * before + needle + filler * (n_fillers - before) + question
    return ids, f" {key}"


def passkey_accuracy(generate, tokenizer, lengths, depths, trials, seed=0, label="passkey"):
    """Accuracy[length][depth] over `trials` random keys. generate(list of token-id prompts,
    max_new_tokens) -> list of generated strings. Also returns the prompts' actual token lengths.
    Progress lines count prompt tokens (all prompts are built first, so the total is exact)."""
    rng = random.Random(seed)
    cells = {(i, j): [build_passkey_prompt(tokenizer, length, depth, rng.randint(10000, 99999)) for _ in range(trials)]
             for i, length in enumerate(lengths) for j, depth in enumerate(depths)}
    progress = timing.Progress(label, sum(len(ids) for cell in cells.values() for ids, _ in cell), "prompt tokens")
    accuracy = np.zeros((len(lengths), len(depths)))
    for (i, j), cell in cells.items():
        prompts, answers = [ids for ids, _ in cell], [answer for _, answer in cell]
        max_new = max(len(tokenizer.encode(a)) for a in answers) + 1
        outputs = generate(prompts, max_new)
        accuracy[i, j] = np.mean([out.strip().startswith(a.strip()) for out, a in zip(outputs, answers)])
        progress.advance(sum(map(len, prompts)))
    actual_lengths = {length: len(cells[i, len(depths) - 1][0][0]) for i, length in enumerate(lengths)}
    return accuracy, actual_lengths


def cached_greedy_generate(model, tokenizer, device, batch_tokens=16384):
    """A `generate` for passkey_accuracy: greedy decoding through the KV cache, in batches of equal-length
    prompts holding about batch_tokens tokens (the prefill returns logits for every prompt token)."""
    from eval.lm_adapter import GrapeLM

    lm = GrapeLM(model=model, tokenizer=tokenizer, device=device, max_length=1 << 30)

    def generate(prompts, max_new_tokens):
        outputs = [None] * len(prompts)
        by_length = {}
        for n, p in enumerate(prompts):
            by_length.setdefault(len(p), []).append(n)
        for length, indices in by_length.items():
            batch_size = max(1, batch_tokens // length)
            for b0 in range(0, len(indices), batch_size):
                batch = indices[b0:b0 + batch_size]
                texts = lm.generate_batch([prompts[n] for n in batch], until=["\n"], max_gen_toks=max_new_tokens)
                for n, text in zip(batch, texts):
                    outputs[n] = text
        return outputs

    return generate


# ---------------------------------------------------------------------------------------------- reports

def resolve_data_dir(run_dir, ckpt, data_dir):
    """--data-dir, else the run's resolved data directory, else the embedded corpus for its tokenizer. The run's
    own folder must hold the data the checkpoint was trained on (its recorded identity); a run whose folder is
    gone says so before the embedded corpus is read."""
    if data_dir:
        return data_dir
    config_path = os.path.join(run_dir, "config.json") if os.path.isdir(run_dir) else None
    resolved = None
    if config_path and os.path.isfile(config_path):
        try:
            settings = json.loads(Path(config_path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:  # (ValueError: not JSON, or not UTF-8)
            settings = str(getattr(error, "strerror", None) or error)
        if not isinstance(settings, dict):
            raise UserError(f"{config_path} is not the run's settings as train.py writes them ("
                            f"{settings if isinstance(settings, str) else 'a JSON ' + type(settings).__name__}); "
                            "restore it from a backup, or pass --data-dir the prepared data to read")
        resolved = settings.get("data_dir_resolved")
    saved = (ckpt.get("train_config") or {}).get("data_dir")
    own = [path for path in (resolved, saved if saved not in EMBEDDED_DATA_NAMES else None) if path]
    for path in own:
        if os.path.isdir(path):
            return checked_run_data(path, ckpt, run_dir)
    from data.prepare import ensure_default_corpus

    if own and not (resolved and is_embedded_corpus(resolved)):
        print(f"note: the data folder of {run_dir}, {own[0]}, is gone; reading the validation split of the embedded "
              f"corpus ({ckpt['tokenizer']} tokens) instead (pass --data-dir to read another folder)", file=sys.stderr)
    return ensure_default_corpus(tokenizer=ckpt["tokenizer"], progress_bar=False)


EMBEDDED_DATA_NAMES = ("default", "default-byte")  # train.py's data_dir names of the embedded corpus


def is_embedded_corpus(path):
    """Whether path is a cache of the embedded corpus (data_cache/default...), which ensure_default_corpus rebuilds."""
    return os.path.basename(os.path.normpath(path)) in EMBEDDED_DATA_NAMES \
        and os.path.basename(os.path.dirname(os.path.normpath(path))) == "data_cache"


def checked_run_data(path, ckpt, run_dir):
    """path, the run's own data folder, once its identity is the checkpoint's (or either is unknown)."""
    from data.prepared import PreparedData, other_data_problem
    from data.shards import DataError
    if not ckpt.get("data_identity"):  # a checkpoint from before identities were recorded
        return path
    try:
        problem = other_data_problem(ckpt.get("data_identity"), PreparedData(path))
    except DataError as error:
        raise UserError(f"the data folder of {run_dir}: {error}") from None
    if problem:
        raise UserError(f"{problem}, so {run_dir} would be evaluated on data it was not trained on; pass --data-dir "
                        f"{path} to evaluate on it as it is now, or put back the data the run was trained on")
    return path


def model_and_validation_tokens(run, args, device):
    """(model, tokenizer, checkpoint, training context, data directory, validation tokens) of one --ckpt, the part
    every evaluation of validation text shares: the run's data folder (or --data-dir) opened once and its tokenizer
    checked against the model's."""
    from data.loader import PreparedData, load_split_tokens

    model, tokenizer, ckpt = load_model(run, device)
    context = args.context or model.config.block_size
    data_dir = resolve_data_dir(run, ckpt, args.data_dir)
    data = PreparedData(data_dir)  # opened once: its manifest read here, its shards checked by load_split_tokens
    if data.tokenizer != ckpt["tokenizer"]:
        raise UserError(f"{data_dir} is tokenized with {data.tokenizer!r} but {run} uses {ckpt['tokenizer']!r}; "
                        f"pass --data-dir a directory prepared with the model's tokenizer")
    return model, tokenizer, ckpt, context, data_dir, load_split_tokens(data, "val")


def checked_inputs(run, args, device):
    """(model, tokenizer, checkpoint, training context, data directory, validation tokens) of one --ckpt, or a
    UserError where they cannot give a result (no window of the longest context fits in the validation text, or,
    with --documents, in one document): checked for every checkpoint before any is evaluated."""
    model, tokenizer, ckpt, train_context, data_dir, tokens = model_and_validation_tokens(run, args, device)
    longest = train_context * max(args.factors)
    if args.documents and not document_windows(tokens, tokenizer.eot_token, longest, 1):
        raise UserError(f"no document of the validation split of {data_dir} is longer than {longest} tokens, the "
                        f"longest context of {run} (--factors); evaluate shorter contexts, leave out --documents, or "
                        "prepare longer documents")
    if len(tokens) <= longest:
        raise UserError(f"the validation split of {data_dir} has {len(tokens):,} tokens, too few for one window of "
                        f"{longest}, the longest context of {run} (--factors); evaluate shorter contexts or prepare "
                        "more validation text")
    return model, tokenizer, ckpt, train_context, data_dir, tokens


def evaluate_checkpoint(run, args, device):
    model, tokenizer, ckpt, train_context, data_dir, tokens = checked_inputs(run, args, device)
    contexts = [train_context * f for f in args.factors]
    result = {"run": run, "name": args_name(run), "encoding": describe_encoding(ckpt["model_config"]),
              "train_context": train_context, "step": ckpt.get("step"), "data_dir": os.path.abspath(data_dir),
              "contexts": {}, "elapsed_s": {}}
    if args.documents:
        return documents_result(model, tokenizer, tokens, contexts, train_context, args, device, result)
    n_tokens = min(len(tokens), args.windows * max(contexts) + 1)
    tokens = tokens[:n_tokens]
    result["val_tokens"] = n_tokens
    strides = {context: max(1, int(context * args.stride_fraction)) for context in contexts}
    work = sum((n_tokens - 1) // context * context + sum(end - start for start, end, _ in
                                                         plan_windows(n_tokens, 1, context, strides[context]))
               for context in contexts)  # the tokens the model reads: non-overlapping, then sliding windows
    progress = timing.Progress(f"extrapolation {result['name']}, loss at {len(contexts)} contexts", work, "tokens")
    for context in contexts:
        per_position, n_windows = nonoverlapping_loss(model, tokens, context, device, args.batch_tokens, progress)
        stride = strides[context]
        sliding, n_scored = sliding_window_loss(model, tokens, context, stride, device, args.batch_tokens, progress)
        result["contexts"][str(context)] = {
            "nonoverlapping": position_cell(per_position, n_windows, context, train_context),
            "sliding": {"mean": sliding, "stride": stride, "min_context": context - stride + 1,
                        "tokens_scored": n_scored},
        }
        print(f"{result['name']}: context {context}: non-overlapping {per_position.mean():.4f} "
              f"({n_windows} windows), sliding {sliding:.4f} (stride {stride})", flush=True)
    result["elapsed_s"]["loss"] = progress.elapsed()
    return with_passkey(result, model, tokenizer, train_context, args, device)


def documents_result(model, tokenizer, tokens, contexts, train_context, args, device, result):
    """--documents: every context reads the same windows of the longest context inside documents (document_losses);
    the JSON also holds each window's document and losses, and per longer context the rise past L with its 95%
    interval over documents (the data's own error, beside the seeds' that a study adds)."""
    longest = max(contexts)
    count = args.windows or None
    work = sum(len(document_windows(tokens, tokenizer.eot_token, longest, count)) * longest for _ in contexts)
    progress = timing.Progress(f"extrapolation {result['name']}, loss at {len(contexts)} contexts inside documents",
                               work, "tokens")
    per_context, per_window = document_losses(model, tokens, tokenizer.eot_token, train_context, contexts, count,
                                              device, args.batch_tokens, progress)
    result["documents"] = len({w["document"] for w in per_window})
    result["val_tokens"] = len(per_window) * (longest + 1)
    result["windows"] = per_window
    for context in contexts:
        per_position, n_windows = per_context[context]
        result["contexts"][str(context)] = {
            "nonoverlapping": position_cell(per_position, n_windows, context, train_context),
            "sliding": None}  # (every window is inside a document already)
        if context > train_context and train_context in contexts:
            result["contexts"][str(context)]["rise_by_document"] = data_interval(
                per_window, lambda w, c=str(context): w["beyond"][c] - w["at_L"])
        print(f"{result['name']}: context {context}: {per_position.mean():.4f} ({n_windows} windows in "
              f"{result['documents']} documents)", flush=True)
    result["elapsed_s"]["loss"] = progress.elapsed()
    return with_passkey(result, model, tokenizer, train_context, args, device)


def position_cell(per_position, n_windows, context, train_context) -> dict:
    """A context's non-overlapping losses as the JSON holds them: the mean, the mean beyond L, the binned curve."""
    centres, binned = bin_positions(per_position)
    return {"mean": float(per_position.mean()), "windows": n_windows,
            "mean_beyond_train_context": float(per_position[train_context:].mean()) if context > train_context else None,
            "binned_positions": centres, "binned_loss": binned}


def with_passkey(result, model, tokenizer, train_context, args, device):
    if args.passkey_trials > 0:
        lengths = [max(16, int(train_context * f)) for f in args.passkey_factors]
        generate = cached_greedy_generate(model, tokenizer, device, args.batch_tokens)
        start = timing.clock()
        accuracy, actual = passkey_accuracy(generate, tokenizer, lengths, args.depths, args.passkey_trials, args.seed,
                                            label=f"extrapolation {result['name']}, passkey")
        result["elapsed_s"]["passkey"] = timing.clock() - start
        result["passkey"] = {"lengths": lengths, "actual_lengths": [actual[n] for n in lengths],
                             "depths": list(args.depths), "trials": args.passkey_trials,
                             "accuracy": accuracy.tolist()}
    return result


def args_name(run):
    return os.path.basename(os.path.normpath(run if os.path.isdir(run) else os.path.dirname(run)))


def markdown_report(results):
    lines = ["## Validation loss by context length", "",
             "Non-overlapping: windows of C tokens, mean over all positions (and over positions beyond the "
             "training context L). Sliding: windows of C tokens advancing by the stride; every token has at "
             "least C - stride + 1 tokens of context.", "",
             "| run | encoding | L | C | C/L | non-overlapping | beyond L | sliding (stride) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for context, c in r["contexts"].items():
            beyond = c["nonoverlapping"]["mean_beyond_train_context"]
            lines.append(f"| {r['name']} | {r['encoding']} | {r['train_context']} | {context} | "
                         f"{int(context) // r['train_context']} | {c['nonoverlapping']['mean']:.4f} | "
                         f"{'–' if beyond is None else f'{beyond:.4f}'} | "
                         + ("– |" if c["sliding"] is None else f"{c['sliding']['mean']:.4f} ({c['sliding']['stride']}) |"))
    for r in results:
        if "passkey" not in r:
            continue
        p = r["passkey"]
        lines += ["", f"## Passkey retrieval accuracy: {r['name']} ({r['encoding']}, L = {r['train_context']}, "
                  f"{p['trials']} keys per cell)", "",
                  "| prompt tokens | " + " | ".join(f"depth {d:g}" for d in p["depths"]) + " |",
                  "|---:|" + "---:|" * len(p["depths"])]
        for n, row in zip(p["actual_lengths"], p["accuracy"]):
            lines.append(f"| {n} | " + " | ".join(f"{a:.2f}" for a in row) + " |")
    return "\n".join(lines) + "\n"


def plot_loss_vs_position(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4))
    for r in results:
        longest = max(r["contexts"], key=int)
        c = r["contexts"][longest]["nonoverlapping"]
        line, = ax.plot(c["binned_positions"], c["binned_loss"], label=f"{r['name']} ({r['encoding']})")
        if "binned_low" in c:  # a study's curve: the mean of its seeds, in the band from their lowest to highest
            ax.fill_between(c["binned_positions"], c["binned_low"], c["binned_high"], color=line.get_color(),
                            alpha=0.15, linewidth=0)
    for L in sorted({r["train_context"] for r in results}):
        ax.axvline(L, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("position in window (dashed: training context L)")
    ax.set_ylabel("validation loss")
    ax.set_title("Loss vs position (non-overlapping windows of the longest context)", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), loc="center left", bbox_to_anchor=(0.76, 0.5), fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.75, 1))  # the legend beside the axes: it covers no curve
    save_figure(fig, path)


def plot_passkey(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = result["passkey"]
    accuracy = np.array(p["accuracy"])
    fig, ax = plt.subplots(figsize=(1.2 * len(p["lengths"]) + 2, 0.6 * len(p["depths"]) + 1.5))
    image = ax.imshow(accuracy.T, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(p["lengths"])), [str(n) for n in p["actual_lengths"]])
    ax.set_yticks(range(len(p["depths"])), [f"{d:g}" for d in p["depths"]])
    for i in range(accuracy.shape[0]):
        for j in range(accuracy.shape[1]):
            ax.text(i, j, f"{accuracy[i, j]:.2f}", ha="center", va="center",
                    color="black" if accuracy[i, j] > 0.5 else "white", fontsize=8)
    ax.set_xlabel(f"prompt tokens (trained at {result['train_context']})")
    ax.set_ylabel("needle depth")
    ax.set_title(f"Passkey accuracy: {result['name']} ({result['encoding']})")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    save_figure(fig, path)


def parse_floats(text):
    return [float(x) for x in text.split(",") if x.strip()]


def build_parser():
    p = make_parser(__doc__)
    p.add_argument("--ckpt", nargs="+", required=True, help="run directories (or checkpoint files) to compare")
    p.add_argument("--data-dir", help="prepared data directory (default: the run's own, else the embedded corpus)")
    p.add_argument("--out", help="output directory (default: RUN_DIR/eval for one run; required for several)")
    p.add_argument("--context", type=int, help="training context L (default: the checkpoint's block_size)")
    p.add_argument("--factors", default="1,2,4,8", help="contexts to evaluate, as multiples of L")
    p.add_argument("--windows", type=int, default=16,
                   help="validation tokens used = windows x the longest context (same tokens for every context)")
    p.add_argument("--stride-fraction", type=float, default=0.25, help="sliding-window stride as a fraction of C")
    p.add_argument("--documents", action="store_true",
                   help="read windows of the longest context that lie inside single documents (--windows of them, "
                        "0 = all), every shorter context the same tokens, and give the rise past L an interval over "
                        "documents; without it the first --windows x the longest context validation tokens, across "
                        "documents")
    p.add_argument("--batch-tokens", type=int, default=16384, help="tokens per forward pass (memory knob)")
    p.add_argument("--passkey-factors", default="0.5,1,2,4,8", help="passkey prompt lengths, as multiples of L")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="needle depths (0 = start, 1 = end)")
    p.add_argument("--passkey-trials", type=int, default=10, help="random keys per (length, depth); 0 skips passkey")
    p.add_argument("--seed", type=int, default=0, help="seed of the random passkeys")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.factors = [int(f) for f in args.factors.split(",")]
        args.passkey_factors = parse_floats(args.passkey_factors)
        args.depths = parse_floats(args.depths)
    except ValueError as error:
        p.error(f"--factors takes integers and --passkey-factors/--depths numbers, comma-separated, e.g. 1,2,4,8 "
                f"({error})")
    if min(args.factors) < 1 or min(args.passkey_factors, default=1) <= 0 or args.windows < (0 if args.documents else 1) \
            or args.batch_tokens < 1:
        p.error(f"--factors must be integers >= 1 (got {args.factors}), --passkey-factors positive (got "
                f"{args.passkey_factors}), --windows and --batch-tokens >= 1 (got {args.windows}, {args.batch_tokens})")
    if not all(0 <= d <= 1 for d in args.depths):
        p.error(f"--depths must lie in [0, 1] (got {args.depths})")
    if not 0 < args.stride_fraction <= 1:
        p.error(f"--stride-fraction must be in (0, 1] (got {args.stride_fraction})")
    check_context(p, args)
    default_out(p, args)
    return args


def main(argv=None):
    args = parse_args(argv)
    device = pick_device(args.device)

    def pictures(results):
        return [("loss_vs_position.png", lambda path: plot_loss_vs_position(results, path))] + [
            (f"passkey_{r['name']}.png", lambda path, r=r: plot_passkey(r, path)) for r in results if "passkey" in r]
    return evaluate_and_write(args, lambda run: evaluate_checkpoint(run, args, device), markdown_report,
                              "extrapolation", pictures, check=lambda run: checked_inputs(run, args, "cpu"))


if __name__ == "__main__":
    main()
