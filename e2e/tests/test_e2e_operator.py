"""The operator against the real control plane: kubectl apply -> children -> KWOK pods -> Ready;
webhook rejections; drift, deletion, operator kill/restart, apiserver restart, no-op writes; canary
rollouts (progressive replacement watched throughout, the operator killed in each phase, a silent parity
Job, a deadline, the CLI's controls)."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import e2e_fleet
import pytest
import yaml
from e2e_helpers import OperatorProcess, apply_crds, apply_invalid_example, eventually, exists, free_port, get_json, rollout_cli
from hisparse_operator.controller import conditions as C
from hisparse_operator.controller.diff import needs_apply
from hisparse_operator.controller.webhook import CONFIGURATION as WEBHOOK_CONFIGURATION
from hisparse_devcluster import Cluster, storage
from hisparse_devcluster.route_watch import RouteWatcher, service_endpoints
from hisparse_operator import yamlio
from hisparse_operator.render import render
from hisparse_runtime.engine.parity import ParitySummary

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"


class Operator(OperatorProcess):
    """The operator in URL mode (as `hisparse dev` runs it): it applies its webhook configuration itself."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.webhook_port = free_port()
        super().__init__(cluster, workdir, env={
            "HISPARSE_WEBHOOK_PORT": str(self.webhook_port), "HISPARSE_WEBHOOK_CERT_DIR": str(workdir / "certs"),
            # Short retry delays so that the retry test does not wait on the production cap (60 s).
            "HISPARSE_RETRY_BASE_SECONDS": "0.5", "HISPARSE_RETRY_MAX_SECONDS": "4"})

    def start(self) -> None:
        self.spawn()
        self.wait_serving()
        eventually(lambda: exists(self.cluster, "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION),
                   what="the operator's webhook configuration", timeout=30)


@pytest.fixture(scope="module")
def operator(cluster: Cluster, gpu_nodes: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    # Each test's deployment takes two full 8-GPU nodes (three while prefill is scaled); namespaces of
    # earlier tests are deleted without waiting, so give this module its own nodes.
    cluster.add_gpu_nodes(10, prefix="op-gpu-")
    apply_crds(cluster, CRD)
    op = Operator(cluster, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()
    # URL mode: a stopped operator removes its configuration, so later suites are not refused by a dead URL.
    eventually(lambda: not exists(cluster, "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION),
               what="the webhook configuration removed on stop", timeout=30)


@pytest.fixture(autouse=True)
def _free_gpus_after(cluster: Cluster, namespace: str) -> Iterator[None]:
    """Each test's pods hold two full GPU nodes; release them before the next test (namespace deletion
    alone is asynchronous), so tests never wait on each other's capacity."""
    yield
    cluster.kubectl("delete", "hsd", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
    eventually(lambda: not exists(cluster, "pods", "-n", namespace), what=f"pods of {namespace} gone", timeout=90)


def _manifest(namespace: str, name: str = "dsv32") -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text())
    doc["metadata"].update(namespace=namespace, name=name)
    return doc


def _apply(cluster: Cluster, doc: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=check)


def _conditions(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    res = cluster.kubectl("get", "hsd", name, "-n", namespace, "-o", "json", check=False)
    if res.returncode:
        return {}
    return {c["type"]: c["status"] for c in (yaml.safe_load(res.stdout).get("status") or {}).get("conditions", [])}


def _wait_ready(cluster: Cluster, namespace: str, name: str = "dsv32", timeout: float = 120) -> None:
    eventually(lambda: _conditions(cluster, namespace, name).get("Ready") == "True", what=f"{name} Ready", timeout=timeout)


def _settled(cluster: Cluster, namespace: str, name: str = "dsv32") -> bool:
    """Ready, and Progressing False for the reason Stable: the status a reconcile writes once it has done
    a step's work. (A step is recorded before its work: between the two, the status names the new phase
    while its counts and conditions still describe the step before, and Ready may already be True.)"""
    st = get_json(cluster, "hsd", name, "-n", namespace).get("status") or {}
    conds = {c["type"]: c for c in st.get("conditions") or []}
    progressing = conds.get("Progressing") or {}
    return (conds.get("Ready") or {}).get("status") == "True" and progressing.get("status") == "False" \
        and progressing.get("reason") == C.STABLE


def _desired(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    live = get_json(cluster, "hsd", name, "-n", namespace)
    return render({k: live[k] for k in ("apiVersion", "kind", "metadata", "spec")})


def test_apply_converges_to_ready_with_rendered_children(cluster: Cluster, operator: Operator, namespace: str) -> None:
    _apply(cluster, _manifest(namespace))
    _wait_ready(cluster, namespace)
    for obj in _desired(cluster, namespace, "dsv32"):
        live = get_json(cluster, obj["kind"].lower(), obj["metadata"]["name"], "-n", namespace)
        assert not needs_apply(obj, live), f"{obj['kind']}/{obj['metadata']['name']} differs from render"
        assert live["metadata"]["ownerReferences"][0]["kind"] == "HiSparseDeployment"
    table = cluster.kubectl("get", "hsd", "-n", namespace).stdout
    assert re.search(r"NAME\s+PREFILL\s+DECODE\s+READY\s+STABLE\s+CANARY-STEP\s+AGE", table), table
    assert re.search(r"dsv32\s+1/1\s+1/1\s+True\s+[0-9a-f]{10}", table), table
    pods = get_json(cluster, "pods", "-n", namespace, "-l", "llm-d.ai/role=decode")["items"]
    assert pods and all(p["metadata"]["labels"]["llm-d.ai/inference-serving"] == "true" for p in pods)


@pytest.mark.parametrize("path", sorted((EXAMPLES / "invalid").glob("*.yaml")), ids=lambda p: p.stem)
def test_invalid_examples_are_refused_with_their_field_path(cluster: Cluster, operator: Operator, namespace: str, path: Path) -> None:
    res, expected = apply_invalid_example(cluster, path, namespace)
    assert res.returncode != 0, f"{path.name} was accepted"
    if expected == "metadata.namespace":
        # The apiserver's own refusal (no namespace of that name can exist) is the oracle the CLI agrees with.
        assert cluster.kubectl("get", "hsd", "-A", "-o", "name").stdout.strip() == ""
        return
    assert expected in res.stderr, res.stderr
    assert cluster.kubectl("get", "hsd", "-n", namespace, "-o", "name").stdout.strip() == ""


def test_drift_is_restored_and_deletion_cascades(cluster: Cluster, operator: Operator, namespace: str) -> None:
    _apply(cluster, _manifest(namespace))
    _wait_ready(cluster, namespace)
    cluster.kubectl("scale", "deployment/dsv32-prefill", "-n", namespace, "--replicas=3")
    cluster.kubectl("label", "service/dsv32-decode-nixl", "-n", namespace, "llm-d.ai/role=prefill", "--overwrite")
    cluster.kubectl("delete", "configmap/dsv32-engine", "-n", namespace)
    eventually(lambda: get_json(cluster, "deployment", "dsv32-prefill", "-n", namespace)["spec"]["replicas"] == 1,
               what="prefill replicas restored to 1")
    eventually(lambda: exists(cluster, "configmap", "dsv32-engine", "-n", namespace), what="engine ConfigMap recreated")
    cluster.kubectl("delete", "hsd", "dsv32", "-n", namespace)
    eventually(lambda: not exists(cluster, "deployments", "-n", namespace, "-l", "serving.hisparse.dev/deployment=dsv32"),
               what="children garbage-collected", timeout=90)


def test_noop_reconcile_writes_nothing(cluster: Cluster, operator: Operator, namespace: str) -> None:
    _apply(cluster, _manifest(namespace))
    _wait_ready(cluster, namespace)
    time.sleep(3)  # let the events of the rollout settle
    writes, reconciles = operator.metric("hisparse_operator_api_writes_total"), operator.metric("hisparse_operator_reconciles_total")
    cluster.kubectl("annotate", "hsd", "dsv32", "-n", namespace, "example.com/touched=1")
    eventually(lambda: (operator.metric("hisparse_operator_reconciles_total") or 0) > (reconciles or 0), what="a reconcile")
    time.sleep(2)
    assert operator.metric("hisparse_operator_api_writes_total") == writes


def test_node_changes_reach_a_deployment_whose_render_is_cached(cluster: Cluster, operator: Operator,
                                                               namespace: str) -> None:
    """The operator reuses a deployment's validation while the resource and the node facts are unchanged;
    cordoning every GPU node changes the facts, so the next reconcile (driven here by a child event that
    changes nothing of ours) finds no node for the host pool, and uncordoning brings ConfigValid back."""
    _apply(cluster, _manifest(namespace))
    _wait_ready(cluster, namespace)
    gpu = [n["metadata"]["name"] for n in get_json(cluster, "nodes")["items"]
           if int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) > 0 and not n["spec"].get("unschedulable")]
    pokes = iter(range(1_000_000))

    def config_valid_after_a_child_event() -> str:
        cluster.kubectl("annotate", "configmap/dsv32-engine", "-n", namespace, f"example.com/poke={next(pokes)}", "--overwrite")
        return _conditions(cluster, namespace, "dsv32").get("ConfigValid", "")

    try:
        cluster.kubectl("cordon", *gpu)
        eventually(lambda: config_valid_after_a_child_event() == "False", what="ConfigValid False with every GPU node cordoned")
        status = get_json(cluster, "hsd", "dsv32", "-n", namespace)["status"]
        message = next(c["message"] for c in status["conditions"] if c["type"] == "ConfigValid")
        assert "hostPoolGiB" in message, message
    finally:
        cluster.kubectl("uncordon", *gpu)
    eventually(lambda: config_valid_after_a_child_event() == "True", what="ConfigValid True after uncordoning")
    _wait_ready(cluster, namespace)


def test_server_side_dry_run_of_both_examples(cluster: Cluster, operator: Operator) -> None:
    cluster.kubectl("create", "namespace", "inference", check=False)
    for path in sorted(EXAMPLES.glob("*.yaml")):
        rendered = subprocess.run([sys.executable, "-m", "hisparse_operator.cli", "render", str(path)],
                                  capture_output=True, text=True, check=True).stdout
        res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
        assert res.returncode == 0, f"{path.name}: {res.stderr}"


def _pod_templates(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for o in objs:
        spec = o.get("spec") or {}
        if o["kind"] in ("Deployment", "Job"):
            out.append((o["metadata"]["name"], spec["template"]))
        elif o["kind"] == "LeaderWorkerSet":
            out.append((o["metadata"]["name"], spec["leaderWorkerTemplate"]["workerTemplate"]))
    return out


@pytest.mark.parametrize(("level", "ipc_lock", "admitted"), [
    ("restricted", False, True),   # without IPC_LOCK every pod of the deployment meets the restricted standard
    ("restricted", True, False),   # the one added capability is what keeps the vLLM container out of it ...
    ("baseline", True, False),     # ... and out of baseline, which adds no capability beyond the default set
    ("privileged", True, True),
])
def test_pod_security_admission_of_the_rendered_pods(cluster: Cluster, operator: Operator, level: str, ipc_lock: bool,
                                                     admitted: bool) -> None:
    """The apiserver's own Pod Security admission, on a server-side dry-run: it warns on the workloads and
    enforces on their pods (each rendered pod template, dry-run as a Pod)."""
    namespace = f"pss-{level}-{'ipc' if ipc_lock else 'noipc'}"
    cluster.kubectl("create", "namespace", namespace, check=False)
    # The RuntimeClass production-topology.yaml names, as the NVIDIA GPU Operator installs it: without it the
    # apiserver's RuntimeClass admission refuses the pods before Pod Security looks at them.
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}))
    cluster.kubectl("label", "--overwrite", "namespace", namespace, f"pod-security.kubernetes.io/enforce={level}",
                    f"pod-security.kubernetes.io/warn={level}")
    for path in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        doc["metadata"]["namespace"] = namespace
        doc["spec"].setdefault("engine", {})["ipcLock"] = ipc_lock
        rendered = subprocess.run([sys.executable, "-m", "hisparse_operator.cli", "render", "-"], input=yaml.safe_dump(doc),
                                  capture_output=True, text=True, check=True).stdout
        res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
        assert res.returncode == 0, f"{path.name}: {res.stderr}"
        warnings = [line for line in res.stderr.splitlines() if "would violate PodSecurity" in line]
        assert bool(warnings) != admitted, f"{path.name} in {level}: {warnings}"
        assert all("IPC_LOCK" in line and 'container "vllm"' in line for line in warnings), warnings
        for name, template in _pod_templates(list(yaml.safe_load_all(rendered))):
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pss-{name}"[:63], "namespace": namespace,
                                                                   "labels": template["metadata"]["labels"]},
                   # the ServiceAccounts are rendered objects the dry-run did not create; admission is the point here
                   "spec": {k: v for k, v in template["spec"].items() if k != "serviceAccountName"}}
            # The CLI's dumper: a hash label such as 12e4567890 must stay a string for kubectl's YAML parser.
            res = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yamlio.dump(pod), check=False)
            vllm = any(c["name"] == "vllm" for c in template["spec"]["containers"])
            if admitted or not vllm:
                assert res.returncode == 0, f"{path.name} pod of {name} in {level}: {res.stderr}"
            else:
                assert res.returncode != 0 and "violates PodSecurity" in res.stderr and "IPC_LOCK" in res.stderr, res.stderr
    # cache.mode NodeCache mounts the node's directory: a hostPath, which only privileged namespaces admit
    # (as the model-artifacts guide says).
    doc = yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["model"]["cache"] = {"mode": "NodeCache"}
    doc["spec"].setdefault("engine", {})["ipcLock"] = ipc_lock
    rendered = subprocess.run([sys.executable, "-m", "hisparse_operator.cli", "render", "-"], input=yaml.safe_dump(doc),
                              capture_output=True, text=True, check=True).stdout
    res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    host_path = [line for line in res.stderr.splitlines()
                 if "would violate PodSecurity" in line and "hostPath" in line and '"model-cache"' in line]
    assert res.returncode == 0 and bool(host_path) == (level != "privileged"), (level, res.stderr)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_operator_killed_mid_reconcile_converges_after_restart(cluster: Cluster, operator: Operator, namespace: str) -> None:
    _apply(cluster, _manifest(namespace))
    time.sleep(0.5)
    operator.stop(signal.SIGKILL)
    operator.start()
    _wait_ready(cluster, namespace)
    deployments = get_json(cluster, "deployments", "-n", namespace, "-l", "serving.hisparse.dev/deployment=dsv32")["items"]
    assert sorted(d["metadata"]["name"] for d in deployments) == ["dsv32-decode", "dsv32-epp", "dsv32-prefill"]


