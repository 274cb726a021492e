"""The tiny DSA model through vLLM 0.33's HiSparse op sequence, on CPU with the NumPy reference ops.

The same sequence runs on the GPU with vLLM's compiled ops and with ours (``test_gpu_vllm_ops.py``);
here it must give the full-KV tokens, and each negative control (an op that does nothing: no written
slot invalidated, no shared layer replayed, no miss copied) must change them.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hisparse_kernels.tiny_dsa import TinyDSA, engine, first_divergence, vllm_path  # noqa: E402
from tinysupport import small_requests  # noqa: E402


def _counting_ops() -> tuple[object, dict[str, int]]:
    calls: dict[str, int] = {}
    inner = vllm_path.reference_ops()

    def wrap(name: str):
        def call(*args):
            calls[name] = calls.get(name, 0) + 1
            return getattr(inner, name)(*args)
        return call

    names = ("hisparse_resolve_residency", "hisparse_gather_compact", "hisparse_gather_plan",
             "hisparse_invalidate_written_slots")
    return type("Ops", (), {n: staticmethod(wrap(n)) for n in names})(), calls


def test_vllm_op_sequence_gives_the_full_kv_tokens(model: TinyDSA, baseline: engine.BatchResult) -> None:
    ops, calls = _counting_ops()
    got = model.generate_batch(small_requests(), hisparse=True, vllm_ops=ops)
    assert first_divergence(baseline.tokens, got.tokens) is None
    assert baseline.blocks_recycled > 0 and got.misses > 0 and got.hits > 0
    # every op of the sequence ran (the model has one index-sharing group with shared layers)
    assert set(calls) == {"hisparse_resolve_residency", "hisparse_gather_compact", "hisparse_gather_plan",
                          "hisparse_invalidate_written_slots"}
    assert calls["hisparse_resolve_residency"] == calls["hisparse_gather_compact"] == 2 * got.decode_steps


@pytest.mark.parametrize("broken", ["invalidate_written_slots", "gather_plan", "gather_compact"])
def test_each_op_of_the_sequence_is_needed(model: TinyDSA, baseline: engine.BatchResult, broken: str) -> None:
    ops = vllm_path.reference_ops()
    setattr(ops, f"hisparse_{broken}", lambda *args: None)
    got = model.generate_batch(small_requests(), hisparse=True, vllm_ops=ops)
    assert first_divergence(baseline.tokens, got.tokens) is not None
