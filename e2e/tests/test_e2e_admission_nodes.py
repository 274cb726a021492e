"""Admission reads node facts from the operator's own node watch, not a LIST per request.

The operator runs as `hisparse dev` runs it (its webhook on a loopback URL); each verdict is a real
`kubectl apply --dry-run=server` through the apiserver and the webhook. A deployment whose decode role
selects a pool of its own is refused while no node of the pool can hold it and admitted while one can;
the pool's one KWOK node is added, tainted, shrunk (allocatable memory) and deleted, and each change must
show in the verdicts. LISTs are counted twice: by the operator's own counters and by the apiserver's
``apiserver_request_total``.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import OperatorProcess, apply_crds, eventually, exists, free_port, service_account_kubeconfig
from hisparse_devcluster import Cluster, nodes
from hisparse_operator.controller.webhook import CONFIGURATION as WEBHOOK_CONFIGURATION

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"
POOL = "e2e.hisparse.dev/admission-pool"
NOT_FITTING = re.compile(r"only 0 of the (\d+) nodes the decode role can be scheduled on")


class Operator(OperatorProcess):
    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.webhook_port = free_port()
        super().__init__(cluster, workdir, env={"HISPARSE_WEBHOOK_PORT": str(self.webhook_port),
                                                "HISPARSE_WEBHOOK_CERT_DIR": str(workdir / "certs")})

    def start(self) -> None:
        self.spawn()
        self.wait_serving()
        eventually(lambda: exists(self.cluster, "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION),
                   what="the operator's webhook configuration", timeout=30)
        eventually(lambda: self.metric("hisparse_operator_node_lists_total", reason="start"),
                   what="the node watch's first list", timeout=30)


@pytest.fixture(scope="module")
def operator(cluster: Cluster, gpu_nodes: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    # gpu_nodes: GPU nodes outside every test's pool (with no GPU node at all, admission skips the fit check).
    apply_crds(cluster, CRD)
    op = Operator(cluster, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()
    eventually(lambda: not exists(cluster, "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION),
               what="the webhook configuration removed on stop", timeout=30)


def _manifest(namespace: str, pool: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "deepseek-v32-single-node.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["decode"]["nodeSelector"] = {POOL: pool}
    return doc


def _dry_run(cluster: Cluster, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)


def _verdict(cluster: Cluster, doc: dict[str, Any]) -> str:
    """``admitted``, or ``refused: N nodes`` (N: nodes of the pool the role could land on)."""
    res = _dry_run(cluster, doc)
    if res.returncode == 0:
        return "admitted"
    found = NOT_FITTING.search(res.stderr)
    assert found, res.stderr
    return f"refused: {found.group(1)} nodes"


def _apiserver_node_lists(cluster: Cluster) -> float:
    status, body = cluster.api_get("/metrics")
    assert status == 200, body
    return sum(float(m.group(1)) for m in re.finditer(
        r'^apiserver_request_total\{[^}]*resource="nodes"[^}]*verb="LIST"[^}]*\} (\S+)$', body, re.M))


def _add_pool_node(cluster: Cluster, pool: str) -> str:
    spec = nodes.GpuNodeSpec(labels={POOL: pool})
    return cluster.add_gpu_nodes(1, spec, prefix=f"adm-{pool}-")[0]


def test_node_changes_reach_verdicts_without_a_list_per_request(cluster: Cluster, operator: Operator,
                                                                 namespace: str) -> None:
    pool = uuid.uuid4().hex[:8]
    doc = _manifest(namespace, pool)
    lists_before = operator.metric("hisparse_operator_node_lists_total")
    apiserver_before = _apiserver_node_lists(cluster)
    requests = 0

    def verdict_is(want: str) -> bool:
        nonlocal requests
        requests += 1
        return _verdict(cluster, doc) == want

    assert verdict_is("refused: 0 nodes")
    node = _add_pool_node(cluster, pool)
    eventually(lambda: verdict_is("admitted"), what="admitted once the pool has a node", timeout=20)

    cluster.kubectl("taint", "node", node, "e2e.hisparse.dev/reserved=yes:NoSchedule")
    eventually(lambda: verdict_is("refused: 0 nodes"), what="refused once the node is tainted", timeout=20)
    cluster.kubectl("taint", "node", node, "e2e.hisparse.dev/reserved-")
    eventually(lambda: verdict_is("admitted"), what="admitted once the taint is gone", timeout=20)

    # Allocatable is status: what a kubelet reports (KWOK leaves it as written).
    cluster.kubectl("patch", "node", node, "--subresource=status", "--type=merge",
                    "-p", '{"status": {"allocatable": {"memory": "64Gi"}}}')
    eventually(lambda: verdict_is("refused: 1 nodes"), what="refused once the node is too small", timeout=20)

    cluster.kubectl("delete", "node", node)
    eventually(lambda: verdict_is("refused: 0 nodes"), what="refused once the node is gone", timeout=20)

    # Every client's node LISTs together (the controller-manager and scheduler list only when they start
    # or their watch expires): far fewer than the admission requests made.
    apiserver_lists = _apiserver_node_lists(cluster) - apiserver_before
    assert apiserver_lists < requests / 2, (apiserver_lists, requests)
    assert operator.metric("hisparse_operator_admission_node_facts_total", source="live") == 0
    assert operator.metric("hisparse_operator_admission_node_facts_total", source="cache") >= requests
    assert operator.metric("hisparse_operator_node_lists_total") == lists_before


def test_the_watch_lists_again_after_410_gone(cluster: Cluster, operator: Operator, namespace: str) -> None:
    """An apiserver restart starts its watch cache at the current version: a watch resumed from an older one
    is answered 410 Gone and the operator lists again; node changes after that reach verdicts as before."""
    pool = uuid.uuid4().hex[:8]
    doc = _manifest(namespace, pool)
    assert _verdict(cluster, doc) == "refused: 0 nodes"
    expired = operator.metric("hisparse_operator_node_lists_total", reason="expired")
    # A write after the watch's last event, so the version it resumes from is older than the restarted
    # apiserver's cache.
    cluster.kubectl("create", "configmap", f"bump-{pool}", "-n", namespace)
    cluster.restart_apiserver()
    _add_pool_node(cluster, pool)
    eventually(lambda: operator.metric("hisparse_operator_node_lists_total", reason="expired") == expired + 1,
               what="a list after 410 Gone", timeout=60)
    eventually(lambda: _verdict(cluster, doc) == "admitted", what="the new node admitted after the re-list", timeout=20)
    assert operator.metric("hisparse_operator_admission_node_facts_total", source="live") == 0


def test_before_the_watch_has_synced_admission_reads_live_or_says_why_it_cannot(
        cluster: Cluster, gpu_nodes: list[str], namespace: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The webhook's own function in this process, with no node watch (a replica's first seconds): it reads
    every node once, with the same verdicts; with the apiserver unreachable it refuses and says why."""
    import kopf
    from hisparse_operator.controller import handlers
    from hisparse_operator.controller.kube import Kube
    from kubernetes import config as k8s_config

    pool = uuid.uuid4().hex[:8]
    doc = _manifest(namespace, pool)
    monkeypatch.setattr(handlers, "_node_watch", None)
    monkeypatch.setattr(handlers, "_kube", Kube(cluster.client()))
    with pytest.raises(kopf.AdmissionError, match=NOT_FITTING.pattern):
        handlers.admit(doc)
    _add_pool_node(cluster, pool)
    handlers.admit(doc)

    # An operator whose account may not list nodes (an RBAC mistake): the read fails, and the refusal says why.
    cluster.kubectl("create", "serviceaccount", "no-nodes", "-n", namespace)
    kubeconfig = service_account_kubeconfig(cluster, tmp_path / "kubeconfig", "no-nodes", namespace)
    monkeypatch.setattr(handlers, "_kube", Kube(k8s_config.new_client_from_config(config_file=str(kubeconfig))))
    with pytest.raises(kopf.AdmissionError, match="cannot decide: the operator has not loaded the cluster's nodes") as e:
        handlers.admit(doc)
    assert e.value.code == 503 and "Forbidden" in str(e.value)


def test_stop_wakes_a_watch_blocked_on_a_quiet_cluster_at_once(cluster: Cluster, gpu_nodes: list[str]) -> None:
    """The watch thread spends its life blocked in a read that only the next event or bookmark ends (a
    minute apart on a quiet cluster). ``stop`` must neither wait for that read (it runs on kopf's event
    loop at exit: closing the response did, 45 s in a measured stop) nor leave the thread reading."""
    from hisparse_operator.controller.cache import NodeFactsCache
    from hisparse_operator.controller.nodes import NodeWatch
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    watch = NodeWatch(k8s.CoreV1Api(k8s_config.new_client_from_config(str(cluster.kubeconfig))), NodeFactsCache())
    watch.start()
    assert watch.synced.wait(30), "the first list"
    eventually(lambda: watch._response is not None, what="the watch open", timeout=10)
    time.sleep(2)  # now blocked in the read: no node changes here
    started = time.monotonic()
    watch.stop()
    returned = time.monotonic() - started
    watch.join(10)
    ended = time.monotonic() - started
    assert returned < 1, f"stop() blocked for {returned:.1f}s"
    assert not watch.is_alive(), "the watch thread still reads 10 s after stop()"
    assert ended < 5, f"the watch thread took {ended:.1f}s to end"
