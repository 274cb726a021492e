"""Real servers for tests and demos: a completions endpoint that speaks vLLM's OpenAI API shape.

``completions_server`` serves ``POST /v1/completions`` (non-streaming, ``return_token_ids``) from any
greedy generator; ``tiny_dsa_backend`` plugs in the tiny DSA model from ``hisparse_kernels``;
``pd_proxy`` stands in for llm-d's routing sidecar (NIXL v2 protocol) in front of a decode engine.
"""

from __future__ import annotations

from hisparse_runtime.testing.completions_server import CompletionsServer, Generator

__all__ = ["CompletionsServer", "Generator"]
