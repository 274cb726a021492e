"""Two operator replicas against the real apiserver, as the chart runs them (service mode, peering):

- the webhook certificate: both start at once with no Secret; one creates it, both serve it, and the
  webhook configuration's caBundle is the Secret's. Concurrent writers of the Secret (absent, or empty as
  the chart makes it) end with one winner that everybody uses.
- leading: exactly one replica reconciles, the other stays paused and writes nothing.
- the webhook: both replicas refuse bad input, with the shared certificate, directly and through the
  apiserver.
- a graceful stop: SIGTERM the leader with a backlog of queued reconciles; it drops them and exits inside
  a pod's grace period (not after running them all), and the other takes over and reconciles every one.
- failover: SIGKILL the leader; the other takes over and converges a change made after the kill.

There is no pod network here: the replicas listen on one loopback port (SO_REUSEPORT, as kopf binds it,
so the kernel spreads connections over both like a Service over two pods), and the webhook's Service is
an ExternalName Service for 127.0.0.1, which the apiserver resolves to that port.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import GRACE_SECONDS, OperatorProcess, apply_crds, eventually, exists, free_port, get_json
from hisparse_operator.api import labels as L
from hisparse_operator.controller import webhook
from hisparse_operator.controller.certs import CertPolicy, CertSecret, WebhookCert, serving_hosts
from hisparse_devcluster import Cluster
from kubernetes import client as k8s
from kubernetes import config as k8s_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "deepseek-v32-single-node.yaml"
INVALID = REPO / "examples" / "invalid" / "hot-buffer-below-topk.yaml"
CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"
PEERING_CRDS = REPO / "charts" / "hisparse" / "crds" / "kopf.dev_peerings.yaml"
SYSTEM = "hisparse-replicas"  # the operator's own namespace
SERVICE = "hisparse-webhook"
SECRET = "hisparse-replicas-webhook-cert"
PEERING = "hisparse-replicas"
LIFETIME_S = 8  # a killed leader's place is free after this long


class Replicas:
    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.port = free_port()
        self.cluster = cluster
        self.ops = [OperatorProcess(cluster, workdir, name=f"replica-{i}", env={
            "POD_ID": f"replica-{i}",  # kopf's peer identity
            "HISPARSE_NAMESPACE": SYSTEM, "HISPARSE_PEERING": PEERING, "HISPARSE_PEERING_LIFETIME": str(LIFETIME_S),
            "HISPARSE_WEBHOOK_PORT": str(self.port), "HISPARSE_WEBHOOK_ADDR": "127.0.0.1",
            "HISPARSE_WEBHOOK_SERVICE": SERVICE, "HISPARSE_WEBHOOK_SECRET": SECRET,
            "HISPARSE_WEBHOOK_CERT_DIR": str(workdir / f"certs-{i}"), "HISPARSE_WEBHOOK_CERT_CHECK_SECONDS": "2",
            "HISPARSE_WORKERS": "1",  # one reconcile at a time: a burst of deployments is a backlog
        }) for i in range(2)]

        self.baseline: dict[str, dict[str, float]] = {}

    def peers(self) -> dict[str, Any]:
        return get_json(self.cluster, "clusterkopfpeering", PEERING).get("status") or {}

    def settle(self) -> None:
        """Wait until both are recorded as peers, give the lower one a moment to pause, then take the
        counters from there (a replica may work for an instant before it first sees its peer)."""
        eventually(lambda: {op.name for op in self.ops} <= set(self.peers()), what="both replicas in the peering")
        time.sleep(3)
        self.baseline = {op.name: {m: op.metric(m) or 0 for m in ("hisparse_operator_reconciles_total",
                                                                   "hisparse_operator_api_writes_total")}
                         for op in self.ops}

    def delta(self, op: OperatorProcess, metric: str) -> float:
        return (op.metric(metric) or 0) - self.baseline[op.name][metric]

    def leader(self) -> OperatorProcess:
        active = [op for op in self.ops if self.delta(op, "hisparse_operator_reconciles_total") > 0]
        assert len(active) == 1, f"exactly one replica must reconcile: {[op.name for op in active]}"
        return active[0]

    def standby(self) -> OperatorProcess:
        leader = self.leader()
        return next(op for op in self.ops if op is not leader)


@pytest.fixture(scope="module")
def replicas(cluster: Cluster, gpu_nodes: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    cluster.add_gpu_nodes(5, prefix="replicas-gpu-")
    apply_crds(cluster, CRD, PEERING_CRDS,
               names=("hisparsedeployments.serving.hisparse.dev", "clusterkopfpeerings.kopf.dev"))
    cluster.kubectl("create", "namespace", SYSTEM)
    # What the chart installs, with the Service pointed at loopback and no Secret (the replicas race to make it).
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": SYSTEM},
         "spec": {"type": "ExternalName", "externalName": "127.0.0.1"}},
    ]))
    rep = Replicas(cluster, tmp_path_factory.mktemp("replicas"))
    endpoint = webhook.Endpoint.for_service(SYSTEM, SERVICE, rep.port)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(webhook.configuration(endpoint.client_config())))
    for op in rep.ops:  # both at once: the Secret race
        op.spawn()
    try:
        for op in rep.ops:
            op.wait_serving()
        rep.settle()
        yield rep
    finally:
        for op in rep.ops:
            op.stop()
        cluster.kubectl("delete", "validatingwebhookconfiguration", webhook.CONFIGURATION, "--ignore-not-found")
        cluster.kubectl("delete", "clusterkopfpeering", PEERING, "--ignore-not-found")
        cluster.kubectl("delete", "namespace", SYSTEM, "--wait=false")


def _secret(cluster: Cluster) -> WebhookCert:
    cert = WebhookCert.from_secret_data(get_json(cluster, "secret", SECRET, "-n", SYSTEM).get("data"))
    assert cert is not None
    return cert


def _ca_bundle_in_configuration(cluster: Cluster) -> bytes:
    hooks = get_json(cluster, "validatingwebhookconfiguration", webhook.CONFIGURATION)["webhooks"]
    return base64.b64decode(hooks[0]["clientConfig"].get("caBundle", ""))


def _manifest(namespace: str) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    return doc


def _apply(cluster: Cluster, doc: dict[str, Any], check: bool = True) -> Any:
    return cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=check)


def _refused_through_apiserver(cluster: Cluster, namespace: str) -> None:
    doc = yaml.safe_load(INVALID.read_text())
    doc["metadata"]["namespace"] = namespace
    res = _apply(cluster, doc, check=False)
    expected = re.search(r"^# expected-path: (.+)$", INVALID.read_text(), re.M).group(1).strip()  # type: ignore[union-attr]
    assert res.returncode != 0 and "denied the request" in res.stderr and expected in res.stderr, res.stderr


def test_replicas_share_one_certificate_from_one_secret(cluster: Cluster, replicas: Replicas) -> None:
    cert = _secret(cluster)
    eventually(lambda: _ca_bundle_in_configuration(cluster) == cert.ca_bundle, what="caBundle from the Secret", timeout=30)
    logs = [op.log() for op in replicas.ops]
    created = sum(len(re.findall(rf"Secret {SYSTEM}/{SECRET} created", log)) for log in logs)
    assert created == 1, "one replica creates the Secret, the other uses it"
    for i, _ in enumerate(replicas.ops):
        served = (replicas.ops[i].workdir / f"certs-{i}" / "serving.pem").read_bytes()
        assert served == cert.cert + cert.key, f"replica {i} serves a certificate that is not the Secret's"
    labels = get_json(cluster, "secret", SECRET, "-n", SYSTEM)["metadata"]["labels"]
    assert labels[L.APP_MANAGED_BY] == L.FIELD_MANAGER


@pytest.mark.parametrize("chart_made_it", [False, True], ids=["absent", "empty"])
def test_concurrent_writers_of_the_secret_end_with_one_certificate(cluster: Cluster, namespace: str,
                                                                   chart_made_it: bool) -> None:
    """Six writers at once, on an absent Secret (create: AlreadyExists) or the chart's empty one (update at
    the version read: Conflict): all come back with the same certificate, which is the stored one."""
    if chart_made_it:
        cluster.kubectl("create", "secret", "generic", "race", "-n", namespace)
    api = k8s.CoreV1Api(k8s_config.new_client_from_config(str(cluster.kubeconfig)))
    hosts = serving_hosts(service="race", namespace=namespace)
    results: list[WebhookCert | BaseException] = []
    barrier = threading.Barrier(6)

    def write() -> None:
        barrier.wait()
        try:
            results.append(CertSecret(api, namespace, "race", hosts, CertPolicy()).ensure())
        except BaseException as e:  # noqa: BLE001 (reported below)
            results.append(e)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    failed = [repr(r) for r in results if isinstance(r, BaseException)]
    assert not failed and len(results) == 6, failed
    stored = WebhookCert.from_secret_data(get_json(cluster, "secret", "race", "-n", namespace)["data"])
    assert stored is not None and all(r == stored for r in results), "every writer must come back with the stored certificate"


def test_exactly_one_replica_reconciles(cluster: Cluster, replicas: Replicas, namespace: str) -> None:
    _apply(cluster, _manifest(namespace))
    eventually(lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in
                           (get_json(cluster, "hsd", "dsv32", "-n", namespace).get("status") or {}).get("conditions", [])),
               what="dsv32 Ready", timeout=120)
    leader, standby = replicas.leader(), replicas.standby()
    assert replicas.delta(standby, "hisparse_operator_api_writes_total") == 0, "the paused replica wrote"
    # The leader is the replica that started first: kopf ranks peers by priority, ours is minus the start time.
    peers = replicas.peers()
    assert max(peers, key=lambda p: peers[p]["priority"]) == leader.name, peers
    assert f"{namespace}/dsv32: reconcile failed" not in leader.log()
    assert not re.search(r"\(409\)|Reason: Conflict", leader.log()), "a write conflicted"


def _review(doc: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "operation": "CREATE", "dryRun": False,
        "kind": {"group": L.GROUP, "version": L.VERSION, "kind": L.KIND},
        "resource": {"group": L.GROUP, "version": L.VERSION, "resource": L.PLURAL},
        "namespace": doc["metadata"]["namespace"], "name": doc["metadata"]["name"],
        "userInfo": {"username": "e2e"}, "object": doc}}).encode()


def _post_review(port: int, ca_bundle: bytes, body: bytes) -> dict[str, Any]:
    """One fresh TLS connection that verifies the server as the apiserver does (the Service's DNS name)."""
    ctx = ssl.create_default_context(cadata=ca_bundle.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=f"{SERVICE}.{SYSTEM}.svc") as tls:
        tls.sendall(b"POST " + webhook.PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return json.loads(payload)


def test_both_replicas_refuse_bad_input_with_the_shared_certificate(cluster: Cluster, replicas: Replicas,
                                                                     namespace: str) -> None:
    doc = yaml.safe_load(INVALID.read_text())
    doc["metadata"]["namespace"] = namespace
    ca_bundle = _ca_bundle_in_configuration(cluster)
    before = [op.metric("hisparse_operator_webhook_rejections_total") or 0 for op in replicas.ops]
    for _ in range(24):  # fresh connections: the kernel spreads them over both listeners
        response = _post_review(replicas.port, ca_bundle, _review(doc))["response"]
        assert response["allowed"] is False and "deviceBufferSize" in response["status"]["message"], response
    after = [op.metric("hisparse_operator_webhook_rejections_total") or 0 for op in replicas.ops]
    assert all(a > b for a, b in zip(after, before)), f"each replica must have refused some: {before} -> {after}"
    _refused_through_apiserver(cluster, namespace)


BACKLOG = 16


def test_sigterm_drops_the_backlog_exits_in_grace_and_the_other_reconciles_it(
    cluster: Cluster, replicas: Replicas, namespace: str,
) -> None:
    """The leader reconciles one deployment at a time (``HISPARSE_WORKERS=1``); SIGTERM it with most of a
    burst still queued. It must exit well inside a pod's grace period (Python's exit used to run the whole
    queue first: over a minute in CI), say what it dropped, and leave nothing undone: the other replica
    takes over and every deployment of the burst reaches its generation."""
    leader = replicas.leader()
    before = leader.metric("hisparse_operator_reconciles_total") or 0
    docs = []
    for i in range(BACKLOG):
        doc = _manifest(namespace)
        doc["metadata"]["name"] = f"burst-{i:02d}"
        docs.append(doc)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    eventually(lambda: (leader.metric("hisparse_operator_reconciles_total") or 0) > before,
               what="the leader's first reconcile of the burst", timeout=60)
    seen = len(leader.log())
    started = time.monotonic()
    leader.stop(signal.SIGTERM)  # fails unless it exits within GRACE_SECONDS
    took = time.monotonic() - started
    stopping = re.search(r"stopping: (\d+) queued reconciles dropped", leader.log()[seen:])
    assert stopping and int(stopping.group(1)) > 0, f"no backlog was dropped: nothing here was tested ({leader.log_path})"
    assert took < GRACE_SECONDS / 2, f"exit took {took:.1f}s after SIGTERM"

    standby = next(op for op in replicas.ops if op is not leader)

    def all_current() -> bool:
        items = get_json(cluster, "hsd", "-n", namespace)["items"]
        return len(items) == BACKLOG and all(
            (h.get("status") or {}).get("observedGeneration") == h["metadata"]["generation"] for h in items)

    eventually(all_current, what=f"every deployment of the burst reconciled by the other replica "
                                 f"(log: {standby.log_path})", timeout=180)
    assert "Resuming operations" in standby.log()
    # Back to two replicas for the tests that follow (the restarted one ranks below: it started later).
    leader.spawn()
    leader.wait_serving()
    replicas.settle()
    cluster.kubectl("delete", "hsd", "--all", "-n", namespace, "--wait=false")


def test_killing_the_leader_hands_over_to_the_other(cluster: Cluster, replicas: Replicas, namespace: str) -> None:
    _apply(cluster, _manifest(namespace))
    eventually(lambda: (get_json(cluster, "hsd", "dsv32", "-n", namespace).get("status") or {}).get("prefill", {}).get("ready") == "1/1",
               what="prefill 1/1", timeout=120)
    leader, standby = replicas.leader(), replicas.standby()
    seen = len(standby.log())
    leader.stop(signal.SIGKILL)
    doc = _manifest(namespace)
    doc["spec"]["prefill"]["replicas"] = 2
    _apply(cluster, doc)  # admitted by the survivor alone
    eventually(lambda: (get_json(cluster, "hsd", "dsv32", "-n", namespace).get("status") or {}).get("prefill", {}).get("ready") == "2/2",
               what=f"prefill 2/2 after the leader died (log: {standby.log_path})", timeout=LIFETIME_S + 90)
    assert "Resuming operations" in standby.log()[seen:]
    # (Reconciles of the earlier tests' objects may fail while their namespaces terminate; not this one's.)
    assert f"{namespace}/dsv32: reconcile failed" not in standby.log()[seen:]
    _refused_through_apiserver(cluster, namespace)
    assert exists(cluster, "secret", SECRET, "-n", SYSTEM)
