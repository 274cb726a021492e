"""Versions the engine core renders for. One place: everything else imports these."""

from __future__ import annotations

VLLM_VERSION = "0.33.0"
"""The vLLM release whose flags, config classes and startup rules this package mirrors."""

VLLM_IMAGE_REPOSITORY = "vllm/vllm-openai"
"""Upstream OpenAI-server image the runtime image is built FROM (tag ``v{VLLM_VERSION}``)."""
