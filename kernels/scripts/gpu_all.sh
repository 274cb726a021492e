#!/usr/bin/env bash
# Build, check and time everything in one GPU run. Logs and JSON go to $OUT (or kernels/results/run).
# Usage (from the repository root or kernels/): bash kernels/scripts/gpu_all.sh
set -u -o pipefail
KDIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$KDIR/results/run}"
mkdir -p "$OUT"
LOG="$OUT/gpu_all.log"
cd "$KDIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$KDIR${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/hisparse_torch_ext}" HISPARSE_FORCE_JIT=1
export HISPARSE_RESULTS_DIR="$OUT"
status=0
START=$(date +%s)
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
exec > >(tee "$LOG") 2>&1
step "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
nvcc --version | tail -2
python3 -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)"
python3 -m pytest --version

step "JIT build (sm_90)"
SECONDS=0
python3 -c "from hisparse_kernels.ops import ensure_loaded; ensure_loaded(verbose=False); print('built')" || status=1
echo "build seconds: $SECONDS"

step "GPU tests"
python3 -m pytest -v -p no:cacheprovider -rs tests -m gpu --junitxml="$OUT/gpu_tests.xml" 2>&1 | tail -60 || status=1

if [ "${HISPARSE_SANITIZE:-1}" = "1" ]; then
step "compute-sanitizer memcheck"
compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 python3 scripts/sanitize_cases.py \
  2>&1 | grep -vE "^========= (Program hit|    Saved host backtrace|        Host Frame)" | tail -25 || status=1
step "compute-sanitizer racecheck"
compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 python3 scripts/sanitize_cases.py \
  2>&1 | tail -25 || status=1
fi

step "benchmarks"
python3 benchmarks/bench_hot_buffer.py --out "$OUT/bench.json" || status=1

step "prefetch bytes in flight beside an HBM-bound kernel (benchmarks/prefetch_inflight.cu)"
nvcc -arch=sm_90 -O3 -std=c++17 benchmarks/prefetch_inflight.cu -o /tmp/hisparse_prefetch_inflight \
  && /tmp/hisparse_prefetch_inflight || status=1

step "resolve phases (clock64 per phase, benchmarks/resolve_phases.cu)"
nvcc -arch=sm_90 -O3 -Ihisparse_kernels/csrc benchmarks/resolve_phases.cu -o /tmp/hisparse_resolve_phases \
  && /tmp/hisparse_resolve_phases || status=1

if [ "${HISPARSE_NCU:-1}" = "1" ] && command -v ncu >/dev/null; then
  step "ncu: resolve, all hits (64 x 2048 x 4096)"
  ncu --clock-control none --kernel-name regex:hisparse_resolve --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__cycles_active.max,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_op_shared_atom.sum" \
    python3 benchmarks/profile_resolve.py \
    2>&1 | grep -vE "^==PROF==|^          |^    (OPT|INF)" || true
fi

step "summary"
python3 scripts/write_summary.py "$OUT" || status=1

if [ "${HISPARSE_AOT:-1}" = "1" ] && [ $(( $(date +%s) - START )) -lt "${HISPARSE_AOT_IF_UNDER_S:-420}" ]; then
  step "AOT build for sm_90 + sm_100 (setup.py build_ext, not installed)"
  SECONDS=0
  TORCH_CUDA_ARCH_LIST="9.0;10.0" timeout 300 python3 setup.py -q build_ext --build-temp /tmp/hisparse_aot_tmp \
    --build-lib /tmp/hisparse_aot_lib 2>&1 | grep -vE "^(copying|creating|running)" | tail -8 \
    && cuobjdump --list-elf /tmp/hisparse_aot_lib/hisparse_kernels/_C*.so | grep -oE 'sm_[0-9]+' | sort | uniq -c \
    || status=1
  echo "aot seconds: $SECONDS"
fi
echo; echo "gpu_all status: $status"
exit "$status"