def test_operator_survives_an_apiserver_restart(cluster: Cluster, operator: Operator, namespace: str) -> None:
    _apply(cluster, _manifest(namespace))
    _wait_ready(cluster, namespace)
    cluster.restart_apiserver()
    doc = _manifest(namespace)
    doc["spec"]["prefill"]["replicas"] = 2
    eventually(lambda: _apply(cluster, doc, check=False).returncode == 0, what="apply after the restart", timeout=60)
    eventually(lambda: get_json(cluster, "hsd", "dsv32", "-n", namespace).get("status", {}).get("prefill", {}).get("ready") == "2/2",
               what="prefill 2/2 after the apiserver restart", timeout=120)
    assert operator.proc is not None and operator.proc.poll() is None, "the operator process must not have exited"


def test_serving_waits_for_the_shared_model_cache_and_model_ready_says_why(cluster: Cluster, operator: Operator,
                                                                         namespace: str) -> None:
    """The SharedVolume cache on the real control plane: with no volume for its claim (no provisioner here)
    the download Job's pod cannot be scheduled, ModelReady says so with the scheduler's words, and no serving
    workload exists; once a volume is bound to the claim, KWOK completes the Job and the fleet starts."""
    doc = _manifest(namespace)
    doc["spec"]["model"]["cache"] = {"mode": "SharedVolume"}

    def model_ready() -> dict[str, Any] | None:
        status = get_json(cluster, "hsd", "dsv32", "-n", namespace).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == "ModelReady"), None)

    _apply(cluster, doc)
    waiting = eventually(lambda: (c := model_ready()) and c["reason"] == "Downloading" and "scheduled" in c["message"] and c,
                         what="ModelReady Downloading, its pod waiting to be scheduled", timeout=90)
    assert waiting["status"] == "False" and "PersistentVolumeClaim" in waiting["message"], waiting
    assert not exists(cluster, "deployment", "dsv32-prefill", "-n", namespace)
    assert not exists(cluster, "deployment", "dsv32-decode", "-n", namespace)
    volumes = storage.provide_model_cache(cluster, doc)
    try:
        eventually(lambda: (c := model_ready()) and c["reason"] == "Cached", what="ModelReady Cached", timeout=120)
        _wait_ready(cluster, namespace)
    finally:
        cluster.kubectl("delete", "hsd", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        cluster.kubectl("delete", "pv", *volumes, "--wait=false", check=False)


def test_multinode_example_gets_lws_leader_and_worker_pods_and_ready(cluster: Cluster, operator: Operator, namespace: str) -> None:
    """The 16-node example: the LWS controller makes the decode group's leader and 7 workers, all in one
    rack (LWS exclusive topology), KWOK runs them, and the operator reports Ready."""
    names = e2e_fleet.add_nodes(cluster, 1, prefix="mn-")
    try:
        doc = e2e_fleet.manifest(namespace, "glm52")
        volumes = storage.provide_model_cache(cluster, doc)  # the model cache claim needs a volume here
        _apply(cluster, doc)
        _wait_ready(cluster, namespace, "glm52", timeout=240)
        pods = get_json(cluster, "pods", "-n", namespace, "-l", "leaderworkerset.sigs.k8s.io/name=glm52-decode")["items"]
        labels = [p["metadata"]["labels"] for p in pods]
        assert sorted(int(x["leaderworkerset.sigs.k8s.io/worker-index"]) for x in labels) == list(range(8))
        assert all(p["status"]["phase"] == "Running" for p in pods)
        nodes = {p["spec"]["nodeName"] for p in pods}
        racks = {get_json(cluster, "node", n)["metadata"]["labels"][e2e_fleet.rack_key()] for n in nodes}
        assert len(nodes) == 8 and len(racks) == 1, (nodes, racks)
        lws = get_json(cluster, "leaderworkerset", "glm52-decode", "-n", namespace)
        assert lws["status"]["readyReplicas"] == 1
        prefill = get_json(cluster, "deployment", "glm52-prefill", "-n", namespace)
        assert prefill["status"]["readyReplicas"] == 8
    finally:
        cluster.kubectl("delete", "hsd", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        cluster.kubectl("delete", "node", *names, "--wait=false", check=False)
        if volumes:
            cluster.kubectl("delete", "pv", *volumes, "--wait=false", check=False)


def test_refused_child_write_is_retried_with_backoff_until_it_succeeds(cluster: Cluster, operator: Operator,
                                                                      namespace: str) -> None:
    """A quota refuses the PodDisruptionBudgets: the reconcile fails and is retried with backoff, without
    any new event, until the quota is lifted; then the operator converges without a restart."""
    cluster.kubectl("create", "quota", "no-pdbs", "-n", namespace, "--hard=count/poddisruptionbudgets.policy=0")
    # Quota admission needs the controller's first count before it enforces anything.
    eventually(lambda: (get_json(cluster, "resourcequota", "no-pdbs", "-n", namespace).get("status") or {}).get("hard"),
               what="the quota counted")
    errors = operator.metric("hisparse_operator_reconciles_total", result="error") or 0
    _apply(cluster, _manifest(namespace))
    eventually(lambda: (operator.metric("hisparse_operator_reconciles_total", result="error") or 0) >= errors + 3,
               what="reconciles refused by the quota", timeout=60)
    assert not exists(cluster, "pdb", "-n", namespace)
    assert "exceeded quota" in operator.log()
    # The refused writes come back on their own: with every pod up nothing else changes, so only the
    # retries reconcile (the re-list is minutes away).
    # Render order puts the prefill PDB right after the prefill Deployment: that one is up, the rest waits.
    eventually(lambda: get_json(cluster, "deployment", "dsv32-prefill", "-n", namespace).get("status", {}).get("readyReplicas") == 1,
               what="prefill pods up", timeout=90)
    assert not exists(cluster, "deployment", "dsv32-decode", "-n", namespace)
    retried = operator.metric("hisparse_operator_reconcile_retries_total") or 0
    eventually(lambda: (operator.metric("hisparse_operator_reconcile_retries_total") or 0) > retried,
               what="a retry with no event to drive it", timeout=30)
    cluster.kubectl("delete", "quota", "no-pdbs", "-n", namespace)
    _wait_ready(cluster, namespace, timeout=60)
    names = {p["metadata"]["name"] for p in get_json(cluster, "pdb", "-n", namespace)["items"]}
    assert names == {o["metadata"]["name"] for o in _desired(cluster, namespace, "dsv32") if o["kind"] == "PodDisruptionBudget"}
    assert operator.proc is not None and operator.proc.poll() is None


# --- canary rollouts --------------------------------------------------------------------------------


def _canary_manifest(namespace: str, **rollout: Any) -> dict[str, Any]:
    doc = _manifest(namespace)
    doc["spec"]["routing"] = {**(doc["spec"].get("routing") or {}), "gatewayRef": {"name": "inference-gateway"}}
    doc["spec"]["rollout"] = {"strategy": "Canary", **rollout}
    return doc


def _status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return get_json(cluster, "hsd", "dsv32", "-n", namespace).get("status") or {}


def _image(cluster: Cluster, namespace: str, deployment: str) -> str:
    return get_json(cluster, "deployment", deployment, "-n", namespace)["spec"]["template"]["spec"]["containers"][0]["image"]


def _phase(cluster: Cluster, namespace: str) -> str | None:
    return (_status(cluster, namespace).get("canary") or {}).get("phase")


def _weights(cluster: Cluster, namespace: str) -> list[int]:
    route = get_json(cluster, "httproute", "dsv32", "-n", namespace)
    return [b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]]


CANARY_OBJECTS = "deployments,services,jobs,inferencepools,configmaps"
"""Kinds a candidate fleet has objects of (``serving.hisparse.dev/track=canary``)."""


def _canary_pruned(cluster: Cluster, namespace: str) -> bool:
    return not exists(cluster, CANARY_OBJECTS, "-n", namespace, "-l", "serving.hisparse.dev/track=canary")


def _stable_fleet(cluster: Cluster, namespace: str) -> str:
    """The base name of the stable fleet's objects (``dsv32`` until a canary is promoted)."""
    return str(_status(cluster, namespace).get("stableFleet") or "dsv32")


def _candidate_fleet(cluster: Cluster, namespace: str) -> str:
    """The base name of the running (or last) canary's fleet, as its status names it."""
    return str(eventually(lambda: (_status(cluster, namespace).get("canary") or {}).get("fleet"), what="the candidate fleet"))


def _old_fleet_pruned(cluster: Cluster, namespace: str, fleet: str) -> bool:
    """No workload of ``fleet`` and none of its pods left (the garbage collector removes them)."""
    return not exists(cluster, "deployments", f"{fleet}-decode", f"{fleet}-prefill", "-n", namespace) \
        and not exists(cluster, "pods", "-n", namespace, "-l", f"serving.hisparse.dev/deployment={fleet}")


def _new_image(doc: dict[str, Any], cluster: Cluster, namespace: str, suffix: str) -> str:
    old = _image(cluster, namespace, f"{_stable_fleet(cluster, namespace)}-decode")
    doc["spec"]["engine"] = {**(doc["spec"].get("engine") or {}), "image": old + suffix}
    _apply(cluster, doc)
    return old


def test_canary_that_never_becomes_ready_is_aborted_at_its_deadline(
    cluster: Cluster, operator: Operator, namespace: str,
) -> None:
    doc = _canary_manifest(namespace, readyTimeoutSeconds=60, scaleDownDelaySeconds=1)
    _apply(cluster, doc)
    _wait_ready(cluster, namespace)
    stable = get_json(cluster, "deployment", "dsv32-decode", "-n", namespace)["spec"]
    # The apiserver refuses the candidate's decode pods (no such PriorityClass): never ready.
    doc["spec"]["decode"]["priorityClassName"] = "no-such-priority-class"
    _apply(cluster, doc)
    fleet = _candidate_fleet(cluster, namespace)
    eventually(lambda: exists(cluster, "deployment", f"{fleet}-decode", "-n", namespace), what="candidate fleet")
    started = time.monotonic()
    eventually(lambda: _phase(cluster, namespace) == "RolledBack", what="candidate rolled back", timeout=120)
    assert time.monotonic() - started >= 50  # at its deadline, not before
    st = _status(cluster, namespace)
    assert "not ready within readyTimeoutSeconds" in st["canary"]["message"]
    assert {c["type"]: c for c in st["conditions"]}["Ready"]["status"] == "True"
    eventually(lambda: not exists(cluster, "deployments,services,jobs", "-n", namespace,
                                  "-l", "serving.hisparse.dev/track=canary"), what="candidate objects pruned")
    assert get_json(cluster, "deployment", "dsv32-decode", "-n", namespace)["spec"] == stable


def test_rollout_controls_through_the_cli_pause_promote_abort_retry(
    cluster: Cluster, operator: Operator, namespace: str,
) -> None:
    doc = _canary_manifest(namespace, steps=[{"pause": {}}], parity={"enabled": False}, scaleDownDelaySeconds=1)
    _apply(cluster, doc)
    _wait_ready(cluster, namespace)
    _new_image(doc, cluster, namespace, "-paused")

    def paused() -> bool:
        c = _status(cluster, namespace).get("canary") or {}
        return c.get("phase") == "Shifting" and bool(c.get("paused")) and not c.get("waitingSince")

    eventually(paused, what="an indefinite pause step", timeout=120)
    time.sleep(5)
    assert paused()  # no duration: it waits
    out = rollout_cli(cluster, "status", "dsv32", "-n", namespace)
    assert out.returncode == 0 and "(paused)" in out.stdout, out.stdout + out.stderr
    assert rollout_cli(cluster, "promote", "dsv32", "-n", namespace).returncode == 0
    eventually(lambda: _phase(cluster, namespace) == "Promoted", what="promoted after the CLI's promote", timeout=180)
    # A second revision: paused by the CLI, then aborted by it, then retried.
    doc["spec"]["rollout"]["steps"] = [{"weight": 50, "pauseSeconds": 600}]
    _new_image(doc, cluster, namespace, "-second")
    eventually(lambda: _phase(cluster, namespace) == "Shifting", what="second canary shifting", timeout=120)
    assert rollout_cli(cluster, "pause", "dsv32", "-n", namespace).returncode == 0
    eventually(lambda: (_status(cluster, namespace).get("canary") or {}).get("paused"), what="paused by the CLI")
    assert rollout_cli(cluster, "abort", "dsv32", "-n", namespace).returncode == 0
    eventually(lambda: _phase(cluster, namespace) == "RolledBack", what="aborted by the CLI", timeout=120)
    assert "aborted" in _status(cluster, namespace)["canary"]["message"]
    eventually(lambda: "replicas" not in (_status(cluster, namespace).get("canary") or {}), what="candidate gone", timeout=120)
    assert rollout_cli(cluster, "retry", "dsv32", "-n", namespace).returncode == 0
    eventually(lambda: (_status(cluster, namespace).get("canary") or {}).get("attempt") == 2, what="retried", timeout=60)
    missing = rollout_cli(cluster, "promote", "no-such-deployment", "-n", namespace)
    assert missing.returncode == 1 and "no-such-deployment" in missing.stderr


def _first(history: list[tuple[float, dict[str, int]]], pred: Any, after: float = float("-inf")) -> float | None:
    return next((t for t, v in history if t >= after and pred(v)), None)


def test_canary_replaces_stable_progressively_and_the_route_never_points_at_an_empty_pool(
    cluster: Cluster, operator: Operator, namespace: str,
) -> None:
    """Without the parity gate (KWOK's pods compute no tokens): one candidate replica per role beside two
    stable prefill replicas and one decode replica. The step of 50 runs one replica of each revision per
    role (the stable revision keeps one: a step below 100 shares the traffic) and routes 50/50; the ramp
    replaces the rest, surging by at most one replica; the stable fleet's replicas go after the scale-down
    delay. The promotion then makes the candidate's fleet the stable one as it is: no pod of it is
    recreated, the old fleet's objects are pruned. A watcher records every weight change, each pool's
    ready endpoints and every Deployment's replicas from apply to prune."""
    delay = 5
    doc = _canary_manifest(namespace, steps=[{"weight": 50, "pauseSeconds": 5}], parity={"enabled": False},
                           scaleDownDelaySeconds=delay)
    doc["spec"]["prefill"]["replicas"] = 2
    n = {"prefill": 2, "decode": 1}
    _apply(cluster, doc)
    _wait_ready(cluster, namespace)
    old_rev = _status(cluster, namespace)["stableRevision"]
    with RouteWatcher(cluster, namespace) as watcher:
        old_image = _new_image(doc, cluster, namespace, "-candidate")
        fleet = _candidate_fleet(cluster, namespace)
        assert fleet == f"dsv32-{_status(cluster, namespace)['canary']['revision'][:6]}"  # named by its revision
        eventually(lambda: exists(cluster, "deployment", f"{fleet}-decode", "-n", namespace), what="candidate fleet")
        for role in n:  # a canary of one replica per role, not a second fleet
            assert get_json(cluster, "deployment", f"{fleet}-{role}", "-n", namespace)["spec"]["replicas"] == 1
        assert _image(cluster, namespace, "dsv32-decode") == old_image
        eventually(lambda: _phase(cluster, namespace) == "Promoted", what="candidate promoted", timeout=240)
        eventually(lambda: _weights(cluster, namespace) == [100], what="route on the stable pool alone")
        eventually(lambda: _old_fleet_pruned(cluster, namespace, "dsv32"), what="the old fleet pruned", timeout=60)
    st = _status(cluster, namespace)
    assert st["stableRevision"] == st["canary"]["revision"] != old_rev and st["stableFleet"] == fleet
    assert _image(cluster, namespace, f"{fleet}-decode") == old_image + "-candidate"
    assert not watcher.violations, watcher.violations
    splits = [w for _, w in watcher.weights]
    print("route weights:", splits)
    print("replicas:", [r for _, r in watcher.replicas])
    # The weights stepped: a shared step of 50/50 with both revisions ready, before the candidate took all.
    shared = _first(watcher.weights, lambda w: w.get("dsv32") == 50 and w.get(fleet) == 50)
    all_candidate = _first(watcher.weights, lambda w: w.get(fleet) == 100)
    assert shared is not None and all_candidate is not None and shared < all_candidate, splits
    ready_at_shared = [e for t, e in watcher.endpoints if t <= shared + RouteWatcher.SKEW_SECONDS][-1]
    assert ready_at_shared.get("dsv32", 0) >= 1 and ready_at_shared.get(fleet, 0) >= 1, watcher.endpoints
    # Replaced progressively: never more than the role's replicas plus the canary's size, and the stable
    # prefill fleet went 2 -> 1 (the step) -> 0 (the ramp), not 2 -> 0.
    for _, reps in watcher.replicas:
        for role, count in n.items():
            total = reps.get(f"dsv32-{role}", 0) + reps.get(f"{fleet}-{role}", 0)
            assert total <= count + 1, (role, reps)
    stable_prefill = [r["dsv32-prefill"] for _, r in watcher.replicas if "dsv32-prefill" in r]
    stable_prefill = [x for i, x in enumerate(stable_prefill) if i == 0 or x != stable_prefill[i - 1]]
    assert stable_prefill[:3] == [2, 1, 0], stable_prefill
    # The old fleet's replicas went only after the scale-down delay once the route stopped counting them.
    last_stable_traffic = max(t for t, w in watcher.weights if w.get("dsv32", 0) > 0)
    route_off = _first(watcher.weights, lambda w: w.get("dsv32", 0) == 0, after=last_stable_traffic)
    stable_off = _first(watcher.replicas, lambda r: not r.get("dsv32-decode"), after=last_stable_traffic)
    assert route_off is not None and stable_off is not None, (splits, watcher.replicas)
    assert stable_off - route_off >= delay - RouteWatcher.SKEW_SECONDS, (route_off, stable_off)
    # Promotion recreated no pod: every pod of the promoted fleet was created before the promotion.
    promoted_at = st["canary"]["stepStartedAt"]
    pods = get_json(cluster, "pods", "-n", namespace, "-l", f"serving.hisparse.dev/deployment={fleet}")["items"]
    serving = [p for p in pods if p["metadata"]["labels"].get("serving.hisparse.dev/role")]
    assert len(serving) == 3 and all(p["metadata"]["creationTimestamp"] < promoted_at for p in serving), \
        ([(p["metadata"]["name"], p["metadata"]["creationTimestamp"]) for p in serving], promoted_at)
    # The resource's own entry points select the promoted fleet's pods.
    svc = get_json(cluster, "service", "dsv32-serving", "-n", namespace)["spec"]["selector"]
    assert svc["serving.hisparse.dev/deployment"] == fleet, svc
    _wait_ready(cluster, namespace)


def _zero_spans(history: list[tuple[float, dict[str, int]]], key: str, end: float) -> list[tuple[float, float]]:
    """(start, seconds) of each stretch in which ``key`` had no ready endpoint, after it first had one."""
    spans, since, seen = [], None, False
    for t, counts in history:
        n = counts.get(key, 0)
        seen = seen or n > 0
        if seen and n == 0 and since is None:
            since = t
        elif n > 0 and since is not None:
            spans.append((since, t - since))
            since = None
    if since is not None:
        spans.append((since, end - since))
    return spans


def test_canary_weights_are_the_steps_capped_by_capacity_and_the_serving_service_never_empties(
    cluster: Cluster, operator: Operator, namespace: str,
) -> None:
    """Two stable prefill replicas and one decode replica, steps of 20 and 80, a canary of one replica per
    role. The route's weights are the steps capped by the candidate's share of ready capacity in every
    role: 20 (the candidate's share is 50 in both roles), then 50, not 80 (the step runs 2 of 3 prefill
    replicas but 1 of 2 decode). Through the whole canary, the ramp that empties the stable fleet and the
    promotion that makes the candidate's fleet the stable one included, the Service ``dsv32-serving`` (its
    EndpointSlices, as kube-proxy reads them) and the InferencePool ``dsv32`` always have a ready endpoint:
    they follow the candidate's pods while the stable fleet has none, and stay on them once promoted."""
    doc = _canary_manifest(namespace, steps=[{"weight": 20, "pauseSeconds": 5}, {"weight": 80, "pauseSeconds": 5}],
                           parity={"enabled": False}, scaleDownDelaySeconds=5)
    doc["spec"]["prefill"]["replicas"] = 2
    _apply(cluster, doc)
    _wait_ready(cluster, namespace)
    eventually(lambda: (service_endpoints(get_json(cluster, "endpointslices", "-n", namespace)["items"])
                        .get("dsv32-serving", 0) >= 1), what="dsv32-serving has a ready endpoint")
    with RouteWatcher(cluster, namespace) as watcher:
        _new_image(doc, cluster, namespace, "-candidate")
        fleet = _candidate_fleet(cluster, namespace)
        eventually(lambda: _phase(cluster, namespace) == "Promoted", what="candidate promoted", timeout=240)
        eventually(lambda: _weights(cluster, namespace) == [100], what="route on the stable pool alone")
        eventually(lambda: _old_fleet_pruned(cluster, namespace, "dsv32"), what="the old fleet pruned", timeout=60)
        _wait_ready(cluster, namespace)
    end = time.monotonic()
    print("route weights:", [w for _, w in watcher.weights])
    print("service endpoints:", [e for _, e in watcher.services])
    print("replicas:", [r for _, r in watcher.replicas])
    assert not watcher.violations, watcher.violations
    # The stable decode fleet did go to zero (the ramp) while the Service kept serving.
    assert any(r.get("dsv32-decode") == 0 for _, r in watcher.replicas), watcher.replicas
    # (The watch's first samples come before its initial list of slices: the Service counts from its first.)
    first = next(e for _, e in watcher.services if "dsv32-serving" in e)
    assert first["dsv32-serving"] >= 1, watcher.services
    assert not _zero_spans(watcher.services, "dsv32-serving", end), watcher.services
    # (The pool's count joins two watch streams, pods and pools: a gap shorter than their skew is not one.)
    gaps = [g for g in _zero_spans(watcher.endpoints, "dsv32", end) if g[1] >= RouteWatcher.SKEW_SECONDS]
    assert not gaps, (gaps, watcher.endpoints)
    canary = [w.get(fleet, 0) for _, w in watcher.weights if fleet in w]
    stepped = [x for i, x in enumerate(canary) if i == 0 or x != canary[i - 1]]
    assert stepped[: stepped.index(100) + 1] == [0, 20, 50, 100], canary


def _kill(operator: Operator, cluster: Cluster, namespace: str, phase: str, step: int | None = None) -> None:
    """SIGKILL the operator while the rollout is in ``phase`` (and at ``step``, when given: past the last
    step is the ramp to every replica), checked once it is dead: nothing moves it on meanwhile."""
    def there() -> bool:
        c = _status(cluster, namespace).get("canary") or {}
        return c.get("phase") == phase and (step is None or c.get("step") == step)

    eventually(there, what=f"phase {phase}" + (f" at step {step}" if step is not None else ""), timeout=180)
    operator.stop(signal.SIGKILL)
    assert not operator.running() and there()


CHILD_KINDS = ("deployments,services,configmaps,jobs,inferencepools,httproutes,poddisruptionbudgets,"
               "controllerrevisions,serviceaccounts,roles,rolebindings,networkpolicies,podmonitors")


def _end_state(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """What a finished rollout leaves, comparable across namespaces: the status without times and
    revision hashes (named by role), and every object of the deployment by kind and name."""
    st = _status(cluster, namespace)
    # (Full revisions first: a fleet's name holds a prefix of one, a ControllerRevision's name all of it.)
    revs = {st["stableRevision"]: "NEW", st.get("stableFleet") or "dsv32": "dsv32-FLEET"}

    def norm(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items() if k not in ("lastTransitionTime", "stepStartedAt", "finishedAt",
                                                                    "handledAction", "observedGeneration")}
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, str):
            for rev, name in revs.items():
                v = v.replace(rev, name)
            return v.replace(namespace, "NS")
        return v

    objs = get_json(cluster, CHILD_KINDS, "-n", namespace, "-l", "serving.hisparse.dev/deployment=dsv32")["items"]
    names = sorted((o["kind"], norm(o["metadata"]["name"])) for o in objs)
    live = [p["metadata"] for p in get_json(cluster, "pods", "-n", namespace)["items"]]
    pods = sorted((norm(m["labels"].get("serving.hisparse.dev/deployment")), m["labels"].get("app.kubernetes.io/component"))
                  for m in live if not m.get("deletionTimestamp"))
    return {"status": norm(st), "objects": names, "pods": pods}


def test_operator_killed_in_shifting_and_in_the_ramp_ends_as_without_the_kill(
    cluster: Cluster, operator: Operator, namespace: str,
) -> None:
    """The same rollout twice: once undisturbed (in a namespace of its own), once with the operator
    SIGKILLed at the weight step and again in the ramp to every replica, just before the promotion
    (restarted after the cluster moved on without it). Both end with the same status and the same
    objects, none twice, and the route never on an empty pool."""
    delay = 6

    def rollout(ns: str, kills: tuple[int, ...]) -> tuple[dict[str, Any], RouteWatcher]:
        doc = _canary_manifest(ns, steps=[{"weight": 50, "pauseSeconds": 8}], parity={"enabled": False},
                               scaleDownDelaySeconds=delay)
        _apply(cluster, doc)
        _wait_ready(cluster, ns)
        with RouteWatcher(cluster, ns) as watcher:
            _new_image(doc, cluster, ns, "-candidate")
            for step in kills:
                _kill(operator, cluster, ns, "Shifting", step)
                time.sleep(3)  # the cluster moves on without the operator (pods ready, clocks running)
                operator.start()
            eventually(lambda: _phase(cluster, ns) == "Promoted", what=f"promoted in {ns}", timeout=240)
            eventually(lambda: _old_fleet_pruned(cluster, ns, "dsv32"), what=f"the old fleet and its pods gone in {ns}",
                       timeout=90)
            eventually(lambda: _settled(cluster, ns), what=f"the promotion's status written in {ns}", timeout=60)
        return _end_state(cluster, ns), watcher

    reference_ns = f"{namespace[:58].rstrip('-')}-ref"
    cluster.kubectl("create", "namespace", reference_ns)
    try:
        reference, ref_watch = rollout(reference_ns, ())
    finally:
        cluster.kubectl("delete", "hsd", "--all", "-n", reference_ns, "--wait=true", "--timeout=60s", check=False)
        cluster.kubectl("delete", "namespace", reference_ns, "--wait=false", check=False)
    killed, watcher = rollout(namespace, (0, 1))  # the weight step, then the ramp
    assert operator.starts >= 3
    assert not ref_watch.violations and not watcher.violations, (ref_watch.violations, watcher.violations)
    assert killed == reference
    assert killed["status"]["canary"]["phase"] == "Promoted" and killed["status"]["canary"]["attempt"] == 1
    kinds = [k for k, _ in killed["objects"]]
    assert len(killed["objects"]) == len(set(killed["objects"])) and kinds.count("Deployment") == 3, killed["objects"]
    fleet = _status(cluster, namespace)["stableFleet"]
    assert any(0 < w.get(fleet, 0) < 100 for _, w in watcher.weights), watcher.weights


SECOND_BUILD = """

# A second operator build for the e2e (not shipped): every serving pod carries one more annotation.
_pod_template_of_the_first_build = pod_template


def pod_template(*args, **kwargs):  # type: ignore[no-redef]
    out = _pod_template_of_the_first_build(*args, **kwargs)
    out["metadata"].setdefault("annotations", {})["e2e.hisparse.dev/operator-build"] = "second"
    return out
"""


def _second_build(workdir: Path) -> Path:
    """A copy of the operator's package whose rendering of serving pods differs: a later release, as far
    as the running deployments can tell. Its directory goes first on PYTHONPATH."""
    import shutil

    import hisparse_operator

    root = workdir / "second-build"
    package = root / "hisparse_operator"
    shutil.copytree(Path(hisparse_operator.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    with (package / "render" / "workloads.py").open("a") as f:
        f.write(SECOND_BUILD)
    return root


def _built_by_second(cluster: Cluster, namespace: str, fleet: str) -> list[bool]:
    return [(get_json(cluster, "deployment", f"{fleet}-{role}", "-n", namespace)["spec"]["template"]["metadata"]
             .get("annotations") or {}).get("e2e.hisparse.dev/operator-build") == "second" for role in ("prefill", "decode")]


def _hsd_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return get_json(cluster, "hsd", name, "-n", namespace).get("status") or {}


def _upgrade_canary_running(st: dict[str, Any]) -> bool:
    c = st.get("canary") or {}
    return bool(c.get("upgrade")) and (c.get("phase") in ("Parity", "Shifting", "Promoting") or bool(c.get("replicas")))


def test_an_operator_upgrade_that_renders_pods_otherwise_keeps_stable_fleets_and_canaries_them_one_at_a_time(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path,
) -> None:
    """Two deployments made by one operator build; a second build that renders serving pods otherwise
    takes over (HISPARSE_UPGRADE_CANARIES at its default, 1). Each stable fleet stays exactly as the first
    build rendered it (its snapshot keeps that rendering, read back from the apiserver), no pod recreated,
    while the second build's rendering rolls in as a canary of its own revision and is promoted: one
    deployment at a time, the other waiting (UpgradeQueued); the route never points at an empty pool."""
    deployments = ("dsv32", "dsv32-b")
    stable: dict[str, dict[str, Any]] = {}
    pods: dict[str, set[str]] = {}
    old: dict[str, str] = {}
    for name in deployments:
        doc = _canary_manifest(namespace, steps=[{"weight": 50, "pauseSeconds": 4}], parity={"enabled": False},
                               scaleDownDelaySeconds=2)
        doc["metadata"]["name"] = name
        _apply(cluster, doc)
    for name in deployments:
        _wait_ready(cluster, namespace, name)
        old[name] = _hsd_status(cluster, namespace, name)["stableRevision"]
        snapshot = get_json(cluster, "controllerrevision", f"{name}-{old[name]}", "-n", namespace)
        assert {o["kind"] for o in snapshot["data"]["rendering"]} == {"Deployment", "ConfigMap"}
        stable[name] = {role: get_json(cluster, "deployment", f"{name}-{role}", "-n", namespace)["spec"]["template"]
                        for role in ("prefill", "decode")}
        pods[name] = {p["metadata"]["uid"] for p in get_json(cluster, "pods", "-n", namespace, "-l",
                                                             f"serving.hisparse.dev/deployment={name}")["items"]}
    operator.stop()
    (tmp_path / "second").mkdir()
    second = Operator(cluster, tmp_path / "second")
    second.env["PYTHONPATH"] = str(_second_build(tmp_path))
    seen: list[tuple[str | None, ...]] = []
    queued: set[str] = set()
    try:
        with RouteWatcher(cluster, namespace) as watcher:
            second.start()
            deadline = time.monotonic() + 420
            while True:
                statuses = {n: _hsd_status(cluster, namespace, n) for n in deployments}
                running = [n for n, st in statuses.items() if _upgrade_canary_running(st)]
                assert len(running) <= 1, f"two upgrade canaries at once: {[st.get('canary') for st in statuses.values()]}"
                seen.append(tuple((st.get("canary") or {}).get("phase") for st in statuses.values()))
                for n, st in statuses.items():
                    progressing = {c["type"]: c for c in st.get("conditions", [])}.get("Progressing") or {}
                    if progressing.get("reason") == "UpgradeQueued":
                        queued.add(n)
                    if st.get("stableFleet"):
                        continue
                    # Until its promotion (queued, then canarying) the stable fleet is as the first build left it.
                    for role, template in stable[n].items():
                        assert get_json(cluster, "deployment", f"{n}-{role}", "-n", namespace)["spec"]["template"] == template
                    left = {p["metadata"]["uid"] for p in get_json(cluster, "pods", "-n", namespace, "-l",
                                                                   f"serving.hisparse.dev/deployment={n}")["items"]}
                    assert left <= pods[n], f"a stable pod of {n} was recreated"
                if all((st.get("canary") or {}).get("phase") == "Promoted" for st in statuses.values()):
                    break
                assert time.monotonic() < deadline, f"not both promoted; phases seen: {seen[-5:]}"
                time.sleep(1)
            for name in deployments:
                st = _hsd_status(cluster, namespace, name)
                assert st["stableRevision"] != old[name] and st["canary"]["upgrade"] is True
                assert st["stableFleet"] == st["canary"]["fleet"] and _built_by_second(cluster, namespace, st["stableFleet"]) == [True, True]
                eventually(lambda: _old_fleet_pruned(cluster, namespace, name), what=f"the first build's fleet of {name} gone",
                           timeout=90)
                _wait_ready(cluster, namespace, name)
        assert not watcher.violations, watcher.violations
        assert len(queued) == 1, f"one deployment waited for the other's upgrade canary: {queued}, phases {seen}"
    finally:
        second.stop()
        eventually(lambda: not exists(cluster, "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION),
                   what="the second build's webhook configuration removed on stop", timeout=30)
        operator.start()


GOOD_SUMMARY = ParitySummary(ok=True, prompts=4, compared=4, end_to_end=True, diverged=0, errors=0, tokens=4 * 128)


def _hold_parity_pods(cluster: Cluster, namespace: str) -> None:
    """A LimitRange the apiserver enforces on every new pod: each container requests at least one CPU.
    Every serving container does; the parity Job's (500m) does not, so its pod is refused until the
    LimitRange goes, and KWOK cannot finish it before the test is ready to read it."""
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "hold-parity", "namespace": namespace},
        "spec": {"limits": [{"type": "Container", "min": {"cpu": "1"}}]}}))


