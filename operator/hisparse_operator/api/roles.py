"""From a HiSparseDeployment to each role's engine settings, and from engine paths back to the spec."""

from __future__ import annotations

from typing import Final

from hisparse_runtime.engine import (
    EngineOptions,
    MOONCAKE_MASTER_PORT,
    MOONCAKE_METADATA_PORT,
    Role,
    RoleOptions,
    RoleSettings,
)
from hisparse_runtime.engine.constraints import PathPart, format_path

from .. import names
from .deployment import HiSparseDeployment
from .facts import pinned_architecture
from .kube import quantity_gib
from .spec import RoleSpec

DEPLOYMENT_LEVEL: Final[dict[str, str]] = {
    "model": "spec.model",
    "engine": "spec.engine",
    "kvTransfer": "spec.kvTransfer",
    "routedExperts": "spec.routedExperts",
}
"""Engine-settings sections that come from deployment-wide spec fields; everything else is per role."""

_ROLE_OPTION_FIELDS: Final = tuple(RoleOptions.model_fields)


def role_spec(d: HiSparseDeployment, role: Role) -> RoleSpec | None:
    return d.spec.prefill if role == "prefill" else d.spec.decode


def role_settings(d: HiSparseDeployment, role: Role) -> RoleSettings:
    """The engine settings of ``role`` (which must exist in the spec)."""
    spec = role_spec(d, role)
    if spec is None:
        raise ValueError(f"spec.{role} is not set")
    memory = spec.resources.requests.get("memory")
    mooncake = d.spec.kv_transfer.mooncake
    master = metadata = None
    if role == "prefill" and mooncake.enabled and not mooncake.master_address:
        host = names.service_host(names.mooncake_master(d.name), d.namespace)
        master = f"{host}:{MOONCAKE_MASTER_PORT}"
        metadata = mooncake.metadata_server or f"http://{host}:{MOONCAKE_METADATA_PORT}/metadata"
    disaggregated = d.spec.prefill is not None  # prefill replicas are at least 1 (PrefillSpec)
    peer = names.service_host(names.nixl_service(d.name, "prefill"), d.namespace) if role == "decode" and disaggregated else None
    return RoleSettings(
        role=role,
        **{f: getattr(spec, f) for f in _ROLE_OPTION_FIELDS},
        model=d.spec.model,
        # EngineSpec extends EngineOptions with pod-level fields; the engine sees only the options.
        engine=EngineOptions.model_validate(d.spec.engine.model_dump(include=set(EngineOptions.model_fields))),
        image=d.spec.engine.image,
        kv_transfer=d.spec.kv_transfer,
        disaggregated=disaggregated,
        peer_host=peer,
        routed_experts=d.spec.routed_experts.enabled,
        gpu_architecture=pinned_architecture(spec),
        memory_request_gib=quantity_gib(memory) if memory is not None else None,
        mooncake_master_address=master,
        mooncake_metadata_server=metadata,
        rdma_devices=spec.rdma.count if spec.rdma is not None else 0,
    )


def spec_path(role: Role, path: tuple[PathPart, ...]) -> str:
    """``("parallelism", "nodes")`` of the decode engine -> ``spec.decode.parallelism.nodes``."""
    head = path[0] if path else ""
    if isinstance(head, str) and head in DEPLOYMENT_LEVEL:
        return format_path((DEPLOYMENT_LEVEL[head], *path[1:]))
    return format_path((f"spec.{role}", *path))
