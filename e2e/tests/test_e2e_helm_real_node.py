"""The operator as users run it: the operator image built here from ``operator/Dockerfile``, loaded into
the real node's containerd, and ``charts/hisparse`` installed by ``helm install`` with that image and the
node's placement (``hisparse_devcluster.operator_pod``). The operator then runs as a pod on the real node
under the chart's ServiceAccount, and the apiserver calls its admission webhook through the chart's
Service, inside the node's network namespace, through the cluster's egress proxy.

Checked: the pod runs on the real node from the local image under its ServiceAccount; the webhook served
from the pod refuses every file in ``examples/invalid/``; the pod reconciles the production example on
KWOK GPU nodes to Ready; its log has no forbidden request; a killed operator pod converges with no
duplicate objects; ``helm upgrade`` with a changed value rolls the pod and it still serves; ``helm
uninstall`` leaves only what the CRD policy keeps. The tests run in file order on one release.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import e2e_fleet
import pytest
import yaml
from e2e_helpers import apply_invalid_example, eventually, exists, get_json
from hisparse_devcluster import Cluster, storage
from hisparse_devcluster.operator_pod import CRD_NAME, IMAGE, OperatorRelease
from hisparse_devcluster.realnode import NODE_NAME, RealNode
from hisparse_operator.controller.kube import CHILD_KINDS
from hisparse_operator.rbac import plural

pytestmark = pytest.mark.host

REPO = Path(__file__).resolve().parents[2]
INVALID = sorted((REPO / "examples" / "invalid").glob("*.yaml"))
RELEASE = "hisparse"
NAMESPACE = "helm-real-node"
APPS = "helm-real-node-apps"
"""Where the test's HiSparseDeployments live."""
PRODUCTION = "glm52"
WEBHOOK = "validate.hisparsedeployments.serving.hisparse.dev"
BEFORE_WEBHOOKS = (" is invalid: ", "strict decoding error: unknown field")
"""How the apiserver words a refusal of its own (schema validation, strict decoding)."""

_STATE: dict[str, Any] = {}


@pytest.fixture(scope="module")
def image(node: RealNode) -> str:
    return OperatorRelease(node.cluster).load_image(node)


@pytest.fixture(scope="module")
def release(cluster: Cluster, node: RealNode, image: str) -> Iterator[OperatorRelease]:
    if cluster.helm_path is None:
        pytest.fail("helm is not built: run e2e/tools/build.sh", pytrace=False)
    rel = OperatorRelease(cluster, release=RELEASE, namespace=NAMESPACE, timeout=300)
    rel.install(image)
    cluster.kubectl("create", "namespace", APPS)
    try:
        yield rel
    finally:
        cluster.kubectl("delete", "hsd", "--all", "-n", APPS, "--wait=false", check=False)
        if rel.installed():
            rel.uninstall()
        cluster.kubectl("delete", "namespace", APPS, NAMESPACE, "--wait=false", check=False)
        if _STATE.get("volumes"):
            cluster.kubectl("delete", "persistentvolume", *_STATE["volumes"], "--wait=false", check=False)


