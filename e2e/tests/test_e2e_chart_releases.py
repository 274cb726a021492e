"""Two releases of the chart side by side on the real control plane, as docs/guides/multi-tenant.md installs them: one
release name in two namespaces. Release one (in `hs-one-system`) manages `hs-team-a` and owns the CRD;
release two manages its own namespace `hs-team-b` (`singleNamespace`, `crds.install=false`). Each
operator, run with its release's ServiceAccount token and argv, reconciles only its namespaces; each
webhook admits only its own (the refusals are counted by the operator that made them); `hs-team-c`, which
no release claims, is neither validated nor reconciled. A third install that claims a managed namespace,
every namespace, or the CRD is refused with the key named, and writes nothing. A deleted webhook
certificate Secret is made again as the release's, so `helm upgrade` adopts it; the aggregated roles give a
namespace's editors HiSparseDeployments."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import (CRD_NAME, assert_left_alone, chart_operator, eventually, exists, free_port, get_json, helm,
                         let_helm_adopt_crd)
from hisparse_devcluster import Cluster
from hisparse_operator.controller import webhook

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hisparse"
EXAMPLE = REPO / "examples" / "deepseek-v32-single-node.yaml"
INVALID = REPO / "examples" / "invalid" / "hot-buffer-below-topk.yaml"
RELEASE = "hisparse"  # both releases: the name alone no longer makes cluster-scoped objects unique
FULLNAME = RELEASE  # the release name holds the chart's name
ONE_NS, TEAM_A = "hs-one-system", "hs-team-a"
TWO_NS = "hs-team-b"
FREE = "hs-team-c"
THIRD_NS = "hs-three"


@dataclass(frozen=True)
class Operator:
    namespace: str  # the release's
    log: Path
    metrics_port: int

    def rejections(self) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        return sum(float(v) for v in re.findall(r"^hisparse_operator_webhook_rejections_total\{[^}]*\} (\S+)$", text, re.M))

    def subject(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{FULLNAME}"


@pytest.fixture(scope="module")
def operators(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Operator, Operator]]:
    cluster.add_gpu_nodes(5, prefix="releases-gpu-")  # an example takes two whole GPU nodes
    let_helm_adopt_crd(cluster, RELEASE, ONE_NS)
    for ns in (TEAM_A, FREE):
        cluster.kubectl("create", "namespace", ns)
    try:
        helm(cluster, "install", RELEASE, str(CHART), "-n", ONE_NS, "--create-namespace", "--set", "replicas=1",
             "--set", f"watchNamespaces={{{TEAM_A}}}", "--set", f"webhook.port={free_port()}", "--wait", "--timeout=180s")
        helm(cluster, "install", RELEASE, str(CHART), "-n", TWO_NS, "--create-namespace", "--set", "replicas=1",
             "--set", "singleNamespace=true", "--set", "crds.install=false", "--set", f"webhook.port={free_port()}",
             "--wait", "--timeout=180s")
        with chart_operator(cluster, ONE_NS, FULLNAME, tmp_path_factory.mktemp("release-one")) as (log1, port1), \
                chart_operator(cluster, TWO_NS, FULLNAME, tmp_path_factory.mktemp("release-two")) as (log2, port2):
            yield Operator(ONE_NS, log1, port1), Operator(TWO_NS, log2, port2)
    finally:
        for ns in (ONE_NS, TWO_NS, THIRD_NS):
            helm(cluster, "uninstall", RELEASE, "-n", ns, "--wait", check=False)
        for ns in (ONE_NS, TWO_NS, TEAM_A, FREE, THIRD_NS):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _example(namespace: str, name: str, path: Path = EXAMPLE) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc["metadata"].update(namespace=namespace, name=name)
    return doc


def _ready(cluster: Cluster, namespace: str, name: str) -> bool:
    status = get_json(cluster, "hsd", name, "-n", namespace).get("status") or {}
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def test_both_releases_installed_with_one_release_name(cluster: Cluster, operators: tuple[Operator, Operator]) -> None:
    for ns in (ONE_NS, TWO_NS):
        assert exists(cluster, "clusterrole", f"{ns}-{FULLNAME}")
        assert exists(cluster, "validatingwebhookconfiguration", f"{ns}-{FULLNAME}.{webhook.CONFIGURATION}")
    crd = get_json(cluster, "crd", CRD_NAME)["metadata"]["annotations"]
    assert (crd["meta.helm.sh/release-name"], crd["meta.helm.sh/release-namespace"]) == (RELEASE, ONE_NS)


def test_each_release_reconciles_only_its_namespaces(cluster: Cluster, operators: tuple[Operator, Operator]) -> None:
    one, two = operators
    for ns in (TEAM_A, TWO_NS):
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(_example(ns, "fleet")))
    for ns, op in ((TEAM_A, one), (TWO_NS, two)):
        eventually(lambda: _ready(cluster, ns, "fleet"), what=f"{ns}/fleet Ready (log: {op.log})", timeout=150)
    logs = {op.namespace: op.log.read_text(errors="replace") for op in operators}
    assert f"{TEAM_A}/fleet: applied" in logs[ONE_NS] and f"{TWO_NS}/fleet" not in logs[ONE_NS]
    assert f"{TWO_NS}/fleet: applied" in logs[TWO_NS] and f"{TEAM_A}/fleet" not in logs[TWO_NS]
    # hs-team-c is nobody's: a bad spec is stored (no webhook sees it) and nothing reconciles either.
    assert_left_alone(cluster, FREE, [_example(FREE, "theirs"), _example(FREE, "bad", INVALID)], owner="any")
    for log in logs.values():
        assert "forbidden" not in log.lower(), log[-4000:]


def test_each_webhook_admits_only_its_own_namespaces(cluster: Cluster, operators: tuple[Operator, Operator]) -> None:
    one, two = operators
    for ns, judge, other in ((TEAM_A, one, two), (TWO_NS, two, one)):
        before = judge.rejections(), other.rejections()
        res = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(_example(ns, "bad", INVALID)), check=False)
        assert res.returncode != 0 and "denied the request" in res.stderr and "deviceBufferSize" in res.stderr, res.stderr
        assert (judge.rejections(), other.rejections()) == (before[0] + 1, before[1]), f"who refused the spec in {ns}"


@pytest.mark.parametrize(("operator", "namespace", "allowed"), [
    (0, TEAM_A, True), (0, TWO_NS, False), (0, FREE, False), (0, ONE_NS, False),
    (1, TWO_NS, True), (1, TEAM_A, False), (1, FREE, False),
])
def test_the_authorizer_confines_each_release_to_its_namespaces(cluster: Cluster, operators: tuple[Operator, Operator],
                                                                 operator: int, namespace: str, allowed: bool) -> None:
    subject = operators[operator].subject()
    for verb, resource in (("patch", "deployments.apps"), ("list", "hisparsedeployments.serving.hisparse.dev")):
        res = cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace, f"--as={subject}", check=False)
        assert res.stdout.strip() == ("yes" if allowed else "no"), f"{subject} {verb} {resource} in {namespace}"
    everywhere = cluster.kubectl("auth", "can-i", "list", "hisparsedeployments.serving.hisparse.dev", "-A",
                                 f"--as={subject}", check=False)
    assert everywhere.stdout.strip() == "no", "no cluster-wide access to namespaced kinds"


@pytest.mark.parametrize(("sets", "message"), [
    ([f"watchNamespaces={{{FREE},{TEAM_A}}}", "crds.install=false"],
     f"watchNamespaces: namespace {TEAM_A} is managed by release {RELEASE} in namespace {ONE_NS} already"),
    (["singleNamespace=false", "crds.install=false"],
     "watchNamespaces: empty (every namespace), but release"),
    ([f"watchNamespaces={{{FREE}}}"],
     f"crds.install: CustomResourceDefinition {CRD_NAME} belongs to release {RELEASE} in namespace {ONE_NS}"),
])
def test_a_release_claiming_what_another_manages_is_refused(cluster: Cluster, operators: tuple[Operator, Operator],
                                                            sets: list[str], message: str) -> None:
    res = helm(cluster, "install", RELEASE, str(CHART), "-n", THIRD_NS, "--create-namespace", "--set", "replicas=1",
               *[a for s in sets for a in ("--set", s)], check=False)
    assert res.returncode != 0 and message in res.stderr, res.stderr
    assert helm(cluster, "list", "-n", THIRD_NS, "-q").stdout.strip() == "", "a refused install leaves no release"
    assert not exists(cluster, "validatingwebhookconfiguration", f"{THIRD_NS}-{FULLNAME}.{webhook.CONFIGURATION}")
    assert not exists(cluster, "clusterrole", f"{THIRD_NS}-{FULLNAME}")


def test_a_release_of_free_namespaces_installs_beside_them(cluster: Cluster, operators: tuple[Operator, Operator]) -> None:
    """The check refuses only overlaps: a third release of a namespace no one manages is accepted."""
    helm(cluster, "install", RELEASE, str(CHART), "-n", THIRD_NS, "--create-namespace", "--set", "replicas=1",
         "--set", f"watchNamespaces={{{FREE}}}", "--set", "crds.install=false")
    selector = get_json(cluster, "validatingwebhookconfiguration",
                        f"{THIRD_NS}-{FULLNAME}.{webhook.CONFIGURATION}")["webhooks"][0]["namespaceSelector"]
    assert selector["matchExpressions"][0]["values"] == [FREE]
    # ... and its upgrade is not refused by its own claim.
    helm(cluster, "upgrade", RELEASE, str(CHART), "-n", THIRD_NS, "--reuse-values")
    helm(cluster, "uninstall", RELEASE, "-n", THIRD_NS, "--wait")


def test_a_deleted_webhook_secret_is_made_again_and_helm_adopts_it(cluster: Cluster,
                                                                    operators: tuple[Operator, Operator]) -> None:
    one, _ = operators
    secret = f"{FULLNAME}-webhook-cert"
    old = get_json(cluster, "secret", secret, "-n", ONE_NS)["metadata"]["uid"]
    cluster.kubectl("delete", "secret", secret, "-n", ONE_NS)

    def remade() -> dict[str, Any] | None:
        res = cluster.kubectl("get", "secret", secret, "-n", ONE_NS, "-o", "json", check=False)
        if res.returncode:
            return None
        obj: dict[str, Any] = json.loads(res.stdout)
        return obj if obj["metadata"]["uid"] != old and obj.get("data") else None

    new = eventually(remade, what=f"the Secret made again (log: {one.log})", timeout=30)
    annotations = new["metadata"]["annotations"]
    assert (annotations["meta.helm.sh/release-name"], annotations["meta.helm.sh/release-namespace"]) == (RELEASE, ONE_NS)
    hook = f"{ONE_NS}-{FULLNAME}.{webhook.CONFIGURATION}"
    eventually(lambda: get_json(cluster, "validatingwebhookconfiguration", hook)["webhooks"][0]["clientConfig"]
               .get("caBundle") == new["data"]["ca.crt"], what="the new CA in the webhook configuration", timeout=30)
    helm(cluster, "upgrade", RELEASE, str(CHART), "-n", ONE_NS, "--reuse-values", "--wait", "--timeout=180s")
    # The webhook serves the new certificate (kopf reloads it): a bad spec is refused again, not failed on TLS.
    def refused() -> bool:
        res = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(_example(TEAM_A, "bad", INVALID)), check=False)
        return res.returncode != 0 and "deviceBufferSize" in res.stderr

    eventually(refused, what="the webhook refusing with the re-made certificate", timeout=30)


def test_aggregated_roles_let_a_namespace_s_editors_deploy(cluster: Cluster, operators: tuple[Operator, Operator]) -> None:
    cluster.kubectl("create", "rolebinding", "alice-edit", "--clusterrole=edit", "--user=alice", "-n", TEAM_A)
    cluster.kubectl("create", "rolebinding", "bob-view", "--clusterrole=view", "--user=bob", "-n", TEAM_A)

    def can(user: str, verb: str) -> str:
        return cluster.kubectl("auth", "can-i", verb, "hisparsedeployments.serving.hisparse.dev", "-n", TEAM_A,
                               f"--as={user}", check=False).stdout.strip()

    eventually(lambda: can("alice", "create") == "yes", what="edit aggregating HiSparseDeployments", timeout=30)
    eventually(lambda: can("bob", "list") == "yes", what="view aggregating HiSparseDeployments", timeout=30)
    assert can("bob", "create") == "no" and can("alice", "delete") == "yes"
    admin = cluster.kubectl("auth", "can-i", "delete", "hisparsedeployments.serving.hisparse.dev", "-n", TEAM_A,
                            "--as=carol", check=False).stdout.strip()
    assert admin == "no", "nothing is granted without a binding"
