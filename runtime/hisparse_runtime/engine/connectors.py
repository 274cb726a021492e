"""The ``--kv-transfer-config`` and ``--attention-config`` JSON of each role, and the Mooncake file.

Shapes follow vLLM 0.33's ``KVTransferConfig`` / ``MultiConnector`` / ``HiSparseConnector`` and
``vllm.distributed.mooncake_store.MooncakeStoreConfig`` (tests round-trip them through those classes).
"""

from __future__ import annotations

from typing import Any, Final

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


def kv_transfer_config(s: RoleSettings) -> dict[str, Any] | None:
    """The role's ``--kv-transfer-config``, or ``None`` when it needs no connector.

    prefill: NIXL producer, under a MultiConnector beside the Mooncake store when that is on.
    decode:  MultiConnector[NIXL kv_consumer, HiSparseConnector{host_pool_gib}] for P/D HiSparse;
             HiSparseConnector alone without a prefill role; plain NIXL (llm-d's kv_both) without HiSparse.
    """
    if s.role == "prefill":
        producer = _connector(NIXL, "kv_producer")
        if not s.mooncake_on:
            return producer
        return _multi("kv_producer", [producer, _connector(MOONCAKE_STORE, "kv_both")])
    hisparse = (
        _connector(HISPARSE, "kv_both", {"host_pool_gib": s.hisparse.host_pool_gib}) if s.hisparse else None
    )
    if not s.disaggregated:
        return hisparse
    config = _connector(NIXL, "kv_both") if hisparse is None else _multi(
        "kv_consumer", [_connector(NIXL, "kv_consumer"), hisparse]
    )
    # Only decode pulls KV over NIXL, so only decode has a load-failure policy to set.
    config["kv_load_failure_policy"] = s.kv_transfer.nixl.kv_load_failure_policy
    return config


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
