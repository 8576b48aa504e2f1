#!/usr/bin/env bash
# The GPU study, sized to a lent H200's few minutes: rope, grape_ap and fox on the 124M-class model of
# configs/small_gpu.toml (12 layers, 12 heads of 64, width 768, context L = 1024, compiled, bf16), one seed,
# GPU_STUDY_ITERS iterations of 64 x 1024 tokens each (default 300: 19.7M tokens), on the embedded English corpus
# read as bytes (vocabulary 257; 2.7M training tokens, so about 7 passes: the GPU image has no tokenizer library
# and no internet). Then the loss by position at 1, 2 and 4 L (eval/extrapolation.py) and the same report as
# study.py writes (docs/results_gpu.md, between its markers, with the plots beside it).
#
# It stops itself in time: the study runs under `timeout -s INT` within GPU_STUDY_SECONDS (default 330); a run
# cut short saves its checkpoint, the report lists what finished, and the same command continues later.
# Needs only what the GPU image has (python3 with torch, triton, numpy, matplotlib) and data_cache/default-byte
# (python -m data.prepare --default --tokenizer byte, on any machine; carry it to the GPU machine).
#   bash scripts/gpu_study.sh                       # on the GPU, after scripts/gpu_check.sh
#   GPU_STUDY_DRY_RUN=1 bash scripts/gpu_study.sh   # on a CPU: a tiny model and 4 iterations, the whole pipeline
# Exit status: 0 all runs and evaluations finished, 1 some did not (cut short or failed), 2 nothing could run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
budget=${GPU_STUDY_SECONDS:-330}
iters=${GPU_STUDY_ITERS:-300}
out=runs/gpu_study
publish=docs/results_gpu.md
overrides="vocab_size = 257
data_dir = \"data_cache/default-byte\"
max_iters = $iters
warmup_iters = $((iters / 10))
eval_interval = $iters
ckpt_interval = $iters
eval_windows = 64"
if [ -n "${GPU_STUDY_DRY_RUN:-}" ]; then
    out=runs/gpu_study_dry_run
    publish=$out/results_gpu.md
    overrides="vocab_size = 257
data_dir = \"data_cache/default-byte\"
n_layer = 2
n_head = 2
n_embd = 64
head_dim = 32
block_size = 128
batch_size = 4
global_batch_size = 4
reference_layout = \"1x1\"
max_iters = 4
warmup_iters = 1
eval_interval = 4
ckpt_interval = 4
compile = false
device = \"cpu\""
fi
if [ ! -f data_cache/default-byte/manifest.json ]; then
    echo "gpu_study: data_cache/default-byte is missing; prepare it with python -m data.prepare --default --tokenizer byte" \
         "(any machine, offline) and bring it here" >&2
    exit 2
fi
mkdir -p "$out" "$(dirname "$publish")"
[ -f "$publish" ] || printf '# Results on one GPU: rope, grape_ap and fox on the 124M-class model\n\nWritten by `bash scripts/gpu_study.sh`.\n\n<!-- study report: begin (study.py --publish writes this part) -->\n<!-- study report: end -->\n' > "$publish"
study_file=$out/gpu_study.toml
cat > "$study_file" <<EOF
name = "gpu_study"
base = "$PWD/configs/small_gpu.toml"
encodings = ["rope", "grape_ap", "fox"]
seeds = [1]
out_dir = "$out"

[overrides]
$overrides

[eval.extrapolation]
factors = [1, 2, 4]
windows = 8
passkey_trials = 0
EOF
echo "gpu_study: $study_file, at most ${budget} s"
timeout -s INT -k 30 "$budget" python3 study.py "$study_file" --publish "$publish"
rc=$?
[ -n "${OUT:-}" ] && cp -rf "$publish" "$(dirname "$publish")"/results_gpu_*.png "$out/report.md" "$out/report.json" "$OUT"/ 2>/dev/null
case $rc in
    0) exit 0 ;;
    130|124) echo "gpu_study: stopped at the ${budget}-second limit; the report lists what finished" >&2; exit 1 ;;
    *) exit 1 ;;
esac
