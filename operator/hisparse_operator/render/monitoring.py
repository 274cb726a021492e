"""PodMonitors (Prometheus Operator) for the engines (vLLM + the hisparse plugin's metrics), the EPP and the
Mooncake master (its ``--metrics_port``)."""

from __future__ import annotations

from typing import Any, Final

from .. import names
from ..api import HiSparseDeployment, labels as L
from .common import meta, obj, selector_labels
from .mooncake import COMPONENT as MOONCAKE_COMPONENT, needs_master

MONITORING_API: Final = "monitoring.coreos.com/v1"

SERIES_LABELS: Final = {"deployment": L.APP_INSTANCE, "role": L.ROLE, "revision": L.REVISION, "component": L.APP_COMPONENT}
"""Target label -> pod label: every scraped series says which deployment, role and revision it is from, and
which component (the EPP has no role: ``up{component="epp"}`` is HiSparseRouterDown's). ``deployment`` is the
HiSparseDeployment's name for every fleet (a candidate's pods select as ``<name>-<revision[:6]>``, but
belong to ``<name>``): a dashboard set to one deployment shows the candidate and the stable revision side by side,
told apart by ``revision``, and alerts name the resource a user can ``kubectl describe``."""


def _relabelings() -> list[dict[str, Any]]:
    out = [{"sourceLabels": [f"__meta_kubernetes_pod_label_{_prom_name(pod_label)}"], "targetLabel": target}
           for target, pod_label in SERIES_LABELS.items()]
    return out + [{"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod"}]


def _prom_name(label: str) -> str:
    """How Prometheus' Kubernetes discovery spells a label in ``__meta_*`` names (non-alphanumerics -> ``_``)."""
    return "".join(c if c.isalnum() else "_" for c in label)


def pod_monitor(d: HiSparseDeployment, component: str, port: str, *, authorization: dict[str, Any] | None = None) -> dict[str, Any]:
    m = d.spec.monitoring
    endpoint: dict[str, Any] = {"port": port, "path": "/metrics", "interval": m.interval, "relabelings": _relabelings()}
    if authorization:
        endpoint["authorization"] = authorization
    return obj(MONITORING_API, "PodMonitor", meta(d, names.pod_monitor(d.name, component), component, extra_labels=m.labels), spec={
        "selector": {"matchLabels": selector_labels(d, component)},
        "podMetricsEndpoints": [endpoint],
    })


def epp_authorization(d: HiSparseDeployment) -> dict[str, Any] | None:
    """The bearer token the EPP's authenticated ``/metrics`` asks for (``spec.monitoring.eppMetricsAuth``)."""
    auth = d.spec.monitoring.epp_metrics_auth
    if auth is None:
        return None
    return {"type": "Bearer", "credentials": {"name": auth.token_secret_name, "key": auth.token_secret_key}}


def monitoring_objects(d: HiSparseDeployment, roles: list[str]) -> list[dict[str, Any]]:
    if not d.spec.monitoring.enabled:
        return []
    out = [pod_monitor(d, role, "vllm") for role in roles]
    if d.spec.routing.enabled:
        out.append(pod_monitor(d, "epp", "metrics", authorization=epp_authorization(d)))
    if needs_master(d):
        out.append(pod_monitor(d, MOONCAKE_COMPONENT, "metrics"))
    return out
