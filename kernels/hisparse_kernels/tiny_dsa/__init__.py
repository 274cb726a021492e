"""A tiny DSA model (MLA + lightning indexer + top-k sparse attention, index sharing) with seeded
random weights, decoding greedily either with the full KV on the device or through the HiSparse
path (pinned host pool + hot buffer + the hot-buffer ops). Runs on CUDA (compiled kernels) or CPU
(the NumPy reference behind the same ops).

API::

    from hisparse_kernels.tiny_dsa import TinyDSA, TinyDSAConfig

    model = TinyDSA(TinyDSAConfig(), seed=0, device=None)   # device None: cuda if available, else cpu
    tokens = model.generate([1, 2, 3], 16, hisparse=True)   # -> list[int], greedy, len == max_tokens
    result = model.generate_batch([(prompt, max_tokens), ...], hisparse=False, max_concurrency=32)
    result.tokens          # list[list[int]] in input order
    first_divergence(result_a.tokens, result_b.tokens)  # None, or (request, step)

``generate`` is deterministic for a given seed, config and device, and takes prompt token ids in
``[0, config.vocab_size)``; ``prompt length + max_tokens`` must fit ``num_blocks * block_size``.
The two paths of one model give identical tokens (that is what the parity tests check).
Each call builds its own KV caches (full KV on the device, or a pinned host pool of
``num_layers * num_blocks * block_size`` rows of ``kv_row_bytes``), so a server that calls
``generate`` per request should keep ``num_blocks`` small.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from hisparse_kernels.tiny_dsa.engine import BatchResult, run_batch
from hisparse_kernels.tiny_dsa.model import TinyDSAConfig, TinyDSAWeights

__all__ = ["BatchResult", "TinyDSA", "TinyDSAConfig", "first_divergence"]


class TinyDSA:
    """Seeded tiny DSA model with a greedy ``generate`` on either KV path."""

    def __init__(self, config: TinyDSAConfig | None = None, *, seed: int = 0,
                 device: str | torch.device | None = None) -> None:
        self.config = config or TinyDSAConfig()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.weights = TinyDSAWeights(self.config, seed, self.device)

    def generate(self, prompt_token_ids: list[int], max_tokens: int, *, hisparse: bool) -> list[int]:
        """Greedy tokens (``max_tokens`` of them) after ``prompt_token_ids``."""
        self._check_prompt(prompt_token_ids)
        return self.generate_batch([(prompt_token_ids, max_tokens)], hisparse=hisparse).tokens[0]

    def generate_batch(self, requests: Sequence[tuple[list[int], int]], *, hisparse: bool,
                       max_concurrency: int | None = None, vllm_ops: Any | None = None) -> BatchResult:
        """Decode many requests with continuous batching (rows and KV blocks are recycled). With
        ``vllm_ops`` the HiSparse path is vLLM's op sequence on that op set (``tiny_dsa.vllm_path``)."""
        for prompt, _ in requests:
            self._check_prompt(prompt)
        return run_batch(self.weights, requests, hisparse=hisparse, device=self.device,
                         max_concurrency=max_concurrency, vllm_ops=vllm_ops)

    def _check_prompt(self, prompt: list[int]) -> None:
        bad = [t for t in prompt if not 0 <= int(t) < self.config.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside [0, {self.config.vocab_size})")


def first_divergence(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> tuple[int, int] | None:
    """``(request, step)`` of the first token that differs (step order first), or None."""
    if len(a) != len(b):
        return (min(len(a), len(b)), 0)
    longest = max((max(len(x), len(y)) for x, y in zip(a, b)), default=0)
    for step in range(longest):
        for i, (x, y) in enumerate(zip(a, b)):
            if step < max(len(x), len(y)) and (step >= len(x) or step >= len(y) or x[step] != y[step]):
                return (i, step)
    return None
