"""KV transfer between roles: NIXL (prefill -> decode) and the optional Mooncake store on prefill."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from ._base import Settings

UcxTransport = Literal["cuda_ipc", "cuda_copy", "tcp", "rc", "rc_x", "ud", "ud_x", "dc", "dc_x", "ib", "sm", "self"]

MOONCAKE_MASTER_PORT: Final = 50051
MOONCAKE_METADATA_PORT: Final = 8080


class NixlSettings(Settings):
    """NIXL transfer of prefilled KV blocks from prefill to decode pods."""

    side_channel_port: int = Field(default=5600, ge=1024, le=65535)
    """Base NIXL handshake port (``VLLM_NIXL_SIDE_CHANNEL_PORT``). vLLM listens on base + global DP
    rank, so a pod uses ``[base + startRank, base + startRank + dataParallelSizeLocal)``."""

    link_check_port: int = Field(default=5590, ge=1024, le=65535)
    """Port on which the runtime publishes its own NIXL metadata for the prefill->decode link check
    (readiness probe and ``hisparse-runtime nixl-check``). Must not fall in a side-channel range."""

    ucx_tls: list[UcxTransport] = Field(default_factory=lambda: ["cuda_ipc", "cuda_copy", "tcp"], min_length=1, max_length=12)
    """UCX transports (``UCX_TLS``). Add ``rc``/``ib`` on InfiniBand or RoCE clusters."""

    kv_load_failure_policy: Literal["recompute", "fail"] = "fail"
    """What decode does when a KV pull fails: ``fail`` the request (default, makes broken links loud)
    or ``recompute`` the prefill locally."""


class MooncakeStoreSettings(Settings):
    """Mooncake distributed KV store on the prefill role (``MooncakeStoreConnector`` under a
    ``MultiConnector`` beside NIXL), so repeated prefixes are fetched instead of recomputed."""

    enabled: bool = False
    """Add the Mooncake store connector to prefill engines."""

    master_address: str | None = Field(default=None, max_length=253, pattern=r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$")
    """``HOST:PORT`` of an existing Mooncake master. Unset: the operator runs one for this deployment."""

    metadata_server: str | None = Field(default=None, max_length=512)
    """Transfer-engine metadata server URL (``http://HOST:PORT/metadata``) or ``P2PHANDSHAKE``.
    Unset: the HTTP metadata server of the operator-run master."""

    protocol: Literal["rdma", "tcp"] = "rdma"
    """Mooncake transfer protocol."""

    device_name: str = Field(default="", max_length=253)
    """RDMA devices for Mooncake (comma separated, e.g. ``mlx5_0,mlx5_1``); empty lets it choose."""

    global_segment_gib: float = Field(default=64.0, gt=0, le=4096)
    """Host memory each prefill pod contributes to the shared store, in GiB."""

    local_buffer_gib: float = Field(default=4.0, gt=0, le=256)
    """Client-side staging buffer per prefill pod, in GiB."""


class KVTransferSettings(Settings):
    """How KV moves between the roles."""

    nixl: NixlSettings = Field(default_factory=NixlSettings)
    """NIXL prefill -> decode transfer."""

    mooncake: MooncakeStoreSettings = Field(default_factory=MooncakeStoreSettings)
    """Optional Mooncake store on the prefill role."""
