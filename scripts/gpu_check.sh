#!/usr/bin/env bash
# Everything that needs a GPU, in one call (about 6-8 minutes on an H100/H200):
#   1. correctness: the bf16 Triton GRAPE-AP kernel, the bf16 lifted columns through FlashAttention,
#      whole models in bf16 (auto vs dense, KV-cache decoding)       -> docs/gpu_check.md
#   2. one attention layer per encoding, bf16, T up to 8192, medium's head shape, plus a Triton tile
#      sweep                                                          -> docs/benchmarks_gpu.md (+ .png)
#   3. training tokens/s and MFU per encoding, medium config          -> docs/benchmarks_train_gpu.md
# Each stage has its own time limit so that a hang cannot eat the others; results are also copied to
# $OUT when that is set (the device runner's output folder). Usage: bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
python3 -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA'; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" || exit 2
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv || true
status=0
timeout 180 python3 scripts/gpu_check.py --out docs/gpu_check.md || status=1
timeout 200 python3 scripts/bench_attention.py --T 1024,2048,4096,8192 --repeats 5 --heads 8 --head_dim 128 \
    --n_embd 1024 --dense_max_T 4096 --sweep --out docs/benchmarks_gpu.md || status=1
timeout 200 python3 scripts/bench_train.py --config configs/base/medium.toml --steps 3 --rounds 2 --warmup 2 \
    --encodings rope,nope,grape_m,grape_m_ctx,alibi,grape_a_qk,fox,grape_ap,rope+kv_shift,rope+grape_ap \
    --out docs/benchmarks_train_gpu.md || status=1
if [ -n "${OUT:-}" ]; then
    cp docs/gpu_check.md docs/benchmarks_gpu.md docs/benchmarks_gpu.png docs/benchmarks_train_gpu.md "$OUT"/ 2>/dev/null || true
fi
exit $status
