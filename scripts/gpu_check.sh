#!/usr/bin/env bash
# Everything that needs a GPU, in one call with a hard time limit (default 420 s on an H200):
#   1. correctness (<= 60 s): the start-up numeric probe of each kernel family (bf16 and fp16, head dims 64 and
#      128: its error beside the tolerance that would send it to the portable path), the bf16 Triton kernels
#      (GRAPE-AP and the in-tile separable bias) against fp64 (values and all gradients, Tq < Tk, decode, T = 4096), the bf16 lifted columns through
#      FlashAttention, whole models in bf16 (auto / lifted vs dense, KV-cache decoding), both kernel families
#      with grouped-query keys and a sliding window                                 -> docs/gpu_check.md
#   1b. compile = true under FSDP (one process, NCCL, inductor's Triton): the compiled run's losses, gradient norms
#      and validation losses beside the eager run's, fp32 and bf16                -> docs/fsdp_compile_gpu.md
#   2. GRAPE-AP beside causal SDPA, plain attention built the same way (the separable Triton kernel without a
#      bias) and the stick-breaking kernel (when installed: see bench/bench_path_kernels.py), B1 and B4 at
#      T = 4096 and 8192: the measured GRAPE-AP / SDPA beside the static prediction of docs/kernel_resources.json
#                                                                             -> docs/benchmarks_path_gpu.md
#   3. one attention layer per encoding at T = 4096 and 8192 (medium's head shape, bf16; separable
#      biases in-tile and lifted), the GRAPE-AP kernel and FoX attention alone against causal SDPA, and a
#      profile of the grape_m_basis layer against RoPE's                         -> docs/benchmarks_gpu.md
#   3b. the kernels alone with batch 4 at T = 4096, 8192 and 16384 (GRAPE-AP; FoX in-tile and lifted)
#                                                                             -> docs/benchmarks_gpu_b4.md
#   4. training tokens/s, MFU and memory, medium config at T = 4096, torch.compile as train.py runs it
#                                                                             -> docs/benchmarks_train_gpu.md
#   5. long context: a 4-layer medium-width model at T = 16384 (attention dominates), compiled
#                                                                             -> docs/benchmarks_long_gpu.md
#   6. if time is left: FoX through FlexAttention, and the Triton tile sweeps at T = 8192
#                                                                             -> docs/benchmarks_gpu_extra.md
# Needs only what the GPU image has (python3 with torch, triton, numpy, matplotlib); installs nothing.
# Each stage runs under `timeout` within what is left of GPU_CHECK_SECONDS, so a hang cannot eat the
# others; the benchmarks rewrite their report after every T / encoding, so a cut-short stage keeps what
# it measured. After every stage the results and the full log are copied to $OUT when that is set (the
# device runner's output folder). Usage: bash scripts/gpu_check.sh   (or GPU_CHECK_SECONDS=420 bash ...)
# Exit status: 0 all stages passed, 1 a check failed or a stage was cut short, 2 no usable GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
budget=${GPU_CHECK_SECONDS:-420}
log=${OUT:-/tmp}/gpu_check.log
: >"$log"
status=0

save() {
    if [ -n "${OUT:-}" ]; then
        cp -f docs/gpu_check.md docs/benchmarks_gpu.md docs/benchmarks_gpu.json docs/benchmarks_gpu_b4.md docs/benchmarks_path_gpu.md \
            docs/benchmarks_train_gpu.md docs/benchmarks_long_gpu.md docs/benchmarks_gpu_extra.md docs/fsdp_compile_gpu.md \
            "$OUT"/ 2>/dev/null || true
    fi
}

stage() {  # stage NAME LIMIT_SECONDS COMMAND...: at most LIMIT and never past the overall budget
    local name=$1 limit=$2 left rc
    shift 2
    left=$((budget - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 30 ]; then
        echo "== $name: skipped, the ${budget} s budget is spent" | tee -a "$log"
        status=1
        return
    fi
    echo "== $name (limit ${limit} s, ${SECONDS} s elapsed)" | tee -a "$log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 124 ] && echo "== $name: cut short after ${limit} s" | tee -a "$log" \
                          || echo "== $name: exit status $rc" | tee -a "$log"
        status=1
    fi
    save
}

python3 - <<'PY' 2>&1 | tee -a "$log"
import sys
try:
    import torch, triton
except ImportError as error:
    sys.exit(f"gpu_check: {error.name} is not installed (the GPU image should have torch and triton); nothing run")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; nothing run")
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 2
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv 2>&1 | tee -a "$log" || true

optional_stage() {  # a stage whose absence (time ran out) or failure does not fail the run
    local before=$status
    stage "$@"
    status=$before
}

medium="--heads 8 --head_dim 128 --n_embd 1024 --dense_max_T 1 --repeats 5"
# stage limits add up to the 420 s budget less 20 s of start-up (correctness first, then compile under FSDP and
# the GRAPE-AP ratios): the optional
# last stage runs only on what earlier stages leave
stage correctness 55 python3 scripts/gpu_check.py --seconds 30 --out docs/gpu_check.md
stage fsdp-compile 100 python3 tools/fsdp_compile_check.py --seconds 45 --out docs/fsdp_compile_gpu.md
stage path-kernels 45 python3 bench/bench_path_kernels.py --T 4096,8192 --batch 1,4 --out docs/benchmarks_path_gpu.md
stage attention 40 python3 bench/bench_attention.py --T 4096,8192 $medium --profile grape_m_basis \
    --out docs/benchmarks_gpu.md
stage kernels-batch4 25 python3 bench/bench_attention.py --T 4096,8192,16384 --batch 4 --encodings grape_ap,fox \
    $medium --repeats 3 --out docs/benchmarks_gpu_b4.md
stage training 85 python3 bench/bench_train.py --config configs/base/medium.toml --steps 3 --rounds 2 --warmup 2 \
    --encodings rope,alibi,grape_a_qk,fox --out docs/benchmarks_train_gpu.md
stage long-context 50 python3 bench/bench_train.py --config configs/base/medium.toml --n_layer=4 --block_size=16384 \
    --batch_size=1 --steps 2 --rounds 2 --warmup 2 --encodings rope,fox,grape_a_qk,grape_ap --out docs/benchmarks_long_gpu.md
optional_stage extra 30 python3 bench/bench_attention.py --T 8192 --encodings grape_ap,fox $medium --repeats 3 \
    --flex --sweep --out docs/benchmarks_gpu_extra.md
# the numbers this script exists for, last, where the device runner's reply shows them
grep -h "GRAPE-AP / SDPA measured" "$log" | sed 's/^/   /' || true
echo "== done in ${SECONDS} s, status $status; log: $log" | tee -a "$log"
save
exit $status