def _pod(release: OperatorRelease) -> dict[str, Any]:
    pods = [p for p in release.pods() if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def _running_ready(release: OperatorRelease) -> dict[str, Any] | None:
    pods = [p for p in release.pods() if not p["metadata"].get("deletionTimestamp")]
    ready = [p for p in pods if p.get("status", {}).get("phase") == "Running"
             and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
    return ready[0] if len(pods) == 1 and ready else None


def test_operator_pod_runs_on_the_real_node_from_the_local_image(cluster: Cluster, node: RealNode, image: str,
                                                                 release: OperatorRelease) -> None:
    assert image.startswith(f"localhost/{IMAGE}:") and image in node.images()
    pod = _pod(release)
    spec, status = pod["spec"], pod["status"]
    assert spec["nodeName"] == NODE_NAME and status["phase"] == "Running"
    assert spec["serviceAccountName"] == release.fullname
    container = spec["containers"][0]
    assert container["image"] == image and container["imagePullPolicy"] == "Never"
    assert status["containerStatuses"][0]["ready"] is True
    assert status["containerStatuses"][0]["image"] == image
    assert status["podIP"].startswith("10.250.1."), "a pod address on the real node's bridge"
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 65532
    # Only the pod's ServiceAccount may write the webhook Secret (besides admins, and nothing else writes
    # it): the operator in the pod filled it with its own token, and patched the configuration's CA.
    secret = get_json(cluster, "secret", f"{release.fullname}-webhook-cert", "-n", NAMESPACE)
    assert {"ca.crt", "tls.crt", "tls.key"} <= set(secret.get("data") or {}), sorted(secret.get("data") or {})
    hooks = get_json(cluster, "validatingwebhookconfiguration", release.webhook_configuration)["webhooks"]
    assert hooks[0]["clientConfig"].get("caBundle") and "url" not in hooks[0]["clientConfig"]
    assert hooks[0]["clientConfig"]["service"]["name"] == release.fullname


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_webhook_in_the_pod_refuses_every_invalid_example(cluster: Cluster, release: OperatorRelease,
                                                         path: Path) -> None:
    res, expected = apply_invalid_example(cluster, path, APPS)
    assert res.returncode != 0, f"{path.name} was accepted"
    if expected == "metadata.namespace":
        # Refused by the apiserver before any webhook (no namespace of that name can exist).
        assert cluster.kubectl("get", "hsd", "-A", "-o", "name").stdout.strip() == ""
        return
    assert expected in res.stderr, res.stderr
    # Refused by the webhook in the pod, or by the apiserver before any webhook is called (the CRD's
    # schema, or its strict decoding of an unknown field).
    by_webhook = f'admission webhook "{WEBHOOK}" denied the request' in res.stderr
    assert by_webhook or any(m in res.stderr for m in BEFORE_WEBHOOKS), res.stderr
    if by_webhook:
        _STATE.setdefault("denied", []).append(path.stem)
    assert cluster.kubectl("get", "hsd", "-n", APPS, "-o", "name").stdout.strip() == ""


def test_the_webhook_calls_went_to_the_service_inside_the_node(cluster: Cluster, release: OperatorRelease) -> None:
    denied = _STATE.get("denied", [])
    assert len(denied) >= len(INVALID) // 2, f"the webhook refused only {denied}"
    service = get_json(cluster, "service", release.fullname, "-n", NAMESPACE)
    ip, port = service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"]
    log = (cluster.workdir / "logs" / "apiserver-egress.log").read_text()
    assert f"connect {ip}:{port} (node)" in log, log[-2000:]
    assert "403 Forbidden" not in log, [ln for ln in log.splitlines() if "403" in ln]


def test_the_pod_reconciles_the_production_example_on_kwok_gpu_nodes(cluster: Cluster,
                                                                     release: OperatorRelease) -> None:
    nodes = e2e_fleet.add_nodes(cluster, 1, prefix="helm-")
    _STATE["nodes"] = nodes
    doc = e2e_fleet.manifest(APPS, PRODUCTION)
    # No provisioner here: the model cache claim gets a static volume on the KWOK nodes, where KWOK
    # completes the download Job (its pod must not land on the real node: nothing can be downloaded).
    _STATE["volumes"] = storage.provide_model_cache(cluster, doc)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    eventually(lambda: _conditions(cluster).get("Ready") == "True", what=f"{PRODUCTION} Ready", timeout=300)
    pods = get_json(cluster, "pods", "-n", APPS)["items"]
    gpu = [p for p in pods if any("nvidia.com/gpu" in (c.get("resources", {}).get("requests") or {})
                                  for c in p["spec"]["containers"])]
    assert len(gpu) == 16, [p["metadata"]["name"] for p in gpu]
    assert all(p["spec"]["nodeName"] in nodes for p in gpu), {p["metadata"]["name"]: p["spec"]["nodeName"] for p in gpu}
    assert all(p["spec"].get("nodeName") != NODE_NAME for p in pods), {p["metadata"]["name"]: p["spec"].get("nodeName")
                                                                        for p in pods}
    # Serving pods run; the model download Job's pod has completed.
    phases = {p["metadata"]["name"]: p["status"]["phase"] for p in pods}
    jobs = {p["metadata"]["name"] for p in pods
            if any(o["kind"] == "Job" for o in p["metadata"].get("ownerReferences", []))}
    assert jobs and all(phases[n] == "Succeeded" for n in jobs), phases
    assert all(ph == "Running" for n, ph in phases.items() if n not in jobs), phases


def test_operator_log_has_no_forbidden_request(release: OperatorRelease) -> None:
    log = release.logs()
    assert PRODUCTION in log, "the log must be the operator's, with the reconcile in it"
    lowered = log.lower()
    assert "forbidden" not in lowered and "not enough permissions" not in lowered, log[-4000:]


def _children(cluster: Cluster) -> dict[tuple[str, str], str]:
    """(kind, name) -> uid of every child kind the operator writes, in the test's namespace."""
    out: dict[tuple[str, str], str] = {}
    for api_version, kind in CHILD_KINDS:
        group = api_version.rpartition("/")[0]
        resource = f"{plural(kind)}.{group}" if group else plural(kind)
        for item in get_json(cluster, resource, "-n", APPS)["items"]:
            out[(kind, item["metadata"]["name"])] = item["metadata"]["uid"]
    return out


def _conditions(cluster: Cluster) -> dict[str, str]:
    res = cluster.kubectl("get", "hsd", PRODUCTION, "-n", APPS, "-o", "json", check=False)
    if res.returncode:
        return {}
    return {c["type"]: c["status"] for c in (yaml.safe_load(res.stdout).get("status") or {}).get("conditions", [])}


def test_killed_operator_pod_converges_with_no_duplicate_objects(cluster: Cluster, release: OperatorRelease) -> None:
    before = _children(cluster)
    assert before, "the production example has children"
    replicasets = {rs["metadata"]["name"] for rs in get_json(cluster, "replicasets", "-n", APPS)["items"]}
    old = _pod(release)["metadata"]["name"]
    cluster.kubectl("delete", "pod", old, "-n", NAMESPACE, "--grace-period=0", "--force")
    # While no operator runs, a child goes: the new pod must restore it.
    cluster.kubectl("delete", "configmap", f"{PRODUCTION}-engine", "-n", APPS)
    new = eventually(lambda: _running_ready(release), what="a new operator pod Ready", timeout=180)
    assert new["metadata"]["name"] != old and new["spec"]["nodeName"] == NODE_NAME
    eventually(lambda: exists(cluster, "configmap", f"{PRODUCTION}-engine", "-n", APPS),
               what="the engine ConfigMap restored by the new pod", timeout=120)
    eventually(lambda: _conditions(cluster).get("Ready") == "True", what=f"{PRODUCTION} Ready again", timeout=120)
    after = _children(cluster)
    assert set(after) == set(before), {"new": set(after) - set(before), "gone": set(before) - set(after)}
    recreated = {k for k in before if before[k] != after[k]}
    assert recreated == {("ConfigMap", f"{PRODUCTION}-engine")}, recreated
    assert {rs["metadata"]["name"] for rs in get_json(cluster, "replicasets", "-n", APPS)["items"]} == replicasets
    ok, answer = release.webhook_answers()
    assert ok, answer


def test_upgrade_with_a_changed_value_rolls_the_pod_and_it_still_serves(cluster: Cluster, image: str,
                                                                       release: OperatorRelease) -> None:
    old = _pod(release)["metadata"]["uid"]
    release.install(image, {"resyncSeconds": 120})  # waits for the rollout and the webhook
    pod = eventually(lambda: _running_ready(release), what="the upgraded operator pod Ready", timeout=180)
    assert pod["metadata"]["uid"] != old
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["HISPARSE_RESYNC_SECONDS"] == "120"
    history = yaml.safe_load(release.helm("history", RELEASE, "-n", NAMESPACE, "-o", "yaml").stdout)
    assert [h["status"] for h in history][-1] == "deployed" and len(history) >= 2
    # Still serving: the webhook refuses, and the reconciler restores a deleted child.
    res = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        {**yaml.safe_load(INVALID[0].read_text()), "metadata": {"name": "after-upgrade", "namespace": APPS}}),
        check=False)
    assert f'admission webhook "{WEBHOOK}" denied the request' in res.stderr or any(
        m in res.stderr for m in BEFORE_WEBHOOKS), res.stderr
    cluster.kubectl("delete", "configmap", f"{PRODUCTION}-engine", "-n", APPS)
    eventually(lambda: exists(cluster, "configmap", f"{PRODUCTION}-engine", "-n", APPS),
               what="the engine ConfigMap restored after the upgrade", timeout=120)


