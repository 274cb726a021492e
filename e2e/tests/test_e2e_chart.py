"""The Helm chart on the real control plane: `helm install` creates the operator and its RBAC, and the
ClusterRole is proven sufficient by running the operator with the chart's ServiceAccount token until an
example is Ready, and proven narrow by the apiserver's own authorizer (`kubectl auth can-i`)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, exists, get_json
from hisparse_operator import rbac
from hisparse_operator.controller.kube import CHILD_KINDS
from hisparse_operator.devcluster import Cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hisparse"
EXAMPLE = REPO / "examples" / "deepseek-v32-single-node.yaml"
RELEASE = "ops"
NAMESPACE = "hisparse-system"
PEERING = "hisparse-e2e"
SERVICE_ACCOUNT = f"{RELEASE}-hisparse"  # the chart's fullname for this release
SUBJECT = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"


@dataclass(frozen=True)
class Release:
    cluster: Cluster
    helm: Path

    def helm_run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([str(self.helm), f"--kubeconfig={self.cluster.kubeconfig}", *args],
                             capture_output=True, text=True, timeout=300, check=False)
        assert not check or res.returncode == 0, f"helm {' '.join(args)}:\n{res.stdout}\n{res.stderr}"
        return res


@pytest.fixture(scope="module")
def release(cluster: Cluster, gpu_nodes: list[str]) -> Iterator[Release]:
    if cluster.helm_path is None:
        pytest.fail("helm is not built: run e2e/tools/build.sh", pytrace=False)
    # The example takes two whole GPU nodes; earlier modules' namespaces may still hold theirs.
    cluster.add_gpu_nodes(3, prefix="chart-gpu-")
    rel = Release(cluster, cluster.helm_path)
    # Two replicas: the chart then creates the ClusterKopfPeering and grants peering.
    rel.helm_run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                 "--set", "replicas=2", "--set", f"peering.name={PEERING}", "--wait", "--timeout=180s")
    try:
        yield rel
    finally:
        rel.helm_run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", check=False)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def test_install_creates_the_operator_and_its_rbac(cluster: Cluster, release: Release) -> None:
    deployment = get_json(cluster, "deployment", SERVICE_ACCOUNT, "-n", NAMESPACE)
    assert deployment["status"].get("availableReplicas") == 2, deployment["status"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["operator", "run"]
    assert exists(cluster, "serviceaccount", SERVICE_ACCOUNT, "-n", NAMESPACE)
    assert exists(cluster, "service", SERVICE_ACCOUNT, "-n", NAMESPACE)
    role = get_json(cluster, "clusterrole", SERVICE_ACCOUNT)
    assert role["rules"] == rbac.cluster_role_rules(peering=True)
    binding = get_json(cluster, "clusterrolebinding", SERVICE_ACCOUNT)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]
    for crd in ("hisparsedeployments.serving.hisparse.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        conditions = {c["type"]: c["status"] for c in get_json(cluster, "crd", crd)["status"]["conditions"]}
        assert conditions.get("Established") == "True" and conditions.get("NonStructuralSchema") is None, (crd, conditions)
    assert exists(cluster, "clusterkopfpeering", PEERING)
    listed = release.helm_run("list", "-n", NAMESPACE, "-o", "json").stdout
    assert [(r["name"], r["status"]) for r in json.loads(listed)] == [(RELEASE, "deployed")]


@pytest.mark.parametrize(("api_version", "kind"), CHILD_KINDS, ids=[k for _, k in CHILD_KINDS])
def test_rules_name_the_resources_the_apiserver_serves(cluster: Cluster, api_version: str, kind: str) -> None:
    """RBAC matches resource names, not kinds: a wrong plural would grant nothing."""
    group, _, version = api_version.rpartition("/")
    served = cluster.kubectl("api-resources", f"--api-group={group}", "-o", "json").stdout
    names = {r["name"] for r in json.loads(served)["resources"] if r["kind"] == kind}
    assert names == {rbac.plural(kind)}, f"{kind} is served as {names}"


# ---- the ServiceAccount's token is enough ------------------------------------------------------------

def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _service_account_kubeconfig(cluster: Cluster, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount (a bound token), trusting the cluster CA."""
    token = cluster.kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
    base64.b64decode(ca, validate=True)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "dev", "cluster": {"server": cluster.server, "certificate-authority-data": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": "sa"}}],
    }))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def sa_operator(cluster: Cluster, release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`hisparse operator run` with the chart's ServiceAccount credentials and peering, webhook and metrics
    on loopback; yields its log file."""
    workdir = tmp_path_factory.mktemp("sa-operator")
    kubeconfig = _service_account_kubeconfig(cluster, workdir / "kubeconfig")
    whoami = subprocess.run([str(cluster.kubectl_path), f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(whoami)["status"]["userInfo"]["username"] == SUBJECT
    metrics_port = _port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HISPARSE_PEERING": PEERING,
           "HISPARSE_WEBHOOK_PORT": str(_port()), "HISPARSE_WEBHOOK_CERT_DIR": str(workdir / "certs"),
           "HISPARSE_METRICS_PORT": str(metrics_port), "HISPARSE_METRICS_ADDR": "127.0.0.1"}
    log_path = workdir / "operator.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "hisparse_operator.cli", "operator", "run"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def metrics_up() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).status == 200
        except OSError:
            return False

    try:
        eventually(lambda: proc.poll() is None and metrics_up()
                   and exists(cluster, "validatingwebhookconfiguration", rbac.WEBHOOK_CONFIGURATION)
                   and bool(get_json(cluster, "validatingwebhookconfiguration", rbac.WEBHOOK_CONFIGURATION).get("webhooks")),
                   what=f"the operator's webhook (log: {log_path})", timeout=90)
        yield log_path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


def _ready(cluster: Cluster, namespace: str, name: str) -> bool:
    res = cluster.kubectl("get", "hsd", name, "-n", namespace, "-o", "json", check=False)
    if res.returncode:
        return False
    conditions = (json.loads(res.stdout).get("status") or {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_service_account_rbac_is_enough_to_reach_ready(cluster: Cluster, sa_operator: Path, namespace: str) -> None:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    eventually(lambda: _ready(cluster, namespace, doc["metadata"]["name"]),
               what=f"{doc['metadata']['name']} Ready under the ServiceAccount (log: {sa_operator})", timeout=150)
    # The Roles it renders were accepted: the apiserver refuses Roles that grant more than their creator holds.
    roles = get_json(cluster, "roles", "-n", namespace, "-l", f"serving.hisparse.dev/deployment={doc['metadata']['name']}")
    assert len(roles["items"]) >= 1
    # Peering is on: kopf recorded itself in the chart's ClusterKopfPeering (list, watch and patch suffice).
    peers = (get_json(cluster, "clusterkopfpeering", PEERING).get("status") or {})
    assert peers, "the operator did not record itself in the peering object"
    log = sa_operator.read_text(errors="replace")
    assert "forbidden" not in log.lower() and "not enough permissions" not in log.lower(), log[-4000:]


@pytest.mark.parametrize(("verb", "resource", "allowed"), [
    ("patch", "deployments.apps", True),
    ("create", "events", True),
    ("patch", "hisparsedeployments.serving.hisparse.dev --subresource=status", True),
    ("get", "secrets", False),
    ("list", "secrets", False),
    ("create", "pods --subresource=exec", False),
    ("create", "pods", False),
    ("update", "deployments.apps", False),
    ("update", "hisparsedeployments.serving.hisparse.dev", False),
    ("delete", "nodes", False),
    ("create", "clusterroles.rbac.authorization.k8s.io", False),
    ("escalate", "roles.rbac.authorization.k8s.io", False),
    ("impersonate", "serviceaccounts", False),
    ("create", "serviceaccounts --subresource=token", False),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io", False),
])
def test_apiserver_authorizer_agrees_with_the_rules(cluster: Cluster, release: Release, verb: str, resource: str,
                                                      allowed: bool) -> None:
    res = cluster.kubectl("auth", "can-i", verb, *resource.split(), "-A", f"--as={SUBJECT}", check=False)
    assert res.stdout.strip() == ("yes" if allowed else "no"), f"can-i {verb} {resource}: {res.stdout}{res.stderr}"


def test_webhook_patch_is_limited_to_its_own_configuration(cluster: Cluster, release: Release) -> None:
    def can(kind: str, name: str) -> str:
        return cluster.kubectl("auth", "can-i", "patch", f"{kind}/{name}", f"--as={SUBJECT}", check=False).stdout.strip()

    for kind in rbac.WEBHOOK_RESOURCES:
        assert can(kind, rbac.WEBHOOK_CONFIGURATION) == "yes"
        assert can(kind, "some-other-webhook") == "no"
