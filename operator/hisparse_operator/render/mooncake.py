"""A Mooncake master for the prefill store, when the store is on and no external master is named."""

from __future__ import annotations

from typing import Any, Final

from hisparse_runtime.engine import MOONCAKE_MASTER_PORT, MOONCAKE_METADATA_PORT

from .. import names
from ..api import HiSparseDeployment, labels as L
from .common import RESTRICTED_CONTAINER, meta, obj, selector_labels, support_placement

COMPONENT: Final = "mooncake-master"
MASTER_METRICS_PORT: Final = 9003


def needs_master(d: HiSparseDeployment) -> bool:
    m = d.spec.kv_transfer.mooncake
    return d.spec.prefill is not None and m.enabled and not m.master_address


def mooncake_objects(d: HiSparseDeployment) -> list[dict[str, Any]]:
    if not needs_master(d):
        return []
    name = names.mooncake_master(d.name)
    deployment = obj("apps/v1", "Deployment", meta(d, name, COMPONENT), spec={
        # One master: it holds the store's metadata; a second would split the pool.
        "replicas": 1,
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": selector_labels(d, COMPONENT)},
        "template": {
            "metadata": {"labels": {**selector_labels(d, COMPONENT), L.APP_NAME: L.APP_NAME_VALUE, L.APP_INSTANCE: d.owner_name}},
            "spec": {
                "automountServiceAccountToken": False,
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True, "runAsUser": 1000},
                "containers": [{
                    "name": "master",
                    "image": d.spec.engine.image,
                    "imagePullPolicy": d.spec.engine.image_pull_policy,
                    "command": ["mooncake_master"],
                    "args": [
                        f"--rpc_port={MOONCAKE_MASTER_PORT}",
                        "--enable_http_metadata_server=true",
                        "--http_metadata_server_host=0.0.0.0",
                        f"--http_metadata_server_port={MOONCAKE_METADATA_PORT}",
                        f"--metrics_port={MASTER_METRICS_PORT}",
                    ],
                    "ports": [
                        {"name": "rpc", "containerPort": MOONCAKE_MASTER_PORT},
                        {"name": "metadata", "containerPort": MOONCAKE_METADATA_PORT},
                        {"name": "metrics", "containerPort": MASTER_METRICS_PORT},
                    ],
                    "readinessProbe": {"tcpSocket": {"port": "rpc"}, "periodSeconds": 5},
                    "livenessProbe": {"tcpSocket": {"port": "rpc"}, "periodSeconds": 10, "failureThreshold": 6},
                    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
                    "securityContext": RESTRICTED_CONTAINER,
                }],
                **support_placement(d),
            },
        },
    })
    service = obj("v1", "Service", meta(d, name, COMPONENT), spec={
        "selector": selector_labels(d, COMPONENT),
        "ports": [
            {"name": "rpc", "port": MOONCAKE_MASTER_PORT, "targetPort": "rpc", "protocol": "TCP"},
            {"name": "metadata", "port": MOONCAKE_METADATA_PORT, "targetPort": "metadata", "protocol": "TCP"},
            {"name": "metrics", "port": MASTER_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
        ],
    })
    return [deployment, service]
