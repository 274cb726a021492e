"""Versions the engine core renders for. One place: everything else imports these."""

from __future__ import annotations

VLLM_VERSION = "0.33.0"
"""The vLLM release whose flags, config classes and startup rules this package mirrors."""

VLLM_IMAGE_REPOSITORY = "vllm/vllm-openai"
"""Upstream OpenAI-server image the runtime image is built FROM (tag ``v{VLLM_VERSION}``)."""

RUNTIME_UID = 10001
"""UID (and GID) of the runtime image's non-root user (``runtime/Dockerfile``'s ``RUNTIME_UID``); serving pods
run as it, so they declare ``runAsNonRoot`` with the image's own identity."""

RUNTIME_HOME = "/home/hisparse"
"""That user's home: HF and vLLM caches (``HF_HOME``, ``VLLM_CACHE_ROOT``), Triton and compile caches live
under it, so a pod with a read-only root filesystem mounts an emptyDir here."""
