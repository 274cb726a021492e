"""The Helm chart on the real control plane: `helm install` creates the operator, its RBAC, its webhook
configuration and the empty certificate Secret; the ClusterRole and Role are proven sufficient by running
the operator with the chart's ServiceAccount token (in service mode, as in the cluster) until an example
is Ready and bad input is refused, and proven narrow by the apiserver's own authorizer (`kubectl auth
can-i`); `helm uninstall` leaves no webhook configuration or Secret behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, exists, free_port, get_json, let_helm_adopt_crd, service_account_kubeconfig, tls_listening
from hisparse_operator import rbac
from hisparse_operator.controller import webhook
from hisparse_operator.controller.kube import CHILD_KINDS
from hisparse_devcluster import Cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hisparse"
EXAMPLE = REPO / "examples" / "deepseek-v32-single-node.yaml"
INVALID = REPO / "examples" / "invalid" / "hot-buffer-below-topk.yaml"
RELEASE = "ops"
NAMESPACE = "hisparse-system"
PEERING = "hisparse-e2e"
SERVICE_ACCOUNT = f"{RELEASE}-hisparse"  # the chart's fullname for this release
SUBJECT = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
SECRET = f"{SERVICE_ACCOUNT}-webhook-cert"
CLUSTER_NAME = f"{NAMESPACE}-{SERVICE_ACCOUNT}"  # cluster-scoped objects: release- and namespace-unique
WEBHOOK_CONFIGURATION = f"{CLUSTER_NAME}.{webhook.CONFIGURATION}"
WEBHOOK_PORT = free_port()


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
    let_helm_adopt_crd(cluster, RELEASE, NAMESPACE)
    # Two replicas: the chart then creates the ClusterKopfPeering and grants peering.
    rel.helm_run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                 "--set", "replicas=2", "--set", f"peering.name={PEERING}", "--set", f"webhook.port={WEBHOOK_PORT}",
                 "--wait", "--timeout=180s")
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
    role = get_json(cluster, "clusterrole", CLUSTER_NAME)
    assert role["rules"] == [{**r, "resourceNames": [WEBHOOK_CONFIGURATION]} if r.get("resourceNames") else r
                             for r in rbac.cluster_role_rules(peering=True)]
    assert get_json(cluster, "role", SERVICE_ACCOUNT, "-n", NAMESPACE)["rules"] == rbac.role_rules(SECRET)
    assert get_json(cluster, "rolebinding", SERVICE_ACCOUNT, "-n", NAMESPACE)["subjects"][0]["name"] == SERVICE_ACCOUNT
    hooks = get_json(cluster, "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION)["webhooks"]
    assert hooks[0]["clientConfig"]["service"] == {"namespace": NAMESPACE, "name": SERVICE_ACCOUNT,
                                                   "port": WEBHOOK_PORT, "path": webhook.PATH}
    assert exists(cluster, "secret", SECRET, "-n", NAMESPACE)
    binding = get_json(cluster, "clusterrolebinding", CLUSTER_NAME)
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

@dataclass(frozen=True)
class SaOperator:
    log: Path
    metrics_port: int


@pytest.fixture(scope="module")
def sa_operator(cluster: Cluster, release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaOperator]:
    """`hisparse operator run` with the chart's ServiceAccount credentials, peering and the chart's webhook
    settings (service mode: the chart's Service, Secret and configuration); yields its log file.

    There is no pod network: the chart's Service becomes an ExternalName for 127.0.0.1, which the apiserver
    resolves to the webhook port there (the TLS name it checks is still the Service's)."""
    workdir = tmp_path_factory.mktemp("sa-operator")
    kubeconfig = service_account_kubeconfig(cluster, workdir / "kubeconfig", SERVICE_ACCOUNT, NAMESPACE)
    whoami = subprocess.run([str(cluster.kubectl_path), f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(whoami)["status"]["userInfo"]["username"] == SUBJECT
    metrics_port = free_port()
    cluster.kubectl("patch", "service", SERVICE_ACCOUNT, "-n", NAMESPACE, "--type=merge", "-p", json.dumps({"spec": {
        "type": "ExternalName", "externalName": "127.0.0.1", "clusterIP": None, "clusterIPs": None, "ipFamilies": None,
        "ipFamilyPolicy": None, "internalTrafficPolicy": None, "sessionAffinity": None, "selector": None}}))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HISPARSE_PEERING": PEERING, "POD_ID": "sa-operator",
           "HISPARSE_NAMESPACE": NAMESPACE, "HISPARSE_WEBHOOK_SERVICE": SERVICE_ACCOUNT, "HISPARSE_WEBHOOK_SECRET": SECRET,
           "HISPARSE_WEBHOOK_PORT": str(WEBHOOK_PORT), "HISPARSE_WEBHOOK_ADDR": "127.0.0.1",
           "HISPARSE_WEBHOOK_CONFIGURATION": WEBHOOK_CONFIGURATION,
           "HISPARSE_WEBHOOK_CERT_DIR": str(workdir / "certs"), "HISPARSE_WEBHOOK_CERT_CHECK_SECONDS": "2",
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
        def ca_bundle() -> str | None:
            hooks = get_json(cluster, "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION)["webhooks"]
            return hooks[0]["clientConfig"].get("caBundle")

        eventually(lambda: proc.poll() is None and metrics_up() and ca_bundle() and tls_listening(WEBHOOK_PORT),
                   what=f"the operator's webhook (log: {log_path})", timeout=90)
        yield SaOperator(log_path, metrics_port)
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


def test_service_account_rbac_is_enough_to_reach_ready(cluster: Cluster, sa_operator: SaOperator, namespace: str) -> None:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    eventually(lambda: _ready(cluster, namespace, doc["metadata"]["name"]),
               what=f"{doc['metadata']['name']} Ready under the ServiceAccount (log: {sa_operator.log})", timeout=150)
    # The Roles it renders were accepted: the apiserver refuses Roles that grant more than their creator holds.
    roles = get_json(cluster, "roles", "-n", namespace, "-l", f"serving.hisparse.dev/deployment={doc['metadata']['name']}")
    assert len(roles["items"]) >= 1
    # Peering is on: kopf recorded itself in the chart's ClusterKopfPeering (list, watch and patch suffice).
    peers = (get_json(cluster, "clusterkopfpeering", PEERING).get("status") or {})
    assert peers, "the operator did not record itself in the peering object"
    # The chart's empty Secret was filled (get + update), and its CA is what the configuration trusts.
    data = get_json(cluster, "secret", SECRET, "-n", NAMESPACE)["data"]
    hooks = get_json(cluster, "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION)["webhooks"]
    assert hooks[0]["clientConfig"]["caBundle"] == data["ca.crt"]
    # ... and the apiserver reaches the webhook through the chart's Service reference and gets a refusal.
    bad: dict[str, Any] = yaml.safe_load(INVALID.read_text())
    bad["metadata"]["namespace"] = namespace
    res = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert res.returncode != 0 and "denied the request" in res.stderr and "deviceBufferSize" in res.stderr, res.stderr
    log = sa_operator.log.read_text(errors="replace")
    assert "forbidden" not in log.lower() and "not enough permissions" not in log.lower(), log[-4000:]


def test_helm_test_command_passes_against_the_operator_and_fails_against_a_stand_in(
        cluster: Cluster, sa_operator: SaOperator, tmp_path: Path) -> None:
    """What the chart's `helm test` pod runs (`hisparse chart-test`), against the operator serving the chart's
    webhook and metrics; and against a TLS server that answers 200 to everything, which it must refuse."""
    service = f"{SERVICE_ACCOUNT}.{NAMESPACE}.svc"
    argv = [sys.executable, "-m", "hisparse_operator.cli", "chart-test", f"--service={service}", "--address=127.0.0.1",
            f"--webhook-port={WEBHOOK_PORT}", f"--metrics-port={sa_operator.metrics_port}"]
    ok = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "refused an empty spec" in ok.stdout and "served" in ok.stdout
    wrong = subprocess.run([*argv[:-1], f"--metrics-port={WEBHOOK_PORT}"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode != 0 and "metrics" in wrong.stderr, wrong.stdout + wrong.stderr
    other = subprocess.run([*argv[:4], "--service=someone-else.default.svc", *argv[5:]], capture_output=True,
                           text=True, timeout=60)
    assert other.returncode != 0 and "not the Service someone-else.default.svc" in other.stderr, other.stderr


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
    def can(verb: str, kind: str, name: str) -> str:
        return cluster.kubectl("auth", "can-i", verb, f"{kind}/{name}", f"--as={SUBJECT}", check=False).stdout.strip()

    assert can("patch", rbac.WEBHOOK_RESOURCE, WEBHOOK_CONFIGURATION) == "yes"
    assert can("patch", rbac.WEBHOOK_RESOURCE, "some-other-webhook") == "no"
    assert can("delete", rbac.WEBHOOK_RESOURCE, WEBHOOK_CONFIGURATION) == "no"
    assert can("patch", "mutatingwebhookconfigurations", WEBHOOK_CONFIGURATION) == "no"


@pytest.mark.parametrize(("verb", "target", "allowed"), [
    ("get", f"secret/{SECRET}", True),
    ("update", f"secret/{SECRET}", True),
    ("get", "secret/some-other-secret", False),
    ("update", "secret/some-other-secret", False),
    ("list", "secrets", False),
    ("watch", "secrets", False),
    ("create", "secrets", True),  # a deleted certificate Secret is made again (create cannot name one)
    ("delete", f"secret/{SECRET}", False),
])
def test_secret_access_is_its_own_secret_in_its_own_namespace(cluster: Cluster, release: Release, verb: str,
                                                               target: str, allowed: bool) -> None:
    res = cluster.kubectl("auth", "can-i", verb, target, "-n", NAMESPACE, f"--as={SUBJECT}", check=False)
    assert res.stdout.strip() == ("yes" if allowed else "no"), f"can-i {verb} {target}: {res.stdout}{res.stderr}"
    elsewhere = cluster.kubectl("auth", "can-i", verb, target, "-n", "default", f"--as={SUBJECT}", check=False)
    assert elsewhere.stdout.strip() == "no", f"{verb} {target} in another namespace"


def test_uninstall_leaves_no_webhook_configuration_or_secret(cluster: Cluster, release: Release,
                                                             sa_operator: SaOperator) -> None:
    """Last in this module: the chart owns the configuration and the Secret, so uninstall removes them;
    the running operator cannot bring either back (its Role, which let it make the Secret, is gone too)."""
    release.helm_run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    for kind, args in (("validatingwebhookconfiguration", ()), ("secret", ("-n", NAMESPACE)),
                       ("role", ("-n", NAMESPACE)), ("clusterrole", ())):
        name = {"validatingwebhookconfiguration": WEBHOOK_CONFIGURATION, "secret": SECRET,
                "clusterrole": CLUSTER_NAME}.get(kind, SERVICE_ACCOUNT)
        eventually(lambda: not exists(cluster, kind, name, *args), what=f"{kind} {name} removed", timeout=30)
    time.sleep(5)  # the operator's certificate keeper runs every 2 s
    assert not exists(cluster, "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION)
    assert not exists(cluster, "secret", SECRET, "-n", NAMESPACE)
    # What the CRD policy keeps (helm.sh/resource-policy: keep): the CRD, so no HiSparseDeployment is deleted.
    crd = get_json(cluster, "crd", "hisparsedeployments.serving.hisparse.dev")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
