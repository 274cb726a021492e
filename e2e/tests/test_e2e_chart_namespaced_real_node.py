"""The chart's single-namespace mode with the operator as a pod on the real node, and a ``helm upgrade``
across a CRD change while a canary runs (``hisparse_devcluster.operator_pod``: the operator image built
here, ``helm install`` with the node's placement).

- A ``singleNamespace`` release in ``team-ns-a`` reconciles an example there (KWOK GPU nodes) to Ready and
  its webhook, served from the pod, refuses bad input there; an example in ``team-ns-b`` is neither
  validated nor reconciled, and the pod's log has no forbidden request.
- The release is installed from a copy of the chart whose CRD is the one before ``Promoted`` was a canary
  phase. A canary (no parity gate: KWOK pods compute no tokens; an indefinite pause step) is promoted
  through the CLI: the operator's status write of ``Promoted`` is refused by the old CRD and the rollout
  sticks, as it would for users of a chart whose CRD Helm never upgrades. ``helm upgrade`` to the
  repository's chart upgrades the CRD with the release; the same rollout then ends Promoted: the
  candidate's fleet is the stable one, the old fleet is pruned and the deployment Ready.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import CRD_NAME, assert_left_alone, eventually, get_json, rollout_cli
from hisparse_devcluster import Cluster
from hisparse_devcluster.operator_pod import CHART, OperatorRelease
from hisparse_devcluster.realnode import NODE_NAME, RealNode
from test_e2e_chart_modes import INVALID, _conditions, _example  # the same example, read one way

pytestmark = [pytest.mark.slow, pytest.mark.host]

REPO = Path(__file__).resolve().parents[2]
REPO_CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"
RELEASE, OWN, OTHER, NAME = "team", "team-ns-a", "team-ns-b", "mine"
NEW_PHASE = "Promoted"
"""The canary phase the old chart's CRD lacks (the operator writes it when a rollout ends)."""


def _phases(cluster: Cluster) -> list[str]:
    version = get_json(cluster, "crd", CRD_NAME)["spec"]["versions"][0]
    canary = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["canary"]
    return list(canary["properties"]["phase"]["enum"])


@pytest.fixture(scope="module")
def old_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chart = tmp_path_factory.mktemp("old-chart") / "hisparse"
    shutil.copytree(CHART, chart)
    crd_file = next((chart / "files" / "crds").glob("serving.hisparse.dev_*.yaml"))
    text = crd_file.read_text()
    line = f"                    - {NEW_PHASE}\n"
    assert text.count(line) == 1, "the canary phase enum moved: update this test"
    crd_file.write_text(text.replace(line, ""))
    return chart


@pytest.fixture(scope="module")
def image(node: RealNode) -> str:
    return OperatorRelease(node.cluster).load_image(node)


@pytest.fixture(scope="module")
def release(cluster: Cluster, node: RealNode, image: str, old_chart: Path) -> Iterator[OperatorRelease]:
    if cluster.helm_path is None:
        pytest.fail("helm is not built: run e2e/tools/build.sh", pytrace=False)
    cluster.add_gpu_nodes(6, prefix="nsrn-gpu-")  # stable, candidate and a surge per role
    rel = OperatorRelease(cluster, release=RELEASE, namespace=OWN, timeout=300)
    rel.install(image, {"singleNamespace": True}, chart=old_chart)
    cluster.kubectl("create", "namespace", OTHER)
    try:
        yield rel
    finally:
        for ns in (OWN, OTHER):
            cluster.kubectl("delete", "hsd", "--all", "-n", ns, "--wait=true", "--timeout=120s", check=False)
        if rel.installed():
            rel.uninstall()
        cluster.kubectl("delete", "namespace", OWN, OTHER, "--wait=false", check=False)
        # The suites after this one expect the repository's CRD.
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_CRD))


