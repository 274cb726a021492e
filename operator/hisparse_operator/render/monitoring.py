"""PodMonitors (Prometheus Operator) for the engines (vLLM + the hisparse plugin's metrics) and the EPP."""

from __future__ import annotations

from typing import Any, Final

from .. import names
from ..api import HiSparseDeployment
from .common import meta, obj, selector_labels

MONITORING_API: Final = "monitoring.coreos.com/v1"


def pod_monitor(d: HiSparseDeployment, component: str, port: str) -> dict[str, Any]:
    m = d.spec.monitoring
    return obj(MONITORING_API, "PodMonitor", meta(d, names.pod_monitor(d.name, component), component, extra_labels=m.labels), spec={
        "selector": {"matchLabels": selector_labels(d, component)},
        "podMetricsEndpoints": [{"port": port, "path": "/metrics", "interval": m.interval}],
    })


def monitoring_objects(d: HiSparseDeployment, roles: list[str]) -> list[dict[str, Any]]:
    if not d.spec.monitoring.enabled:
        return []
    out = [pod_monitor(d, role, "vllm") for role in roles]
    if d.spec.routing.enabled:
        out.append(pod_monitor(d, "epp", "metrics"))
    return out
