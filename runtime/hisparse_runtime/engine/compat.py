"""KV-compatibility hash: prefill and decode pods pair only when their KV blocks are interchangeable.

Like vLLM's ``compute_hash``, the hash covers every field of the model and engine options *except* the
ones listed in ``IGNORED`` with a reason, so a field added later changes the hash by default.
"""

from __future__ import annotations

import hashlib
import json
from typing import Final

from .role import RoleSettings
from .versions import VLLM_VERSION

IGNORED: Final[dict[str, str]] = {
    "model.served_model_name": "a routing name; the weights and KV layout are the same",
    "model.trust_remote_code": "how the config is loaded, not what it says",
    "model.architecture": "a fact of the weights, which source and revision already pin",
    "model.size_gib": "sizes the cache, not what is loaded",
    "model.cache": "where the bytes of the pinned revision are kept, not which bytes",
    "model.credentials": "how the bytes are fetched, not which bytes",
    "model.endpoint": "which hub (or mirror) the bytes of the pinned revision come from, not which bytes",
    "engine.max_model_len": "a request limit; blocks written under one limit read the same under another",
    "engine.gpu_memory_utilization": "how many blocks exist, not their layout",
    "engine.extra_args": "free-form; must not change KV layout (owned flags are refused there)",
    "engine.extra_env": "free-form; must not change KV layout (owned variables are refused there)",
}

HASH_LENGTH: Final = 10


def _fields(section: str, data: dict) -> dict:
    return {k: v for k, v in data.items() if f"{section}.{k}" not in IGNORED}


def kv_compat_hash(s: RoleSettings) -> str:
    """Short stable hash of everything that decides whether KV written by one pod can be read by another.

    Equal for the prefill and decode roles of one deployment; different across images, model revisions,
    KV dtypes, block sizes, sparse settings, vLLM versions or transfer settings."""
    material = {
        "vllm": VLLM_VERSION,
        "image": s.image,
        "model": _fields("model", s.model.model_dump(mode="json")),
        "engine": _fields("engine", s.engine.model_dump(mode="json")),
        "transfer": {"connector": "NixlConnector", "ucx_tls": s.kv_transfer.nixl.ucx_tls},
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return digest[:HASH_LENGTH]
