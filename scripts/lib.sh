# Shared by the project's scripts: where the cached environment lives. Source it, do not run it.
# The test environment (vLLM 0.33.0 and its CUDA torch, NIXL, Mooncake, kopf, ...) is about 10 GB, so it
# is built once into a cache outside the repository, keyed by the lock file and the Python version.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HISPARSE_CACHE=${HISPARSE_CACHE:-$HOME/.cache/hisparse}
PYTHON=${PYTHON:-python3}
_pyver=$("$PYTHON" -c 'import sys; print("%d%d" % sys.version_info[:2])')
_lockhash=$(sha256sum "$ROOT/requirements/test.lock" | cut -c1-12)
VENV="$HISPARSE_CACHE/venv-py$_pyver-$_lockhash"
export HISPARSE_CACHE VENV ROOT
# vLLM's config classes need a device type on a machine without a GPU.
export VLLM_TARGET_DEVICE=${VLLM_TARGET_DEVICE:-cpu}
log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
