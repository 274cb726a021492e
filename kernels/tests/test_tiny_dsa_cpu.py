"""Token parity of the tiny DSA model on CPU: HiSparse path (reference ops) vs the full KV."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from hisparse_kernels.tiny_dsa import TinyDSA, TinyDSAConfig, first_divergence  # noqa: E402
from hisparse_kernels.tiny_dsa import engine  # noqa: E402

SMALL = TinyDSAConfig(vocab_size=128, hidden_size=64, num_layers=5, num_heads=2, index_topk=8,
                      hot_slots=16, block_size=4, num_blocks=256, max_batch=3)


def _requests(seed: int, n: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(SMALL.vocab_size) for _ in range(rng.randrange(30, 60))], rng.randrange(10, 25))
            for _ in range(n)]


@pytest.fixture(scope="module")
def model() -> TinyDSA:
    return TinyDSA(SMALL, seed=1, device="cpu")


@pytest.fixture(scope="module")
def baseline(model: TinyDSA) -> engine.BatchResult:
    return model.generate_batch(_requests(0, 6), hisparse=False)


def test_hisparse_matches_full_kv_with_churn(model: TinyDSA, baseline: engine.BatchResult) -> None:
    got = model.generate_batch(_requests(0, 6), hisparse=True)
    assert first_divergence(baseline.tokens, got.tokens) is None
    # the run exercised what parity is about: contexts past H, eviction, recycling, concurrency
    assert baseline.max_concurrency == SMALL.max_batch
    assert baseline.blocks_recycled > 0 and got.misses > 0 and got.hits > 0
    assert all(len(t) == m for t, (_, m) in zip(got.tokens, _requests(0, 6)))


def test_parity_check_catches_a_missing_invalidation(model: TinyDSA, baseline: engine.BatchResult,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without invalidation, a recycled block is shadowed by a stale hot row: tokens must differ."""
    monkeypatch.setattr(engine.HiSparseKV, "assign_blocks", lambda self, ids: None)
    got = model.generate_batch(_requests(0, 6), hisparse=True)
    assert first_divergence(baseline.tokens, got.tokens) is not None


def test_generate_api(model: TinyDSA) -> None:
    prompt = list(range(40))
    a = model.generate(prompt, 12, hisparse=False)
    b = model.generate(prompt, 12, hisparse=True)
    assert a == b and len(a) == 12 and all(0 <= t < SMALL.vocab_size for t in a)
    with pytest.raises(ValueError):
        model.generate([SMALL.vocab_size], 2, hisparse=True)


def test_first_divergence() -> None:
    assert first_divergence([[1, 2], [3]], [[1, 2], [3]]) is None
    assert first_divergence([[1, 2], [3, 4]], [[1, 5], [3, 6]]) == (0, 1)
    assert first_divergence([[1], [3, 4]], [[1], [3]]) == (1, 1)
