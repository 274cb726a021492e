"""kopf wiring: settings in one startup handler, thin event handlers (coroutines that update the watch-fed
caches and queue a :func:`reconcile` on the handler threads), and the validating admission webhook.
Node facts come from a watch of the operator's own (:mod:`.nodes`), not kopf's, since every replica needs
them and kopf runs handlers in the leader only.

No change-detection handlers (``on.create/update``): they keep progress in annotations, i.e. write on
every change. Watch events of the resource and of its children drive a reconcile that writes only what
differs; kopf's periodic re-list (``watching.server_timeout``) is the resync that catches anything missed,
and a reconcile that fails is retried for its object with exponential backoff (:mod:`.retry`).

Several replicas: kopf peering lets one handle events (see :func:`_start_priority`); all of them serve the
webhook with the certificate they share through a Secret (:mod:`.certs`, :mod:`.webhook`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from ..api import ClusterFacts, labels as L, validate
from ..render.parity import JudgeImage
from . import metrics
from .cache import ChildCache, NodeFactsCache, RenderCache
from .certs import CertSecret, CertSecretError, ExternalCertSecret, serving_hosts
from .kube import CHILD_KINDS, Kube
from .nodes import LIVE_READ_SECONDS, NodeWatch, list_node_facts
from .reconcile import reconcile
from .retry import Backoff, Retries
from .settings import OperatorEnv, SettingsError
from .workqueue import Key, ReconcileQueue
from .webhook import HANDLER_ID, OPERATIONS, Endpoint, Registration, WebhookError

log = logging.getLogger("hisparse.operator")
_kube: Kube | None = None
# Watch-fed caches and pure results, rebuilt on restart: no state of record (see .cache).
_nodes = NodeFactsCache()  # fed by _node_watch in every replica; admission and reconciles read it
_node_watch: NodeWatch | None = None
_children = ChildCache()
_deployments = ChildCache()
_renders = RenderCache()
_queue: ReconcileQueue | None = None  # reconciles, coalesced per deployment, on threads of their own
_retries = Retries()
_requeues: dict[tuple[str, str], asyncio.TimerHandle] = {}  # on the event loop only
_loop: asyncio.AbstractEventLoop | None = None
_cert_keeper: CertKeeper | None = None
_registration: Registration | None = None
_prometheus_url: str | None = None  # HISPARSE_PROMETHEUS_URL: canary analysis steps' default
_judge: JudgeImage | None = None  # HISPARSE_PARITY_IMAGE: the parity Jobs' pinned image
_upgrade_canaries = OperatorEnv.model_fields["upgrade_canaries"].default  # HISPARSE_UPGRADE_CANARIES


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
    return _nodes.snapshot()


@kopf.on.startup()
async def capture_loop(**_: Any) -> None:
    """Retries are timers on kopf's event loop (handlers run in threads and schedule onto it)."""
    global _loop
    _loop = asyncio.get_running_loop()


@kopf.on.startup()
def watch_nodes(**_: Any) -> None:
    """Every replica, leader or not, keeps node facts: each answers admission requests."""
    global _node_watch
    _node_watch = NodeWatch(k8s.CoreV1Api(kube().api_client), _nodes)
    _node_watch.start()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _retries
    try:
        env = OperatorEnv.from_env(os.environ)
    except SettingsError as e:
        raise kopf.PermanentError(str(e)) from None
    settings.persistence.finalizer = f"{L.GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = env.resync_seconds
    settings.watching.client_timeout = env.resync_seconds + 30
    settings.watching.reconnect_backoff = 1.0
    settings.networking.error_backoffs = [1, 2, 5, 10, 30]
    global _queue, _prometheus_url, _judge, _upgrade_canaries
    _queue = ReconcileQueue(_reconcile_logged, env.workers)
    _prometheus_url = env.prometheus_url
    _judge = env.judge_image()
    _upgrade_canaries = env.upgrade_canaries
    _retries = Retries(Backoff(env.retry_base_seconds, env.retry_max_seconds))
    settings.peering.standalone = not env.peering
    if env.peering:
        settings.peering.name = env.peering
        settings.peering.clusterwide = True
        settings.peering.mandatory = True
        settings.peering.lifetime = env.peering_lifetime
        settings.peering.priority = _start_priority()
    if env.webhook_port:
        settings.admission.server = _start_webhook(env)
    if env.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(env.metrics_port, addr=env.metrics_addr)


