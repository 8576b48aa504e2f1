"""Mutation check for developers (not CI): do the tests catch the bugs that matter?

    python tools/mutation_check.py                 # every break in BREAKS, a few minutes each on 2 cores
    python tools/mutation_check.py --only kv_shift # the breaks whose name contains "kv_shift"
    python tools/mutation_check.py --list

Each break is a realistic one-line bug (file, exact old text, new text) and the test files that should catch
it. The repository's tracked and untracked-but-not-ignored files are copied once to a scratch folder; each break
is applied there alone, its test files are run with pytest -x (with a timeout), and the file is restored. A break
is "caught" when pytest fails, "missed" when it passes. A break whose old text is no longer in the file is
reported as "stale" (update the list), never silently skipped. Prints one line per break and the catch rate.

Why not mutmut: it mutates operators at random and runs the whole suite per mutant (minutes each here); this
list names the bugs the README's claims depend on and gives each only its relevant tests.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, file, old, new, test files): old must occur exactly once in file.
BREAKS = [
    # rotation spectra
    ("rope_base_ignored", "model.py", "base=config.rope_base,", "base=10000.0,", ["tests/test_references.py"]),
    ("spectrum_exponent_halved", "positional.py", "* 2 / head_dim) * math.log(base)", "/ head_dim) * math.log(base)",
     ["tests/test_references.py"]),
    ("rotation_sign_flipped", "positional.py", "x1 * sin + x2 * cos", "-x1 * sin + x2 * cos",
     ["tests/test_positional.py"]),
    ("grape_ap_rotation_base_2", "positional.py", "angles = fp32(positions)[:, None].expand",
     "angles = 0.5 * fp32(positions)[:, None].expand",
     ["tests/test_positional.py", "tests/test_references.py", "tests/test_model.py"]),
    # norm order and gains
    ("qk_norm_after_rotation", "model.py", 'self.norm_after_rotation = config.qk_norm == "after"',
     "self.norm_after_rotation = True", ["tests/test_references.py"]),
    ("k_normed_with_q_gain", "model.py", "self.k_norm(k)", "self.q_norm(k)", ["tests/test_references.py"]),
    # KV-shift
    ("kv_shift_gates_swapped", "positional.py", "a * torch.cat((previous, t[:, :, :-1]), dim=2) + (1 - a) * t",
     "(1 - a) * torch.cat((previous, t[:, :, :-1]), dim=2) + a * t", ["tests/test_references.py"]),
    ("kv_shift_v_uses_k_gate", "positional.py", '("prev_v", v, a_v)', '("prev_v", v, a_k)',
     ["tests/test_references.py"]),
    ("kv_shift_state_not_carried", "positional.py", "state[name] = t[:, :, -1:]", "pass",
     ["tests/test_model.py"]),
    # additive biases
    ("alibi_slope_off_by_one", "positional.py", "2.0 ** (-8.0 * (h + 1) / n)", "2.0 ** (-8.0 * h / n)",
     ["tests/test_positional.py"]),
    ("fox_exclusive_cumsum", "positional.py", "c = previous[..., None] + torch.cumsum(log_f, dim=-1)",
     "c = previous[..., None] + torch.cumsum(log_f, dim=-1) - log_f", ["tests/test_positional.py"]),
    ("fox_gate_bias_init_ignored", "positional.py", "nn.init.constant_(self.gate.bias, bias_init)",
     "nn.init.zeros_(self.gate.bias)", ["tests/test_references.py"]),
    ("grape_a_omega_init_ignored", "positional.py", "inverse_softplus(omega_init)", "inverse_softplus(1.0)",
     ["tests/test_references.py"]),
    ("ctx_temperature_ignored", "model.py", "ctx_temperature=config.ctx_temperature,", "ctx_temperature=16.0,",
     ["tests/test_references.py"]),
    # sampling
    ("sample_next_ignores_temperature", "model.py", "    logits = logits / temperature\n", "",
     ["tests/test_references.py", "tests/test_eval_sample.py"]),
    ("sample_next_keeps_k_minus_1", "model.py", "logits.masked_fill(logits < kth",
     "logits.masked_fill(logits <= kth", ["tests/test_references.py", "tests/test_eval_sample.py"]),
    ("generate_greedy_only", "model.py", "sample_next(logits[:, -1].float(), temperature, top_k, generator)",
     "sample_next(logits[:, -1].float(), 0.0, top_k, generator)", ["tests/test_references.py", "tests/test_model.py"]),
    # training settings
    ("grad_clip_ignored", "training/step.py", "cfg.grad_clip if cfg.grad_clip > 0 else float(\"inf\")", "float(\"inf\")",
     ["tests/test_train_references.py"]),
    ("micro_batch_loss_summed", "training/step.py", "(loss * cfg.loss_scale / grad_accum).backward()",
     "(loss * cfg.loss_scale).backward()", ["tests/test_train_references.py"]),
    # the official recipe: the authors' gradient scale, sampler and spectrum
    ("official_gradient_is_the_mean", "config.py",
     'return self.reference_processes_and_micro_steps()[1] if self.grad_scale == "official" else 1', "return 1",
     ["tests/test_recipe_training.py"]),
    ("official_gradient_scale_from_this_runs_split", "training/step.py", "(loss * cfg.loss_scale / grad_accum).backward()",
     "(loss * grad_accum / grad_accum).backward()", ["tests/test_recipe_training.py"]),
    ("official_sampler_seeds_by_step_only", "data/loader.py",
     "fold_in_seed(self.seed, p, s * self.micro_steps + m)", "fold_in_seed(self.seed, p, s)",
     ["tests/test_recipe_training.py"]),
    ("official_sampler_rank_and_micro_batch_swapped", "data/loader.py", "m, p = divmod(mp, self.processes)",
     "p, m = divmod(mp, self.micro_steps)", ["tests/test_data_loader.py"]),
    ("official_ctx_spectrum_scaled", "config.py", 'return 1.0 if "grape_m_ctx" in', 'return 16.0 if "grape_m_ctx" in',
     ["tests/test_recipe_training.py"]),
    ("rope_theta_from_fp32_log", "positional.py",
     "log_theta = -(torch.arange(head_dim // 2, dtype=torch.float64) * 2",
     "log_theta = -(torch.arange(head_dim // 2, dtype=torch.float32) * 2", ["tests/test_positional.py"]),
    ("resume_ignores_gradient_scale", "training/checkpointing.py", '"lr_schedule", "grad_scale", "sampler", "reference_layout")',
     '"lr_schedule", "sampler", "reference_layout")', ["tests/test_recipe_training.py"]),
    ("ddp_sync_on_first_micro_batch", "training/step.py", "micro == grad_accum - 1 else", "micro == 0 else",
     ["tests/test_train_references.py"]),
    ("bf16_ignored_on_cpu", "train.py", "use_bf16 = cfg.dtype == \"bf16\" or", "use_bf16 = False and",
     ["tests/test_train_references.py"]),
    ("resume_ignores_model_config", "training/checkpointing.py", "if saved_model != model_cfg:", "if False:",
     ["tests/test_train_references.py"]),
    # divergence: the checks, the check before saving, the history across a resume
    ("divergence_spike_ignored", "training/divergence.py", "if loss > self.spike_factor * reference:", "if False:",
     ["tests/test_divergence.py", "tests/test_faults.py"]),
    ("divergence_uniform_level_ignored", "training/divergence.py", "and loss >= self.uniform - 0.01:",
     "and loss >= self.uniform + 1e9:", ["tests/test_divergence.py"]),
    ("divergence_weights_not_checked", "training/divergence.py", "if not math.isfinite(param_norm):", "if False:",
     ["tests/test_divergence.py", "tests/test_faults.py"]),
    ("checkpoint_saved_unchecked", "train.py", "    check(monitor, confirmation(raw_model,",
     "    (monitor, confirmation(raw_model,", ["tests/test_faults.py"]),
    ("divergence_history_not_resumed", "train.py", 'ckpt.get("divergence") if ckpt else None', "None",
     ["tests/test_faults.py"]),
    ("validation_ignores_a_stop", "training/step.py", "if stops is not None and stops.requested:", "if False:",
     ["tests/test_faults.py"]),
    ("time_left_from_the_first_interval", "training/metrics.py",
     "eta = elapsed / max(step - self.first_step, 1) * (end_step - step)",
     "eta = elapsed / max(step - self.step, 1) * (end_step - step)", ["tests/test_train.py"]),
    ("run_directory_keeps_stop_iter", "config.py", '"out_dir": run_dir, "stop_iter": 0}', '"out_dir": run_dir}',
     ["tests/test_train.py"]),
    ("second_ctrl_c_ignored", "training/stopping.py", "if signum == signal.SIGINT and self.requested:", "if False:",
     ["tests/test_stopping.py", "tests/test_train_references.py"]),
    ("second_ctrl_c_breaks_a_checkpoint_write", "training/stopping.py", "            if self.writing:",
     "            if False:", ["tests/test_stopping.py"]),
    ("flops_attention_term_halved", "model.py", "+ 12 * cfg.n_layer", "+ 6 * cfg.n_layer",
     ["tests/test_references.py"]),
    ("mfu_peak_h100_sxm_first", "training/metrics.py", 'GPU_PEAK_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12,',
     'GPU_PEAK_FLOPS = {"H100": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12,', ["tests/test_train_references.py"]),
    ("attention_sees_only_itself", "model.py", "y = y[..., :self.head_dim]", "y = v[..., :self.head_dim]",
     ["tests/test_train_references.py::test_loss_falls_below_what_the_current_token_alone_allows"]),
    # plots and evaluation reports
    ("plot_val_curve_from_train", "scripts/plot_runs.py", "tokens, losses = zip(*curve[\"val\"])",
     "tokens, losses = zip(*curve[\"train\"])", ["tests/test_plots.py"]),
    ("plot_unsmoothed", "scripts/plot_runs.py", "smooth(list(losses), args.smooth)", "list(losses)",
     ["tests/test_plots.py"]),
    ("extrapolation_targets_unshifted", "eval/extrapolation.py", "windows[:, :-1], windows[:, 1:], device",
     "windows[:, :-1], windows[:, :-1], device", ["tests/test_eval_extrapolation.py"]),
    ("paper_score_mistyped", "eval/paper_results.json", "[56.36, 30.38", "[65.36, 30.38",
     ["tests/test_eval_zero_shot.py::test_paper_results_are_consistent_and_name_a_config_per_row"]),
    ("extrapolation_plots_shortest_context", "eval/extrapolation.py", "longest = max(r[\"contexts\"], key=int)",
     "longest = min(r[\"contexts\"], key=int)", ["tests/test_plots.py"]),
    # GRAPE-AP kernels
    ("grape_ap_triton_path_gradient_as_suffix", "attention_kernels/grape_ap_triton.py", "    row_total = carry_ds  # E_i",
     "    row_total = carry_ds * 0.0  # E_i", ["tests/test_kernels.py::test_triton_fp16_path_gradients_as_accurate_as_attention_gradients"]),
    ("grape_ap_triton_passes_overwrite", "attention_kernels/grape_ap_triton.py", "ACCUMULATE=n_passes > 1, ", "ACCUMULATE=False, ",
     ["tests/test_kernels.py::test_triton_interpreter_matches_dense_reference"]),
    ("grape_ap_chunked_in_input_dtype", "attention_kernels/grape_ap.py",
     "    return torch.float64 if x.dtype == torch.float64 else torch.float32", "    return x.dtype",
     ["tests/test_kernels.py::test_chunked_under_bf16_autocast_computes_in_fp32"]),
    ("grape_ap_graph_break", "attention_kernels/grape_ap.py", "\ndef grape_ap_attention(",
     "\n@torch.compiler.disable\ndef grape_ap_attention(",
     ["tests/test_kernels.py::test_compiled_model_is_one_graph_and_equals_eager"]),
    ("grape_ap_in_tile_suffix_as_cumsum", "attention_kernels/grape_ap_triton.py", "    s = _split_dot(psi, gt, s, SPLIT)\n",
     "    s = s + tl.sum(psi, axis=1)[:, None] - tl.cumsum(psi, axis=1)\n",
     ["tests/test_kernels.py::test_triton_fp32_forward_accurate_on_large_path_logits"]),
    ("grape_ap_triangle_counts_the_key_itself", "attention_kernels/grape_ap_triton.py",
     "tri = tl.where(a[:, None] > a[None, :], 1.0, 0.0)", "tri = tl.where(a[:, None] >= a[None, :], 1.0, 0.0)",
     ["tests/test_kernels.py::test_triton_interpreter_matches_dense_reference"]),
    ("grape_ap_path_gradient_lo_part_dropped", "attention_kernels/grape_ap_triton.py",
     "        acc = tl.dot((x - hi.to(tl.float32)).to(y.dtype), y, acc)\n", "",
     ["tests/test_kernels.py::test_triton_interpreter_matches_dense_reference",
      "tests/test_kernels.py::test_triton_fp16_path_gradients_as_accurate_as_attention_gradients"]),
    ("grape_ap_key_tiles_ratio_ignored", "attention_kernels/grape_ap_triton.py",
     'query_sizes["RATIO"] = key_tiles[1] // query_tiles[1]', 'query_sizes["RATIO"] = 1',
     ["tests/test_kernels.py::test_triton_interpreter_matches_dense_reference"]),
    ("grape_ap_boundary_index_32_bit", "attention_kernels/grape_ap_triton.py", "return (bh.to(tl.int64) * n_key_tiles",
     "return (bh * n_key_tiles", ["tests/test_kernels.py::test_boundary_carry_index_is_64_bit"]),
    ("grape_ap_no_pass_for_no_queries", "attention_kernels/grape_ap_triton.py",
     "whole = max(1, triton.cdiv(Tq, block_m)) * block_m", "whole = triton.cdiv(Tq, block_m) * block_m",
     ["tests/test_kernels.py::test_triton_handles_no_queries_and_an_empty_batch"]),
    ("grape_ap_chunked_gradients_strided_like_views", "attention_kernels/grape_ap.py",
     "dq, dp = (torch.empty(x.shape, dtype=dtype, device=q.device) for x in (qg, pg))",
     "dq, dp = torch.empty_like(qg), torch.empty_like(pg)",
     ["tests/test_kernels.py::test_backward_op_passes_opcheck_on_views_of_a_batch_of_one",
      "tests/test_kernels.py::test_inductor_compiles_a_grape_ap_attention_layer"]),
    ("grape_ap_chunked_empty_view", "attention_kernels/grape_ap.py", "out.view(B, H, Tq, v.shape[3])", "out.view(B, H, Tq, -1)",
     ["tests/test_kernels.py::test_chunked_handles_no_queries_and_an_empty_batch"]),
    ("grape_ap_decode_bias_includes_own_edge", "attention_kernels/grape_ap.py",
     "bias = F.pad(suffix[..., 1:], (0, 1))", "bias = suffix",
     ["tests/test_kernels.py::test_decode_matches_the_full_forward_and_the_reference"]),
    ("triton_probe_failure_ignored", "attention_kernels/triton_probe.py", "            _BUILDS[key] = False\n",
     "            _BUILDS[key] = True\n", ["tests/test_kernels.py::test_auto_falls_back_with_one_warning_when_triton_cannot_build"]),
    # the in-tile separable-bias kernel
    ("separable_key_sum_gradient_sign", "attention_kernels/separable_triton.py", "            d_sum -= tl.sum(ds, axis=0)",
     "            d_sum += tl.sum(ds, axis=0)", ["tests/test_kernels_separable.py"]),
    ("separable_unmasked_diagonal_tiles", "attention_kernels/separable_triton.py",
     "tl.cdiv(tl.maximum(kb * BLOCK_N + BLOCK_N - 1 - offset, 0), BLOCK_M)",
     "tl.cdiv(tl.maximum(kb * BLOCK_N - offset, 0), BLOCK_M)", ["tests/test_kernels_separable.py"]),
    ("separable_rate_term_dropped_in_query_backward", "attention_kernels/separable_triton.py",
     "            d_rate -= tl.sum(ds * dist, axis=1)", "            d_rate -= 0.0 * tl.sum(ds * dist, axis=1)",
     ["tests/test_kernels_separable.py"]),
    ("tile_features_gate_without_omega", "positional.py", 'q_rate = omega * qf["lam"] if', 'q_rate = qf["lam"] if',
     ["tests/test_positional.py::test_tile_features_give_the_paper_bias"]),
    ("skew_exp_one_squaring_short", "positional.py", "        result = torch.where((steps > i)[..., None, None]",
     "        result = torch.where((steps > i + 1)[..., None, None]", ["tests/test_positional.py"]),
    # Hugging Face export and init_from
    ("hf_qwen3_q_norm_as_k_norm", "hf/qwen3.py", 'ours + "attn.q_norm.weight": theirs + "self_attn.q_norm.weight"',
     'ours + "attn.q_norm.weight": theirs + "self_attn.k_norm.weight"', ["tests/test_hf_export.py"]),
    ("hf_remote_buffers_not_loaded", "hf/templates/modeling_grape.py",
     "            module._non_persistent_buffers_set.clear()", "            pass", ["tests/test_hf_export.py"]),
    ("hf_cache_growth_drops_keys", "hf/templates/modeling_grape.py",
     "                    grown[:, :, :layer.length] = buffer[:, :, :layer.length]", "                    pass",
     ["tests/test_hf_export.py"]),
    ("hf_padding_ids_not_suppressed", "hf/export.py", '        config["suppress_tokens"] = list(range(n_vocab, vocab_size))',
     "        pass", ["tests/test_hf_export.py"]),
    ("hf_init_from_not_loaded", "train.py", "        raw_model.load_state_dict(init_state)", "        pass",
     ["tests/test_hf_init_from.py"]),
    # data at scale: preparation, recorded shard checks, the per-batch check, several nodes
    ("validation_split_not_cut", "data/assemble.py", '(("val", lo, min(hi, val_tokens, limit))',
     '(("val", lo, min(hi, limit))', ["tests/test_data_assemble.py"]),
    ("shard_record_ignores_ctime", "data/verify.py", "return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]",
     "return [stat.st_size, stat.st_mtime_ns]", ["tests/test_data_verify.py"]),
    ("first_read_not_shared_out", "data/verify.py", "for path in unread[rank::world_size]}",
     "for path in unread}", ["tests/test_data_verify.py"]),
    ("batch_check_skipped", "data/prefetch.py", "    if largest >= vocab_size:", "    if False:",
     ["tests/test_data_verify.py",
      "tests/test_faults.py::test_a_shard_damaged_after_its_check_is_caught_by_the_batch_check"]),
    ("batch_index_uses_local_rank", "training/step.py", "(step * grad_accum + micro) * ddp.world_size + ddp.rank)",
     "(step * grad_accum + micro) * ddp.world_size + ddp.local_rank)",
     ["tests/test_launch.py::test_two_nodes_train_exactly_as_one_and_resume_on_another_node_count"]),
]


def copy_repository(dest: str) -> None:
    files = subprocess.run(["git", "-C", REPO, "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = os.path.join(REPO, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)) or dest, exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def replace_once(text: str, old: str, new: str) -> str | None:
    return text.replace(old, new, 1) if text.count(old) == 1 else None


def run_break(scratch: str, name: str, rel: str, old: str, new: str, tests: list[str], timeout: float) -> str:
    path = os.path.join(scratch, rel)
    with open(path) as f:
        original = f.read()
    broken = replace_once(original, old, new)
    if broken is None:
        return "stale"
    with open(path, "w") as f:
        f.write(broken)
    try:
        result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                                cwd=scratch, capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        return "missed" if result.returncode == 0 else "caught"
    except subprocess.TimeoutExpired:
        return "caught (timeout)"
    finally:
        with open(path, "w") as f:
            f.write(original)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run only the breaks whose name contains this text")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per break (default 600)")
    parser.add_argument("--list", action="store_true", help="list the breaks and exit")
    parser.add_argument("--table", metavar="FILE", help="also write the results as a markdown table to FILE "
                                                        "(docs/testing.md quotes it)")
    args = parser.parse_args(argv)
    selected = [b for b in BREAKS if args.only in b[0]]
    if args.list:
        for name, rel, _, _, tests in selected:
            print(f"{name:40s} {rel:24s} {' '.join(tests)}")
        return 0
    if not selected:
        print(f"error: no break name contains {args.only!r}; see --list", file=sys.stderr)
        return 2
    results = {}
    with tempfile.TemporaryDirectory(prefix="mutation_check_") as scratch:
        copy_repository(scratch)
        for name, rel, old, new, tests in selected:
            start = time.perf_counter()
            results[name] = run_break(scratch, name, rel, old, new, tests, args.timeout)
            print(f"{results[name]:16s} {name:40s} {time.perf_counter() - start:6.1f} s", flush=True)
    caught = sum(r.startswith("caught") for r in results.values())
    stale = sum(r == "stale" for r in results.values())
    if args.table:
        rows = ["| break | file | caught by (test files run) | result |", "|---|---|---|---|"]
        for name, rel, _, _, tests in selected:
            files = ", ".join("`" + test.removeprefix("tests/") + "`" for test in tests)
            rows.append(f"| `{name}` | `{rel}` | {files} | {results[name]} |")
        with open(args.table, "w") as f:
            f.write("\n".join(rows) + "\n")
    print(f"caught {caught} of {len(results) - stale} breaks" + (f" ({stale} stale: update BREAKS)" if stale else ""))
    return 0 if caught == len(results) - stale and not stale else 1


if __name__ == "__main__":
    sys.exit(main())
