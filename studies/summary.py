"""A study's numbers, from the files its runs and evaluations wrote: each run's row, the mean and interval over
seeds, the paired difference against the reference encoding and the finding rule, the setup."""
from __future__ import annotations

import itertools
import math
import os
import statistics


from model import GPTConfig
from studies.curves import read_curves
from studies.launch import eval_finished, final_val_loss, read_json, read_records, run_finished
from studies.spec import CONFIDENCE, MIN_SEEDS_FOR_A_FINDING, Run, Study, evaluation


def describe(values: list[float]) -> dict:
    """Mean and sample standard deviation (n - 1; None for one value) of per-seed values."""
    n = len(values)
    return {"values": values, "n": n, "mean": statistics.fmean(values) if n else None,
            "std": statistics.stdev(values) if n > 1 else None}


def mean_interval(values: list[float]) -> dict:
    """describe(values) with the two-sided 95% Student-t interval of their mean, whether it excludes 0 ("exceeds
    the seed spread"), and whether that is a finding: it excludes 0 over at least MIN_SEEDS_FOR_A_FINDING seeds."""
    result = describe(values)
    if result["n"] < 2:
        return result | {"interval": None, "exceeds_seed_spread": None, "finding": False}
    from scipy.stats import t as student_t  # (here: a one-seed study, the GPU study, runs without scipy)

    half_width = student_t.ppf(0.5 + CONFIDENCE / 2, result["n"] - 1) * result["std"] / math.sqrt(result["n"])
    interval = [result["mean"] - half_width, result["mean"] + half_width]
    excludes = not interval[0] <= 0 <= interval[1]
    return result | {"interval": interval, "exceeds_seed_spread": excludes,
                     "finding": excludes and result["n"] >= MIN_SEEDS_FOR_A_FINDING}


def paired_difference(values: dict[int, float], reference: dict[int, float]) -> dict:
    """mean_interval of the per-seed differences to the reference encoding (same seed = same data order and
    init), over the seeds both have."""
    seeds = sorted(set(values) & set(reference))
    return mean_interval([values[s] - reference[s] for s in seeds]) | {"seeds": seeds}


def finding_word(diff: dict | None) -> str:
    """The table's word for a difference: lower / higher where it is a finding, else not resolved."""
    if not diff or not diff["n"]:
        return "–"
    return ("lower" if diff["mean"] < 0 else "higher") if diff["finding"] else "not resolved"


def verdict(encoding: str, reference: str, diff: dict | None) -> str:
    if encoding == reference:
        return f"{encoding} is the reference."
    if diff is None or diff["n"] == 0:
        return f"{encoding}: no seed finished for both {encoding} and {reference}, so there is no comparison."
    spread = f" ± {diff['std']:.4f} (mean ± sample std)" if diff["std"] is not None else ""
    head = f"{encoding} − {reference} = {diff['mean']:+.4f}{spread} over {diff['n']} paired seed(s)"
    if diff["n"] < MIN_SEEDS_FOR_A_FINDING:
        return (f"{head}: not resolved at this budget (a difference counts only when its {CONFIDENCE:.0%} paired "
                f"t-interval over at least {MIN_SEEDS_FOR_A_FINDING} seeds excludes 0).")
    lo, hi = diff["interval"]
    if diff["finding"]:
        return (f"{head}; the {CONFIDENCE:.0%} t-interval [{lo:+.4f}, {hi:+.4f}] excludes 0: {encoding} is "
                f"{finding_word(diff)} than {reference} at this budget.")
    return f"{head}; the {CONFIDENCE:.0%} t-interval [{lo:+.4f}, {hi:+.4f}] contains 0: not resolved at this budget."


# ----------------------------------------------------------------------------- the report, from the runs' files

