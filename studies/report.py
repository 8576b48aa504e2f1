"""A study's report: report.md and report.json written from summary.build_report, its plots, and --publish
(the report copied between markers into a docs page)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
from pathlib import Path


from training.metrics import atomic_write_text
from studies.curves import main as plot_loss_curves
from studies.spec import CONFIDENCE, MIN_SEEDS_FOR_A_FINDING, Study, StudyError, evaluation
from studies.summary import build_report, eval_outputs_by_seed, finding_word


def fmt(stat: dict | None, digits: int = 4) -> str:
    if not stat or stat.get("mean") is None:
        return "–"
    return f"{stat['mean']:.{digits}f}" + (f" ± {stat['std']:.{digits}f}" if stat.get("std") is not None else "")


def setup_lines(setup: dict) -> list[str]:
    m = setup["model"]
    params = ", ".join(f"{encoding} {n:,}" for encoding, n in setup["parameters"].items())
    lines = [f"- Model: {m['n_layer']} layers, width {m['n_embd']} ({m['n_head']} heads × {m['head_dim']}), context "
             f"{m['block_size']} tokens, vocabulary {m['vocab_size']}; parameters: {params}.",
             f"- Training: {setup['tokens_per_run']:,} tokens per run ({setup['iterations']} iterations × "
             f"{setup['sequences_per_iteration']} sequences × {m['block_size']} tokens); the Runs table has each "
             "run's own count."]
    if "zero_shot_documents" in setup:
        lines.append("- Zero-shot: documents per task: "
                     + ", ".join(f"{task} {n}" for task, n in setup["zero_shot_documents"].items()) + ".")
    if "extrapolation" in setup:
        ex = setup["extrapolation"]
        windows = ", ".join(f"{c} tokens: {n}" for c, n in ex["windows"].items())
        if ex.get("documents"):
            lines.append(f"- Extrapolation: {ex['val_tokens']:,} validation tokens in windows of the longest context "
                         f"that each lie inside one of {ex['documents']} documents, every context reading the same "
                         f"tokens; non-overlapping windows per context: {windows}.")
        else:
            lines.append(f"- Extrapolation: the first {ex['val_tokens']:,} validation tokens; non-overlapping windows "
                         f"per context: {windows}.")
    if "retrieval" in setup:
        rt = setup["retrieval"]
        lines.append(f"- Retrieval: {rt['sequences']} test sequences per gap bucket, {rt['pairs']} facts and their "
                     f"queries in each ({rt['queries'][0]} queries per bucket and run), filled with validation text.")
    if "reach" in setup:
        rc = setup["reach"]
        lines.append(f"- Reach: {rc['windows']} validation windows at L for the attention mass, and {rc['windows']} of "
                     f"{rc['factor']}L for the positional penalty, read to distances of {rc['largest_distance']:,} "
                     "tokens.")
    if "long_context" in setup:
        lc = setup["long_context"]
        factors = ", ".join(f"{n:,} ({n / lc['train_context']:g}×)" for n in lc["lengths"])
        documents = f"the first {lc['limit']}" if lc["limit"] else "all"
        lines.append(f"- Long context: RULER and BABILong through lm-eval at {factors} tokens; {len(lc['tasks'])} tasks, "
                     f"{documents} documents per task and length; positions: `--rope-scaling {lc['rope_scaling']}`.")
    if "passkey" in setup:
        p = setup["passkey"]
        trials = f"{p['trials']} trial{'s' if p['trials'] != 1 else ''}"
        lines.append(f"- Passkey: prompts of {', '.join(map(str, p['lengths']))} tokens × {p['depths']} depths × "
                     f"{trials} = {len(p['lengths']) * p['depths'] * p['trials']} prompts per run.")
    return lines


def paper_warning(setup: dict) -> list[str]:
    paper = setup.get("paper")
    if not paper or paper["comparable"]:
        return []
    params = ", ".join(f"{n:,}" for n in sorted(set(setup["parameters"].values())))
    return [f"**Warning:** the paper's {paper['size']} row below comes from a {paper['parameters'] / 1e6:,.0f}M-"
            f"parameter model trained on {paper['tokens'] / 1e9:,.0f}B tokens; this study's model has {params} "
            f"parameters and saw {setup['tokens_per_run']:,} tokens per run. Beside it, our numbers show that the "
            "pipeline works, not how the encodings compare at the paper's scale.", ""]


def markdown(report: dict, plots: dict) -> str:
    ref = report["reference"]
    enc = report["encodings"]
    lines = [f"# Study `{report['study']}`", "",
             f"Base config `{os.path.relpath(report['base'])}`, overrides `{' '.join(report['overrides']) or 'none'}`, "
             f"seeds {report['seeds']}, launch {report['launch']['mode']}. Every number is mean ± sample standard "
             "deviation over seeds, read from the runs' own metrics.jsonl and eval/*.json "
             "(report.json holds them all).",
             "", "## Setup", "", *setup_lines(report["setup"]),
             "", "## Final validation loss", "",
             f"| encoding | seeds | val loss | − {ref} (paired) | {CONFIDENCE:.0%} t-interval "
             "| finding | diverged |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for name, e in enc.items():
        d = e["difference_to_reference"]
        interval = f"[{d['interval'][0]:+.4f}, {d['interval'][1]:+.4f}]" if d and d["interval"] else "–"
        lines.append(f"| {name} | {e['final_val_loss']['n']} | {fmt(e['final_val_loss'])} | {fmt(d)} | "
                     f"{interval} | {finding_word(d) if name != ref else '–'} | {len(e.get('diverged_seeds', []))} |")
    lines += ["", f"Rule: {report['rule']}.", ""] + [f"- {e['verdict']}" for e in enc.values()]
    if "loss_curves" in plots:
        lines += ["", f"![loss curves]({plots['loss_curves']})"]
    if any("extrapolation" in e for e in enc.values()):
        lines += ["", "## Loss beyond the training context", "",
                  "| encoding | C/L | C | non-overlapping | beyond L | sliding |", "|---|---:|---:|---:|---:|---:|"]
        for name, e in enc.items():
            for factor, c in e.get("extrapolation", {}).get("contexts", {}).items():
                lines.append(f"| {name} | {factor} | {c['context']} | {fmt(c['nonoverlapping'])} | "
                             f"{fmt(c['beyond_train_context'])} | {fmt(c['sliding'])} |")
        lines += extrapolation_comparison_lines(report)
        if "loss_vs_position" in plots:
            lines += ["", f"![loss vs position]({plots['loss_vs_position']})"]
        passkeys = {n: e["extrapolation"]["passkey"] for n, e in enc.items() if "passkey" in e.get("extrapolation", {})}
        if passkeys:
            lengths = next(iter(passkeys.values()))["lengths"]
            lines += ["", "## Passkey retrieval accuracy (mean over depths, then over seeds)", "",
                      "| encoding | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
                      "|---|" + "---:|" * len(lengths)]
            for name, p in passkeys.items():
                lines.append(f"| {name} | " + " | ".join(fmt(a, 2) for a in p["accuracy_by_length"]) + " |")
    zs = {n: e["zero_shot"] for n, e in enc.items() if "zero_shot" in e}
    if zs:
        first = next(iter(zs.values()))
        tasks = list(first["tasks"])
        lines += ["", "## Zero-shot accuracy (%)", "", *paper_warning(report["setup"]),
                  "The metric eval/zero_shot.py averages (named per task), ours beside the paper's row:", "",
                  "| encoding | " + " | ".join(f"{t} ({first['tasks'][t]['average_metric']})" for t in tasks)
                  + " | average |", "|---|" + "---:|" * (len(tasks) + 1)]
        for name, z in zs.items():
            lines.append(f"| {name} (ours) | " + " | ".join(fmt(z["tasks"][t].get("score"), 2) for t in tasks)
                         + f" | {fmt(z['average'], 2)} |")
            paper = z["paper"]
            complete = paper is not None and len(tasks) == len(paper) - 1
            lines.append(f"| {name} (paper, {z['paper_size']}) | " + " | ".join(
                "–" if not paper or paper.get(t) is None else f"{paper[t]:.2f}" for t in tasks)
                + (f" | {paper['avg']:.2f} |" if complete else " | – |"))
        lines += ["", "Both metrics, acc / acc_norm:", "", "| encoding | " + " | ".join(tasks) + " |",
                  "|---|" + "---:|" * len(tasks)]
        for name, z in zs.items():
            lines.append(f"| {name} | " + " | ".join(
                f"{fmt(z['tasks'][t].get('acc'), 2)} / {fmt(z['tasks'][t].get('acc_norm'), 2)}" for t in tasks) + " |")
    lines += retrieval_lines(report, plots)
    lines += reach_lines(report, plots)
    lines += long_context_lines(report, plots)
    lines += ["", "## Runs", "", "| encoding | seed | status | iterations | tokens | final val loss | wall-clock (h) "
              "| GPU-hours | run directory |", "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in report["runs"]:
        loss = "–" if r["final_val_loss"] is None else f"{r['final_val_loss']:.4f}"
        lines.append(f"| {r['encoding']} | {r['seed']} | {r['status']} | {r['iter']} | {r['tokens']:,} | {loss} | "
                     f"{sum(r['wall_clock_s'].values()) / 3600:.3f} | {r['gpu_hours']:.2f} | `{r['run_dir']}` |")
    failed = [r for r in report["runs"] if r["errors"]]
    if failed:
        lines += ["", "## Failed or diverged runs", ""]
        lines += [f"- {r['encoding']} seed {r['seed']}: {'; '.join(r['errors'])}" for r in failed]
    return "\n".join(lines) + "\n"


def interval_cell(stat: dict | None, digits: int = 3) -> str:
    """mean [95% interval], with * where it is a finding (excludes 0 over enough seeds)."""
    if not stat or stat.get("mean") is None:
        return "–"
    if stat["interval"] is None:
        return f"{stat['mean']:+.{digits}f} ({stat['n']} seed)"
    lo, hi = stat["interval"]
    return f"{stat['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]" + ("*" if stat["finding"] else "")


def extrapolation_comparison_lines(report: dict) -> list[str]:
    comparisons = {n: e["extrapolation"]["by_seed"] for n, e in report["encodings"].items()
                   if e.get("extrapolation", {}).get("by_seed")}
    if not comparisons:
        return []
    factors = sorted({k for c in comparisons.values() for k in c["rise"]}, key=int)
    header = " | ".join(f"{k}L" for k in factors)
    ref = report["reference"]
    lines = ["", f"Per seed, then the mean and its {CONFIDENCE:.0%} t-interval over seeds (* where the interval "
             f"excludes 0 over at least {MIN_SEEDS_FOR_A_FINDING} seeds): the rise of the loss beyond L over the "
             "loss at L, in the same windows (positive: the loss grows past the training context).", "",
             f"| encoding | loss at L | rise at {header.replace(' | ', ' | rise at ')} |",
             "|---|---:|" + "---:|" * len(factors)]
    for name, c in comparisons.items():
        lines.append(f"| {name} | {fmt(c['at_L'], 3)} | "
                     + " | ".join(interval_cell(c["rise"].get(k)) for k in factors) + " |")
    data = {n: {k: e["extrapolation"]["contexts"].get(k, {}).get("rise_by_document") for k in factors}
            for n, e in report["encodings"].items() if n in comparisons}
    if any(cell for row in data.values() for cell in row.values()):
        documents = next(cell["documents"] for row in data.values() for cell in row.values() if cell)
        lines += ["", f"The data's own error: the half-width of each seed's {CONFIDENCE:.0%} t-interval of the rise over "
                      f"the {documents} documents read (windows of one document averaged first), averaged over seeds; "
                      "a rise smaller than this says more about which documents were read than about the encoding.",
                  "", f"| encoding | ± at {header.replace(' | ', ' | ± at ')} |", "|---|" + "---:|" * len(factors)]
        for name, row in data.items():
            lines.append(f"| {name} | " + " | ".join("–" if not row[k] else f"{row[k]['half_width']:.3f}"
                                                    for k in factors) + " |")
    lines += ["", f"The loss beyond L minus {ref}'s (paired by seed):", "", f"| encoding | {header} |",
              "|---|" + "---:|" * len(factors)]
    for name, c in comparisons.items():
        if name != ref:
            lines.append(f"| {name} − {ref} | "
                         + " | ".join(interval_cell(c["beyond_minus_reference"].get(k)) for k in factors) + " |")
    return lines


def retrieval_lines(report: dict, plots: dict) -> list[str]:
    enc = {n: e["retrieval"] for n, e in report["encodings"].items() if "retrieval" in e}
    if not enc:
        return []
    first = next(iter(enc.values()))
    names = [b["bucket"] for b in first["buckets"]]
    header = " | ".join(f"gap {n}" for n in names)
    ref = report["reference"]
    lines = ["", "## Retrieval by distance (accuracy)", "",
             "A query counts when the model's most likely next token is right at every value token (eval/retrieval.py); "
             f"mean ± sample std over seeds, L = {first['train_context']}.", "",
             f"| encoding | {header} |", "|---|" + "---:|" * len(names)]
    for name, rt in enc.items():
        lines.append(f"| {name} | " + " | ".join(fmt(b["accuracy"], 3) for b in rt["buckets"]) + " |")
    diffs = {n: rt["difference_to_reference"] for n, rt in enc.items() if rt.get("difference_to_reference")}
    if diffs:
        lines += ["", f"Paired difference to {ref} (per seed, then mean; {CONFIDENCE:.0%} t-interval; * where it "
                      f"excludes 0 over at least {MIN_SEEDS_FOR_A_FINDING} seeds):", "", f"| encoding | {header} |",
                  "|---|" + "---:|" * len(names)]
        for name, cells in diffs.items():
            lines.append(f"| {name} − {ref} | " + " | ".join(interval_cell(d, 3) for d in cells) + " |")
    if "retrieval" in plots:
        lines += ["", f"![retrieval accuracy against gap]({plots['retrieval']})"]
    return lines


def reach_lines(report: dict, plots: dict) -> list[str]:
    enc = {n: e["reach"] for n, e in report["encodings"].items() if "reach" in e}
    if not enc:
        return []
    lines = ["", "## Each head's reach", "",
             "Median head: the distance that holds 90% of a head's attention mass at L, the median over its heads "
             "(eval/reach.py). Longest reach: over the heads of an additive encoding, the largest distance at which "
             "the mean positional penalty is still below the head's content margin (best minus median content logit); "
             "'≥' where some head's penalty stays below its margin as far as was read. Mean ± sample std over seeds.",
             "", "| encoding | median head: 90% of the mass within | longest reach (penalty < margin) | heads beyond "
             "the longest distance read |", "|---|---:|---:|---:|"]
    for name, rc in enc.items():
        if rc["additive"]:
            longest = ("≥ " if rc["beyond_read"]["mean"] else "") + fmt(rc["reach"], 0)
            beyond = f"{fmt(rc['beyond_read'], 1)} of {rc['heads']}"
        else:
            longest, beyond = "– (no additive penalty)", "–"
        median = rc["median_reach_mass"]
        held = f"> {rc['mass_read']}" if median["mean"] is not None and "mass_read" in rc and \
            median["mean"] > rc["mass_read"] else fmt(median, 0)  # (a head that never holds 90% as far as was read)
        lines.append(f"| {name} | {held} | {longest} | {beyond} |")
    if "reach" in plots:
        lines += ["", f"![each head's reach]({plots['reach']})"]
    return lines


def plot_retrieval(report: dict, path: str) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from eval.outputs import save_figure

    enc = {n: e["retrieval"] for n, e in report["encodings"].items() if "retrieval" in e}
    if not enc:
        return False
    fig, ax = plt.subplots(figsize=(8, 4))
    for n, (name, rt) in enumerate(enc.items()):
        L = rt["train_context"]
        x = [b["mean_gap"] / L for b in rt["buckets"]]
        mean = [b["accuracy"]["mean"] for b in rt["buckets"]]
        std = [b["accuracy"]["std"] or 0.0 for b in rt["buckets"]]
        colour = plt.get_cmap("tab10")(n % 10)
        ax.plot(x, mean, marker="o", markersize=3, color=colour, label=name)
        ax.fill_between(x, [max(0, m - s) for m, s in zip(mean, std)], [min(1, m + s) for m, s in zip(mean, std)],
                        color=colour, alpha=0.15, linewidth=0)
    ax.axvline(1, color="gray", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("gap / training context L (mean of each bucket; dashed: L)")
    ax.set_ylabel("retrieval accuracy (band: ± std over seeds)")
    fig.legend(*ax.get_legend_handles_labels(), loc="center left", bbox_to_anchor=(0.8, 0.5), fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.79, 1))
    save_figure(fig, path)
    return True


def plot_reach(report: dict, path: str) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from eval.outputs import save_figure

    enc = {n: e["reach"] for n, e in report["encodings"].items() if "reach" in e}
    if not enc:
        return False
    fig, (ax_mass, ax_share) = plt.subplots(1, 2, figsize=(11, 4))
    for n, (name, rc) in enumerate(enc.items()):
        colour = plt.get_cmap("tab10")(n % 10)
        L = rc["train_context"]
        for ax, key in ((ax_mass, "mass_within"), (ax_share, "share_reaching")):
            if key not in rc:
                continue
            mean = [d["mean"] for d in rc[key]]
            std = [d["std"] or 0.0 for d in rc[key]]
            x = [d / L for d in range(len(mean))]
            ax.plot(x, mean, color=colour, linewidth=1.3, label=name)
            ax.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color=colour,
                            alpha=0.15, linewidth=0)
    ax_mass.set_xlabel("distance / L (queries in [L/2, L))")
    ax_mass.set_ylabel("attention mass within the distance (mean head)")
    ax_share.set_xlabel("distance / L")
    ax_share.set_ylabel("share of heads whose penalty is below their margin")
    ax_share.set_title("additive encodings", fontsize=9)
    ax_mass.set_xscale("symlog", linthresh=1 / 64)
    ax_share.set_xscale("symlog", linthresh=1 / 64)
    handles, labels = ax_mass.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.86, 0.5), fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    save_figure(fig, path)
    return True


def long_context_lines(report: dict, plots: dict) -> list[str]:
    enc = {n: e["long_context"] for n, e in report["encodings"].items() if "long_context" in e}
    if not enc:
        return []
    first = next(iter(enc.values()))
    lengths = [str(n) for n in first["lengths"]]
    header = " | ".join(f"{int(n):,} ({int(n) / first['train_context']:g}×)" for n in lengths)
    lines = ["", "## Long context: RULER and BABILong (accuracy %)", "",
             "Each cell: lm-eval's score, mean ± sample std over seeds (eval/long_context.py; each run's "
             "eval/long_context.md has its tables). An average over fewer tasks than RULER's 13 or BABILong's 5 says "
             "how many.", "", f"| encoding | average | {header} |", "|---|---|" + "---:|" * len(lengths)]
    for name, lc in enc.items():
        for family, label, full in (("ruler", "RULER", 13), ("babilong", "BABILong", 5)):
            counts = lc[f"{family}_average_tasks"]
            if not any(counts.values()):
                continue
            cells = [fmt(lc[f"{family}_average"][n], 2) + (f" ({counts[n]} of {full})" if 0 < counts[n] < full else "")
                     for n in lengths]
            lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    ref = report["reference"]
    diffs = {n: lc.get("difference_to_reference") for n, lc in enc.items() if lc.get("difference_to_reference")}
    if diffs:
        lines += ["", f"Paired difference to {ref} (per seed, then mean; {CONFIDENCE:.0%} t-interval; * where it "
                      f"excludes 0 over at least {MIN_SEEDS_FOR_A_FINDING} seeds):", "", f"| encoding | average | {header} |",
                  "|---|---|" + "---:|" * len(lengths)]
        for name, families in diffs.items():
            for family, label in (("ruler", "RULER"), ("babilong", "BABILong")):
                cells = []
                for n in lengths:
                    d = families[family][n]
                    cells.append(interval_cell(d, 2) if d["n"] else "–")
                if any(c != "–" for c in cells):
                    lines.append(f"| {name} − {ref} | {label} | " + " | ".join(cells) + " |")
    lines += ["", "Per task:", "", f"| encoding | task | {header} |", "|---|---|" + "---:|" * len(lengths)]
    for name, lc in enc.items():
        for task, cells in lc["tasks"].items():
            lines.append(f"| {name} | {task} | " + " | ".join(fmt(cells[n], 1) for n in lengths) + " |")
    if "long_context" in plots:
        lines += ["", f"![accuracy against context length]({plots['long_context']})"]
    return lines


def mean_over_seeds(results: list[dict]) -> dict:
    """An extrapolation result whose longest context's binned loss curve is the mean of the seeds' curves (the
    same validation tokens and bins for every seed)."""
    longest = max(results[0]["contexts"], key=int)
    curves = [r["contexts"][longest]["nonoverlapping"]["binned_loss"] for r in results]
    cell = {"binned_positions": results[0]["contexts"][longest]["nonoverlapping"]["binned_positions"],
            "binned_loss": [statistics.fmean(column) for column in zip(*curves)],
            "binned_low": [min(column) for column in zip(*curves)],
            "binned_high": [max(column) for column in zip(*curves)]}
    return {"train_context": results[0]["train_context"], "contexts": {longest: {"nonoverlapping": cell}}}


def write_plots(study: Study, report: dict) -> dict:
    plots = {}
    done = [r for r in report["runs"] if r["finished"]]
    if done:
        path = os.path.join(study.out_dir, "loss_curves.png")
        labels = [f"{r['encoding']} seed {r['seed']}" for r in done]
        with contextlib.redirect_stdout(io.StringIO()):  # it prints the path
            drawn = plot_loss_curves([r["run_dir"] for r in done] + ["--out", path, "--title", study.name, "--labels",
                                                                   *labels, "--groups", *[r["encoding"] for r in done], "--bands"])
        if drawn == 0:  # it refuses (and says why) when no run has readable metrics: link no missing plot
            plots["loss_curves"] = "loss_curves.png"
    results = []  # one line per encoding: its seeds' loss at each position of the longest context, averaged
    for encoding in study.encodings:
        seeds = eval_outputs_by_seed(study, encoding, "extrapolation")
        if seeds:
            results.append(mean_over_seeds(list(seeds.values())) | {"name": encoding,
                                                                     "encoding": f"{len(seeds)} seeds"})
    if results:
        evaluation("extrapolation").plot_loss_vs_position(results, os.path.join(study.out_dir, "loss_vs_position.png"))
        plots["loss_vs_position"] = "loss_vs_position.png"
    lines = []  # one line per encoding: the mean over seeds of each average
    for name, entry in report["encodings"].items():
        lc = entry.get("long_context")
        if lc:
            means = {f: {n: v["mean"] for n, v in lc[f"{f}_average"].items()} for f in ("ruler", "babilong")}
            lines.append({"name": name, "encoding": name, "label": f"{name} (mean of {len(lc['seeds'])} seeds)",
                          "lengths": lc["lengths"], "train_context": lc["train_context"],
                          "ruler_average": means["ruler"], "babilong_average": means["babilong"],
                          "ruler_average_tasks": lc["ruler_average_tasks"],
                          "babilong_average_tasks": lc["babilong_average_tasks"]})
    if lines and evaluation("long_context").plot_accuracy_vs_length(lines, os.path.join(study.out_dir, "long_context.png")):
        plots["long_context"] = "long_context.png"
    for key, draw in (("retrieval", plot_retrieval), ("reach", plot_reach)):
        if draw(report, os.path.join(study.out_dir, f"{key}.png")):
            plots[key] = f"{key}.png"
    return plots


def write_report(study: Study, statuses: dict) -> dict:
    report = build_report(study, statuses)
    os.makedirs(study.out_dir, exist_ok=True)
    plots = write_plots(study, report)
    report["plots"] = plots
    atomic_write_text(os.path.join(study.out_dir, "report.json"), json.dumps(report, indent=2) + "\n")
    atomic_write_text(os.path.join(study.out_dir, "report.md"), markdown(report, plots))
    return report


REPORT_BEGIN, REPORT_END = "<!-- study report: begin (study.py --publish writes this part) -->", \
    "<!-- study report: end -->"
FORMER_BEGIN = REPORT_BEGIN.replace("study.py", "scripts/study.py")  # in pages published before study.py moved


def check_publish_target(target: str) -> str:
    """The text of `target` (the two markers alone for a missing file), refused before any work when it lacks the
    markers, is not a UTF-8 text file, or cannot be replaced (a read-only or immutable file, a folder that refuses
    new files): a study of hours must not end in an error that loses its report. Opening the file for writing
    (without writing) and making a file in its folder are the probes: os.access says yes to root on an immutable
    file's folder, and a mode of 444 is no obstacle to a rename, which would replace the file against its owner's
    wish. A symbolic link is written through: the document it points to gets the report. Anything but a regular
    file (a FIFO, /dev/stdout, a device) is refused before it is read, which would wait for a writer or a reader
    that never comes."""
    import stat
    import tempfile

    if os.path.isdir(target):
        raise StudyError(f"--publish {target} is a folder; give the Markdown file to write the report into, e.g. "
                         f"{os.path.join(target, 'results.md')}.")
    with contextlib.suppress(OSError):  # (a missing file, or a link to one, is made)
        mode = os.stat(target).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
            raise StudyError(f"--publish {target} is {kind}, not a regular file; give the Markdown file to write the "
                             "report into (the report is printed and in the study's report.md either way).")
    path = os.path.realpath(target) if os.path.islink(target) else target
    if os.path.exists(path):
        try:
            text = Path(path).read_text(encoding="utf-8")
            with open(path, "r+b"):
                pass
        except UnicodeDecodeError:
            raise StudyError(f"--publish {target} is not UTF-8 text; save it as UTF-8 (or choose another file).") \
                from None
        except OSError as error:
            raise StudyError(f"--publish {target} cannot be written ({error.strerror or error}); make it writable "
                             "(chmod u+w, or chattr -i for an immutable file) or choose another file.") from None
    else:
        text = f"{REPORT_BEGIN}\n{REPORT_END}\n"
    text = text.replace(FORMER_BEGIN, REPORT_BEGIN)
    if text.count(REPORT_BEGIN) != 1 or text.count(REPORT_END) != 1 or text.index(REPORT_BEGIN) > text.index(REPORT_END):
        raise StudyError(f"{target} must hold the lines {REPORT_BEGIN} and {REPORT_END} once each, in that order: "
                         "the report goes between them; add them where it belongs.")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".publish_probe_"):
            pass
    except OSError:  # (FileNotFoundError for a folder that does not exist)
        raise StudyError(f"--publish {target}: its folder {folder} does not exist or cannot be written; "
                         "make it or choose another file.") from None
    return text


def publish(study: Study, report: dict, target: str) -> None:
    """The report into `target` between REPORT_BEGIN and REPORT_END (the text around them is kept; a new file gets
    just the markers and the report), one heading level down, with its plots copied beside the file as
    <target stem>_<plot>.png. The file keeps its mode. A write that fails after all (a full disk, a file made
    read-only since the study started) is one StudyError that leaves the file and its folder as they were; the
    report is in the study's own report.md either way."""
    import shutil

    text = check_publish_target(target)
    # a link is written through: the document it points to gets the report, and its plots go beside that document
    path = os.path.realpath(target) if os.path.islink(target) else target
    folder, stem = os.path.dirname(os.path.abspath(path)), Path(path).stem
    plots, written = {}, []
    try:
        for key, name in report["plots"].items():
            plots[key] = f"{stem}_{name}"
            staged = os.path.join(folder, plots[key] + ".tmp")
            written.append(staged)
            shutil.copyfile(os.path.join(study.out_dir, name), staged)
        body = "\n".join("#" + line if line.startswith("#") else line
                         for line in markdown(report, plots).splitlines())
        before, rest = text.split(REPORT_BEGIN)
        after = rest.split(REPORT_END)[1]
        staged = path + ".tmp"
        written.append(staged)
        with open(staged, "w", encoding="utf-8") as f:
            f.write(f"{before}{REPORT_BEGIN}\n{body}\n{REPORT_END}{after}")
        if os.path.exists(path):
            shutil.copymode(path, staged)
        for key in plots:  # every file is whole before any replaces what was there
            picture = os.path.join(folder, plots[key])
            if not os.path.exists(picture):
                written.append(picture)  # (a new picture goes again if the page cannot take its link)
            os.replace(picture + ".tmp", picture)
        os.replace(staged, path)
    except OSError as error:
        for leftover in written:
            with contextlib.suppress(OSError):
                os.remove(leftover)
        raise StudyError(f"cannot publish the report into {target} ({error.strerror or error}); it is in "
                         f"{os.path.join(study.out_dir, 'report.md')}: free space or make {target} writable, then run "
                         "the same command again (finished runs are not redone)") from None
    linked = f" (the document {path} it links to)" if path != target else ""
    print(f"[study] wrote the report into {target}{linked} and its plots beside it", flush=True)