def _start_priority() -> int:
    """kopf peering runs only the replica with the highest priority and pauses *every* replica when two
    share one, so replicas must differ: the longest-running replica leads (a new pod of a rolling update
    waits), by minus its start time in microseconds."""
    return -(time.time_ns() // 1000)


def _start_webhook(env: OperatorEnv) -> kopf.WebhookServer:
    """Load (or make) the shared certificate, point the webhook configuration at it, and keep both
    current in the background; returns the server kopf runs."""
    namespace, port = env.own_namespace(), env.webhook_port
    assert port is not None
    if env.webhook_service:
        endpoint = Endpoint.for_service(namespace, env.webhook_service, port)
        hosts = serving_hosts(service=env.webhook_service, namespace=namespace)
        addr = env.webhook_addr  # None: every interface of the pod
    else:
        endpoint = Endpoint.for_url(env.webhook_host, port)
        hosts = serving_hosts(host=env.webhook_host)
        addr = env.webhook_addr or env.webhook_host
    certdir = env.webhook_cert_dir or Path(tempfile.mkdtemp(prefix="hisparse-webhook-"))
    core = k8s.CoreV1Api(kube().api_client)
    external = env.webhook_cert_source == "external"
    store: CertSecret | ExternalCertSecret = (
        ExternalCertSecret(core, namespace, env.webhook_secret) if external
        else CertSecret(core, namespace, env.webhook_secret, hosts, env.cert_policy(),
                        helm_release=env.webhook_secret_release))
    registration = Registration(kube(), endpoint, name=env.webhook_configuration, inject_ca=not external)
    try:
        serving = _refresh_certificate(store, registration, certdir)
    except (CertSecretError, WebhookError) as e:
        raise kopf.TemporaryError(str(e), delay=10) from e
    global _cert_keeper, _registration
    _registration = registration
    _cert_keeper = CertKeeper(store, registration, certdir, env.webhook_cert_check_seconds)
    _cert_keeper.start()
    # kopf re-reads the file every few seconds and restarts its server when it changed (a renewal).
    return kopf.WebhookServer(addr=addr, port=port, certfile=str(serving), pkeyfile=str(serving),
                              file_check_interval=5.0)


def _refresh_certificate(store: CertSecret | ExternalCertSecret, registration: Registration, certdir: Path) -> Path:
    cert = store.ensure()
    metrics.WEBHOOK_CERT_EXPIRY.set(cert.not_after().timestamp())
    path = cert.write_serving_file(certdir)
    registration.sync(cert.ca_bundle)
    return path


class CertKeeper(threading.Thread):
    """Every replica, leader or not (all serve the webhook): re-read the Secret, renew when due, load a
    certificate another replica renewed, and keep the configuration's caBundle equal to the Secret's."""

    def __init__(self, store: CertSecret | ExternalCertSecret, registration: Registration, certdir: Path, interval: float) -> None:
        super().__init__(name="webhook-cert-keeper", daemon=True)
        self.store, self.registration, self.certdir, self.interval = store, registration, certdir, interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                _refresh_certificate(self.store, self.registration, self.certdir)
            except Exception as exc:  # the next round retries; the current certificate keeps serving
                log.warning("webhook certificate refresh failed: %s", exc)


@kopf.on.cleanup()
async def stop_work(**_: Any) -> None:
    """On the event loop, not a handler thread: it must not wait behind work it is here to cancel."""
    if _queue is not None:
        dropped, running = _queue.stop()
        log.info("stopping: %d queued reconciles dropped (the next leader lists every deployment), "
                 "waiting for %d in flight: %s", dropped, len(running),
                 ", ".join(f"{ns}/{n}" for ns, n in sorted(running)) or "none")
    if _node_watch is not None:
        _node_watch.stop()
    if _cert_keeper is not None:
        _cert_keeper.stopped.set()
    if _registration is not None:
        try:
            await asyncio.to_thread(_registration.withdraw)  # URL mode (one local process) only
        except Exception as exc:
            log.warning("could not remove the webhook configuration: %s", exc)


@kopf.on.event(L.GROUP, L.VERSION, L.PLURAL)
async def on_deployment(event: dict[str, Any], body: dict[str, Any], name: str, namespace: str, **_: Any) -> None:
    if event.get("type") == "DELETED":
        _deployments.drop(L.KIND, namespace, name, (body.get("metadata") or {}).get("uid"))
        _renders.drop(namespace, name)
        metrics.forget(namespace, name)
        return
    _deployments.put(dict(body))  # the reconcile reads this copy instead of a GET
    _request(namespace, name)


async def _on_child(event: dict[str, Any], body: dict[str, Any], labels: dict[str, str], namespace: str, name: str,
                    **_: Any) -> None:
    if event.get("type") == "DELETED":
        _children.drop(body["kind"], namespace, name, (body.get("metadata") or {}).get("uid"))
    else:
        _children.put(dict(body))
    owner = labels.get(L.DEPLOYMENT)
    if owner:
        _request(namespace, owner)


for _api_version, _kind in CHILD_KINDS:
    _group, _, _version = _api_version.rpartition("/")
    kopf.on.event(group=_group or None, version=_version, kind=_kind,
                  labels={L.APP_MANAGED_BY: L.FIELD_MANAGER}, id=f"child-{_kind}")(_on_child)


def _request(namespace: str, name: str) -> None:
    """Queue a reconcile of one HiSparseDeployment (coalesced, see :mod:`.workqueue`)."""
    if _queue is not None:
        _queue.request((namespace, name))


def _reconcile_logged(key: Key) -> None:
    namespace, name = key
    try:
        out = reconcile(kube(), namespace, name, facts(), _children, deployments=_deployments, renders=_renders,
                        prometheus_url=_prometheus_url, judge=_judge, upgrade_canaries=_upgrade_canaries)
        _retries.succeeded(key)
        if out.requeue_after is not None:
            _schedule_requeue(key, out.requeue_after)
        if out.applied or out.pruned:
            log.info("%s/%s: applied %s, pruned %s", namespace, name, out.applied, out.pruned)
    except Exception as exc:
        delay, token = _retries.failed(key)
        log.error("%s/%s: reconcile failed (%d in a row), retrying in %.0fs: %s", namespace, name,
                  _retries.failures(key), delay, exc, exc_info=_retries.failures(key) == 1)
        _schedule_retry(key, delay, token)


def _schedule_retry(key: tuple[str, str], delay: float, token: int) -> None:
    loop = _loop
    if loop is None or loop.is_closed():
        return  # not started yet or shutting down: the next event or re-list reconciles

    def fire() -> None:
        if _retries.due(key, token):  # not superseded by a newer failure or a success
            metrics.RETRIES.inc()
            _request(*key)

    loop.call_soon_threadsafe(loop.call_later, delay, fire)


def _schedule_requeue(key: tuple[str, str], delay: float) -> None:
    """Reconcile ``key`` again after ``delay`` seconds (a canary step's pause, a parity deadline): nothing
    else would wake it. Extra wake-ups are harmless: a reconcile with nothing to do writes nothing."""
    loop = _loop
    if loop is None or loop.is_closed():
        return

    def arm() -> None:  # on the loop: one pending wake-up per resource, the latest one
        pending = _requeues.pop(key, None)
        if pending is not None:
            pending.cancel()
        _requeues[key] = loop.call_later(max(0.0, delay) + 0.5, fire)

    def fire() -> None:
        _requeues.pop(key, None)
        _request(*key)

    loop.call_soon_threadsafe(arm)


def _admission_facts() -> ClusterFacts | None:
    """The node watch's facts once it has listed every node. Before that (a replica's first seconds) one
    live read of the same kind, so no verdict rests on some of the nodes; a live read that fails or runs
    past :data:`~.nodes.LIVE_READ_SECONDS` refuses the request and says why, rather than admit a
    deployment unchecked against the nodes or leave the apiserver to time the webhook out."""
    watch = _node_watch
    if watch is not None and watch.synced.is_set():
        metrics.ADMISSION_NODE_FACTS.labels(source="cache").inc()
        return _nodes.snapshot()
    metrics.ADMISSION_NODE_FACTS.labels(source="live").inc()
    try:
        nodes, _ = list_node_facts(k8s.CoreV1Api(kube().api_client), timeout=LIVE_READ_SECONDS)
    except Exception as e:  # noqa: BLE001 (any failure leaves the same question unanswered)
        raise kopf.AdmissionError(
            f"cannot decide: the operator has not loaded the cluster's nodes yet and reading them failed "
            f"({type(e).__name__}: {e}); nothing was written, retry in a few seconds", code=503) from e
    return ClusterFacts(nodes=nodes) if nodes else None


def admit(body: dict[str, Any], **_: Any) -> None:
    manifest = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    _, errors = validate(dict(manifest), _admission_facts(), prometheus_url=_prometheus_url)
    if errors:
        for e in errors:
            metrics.WEBHOOK_REJECTIONS.labels(rule=e.rule).inc()
        raise kopf.AdmissionError("\n".join(str(e) for e in errors), code=422)


# kopf refuses to start with admission handlers and no webhook server: register the webhook only when
# it is served (HISPARSE_WEBHOOK_PORT); the reconciler's ConfigValid condition catches the rest.
if os.environ.get("HISPARSE_WEBHOOK_PORT"):
    kopf.on.validate(L.GROUP, L.VERSION, L.PLURAL, id=HANDLER_ID, operations=list(OPERATIONS))(admit)
