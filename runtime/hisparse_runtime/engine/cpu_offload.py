"""vLLM's native CPU KV offload (``OffloadingConnector`` with the ``CPUOffloadingSpec``).

Prefill composes it with NIXL inside a ``MultiConnector`` (the asymmetric P/D topology: prefill keeps
recently computed KV in host memory for prefix reuse, decode keeps direct NIXL + HiSparse). The
toolkit renders the connector entry itself instead of ``--kv-offloading-size``: vLLM turns that flag
into a whole ``kv_transfer_config`` of its own (``kv_connector = OffloadingConnector``,
``kv_role = kv_both``), replacing the NIXL connector (``VllmConfig._post_init_kv_transfer_config``).
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from ._base import Settings

OFFLOADING: Final = "OffloadingConnector"
CPU_SPEC: Final = "CPUOffloadingSpec"
"""``spec_name`` of vLLM's CPU offloading spec (``vllm/v1/kv_offload/factory.py``; also its default)."""


class CpuOffloadSettings(Settings):
    """Host-memory KV offload of one role's engines through vLLM's ``OffloadingConnector``."""

    size_gib: float = Field(gt=0, le=4096)
    """Host memory for offloaded KV per DP rank, in GiB (``cpu_bytes_to_use`` of the connector, which
    vLLM splits over the rank's TP workers). A pod holds dataParallelSizeLocal of these, counted with
    the same headroom rule as the HiSparse host pool against the pod's memory request and its nodes."""

    eviction_policy: Literal["lru", "arc"] = "lru"
    """Which offloaded blocks go first when the buffer is full (``eviction_policy``: ``lru`` or ``arc``)."""

    @property
    def cpu_bytes_to_use(self) -> int:
        return int(self.size_gib * (1 << 30))
