"""Headless Services publishing each role's NIXL side channel and link-check port."""

from __future__ import annotations

from typing import Any

from hisparse_runtime.engine import RoleSettings

from .. import names
from ..api import HiSparseDeployment
from .common import meta, obj, selector_labels


def nixl_service(d: HiSparseDeployment, s: RoleSettings) -> dict[str, Any]:
    nixl = s.kv_transfer.nixl
    return obj("v1", "Service", meta(d, names.nixl_service(d.name, s.role), s.role), spec={
        "clusterIP": "None",
        # Peers must find pods that are still loading: the handshake is how they become ready.
        "publishNotReadyAddresses": True,
        "selector": selector_labels(d, s.role),
        "ports": [
            {"name": "nixl", "port": nixl.side_channel_port, "targetPort": "nixl", "protocol": "TCP"},
            {"name": "nixl-check", "port": nixl.link_check_port, "targetPort": "nixl-check", "protocol": "TCP"},
        ],
    })
