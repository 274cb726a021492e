"""The small tiny-DSA configuration and request mix the CPU parity tests share."""

from __future__ import annotations

import random

from hisparse_kernels.tiny_dsa import TinyDSAConfig

SMALL = TinyDSAConfig(vocab_size=128, hidden_size=64, num_layers=5, num_heads=2, index_topk=8,
                      hot_slots=16, block_size=4, num_blocks=256, max_batch=3)
"""Contexts of 30-85 rows over 16 hot slots and 3 rows: eviction, block recycling and concurrency."""


def small_requests(seed: int = 0, n: int = 6) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(SMALL.vocab_size) for _ in range(rng.randrange(30, 60))], rng.randrange(10, 25))
            for _ in range(n)]
