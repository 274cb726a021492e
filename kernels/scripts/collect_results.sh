#!/usr/bin/env bash
# Copy one GPU run's files ($OUT of gpu_all.sh) into kernels/results/, with machine-specific paths
# in the logs replaced by placeholders. Usage: bash kernels/scripts/collect_results.sh RUN_DIR
set -euo pipefail
src="$1"
dst="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/results"
mkdir -p "$dst"
for f in gpu_all.log gpu_tests.xml bench.json parity.json summary.json; do
  [ -f "$src/$f" ] || continue
  sed -E \
    -e 's#/[A-Za-z0-9_./-]*/\.venv#<venv>#g' -e 's#/[A-Za-z0-9_./-]*/gcc/bin#<gcc>/bin#g' -e 's#/usr/local/cuda#<cuda>#g' \
    -e 's#/usr/include/python3\.[0-9]+#<python-include>#g' -e 's#/tmp/#<tmp>/#g' \
    -e 's#/[A-Za-z0-9_./-]*/kernels/#kernels/#g' -e 's#[^ ]*/gpu_tests\.xml#$OUT/gpu_tests.xml#g' \
    -e 's#^rootdir: .*#rootdir: <repo>#' \
    "$src/$f" > "$dst/$f"
done
echo "copied into $dst"
