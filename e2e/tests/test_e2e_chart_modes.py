"""The chart's single-namespace mode and CRD lifecycle on the real control plane.

A `singleNamespace` release in `team-a`: the operator runs with that release's ServiceAccount token (in
service mode, through the chart's Service, as in the cluster) and reconciles an example in `team-a` to
Ready, while the webhook refuses bad input there; a deployment in `team-b` is neither validated nor
reconciled, and the apiserver's own authorizer gives the ServiceAccount nothing outside `team-a`. Then
`helm upgrade` with a CRD that gained a status value upgrades the live CRD (Helm never upgrades `crds/`),
and `helm uninstall` leaves the CRD, as its resource policy says."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
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
REPO_CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"
RELEASE, OWN, OTHER = "team", "team-a", "team-b"
FULLNAME = f"{RELEASE}-hisparse"
CLUSTER_NAME = f"{OWN}-{FULLNAME}"  # cluster-scoped objects and the Roles in watched namespaces
SUBJECT = f"system:serviceaccount:{OWN}:{FULLNAME}"
WEBHOOK_PORT = free_port()


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[str]:
    cluster.add_gpu_nodes(3, prefix="modes-gpu-")
    let_helm_adopt_crd(cluster, RELEASE, OWN)
    helm(cluster, "install", RELEASE, str(CHART), "--namespace", OWN, "--create-namespace", "--set", "singleNamespace=true",
         "--set", "replicas=1", "--set", f"webhook.port={WEBHOOK_PORT}", "--wait", "--timeout=180s")
    cluster.kubectl("create", "namespace", OTHER)
    try:
        yield RELEASE
    finally:
        helm(cluster, "uninstall", RELEASE, "--namespace", OWN, "--wait", check=False)
        for ns in (OWN, OTHER):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator_log(cluster: Cluster, release: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The operator as the release's pod would run it: its ServiceAccount, `--namespace=team-a` (the chart's
    argv), the chart's webhook settings."""
    container = get_json(cluster, "deployment", FULLNAME, "-n", OWN)["spec"]["template"]["spec"]["containers"][0]
    assert f"--namespace={OWN}" in container["args"]
    with chart_operator(cluster, OWN, FULLNAME, tmp_path_factory.mktemp("modes-operator")) as (log_path, _):
        yield log_path


def _example(namespace: str, name: str, path: Path = EXAMPLE) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc["metadata"].update(namespace=namespace, name=name)
    return doc


def _conditions(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    status = get_json(cluster, "hsd", name, "-n", namespace).get("status") or {}
    return {c["type"]: c["status"] for c in status.get("conditions", [])}


def test_single_namespace_release_reconciles_its_namespace_only(cluster: Cluster, operator_log: Path) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(_example(OWN, "mine")))
    eventually(lambda: _conditions(cluster, OWN, "mine").get("Ready") == "True",
               what=f"team-a/mine Ready (log: {operator_log})", timeout=150)
    bad = _example(OWN, "bad", INVALID)
    res = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert res.returncode != 0 and "denied the request" in res.stderr and "deviceBufferSize" in res.stderr, res.stderr
    # team-b: this release's webhook does not see it (namespaceSelector), and the operator never touches it.
    assert_left_alone(cluster, OTHER, [_example(OTHER, "theirs"), _example(OTHER, "bad", INVALID)], owner=OWN)
    log = operator_log.read_text(errors="replace")
    assert "forbidden" not in log.lower(), log[-4000:]


@pytest.mark.parametrize(("verb", "resource", "namespace", "allowed"), [
    ("patch", "deployments.apps", OWN, True),
    ("create", "events", OWN, True),
    ("patch", "hisparsedeployments.serving.hisparse.dev --subresource=status", OWN, True),
    ("patch", "deployments.apps", OTHER, False),
    ("list", "hisparsedeployments.serving.hisparse.dev", OTHER, False),
    ("create", "events", OTHER, False),
    ("get", "configmaps", OTHER, False),
    ("list", "nodes", "", True),
    ("patch", "nodes", "", False),
])
def test_the_apiserver_authorizer_confines_the_service_account(cluster: Cluster, release: str, verb: str,
                                                               resource: str, namespace: str, allowed: bool) -> None:
    where = ["-n", namespace] if namespace else []
    res = cluster.kubectl("auth", "can-i", verb, *resource.split(), *where, f"--as={SUBJECT}", check=False)
    assert res.stdout.strip() == ("yes" if allowed else "no"), f"{verb} {resource} in {namespace or 'cluster'}: {res.stdout}"
    cluster_role = get_json(cluster, "clusterrole", CLUSTER_NAME)
    assert not any("deployments" in r["resources"] for r in cluster_role["rules"])


def test_helm_upgrade_upgrades_the_crd_and_uninstall_keeps_it(cluster: Cluster, release: str, tmp_path: Path) -> None:
    """The case a `crds/` file cannot handle: the new chart's CRD has a status value the old one refuses."""
    chart = tmp_path / "hisparse"
    shutil.copytree(CHART, chart)
    crd_file = next((chart / "files" / "crds").glob("serving.hisparse.dev_*.yaml"))
    text = crd_file.read_text()
    assert "                    - RolledBack\n" in text
    crd_file.write_text(text.replace("                    - RolledBack\n",
                                     "                    - RolledBack\n                    - UpgradeProbe\n", 1))

    def phases() -> list[str]:
        version = get_json(cluster, "crd", CRD_NAME)["spec"]["versions"][0]
        canary = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["canary"]
        return canary["properties"]["phase"]["enum"]

    assert "UpgradeProbe" not in phases()
    helm(cluster, "upgrade", RELEASE, str(chart), "--namespace", OWN, "--reuse-values", "--wait", "--timeout=180s")
    eventually(lambda: "UpgradeProbe" in phases(), what="the upgraded CRD", timeout=30)
    helm(cluster, "uninstall", RELEASE, "--namespace", OWN, "--wait")
    crd = get_json(cluster, "crd", CRD_NAME)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not exists(cluster, "validatingwebhookconfiguration", f"{CLUSTER_NAME}.{webhook.CONFIGURATION}")
    # Restore the repository's CRD for the suites after this one.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_CRD))
