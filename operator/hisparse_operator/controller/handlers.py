"""kopf wiring: settings in one startup handler, thin event handlers that call :func:`reconcile`,
and the validating admission webhook.

No change-detection handlers (``on.create/update``): they keep progress in annotations, i.e. write on
every change. Watch events of the resource and of its children drive a reconcile that writes only what
differs; kopf's periodic re-list (``watching.server_timeout``) is the resync that catches anything missed.
"""

from __future__ import annotations

import logging
import os
import threading
import tempfile
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from ..api import ClusterFacts, NodeFacts, labels as L, validate
from . import metrics
from .certs import make_serving_cert
from .cache import ChildCache
from .kube import CHILD_KINDS, Kube
from .reconcile import reconcile

log = logging.getLogger("hisparse.operator")
_kube: Kube | None = None
_nodes: dict[str, NodeFacts] = {}  # watch-fed caches, rebuilt on restart: no state of record
_children = ChildCache()
# Coalescing: a burst of child events (a rollout touches ~20 objects) becomes one running reconcile
# plus at most one more, instead of one reconcile per event.
_guard = threading.Lock()
_running: set[tuple[str, str]] = set()
_dirty: set[tuple[str, str]] = set()


def kube() -> Kube:
    global _kube
    if _kube is None:
        try:
            k8s_config.load_incluster_config()
        except k8s_config.ConfigException:
            k8s_config.load_kube_config()
        _kube = Kube(k8s.ApiClient())
    return _kube


def facts() -> ClusterFacts | None:
    return ClusterFacts(nodes=list(_nodes.values())) if _nodes else None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{L.GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = int(os.environ.get("HISPARSE_RESYNC_SECONDS", "300"))
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.watching.reconnect_backoff = 1.0
    settings.networking.error_backoffs = [1, 2, 5, 10, 30]
    settings.execution.max_workers = int(os.environ.get("HISPARSE_WORKERS", "8"))
    peering = os.environ.get("HISPARSE_PEERING")
    settings.peering.standalone = not peering
    if peering:
        settings.peering.name = peering
        settings.peering.clusterwide = True
        settings.peering.mandatory = True
    port = os.environ.get("HISPARSE_WEBHOOK_PORT")
    if port:
        host = os.environ.get("HISPARSE_WEBHOOK_HOST", "127.0.0.1")
        certdir = Path(os.environ.get("HISPARSE_WEBHOOK_CERT_DIR") or tempfile.mkdtemp(prefix="hisparse-webhook-"))
        cert = make_serving_cert(certdir, [host])
        settings.admission.server = kopf.WebhookServer(
            addr=os.environ.get("HISPARSE_WEBHOOK_ADDR", host), port=int(port), host=host,
            certfile=str(cert.certfile), pkeyfile=str(cert.keyfile), cadata=cert.ca_pem,
        )
        settings.admission.managed = f"{L.PLURAL}.{L.GROUP}"
    metrics_port = os.environ.get("HISPARSE_METRICS_PORT")
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(int(metrics_port), addr=os.environ.get("HISPARSE_METRICS_ADDR", "0.0.0.0"))


@kopf.on.event(L.GROUP, L.VERSION, L.PLURAL)
def on_deployment(event: dict[str, Any], name: str, namespace: str, **_: Any) -> None:
    if event.get("type") == "DELETED":
        return
    _reconcile_logged(namespace, name)


def _on_child(event: dict[str, Any], body: dict[str, Any], labels: dict[str, str], namespace: str, name: str,
              **_: Any) -> None:
    if event.get("type") == "DELETED":
        _children.drop(body["kind"], namespace, name)
    else:
        _children.put(dict(body))
    owner = labels.get(L.DEPLOYMENT)
    if owner:
        _reconcile_logged(namespace, owner)


for _api_version, _kind in CHILD_KINDS:
    _group, _, _version = _api_version.rpartition("/")
    kopf.on.event(group=_group or None, version=_version, kind=_kind,
                  labels={L.APP_MANAGED_BY: L.FIELD_MANAGER}, id=f"child-{_kind}")(_on_child)


@kopf.on.event("", "v1", "nodes")
def on_node(event: dict[str, Any], body: dict[str, Any], name: str, **_: Any) -> None:
    if event.get("type") == "DELETED":
        _nodes.pop(name, None)
    else:
        _nodes[name] = NodeFacts.from_node(dict(body))


def _reconcile_logged(namespace: str, name: str) -> None:
    key = (namespace, name)
    with _guard:
        if key in _running:
            _dirty.add(key)  # the running reconcile will go round once more
            return
        _running.add(key)
    while True:
        with _guard:
            _dirty.discard(key)
        try:
            out = reconcile(kube(), namespace, name, facts(), _children)
            if out.applied or out.pruned:
                log.info("%s/%s: applied %s, pruned %s", namespace, name, out.applied, out.pruned)
        except Exception as exc:  # the next event or the periodic re-list retries
            log.exception("%s/%s: reconcile failed: %s", namespace, name, exc)
        with _guard:  # decide and release under one lock, so no event falls between the two
            if key not in _dirty:
                _running.discard(key)
                return


def admit(body: dict[str, Any], **_: Any) -> None:
    manifest = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    _, errors = validate(dict(manifest), facts())
    if errors:
        for e in errors:
            metrics.WEBHOOK_REJECTIONS.labels(rule=e.rule).inc()
        raise kopf.AdmissionError("\n".join(str(e) for e in errors), code=422)


# kopf refuses to start with admission handlers and no webhook server: register the webhook only when
# it is served (HISPARSE_WEBHOOK_PORT); the reconciler's ConfigValid condition catches the rest.
if os.environ.get("HISPARSE_WEBHOOK_PORT"):
    kopf.on.validate(L.GROUP, L.VERSION, L.PLURAL, id="validate", operations=["CREATE", "UPDATE"])(admit)
