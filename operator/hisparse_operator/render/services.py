"""Headless Services publishing each role's NIXL side channel and link-check port."""

from __future__ import annotations

from typing import Any

from hisparse_runtime.engine import RoleSettings

from .. import names
from ..api import HiSparseDeployment
from .common import meta, obj, selector_labels


def nixl_service(d: HiSparseDeployment, s: RoleSettings) -> dict[str, Any]:
    nixl = s.kv_transfer.nixl
    spec: dict[str, Any] = {"clusterIP": "None"}
    # Decode's readiness probe and the parity Job resolve the prefill Service to prove the data path and
    # to force a prefiller: ready prefill pods only (the field left out: false, which the apiserver
    # stores as absent), so a loading, crash-looping or terminating prefill pod is never the one a decode
    # pod's readiness depends on. Decode's Service keeps publishing every pod (nothing resolves it to
    # decide readiness).
    if s.role != "prefill":
        spec["publishNotReadyAddresses"] = True
    spec["selector"] = selector_labels(d, s.role)
    spec["ports"] = [
        {"name": "nixl", "port": nixl.side_channel_port, "targetPort": "nixl", "protocol": "TCP"},
        {"name": "nixl-check", "port": nixl.link_check_port, "targetPort": "nixl-check", "protocol": "TCP"},
    ]
    return obj("v1", "Service", meta(d, names.nixl_service(d.name, s.role), s.role), spec=spec)
