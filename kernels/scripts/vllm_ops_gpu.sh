#!/usr/bin/env bash
# vLLM 0.33's HiSparse ops against ours on one GPU, in one run: build ours, the differentials (every op,
# fuzzed, bit for bit), compute-sanitizer over a bounded differential, the side-by-side benchmark and
# the tiny DSA model's tokens through vLLM's op sequence on both op sets. Logs and JSON go to $OUT.
# Usage (repository root): bash kernels/scripts/vllm_ops_gpu.sh <the wheel's _C_stable_libtorch.abi3.so>
set -u -o pipefail
SO="$1"
KDIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$KDIR/results/run}"
CASES="${HISPARSE_DIFF_CASES:-10000}"
mkdir -p "$OUT"
cd "$KDIR"
ROOT="$(cd "$KDIR/.." && pwd)"
export PYTHONUNBUFFERED=1 PYTHONPATH="$KDIR:$ROOT/runtime${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/hisparse_torch_ext}" HISPARSE_FORCE_JIT=1
export HISPARSE_RESULTS_DIR="$OUT" HISPARSE_VLLM_OPS_SO="$SO"
status=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
exec > >(tee "$OUT/vllm_ops_gpu.log") 2>&1
step "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"
sha256sum "$SO"

step "build ours (JIT, sm_90)"
SECONDS=0
python3 -c "from hisparse_kernels.ops import ensure_loaded; ensure_loaded(); print('built')" || status=1
echo "build seconds: $SECONDS"

step "differentials and benchmark"
python3 benchmarks/vllm_ops_diff.py "$SO" --ours --cases "$CASES" --ours-cases "$CASES" --compact-cases 3000 \
  --plan-cases "$CASES" --invalidate-cases "$CASES" --trace results/footprint/full_trace.npz \
  results/footprint/placement_trace.npz --out "$OUT" > "$OUT/vllm_ops_diff.log" 2>&1 || status=1
grep -vE '^ |^\{|^\}' "$OUT/vllm_ops_diff.log" | cut -c1-400 | tail -25

step "tokens through vLLM's op sequence, the swap under vLLM's names, and our own ops' GPU tests"
# The swap test imports the runtime (pydantic, prometheus_client): wheels in $HISPARSE_WHEELS if the
# machine lacks them.
python3 -c "import pydantic, prometheus_client" 2>/dev/null || \
  python3 -m pip install -q --no-index --find-links "${HISPARSE_WHEELS:-/nonexistent}" pydantic prometheus_client
(cd "$ROOT" && python3 -m pytest -q -p no:cacheprovider -rs kernels/tests/test_gpu_vllm_ops.py \
  runtime/tests/test_gpu_kernel_swap.py kernels/tests/test_gpu_ops.py --junitxml="$OUT/vllm_ops_gpu_tests.xml") \
  2>&1 | tail -15 || status=1

if [ "${HISPARSE_SANITIZE:-1}" = "1" ]; then
step "compute-sanitizer memcheck over a bounded differential"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 \
  python3 benchmarks/vllm_ops_diff.py "$SO" --ours --no-timing --cases 20 --ours-cases 200 --compact-cases 60 \
  --plan-cases 300 --invalidate-cases 300 --out /tmp > "$OUT/memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|plan_fuzz|invalidate_fuzz" "$OUT/memcheck.log" | cut -c1-300
step "compute-sanitizer racecheck"
compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 \
  python3 benchmarks/vllm_ops_diff.py "$SO" --ours --no-timing --cases 5 --ours-cases 40 --compact-cases 10 \
  --plan-cases 60 --invalidate-cases 60 --out /tmp > "$OUT/racecheck.log" 2>&1 || status=1
grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUT/racecheck.log"
fi
echo; echo "vllm_ops_gpu status: $status"
exit "$status"