def test_namespaced_operator_pod_reconciles_its_namespace_only(cluster: Cluster, release: OperatorRelease) -> None:
    (pod,) = [p for p in release.pods() if not p["metadata"].get("deletionTimestamp")]
    assert pod["spec"]["nodeName"] == NODE_NAME and pod["spec"]["serviceAccountName"] == release.fullname
    args = pod["spec"]["containers"][0]["args"]
    assert f"--namespace={OWN}" in args, args
    doc = _example(OWN, NAME)
    doc["spec"]["routing"] = {**(doc["spec"].get("routing") or {}), "gatewayRef": {"name": "inference-gateway"}}
    doc["spec"]["rollout"] = {"strategy": "Canary", "steps": [{"pause": {}}], "parity": {"enabled": False},
                              "scaleDownDelaySeconds": 1}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    eventually(lambda: _conditions(cluster, OWN, NAME).get("Ready") == "True", what=f"{OWN}/{NAME} Ready",
               timeout=300)
    res = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(_example(OWN, "bad", INVALID)), check=False)
    assert res.returncode != 0 and "denied the request" in res.stderr and "deviceBufferSize" in res.stderr, res.stderr
    # team-ns-b: this release's webhook does not see it, and its operator never touches it.
    assert_left_alone(cluster, OTHER, [_example(OTHER, "theirs"), _example(OTHER, "bad", INVALID)], owner=OWN)
    log = release.logs()
    assert NAME in log and "forbidden" not in log.lower(), log[-4000:]


def test_helm_upgrade_across_a_crd_change_keeps_a_running_canary_working(cluster: Cluster, image: str,
                                                                         release: OperatorRelease) -> None:
    assert NEW_PHASE not in _phases(cluster), "the release was to be installed with the old CRD"
    doc = get_json(cluster, "hsd", NAME, "-n", OWN)
    stable = doc["status"]["stableRevision"]
    serving = get_json(cluster, "deployment", f"{NAME}-decode", "-n", OWN)["spec"]["template"]["spec"]["containers"][0]
    cluster.kubectl("patch", "hsd", NAME, "-n", OWN, "--type=merge", "-p",
                    json.dumps({"spec": {"engine": {"image": f"{serving['image']}-next"}}}))

    def canary() -> dict[str, Any]:
        return dict((get_json(cluster, "hsd", NAME, "-n", OWN).get("status") or {}).get("canary") or {})

    eventually(lambda: canary().get("phase") == "Shifting" and canary().get("paused"), what="the canary paused",
               timeout=180)
    res = rollout_cli(cluster, "promote", NAME, "-n", OWN)
    assert res.returncode == 0, res.stdout + res.stderr
    # With the old CRD the rollout cannot end: the apiserver refuses the status it would end with.
    refused = re.compile(rf'Unsupported value: \\*"{NEW_PHASE}')  # the body's quotes may come escaped
    try:
        eventually(lambda: refused.search(release.logs()), what="the old CRD refusing the operator's status write",
                   timeout=480)
    except AssertionError:
        print(json.dumps(get_json(cluster, "hsd", NAME, "-n", OWN).get("status"), indent=1))
        print("\n".join(release.logs().splitlines()[-40:]))
        raise
    assert canary().get("phase") != NEW_PHASE
    release.install(image, {"singleNamespace": True})  # the repository's chart: its CRD comes with it
    assert NEW_PHASE in _phases(cluster)
    eventually(lambda: canary().get("phase") == NEW_PHASE, what="the rollout ended after the upgrade", timeout=240)
    st = get_json(cluster, "hsd", NAME, "-n", OWN)["status"]
    assert st["stableRevision"] != stable, st
    eventually(lambda: _conditions(cluster, OWN, NAME).get("Ready") == "True", what="Ready after the promotion",
               timeout=180)
    fleet = st["stableFleet"]
    def pruned() -> bool:  # (the namespace also holds the release's own operator Deployment)
        names = set(cluster.kubectl("get", "deployments", "-n", OWN, "-o", "name").stdout.split())
        old = {f"deployment.apps/{NAME}-{c}" for c in ("decode", "prefill", "epp")}
        return f"deployment.apps/{fleet}-decode" in names and not names & old

    eventually(pruned, what="the old fleet pruned", timeout=120)
    decode = get_json(cluster, "deployment", f"{fleet}-decode", "-n", OWN)["spec"]["template"]["spec"]["containers"][0]
    assert decode["image"].endswith("-next"), decode["image"]
