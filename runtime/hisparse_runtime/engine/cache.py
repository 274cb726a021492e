"""Engine options shared by both roles: context length, KV cache layout, memory, extra flags."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from ._base import Settings
from .kube import EnvVarName

KVCacheDType = Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_ds_mla"]

KV_ROW_BYTES: Final[dict[str, int]] = {"fp8_ds_mla": 656, "bfloat16": 1152, "auto": 1152}
"""Bytes of one MLA KV row: fp8_ds_mla = 512 fp8 NoPE + 16 scale + 128 bf16 RoPE; bf16 = 576 x 2."""


class EngineOptions(Settings):
    """vLLM options common to the prefill and decode engines."""

    max_model_len: int = Field(default=131072, ge=256, le=2_097_152)
    """Longest prompt + output in tokens (``--max-model-len``)."""

    kv_cache_dtype: KVCacheDType = "fp8_ds_mla"
    """KV cache storage type (``--kv-cache-dtype``). ``fp8_ds_mla`` is the 656-byte DSA MLA row."""

    block_size: Literal[16, 32, 64, 128, 256] = 64
    """Tokens per KV block (``--block-size``). Prefill and decode must agree (KV-compatibility hash)."""

    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=0.98)
    """Fraction of GPU memory vLLM may use (``--gpu-memory-utilization``)."""

    extra_args: list[str] = Field(default_factory=list, max_length=128)
    """Additional ``vllm serve`` arguments for both roles. Flags the toolkit renders from typed fields
    (parallel sizes, KV transfer, attention/compilation config, ...) are refused here."""

    extra_env: dict[EnvVarName, str] = Field(default_factory=dict, max_length=128)
    """Additional environment variables for both roles' vLLM containers. Variables the toolkit owns
    (NIXL side channel, Model Runner V2, Mooncake config path, ...) are refused here."""
