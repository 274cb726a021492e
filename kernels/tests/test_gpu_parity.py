"""Full-size token parity on the GPU: HiSparse (compiled kernels) vs the full KV on the device."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def compiled_ops() -> None:
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
        pytest.skip("needs a CUDA GPU of compute capability >= 9.0")
    from hisparse_kernels.ops import ensure_loaded

    ensure_loaded()


def test_token_parity_32_concurrent_256_steps() -> None:
    from hisparse_kernels.tiny_dsa import TinyDSA, TinyDSAConfig
    from hisparse_kernels.tiny_dsa.parity import parity_requests, run_parity

    config = TinyDSAConfig(index_topk=64, hot_slots=128, max_batch=32, num_blocks=4096, block_size=16)
    model = TinyDSA(config, seed=2026, device="cuda")
    requests = parity_requests(config, count=120, prompt_range=(300, 700), tokens_range=(40, 120), seed=5)
    report = run_parity(model, requests)
    out_dir = os.environ.get("HISPARSE_RESULTS_DIR")
    if out_dir:
        Path(out_dir, "parity.json").write_text(json.dumps(report.to_dict(), indent=1))
    print("parity:", report.to_dict())
    assert report.max_concurrency >= 32 and report.decode_steps >= 256
    assert report.max_context >= 4 * config.hot_slots and report.blocks_recycled > 0
    assert report.misses > 0 and report.hits > 0
    assert report.first_divergence is None, f"first divergence (request, step): {report.first_divergence}"


def test_parity_run_catches_a_missing_invalidation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same harness must see a divergence when recycled blocks are not invalidated."""
    from hisparse_kernels.tiny_dsa import TinyDSA, TinyDSAConfig, engine
    from hisparse_kernels.tiny_dsa.parity import parity_requests, run_parity

    config = TinyDSAConfig(index_topk=64, hot_slots=128, max_batch=16, num_blocks=1024, block_size=16)
    model = TinyDSA(config, seed=7, device="cuda")
    requests = parity_requests(config, count=48, prompt_range=(200, 400), tokens_range=(20, 60), seed=9)
    monkeypatch.setattr(engine.HiSparseKV, "assign_blocks", lambda self, ids: None)
    report = run_parity(model, requests)
    assert report.blocks_recycled > 0
    assert report.first_divergence is not None