def run_row(run: Run, status: dict) -> dict:
    records = read_records(run.run_dir)
    curves = read_curves(run.run_dir) if records else {"train": [], "val": []}
    trains = [r for r in records if r.get("type") == "train"]
    summary = next((r for r in reversed(records) if r.get("type") == "summary"), {})
    finished = run_finished(run)
    times = read_json(os.path.join(run.run_dir, "study_time.json"), dict) or {}
    resolved = read_json(os.path.join(run.run_dir, "config.json"), dict) or {}
    on_gpu = str(summary.get("memory_kind", "")).startswith("cuda")
    gpus = resolved.get("world_size", 1) if on_gpu else 0
    wall = sum(times.values())
    return {
        "encoding": run.encoding, "seed": run.seed, "run_dir": run.run_dir,
        "status": status.get("status", "done" if finished else "not run"), "errors": status.get("errors", []),
        "finished": finished, "iter": trains[-1]["iter"] if trains else 0,
        "tokens": trains[-1]["tokens"] if trains else 0,
        "final_val_loss": final_val_loss(run) if finished else None,
        "val_curve": curves["val"], "wall_clock_s": times, "gpus": gpus,
        "gpu_hours": wall / 3600 * gpus, "peak_memory_gb": summary.get("peak_memory_gb"),
    }