def test_uninstall_leaves_only_what_the_crd_policy_keeps(cluster: Cluster, release: OperatorRelease) -> None:
    manifest = list(yaml.safe_load_all(release.helm("get", "manifest", RELEASE, "-n", NAMESPACE).stdout))
    objects = [(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", NAMESPACE)
                if o["kind"] not in _CLUSTER_SCOPED else None) for o in manifest if o]
    assert ("CustomResourceDefinition", CRD_NAME, None) in objects
    release.uninstall()
    left = [o for o in objects if _exists(cluster, *o)]
    assert left == [("CustomResourceDefinition", CRD_NAME, None)], left
    crd = get_json(cluster, "crd", CRD_NAME)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # The kept CRD keeps every HiSparseDeployment (and so every fleet).
    assert exists(cluster, "hsd", PRODUCTION, "-n", APPS)
    eventually(lambda: not release.pods(), what="the operator pod gone", timeout=120)
    cluster.kubectl("delete", "hsd", PRODUCTION, "-n", APPS, "--wait=false")
    cluster.kubectl("delete", "node", *_STATE.get("nodes", []), "--wait=false", check=False)


_CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration", "CustomResourceDefinition",
                   "ClusterKopfPeering", "Namespace", "PriorityClass"}


def _exists(cluster: Cluster, kind: str, name: str, namespace: str | None) -> bool:
    args = ["get", kind, name, "--ignore-not-found", "-o", "name"]
    if namespace:
        args += ["-n", namespace]
    return bool(cluster.kubectl(*args).stdout.strip())
