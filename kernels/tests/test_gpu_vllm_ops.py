"""Token parity on the GPU through vLLM 0.33's HiSparse op sequence: vLLM's compiled ops against ours.

The tiny DSA model decodes the same requests three ways: the full KV on the device, vLLM's op
sequence on the wheel's compiled ops (``_C_stable_libtorch.abi3.so``, path in
``HISPARSE_VLLM_OPS_SO``), and the same sequence on our ops under vLLM's schemas. All three must give
the same tokens, and the two op sets the same hit and miss counts.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def load_wheel_ops(path: str) -> None:
    """Load the wheel's ops into ``torch.ops._C_cache_ops`` (its CUDA runtime from torch's wheel)."""
    cudart = Path(torch.__file__).parent.parent / "nvidia" / "cu13" / "lib" / "libcudart.so.13"
    if cudart.exists():
        ctypes.CDLL(str(cudart), mode=ctypes.RTLD_GLOBAL)
    torch.ops.load_library(path)


@pytest.fixture(scope="module", autouse=True)
def both_op_sets() -> None:
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
        pytest.skip("needs a CUDA GPU of compute capability >= 9.0")
    so = os.environ.get("HISPARSE_VLLM_OPS_SO", "")
    assert so and Path(so).exists(), (
        "HISPARSE_VLLM_OPS_SO must name the vLLM 0.33.0 wheel's _C_stable_libtorch.abi3.so: this test "
        "compares our ops with vLLM's and has nothing to compare without it")
    load_wheel_ops(so)
    from hisparse_kernels.ops import ensure_loaded

    ensure_loaded()


def test_tokens_equal_on_vllms_ops_and_ours() -> None:
    from hisparse_kernels.tiny_dsa import TinyDSA, TinyDSAConfig, first_divergence
    from hisparse_kernels.tiny_dsa import vllm_path
    from hisparse_kernels.tiny_dsa.parity import parity_requests

    config = TinyDSAConfig(index_topk=64, hot_slots=128, max_batch=32, num_blocks=4096, block_size=16)
    model = TinyDSA(config, seed=2026, device="cuda")
    requests = parity_requests(config, count=120, prompt_range=(300, 700), tokens_range=(40, 120), seed=5)
    runs = {}
    for name, ops in (("full_kv", None), ("vllm_ops", vllm_path.wheel_ops()), ("our_ops", vllm_path.our_ops())):
        t0 = time.perf_counter()
        runs[name] = model.generate_batch(requests, hisparse=ops is not None, vllm_ops=ops)
        runs[name].seconds = round(time.perf_counter() - t0, 1)  # type: ignore[attr-defined]
    full, theirs, ours = runs["full_kv"], runs["vllm_ops"], runs["our_ops"]
    report = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "requests": len(requests), "decode_steps": full.decode_steps, "max_concurrency": full.max_concurrency,
        "blocks_recycled": full.blocks_recycled, "tokens_compared": sum(len(t) for t in full.tokens),
        "max_context": max(len(p) + m for p, m in requests),
        "first_divergence_vllm_vs_full": first_divergence(full.tokens, theirs.tokens),
        "first_divergence_ours_vs_vllm": first_divergence(theirs.tokens, ours.tokens),
        "hits_misses": {"vllm_ops": [theirs.hits, theirs.misses], "our_ops": [ours.hits, ours.misses]},
        "seconds": {name: r.seconds for name, r in runs.items()},  # type: ignore[attr-defined]
    }
    out_dir = os.environ.get("HISPARSE_RESULTS_DIR")
    if out_dir:
        Path(out_dir, "vllm_ops_tokens.json").write_text(json.dumps(report, indent=1))
    print("vllm_ops_tokens:", report)
    assert full.max_concurrency >= 32 and full.decode_steps >= 256 and full.blocks_recycled > 0
    assert theirs.misses > 0 and theirs.hits > 0
    assert report["first_divergence_vllm_vs_full"] is None
    assert report["first_divergence_ours_vs_vllm"] is None
    assert (ours.hits, ours.misses) == (theirs.hits, theirs.misses)