def extrapolation_summary(results: list[dict]) -> dict:
    """Per context (as a multiple of L): non-overlapping loss, loss beyond L, sliding loss; passkey by length."""
    out: dict = {"contexts": {}}
    first = results[0]
    for context in first["contexts"]:
        factor = str(int(context) // first["train_context"])
        cells = [r["contexts"][context] for r in results]
        beyond = [c["nonoverlapping"]["mean_beyond_train_context"] for c in cells]
        out["contexts"][factor] = {
            "context": int(context),
            "nonoverlapping": describe([c["nonoverlapping"]["mean"] for c in cells]),
            "beyond_train_context": describe(beyond) if None not in beyond else None,
            "sliding": describe([c["sliding"]["mean"] for c in cells]) if None not in [c["sliding"] for c in cells]
            else None,  # (--documents reads no sliding windows)
        }
        by_document = [c.get("rise_by_document") for c in cells]
        if by_document and None not in by_document and all(d["interval"] for d in by_document):
            # the data's own error: each seed's 95% interval over documents, its half-width averaged over seeds
            out["contexts"][factor]["rise_by_document"] = {
                "documents": by_document[0]["documents"],
                "half_width": statistics.fmean((d["interval"][1] - d["interval"][0]) / 2 for d in by_document)}
    if all("passkey" in r for r in results):
        per_seed = [[statistics.fmean(row) for row in r["passkey"]["accuracy"]] for r in results]
        out["passkey"] = {"lengths": first["passkey"]["actual_lengths"], "depths": first["passkey"]["depths"],
                          "trials_per_cell": first["passkey"]["trials"],
                          "accuracy_by_length": [describe([seed[i] for seed in per_seed])
                                                 for i in range(len(first["passkey"]["lengths"]))]}
    return out


def retrieval_summary(results: list[dict]) -> dict:
    """Per gap bucket: the accuracy over seeds and the queries per seed."""
    first = results[0]
    return {"train_context": first["train_context"], "pairs": first["pairs"],
            "buckets": [{"bucket": b["bucket"], "lo": b["lo"], "hi": b["hi"], "queries": b["queries"],
                         "mean_gap": b["mean_gap"], "accuracy": describe([r["buckets"][i]["accuracy"] for r in results])}
                        for i, b in enumerate(first["buckets"])]}


def reach_summary(results: list[dict]) -> dict:
    """Over seeds: the median head's reach_mass, the longest reach (eval/reach.encoding_reach), and each distance's
    share of heads that still reach it (penalty below margin), for the plot."""
    def median_mass(r):
        values = [h["reach_mass"] if h["reach_mass"] is not None else len(h["mass"]) for h in r["heads"]]
        return statistics.median(values)

    out = {"train_context": results[0]["train_context"], "additive": results[0]["additive"],
           "mass_read": len(results[0]["heads"][0]["mass"]) - 1,  # the largest distance the mass was read at
           "largest_distance": results[0]["largest_distance"], "heads": len(results[0]["heads"]),
           "median_reach_mass": describe([median_mass(r) for r in results])}
    cumulative = [[statistics.fmean(values) for values in zip(*[itertools.accumulate(h["mass"]) for h in r["heads"]])]
                  for r in results]  # per seed: the mean over heads of the mass within distance d
    out["mass_within"] = [describe([seed[d] for seed in cumulative]) for d in range(len(cumulative[0]))]
    if results[0]["additive"]:
        out["reach"] = describe([r["reach"] for r in results])
        out["beyond_read"] = describe([sum(h["reach_penalty"] is None for h in r["heads"]) for r in results])
        shares = []
        for r in results:
            distances = len(r["heads"][0]["penalty"])
            shares.append([statistics.fmean(h["penalty"][d] < h["margin"] for h in r["heads"])
                           for d in range(distances)])
        out["share_reaching"] = [describe([share[d] for share in shares]) for d in range(len(shares[0]))]
    return out


def zero_shot_summary(reports: list[dict]) -> dict:
    tasks = {}
    for task, row in reports[0]["tasks"].items():
        tasks[task] = {"average_metric": row["average_metric"]}
        for metric in ("acc", "acc_norm", "score"):
            if metric in row:
                tasks[task][metric] = describe([r["tasks"][task][metric] for r in reports])
    return {"tasks": tasks, "average": describe([r["average"] for r in reports]),
            "paper_size": reports[0]["paper_size"], "paper": reports[0]["paper"]}


def long_context_summary(reports: list[dict]) -> dict:
    """Per length: the RULER and BABILong averages and every task's score (%), mean ± std over seeds."""
    first = reports[0]
    lengths = [str(n) for n in first["lengths"]]

    def over_seeds(values):
        return describe([v for v in values if v is not None])

    out = {"lengths": first["lengths"], "train_context": first["train_context"], "rope_scaling": first["rope_scaling"],
           "limit": first["limit"], "tasks": {}}
    for family in ("ruler", "babilong"):
        out[f"{family}_average"] = {n: over_seeds([r[f"{family}_average"].get(n) for r in reports]) for n in lengths}
        out[f"{family}_average_tasks"] = {n: first[f"{family}_average_tasks"].get(n, 0) for n in lengths}
    for task in first["tasks"]:
        out["tasks"][task] = {n: over_seeds([r["scores"][task].get(n, {}).get("score") for r in reports])
                              for n in lengths}
    return out


def eval_outputs_by_seed(study: Study, encoding: str, name: str) -> dict[int, dict]:
    """seed -> the finished evaluation `name` of that encoding's run (its first result where the file holds a list)."""
    found = {}
    for run in study.runs:
        if run.encoding == encoding and name in run.evals and run_finished(run) and eval_finished(run, name):
            output = read_json(os.path.join(run.run_dir, "eval", f"{name}.json"))
            output = output[0] if isinstance(output, list) and output else output
            if output:
                found[run.seed] = output
    return found


def extrapolation_comparison(study: Study, encoding: str) -> dict:
    """Per seed, then over seeds: the non-overlapping loss at L, and for each longer context kL the loss beyond L
    and its rise over the loss at L (does the loss grow past the training context?), and the paired difference of
    the loss beyond L to the reference encoding's."""
    def per_seed(results):
        out = {}
        for seed, r in results.items():
            train_context = r["train_context"]
            cells = {int(c) // train_context: cell["nonoverlapping"] for c, cell in r["contexts"].items()}
            if 1 in cells:
                out[seed] = {"at_L": cells[1]["mean"], "beyond": {k: c["mean_beyond_train_context"]
                                                                    for k, c in cells.items() if k > 1}}
        return out

    mine = per_seed(eval_outputs_by_seed(study, encoding, "extrapolation"))
    if not mine:
        return {}
    reference = per_seed(eval_outputs_by_seed(study, study.reference, "extrapolation"))
    factors = sorted({k for v in mine.values() for k in v["beyond"]})
    seeds = sorted(mine)
    return {"seeds": seeds, "at_L": mean_interval([mine[s]["at_L"] for s in seeds]),
            "rise": {str(k): mean_interval([mine[s]["beyond"][k] - mine[s]["at_L"] for s in seeds
                                            if mine[s]["beyond"].get(k) is not None]) for k in factors},
            "beyond_minus_reference": {str(k): paired_difference(
                {s: v["beyond"][k] for s, v in mine.items() if v["beyond"].get(k) is not None},
                {s: v["beyond"][k] for s, v in reference.items() if v["beyond"].get(k) is not None})
                for k in factors}}


def long_context_differences(study: Study, encoding: str) -> dict:
    """Per family and length, the paired difference of the average to the reference encoding's (same seed)."""
    def by_seed(name):
        return eval_outputs_by_seed(study, name, "long_context")

    mine, reference = by_seed(encoding), by_seed(study.reference)
    if not mine or not reference:
        return {}
    lengths = [str(n) for n in next(iter(mine.values()))["lengths"]]
    diffs = {}
    for family in ("ruler", "babilong"):
        def values(reports, n):
            return {seed: r[f"{family}_average"][n] for seed, r in reports.items()
                    if r.get(f"{family}_average", {}).get(n) is not None}
        diffs[family] = {n: paired_difference(values(mine, n), values(reference, n)) for n in lengths}
    return diffs


def retrieval_differences(study: Study, encoding: str) -> list[dict]:
    """Per gap bucket, the paired difference of the accuracy to the reference encoding's (same seed)."""
    mine = eval_outputs_by_seed(study, encoding, "retrieval")
    reference = eval_outputs_by_seed(study, study.reference, "retrieval")
    if not mine or not reference:
        return []
    buckets = len(next(iter(mine.values()))["buckets"])
    return [paired_difference({s: r["buckets"][i]["accuracy"] for s, r in mine.items()},
                              {s: r["buckets"][i]["accuracy"] for s, r in reference.items()}) for i in range(buckets)]


def count_parameters(model: dict) -> int:
    """A model's parameter count from its config alone (built on the meta device: no memory, no initialisation)."""
    import torch
    from model import GPT

    with torch.device("meta"):
        return GPT(GPTConfig(**model)).num_params()


def setup_summary(study: Study, first_outputs: dict) -> dict:
    """What every number was measured on: the model, the tokens per run, the evaluation sizes (from the first
    output of each evaluation), and whether the paper's row shown beside ours comes from a comparable model."""
    run = study.runs[0]  # the runs differ only in encoding and seed
    model = run.model
    params = {e: count_parameters(next(r.model for r in study.runs if r.encoding == e)) for e in study.encodings}
    setup = {"model": {key: model[key] for key in ("n_layer", "n_embd", "n_head", "head_dim", "block_size",
                                                   "vocab_size")},
             "parameters": params, "tokens_per_run": run.tokens, "iterations": run.final_iter,
             "sequences_per_iteration": run.tokens // (run.final_iter * model["block_size"])}
    zs, ex, lc = first_outputs.get("zero_shot"), first_outputs.get("extrapolation"), first_outputs.get("long_context")
    if lc:
        setup["long_context"] = {"lengths": lc["lengths"], "train_context": lc["train_context"],
                                 "tasks": lc["tasks"], "limit": lc["limit"], "rope_scaling": lc["rope_scaling"]}
    if zs:
        size = zs["paper_size"]
        setup["zero_shot_documents"] = {task: row["n"] for task, row in zs["tasks"].items()}
        setup["paper"] = {"size": size, "parameters": evaluation("zero_shot").PAPER_SIZES[size],
                          "tokens": evaluation("zero_shot").PAPER_TOKENS,
                          # within a factor 2 in size and 10 in tokens: the paper's numbers are a fair target
                          "comparable": min(params.values()) >= evaluation("zero_shot").PAPER_SIZES[size] / 2
                          and run.tokens >= evaluation("zero_shot").PAPER_TOKENS / 10}
    if ex:
        setup["extrapolation"] = {"val_tokens": ex["val_tokens"], "windows": {
            context: cell["nonoverlapping"]["windows"] for context, cell in ex["contexts"].items()}}
        if ex.get("documents"):
            setup["extrapolation"]["documents"] = ex["documents"]
        if "passkey" in ex:
            setup["passkey"] = {"lengths": ex["passkey"]["actual_lengths"], "depths": len(ex["passkey"]["depths"]),
                                "trials": ex["passkey"]["trials"]}
    rt, rc = first_outputs.get("retrieval"), first_outputs.get("reach")
    if rt:
        setup["retrieval"] = {"pairs": rt["pairs"], "sequences": rt["sequences"],
                              "queries": [b["queries"] for b in rt["buckets"]]}
    if rc:
        setup["reach"] = {"windows": rc["windows"], "factor": rc["factor"], "largest_distance": rc["largest_distance"]}
    return setup


def build_report(study: Study, statuses: dict) -> dict:
    rows = [run_row(run, statuses.get((run.encoding, run.seed), {})) for run in study.runs]
    final = {e: {r["seed"]: r["final_val_loss"] for r in rows if r["encoding"] == e and r["final_val_loss"] is not None}
             for e in study.encodings}
    encodings, first_outputs = {}, {}
    for encoding in study.encodings:
        finished = [run for run in study.runs if run.encoding == encoding and run_finished(run)]
        diff = None if encoding == study.reference else paired_difference(final[encoding], final[study.reference])
        entry = {"final_val_loss": describe([final[encoding][s] for s in sorted(final[encoding])]) |
                 {"seeds": sorted(final[encoding])}, "difference_to_reference": diff,
                 "verdict": verdict(encoding, study.reference, diff)}
        for name, summarize in (("extrapolation", extrapolation_summary), ("zero_shot", zero_shot_summary),
                                ("long_context", long_context_summary), ("retrieval", retrieval_summary),
                                ("reach", reach_summary)):
            outputs = [read_json(os.path.join(run.run_dir, "eval", f"{name}.json"))
                       for run in finished if name in run.evals and eval_finished(run, name)]
            outputs = [o[0] if isinstance(o, list) else o for o in outputs if o]
            if outputs:
                entry[name] = summarize(outputs) | {"seeds": [run.seed for run in finished if eval_finished(run, name)]}
                first_outputs.setdefault(name, outputs[0])
        if "long_context" in entry and encoding != study.reference:
            entry["long_context"]["difference_to_reference"] = long_context_differences(study, encoding)
        if "extrapolation" in entry:
            entry["extrapolation"]["by_seed"] = extrapolation_comparison(study, encoding)
        if "retrieval" in entry and encoding != study.reference:
            entry["retrieval"]["difference_to_reference"] = retrieval_differences(study, encoding)
        entry["diverged_seeds"] = [r["seed"] for r in rows if r["encoding"] == encoding and r["status"] == "diverged"]
        if entry["diverged_seeds"]:
            entry["verdict"] += (f" Diverged (no final loss, left out above): seed(s) "
                                 f"{', '.join(map(str, entry['diverged_seeds']))}.")
        encodings[encoding] = entry
    return {"study": study.name, "study_file": study.path, "base": study.base, "overrides": study.overrides,
            "seeds": study.seeds, "reference": study.reference, "launch": {"mode": study.mode, "gpus": study.gpus,
                                                                           "gpus_per_run": study.gpus_per_run},
            "rule": f"a difference to {study.reference} is a finding only when the two-sided {CONFIDENCE:.0%} "
                    f"Student-t interval of the mean per-seed paired difference, over at least "
                    f"{MIN_SEEDS_FOR_A_FINDING} seeds, excludes 0; otherwise it is not resolved at this budget",
            "setup": setup_summary(study, first_outputs), "runs": rows, "encodings": encodings}
