"""Full-size token parity run: HiSparse path vs full KV, many concurrent requests with churn."""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass

from hisparse_kernels.tiny_dsa import TinyDSA, TinyDSAConfig, first_divergence

__all__ = ["ParityReport", "parity_requests", "run_parity"]


@dataclass
class ParityReport:
    passed: bool
    first_divergence: tuple[int, int] | None
    requests: int
    decode_steps: int
    max_concurrency: int
    blocks_recycled: int
    tokens_compared: int
    hot_slots: int
    index_topk: int
    max_context: int
    hits: int
    misses: int
    seconds_full: float
    seconds_hisparse: float
    device: str

    def to_dict(self) -> dict:
        return asdict(self)


def parity_requests(config: TinyDSAConfig, *, count: int, prompt_range: tuple[int, int],
                    tokens_range: tuple[int, int], seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(config.vocab_size) for _ in range(rng.randint(*prompt_range))],
             rng.randint(*tokens_range)) for _ in range(count)]


def run_parity(model: TinyDSA, requests: list[tuple[list[int], int]], *,
               max_concurrency: int | None = None) -> ParityReport:
    t0 = time.perf_counter()
    full = model.generate_batch(requests, hisparse=False, max_concurrency=max_concurrency)
    t1 = time.perf_counter()
    hs = model.generate_batch(requests, hisparse=True, max_concurrency=max_concurrency)
    t2 = time.perf_counter()
    div = first_divergence(full.tokens, hs.tokens)
    return ParityReport(
        passed=div is None,
        first_divergence=div,
        requests=len(requests),
        decode_steps=full.decode_steps,
        max_concurrency=full.max_concurrency,
        blocks_recycled=full.blocks_recycled,
        tokens_compared=sum(len(t) for t in full.tokens),
        hot_slots=model.config.hot_slots,
        index_topk=model.config.index_topk,
        max_context=max(len(p) + m for p, m in requests),
        hits=hs.hits,
        misses=hs.misses,
        seconds_full=t1 - t0,
        seconds_hisparse=t2 - t1,
        device=str(model.device),
    )
