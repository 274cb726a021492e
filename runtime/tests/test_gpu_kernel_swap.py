"""The decode-kernel swap on the GPU: our kernels registered under vLLM's op names serve vLLM's calls.

``install("hisparse")`` in one process with the wheel's compiled ops loaded (path in
``HISPARSE_VLLM_OPS_SO``): ``verify`` proves a call through ``torch.ops._C_cache_ops`` reaches our
kernel; the tiny DSA model decoded through vLLM's op sequence *by vLLM's names* then runs on ours (every
op's call counter moves) and gives the full-KV tokens; ``install("vllm")`` gives vLLM's kernels back
(no more calls reach ours) and the tokens stay the same.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def wheel_ops() -> None:
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
        pytest.skip("needs a CUDA GPU of compute capability >= 9.0")
    so = os.environ.get("HISPARSE_VLLM_OPS_SO", "")
    assert so and Path(so).exists(), (
        "HISPARSE_VLLM_OPS_SO must name the vLLM 0.33.0 wheel's _C_stable_libtorch.abi3.so: the swap "
        "replaces vLLM's kernels and has nothing to replace without them")
    from hisparse_kernels.tiny_dsa.vllm_path import load_wheel_ops
    from hisparse_runtime.plugin import kernel_swap

    load_wheel_ops(so)

    if importlib.util.find_spec("vllm") is None:
        # No vLLM package on this machine: the .so is loaded by path above, so the module install()
        # imports to load vLLM's ops is already loaded in effect.
        sys.modules.setdefault(kernel_swap.VLLM_OPS_MODULE, types.ModuleType(kernel_swap.VLLM_OPS_MODULE))


def test_our_kernels_serve_vllms_names_and_give_the_tokens_back() -> None:
    from hisparse_kernels.ops.vllm_names import OURS_FOR_VLLM
    from hisparse_kernels.tiny_dsa import TinyDSA, TinyDSAConfig, first_divergence
    from hisparse_kernels.tiny_dsa import vllm_path
    from hisparse_kernels.tiny_dsa.parity import parity_requests
    from hisparse_runtime.plugin import kernel_swap

    config = TinyDSAConfig(index_topk=64, hot_slots=128, max_batch=32, num_blocks=2048, block_size=16)
    model = TinyDSA(config, seed=11, device="cuda")
    requests = parity_requests(config, count=48, prompt_range=(200, 500), tokens_range=(30, 80), seed=3)
    full = model.generate_batch(requests, hisparse=False)

    swap = kernel_swap.install("hisparse")
    evidence = kernel_swap.verify()
    before = kernel_swap.calls()
    swapped = model.generate_batch(requests, hisparse=True, vllm_ops=vllm_path.wheel_ops())
    during = kernel_swap.calls()

    back = kernel_swap.install("vllm")
    restored = model.generate_batch(requests, hisparse=True, vllm_ops=vllm_path.wheel_ops())
    after = kernel_swap.calls()

    moved = {op: during.get(op, 0) - before.get(op, 0) for op in swap.ops}
    report = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "swap": swap.active,
        "ops": list(swap.ops), "verify": evidence.output == evidence.expected,
        "calls_through_vllm_names_during_decode": moved,
        "calls_after_giving_vllms_kernels_back": {op: after.get(op, 0) - during.get(op, 0) for op in swap.ops},
        "decode_steps": full.decode_steps, "tokens_compared": sum(len(t) for t in full.tokens),
        "first_divergence_swapped_vs_full": first_divergence(full.tokens, swapped.tokens),
        "first_divergence_restored_vs_full": first_divergence(full.tokens, restored.tokens),
        "hits_misses": {"swapped": [swapped.hits, swapped.misses], "restored": [restored.hits, restored.misses]},
    }
    out_dir = os.environ.get("HISPARSE_RESULTS_DIR")
    if out_dir:
        Path(out_dir, "kernel_swap.json").write_text(json.dumps(report, indent=1))
    print("kernel_swap:", report)
    assert swap.active == "hisparse" and len(swap.ops) == len(OURS_FOR_VLLM)
    assert evidence.calls_after == evidence.calls_before + 1
    assert all(n > 0 for n in moved.values()), moved  # every vLLM name reached ours during decode
    assert back.active == "vllm" and after == during  # vLLM's kernels serve again: nothing reaches ours
    assert swapped.misses > 0 and swapped.hits > 0 and full.blocks_recycled > 0
    assert report["first_divergence_swapped_vs_full"] is None
    assert report["first_divergence_restored_vs_full"] is None
    assert (swapped.hits, swapped.misses) == (restored.hits, restored.misses)
