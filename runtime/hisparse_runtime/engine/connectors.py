"""The ``--kv-transfer-config`` and ``--attention-config`` JSON of each role, and the Mooncake file.

Shapes follow vLLM 0.33's ``KVTransferConfig`` / ``MultiConnector`` / ``HiSparseConnector`` and
``vllm.distributed.mooncake_store.MooncakeStoreConfig`` (tests round-trip them through those classes).
"""

from __future__ import annotations

from typing import Any, Final

from .cpu_offload import CPU_SPEC, OFFLOADING
from .role import RoleSettings

NIXL: Final = "NixlConnector"
HISPARSE: Final = "HiSparseConnector"
MOONCAKE_STORE: Final = "MooncakeStoreConnector"
MULTI: Final = "MultiConnector"

GIB: Final = 1024**3

ENGINE_CONFIG_DIR: Final = "/etc/hisparse/engine"
"""Where the engine ConfigMap is mounted in serving pods."""
MOONCAKE_CONFIG_FILE: Final = "mooncake.json"


def _connector(name: str, role: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"kv_connector": name, "kv_role": role}
    if extra:
        entry["kv_connector_extra_config"] = extra
    return entry


def _multi(role: str, children: list[dict[str, Any]]) -> dict[str, Any]:
    return _connector(MULTI, role, {"connectors": children})


def offload_connector(s: RoleSettings) -> dict[str, Any] | None:
    """The ``OffloadingConnector`` entry with vLLM's CPU spec, when the role offloads KV to host memory.
    ``kv_role`` is ``kv_both``, as vLLM sets it for its own native offload."""
    o = s.cpu_offload
    if o is None:
        return None
    return _connector(OFFLOADING, "kv_both", {
        "spec_name": CPU_SPEC, "cpu_bytes_to_use": o.cpu_bytes_to_use, "eviction_policy": o.eviction_policy,
    })


def _compose(role: str, children: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not children:
        return None
    return children[0] if len(children) == 1 else _multi(role, children)


def kv_transfer_config(s: RoleSettings) -> dict[str, Any] | None:
    """The role's ``--kv-transfer-config``, or ``None`` when it needs no connector.

    prefill: NIXL producer, under a MultiConnector beside the CPU offload and/or the Mooncake store.
    decode:  MultiConnector[NIXL kv_consumer, HiSparseConnector{host_pool_gib}] for P/D HiSparse;
             HiSparseConnector alone without a prefill role; plain NIXL (llm-d's kv_both) without
             HiSparse, beside the CPU offload when that is on; the CPU offload alone without either.
    """
    offload = offload_connector(s)
    if s.role == "prefill":
        children = [_connector(NIXL, "kv_producer")]
        # The local host tier before the remote store: MultiConnector loads from the first child
        # that has the prefix.
        children += [offload] if offload else []
        children += [_connector(MOONCAKE_STORE, "kv_both")] if s.mooncake_on else []
        return _compose("kv_producer", children)
    hisparse = (
        _connector(HISPARSE, "kv_both", {"host_pool_gib": s.hisparse.host_pool_gib}) if s.hisparse else None
    )
    local = [c for c in (hisparse, offload) if c is not None]
    if not s.disaggregated:
        return _compose("kv_both", local)
    if hisparse is not None:
        config = _multi("kv_consumer", [_connector(NIXL, "kv_consumer"), *local])
    else:
        config = _compose("kv_both", [_connector(NIXL, "kv_both"), *local])  # type: ignore[assignment]
    assert config is not None
    # Only decode pulls KV over NIXL, so only decode has a load-failure policy to set.
    config["kv_load_failure_policy"] = s.kv_transfer.nixl.kv_load_failure_policy
    return config


def connector_names(config: dict[str, Any] | None) -> list[str]:
    """Every connector of a ``kv_transfer_config``: itself, or a MultiConnector's children (as vLLM's
    ``KVTransferConfig.has_connector`` looks them up)."""
    if not config:
        return []
    if config.get("kv_connector") == MULTI:
        return [c.get("kv_connector") for c in config.get("kv_connector_extra_config", {}).get("connectors", [])]
    return [config.get("kv_connector")]  # type: ignore[list-item]


def attention_config(s: RoleSettings) -> dict[str, Any] | None:
    """``--attention-config`` carrying ``hisparse_config`` on HiSparse decode."""
    if not s.hisparse_on or s.hisparse is None:
        return None
    hisparse: dict[str, Any] = {"eager_host_mirror": s.hisparse.eager_host_mirror}
    if s.hisparse.device_buffer_size is not None:
        hisparse["device_buffer_size"] = s.hisparse.device_buffer_size
    return {"hisparse_config": hisparse}


def mooncake_config(s: RoleSettings) -> dict[str, Any] | None:
    """The JSON file ``MOONCAKE_CONFIG_PATH`` points at, for prefill pods with the store on."""
    if not s.mooncake_on:
        return None
    m = s.kv_transfer.mooncake
    return {
        "metadata_server": s.mooncake_metadata_server or m.metadata_server or "P2PHANDSHAKE",
        "master_server_address": s.mooncake_master_address or m.master_address or "",
        "protocol": m.protocol,
        "device_name": m.device_name,
        "mode": "embedded",
        "global_segment_size": int(m.global_segment_gib * GIB),
        "local_buffer_size": int(m.local_buffer_gib * GIB),
    }