def test_operator_killed_in_parity_reads_the_verdict_after_restart(
    cluster: Cluster, operator: Operator, namespace: str,
) -> None:
    """The operator dies while its parity Job runs; the Job's pod finishes (KWOK) and leaves a passing
    summary as its termination message, as the parity client does, while no operator is there to read
    it. The restarted operator reads the verdict and promotes, with one Job ever and nothing twice."""
    doc = _canary_manifest(namespace, steps=[{"weight": 50, "pauseSeconds": 2}],
                           parity={"prompts": 4, "timeoutSeconds": 300}, scaleDownDelaySeconds=2)
    _hold_parity_pods(cluster, namespace)
    _apply(cluster, doc)
    _wait_ready(cluster, namespace)
    _new_image(doc, cluster, namespace, "-parity")
    jobs = eventually(lambda: get_json(cluster, "jobs", "-n", namespace)["items"], what="the parity Job", timeout=120)
    assert len(jobs) == 1 and (_status(cluster, namespace).get("canary") or {}).get("readyAt")
    job = jobs[0]["metadata"]["name"]
    eventually(lambda: "minimum cpu" in cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                                          f"involvedObject.name={job}", "-o", "json").stdout,
               what="the parity pod refused by the LimitRange", timeout=60)
    _kill(operator, cluster, namespace, "Parity")
    cluster.kubectl("delete", "limitrange", "hold-parity", "-n", namespace)
    nudges = iter(range(1_000_000))

    def succeeded() -> str | None:
        # The Job controller backs off after refused creates (up to a minute), and the apiserver's
        # LimitRanger may hold a deleted LimitRange for 30 s: a change to the Job syncs it at once.
        n = next(nudges)
        if n % 8 == 0:
            cluster.kubectl("annotate", "--overwrite", "job", job, "-n", namespace, f"example.com/nudge={n}")
        pods = get_json(cluster, "pods", "-n", namespace, "-l", f"batch.kubernetes.io/job-name={job}")["items"]
        return next((p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Succeeded"), None)

    pod = eventually(succeeded, what="the parity pod run to completion by KWOK", timeout=120)
    status = get_json(cluster, "pod", pod, "-n", namespace)["status"]
    assert "message" not in status["containerStatuses"][0]["state"]["terminated"]
    message = {"op": "add", "path": "/status/containerStatuses/0/state/terminated/message",
               "value": GOOD_SUMMARY.model_dump_json()}
    cluster.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=json", "-p", json.dumps([message]))

    def complete() -> bool:
        conditions = get_json(cluster, "job", job, "-n", namespace)["status"].get("conditions", [])
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    eventually(complete, what="the Job Complete", timeout=60)
    operator.start()
    eventually(lambda: _phase(cluster, namespace) == "Promoted", what="promoted after the restart", timeout=240)
    eventually(lambda: _old_fleet_pruned(cluster, namespace, "dsv32"), what="the old fleet pruned", timeout=60)
    st = _status(cluster, namespace)
    assert (st["parity"]["passed"], st["parity"]["reason"], st["parity"]["prompts"]) == (True, "Passed", 4), st["parity"]
    assert st["stableRevision"] == st["canary"]["revision"] and st["canary"]["attempt"] == 1
    events = get_json(cluster, "events", "-n", namespace, "--field-selector", "involvedObject.kind=Job")["items"]
    assert {e["involvedObject"]["name"] for e in events} == {job}  # one parity Job, never a second
    deployments = get_json(cluster, "deployments", "-n", namespace, "-l", "serving.hisparse.dev/deployment=dsv32")["items"]
    fleet = st["stableFleet"]
    assert sorted(d["metadata"]["name"] for d in deployments) == [f"{fleet}-decode", f"{fleet}-epp", f"{fleet}-prefill"]
    _wait_ready(cluster, namespace)


def test_a_parity_job_that_exits_0_without_a_summary_is_rolled_back_with_the_reason(
    cluster: Cluster, operator: Operator, namespace: str,
) -> None:
    """KWOK completes the parity Job's pod with exit 0 and no termination message: no verdict, a failure.
    The report ConfigMap outlives the Job and the candidate's objects, and says why it holds no report
    (a KWOK node serves no pod logs)."""
    doc = _canary_manifest(namespace, parity={"timeoutSeconds": 300, "prompts": 4}, scaleDownDelaySeconds=1)
    _apply(cluster, doc)
    _wait_ready(cluster, namespace)
    stable = get_json(cluster, "deployment", "dsv32-decode", "-n", namespace)["spec"]
    with RouteWatcher(cluster, namespace) as watcher:
        _new_image(doc, cluster, namespace, "-silent")
        eventually(lambda: _phase(cluster, namespace) == "RolledBack", what="candidate rolled back", timeout=180)
        st = _status(cluster, namespace)
        assert st["parity"]["passed"] is False and st["parity"]["reason"] == "NoSummary", st["parity"]
        assert "without a readable summary" in st["canary"]["message"] and "without a readable summary" in st["parity"]["message"]
        eventually(lambda: _canary_pruned(cluster, namespace), what="candidate objects pruned", timeout=60)
    assert not get_json(cluster, "jobs", "-n", namespace)["items"]  # the Job and its pod's log are gone
    report = get_json(cluster, "configmap", "dsv32-parity-report", "-n", namespace)
    owner = report["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("HiSparseDeployment", "dsv32")
    assert json.loads(report["data"]["verdict.json"])["reason"] == "NoSummary"
    assert report["data"]["summary.json"] == "null" and "could not be read" in report["data"]["source"]
    assert _status(cluster, namespace)["parity"]["report"] == "dsv32-parity-report"
    assert "ConfigMap dsv32-parity-report" in _status(cluster, namespace)["canary"]["message"]
    fleet = st["canary"]["fleet"]
    assert not watcher.violations and all(w.get(fleet, 0) == 0 for _, w in watcher.weights), watcher.weights
    conds = {c["type"]: c for c in _status(cluster, namespace)["conditions"]}
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "CanaryRolledBack"
    assert conds["Ready"]["status"] == "True" and "without a readable summary" in conds["Degraded"]["message"]
    events = get_json(cluster, "events", "-n", namespace, "--field-selector", "reason=CanaryRolledBack")["items"]
    assert any("NoSummary" in e["message"] for e in events), [e["message"] for e in events]
    assert any("ConfigMap dsv32-parity-report" in e["message"] and "log" not in e["message"]
               for e in events), [e["message"] for e in events]
    assert get_json(cluster, "deployment", "dsv32-decode", "-n", namespace)["spec"] == stable


def test_prometheus_unreachable_during_an_analysis_step_is_retried_then_rolls_back_or_passes_once_it_answers(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path,
) -> None:
    """An analysis step whose Prometheus does not answer: each attempt is an error, retried every
    ``intervalSeconds``; the third in a row (``consecutiveErrorLimit: 2``) rolls the candidate back. The
    next revision meets the same silence, then a real Prometheus starts on that address: the retry gets
    an answer, and the candidate is promoted."""
    from hisparse_devcluster import locate_binary

    port, interval = free_port(), 5
    query = {"name": "error-ratio", "query": "vector(0)", "max": 0.05, "count": 2, "intervalSeconds": interval,
             "consecutiveErrorLimit": 2}
    doc = _canary_manifest(namespace, parity={"enabled": False}, scaleDownDelaySeconds=1, steps=[
        {"weight": 50, "pauseSeconds": 0},
        {"analysis": {"prometheusUrl": f"http://127.0.0.1:{port}", "delaySeconds": 0, "queries": [query]}}])
    _apply(cluster, doc)
    _wait_ready(cluster, namespace)
    stable = get_json(cluster, "deployment", "dsv32-decode", "-n", namespace)["spec"]

    def attempts(seen: list[dict[str, Any]], before: str | None = None) -> Any:
        def check() -> str | None:
            canary = _status(cluster, namespace).get("canary") or {}
            q = (canary.get("analysis") or {}).get("queries", {}).get("error-ratio")
            # (Measurements of this rollout: the one ``before`` keeps those that ended it until the next starts.)
            if q and canary.get("revision") != before and (not seen or seen[-1]["lastAt"] != q["lastAt"]):
                seen.append(q)
            ended = canary.get("revision") != before and canary.get("phase") in ("RolledBack", "Promoted")
            return canary["phase"] if ended else None
        return check

    first: list[dict[str, Any]] = []
    _new_image(doc, cluster, namespace, "-unmeasured")
    assert eventually(attempts(first), what="the analysis' outcome", timeout=240) == "RolledBack"
    assert [q["consecutiveErrors"] for q in first] == [1, 2, 3] and all(q["measured"] == 0 for q in first), first
    times = [dt.datetime.fromisoformat(q["lastAt"].replace("Z", "+00:00")) for q in first]
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
    assert all(interval <= g <= interval + 4 for g in gaps), gaps  # retried at the interval, not at once
    st = _status(cluster, namespace)
    assert "3 errors in a row, consecutiveErrorLimit 2" in st["canary"]["message"], st["canary"]
    assert "did not answer" in st["canary"]["message"]
    events = get_json(cluster, "events", "-n", namespace, "--field-selector", "reason=CanaryAnalysis")["items"]
    assert any("tolerated; retried in 5s" in e["message"] for e in events), [e["message"] for e in events]
    eventually(lambda: _canary_pruned(cluster, namespace), what="candidate objects pruned", timeout=90)
    assert get_json(cluster, "deployment", "dsv32-decode", "-n", namespace)["spec"] == stable

    second: list[dict[str, Any]] = []
    rejected = st["canary"]["revision"]
    _new_image(doc, cluster, namespace, "-measured")
    eventually(lambda: attempts(second, rejected)() or (second and second[-1]["consecutiveErrors"] >= 1), what="a first error")
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 15s}\n")
    log = (tmp_path / "prometheus.log").open("w")
    prom = subprocess.Popen([str(locate_binary("prometheus", "prometheus")), f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        assert eventually(attempts(second, rejected), what="the analysis' outcome", timeout=240) == "Promoted", second
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        log.close()
    assert second[0]["consecutiveErrors"] == 1 and max(q["consecutiveErrors"] for q in second) <= 2, second
    events = get_json(cluster, "events", "-n", namespace, "--field-selector", "reason=CanaryAnalysis")["items"]
    assert any("passed: error-ratio: 2 of 2 measurements passed" in e["message"] for e in events), \
        [e["message"] for e in events]
