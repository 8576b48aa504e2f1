"""Plot the train and validation loss of several runs against tokens seen, on one PNG.

    python scripts/plot_runs.py runs/medium/rope runs/medium/fox runs/medium/grape_ap --out docs/medium_loss.png

Reads RUN_DIR/metrics.jsonl of each run directory (written by train.py). Left panel: training loss
(smoothed with --smooth, an exponential moving average); right panel: validation loss. Each run is
labelled with its directory name (or --labels), the way the paper's Figures 2-3 compare encodings;
--groups gives the runs of one group (an encoding's seeds) one colour in shades. A study's report draws its
loss_curves.png with the same code (studies/curves.py).
"""
from __future__ import annotations

import json
import os
import sys


from config import UserError
from eval.cli import make_parser
from eval.outputs import check_writable, save_figure


def read_curves(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """{"train": [(tokens, loss), ...], "val": [(tokens, val_loss), ...]} from RUN_DIR/metrics.jsonl."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist; pass run directories written by train.py")
    curves: dict[str, list[tuple[int, float]]] = {"train": [], "val": []}
    with open(path, errors="replace") as f:  # binary garbage is a damaged line, skipped like a cut one
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if not isinstance(record, dict):
                continue  # JSON, but not a record train.py writes: damaged too
            kind, value = record.get("type"), {"train": "loss", "val": "val_loss"}.get(record.get("type"))
            point = (record.get("tokens"), record.get(value))
            if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in point):
                curves[kind].append(point)  # (a record without its numbers is damaged too)
    for points in curves.values():
        points.sort()
    return curves


def smooth(values: list[float], weight: float) -> list[float]:
    """Exponential moving average with bias correction (weight 0 = raw values)."""
    out, average = [], 0.0
    for i, value in enumerate(values):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight ** (i + 1)))
    return out


def build_parser():
    parser = make_parser(__doc__)
    parser.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
    parser.add_argument("--out", default="loss_curves.png", help="output PNG")
    parser.add_argument("--labels", nargs="*", help="one label per run (default: the directory names)")
    parser.add_argument("--smooth", type=float, default=0.6, help="EMA weight for the training loss, 0..1")
    parser.add_argument("--title", default="", help="figure title (default: none)")
    parser.add_argument("--groups", nargs="*", help="one group per run, e.g. its encoding: a group's runs share one "
                                                    "colour, in shades (default: a colour per run)")
    parser.add_argument("--bands", action="store_true",
                        help="with --groups: each group as one line, the mean of its runs, in a band from their lowest "
                             "to their highest value, with one legend entry per group beside the panels")
    return parser


def group_band(points_of_runs: list[list[tuple[int, float]]]):
    """(x, mean, lowest, highest) of a group's curves, each read at the x of its longest run (np.interp inside a run's
    own range; a run that ends earlier counts only where it has points)."""
    import numpy as np

    runs = [p for p in points_of_runs if p]
    x = np.array([t for t, _ in max(runs, key=len)], dtype=float)
    values = np.full((len(runs), len(x)), np.nan)
    for i, points in enumerate(runs):
        xs, ys = zip(*points)
        inside = (x >= xs[0]) & (x <= xs[-1])
        values[i, inside] = np.interp(x[inside], xs, ys)
    return x, np.nanmean(values, 0), np.nanmin(values, 0), np.nanmax(values, 0)


def group_colours(groups: list[str]) -> list[tuple]:
    """One tab10 colour per group (in order of first appearance); the k-th of a group's n runs mixed with white
    by 0.6·k/n, which keeps the hue (every channel moves toward 1 in proportion) and makes the seeds shades."""
    from matplotlib import colormaps, colors

    names = list(dict.fromkeys(groups))
    colours, seen = [], {}
    for group in groups:
        k, n = seen.get(group, 0), groups.count(group)
        seen[group] = k + 1
        base = colors.to_rgb(colormaps["tab10"](names.index(group) % 10))
        colours.append(tuple(c + (1 - c) * 0.6 * k / n for c in base))
    return colours


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for option, values in (("labels", args.labels), ("groups", args.groups)):
        if values and len(values) != len(args.runs):
            print(f"error: {len(values)} {option} for {len(args.runs)} runs; give one per run", file=sys.stderr)
            return 2
    if not 0 <= args.smooth < 1:
        print(f"error: --smooth must be in [0, 1) (got {args.smooth})", file=sys.stderr)
        return 2
    if os.path.isdir(args.out):  # os.replace onto it would fail only after drawing, leaving OUT.tmp.png behind
        print(f"error: --out {args.out} is a folder; name the PNG file to write, e.g. "
              f"{os.path.join(args.out, 'loss_curves.png')}", file=sys.stderr)
        return 2
    try:
        check_writable(os.path.dirname(os.path.abspath(args.out)), "the plot")
        curves = [read_curves(run) for run in args.runs]
    except (UserError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    unread = [os.path.join(run, "metrics.jsonl") for run, c in zip(args.runs, curves) if not (c["train"] or c["val"])]
    if len(unread) == len(curves):  # an empty plot said nothing but a matplotlib warning
        print(f"error: no readable training or validation records in {', '.join(unread)} (empty or damaged), so "
              "there is nothing to plot; pass run directories whose training has logged a step", file=sys.stderr)
        return 2
    if unread:
        print(f"warning: no readable training or validation records in {', '.join(unread)} (empty or damaged); "
              f"the plot leaves {'it' if len(unread) == 1 else 'them'} out", file=sys.stderr)

    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    largest = max((t for c in curves for points in c.values() for t, _ in points), default=1)
    scale, unit = next((s, u) for s, u in ((1e9, "billions"), (1e6, "millions"), (1e3, "thousands"), (1, ""))
                       if largest >= s)
    labels = args.labels or [os.path.basename(os.path.normpath(run)) for run in args.runs]
    colours = group_colours(args.groups) if args.groups else [None] * len(curves)
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(12, 4.5))
    if args.bands and args.groups:
        names = list(dict.fromkeys(args.groups))
        for n, group in enumerate(names):
            members = [c for c, g in zip(curves, args.groups) if g == group]
            colour = plt.get_cmap("tab10")(n % 10)
            for ax, key in ((ax_train, "train"), (ax_val, "val")):
                points = [[(t, v) for t, v in zip([t for t, _ in c[key]], smooth([v for _, v in c[key]], args.smooth)
                                                   if key == "train" else [v for _, v in c[key]])] for c in members]
                if not any(points):
                    continue
                x, mean, lo, hi = group_band(points)
                ax.plot(x / scale, mean, color=colour, linewidth=1.4, label=f"{group} ({len(members)})",
                        marker="o" if len(x) == 1 else None, markersize=4)
                ax.fill_between(x / scale, lo, hi, color=colour, alpha=0.2, linewidth=0)
        curves = []  # (drawn above)
    for label, curve, colour in zip(labels, curves, colours):
        if curve["train"]:
            tokens, losses = zip(*curve["train"])
            # a run with one logged point (log_interval >= max_iters) is a dot: a line through one point is invisible
            ax_train.plot([t / scale for t in tokens], smooth(list(losses), args.smooth), label=label, linewidth=1.2,
                          color=colour, marker="o" if len(tokens) == 1 else None, markersize=4)
        if curve["val"]:
            tokens, losses = zip(*curve["val"])
            ax_val.plot([t / scale for t in tokens], losses, marker="o", markersize=3, label=label, linewidth=1.2,
                        color=colour)
    for ax, name in ((ax_train, "training loss"), (ax_val, "validation loss")):
        ax.set_xlabel(f"tokens ({unit})" if unit else "tokens")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        if not args.bands:
            ax.legend(fontsize=8)
    if args.bands and args.groups:  # one legend, beside the panels: it covers no curve
        handles, names = ax_val.get_legend_handles_labels()
        fig.legend(handles, names, loc="center left", bbox_to_anchor=(0.86, 0.5), fontsize=8,
                   title="encoding (runs)", title_fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout(rect=(0, 0, 0.85, 1) if args.bands and args.groups else (0, 0, 1, 1))
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        save_figure(fig, args.out, dpi=130)
    except OSError as e:  # (checked writable before): the disk filled; the runs' metrics are untouched
        print(f"error: cannot write the plot to {args.out} ({e.strerror or e}); free space or choose another --out",
              file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
